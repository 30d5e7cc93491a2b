import anyTest, { type TestFn } from "ava";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { writeChatStream } from "../helpers/chat-stream.js";

/** Usage on turns and runs (issue 16, part 2): from the scripted model and from an OpenAI-compatible endpoint. */
const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; provider: Server; baseUrl: string }>;

/** An OpenAI-compatible endpoint that answers and reports usage in its last chunk, as OpenAI does with include_usage. */
function fakeProvider(): Server {
  return createServer((req, res) => {
    req.resume();
    req.on("end", () => writeChatStream(res, ["counted"], { prompt_tokens: 42, completion_tokens: 7, prompt_tokens_details: { cached_tokens: 2 } }));
  });
}

const METRICS_TOKEN = "metrics-token-for-the-usage-tests";

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers, { RUNS_ALLOW_PRIVATE_MODEL_ENDPOINTS: "1", RUNS_METRICS_TOKEN: METRICS_TOKEN });
  const provider = fakeProvider();
  await new Promise<void>((resolve) => provider.listen(0, "127.0.0.1", resolve));
  t.context = { servers, service, provider, baseUrl: `http://127.0.0.1:${(provider.address() as AddressInfo).port}/v1` };
});

test.after.always(async (t) => {
  t.context.provider?.close();
  await t.context.service?.close();
  await t.context.servers?.stop();
});

const ZERO = { input_tokens: 0, output_tokens: 0, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: null };

test("usage - a turn sums its model calls; the run sums its turns, in GET run, the list, the turn history and the final event", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const agent = await ws.api.agentWith({
    model: "faux/scripted",
    tools: ["bash"],
    script: [
      { tool_call: { name: "bash", arguments: { command: "true" } }, usage: { input: 100, output: 20, cache_read: 50 } },
      { text: "done", usage: { input: 130, output: 10, cache_write: 5 } },
    ],
  });
  const first = await ws.api.post("/api/v1/runs", { agent, input: "go" });
  t.is(first.status, 200, JSON.stringify(first.body));
  const turnUsage = { input_tokens: 230, output_tokens: 30, cache_read_tokens: 50, cache_write_tokens: 5, cost_usd: null };
  t.deepEqual(first.body.turn.usage, turnUsage);
  t.deepEqual(first.body.usage, turnUsage);

  // A second turn (the script starts again for each turn): the run has both.
  const second = await ws.api.post("/api/v1/runs", { run_id: first.body.id, input: "again" });
  t.deepEqual(second.body.turn.usage, turnUsage);
  const both = { input_tokens: 460, output_tokens: 60, cache_read_tokens: 100, cache_write_tokens: 10, cost_usd: null };
  t.deepEqual(second.body.usage, both);
  t.deepEqual((await ws.api.get(`/api/v1/runs/${first.body.id}`)).body.usage, both);
  t.deepEqual((await ws.api.get(`/api/v1/runs/${first.body.id}?turn_id=${first.body.turn.id}`)).body.turn.usage, turnUsage);
  t.deepEqual((await ws.api.get("/api/v1/runs")).body.data.find((r: { id: string }) => r.id === first.body.id).usage, both);
  const turns = (await ws.api.get(`/api/v1/runs/${first.body.id}/turns`)).body.data;
  t.deepEqual(turns.map((turn: { usage: unknown }) => turn.usage), [turnUsage, turnUsage]);
  const events = (await ws.api.get(`/api/v1/runs/${first.body.id}/events?turn_id=${second.body.turn.id}`)).body.data;
  t.deepEqual(events.at(-1).data.run.usage, both, "the final event's run carries the sum including its turn");
  // Per-call usage stays on message_end events.
  const ends = events.filter((e: { type: string; data: { message: { role: string } } }) => e.type === "message_end" && e.data.message.role === "assistant");
  t.deepEqual(ends.map((e: { data: { message: { usage: { input: number } } } }) => e.data.message.usage.input), [100, 130]);
});

