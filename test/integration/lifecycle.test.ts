import anyTest, { type ExecutionContext, type TestFn } from "ava";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";

const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; api: Api; other: Api; echo: string; sleeper: string }>;

/** A scripted agent whose first step runs `sleep <s>` in bash; past the script it echoes the latest user text. */
const sleepConfig = (seconds: number, then: Array<Record<string, unknown>> = []) => ({
  model: "faux/scripted",
  tools: ["bash"],
  script: [{ tool_call: { name: "bash", arguments: { command: `sleep ${seconds}` } } }, ...then],
});

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers, { RUNS_WAIT_TIMEOUT_MS: "20000", RUNS_ACTIVE_TURNS_SOLO: "1000" });
  const ws = await newWorkspace(service);
  const other = await newWorkspace(service);
  const echo = await ws.api.agentWith({ model: "faux/scripted" });
  // Long enough to still be running on a loaded machine when a test acts on it.
  const sleeper = await ws.api.agentWith(sleepConfig(8, [{ text: "slept" }]));
  t.context = { servers, service, api: ws.api, other: other.api, echo, sleeper };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

async function busyRun(api: Api, agent: string) {
  const res = await api.post("/api/v1/runs", { agent, input: "work", background: true });
  if (res.status !== 202) throw new Error(`start failed ${res.status} ${JSON.stringify(res.body)}`);
  return res.body;
}

test("continue - on an idle run every continuation starts a turn (disposition continued), whatever on_busy says", async (t) => {
  const { api, echo } = t.context;
  const run = (await api.post("/api/v1/runs", { agent: echo, input: "one" })).body;
  for (const on_busy of ["queue", "steer", "reject"]) {
    const res = await api.post("/api/v1/runs", { run_id: run.id, input: on_busy, on_busy });
    t.is(res.status, 200, on_busy);
    t.is(res.body.disposition, "continued");
    t.deepEqual(res.body.turn.output, [{ type: "output_text", text: on_busy }]);
  }
});

test("continue - queue admits one follow-up; a second is 409 run_busy; the queued turn runs after the active one", async (t) => {
  const { api, sleeper } = t.context;
  const run = await busyRun(api, sleeper);
  const queued = await api.post("/api/v1/runs", { run_id: run.id, input: "next", background: true });
  t.is(queued.status, 202);
  t.is(queued.body.disposition, "queued");
  t.is(queued.body.turn.status, "queued");
  const busyKey = `busy-${Date.now()}`;
  const second = await api.post("/api/v1/runs", { run_id: run.id, input: "too many", background: true, on_busy: "queue" }, busyKey);
  t.is(second.status, 409);
  t.is(second.body.error.code, "run_busy");
  t.true(second.body.error.retryable);
  const first = await api.waitTurn(run.id, run.turn.id, 20_000);
  t.is(first.turn.status, "completed");
  const next = await api.waitTurn(run.id, queued.body.turn.id, 20_000);
  t.is(next.turn.status, "completed");
  t.true(next.turn.started_at >= first.turn.completed_at);
  // run_busy is retryable: the same key is accepted once the run has room.
  await api.waitRun(run.id, (r) => r.state === "idle", 20_000);
  const retried = await api.post("/api/v1/runs", { run_id: run.id, input: "too many", background: true, on_busy: "queue" }, busyKey);
  t.is(retried.status, 202);
  t.is(retried.body.disposition, "continued");
});

test("continue - two queue requests racing: exactly one is queued, the other is run_busy", async (t) => {
  const { api, sleeper } = t.context;
  const run = await busyRun(api, sleeper);
  const results = await Promise.all([
    api.post("/api/v1/runs", { run_id: run.id, input: "a", background: true }),
    api.post("/api/v1/runs", { run_id: run.id, input: "b", background: true }),
  ]);
  const statuses = results.map((r) => r.status).sort();
  t.deepEqual(statuses, [202, 409]);
  t.is(results.find((r) => r.status === 409)!.body.error.code, "run_busy");
  await api.waitRun(run.id, (r) => r.state === "idle", 30_000);
});

test("continue - reject on a busy run is 409 run_busy", async (t) => {
  const { api, sleeper } = t.context;
  const run = await busyRun(api, sleeper);
  const res = await api.post("/api/v1/runs", { run_id: run.id, input: "no", on_busy: "reject" });
  t.is(res.status, 409);
  t.is(res.body.error.code, "run_busy");
  await api.waitRun(run.id, (r) => r.state === "idle", 30_000);
});

test("steer - input reaches the active turn's agent at its next step boundary", async (t) => {
  const { api } = t.context;
  // After the bash step the script is over, so the model echoes the latest user message: the steer.
  const agent = await api.agentWith(sleepConfig(4));
  const run = await busyRun(api, agent);
  const steered = await api.post("/api/v1/runs", { run_id: run.id, input: "change of plan", on_busy: "steer", background: true });
  t.is(steered.status, 202);
  t.is(steered.body.disposition, "steered");
  t.is(steered.body.turn.id, run.turn.id, "the answer selects the active turn");
  const final = await api.waitTurn(run.id, run.turn.id, 20_000);
  t.is(final.turn.status, "completed");
  t.deepEqual(final.turn.output, [{ type: "output_text", text: "change of plan" }]);
  const turns = await api.get(`/api/v1/runs/${run.id}/turns`);
  t.is(turns.body.data.length, 1, "a steer adds no turn");
});

