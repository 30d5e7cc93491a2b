import anyTest, { type TestFn } from "ava";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";

const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; api: Api; other: Api; echoAgent: string }>;

const WAIT_MS = 4_000;

test.before(async (t) => {
  const servers = await startTestServers();
  // The file's tests run at once in one solo workspace: a dozen turns, some sleeping for
  // seconds in bash, can overlap past the plan's 10 active turns (a turn over it would fail
  // concurrency_limit_reached and a test with it). The limit has tests of its own.
  const service = await startTestService(servers, { RUNS_WAIT_TIMEOUT_MS: String(WAIT_MS), RUNS_ACTIVE_TURNS_SOLO: "1000" });
  const ws = await newWorkspace(service);
  const other = await newWorkspace(service);
  const echoAgent = await ws.api.agentWith({ model: "faux/scripted" });
  t.context = { servers, service, api: ws.api, other: other.api, echoAgent };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

test("runs - start on the active deployment waits and answers 200 with the echoed output", async (t) => {
  const { api, echoAgent } = t.context;
  const res = await api.post("/api/v1/runs", { agent: echoAgent, input: "hello there" });
  t.is(res.status, 200);
  const run = res.body;
  t.regex(run.id, /^run_/);
  t.is(run.object, "run");
  t.is(run.agent_id, echoAgent);
  t.is(run.agent_version, 1);
  t.is(run.state, "idle");
  t.is(run.disposition, "created");
  t.deepEqual(run.tags, []);
  t.regex(run.turn.id, /^turn_/);
  t.is(run.turn.object, "turn");
  t.is(run.turn.status, "completed");
  t.is(run.turn.agent_version, 1);
  t.deepEqual(run.turn.input, [{ type: "input_text", text: "hello there" }]);
  t.deepEqual(run.turn.output, [{ type: "output_text", text: "hello there" }]);
  t.is(run.turn.error, null);
  for (const field of ["created_at", "started_at", "completed_at"]) t.true(Number.isInteger(run.turn[field]), field);
  t.true(run.turn.duration_ms >= 0);
  t.true(run.turn.created_at < 1e11, "timestamps are Unix seconds");
});

test.serial("runs - a default wait is answered from the turn's final notice: no run or turn read, the same body a GET then shows", async (t) => {
  const { api, echoAgent, service } = t.context;
  const store = service.store;
  const reads = { runs: 0, turns: 0 };
  const { getRun, getTurn } = store;
  // Counted, not replaced: the store's own methods answer (serial: nothing else runs meanwhile).
  store.getRun = (...args) => (reads.runs++, getRun.apply(store, args));
  store.getTurn = (...args) => (reads.turns++, getTurn.apply(store, args));
  let res;
  try {
    res = await api.post("/api/v1/runs", { agent: echoAgent, input: "from the notice", tags: ["b", "a"] });
  } finally {
    store.getRun = getRun;
    store.getTurn = getTurn;
  }
  t.is(res.status, 200);
  t.deepEqual(reads, { runs: 0, turns: 0 });
  t.is(res.body.turn.status, "completed");
  t.deepEqual(res.body.turn.output, [{ type: "output_text", text: "from the notice" }]);
  const { disposition, ...view } = res.body;
  t.is(disposition, "created");
  const read = await api.get(`/api/v1/runs/${res.body.id}?turn_id=${res.body.turn.id}`);
  t.deepEqual(view, read.body);
});

test("runs - a bash step then a text step completes with that text", async (t) => {
  const { api } = t.context;
  const agent = await api.agentWith({
    model: "faux/scripted",
    tools: ["bash"],
    script: [{ tool_call: { name: "bash", arguments: { command: "sleep 2 && echo slept > proof.txt" } } }, { text: "all done" }],
  });
  const started = Date.now();
  const res = await api.post("/api/v1/runs", { agent, input: "go" });
  t.is(res.status, 200);
  t.true(Date.now() - started >= 2_000, "the bash step really ran");
  t.is(res.body.turn.status, "completed");
  t.deepEqual(res.body.turn.output, [{ type: "output_text", text: "all done" }]);
});

test("runs - input parts: input_text and an inline text file reach the agent", async (t) => {
  const { api, echoAgent } = t.context;
  const res = await api.post("/api/v1/runs", {
    agent: echoAgent,
    input: [
      { type: "input_text", text: "read this" },
      { type: "input_file", filename: "note.txt", file_data: Buffer.from("file body").toString("base64") },
    ],
  });
  t.is(res.status, 200);
  t.is(res.body.turn.input.length, 2);
  t.is(res.body.turn.input[1].filename, "note.txt");
  t.is(res.body.turn.status, "completed");
});

test("runs - background answers 202 after admission and the turn completes", async (t) => {
  const { api, echoAgent } = t.context;
  const res = await api.post("/api/v1/runs", { agent: echoAgent, input: "bg", background: true });
  t.is(res.status, 202);
  t.is(res.body.disposition, "created");
  t.is(res.headers.get("location"), `/api/v1/runs/${res.body.id}?turn_id=${res.body.turn.id}`);
  const final = await api.waitTurn(res.body.id, res.body.turn.id);
  t.is(final.turn.status, "completed");
  t.deepEqual(final.turn.output, [{ type: "output_text", text: "bg" }]);
});

test("runs - default wait past its limit answers 202 with Location and the turn keeps running once", async (t) => {
  const { api } = t.context;
  const agent = await api.agentWith({
    model: "faux/scripted",
    tools: ["bash"],
    script: [{ tool_call: { name: "bash", arguments: { command: `sleep ${WAIT_MS / 1000 + 2}; echo x >> count.txt` } } }, { text: "late" }],
  });
  const res = await api.post("/api/v1/runs", { agent, input: "slow" });
  t.is(res.status, 202);
  t.is(res.body.turn.status, "in_progress");
  t.is(res.body.state, "busy");
  t.is(res.headers.get("location"), `/api/v1/runs/${res.body.id}?turn_id=${res.body.turn.id}`);
  const final = await api.waitTurn(res.body.id, res.body.turn.id, 20_000);
  t.is(final.turn.status, "completed");
  t.deepEqual(final.turn.output, [{ type: "output_text", text: "late" }]);
});

test("runs - GET run selects the latest turn, or the one named by turn_id", async (t) => {
  const { api, echoAgent } = t.context;
  const first = await api.post("/api/v1/runs", { agent: echoAgent, input: "one" });
  const second = await api.post("/api/v1/runs", { run_id: first.body.id, input: "two" });
  t.is(second.status, 200);
  t.is(second.body.disposition, "continued");
  const latest = await api.get(`/api/v1/runs/${first.body.id}`);
  t.is(latest.status, 200);
  t.is(latest.body.turn.id, second.body.turn.id);
  t.false("disposition" in latest.body);
  const named = await api.get(`/api/v1/runs/${first.body.id}?turn_id=${first.body.turn.id}`);
  t.is(named.body.turn.id, first.body.turn.id);
  t.deepEqual(named.body.turn.output, [{ type: "output_text", text: "one" }]);
});

test("runs - unknown run is 404 run_not_found and unknown turn 404 turn_not_found", async (t) => {
  const { api, echoAgent } = t.context;
  const missing = await api.get("/api/v1/runs/run_doesnotexist");
  t.is(missing.status, 404);
  t.is(missing.body.error.code, "run_not_found");
  t.is(missing.body.error.type, "not_found_error");
  const run = await api.post("/api/v1/runs", { agent: echoAgent, input: "x" });
  const badTurn = await api.get(`/api/v1/runs/${run.body.id}?turn_id=turn_nope`);
  t.is(badTurn.status, 404);
  t.is(badTurn.body.error.code, "turn_not_found");
});

test("runs - another workspace's run and agent are not found", async (t) => {
  const { api, other, echoAgent } = t.context;
  const run = await api.post("/api/v1/runs", { agent: echoAgent, input: "mine" });
  const read = await other.get(`/api/v1/runs/${run.body.id}`);
  t.is(read.status, 404);
  t.is(read.body.error.code, "run_not_found");
  const start = await other.post("/api/v1/runs", { agent: echoAgent, input: "steal" });
  t.is(start.status, 404);
  t.is(start.body.error.code, "agent_not_found");
  const startVersion = await other.post("/api/v1/runs", { agent: echoAgent, version: 1, input: "steal" });
  t.is(startVersion.body.error.code, "agent_not_found");
  const cont = await other.post("/api/v1/runs", { run_id: run.body.id, input: "steal" });
  t.is(cont.status, 404);
  t.is(cont.body.error.code, "run_not_found");
});

const badBodies: Array<[string, Record<string, unknown>, string]> = [
  ["neither agent nor run_id (rule 1)", { input: "x" }, "agent"],
  ["both agent and run_id (rule 1)", { agent: "agt_x", run_id: "run_x", input: "x" }, "run_id"],
  ["background and stream (rule 2)", { agent: "agt_x", input: "x", background: true, stream: true }, "stream"],
  ["version with run_id (rule 8)", { run_id: "run_x", version: 1, input: "x" }, "version"],
  ["version zero (rule 8)", { agent: "agt_x", version: 0, input: "x" }, "version"],
  ["version negative (rule 8)", { agent: "agt_x", version: -2, input: "x" }, "version"],
  ["version fractional (rule 8)", { agent: "agt_x", version: 1.5, input: "x" }, "version"],
  ["version as string (rule 8)", { agent: "agt_x", version: "1", input: "x" }, "version"],
  ["tags with run_id (rule 12)", { run_id: "run_x", tags: ["a"], input: "x" }, "tags"],
  ["empty tag (rule 12)", { agent: "agt_x", tags: [""], input: "x" }, "tags"],
  ["whitespace tag (rule 12)", { agent: "agt_x", tags: ["   "], input: "x" }, "tags"],
  ["tab in tag (rule 12)", { agent: "agt_x", tags: ["a\tb"], input: "x" }, "tags"],
  ["line break in tag (rule 12)", { agent: "agt_x", tags: ["a\nb"], input: "x" }, "tags"],
  ["65-character tag (rule 12)", { agent: "agt_x", tags: ["x".repeat(65)], input: "x" }, "tags"],
  // Not storable as sent: the store's UTF-8 would read both back as one repeated U+FFFD.
  ["lone surrogates in tags (rule 12)", { agent: "agt_x", tags: ["\ud800", "a\udc00"], input: "x" }, "tags"],
  ["21 tags (rule 12)", { agent: "agt_x", tags: Array.from({ length: 21 }, (_, i) => `t${i}`), input: "x" }, "tags"],
  ["missing input", { agent: "agt_x" }, "input"],
  ["bad input part", { agent: "agt_x", input: [{ type: "input_image" }] }, "input"],
  // As an upload's name would be refused (POST /api/v1/files): a NUL or a line break in an inline file's name.
  ["inline file name with a NUL", { agent: "agt_x", input: [{ type: "input_file", filename: "a\u0000b.txt", file_data: "aGk=" }] }, "input"],
  ["inline file name with a line break", { agent: "agt_x", input: [{ type: "input_file", filename: "a\nb.txt", file_data: "aGk=" }] }, "input"],
  // An inline file without its data had thrown a TypeError in the parts' byte count (found by a unit test).
  ["inline file without file_data", { agent: "agt_x", input: [{ type: "input_file", filename: "a.txt" }] }, "input"],
  ["inline file without file_data, after a text", { agent: "agt_x", input: [{ type: "input_text", text: "x" }, { type: "input_file", filename: "a.txt", media_type: "text/plain" }] }, "input"],
  ["inline file as a data: URL", { agent: "agt_x", input: [{ type: "input_file", filename: "a.txt", file_data: "data:text/plain;base64,aGk=" }] }, "input"],
  ["on_busy with agent", { agent: "agt_x", input: "x", on_busy: "queue" }, "on_busy"],
  ["unknown on_busy", { run_id: "run_x", input: "x", on_busy: "later" }, "on_busy"],
  ["unknown field", { agent: "agt_x", input: "x", colour: "red" }, "colour"],
];

for (const [name, body, param] of badBodies) {
  test(`runs - ${name} is 400 invalid_request param ${param}`, async (t) => {
    const res = await t.context.api.post("/api/v1/runs", body);
    t.is(res.status, 400);
    t.is(res.body.error.code, "invalid_request");
    t.is(res.body.error.type, "invalid_request_error");
    t.is(res.body.error.param, param);
    t.is(typeof res.body.error.message, "string");
  });
}

test("runs - 20 distinct tags with repeats are accepted, stored exactly and sorted (rule 12)", async (t) => {
  const { api, echoAgent } = t.context;
  const tags = [...Array.from({ length: 20 }, (_, i) => `T-${String(i).padStart(2, "0")}`), "T-00", " padded ", "ünï"].slice(0, 22);
  const distinct = [...new Set(tags)];
  t.is(distinct.length, 22 - 1);
  const ok = await api.post("/api/v1/runs", { agent: echoAgent, input: "x", tags: distinct.slice(0, 19).concat(["T-00", " padded "]) });
  t.is(ok.status, 200);
  t.deepEqual(ok.body.tags, [...new Set(distinct.slice(0, 19).concat([" padded "]))].sort());
  t.true(ok.body.tags.includes(" padded "), "not trimmed");
});

test("runs - version rules 7, 9: exact version, missing version, version not ready", async (t) => {
  const { api } = t.context;
  const agent = await api.post("/api/v1/agents", { name: "versions" });
  const agentId = agent.body.id;
  const v1 = await api.deploy(agentId, { model: "faux/scripted", script: [{ text: "from v1" }] });
  await api.waitDeployment(agentId, v1.version);
  const v2 = await api.deploy(agentId, { model: "faux/scripted", script: [{ text: "from v2" }] });
  await api.waitDeployment(agentId, v2.version);
  // v2 is active now; an exact start on v1 runs there without activating it.
  const onV1 = await api.post("/api/v1/runs", { agent: agentId, version: 1, input: "x" });
  t.is(onV1.status, 200);
  t.is(onV1.body.agent_version, 1);
  t.deepEqual(onV1.body.turn.output, [{ type: "output_text", text: "from v1" }]);
  const agentNow = await api.get(`/api/v1/agents/${agentId}`);
  t.is(agentNow.body.active_version, 2);
  const active = await api.post("/api/v1/runs", { agent: agentId, input: "x" });
  t.is(active.body.agent_version, 2);

  const never = await api.post("/api/v1/runs", { agent: agentId, version: 99, input: "x" });
  t.is(never.status, 404);
  t.is(never.body.error.code, "agent_version_not_found");

  const failed = await api.deploy(agentId, { model: "nosuch/model-x" }, { activate: false });
  const built = await api.waitDeployment(agentId, failed.version);
  t.is(built.status, "failed");
  const notReady = await api.post("/api/v1/runs", { agent: agentId, version: failed.version, input: "x" });
  t.is(notReady.status, 409);
  t.is(notReady.body.error.code, "agent_version_not_ready");

  const unknown = await api.post("/api/v1/runs", { agent: "agt_unknown", version: 1, input: "x" });
  t.is(unknown.status, 404);
  t.is(unknown.body.error.code, "agent_not_found");
});

test("runs - a version still building is 409 agent_version_not_ready", async (t) => {
  const { api } = t.context;
  const agent = await api.post("/api/v1/agents", { name: "building" });
  const dep = await api.deploy(agent.body.id, { model: "faux/scripted" });
  t.is(dep.status, "building");
  // Ask at once, while the build is (very likely) still pending; accept only the two legal answers.
  const res = await api.post("/api/v1/runs", { agent: agent.body.id, version: dep.version, input: "x" });
  if (res.status === 409) t.is(res.body.error.code, "agent_version_not_ready");
  else t.is(res.status, 200);
});

test("runs - Idempotency-Key is required and a retry returns the same run and turn", async (t) => {
  const { api, echoAgent } = t.context;
  const missing = await api.request("POST", "/api/v1/runs", { body: { agent: echoAgent, input: "x" } });
  t.is(missing.status, 400);
  t.is(missing.body.error.param, "Idempotency-Key");

  const key = `idem-${Date.now()}`;
  const first = await api.post("/api/v1/runs", { agent: echoAgent, input: "same", tags: ["b", "a"] }, key);
  const retry = await api.post("/api/v1/runs", { agent: echoAgent, input: "same", tags: ["a", "b"], background: true }, key);
  t.is(first.status, 200);
  t.is(retry.body.id, first.body.id);
  t.is(retry.body.turn.id, first.body.turn.id);

  const otherTags = await api.post("/api/v1/runs", { agent: echoAgent, input: "same", tags: ["c"] }, key);
  t.is(otherTags.status, 409);
  t.is(otherTags.body.error.code, "idempotency_conflict");
  const otherVersion = await api.post("/api/v1/runs", { agent: echoAgent, version: 1, input: "same", tags: ["a", "b"] }, key);
  t.is(otherVersion.status, 409);
  t.is(otherVersion.body.error.code, "idempotency_conflict");
});

test.serial("runs - the key's record is completed after the answer: when that write fails, the answer stands and a retry gets the same run and turn", async (t) => {
  const { api, echoAgent, service } = t.context;
  const store = service.store;
  const complete = store.completeIdempotency;
  let failed = 0;
  // Fails once, as a store that went away would (serial: nothing else runs meanwhile).
  store.completeIdempotency = async () => {
    store.completeIdempotency = complete;
    failed++;
    throw new Error("store away for a moment");
  };
  const key = `complete-fails-${Date.now()}`;
  try {
    const first = await api.post("/api/v1/runs", { agent: echoAgent, input: "once" }, key);
    t.is(first.status, 200);
    t.is(first.body.turn.status, "completed");
    // The claim stays pending: the retry waits for it to go stale, then re-drives the same ids.
    const retry = await api.post("/api/v1/runs", { agent: echoAgent, input: "once" }, key);
    t.is(failed, 1);
    t.is(retry.status, 200);
    t.is(retry.body.id, first.body.id);
    t.is(retry.body.turn.id, first.body.turn.id);
    t.deepEqual(retry.body.turn.output, [{ type: "output_text", text: "once" }]);
    const turns = await api.get(`/api/v1/runs/${first.body.id}/turns`);
    t.is(turns.body.data.length, 1, "the retry admitted no second turn");
  } finally {
    store.completeIdempotency = complete;
  }
});

test.serial("runs - a retry re-driving a start whose run was deleted meanwhile (its key's record left pending) answers 404 and does not make the run again", async (t) => {
  const { api, echoAgent, service, servers } = t.context;
  const store = service.store;
  const complete = store.completeIdempotency;
  // The record's completion fails once (serial: nothing else runs meanwhile): the claim stays pending.
  store.completeIdempotency = async () => {
    store.completeIdempotency = complete;
    throw new Error("store away for a moment");
  };
  const key = `redrive-deleted-${Date.now()}`;
  try {
    const first = await api.post("/api/v1/runs", { agent: echoAgent, input: "once" }, key);
    t.is(first.status, 200);
    t.is((await api.request("DELETE", `/api/v1/runs/${first.body.id}`, { idempotencyKey: `del-${key}` })).status, 200);
    const raw = await servers.raw();
    const record = () => raw.idempotency.findOne({ operation: "runs.create", "result.run_id": first.body.id });
    t.is((await record())?.state, "pending", "the key's record was left pending: the retry re-drives it");
    for (let i = 0; i < 2; i++) {
      // The first retry re-drives the pending claim's ids; the second finds the key's record done.
      const retry = await api.post("/api/v1/runs", { agent: echoAgent, input: "once" }, key);
      t.is(retry.status, 404, JSON.stringify(retry.body));
      t.is(retry.body.error.code, "run_not_found");
      // A start names no run: the answer names no field of it (found by a probe: run_id).
      t.is(retry.body.error.param, null);
      // The record is completed after the answer (an admitted start's answer does not wait for it).
      for (let k = 0; k < 100 && (await record())?.state !== "done"; k++) await new Promise((resolve) => setTimeout(resolve, 50));
      t.is((await record())?.state, "done", "the key stays bound to the deleted run");
    }
    t.is((await api.get(`/api/v1/runs/${first.body.id}`)).status, 404, "the run stays deleted");
    t.is(await raw.runs.countDocuments({ _id: first.body.id }), 0);
    t.is(await raw.turns.countDocuments({ run_id: first.body.id }), 0);
  } finally {
    store.completeIdempotency = complete;
  }
});

test("runs - two concurrent requests with one key create one run", async (t) => {
  const { api, echoAgent } = t.context;
  const key = `race-${Date.now()}`;
  const [a, b] = await Promise.all([
    api.post("/api/v1/runs", { agent: echoAgent, input: "race", background: true }, key),
    api.post("/api/v1/runs", { agent: echoAgent, input: "race", background: true }, key),
  ]);
  t.is(a.status, 202);
  t.is(b.status, 202);
  t.is(a.body.id, b.body.id);
  t.is(a.body.turn.id, b.body.turn.id);
});

test("errors - malformed JSON, unknown /api path and the error body shape", async (t) => {
  const { api } = t.context;
  const bad = await api.request("POST", "/api/v1/runs", { rawBody: "{not json", idempotencyKey: "k" });
  t.is(bad.status, 400);
  t.is(bad.body.error.code, "invalid_request");
  t.true("param" in bad.body.error);
  const nowhere = await api.get("/api/v1/nowhere");
  t.is(nowhere.status, 404);
  t.is(nowhere.body.error.code, "not_found");
  t.is(nowhere.body.error.param, null);
});

test("runs - an oversized inline file is 413", async (t) => {
  const { api, echoAgent } = t.context;
  const data = Buffer.alloc(4 * 1024 * 1024 + 10, 1).toString("base64");
  const res = await api.post("/api/v1/runs", { agent: echoAgent, input: [{ type: "input_file", filename: "big.bin", file_data: data }] });
  t.is(res.status, 413);
  t.is(res.body.error.code, "payload_too_large");
});