test("usage - a run with no finished turn has zero usage; a turn in progress has none yet", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const agent = await ws.api.agentWith({ model: "faux/scripted", tools: ["bash"], script: [{ tool_call: { name: "bash", arguments: { command: "sleep 30" } } }, { text: "late" }] });
  const started = await ws.api.post("/api/v1/runs", { agent, input: "x", background: true });
  t.is(started.status, 202);
  t.is(started.body.turn.usage, null);
  t.deepEqual(started.body.usage, ZERO);
  const cancelled = await ws.api.post(`/api/v1/runs/${started.body.id}/cancel`, {});
  t.true(cancelled.status === 202 || cancelled.status === 200);
  const settled = await ws.api.waitTurn(started.body.id, started.body.turn.id);
  t.is(settled.turn.status, "cancelled");
  t.deepEqual(settled.turn.usage, ZERO, "the cancelled turn's one call reported nothing");
});

test("usage - an OpenAI-compatible endpoint's reported usage is the turn's; no prices, so no cost", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const agent = await ws.api.agentWith({ model: { provider: "openai-compatible", base_url: t.context.baseUrl, model: "m" }, tools: [] });
  const run = await ws.api.post("/api/v1/runs", { agent, input: "count me" });
  t.is(run.body.turn.status, "completed", JSON.stringify(run.body.turn.error));
  t.deepEqual(run.body.turn.output, [{ type: "output_text", text: "counted" }]);
  t.deepEqual(run.body.turn.usage, { input_tokens: 40, output_tokens: 7, cache_read_tokens: 2, cache_write_tokens: 0, cost_usd: null });
  t.deepEqual(run.body.usage, run.body.turn.usage);
});

// ---------------------------------------------------------------------------------
// The ledger: GET /api/v1/usage, budgets, /metrics

/** A scripted agent whose one model call reports `input` + `output` tokens. */
function countingAgent(ws: { api: { agentWith: (c: Record<string, unknown>, n?: string) => Promise<string> } }, input: number, output: number, name = "counting") {
  return ws.api.agentWith({ model: "faux/scripted", tools: [], script: [{ text: "counted", usage: { input, output } }] }, name);
}

async function keyWith(api: { post: (url: string, body?: unknown) => Promise<{ status: number; body: any }> }, scopes: string[]): Promise<string> {
  const res = await api.post("/api/v1/api-keys", { scopes });
  if (res.status !== 201) throw new Error(`key create failed: ${JSON.stringify(res.body)}`);
  return res.body.key as string;
}

test("usage ledger - GET /api/v1/usage totals a workspace's final turns by day, agent, version and model; deleted runs still count; other workspaces are not seen", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const other = await newWorkspace(t.context.service);
  const a = await countingAgent(ws, 100, 10, "a");
  const b = await countingAgent(ws, 7, 3, "b");
  // Version 2 of agent a counts differently.
  const v2 = await ws.api.deploy(a, { model: "faux/scripted", tools: [], script: [{ text: "v2", usage: { input: 1, output: 1 } }] });
  await ws.api.waitDeployment(a, v2.version);
  const r1 = await ws.api.post("/api/v1/runs", { agent: a, version: 1, input: "x" });
  // Continued after v2 became active: the second turn runs on v2 (upgrade policy automatic).
  const r1b = await ws.api.post("/api/v1/runs", { run_id: r1.body.id, input: "y" });
  t.is(r1b.body.turn.agent_version, 2);
  const r2 = await ws.api.post("/api/v1/runs", { agent: a, version: 2, input: "x" });
  const r3 = await ws.api.post("/api/v1/runs", { agent: b, input: "x" });
  for (const r of [r1, r2, r3]) t.is(r.body.turn.status, "completed");
  await other.api.post("/api/v1/runs", { agent: await countingAgent(other, 5000, 5000), input: "not yours" });
  // A deleted run's turns were used: they still count.
  t.is((await ws.api.request("DELETE", `/api/v1/runs/${r3.body.id}`, { idempotencyKey: "del-r3" })).status, 200);

  const byDay = await ws.api.get("/api/v1/usage");
  t.is(byDay.status, 200, JSON.stringify(byDay.body));
  const total = { input_tokens: 109, output_tokens: 15, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: null, turns: 4 };
  t.deepEqual(byDay.body.total, total);
  t.is(byDay.body.group_by, "day");
  t.deepEqual(byDay.body.data, [{ day: new Date().toISOString().slice(0, 10), ...total }]);
  t.is(byDay.body.budget, null);
  t.true(byDay.body.from <= Date.now() / 1000 && byDay.body.to > Date.now() / 1000 - 60);

  const byAgent = (await ws.api.get("/api/v1/usage?group_by=agent")).body;
  t.deepEqual(byAgent.data.map((d: any) => [d.agent_id, d.turns, d.input_tokens, d.output_tokens]), [[a, 3, 102, 12], [b, 1, 7, 3]], "most tokens first");
  const byVersion = (await ws.api.get("/api/v1/usage?group_by=version")).body;
  t.deepEqual(byVersion.data.map((d: any) => [d.agent_id, d.agent_version, d.turns, d.input_tokens]), [[a, 1, 1, 100], [b, 1, 1, 7], [a, 2, 2, 2]]);
  const byModel = (await ws.api.get("/api/v1/usage?group_by=model")).body;
  t.deepEqual(byModel.data, [{ model: "faux/scripted", ...total }]);

  // A range before the turns holds none.
  const before = (await ws.api.get(`/api/v1/usage?from=1000&to=2000`)).body;
  t.deepEqual(before.total, { input_tokens: 0, output_tokens: 0, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: null, turns: 0 });
  t.deepEqual(before.data, []);
  // A read-only key may read usage.
  const reader = ws.api.withKey(await keyWith(ws.api, ["run:read"]));
  t.deepEqual((await reader.get("/api/v1/usage")).body.total, total);
});