test("steer - a default-wait steer answers when the active turn ends (its final notice), not at the next store check 3 s on", async (t) => {
  const { api } = t.context;
  const agent = await api.agentWith(sleepConfig(1));
  const run = await busyRun(api, agent);
  const steered = await api.post("/api/v1/runs", { run_id: run.id, input: "steered here", on_busy: "steer" });
  const answeredAt = Date.now();
  t.is(steered.status, 200);
  t.is(steered.body.disposition, "steered");
  t.is(steered.body.turn.id, run.turn.id);
  t.is(steered.body.turn.status, "completed");
  t.deepEqual(steered.body.turn.output, [{ type: "output_text", text: "steered here" }]);
  // Measured from the turn's stored end: a wait on the wrong notice lasted until the store
  // check 3 s after admission, ~2 s after the end of a turn with ≤ 1 s of sleep left.
  const completedAt = (await t.context.service.store.getTurn(run.turn.id))!.completed_at!;
  t.true(answeredAt - completedAt < 1_500, `answered ${answeredAt - completedAt} ms after the turn ended`);
});

test("steer - a cancelling target is 409 steering_target_ended, retryable false, and the same key answers the same", async (t) => {
  const { api, sleeper } = t.context;
  const run = await busyRun(api, sleeper);
  const cancel = await api.post(`/api/v1/runs/${run.id}/cancel`, {});
  t.is(cancel.status, 202);
  const key = `steer-${Date.now()}`;
  const res = await api.post("/api/v1/runs", { run_id: run.id, input: "late", on_busy: "steer" }, key);
  // The turn may already have settled (then the run is idle and this is a plain continuation).
  if (res.status === 409) {
    t.is(res.body.error.code, "steering_target_ended");
    t.false(res.body.error.retryable);
    const again = await api.post("/api/v1/runs", { run_id: run.id, input: "late", on_busy: "steer" }, key);
    t.is(again.status, 409);
    t.is(again.body.error.code, "steering_target_ended");
  } else {
    t.is(res.body.disposition, "continued");
  }
  await api.waitRun(run.id, (r) => r.state === "idle", 30_000);
});

test("steer - racing the turn's end: every acknowledged steer is seen by the agent", async (t) => {
  const { api } = t.context;
  const agent = await api.agentWith(sleepConfig(1));
  for (let i = 0; i < 3; i++) {
    const run = await busyRun(api, agent);
    await new Promise((r) => setTimeout(r, 900 + i * 60));
    const steer = await api.post("/api/v1/runs", { run_id: run.id, input: `steer ${i}`, on_busy: "steer", background: true });
    const final = await api.waitTurn(run.id, run.turn.id, 20_000);
    if (steer.body.disposition === "steered") {
      t.deepEqual(final.turn.output, [{ type: "output_text", text: `steer ${i}` }], "an acknowledged steer is never dropped");
    } else {
      t.true(steer.status === 409 || steer.body.disposition === "continued", JSON.stringify(steer.body));
    }
  }
});

test("cancel - every row of the transitions table", async (t) => {
  const { api, sleeper } = t.context;
  const run = await busyRun(api, sleeper);
  const queued = (await api.post("/api/v1/runs", { run_id: run.id, input: "q", background: true })).body;

  // queued → cancelled, 200
  const cq = await api.post(`/api/v1/runs/${run.id}/cancel`, { turn_id: queued.turn.id });
  t.is(cq.status, 200);
  t.is(cq.body.turn.id, queued.turn.id);
  t.is(cq.body.turn.status, "cancelled");
  t.deepEqual(cq.body.turn.output, []);

  // in_progress → cancelling, 202, then cancelled when the agent settles
  const ca = await api.post(`/api/v1/runs/${run.id}/cancel`, {});
  t.is(ca.status, 202, JSON.stringify(ca.body.turn));
  t.is(ca.body.turn.id, run.turn.id);
  t.is(ca.body.turn.status, "cancelling");
  const settled = await api.waitTurn(run.id, run.turn.id, 10_000);
  t.is(settled.turn.status, "cancelled");
  t.is(settled.turn.error, null);
  t.is(settled.state, "idle");

  // final turn → 200 unchanged; idle run with an empty body → 200 unchanged
  const again = await api.post(`/api/v1/runs/${run.id}/cancel`, { turn_id: run.turn.id });
  t.is(again.status, 200);
  t.is(again.body.turn.status, "cancelled");
  const idle = await api.request("POST", `/api/v1/runs/${run.id}/cancel`, { idempotencyKey: `idle-${Date.now()}` });
  t.is(idle.status, 200);

  // a completed turn is never relabelled
  const done = (await api.post("/api/v1/runs", { agent: t.context.echo, input: "fin" })).body;
  const cd = await api.post(`/api/v1/runs/${done.id}/cancel`, {});
  t.is(cd.status, 200);
  t.is(cd.body.turn.status, "completed");
  t.deepEqual(cd.body.turn.output, [{ type: "output_text", text: "fin" }]);
});

