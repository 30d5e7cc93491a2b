import anyTest, { type TestFn } from "ava";
import { gatedBashConfig } from "../helpers/agent-configs.js";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";

/**
 * Human approval of tool calls (issue 18) through the API, on a real service, store and
 * sandbox: approve, deny, expire, cancel while waiting, decide twice, steer while waiting,
 * another workspace, bad input, and a wait that survives a restart of the service.
 */
const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; api: Api; other: Api; otherWorkspaceAgent: string; gated: string }>;

/** bash commands starting with `echo` need a person; the command counts its runs in the workspace. */
const COUNTING = "echo ran >> count.txt; wc -l < count.txt";
const gatedConfig = (extra: Record<string, unknown> = {}, script?: unknown[]) =>
  gatedBashConfig(
    script ?? [
      { tool_call: { name: "bash", arguments: { command: COUNTING } }, usage: { input: 100 } },
      { text: "done", usage: { input: 10 } },
    ],
    extra,
  );

test.before(async (t) => {
  const servers = await startTestServers();
  // The file's tests run at once in one solo workspace: some sixteen turns start together
  // and resumed ones run bash, past the plan's 10 active turns (a turn over it would fail
  // concurrency_limit_reached and another test with it). The limit has tests of its own.
  // Waits end by notices here: a store check would come only after the wait's end (see
  // "the default wait answers 202…"), so a notice lost in any test of this file shows as a
  // default wait answered 202 at its 20 s end instead of 200.
  const service = await startTestService(servers, { RUNS_WAIT_TIMEOUT_MS: "20000", RUNS_WAIT_STORE_CHECK_MS: "60000", RUNS_ACTIVE_TURNS_SOLO: "1000" });
  const ws = await newWorkspace(service);
  const other = await newWorkspace(service);
  const gated = await ws.api.agentWith(gatedConfig());
  const otherWorkspaceAgent = await other.api.agentWith(gatedConfig());
  t.context = { servers, service, api: ws.api, other: other.api, gated, otherWorkspaceAgent };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

/** Starts a run in the background and waits until its turn asks for a decision. */
async function waitingRun(api: Api, agent: string, input = "go") {
  const res = await api.post("/api/v1/runs", { agent, input, background: true });
  if (res.status !== 202) throw new Error(`start failed ${res.status} ${JSON.stringify(res.body)}`);
  const run = await api.waitRun(res.body.id, (r) => r.turn?.pending_action != null || ["completed", "failed", "cancelled", "incomplete"].includes(r.turn?.status), 30_000);
  if (!run.turn.pending_action) throw new Error(`the turn did not wait: ${JSON.stringify(run.turn)}`);
  return run;
}

async function events(api: Api, runId: string): Promise<any[]> {
  const res = await api.get(`/api/v1/runs/${runId}/events?limit=1000`);
  return res.body.data;
}

const NOT_RUN_TEXTS = { cancelled: "The call did not run: the turn was cancelled.", limit: "The call did not run: the turn reached its time limit." };
const toolEnd = (evs: any[]) => evs.filter((e) => e.type === "tool_execution_end");
const assistantEnds = (evs: any[]) => evs.filter((e) => e.type === "message_end" && e.data.message.role === "assistant");

test("approve - the turn waits in_progress with its pending action; nothing ran; approving runs the call once and the turn completes", async (t) => {
  const { api, gated } = t.context;
  const run = await waitingRun(api, gated);
  t.is(run.state, "busy");
  t.is(run.turn.status, "in_progress");
  const action = run.turn.pending_action;
  t.regex(action.id, /^act_/);
  t.is(action.tool, "bash");
  t.deepEqual(action.arguments, { command: COUNTING });
  t.is(action.expires_at - action.requested_at, 3600);
  t.is(run.turn.usage, null);

  const before = await events(api, run.id);
  const requested = before.filter((e) => e.type === "tool.approval_requested");
  t.is(requested.length, 1);
  t.is(requested[0].source, "runtime");
  t.is(requested[0].data.action_id, action.id);
  t.is(requested[0].data.tool_call_id, action.tool_call_id);
  t.true(before.some((e) => e.type === "tool_execution_start" && e.data.toolCallId === action.tool_call_id), "the call was announced");
  t.is(toolEnd(before).length, 0, "nothing of the call ran");

  const decided = await api.post(`/api/v1/runs/${run.id}/actions/${action.id}`, { decision: "approve" });
  t.is(decided.status, 200, JSON.stringify(decided.body));
  t.like(decided.body, { id: action.id, object: "action", run_id: run.id, turn_id: run.turn.id, tool: "bash", decision: "approve", reason: null, decided_by: "person" });
  t.is(typeof decided.body.decided_at, "number");

  const done = await api.waitTurn(run.id, run.turn.id);
  t.is(done.turn.status, "completed");
  t.deepEqual(done.turn.output, [{ type: "output_text", text: "done" }]);
  t.is(done.turn.pending_action, null);
  t.is(done.state, "idle");
  // Two model calls: the one that asked (not repeated) and the answer.
  t.is(done.turn.usage.input_tokens, 110);
  const after = await events(api, run.id);
  t.is(assistantEnds(after).length, 2);
  t.is(after.filter((e) => e.type === "tool_execution_start").length, 1, "the call's start is reported once");
  const ends = toolEnd(after);
  t.is(ends.length, 1);
  t.false(ends[0].data.isError);
  t.is(ends[0].data.result.content[0].text.trim(), "1", "the command ran once");
  const decidedEvent = after.find((e) => e.type === "tool.approval_decided");
  t.like(decidedEvent?.data, { action_id: action.id, decision: "approve", decided_by: "person" });
  // Order: asked, decided, ran, final.
  const seq = (type: string) => after.findIndex((e) => e.type === type);
  t.true(seq("tool.approval_requested") < seq("tool.approval_decided"));
  t.true(seq("tool.approval_decided") < seq("tool_execution_end"));
  t.true(seq("tool_execution_end") < seq("turn.completed"));
  // Sequences stay 1..n without gaps.
  t.deepEqual(after.map((e) => e.sequence), after.map((_, i) => i + 1));
});

test("the default wait answers 202 once the turn waits for a person (it is not about to end)", async (t) => {
  const { api, gated } = t.context;
  const started = Date.now();
  const res = await api.post("/api/v1/runs", { agent: gated, input: "wait for me" });
  const answeredAt = Date.now();
  t.is(res.status, 202, JSON.stringify(res.body));
  t.truthy(res.headers.get("location"));
  t.is(res.body.turn.status, "in_progress");
  t.is(res.body.turn.pending_action?.tool, "bash", "the answer shows what the turn waits for");
  // The turn's waiting notice ends the wait when the action is asked for. This file's
  // service reads the store only a minute into a wait, past the wait's 20 s: without the
  // notice the answer would have come at the wait's end (seen: 20.0 s).
  t.true(answeredAt - started < 15_000, `answered after ${answeredAt - started} ms`);
  const run = await api.waitRun(res.body.id, (r) => r.turn.pending_action != null);
  t.is(run.turn.status, "in_progress");
  t.is((await api.post(`/api/v1/runs/${run.id}/cancel`, {})).status, 200);
});

test("lists: a waiting run shows its pending action in summaries and pending_action=true finds it; once decided it is gone", async (t) => {
  const { api, gated } = t.context;
  const run = await waitingRun(api, gated, "inbox");
  const tag = `inbox-${run.id}`;
  await api.post(`/api/v1/runs/${run.id}/tags`, { add: [tag] });
  const action = run.turn.pending_action;
  const waiting = await api.get(`/api/v1/runs?pending_action=true&tag=${tag}`);
  t.is(waiting.status, 200);
  t.deepEqual(waiting.body.data.map((r: any) => [r.id, r.pending_action]), [[run.id, { id: action.id, turn_id: run.turn.id, tool: "bash", expires_at: action.expires_at }]]);
  t.deepEqual((await api.get(`/api/v1/runs?pending_action=false&tag=${tag}`)).body.data, []);
  t.like((await api.get(`/api/v1/runs/${run.id}`)).body.pending_action, { id: action.id });
  const bad = await api.get("/api/v1/runs?pending_action=yes");
  t.is(bad.status, 400);
  t.is(bad.body.error.param, "pending_action");
  t.is((await api.post(`/api/v1/runs/${run.id}/actions/${action.id}`, { decision: "approve" })).status, 200);
  await api.waitTurn(run.id, run.turn.id);
  t.deepEqual((await api.get(`/api/v1/runs?pending_action=true&tag=${tag}`)).body.data, []);
  const after = await api.get(`/api/v1/runs?pending_action=false&tag=${tag}`);
  t.deepEqual(after.body.data.map((r: any) => [r.id, r.pending_action]), [[run.id, null]]);
});

test("deny - the model gets the tool's error result with the reason; the command never ran", async (t) => {
  const { api, gated } = t.context;
  const run = await waitingRun(api, gated);
  const action = run.turn.pending_action;
  const res = await api.post(`/api/v1/runs/${run.id}/actions/${action.id}`, { decision: "deny", reason: "not on a Friday" });
  t.is(res.status, 200);
  t.like(res.body, { decision: "deny", reason: "not on a Friday", decided_by: "person" });
  const done = await api.waitTurn(run.id, run.turn.id);
  t.is(done.turn.status, "completed");
  const ends = toolEnd(await events(api, run.id));
  t.is(ends.length, 1);
  t.true(ends[0].data.isError);
  t.is(ends[0].data.result.content[0].text, "The call was denied by a person: not on a Friday");
});

test("expire - without a decision the timeout denies; a decision afterwards is 409 action_already_decided", async (t) => {
  const { api } = t.context;
  const agent = await api.agentWith(gatedConfig({ timeout_s: 1 }));
  const run = await waitingRun(api, agent);
  const action = run.turn.pending_action;
  t.is(action.expires_at - action.requested_at, 1);
  const done = await api.waitTurn(run.id, run.turn.id, 20_000);
  t.is(done.turn.status, "completed");
  const evs = await events(api, run.id);
  t.like(evs.find((e) => e.type === "tool.approval_decided")?.data, { action_id: action.id, decision: "deny", decided_by: "timeout" });
  const end = toolEnd(evs)[0];
  t.true(end.data.isError);
  t.regex(end.data.result.content[0].text, /expired/);
  const late = await api.post(`/api/v1/runs/${run.id}/actions/${action.id}`, { decision: "approve" });
  t.is(late.status, 409);
  t.is(late.body.error.code, "action_already_decided");
  t.is(late.body.error.param, "actionId");
  t.false(late.body.error.retryable);
});

test("expire - on_timeout approve runs the call when nobody decides", async (t) => {
  const { api } = t.context;
  const agent = await api.agentWith(gatedConfig({ timeout_s: 1, on_timeout: "approve" }));
  const run = await waitingRun(api, agent);
  const done = await api.waitTurn(run.id, run.turn.id, 20_000);
  t.is(done.turn.status, "completed");
  const evs = await events(api, run.id);
  t.like(evs.find((e) => e.type === "tool.approval_decided")?.data, { decision: "approve", decided_by: "timeout" });
  t.false(toolEnd(evs)[0].data.isError);
});

test("cancel while waiting - the turn settles cancelled at once (200); the run goes on with a new turn", async (t) => {
  const { api, gated } = t.context;
  const run = await waitingRun(api, gated);
  const res = await api.post(`/api/v1/runs/${run.id}/cancel`, {});
  t.is(res.status, 200, JSON.stringify(res.body));
  t.is(res.body.turn.status, "cancelled");
  t.is(res.body.turn.pending_action, null);
  t.is(res.body.state, "idle");
  const evs = await events(api, run.id);
  // The call's start was reported when it asked; its end says it never ran.
  t.deepEqual(toolEnd(evs).map((e) => [e.data.isError, e.data.result.content[0].text]), [[true, NOT_RUN_TEXTS.cancelled]], "the call never ran");
  t.is(evs.filter((e) => e.type === "turn.cancelled").length, 1);
  // The action is settled with its turn: deciding it now is a conflict, not a resumption.
  const late = await api.post(`/api/v1/runs/${run.id}/actions/${run.turn.pending_action.id}`, { decision: "approve" });
  t.is(late.status, 409);
  t.is(late.body.error.code, "action_already_decided");
  // The session stays usable: the next turn asks again (its model sees the cancelled call answered).
  const next = await api.post("/api/v1/runs", { run_id: run.id, input: "again", background: true });
  t.is(next.status, 202);
  const waitingAgain = await api.waitRun(run.id, (r) => r.turn?.id === next.body.turn.id && r.turn.pending_action != null);
  t.not(waitingAgain.turn.pending_action.id, run.turn.pending_action.id);
  t.is((await api.post(`/api/v1/runs/${run.id}/cancel`, {})).status, 200);
});

test("decide twice - the same key answers as the first time; a new key is 409; the same key with another decision is idempotency_conflict", async (t) => {
  const { api, gated } = t.context;
  const run = await waitingRun(api, gated);
  const action = run.turn.pending_action;
  const url = `/api/v1/runs/${run.id}/actions/${action.id}`;
  const first = await api.post(url, { decision: "approve" }, "decide-1");
  t.is(first.status, 200);
  const again = await api.post(url, { decision: "approve" }, "decide-1");
  t.is(again.status, 200);
  t.deepEqual(again.body, first.body);
  const other = await api.post(url, { decision: "deny" }, "decide-2");
  t.is(other.status, 409);
  t.is(other.body.error.code, "action_already_decided");
  const changed = await api.post(url, { decision: "deny" }, "decide-1");
  t.is(changed.status, 409);
  t.is(changed.body.error.code, "idempotency_conflict");
  const done = await api.waitTurn(run.id, run.turn.id);
  t.is(done.turn.status, "completed");
  t.is(toolEnd(await events(api, run.id)).filter((e) => !e.data.isError).length, 1, "approved once, ran once");
  // After the turn ended the first key still answers the same.
  t.deepEqual((await api.post(url, { decision: "approve" }, "decide-1")).body, first.body);
});

test("two requests racing to decide one action: one decision wins, the other is 409, the call runs once", async (t) => {
  const { api, gated } = t.context;
  const run = await waitingRun(api, gated);
  const url = `/api/v1/runs/${run.id}/actions/${run.turn.pending_action.id}`;
  const answers = await Promise.all([api.post(url, { decision: "approve" }), api.post(url, { decision: "deny" })]);
  t.deepEqual(answers.map((a) => a.status).sort(), [200, 409]);
  const winner = answers.find((a) => a.status === 200)!.body.decision;
  await api.waitTurn(run.id, run.turn.id);
  const ends = toolEnd(await events(api, run.id));
  t.is(ends.length, 1);
  t.is(ends[0].data.isError, winner === "deny");
});

test("another workspace's run is 404 run_not_found; an unknown action 404 action_not_found; bad bodies 400 naming the field", async (t) => {
  const { api, other, gated } = t.context;
  const run = await waitingRun(api, gated);
  const action = run.turn.pending_action;
  const foreign = await other.post(`/api/v1/runs/${run.id}/actions/${action.id}`, { decision: "approve" });
  t.is(foreign.status, 404);
  t.is(foreign.body.error.code, "run_not_found");
  const unknown = await api.post(`/api/v1/runs/${run.id}/actions/act_nothing`, { decision: "approve" });
  t.is(unknown.status, 404);
  t.is(unknown.body.error.code, "action_not_found");
  t.is(unknown.body.error.param, "actionId");
  for (const [body, param] of [
    [{}, "decision"],
    [{ decision: "maybe" }, "decision"],
    [{ decision: "approve", reason: 7 }, "reason"],
    [{ decision: "approve", reason: "x".repeat(2001) }, "reason"],
    // Stored as U+FFFD or refused by some readers, while the event and the model had them raw (probe).
    [{ decision: "deny", reason: "a\u0000b" }, "reason"],
    [{ decision: "deny", reason: "a\u001b[2Jb" }, "reason"],
    [{ decision: "deny", reason: "half \ud800" }, "reason"],
    [{ decision: "approve", extra: true }, "extra"],
  ] as const) {
    const res = await api.post(`/api/v1/runs/${run.id}/actions/${action.id}`, body);
    t.is(res.status, 400, JSON.stringify(body));
    t.is(res.body.error.param, param, JSON.stringify(body));
  }
  const keyless = await api.request("POST", `/api/v1/runs/${run.id}/actions/${action.id}`, { body: { decision: "approve" } });
  t.is(keyless.status, 400);
  t.is(keyless.body.error.param, "Idempotency-Key");
  // None of that decided anything: the foreign workspace's approval did not run the call.
  const still = await api.get(`/api/v1/runs/${run.id}`);
  t.is(still.body.turn.pending_action.id, action.id);
  t.is(toolEnd(await events(api, run.id)).length, 0);
  t.is((await api.post(`/api/v1/runs/${run.id}/cancel`, {})).status, 200);
});

test("an action of another run of the same workspace is 404 action_not_found there", async (t) => {
  const { api, gated } = t.context;
  const [a, b] = await Promise.all([waitingRun(api, gated), waitingRun(api, gated)]);
  const crossed = await api.post(`/api/v1/runs/${b.id}/actions/${a.turn.pending_action.id}`, { decision: "approve" });
  t.is(crossed.status, 404);
  t.is(crossed.body.error.code, "action_not_found");
  await Promise.all([api.post(`/api/v1/runs/${a.id}/cancel`, {}), api.post(`/api/v1/runs/${b.id}/cancel`, {})]);
});

test("steer while waiting - the input is taken (steered) and reaches the model after the decision", async (t) => {
  const { api } = t.context;
  // One gated call; past the script the model echoes the latest user text.
  const agent = await api.agentWith(gatedConfig({}, [{ tool_call: { name: "bash", arguments: { command: "echo hi" } } }]));
  const run = await waitingRun(api, agent);
  const steer = await api.post("/api/v1/runs", { run_id: run.id, input: "also this", on_busy: "steer", background: true });
  t.is(steer.status, 202, JSON.stringify(steer.body));
  t.is(steer.body.disposition, "steered");
  t.is(steer.body.turn.id, run.turn.id);
  t.is((await api.post(`/api/v1/runs/${run.id}/actions/${run.turn.pending_action.id}`, { decision: "approve" })).status, 200);
  // The echo of 600 KiB streams as ~38,000 text_delta events: ~16 s alone, more under load.
  const done = await api.waitTurn(run.id, run.turn.id, 120_000);
  t.deepEqual(done.turn.output, [{ type: "output_text", text: "also this" }]);
  const evs = await events(api, run.id);
  const steerDelivered = evs.findIndex((e) => e.type === "message_end" && e.data.message.role === "user" && e.data.message.content[0]?.text === "also this");
  t.true(steerDelivered > evs.findIndex((e) => e.type === "tool_execution_end"), "delivered after the decided call");
});

test("abuse: steering a waiting turn cannot grow its document without bound: past 1 MiB of held input a steer is 409 run_busy, and the turn still goes on", async (t) => {
  const { api } = t.context;
  const agent = await api.agentWith(gatedConfig({}, [{ tool_call: { name: "bash", arguments: { command: "echo hi" } } }]));
  const run = await waitingRun(api, agent);
  const big = "x".repeat(600 * 1024);
  const first = await api.post("/api/v1/runs", { run_id: run.id, input: big, on_busy: "steer", background: true });
  t.is(first.status, 202, JSON.stringify(first.body).slice(0, 300));
  for (let i = 0; i < 3; i++) {
    const refused = await api.post("/api/v1/runs", { run_id: run.id, input: big, on_busy: "steer", background: true });
    t.is(refused.status, 409);
    t.is(refused.body.error.code, "run_busy");
    t.true(refused.body.error.retryable);
  }
  t.is((await api.post(`/api/v1/runs/${run.id}/actions/${run.turn.pending_action.id}`, { decision: "approve" })).status, 200);
  // The echo of 600 KiB streams as ~38,000 text_delta events: ~16 s alone, more under load.
  const done = await api.waitTurn(run.id, run.turn.id, 120_000);
  t.is(done.turn.status, "completed");
  t.is(done.turn.output[0].text.length, big.length, "the one steer taken reached the model");
});

test("two gated calls in one turn wait one after the other, each with its own action", async (t) => {
  const { api } = t.context;
  const agent = await api.agentWith(
    gatedConfig({}, [
      { tool_call: { name: "bash", arguments: { command: "echo one" } }, usage: { input: 1 } },
      { tool_call: { name: "bash", arguments: { command: "echo two" } }, usage: { input: 2 } },
      { text: "both", usage: { input: 4 } },
    ]),
  );
  const run = await waitingRun(api, agent);
  const first = run.turn.pending_action;
  t.deepEqual(first.arguments, { command: "echo one" });
  t.is((await api.post(`/api/v1/runs/${run.id}/actions/${first.id}`, { decision: "approve" })).status, 200);
  const second = await api.waitRun(run.id, (r) => r.turn.pending_action && r.turn.pending_action.id !== first.id);
  t.deepEqual(second.turn.pending_action.arguments, { command: "echo two" });
  t.is((await api.post(`/api/v1/runs/${run.id}/actions/${second.turn.pending_action.id}`, { decision: "deny" })).status, 200);
  const done = await api.waitTurn(run.id, run.turn.id);
  t.deepEqual(done.turn.output, [{ type: "output_text", text: "both" }]);
  t.is(done.turn.usage.input_tokens, 7, "three model calls, none repeated");
  const ends = toolEnd(await events(api, run.id));
  t.deepEqual(ends.map((e) => [e.data.result.content[0].text.trim(), e.data.isError]), [["one", false], ["The call was denied by a person.", true]]);
});

test("ungated calls run without waiting; the policy's prefix decides", async (t) => {
  const { api } = t.context;
  const agent = await api.agentWith(gatedConfig({}, [{ tool_call: { name: "bash", arguments: { command: "printf free" } } }, { text: "ok" }]));
  const res = await api.post("/api/v1/runs", { agent, input: "go" });
  t.is(res.status, 200);
  t.is(res.body.turn.status, "completed");
  const evs = await events(api, res.body.id);
  t.is(evs.filter((e) => e.type === "tool.approval_requested").length, 0);
  t.is(toolEnd(evs)[0].data.result.content[0].text, "free");
});

test("deployment validation - approval rules are checked and refusals name the field", async (t) => {
  const { api } = t.context;
  const agent = (await api.post("/api/v1/agents", { name: "policy" })).body.id;
  const cases: Array<[unknown, string]> = [
    [{ rules: [] }, "config.approval.rules"],
    [{ rules: [{ tool: "write", command_prefix: "rm" }] }, "config.approval.rules.0.command_prefix"],
    [{ rules: [{ tool: "bash", path_glob: "*.md" }] }, "config.approval.rules.0.path_glob"],
    [{ rules: [{ tool: "curl" }] }, "config.approval.rules.0.tool"],
    [{ rules: [{ tool: "bash" }], timeout_s: 0 }, "config.approval.timeout_s"],
    [{ rules: [{ tool: "bash" }], timeout_s: 43_201 }, "config.approval.timeout_s"],
    [{ rules: [{ tool: "bash" }], on_timeout: "maybe" }, "config.approval.on_timeout"],
    [{ rules: [{ tool: "bash" }], extra: 1 }, "config.approval.extra"],
  ];
  for (const [approval, param] of cases) {
    const res = await api.post(`/api/v1/agents/${agent}/deployments`, { config: { model: "faux/scripted", approval } });
    t.is(res.status, 400, JSON.stringify(approval));
    t.is(res.body.error.param, param, JSON.stringify(approval));
  }
  const ok = await api.post(`/api/v1/agents/${agent}/deployments`, { config: { model: "faux/scripted", approval: { rules: [{ tool: "*" }, { tool: "write", path_glob: "**/*.sh" }], timeout_s: 60 } } });
  t.is(ok.status, 201);
  t.deepEqual(ok.body.config.approval, { rules: [{ tool: "*" }, { tool: "write", path_glob: "**/*.sh" }], timeout_s: 60 });
});

test("restart - a turn waiting for a decision survives the service stopping; the next service restores the wait and approving runs the call once", async (t) => {
  // Its own servers: the service under test is stopped and replaced.
  const servers = await startTestServers();
  t.teardown(() => servers.stop());
  const first = await startTestService(servers, { RUNS_WAIT_TIMEOUT_MS: "20000" });
  const ws = await newWorkspace(first);
  const agent = await ws.api.agentWith(gatedConfig());
  const run = await waitingRun(ws.api, agent);
  const action = run.turn.pending_action;
  await first.close();
  const second = await startTestService(servers, { RUNS_WAIT_TIMEOUT_MS: "20000" });
  t.teardown(() => second.close());
  const api = new Api(second.url!, ws.key);
  const still = await api.waitRun(run.id, (r) => r.turn.pending_action?.id === action.id);
  t.is(still.turn.status, "in_progress");
  const res = await api.post(`/api/v1/runs/${run.id}/actions/${action.id}`, { decision: "approve" });
  t.is(res.status, 200, JSON.stringify(res.body));
  const done = await api.waitTurn(run.id, run.turn.id, 30_000);
  t.is(done.turn.status, "completed");
  t.is(done.turn.usage.input_tokens, 110, "the call that asked was not made again");
  const evs = await events(api, run.id);
  t.is(assistantEnds(evs).length, 2);
  const ends = toolEnd(evs);
  t.is(ends.length, 1);
  t.is(ends[0].data.result.content[0].text.trim(), "1");
});

test("waiting costs nothing: a waiting turn does not count against the active-turn limit, and its wait counts toward the turn's wall-clock limit", async (t) => {
  // Its own servers: one active turn per workspace and a 4 s turn limit.
  const servers = await startTestServers();
  t.teardown(() => servers.stop());
  const service = await startTestService(servers, { RUNS_WAIT_TIMEOUT_MS: "20000", RUNS_ACTIVE_TURNS_SOLO: "1", RUNS_TURN_LIMIT_MS: "4000" });
  t.teardown(() => service.close());
  const ws = await newWorkspace(service);
  const gated = await ws.api.agentWith(gatedConfig());
  const echo = await ws.api.agentWith({ model: "faux/scripted" });
  const waiting = await waitingRun(ws.api, gated);
  const startedAt = Date.now();
  // The limit is one executing turn: another run executes while the first waits for a person.
  const other = await ws.api.post("/api/v1/runs", { agent: echo, input: "meanwhile" });
  t.is(other.status, 200);
  t.is(other.body.turn.status, "completed", JSON.stringify(other.body.turn.error));
  // Nobody decides within the turn's 4 s: the wait ends the turn at its wall-clock limit.
  const done = await ws.api.waitTurn(waiting.id, waiting.turn.id, 20_000);
  t.is(done.turn.status, "incomplete");
  t.is(done.turn.error.code, "turn_duration_limit");
  t.is(done.turn.pending_action, null);
  t.true(done.turn.duration_ms >= 3_900, `duration ${done.turn.duration_ms} ms`);
  t.true(Date.now() - startedAt < 15_000);
  const evs = await events(ws.api, waiting.id);
  // The call's start was reported when it asked; its end says it never ran.
  t.deepEqual(toolEnd(evs).map((e) => [e.data.isError, e.data.result.content[0].text]), [[true, NOT_RUN_TEXTS.limit]], "the call never ran");
  // The action was never decided: a decision now finds it settled with its turn.
  const late = await ws.api.post(`/api/v1/runs/${waiting.id}/actions/${waiting.turn.pending_action.id}`, { decision: "approve" });
  t.is(late.status, 409);
  t.is(late.body.error.code, "action_already_decided");
  t.regex(late.body.error.message, /ended before a decision/);
  // The run's session holds the unrun call answered: the next turn runs normally.
  const next = await ws.api.post("/api/v1/runs", { run_id: waiting.id, input: "after", background: true });
  t.is(next.status, 202);
  await ws.api.waitRun(waiting.id, (r) => r.turn?.id === next.body.turn.id && r.turn.pending_action != null);
});
