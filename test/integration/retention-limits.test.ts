import anyTest, { type TestFn } from "ava";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { TURN_ERROR_CATALOGUE } from "../../src/turn-errors.js";
import { setWorkspacePlan } from "../../node/workspaces.js";

const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; solo: Api; business: Api; soloWs: string }>;

const RETENTION_S = 3;

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers, {
    RUNS_RETENTION_SOLO_S: String(RETENTION_S),
    RUNS_RETENTION_BUSINESS_S: "3600",
    RUNS_SWEEP_INTERVAL_MS: "250",
    RUNS_TURN_LIMIT_MS: "1500",
    RUNS_ACTIVE_TURNS_SOLO: "1",
    RUNS_TAG_SCAN_LIMIT: "30",
  });
  const solo = await newWorkspace(service, "solo");
  const business = await newWorkspace(service, "business");
  t.context = { servers, service, solo: solo.api, business: business.api, soloWs: solo.id };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test.serial("retention - a run expires after its plan's retention from last activity: 410 run_expired everywhere, data deleted", async (t) => {
  const { solo, business, service } = t.context;
  const agent = await solo.agentWith({ model: "faux/scripted" });
  const run = (await solo.post("/api/v1/runs", { agent, input: "short-lived" })).body;
  const businessAgent = await business.agentWith({ model: "faux/scripted" });
  const kept = (await business.post("/api/v1/runs", { agent: businessAgent, input: "long-lived" })).body;

  // Reads and tag changes do not extend retention.
  await sleep(1_200);
  t.is((await solo.get(`/api/v1/runs/${run.id}`)).status, 200);
  t.is((await solo.request("POST", `/api/v1/runs/${run.id}/tags`, { body: { add: ["touch"] } })).status, 200);
  await sleep(RETENTION_S * 1000 - 1_200 + 500);

  const urls = [`/api/v1/runs/${run.id}`, `/api/v1/runs/${run.id}/turns`, `/api/v1/runs/${run.id}/turns/${run.turn.id}`];
  for (const url of urls) {
    const res = await solo.get(url);
    t.is(res.status, 410, url);
    t.is(res.body.error.code, "run_expired");
    t.is(res.body.error.type, "gone_error");
  }
  t.is((await solo.post("/api/v1/runs", { run_id: run.id, input: "x" })).status, 410);
  t.is((await solo.post(`/api/v1/runs/${run.id}/cancel`, {})).status, 410);
  t.is((await solo.request("POST", `/api/v1/runs/${run.id}/tags`, { body: { add: ["x"] } })).status, 410);
  // The sweeper deletes the data and keeps a tombstone.
  for (let i = 0; i < 40 && (await service.store.getRun(run.id)); i++) await sleep(100);
  t.is(await service.store.getRun(run.id), null);
  t.is((await service.store.listTurns(run.id)).length, 0);
  t.is((await service.store.getTombstone(run.id))?.reason, "expired");
  t.is((await solo.get(`/api/v1/runs/${run.id}`)).status, 410, "still 410 from the tombstone");
  // The business run (30-day class here: an hour) is untouched.
  t.is((await business.get(`/api/v1/runs/${kept.id}`)).status, 200);
});

test.serial("retention - a plan change applies only to runs created afterwards", async (t) => {
  const { solo, service, soloWs } = t.context;
  const agent = await solo.agentWith({ model: "faux/scripted" });
  const before = (await solo.post("/api/v1/runs", { agent, input: "solo-era" })).body;
  await setWorkspacePlan(service.store, soloWs, "business");
  await sleep(2_100); // past the auth cache, which holds the workspace
  const after = (await solo.post("/api/v1/runs", { agent, input: "business-era" })).body;
  t.is((await service.store.getRun(after.id))?.retention_s, 3600);
  t.is((await service.store.getRun(before.id))?.retention_s, RETENTION_S);
  await sleep(RETENTION_S * 1000);
  t.is((await solo.get(`/api/v1/runs/${before.id}`)).status, 410, "the older run keeps its solo retention");
  t.is((await solo.get(`/api/v1/runs/${after.id}`)).status, 200);
  await setWorkspacePlan(service.store, soloWs, "solo");
  await sleep(2_100);
});

test.serial("retention - accepting input restarts the clock", async (t) => {
  const { solo } = t.context;
  const agent = await solo.agentWith({ model: "faux/scripted" });
  const run = (await solo.post("/api/v1/runs", { agent, input: "a" })).body;
  await sleep(2_000);
  t.is((await solo.post("/api/v1/runs", { run_id: run.id, input: "b" })).status, 200);
  await sleep(2_000);
  t.is((await solo.get(`/api/v1/runs/${run.id}`)).status, 200, "4 s after start, 2 s after the last input");
});

test.serial("limits - the turn duration limit ends the turn incomplete with turn_duration_limit and its fixed message", async (t) => {
  const { business } = t.context;
  const agent = await business.agentWith({
    model: "faux/scripted",
    tools: ["bash"],
    script: [{ tool_call: { name: "bash", arguments: { command: "sleep 20" } } }, { text: "never" }],
  });
  const started = Date.now();
  const res = await business.post("/api/v1/runs", { agent, input: "long" });
  t.is(res.status, 200);
  t.true(Date.now() - started < 10_000, "ended by the limit, not by the command");
  t.is(res.body.turn.status, "incomplete");
  t.is(res.body.turn.error.code, "turn_duration_limit");
  t.is(res.body.turn.error.message, TURN_ERROR_CATALOGUE.turn_duration_limit.message);
  t.false(res.body.turn.error.retryable);
  t.is(res.body.state, "idle");
});