test("cancel - a default-wait request whose queued turn is cancelled is answered at once: 200 with the cancelled turn, as a GET shows it", async (t) => {
  const { api, sleeper } = t.context;
  const run = await busyRun(api, sleeper);
  const waiting = api.post("/api/v1/runs", { run_id: run.id, input: "queued, then cancelled", on_busy: "queue" });
  let queuedId: string | undefined;
  for (let i = 0; i < 100 && !queuedId; i++) {
    const turns = await api.get(`/api/v1/runs/${run.id}/turns`);
    queuedId = turns.body.data.find((turn: any) => turn.status === "queued")?.id;
    if (!queuedId) await new Promise((r) => setTimeout(r, 50));
  }
  if (!queuedId) return t.fail("the continuation was never queued");
  t.is((await api.post(`/api/v1/runs/${run.id}/cancel`, { turn_id: queuedId })).status, 200);
  const answer = await waiting;
  // The sleeper's active turn sleeps 8 s: the wait ended with the cancelled turn, not with it.
  t.is(answer.status, 200);
  t.is(answer.body.disposition, "queued");
  t.is(answer.body.turn.id, queuedId);
  t.is(answer.body.turn.status, "cancelled");
  const { disposition: _disposition, ...view } = answer.body;
  const read = await api.get(`/api/v1/runs/${run.id}?turn_id=${queuedId}`);
  t.deepEqual(view, read.body);
  await api.post(`/api/v1/runs/${run.id}/cancel`, {});
});

test("cancel - a repeat with the same key returns the turn it first selected; unknown turn is 404", async (t) => {
  const { api, sleeper } = t.context;
  const run = await busyRun(api, sleeper);
  const key = `cancel-${Date.now()}`;
  const first = await api.post(`/api/v1/runs/${run.id}/cancel`, {}, key);
  t.is(first.status, 202);
  await api.waitTurn(run.id, run.turn.id, 10_000);
  const next = (await api.post("/api/v1/runs", { run_id: run.id, input: "new", background: true })).body;
  const repeat = await api.post(`/api/v1/runs/${run.id}/cancel`, {}, key);
  t.is(repeat.body.turn.id, run.turn.id, "never a later turn");
  t.not(repeat.body.turn.id, next.turn.id);
  const unknown = await api.post(`/api/v1/runs/${run.id}/cancel`, { turn_id: "turn_nope" });
  t.is(unknown.status, 404);
  t.is(unknown.body.error.code, "turn_not_found");
  const noRun = await api.post(`/api/v1/runs/run_nope/cancel`, {});
  t.is(noRun.body.error.code, "run_not_found");
  await api.waitRun(run.id, (r) => r.state === "idle", 30_000);
});

test("cancel - racing completion: the answer and the stored turn agree", async (t) => {
  const { api } = t.context;
  const agent = await api.agentWith(sleepConfig(0.3, [{ text: "raced" }]));
  for (let i = 0; i < 3; i++) {
    const run = await busyRun(api, agent);
    await new Promise((r) => setTimeout(r, 250 + i * 40));
    const res = await api.post(`/api/v1/runs/${run.id}/cancel`, {});
    const final = await api.waitTurn(run.id, run.turn.id, 10_000);
    if (res.status === 202) t.is(final.turn.status, "cancelled");
    else {
      t.is(res.status, 200);
      t.is(final.turn.status, "completed");
      t.deepEqual(final.turn.output, [{ type: "output_text", text: "raced" }]);
    }
  }
});

test("delete - an idle run is deleted and then 404 everywhere; a busy run is 409 run_busy", async (t) => {
  const { api, echo, sleeper } = t.context;
  const busy = await busyRun(api, sleeper);
  const refused = await api.request("DELETE", `/api/v1/runs/${busy.id}`, { idempotencyKey: `del-${Date.now()}` });
  t.is(refused.status, 409);
  t.is(refused.body.error.code, "run_busy");

  const run = (await api.post("/api/v1/runs", { agent: echo, input: "bye" })).body;
  const noKey = await api.request("DELETE", `/api/v1/runs/${run.id}`);
  t.is(noKey.status, 400);
  t.is(noKey.body.error.param, "Idempotency-Key");
  const key = `del-${Date.now()}`;
  const del = await api.request("DELETE", `/api/v1/runs/${run.id}`, { idempotencyKey: key });
  t.is(del.status, 200);
  t.deepEqual(del.body, { id: run.id, object: "run.deleted", deleted: true });
  const repeat = await api.request("DELETE", `/api/v1/runs/${run.id}`, { idempotencyKey: key });
  t.is(repeat.status, 200, "the same key returns the first result");
  for (const url of [`/api/v1/runs/${run.id}`, `/api/v1/runs/${run.id}/turns`, `/api/v1/runs/${run.id}/turns/${run.turn.id}`]) {
    const res = await api.get(url);
    t.is(res.status, 404, url);
    t.is(res.body.error.code, "run_not_found");
  }
  t.is((await api.post("/api/v1/runs", { run_id: run.id, input: "x" })).status, 404);
  t.is((await api.post(`/api/v1/runs/${run.id}/tags`, { add: ["x"] })).status, 404);
  await api.waitRun(busy.id, (r) => r.state === "idle", 30_000);
});