test("usage ledger - bad queries and budget bodies answer 400 naming the parameter; budgets need api_keys:manage", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const cases: Array<[string, string]> = [
    ["/api/v1/usage?group_by=week", "group_by"],
    ["/api/v1/usage?from=2000&to=1000", "from"],
    ["/api/v1/usage?from=0&to=40000000", "from"],
    ["/api/v1/usage?to=soon", "to"],
    ["/api/v1/usage?from=1&from=2", "from"],
  ];
  for (const [url, param] of cases) {
    const res = await ws.api.get(url);
    t.is(res.status, 400, url);
    t.is(res.body.error.code, "invalid_request", url);
    t.is(res.body.error.param, param, url);
  }
  const bodies: Array<[unknown, string | null]> = [
    [{}, null],
    [{ monthly_cost_usd: null, monthly_tokens: null }, null],
    [{ monthly_cost_usd: -1 }, "monthly_cost_usd"],
    [{ monthly_cost_usd: "10" }, "monthly_cost_usd"],
    [{ monthly_tokens: 1.5 }, "monthly_tokens"],
    [{ monthly_tokens: 0 }, "monthly_tokens"],
    [{ monthly_tokens: 10, per_day: 1 }, "per_day"],
    [[], null],
  ];
  for (const [body, param] of bodies) {
    const res = await ws.api.request("PUT", "/api/v1/usage/budget", { body });
    t.is(res.status, 400, JSON.stringify(body));
    t.is(res.body.error.param, param, JSON.stringify(body));
  }
  t.is((await ws.api.get("/api/v1/usage/budget")).status, 404);
  const runner = ws.api.withKey(await keyWith(ws.api, ["run:read", "run:write"]));
  const refused = await runner.request("PUT", "/api/v1/usage/budget", { body: { monthly_tokens: 10 } });
  t.is(refused.status, 403);
  t.is(refused.body.error.code, "permission_denied");
  t.is((await runner.request("DELETE", "/api/v1/usage/budget")).status, 403);
  t.is((await ws.api.get("/api/v1/usage/budget")).status, 404, "nothing was set");
});