test.serial("limits - a turn stopped by the limit keeps its partial output and its error, readable without events", async (t) => {
  const { business } = t.context;
  const words = "steady words ".repeat(100);
  // About 325 tokens at 20 tokens per second: far longer than the 1.5 s limit.
  const agent = await business.agentWith({ model: "faux/scripted", script: [{ text: words }], tokens_per_second: 20 });
  const res = await business.post("/api/v1/runs", { agent, input: "talk" });
  t.is(res.body.turn.status, "incomplete");
  t.is(res.body.turn.error.code, "turn_duration_limit");
  const partial = res.body.turn.output.map((p: any) => p.text).join("");
  t.true(partial.length > 0, "something was produced");
  t.true(partial.length < words.length, "but not everything");
  t.true(words.startsWith(partial));
  const history = await business.get(`/api/v1/runs/${res.body.id}/turns/${res.body.turn.id}`);
  t.deepEqual(history.body.error, res.body.turn.error);
  t.deepEqual(history.body.output, res.body.turn.output);
});

test.serial("limits - over the workspace's active-turn limit a turn fails fast with concurrency_limit_reached", async (t) => {
  const { solo } = t.context;
  const agent = await solo.agentWith({
    model: "faux/scripted",
    tools: ["bash"],
    // Under this service's 1.5 s turn limit.
    script: [{ tool_call: { name: "bash", arguments: { command: "sleep 1" } } }, { text: "done" }],
  });
  const first = await solo.post("/api/v1/runs", { agent, input: "one", background: true });
  t.is(first.status, 202);
  const second = await solo.post("/api/v1/runs", { agent, input: "two" });
  t.is(second.body.turn.status, "failed");
  t.is(second.body.turn.error.code, "concurrency_limit_reached");
  t.true(second.body.turn.error.retryable);
  const done = await solo.waitTurn(first.body.id, first.body.turn.id, 15_000);
  t.is(done.turn.status, "completed");
});

test.serial("list - tag filters are answered by the store whatever the tags' frequency, past the scan cap of stock FerretDB", async (t) => {
  const { business } = t.context;
  const agent = await business.agentWith({ model: "faux/scripted" }, "tagger");
  // 40 runs carry two common tags (over the scan cap of 30); the 2 oldest also carry "rare".
  const ids: string[] = [];
  for (let i = 0; i < 40; i++) {
    const tags = ["common", "other-common"];
    if (i < 2) tags.push("rare");
    const res = await business.post("/api/v1/runs", { agent, input: `r${i}`, tags, background: true });
    ids.push(res.body.id);
  }
  const rare = await business.get(`/api/v1/runs?tag=rare&tag=common`);
  t.is(rare.status, 200);
  t.deepEqual(rare.body.data.map((r: any) => r.id).sort(), ids.slice(0, 2).sort(), "a rare tag uses its index");
  // Common tags only: the first page of 20 fills from the most recent runs.
  const common = await business.get(`/api/v1/runs?tag=common&tag=other-common&limit=20`);
  t.is(common.status, 200);
  t.is(common.body.data.length, 20);
  // A page of 100: the store looks into the tags (this build of FerretDB, as MongoDB),
  // so the scan cap of 30 (stock FerretDB's bound, tested in store-plans) does not apply.
  const all = await business.get(`/api/v1/runs?tag=common&tag=other-common&limit=100`);
  t.is(all.status, 200);
  t.deepEqual(all.body.data.map((r: any) => r.id).sort(), [...ids].sort());
  t.false(all.body.has_more);
});

test.serial("list - ordering and cursors stay consistent while runs are being updated", async (t) => {
  const { business } = t.context;
  const agent = await business.agentWith({ model: "faux/scripted" }, "churn");
  const ids: string[] = [];
  for (let i = 0; i < 12; i++) ids.push((await business.post("/api/v1/runs", { agent, input: `c${i}` })).body.id);
  const seen: string[] = [];
  let cursor: string | null = null;
  let lastActivity = Number.POSITIVE_INFINITY;
  for (let page = 0; page < 20; page++) {
    // Meanwhile another client keeps continuing runs, moving them to the front.
    await business.post("/api/v1/runs", { run_id: ids[page % ids.length], input: "bump" });
    const res: any = await business.get(`/api/v1/runs?agent_id=${agent}&limit=3${cursor ? `&after=${cursor}` : ""}`);
    t.is(res.status, 200);
    for (const run of res.body.data) {
      if (cursor) t.true(run.last_activity_at <= lastActivity, "pages continue in activity order");
      lastActivity = run.last_activity_at;
      seen.push(run.id);
    }
    cursor = res.body.has_more ? res.body.next_cursor : null;
    if (!cursor) break;
  }
  t.is(new Set(seen).size, seen.length, "no run appears twice");
});