test("tags - a lone surrogate is refused 400 on add and remove (it could not be stored as sent), and the run's tags stay as they were", async (t) => {
  const { api, echo } = t.context;
  const run = (await api.post("/api/v1/runs", { agent: echo, input: "x", tags: ["kept"] })).body;
  for (const body of [{ add: ["\ud800"] }, { add: ["\udbff"], remove: ["kept"] }, { remove: ["a\udc00"] }]) {
    const res = await api.request("POST", `/api/v1/runs/${run.id}/tags`, { body });
    t.is(res.status, 400, JSON.stringify(res.body));
    t.is(res.body.error.code, "invalid_request");
    t.true(["add", "remove"].includes(res.body.error.param), res.body.error.param);
  }
  t.deepEqual((await api.get(`/api/v1/runs/${run.id}`)).body.tags, ["kept"]);
});

test("tags - add and remove with set semantics; sorted; no key needed; retention and turns untouched", async (t) => {
  const { api, echo } = t.context;
  const run = (await api.post("/api/v1/runs", { agent: echo, input: "x", tags: ["b"] })).body;
  const before = (await api.get(`/api/v1/runs/${run.id}`)).body;
  const res = await api.request("POST", `/api/v1/runs/${run.id}/tags`, { body: { add: ["c", "a", "b"], remove: ["zzz"] } });
  t.is(res.status, 200);
  t.deepEqual(res.body, { object: "run_tags", run_id: run.id, tags: ["a", "b", "c"] });
  const removed = await api.request("POST", `/api/v1/runs/${run.id}/tags`, { body: { remove: ["b"] } });
  t.deepEqual(removed.body.tags, ["a", "c"]);
  const after = (await api.get(`/api/v1/runs/${run.id}`)).body;
  t.deepEqual(after.tags, ["a", "c"]);
  t.is(after.last_activity_at, before.last_activity_at, "tag changes do not extend retention");
  t.deepEqual(after.turn, before.turn);
});

test("tags - validation: neither field, tag in both, invalid tags, result over 20 names add and changes nothing", async (t) => {
  const { api, echo } = t.context;
  const run = (await api.post("/api/v1/runs", { agent: echo, input: "x", tags: ["keep"] })).body;
  const url = `/api/v1/runs/${run.id}/tags`;
  const cases: Array<[unknown, string]> = [
    [{}, "add"],
    [{ add: ["x"], remove: ["x"] }, "tags"],
    [{ add: [""] }, "add"],
    [{ remove: ["a\tb"] }, "remove"],
    [{ add: "x" }, "add"],
    [{ add: Array.from({ length: 20 }, (_, i) => `n${i}`) }, "add"],
  ];
  for (const [body, param] of cases) {
    const res = await api.request("POST", url, { body });
    t.is(res.status, 400, JSON.stringify(body));
    t.is(res.body.error.param, param, JSON.stringify(body));
  }
  t.deepEqual((await api.get(`/api/v1/runs/${run.id}`)).body.tags, ["keep"], "nothing changed");
  const ok = await api.request("POST", url, { body: { add: Array.from({ length: 19 }, (_, i) => `n${i}`) } });
  t.is(ok.status, 200);
  t.is(ok.body.tags.length, 20);
  t.is((await t.context.other.request("POST", url, { body: { add: ["x"] } })).status, 404);
});

test("tags - concurrent editors never erase each other's tags", async (t) => {
  const { api, echo } = t.context;
  const run = (await api.post("/api/v1/runs", { agent: echo, input: "x" })).body;
  await Promise.all(Array.from({ length: 15 }, (_, i) => api.request("POST", `/api/v1/runs/${run.id}/tags`, { body: { add: [`t${i}`] } })));
  const tags = (await api.get(`/api/v1/runs/${run.id}`)).body.tags;
  t.is(tags.length, 15);
});

test("turns - history oldest first with limit and cursors; another run's cursor is 400 invalid_cursor", async (t) => {
  const { api, echo } = t.context;
  const run = (await api.post("/api/v1/runs", { agent: echo, input: "t0" })).body;
  for (let i = 1; i < 5; i++) await api.post("/api/v1/runs", { run_id: run.id, input: `t${i}` });
  const page1 = await api.get(`/api/v1/runs/${run.id}/turns?limit=2`);
  t.is(page1.status, 200);
  t.is(page1.body.object, "list");
  t.deepEqual(page1.body.data.map((x: any) => x.input[0].text), ["t0", "t1"]);
  t.true(page1.body.has_more);
  const page2 = await api.get(`/api/v1/runs/${run.id}/turns?limit=2&after=${page1.body.next_cursor}`);
  t.deepEqual(page2.body.data.map((x: any) => x.input[0].text), ["t2", "t3"]);
  const page3 = await api.get(`/api/v1/runs/${run.id}/turns?limit=2&after=${page2.body.next_cursor}`);
  t.deepEqual(page3.body.data.map((x: any) => x.input[0].text), ["t4"]);
  t.false(page3.body.has_more);
  t.is(page3.body.next_cursor, null);
  for (const turn of page1.body.data) {
    for (const f of ["created_at", "started_at", "completed_at", "duration_ms"]) t.true(Number.isInteger(turn[f]), f);
  }
  const one = await api.get(`/api/v1/runs/${run.id}/turns/${page1.body.data[1].id}`);
  t.is(one.body.input[0].text, "t1");
  const otherRun = (await api.post("/api/v1/runs", { agent: echo, input: "o" })).body;
  const wrong = await api.get(`/api/v1/runs/${otherRun.id}/turns?after=${page1.body.next_cursor}`);
  t.is(wrong.status, 400);
  t.is(wrong.body.error.code, "invalid_cursor");
  t.is((await api.get(`/api/v1/runs/${run.id}/turns?limit=0`)).body.error.param, "limit");
  t.is((await api.get(`/api/v1/runs/${run.id}/turns/turn_nope`)).body.error.code, "turn_not_found");
  // A cursor of the right list with a malformed position is 400, not a store failure (issue 12, finding 6).
  for (const k of ["abc", "-1", "1e3", "", "99999999999999999999"]) {
    const forged = Buffer.from(JSON.stringify({ s: "turns", o: run.id, k, id: "turn_x" })).toString("base64url");
    const res = await api.get(`/api/v1/runs/${run.id}/turns?after=${forged}`);
    t.is(res.status, 400, k);
    t.like(res.body.error, { code: "invalid_cursor", param: "after" });
  }
});