test.serial("usage ledger - a start re-driven after its run was deleted and the budget spent answers 404 and keeps its key bound: a 429 would free the key to start another run once the budget renews", async (t) => {
  const { service, servers } = t.context;
  const ws = await newWorkspace(service);
  const agent = await countingAgent(ws, 300, 10);
  t.is((await ws.api.request("PUT", "/api/v1/usage/budget", { body: { monthly_tokens: 100 } })).status, 200);
  const store = service.store;
  const complete = store.completeIdempotency;
  // The record's completion fails once (serial: nothing else runs meanwhile): the claim stays pending.
  store.completeIdempotency = async () => {
    store.completeIdempotency = complete;
    throw new Error("store away for a moment");
  };
  const key = "redrive-spent";
  try {
    const first = await ws.api.post("/api/v1/runs", { agent, input: "spends it" }, key);
    t.is(first.body.turn?.status, "completed", JSON.stringify(first.body));
    t.is((await ws.api.request("DELETE", `/api/v1/runs/${first.body.id}`, { idempotencyKey: `del-${key}` })).status, 200);
    t.is((await ws.api.get("/api/v1/usage")).body.budget.exhausted, "tokens");
    const raw = await servers.raw();
    const record = () => raw.idempotency.findOne({ workspace_id: ws.id, operation: "runs.create" });
    t.is((await record())?.state, "pending");
    const retry = await ws.api.post("/api/v1/runs", { agent, input: "spends it" }, key);
    t.is(retry.status, 404, JSON.stringify(retry.body));
    // The record is completed after the answer (an admitted start's answer does not wait for it).
    for (let i = 0; i < 100 && (await record())?.state !== "done"; i++) await new Promise((resolve) => setTimeout(resolve, 50));
    t.is((await record())?.state, "done", "the key stays bound to the deleted run");
    t.is((await ws.api.post("/api/v1/runs", { agent, input: "another" }, "another-key")).status, 429, "a new start is refused");
  } finally {
    store.completeIdempotency = complete;
  }
});

test("usage ledger - a spent token budget refuses new turns 429 quota_exceeded; a turn in progress finishes; a raised or removed budget admits again", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const agent = await countingAgent(ws, 300, 10);
  const set = await ws.api.request("PUT", "/api/v1/usage/budget", { body: { monthly_tokens: 500 } });
  t.is(set.status, 200, JSON.stringify(set.body));
  t.like(set.body, { object: "usage.budget", monthly_tokens: 500, monthly_cost_usd: null, exhausted: null });
  t.is(set.body.spent.input_tokens, 0);

  const first = await ws.api.post("/api/v1/runs", { agent, input: "one" });
  t.is(first.body.turn.status, "completed");
  // A turn still in progress when the budget runs out finishes.
  const slow = await ws.api.agentWith({ model: "faux/scripted", tools: ["bash"], script: [{ tool_call: { name: "bash", arguments: { command: "sleep 1" } }, usage: { input: 1 } }, { text: "late", usage: { output: 1 } }] }, "slow");
  const running = await ws.api.post("/api/v1/runs", { agent: slow, input: "slow", background: true });
  t.is(running.status, 202);
  const secondKey = "second-turn";
  const second = await ws.api.post("/api/v1/runs", { run_id: first.body.id, input: "two" }, secondKey);
  t.is(second.body.turn.status, "completed", "admitted at 310 of 500 tokens");

  const refusedStart = await ws.api.post("/api/v1/runs", { agent, input: "three" }, "refused-start");
  t.is(refusedStart.status, 429, JSON.stringify(refusedStart.body));
  t.is(refusedStart.body.error.code, "quota_exceeded");
  t.regex(refusedStart.body.error.message, /monthly budget of 500 tokens is spent/);
  const untilNextMonth = (Date.UTC(new Date().getUTCFullYear(), new Date().getUTCMonth() + 1, 1) - Date.now()) / 1000;
  t.true(Math.abs(Number(refusedStart.headers.get("retry-after")) - untilNextMonth) < 60, "Retry-After: when the month (and the budget) renews");
  const refusedContinue = await ws.api.post("/api/v1/runs", { run_id: first.body.id, input: "three" });
  t.is(refusedContinue.status, 429);
  // Twins with one key, at once: neither gets a turn past the budget.
  const twins = await Promise.all([0, 1].map(() => ws.api.post("/api/v1/runs", { agent, input: "twin" }, "twin-key")));
  t.deepEqual(twins.map((r) => r.status), [429, 429]);
  t.false((await ws.api.get("/api/v1/runs?limit=100")).body.data.some((r: { id: string }) => twins.some((tw) => tw.body.id === r.id)));
  // The request admitted before the budget ran out answers as it did.
  const replay = await ws.api.post("/api/v1/runs", { run_id: first.body.id, input: "two" }, secondKey);
  t.is(replay.status, 200);
  t.is(replay.body.turn.id, second.body.turn.id);
  const done = await ws.api.waitTurn(running.body.id, running.body.turn.id);
  t.is(done.turn.status, "completed", "the turn in progress finished");

  const state = (await ws.api.get("/api/v1/usage")).body.budget;
  t.is(state.exhausted, "tokens");
  t.is(state.spent.input_tokens + state.spent.output_tokens, 622);
  t.deepEqual((await ws.api.get("/api/v1/usage/budget")).body, state);

  // Raised: the refused key was left free, so the same request is admitted now.
  t.is((await ws.api.request("PUT", "/api/v1/usage/budget", { body: { monthly_tokens: 10_000 } })).body.exhausted, null);
  const admitted = await ws.api.post("/api/v1/runs", { agent, input: "three" }, "refused-start");
  t.is(admitted.status, 200, JSON.stringify(admitted.body));
  t.is((await ws.api.request("PUT", "/api/v1/usage/budget", { body: { monthly_tokens: 100 } })).body.exhausted, "tokens");
  t.is((await ws.api.post("/api/v1/runs", { agent, input: "four" })).status, 429);
  const removed = await ws.api.request("DELETE", "/api/v1/usage/budget");
  t.deepEqual(removed.body, { object: "usage.budget.deleted", deleted: true });
  t.is((await ws.api.post("/api/v1/runs", { agent, input: "four" })).status, 200);
  t.is((await ws.api.get("/api/v1/usage")).body.budget, null);
});