test("turns - queued and running turns appear in history with their current status", async (t) => {
  const { api, sleeper } = t.context;
  const run = await busyRun(api, sleeper);
  await api.post("/api/v1/runs", { run_id: run.id, input: "q", background: true });
  const history = await api.get(`/api/v1/runs/${run.id}/turns`);
  t.deepEqual(
    history.body.data.map((x: any) => x.status),
    ["in_progress", "queued"],
  );
  t.is(history.body.data[1].started_at, null);
  await api.waitRun(run.id, (r) => r.state === "idle", 30_000);
});

/**
 * The key's record as a lost answer leaves it: pending with the identity its claim made
 * (`claimed`: what the done record's answer does not show), and old enough that a retry
 * re-drives the request with that identity instead of waiting for it.
 */
async function loseAnswer(servers: TestServers, operation: string, runId: string, claimed?: Record<string, unknown>): Promise<void> {
  const raw = (await servers.raw()).db.collection("idempotency");
  const latest = await raw.find({ operation, "result.run_id": runId }).sort({ created_at: -1 }).limit(1).next();
  if (!latest) throw new Error(`no ${operation} record for ${runId}`);
  await raw.updateOne({ _id: latest._id }, { $set: { state: "pending", created_at: Date.now() - 60_000, ...(claimed ? { result: claimed } : {}) } });
}

/**
 * The cancel repeated with `key` answers 200 with `selected`, cancelled; the turn `goesOn`,
 * active since, is left running (then cancelled, to free the run).
 */
async function repeatAnswers(t: ExecutionContext, api: Api, c: { runId: string; key: string; selected: string; goesOn: string }): Promise<void> {
  const repeat = await api.post(`/api/v1/runs/${c.runId}/cancel`, {}, c.key);
  t.is(repeat.status, 200, JSON.stringify(repeat.body));
  t.is(repeat.body.turn.id, c.selected, "the turn the first attempt selected");
  t.is(repeat.body.turn.status, "cancelled");
  t.is((await api.get(`/api/v1/runs/${c.runId}?turn_id=${c.goesOn}`)).body.turn.status, "in_progress", "the turn active since goes on");
  await api.post(`/api/v1/runs/${c.runId}/cancel`, { turn_id: c.goesOn });
}

test("cancel - a repeat after a lost answer cancels the turn the first attempt selected, never the queued turn that became active since (runs-api.md: a repeat returns the turn it first selected)", async (t) => {
  const { api, sleeper, servers } = t.context;
  const run = await busyRun(api, sleeper);
  const queued = (await api.post("/api/v1/runs", { run_id: run.id, input: "next", background: true, on_busy: "queue" })).body;
  const key = `cancel-lost-${run.id}`;
  const first = await api.post(`/api/v1/runs/${run.id}/cancel`, {}, key);
  t.is(first.status, 202);
  t.is(first.body.turn.id, run.turn.id);
  // The claim's identity: the request's id (recorded on the turn it cancelled) and the turns the run had then.
  const cancelIds = (await (await servers.raw()).turns.findOne({ _id: run.turn.id }))!.cancel_ids!;
  t.is(cancelIds.length, 1);
  await loseAnswer(servers, "runs.cancel", run.id, { run_id: run.id, cancel_id: cancelIds[0], before_index: 2 });
  t.is((await api.waitTurn(run.id, run.turn.id, 20_000)).turn.status, "cancelled");
  const next = await api.waitRun(run.id, (r) => r.turn.id === queued.turn.id && r.turn.status === "in_progress", 20_000);
  t.is(next.turn.status, "in_progress");
  await repeatAnswers(t, api, { runId: run.id, key, selected: run.turn.id, goesOn: queued.turn.id });
});

test("cancel - a repeat after a lost answer whose first attempt changed nothing (the run was idle) answers the turn the run had then, never one admitted since", async (t) => {
  const { api, sleeper, servers } = t.context;
  const run = await busyRun(api, sleeper);
  t.is((await api.post(`/api/v1/runs/${run.id}/cancel`, {})).status, 202);
  t.is((await api.waitTurn(run.id, run.turn.id, 20_000)).turn.status, "cancelled");
  const key = `cancel-idle-lost-${run.id}`;
  const first = await api.post(`/api/v1/runs/${run.id}/cancel`, {}, key);
  t.is(first.status, 200);
  t.is(first.body.turn.id, run.turn.id);
  // It changed nothing, so its id is on no turn; the run had one turn then.
  await loseAnswer(servers, "runs.cancel", run.id, { run_id: run.id, cancel_id: "cnl_neverrecorded000000001", before_index: 1 });
  // A turn admitted after the first attempt, sleeping.
  const later = (await api.post("/api/v1/runs", { run_id: run.id, input: "admitted later", background: true })).body;
  t.is(later.turn.status, "in_progress");
  await repeatAnswers(t, api, { runId: run.id, key, selected: run.turn.id, goesOn: later.turn.id });
});

test("continue - a repeat after a lost answer whose turn is no longer the run's latest answers that turn as before, recording no second start of it", async (t) => {
  const { api, echo, servers } = t.context;
  const run = (await api.post("/api/v1/runs", { agent: echo, input: "one" })).body;
  const key = `continue-lost-${run.id}`;
  const body = { run_id: run.id, input: "two" };
  const second = await api.post("/api/v1/runs", body, key);
  t.is(second.status, 200);
  await loseAnswer(servers, "runs.create", run.id, { run_id: run.id, turn_id: second.body.turn.id });
  // Another turn since: the one the key admitted is no longer the latest.
  t.is((await api.post("/api/v1/runs", { run_id: run.id, input: "three" })).status, 200);
  const repeat = await api.post("/api/v1/runs", body, key);
  t.is(repeat.status, 200, JSON.stringify(repeat.body));
  t.is(repeat.body.turn.id, second.body.turn.id);
  t.is(repeat.body.disposition, "continued");
  const events = (await api.get(`/api/v1/runs/${run.id}/events?limit=1000`)).body.data as Array<{ type: string; turn_id: string }>;
  t.is(events.filter((e) => e.type === "turn.started" && e.turn_id === second.body.turn.id).length, 1);
  t.is(((await api.get(`/api/v1/runs/${run.id}/turns`)).body.data as unknown[]).length, 3);
});

test("steer - a repeat after a lost answer whose steered turn has ended since answers steered with that turn; its input is not run again as a new turn", async (t) => {
  const { api, sleeper, servers } = t.context;
  const run = await busyRun(api, sleeper);
  const key = `steer-lost-${run.id}`;
  const body = { run_id: run.id, input: "steered once", on_busy: "steer", background: true };
  const first = await api.post("/api/v1/runs", body, key);
  t.is(first.status, 202, JSON.stringify(first.body));
  t.is(first.body.disposition, "steered");
  t.is(first.body.turn.id, run.turn.id);
  // The claim's identity holds the steer's id (the turn took it), not the turn's.
  const steerIds = (await (await servers.raw()).turns.findOne({ _id: run.turn.id }))!.steer_ids;
  t.is(steerIds.length, 1);
  await loseAnswer(servers, "runs.create", run.id, { run_id: run.id, turn_id: steerIds[0] });
  t.is((await api.waitTurn(run.id, run.turn.id, 20_000)).turn.status, "completed");
  const repeat = await api.post("/api/v1/runs", body, key);
  t.true(repeat.status === 200 || repeat.status === 202, JSON.stringify(repeat.body));
  t.is(repeat.body.disposition, "steered");
  t.is(repeat.body.turn.id, run.turn.id);
  const turns = (await api.get(`/api/v1/runs/${run.id}/turns`)).body.data as Array<{ id: string }>;
  t.deepEqual(turns.map((turn) => turn.id), [run.turn.id], "no second turn ran the steer's input");
});

test("retention - a run past its retention that the sweeper has not removed yet is left out of lists (the page filled from the next runs), and reading or deleting it is 410 run_expired", async (t) => {
  const { api, echo, servers } = t.context;
  const kept = (await api.post("/api/v1/runs", { agent: echo, input: "kept", tags: ["past-retention"] })).body;
  const run = (await api.post("/api/v1/runs", { agent: echo, input: "soon past", tags: ["past-retention"] })).body;
  const listed = async (limit = 20) => (await api.get(`/api/v1/runs?tag=past-retention&limit=${limit}`)).body;
  t.deepEqual((await listed()).data.map((r: any) => r.id), [run.id, kept.id]);
  // Past retention, as the clock sees it before the next sweep (every 60 s here).
  await (await servers.raw()).runs.updateOne({ _id: run.id }, { $set: { expires_at: Date.now() - 1_000 } });
  t.deepEqual((await listed()).data.map((r: any) => r.id), [kept.id]);
  // A page of one: not left empty by the run it skips.
  const one = await listed(1);
  t.deepEqual(one.data.map((r: any) => r.id), [kept.id]);
  t.false(one.has_more);
  t.is((await api.get(`/api/v1/runs/${run.id}`)).body.error?.code, "run_expired");
  const deleted = await api.request("DELETE", `/api/v1/runs/${run.id}`, { idempotencyKey: `del-${run.id}` });
  t.is(deleted.status, 410, JSON.stringify(deleted.body));
  t.is(deleted.body.error.code, "run_expired");
});