test("usage ledger - cost: a priced model's records sum to dollars, the biggest spender first, and a spent cost budget refuses turns", async (t) => {
  // No priced model answers on this machine: the records a priced model's turns leave
  // are written through the test's own connection, as the owning actor writes them.
  const ws = await newWorkspace(t.context.service);
  const agent = await countingAgent(ws, 1, 1);
  const raw = await t.context.servers.raw();
  const now = Date.now();
  const record = (id: string, model: string, cost: number | null) => ({
    _id: `turn_${id}`, workspace_id: ws.id, run_id: `run_${id}`, agent_id: agent, agent_version: 1, model, at: now - 1000,
    input_tokens: 1000, output_tokens: 100, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: cost,
  });
  await raw.db.collection("usage").insertMany([record("a", "openai/gpt-x", 0.25), record("b", "openai/gpt-x", 0.5), record("c", "anthropic/c", 1.125), record("d", "faux/scripted", null)] as never[]);
  const byModel = (await ws.api.get("/api/v1/usage?group_by=model")).body;
  t.is(byModel.total.cost_usd, 1.875);
  t.deepEqual(byModel.data.map((d: any) => [d.model, d.cost_usd, d.turns]), [["anthropic/c", 1.125, 1], ["openai/gpt-x", 0.75, 2], ["faux/scripted", null, 1]]);
  const set = await ws.api.request("PUT", "/api/v1/usage/budget", { body: { monthly_cost_usd: 1.5, monthly_tokens: 1_000_000 } });
  t.is(set.body.exhausted, "cost");
  t.is(set.body.spent.cost_usd, 1.875);
  const refused = await ws.api.post("/api/v1/runs", { agent, input: "x" });
  t.is(refused.status, 429);
  t.regex(refused.body.error.message, /1\.5 USD/);
  t.is((await ws.api.request("PUT", "/api/v1/usage/budget", { body: { monthly_cost_usd: 2 } })).body.exhausted, null);
  t.is((await ws.api.post("/api/v1/runs", { agent, input: "x" })).status, 200);
});