test("versions - automatic moves the run to the active version; new_run_only stays; each turn reports its version", async (t) => {
  const { api } = t.context;
  const agent = (await api.post("/api/v1/agents", { name: "upgrades" })).body.id;
  await api.deploy(agent, { model: "faux/scripted" });
  await api.waitDeployment(agent, 1);
  const run = (await api.post("/api/v1/runs", { agent, input: "v1" })).body;
  t.is(run.agent_version, 1);
  // v2 with new_run_only: an existing run stays on 1.
  await api.deploy(agent, { model: "faux/scripted" }, { upgrade_policy: "new_run_only" });
  await api.waitDeployment(agent, 2);
  const stay = (await api.post("/api/v1/runs", { run_id: run.id, input: "still" })).body;
  t.is(stay.turn.agent_version, 1);
  // v3 automatic: the next turn moves to 3.
  await api.deploy(agent, { model: "faux/scripted" }, { upgrade_policy: "automatic" });
  await api.waitDeployment(agent, 3);
  const moved = (await api.post("/api/v1/runs", { run_id: run.id, input: "moved" })).body;
  t.is(moved.turn.agent_version, 3);
  t.is(moved.agent_version, 3);
  const first = (await api.get(`/api/v1/runs/${run.id}?turn_id=${run.turn.id}`)).body;
  t.is(first.agent_version, 1, "agent_version is the selected turn's");
  // The run lists under every version its turns ran on.
  for (const v of [1, 3]) {
    const listed = await api.get(`/api/v1/runs?agent_id=${agent}&version=${v}`);
    t.true(listed.body.data.some((r: any) => r.id === run.id), `version ${v}`);
  }
  t.false((await api.get(`/api/v1/runs?agent_id=${agent}&version=2`)).body.data.some((r: any) => r.id === run.id));
});

test("versions - a queued turn on a newer version moves the run's summary and version filter only when it starts; cancelled before that, the run stays on its version", async (t) => {
  const { api } = t.context;
  const agent = (await api.post("/api/v1/agents", { name: "queued-upgrade" })).body.id;
  await api.deploy(agent, sleepConfig(12, [{ text: "slept" }]));
  await api.waitDeployment(agent, 1);
  const run = await busyRun(api, agent);
  // v2 automatic: a turn admitted now runs on 2.
  await api.deploy(agent, { model: "faux/scripted" }, { upgrade_policy: "automatic" });
  await api.waitDeployment(agent, 2);
  const summary = async () => (await api.get(`/api/v1/runs?agent_id=${agent}`)).body.data.find((r: any) => r.id === run.id);
  const listedUnder = async (version: number) => (await api.get(`/api/v1/runs?agent_id=${agent}&version=${version}`)).body.data.some((r: any) => r.id === run.id);
  const queued = (await api.post("/api/v1/runs", { run_id: run.id, input: "on two", background: true, on_busy: "queue" })).body;
  t.is(queued.disposition, "queued");
  t.is(queued.turn.agent_version, 2);
  t.is(queued.agent_version, 2, "the selected (queued) turn's version");
  t.is((await summary()).agent_version, 1, "the workspace is still on 1");
  t.false(await listedUnder(2));
  // Cancelled before it started: the run never ran on 2.
  t.is((await api.post(`/api/v1/runs/${run.id}/cancel`, { turn_id: queued.turn.id })).status, 200);
  t.is((await summary()).agent_version, 1);
  t.false(await listedUnder(2));
  // Queued again, it starts when the first turn ends: then the run is on 2.
  const again = (await api.post("/api/v1/runs", { run_id: run.id, input: "on two again", background: true, on_busy: "queue" })).body;
  t.is(again.disposition, "queued");
  t.is((await summary()).agent_version, 1);
  t.is((await api.waitTurn(run.id, run.turn.id, 30_000)).turn.status, "completed");
  t.is((await api.waitTurn(run.id, again.turn.id, 30_000)).turn.status, "completed");
  t.is((await summary()).agent_version, 2);
  t.true(await listedUnder(1));
  t.true(await listedUnder(2));
});

test("versions - an exact-version start runs there; the idempotent retry returns the same turn after another activation; another version is 409", async (t) => {
  const { api } = t.context;
  const agent = (await api.post("/api/v1/agents", { name: "pinned" })).body.id;
  await api.deploy(agent, { model: "faux/scripted", script: [{ text: "one" }] });
  await api.waitDeployment(agent, 1);
  await api.deploy(agent, { model: "faux/scripted", script: [{ text: "two" }] }, { activate: false });
  await api.waitDeployment(agent, 2);
  const key = `pin-${Date.now()}`;
  const first = await api.post("/api/v1/runs", { agent, version: 2, input: "x" }, key);
  t.is(first.body.agent_version, 2);
  await api.post(`/api/v1/agents/${agent}/deployments/1/activate`);
  const retry = await api.post("/api/v1/runs", { agent, version: 2, input: "x" }, key);
  t.is(retry.body.turn.id, first.body.turn.id);
  t.is(retry.body.agent_version, 2);
  const conflict = await api.post("/api/v1/runs", { agent, version: 1, input: "x" }, key);
  t.is(conflict.status, 409);
  t.is(conflict.body.error.code, "idempotency_conflict");
});

test("list - filters, ordering by activity, summaries without turns, cursors", async (t) => {
  const { api } = t.context;
  const agent = await api.agentWith({ model: "faux/scripted" }, "lister");
  const ids: string[] = [];
  for (let i = 0; i < 5; i++) ids.push((await api.post("/api/v1/runs", { agent, input: `r${i}`, tags: i % 2 ? ["odd", "all"] : ["even", "all"] })).body.id);
  // Touch the first run: it becomes the most recently active.
  await new Promise((r) => setTimeout(r, 1100));
  await api.post("/api/v1/runs", { run_id: ids[0], input: "again" });
  const all = await api.get(`/api/v1/runs?agent_id=${agent}`);
  t.is(all.status, 200);
  t.is(all.body.data[0].id, ids[0]);
  t.deepEqual(Object.keys(all.body.data[0]).sort(), ["agent_id", "agent_version", "created_at", "id", "last_activity_at", "object", "pending_action", "state", "tags", "usage"]);
  // A summary carries the run's usage (additive; issue 16) and what it waits for (null here;
  // additive; issue 18), never its turns.
  t.is(all.body.data[0].pending_action, null);
  t.deepEqual(Object.keys(all.body.data[0].usage).sort(), ["cache_read_tokens", "cache_write_tokens", "cost_usd", "input_tokens", "output_tokens"]);
  t.is(all.body.data.length, 5);
  const odd = await api.get(`/api/v1/runs?agent_id=${agent}&tag=odd&tag=all`);
  t.deepEqual(odd.body.data.map((r: any) => r.id).sort(), [ids[1], ids[3]].sort());
  const none = await api.get(`/api/v1/runs?agent_id=${agent}&tag=odd&tag=even`);
  t.is(none.body.data.length, 0);
  const idle = await api.get(`/api/v1/runs?agent_id=${agent}&state=idle`);
  t.is(idle.body.data.length, 5);
  const future = await api.get(`/api/v1/runs?agent_id=${agent}&created_after=${Math.floor(Date.now() / 1000) + 60}`);
  t.is(future.body.data.length, 0);
  const past = await api.get(`/api/v1/runs?agent_id=${agent}&created_before=${Math.floor(Date.now() / 1000) + 60}`);
  t.is(past.body.data.length, 5);
  // Pages of 2 cover all five exactly once.
  const seen: string[] = [];
  let cursor: string | null = null;
  for (let i = 0; i < 10; i++) {
    const page: any = await api.get(`/api/v1/runs?agent_id=${agent}&limit=2${cursor ? `&after=${cursor}` : ""}`);
    seen.push(...page.body.data.map((r: any) => r.id));
    cursor = page.body.has_more ? page.body.next_cursor : null;
    if (!cursor) break;
  }
  t.deepEqual([...seen].sort(), [...ids].sort());
});

test("list - created_after and created_before include a run created at that very second; a tag filter matches exactly, case and all", async (t) => {
  const { api } = t.context;
  const agent = await api.agentWith({ model: "faux/scripted" }, "list-edges");
  const run = (await api.post("/api/v1/runs", { agent, input: "x", tags: ["Case"] })).body;
  const at = run.created_at as number;
  t.true(Number.isInteger(at));
  const ids = async (query: string) => (await api.get(`/api/v1/runs?agent_id=${agent}&${query}`)).body.data.map((r: any) => r.id);
  t.deepEqual(await ids(`created_after=${at}&created_before=${at}`), [run.id]);
  t.deepEqual(await ids(`created_after=${at + 1}`), []);
  t.deepEqual(await ids(`created_before=${at - 1}`), []);
  t.deepEqual(await ids("tag=Case"), [run.id]);
  t.deepEqual(await ids("tag=case"), []);
  t.deepEqual(await ids("tag=CASE"), []);
  t.deepEqual(await ids(`tag=${encodeURIComponent(" Case")}`), []);
});

test("list - validation: six tags, bad tag, limit, state, version, another workspace's cursor", async (t) => {
  const { api, other } = t.context;
  const six = Array.from({ length: 6 }, (_, i) => `tag=t${i}`).join("&");
  t.is((await api.get(`/api/v1/runs?${six}`)).body.error.param, "tag");
  t.is((await api.get(`/api/v1/runs?tag=${encodeURIComponent("a\tb")}`)).body.error.param, "tag");
  t.is((await api.get(`/api/v1/runs?tag=`)).body.error.param, "tag");
  // Encoded bytes that are not UTF-8 name no tag (the parser would keep "%FF" as typed).
  for (const query of ["tag=%FF", "tag=a&tag=b%E2%82"]) {
    const notUtf8 = await api.get(`/api/v1/runs?${query}`);
    t.is(notUtf8.status, 400, query);
    t.like(notUtf8.body.error, { code: "invalid_request", param: "tag" }, query);
  }
  t.is((await api.get(`/api/v1/runs?utm=%FF`)).status, 200, "a parameter the route does not read is ignored, as its value is");
  t.is((await api.get(`/api/v1/runs?limit=101`)).body.error.param, "limit");
  t.is((await api.get(`/api/v1/runs?state=sleepy`)).body.error.param, "state");
  t.is((await api.get(`/api/v1/runs?version=0`)).body.error.param, "version");
  t.is((await api.get(`/api/v1/runs?created_after=yesterday`)).body.error.param, "created_after");
  // An empty agent filter names no agent: refused, not taken as "any" nor as "none".
  const emptyAgent = await api.get(`/api/v1/runs?agent_id=`);
  t.is(emptyAgent.status, 400);
  t.is(emptyAgent.body.error.param, "agent_id");
  await api.post("/api/v1/runs", { agent: t.context.echo, input: "one" });
  await api.post("/api/v1/runs", { agent: t.context.echo, input: "two" });
  const page = await api.get(`/api/v1/runs?limit=1`);
  t.truthy(page.body.next_cursor);
  const foreign = await other.get(`/api/v1/runs?after=${page.body.next_cursor}`);
  t.is(foreign.status, 400);
  t.is(foreign.body.error.code, "invalid_cursor");
});