test("usage ledger - /metrics counts tokens by workspace, model and kind, for the operator's token only (RUNS_METRICS_TOKEN)", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const agent = await countingAgent(ws, 11, 4);
  await ws.api.post("/api/v1/runs", { agent, input: "x" });
  await ws.api.post("/api/v1/runs", { agent, input: "y" });
  const anon = ws.api.withKey(undefined);
  const attempts: Array<Record<string, string>> = [{}, { authorization: `Bearer ${METRICS_TOKEN}x` }, { authorization: `Bearer ${METRICS_TOKEN.slice(1)}` }, { authorization: `Basic ${METRICS_TOKEN}` }, { authorization: `Bearer ${ws.key}` }];
  for (const headers of attempts) {
    const refused = await anon.request("GET", "/metrics", { headers });
    t.is(refused.status, 401, JSON.stringify(headers));
    t.is(refused.body.error.code, "unauthorized");
    t.false(JSON.stringify(refused.body).includes(ws.id));
  }
  const scraped = await anon.request("GET", "/metrics", { headers: { authorization: `Bearer ${METRICS_TOKEN}` } });
  t.is(scraped.status, 200);
  const text = scraped.body as string;
  t.regex(text, /^runs_sse_streams \d+$/m, "the node's own series too");
  const line = (kind: string) => text.split("\n").find((l) => l.startsWith("runs_tokens_total{") && l.includes(`workspace="${ws.id}"`) && l.includes(`kind="${kind}"`));
  t.regex(line("input") ?? "", /model="faux\/scripted".* 22$/);
  t.regex(line("output") ?? "", / 8$/);
  t.is(line("cache_read"), undefined, "no cache reads were reported");
  t.false(text.includes(`runs_cost_usd_total{workspace="${ws.id}"`), "an unpriced model has no cost");
});

test.serial("usage ledger - records are kept for RUNS_USAGE_RETENTION_DAYS after their turn, then swept; the sweep reads by the `at` index", async (t) => {
  t.timeout(60_000);
  const { servers } = t.context;
  const DAY = 86_400_000;
  // A node of its own, sweeping every 300 ms and keeping records for 32 days (the least allowed).
  const service = await startTestService(servers, { RUNS_SWEEP_INTERVAL_MS: "300", RUNS_USAGE_RETENTION_DAYS: "32" });
  try {
    const ws = await newWorkspace(service);
    const now = (await ws.api.post("/api/v1/runs", { agent: await countingAgent(ws, 11, 1), input: "x" })).body;
    t.is(now.turn.status, "completed");
    const raw = await servers.raw();
    const usage = raw.db.collection("usage");
    const workspaceId = (await usage.findOne({ run_id: now.id }))!.workspace_id as string;
    const record = (id: string, ageDays: number) => ({
      _id: id, workspace_id: workspaceId, run_id: now.id, agent_id: "agt_x", agent_version: 1, model: "faux/scripted", at: Date.now() - ageDays * DAY,
      input_tokens: 1000, output_tokens: 100, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: null,
    });
    await usage.insertMany([record("turn_usageold0000000001", 40), record("turn_usageold0000000002", 33), record("turn_usagemid0000000001", 31)] as never[]);

    let left: string[] = [];
    for (let i = 0; i < 100; i++) {
      left = (await usage.find({ workspace_id: workspaceId }).toArray()).map((d) => String(d._id)).sort();
      if (left.length === 2) break;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    t.is(left.length, 2, `left: ${left}`);
    t.true(left.includes("turn_usagemid0000000001"), "31 days old: kept");
    t.true(left.includes(now.turn.id), "this turn's: kept");
    const s = (ms: number) => Math.floor(ms / 1000);
    const summary = (await ws.api.get(`/api/v1/usage?from=${s(Date.now() - 45 * DAY)}&to=${s(Date.now() + 60_000)}`)).body;
    t.deepEqual([summary.total.turns, summary.total.input_tokens], [2, 1011], "what is left is what a summary counts");

    if (!process.env.RUNS_TEST_MONGODB_URI) {
      // The embedded store answers the sweep's step (the oldest due, sorted, 1,000) from the `at`
      // index, in order: a scan would read every workspace's records, an unsorted read every due one.
      const step = { find: "usage", filter: { at: { $gte: Number.MIN_SAFE_INTEGER, $lt: Date.now() - 32 * DAY } }, sort: { at: 1 }, limit: 1_000 };
      const explained = await raw.db.command({ explain: step });
      const plan = (explained.queryPlanner?.Plan ?? []) as string[];
      t.true(plan.some((line) => /SEARCH \S+ USING (COVERING )?INDEX \S+_at /.test(line) && !/_ws_at /.test(line)), plan.join(" | "));
      t.true(explained.sortPushdown, "sorted by the index");
    }
  } finally {
    await service.close();
  }
});
