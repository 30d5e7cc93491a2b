import test from "ava";
import { RunsApiError, RunsClient, RunsWaitTimeoutError, type FetchLike } from "../../client/client.js";
import type { Run, RunEvent } from "../../client/types.js";

/** A scripted answer of the fake server: a Response, or an Error thrown by fetch. */
type Answer = Response | Error | ((request: Recorded) => Response | Error);

interface Recorded {
  method: string;
  url: string;
  headers: Record<string, string>;
  body: string | undefined;
}

/**
 * A client over a fake fetch that answers from `answers` in order, and a fake clock that
 * only moves when the client sleeps; every sleep is recorded.
 */
function harness(answers: Answer[], options: { random?: number; maxRetries?: number } = {}) {
  const requests: Recorded[] = [];
  const sleeps: number[] = [];
  let nowMs = 1_000_000;
  let keys = 0;
  const fetch: FetchLike = async (url, init) => {
    const headers: Record<string, string> = {};
    for (const [name, value] of Object.entries((init.headers ?? {}) as Record<string, string>)) headers[name.toLowerCase()] = value;
    const recorded = { method: init.method ?? "GET", url, headers, body: typeof init.body === "string" ? init.body : undefined };
    requests.push(recorded);
    let answer = answers.shift();
    if (answer === undefined) throw new Error(`unexpected request ${recorded.method} ${url}`);
    if (typeof answer === "function") answer = answer(recorded);
    if (answer instanceof Error) throw answer;
    return answer;
  };
  const client = new RunsClient({
    baseUrl: "http://runs.test/",
    apiKey: "rk_live_test",
    fetch,
    maxRetries: options.maxRetries,
    random: () => options.random ?? 0,
    now: () => nowMs,
    newIdempotencyKey: () => `key-${++keys}`,
    sleep: async (ms, signal) => {
      if (signal?.aborted) throw signal.reason;
      sleeps.push(ms);
      nowMs += ms;
    },
  });
  return { client, requests, sleeps, keysIssued: () => keys, answers };
}

function json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json", ...headers } });
}

function error(status: number, code: string, headers: Record<string, string> = {}, extra: Record<string, unknown> = {}): Response {
  return json(status, { error: { message: `${code} happened`, type: "unavailable_error", param: null, code, ...extra } }, headers);
}

function run(status: string, overrides: Partial<Run> = {}): Run {
  return {
    id: "run_1",
    object: "run",
    agent_id: "agt_1",
    agent_version: 1,
    state: status === "completed" ? "idle" : "busy",
    tags: [],
    created_at: 1,
    last_activity_at: 1,
    usage: { input_tokens: 0, output_tokens: 0, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: null },
    pending_action: null,
    turn: {
      id: "turn_1",
      object: "turn",
      status: status as Run["turn"]["status"],
      agent_version: 1,
      input: [],
      output: status === "completed" ? [{ type: "output_text", text: "done" }] : [],
      error: null,
      created_at: 1,
      started_at: 1,
      completed_at: null,
      duration_ms: null,
      usage: null,
      pending_action: null,
    },
    ...overrides,
  };
}

// ---- retries -------------------------------------------------------------------------

test("client - 503 then success: waits Retry-After and retries with the same Idempotency-Key", async (t) => {
  const h = harness([error(503, "runtime_unavailable", { "retry-after": "1" }), error(503, "runtime_unavailable", { "retry-after": "3" }), json(200, run("completed"))]);
  const result = await h.client.createRun({ agent: "agt_1", input: "hi" });
  t.is(result.turn.status, "completed");
  t.deepEqual(h.sleeps, [1000, 3000]);
  t.is(h.requests.length, 3);
  t.deepEqual(h.requests.map((r) => r.headers["idempotency-key"]), ["key-1", "key-1", "key-1"]);
  t.is(h.keysIssued(), 1, "one key per logical call");
  t.deepEqual(h.requests.map((r) => r.body), Array(3).fill(JSON.stringify({ agent: "agt_1", input: "hi" })));
  t.is(h.requests[0].headers.authorization, "Bearer rk_live_test");
  t.is(h.requests[0].url, "http://runs.test/api/v1/runs");
});

test("client - 429, 502, 503 and 504 are retried twice by default, then the error is thrown", async (t) => {
  for (const status of [429, 502, 503, 504]) {
    const h = harness([error(status, "x"), error(status, "x"), error(status, "last", { "retry-after": "2" })], { random: 0 });
    const err = await t.throwsAsync(h.client.getRun("run_1"), { instanceOf: RunsApiError });
    t.is(err?.status, status);
    t.is(err?.code, "last");
    t.is(err?.retryAfterS, 2);
    t.is(h.requests.length, 3, `status ${status}`);
    t.deepEqual(h.sleeps, [500, 1000], "backoff without Retry-After: 500 ms doubling");
  }
});

test("client - maxRetries is configurable per client and per call", async (t) => {
  const none = harness([error(503, "x")], { maxRetries: 0 });
  await t.throwsAsync(none.client.getRun("run_1"), { instanceOf: RunsApiError });
  t.is(none.requests.length, 1);
  const four = harness([error(503, "x"), error(503, "x"), error(503, "x"), error(503, "x"), json(200, run("completed"))]);
  await four.client.getRun("run_1", { maxRetries: 4 });
  t.is(four.requests.length, 5);
});

test("client - 409 is never retried, and other 4xx and 500 neither", async (t) => {
  for (const [status, code] of [
    [409, "idempotency_conflict"],
    [409, "run_busy"],
    [400, "invalid_request"],
    [404, "run_not_found"],
    [410, "run_expired"],
    [500, "internal_error"],
  ] as const) {
    const h = harness([error(status, code, {}, { param: "version", retryable: false, reference: "ref_1" })]);
    const err = await t.throwsAsync(h.client.createRun({ run_id: "run_1", input: "x" }, { idempotencyKey: "mine" }), { instanceOf: RunsApiError });
    t.is(err?.status, status);
    t.is(err?.code, code);
    t.is(err?.param, "version");
    t.is(err?.retryable, false);
    t.is(err?.reference, "ref_1");
    t.is(err?.idempotencyKey, "mine");
    t.is(h.requests.length, 1);
    t.deepEqual(h.sleeps, []);
  }
});

test("client - the caller's Idempotency-Key is used; each logical call gets its own key", async (t) => {
  const h = harness([json(200, run("completed")), json(200, run("completed")), json(200, run("completed"))]);
  await h.client.createRun({ agent: "agt_1", input: "a" }, { idempotencyKey: "given" });
  await h.client.createRun({ agent: "agt_1", input: "a" });
  await h.client.createRun({ agent: "agt_1", input: "a" });
  t.deepEqual(h.requests.map((r) => r.headers["idempotency-key"]), ["given", "key-1", "key-2"]);
});

test("client - keyed endpoints send a key; keyless ones do not", async (t) => {
  const h = harness([
    json(202, run("cancelling")),
    json(200, { id: "run_1", object: "run.deleted", deleted: true }),
    json(201, { object: "deployment" }),
    json(200, { object: "run_tags", run_id: "run_1", tags: ["a"] }),
    json(201, { id: "agt_1" }),
  ]);
  await h.client.cancelRun("run_1", { turnId: "turn_1" });
  await h.client.deleteRun("run_1");
  await h.client.createDeployment("agt_1", { config: { model: "faux/scripted" } });
  await h.client.updateTags("run_1", { add: ["a"] });
  await h.client.createAgent({ name: "a" });
  t.deepEqual(
    h.requests.map((r) => [r.method, new URL(r.url).pathname, r.headers["idempotency-key"] ?? null, r.body ?? null]),
    [
      ["POST", "/api/v1/runs/run_1/cancel", "key-1", '{"turn_id":"turn_1"}'],
      ["DELETE", "/api/v1/runs/run_1", "key-2", null],
      ["POST", "/api/v1/agents/agt_1/deployments", "key-3", '{"config":{"model":"faux/scripted"}}'],
      ["POST", "/api/v1/runs/run_1/tags", null, '{"add":["a"]}'],
      ["POST", "/api/v1/agents", null, '{"name":"a"}'],
    ],
  );
});

test("client - decideAction: POST …/actions/{actionId} with a key kept across retries; 409 action_already_decided is thrown at once", async (t) => {
  const action = {
    id: "act_1",
    object: "action",
    run_id: "run_1",
    turn_id: "turn_1",
    tool: "bash",
    tool_call_id: "call_1",
    arguments: { command: "echo hi" },
    requested_at: 1,
    expires_at: 3601,
    decision: "deny",
    reason: "not now",
    decided_by: "person",
    decided_at: 2,
  };
  const h = harness([error(503, "runtime_unavailable", { "retry-after": "1" }), json(200, action)]);
  const decided = await h.client.decideAction("run_1", "act_1", { decision: "deny", reason: "not now" });
  t.deepEqual(decided, action);
  t.deepEqual(
    h.requests.map((r) => [r.method, new URL(r.url).pathname, r.headers["idempotency-key"], r.body]),
    Array(2).fill(["POST", "/api/v1/runs/run_1/actions/act_1", "key-1", '{"decision":"deny","reason":"not now"}']),
    "the retry repeats the same request under the same key",
  );
  t.deepEqual(h.sleeps, [1000]);

  const late = harness([error(409, "action_already_decided", {}, { type: "conflict_error", param: "actionId", retryable: false }), json(200, action)]);
  const err = await t.throwsAsync(late.client.decideAction("run_1", "act_1", { decision: "approve" }, { idempotencyKey: "decide-2" }), { instanceOf: RunsApiError });
  t.is(err?.status, 409);
  t.is(err?.code, "action_already_decided");
  t.is(err?.param, "actionId");
  t.is(err?.retryable, false);
  t.is(err?.idempotencyKey, "decide-2");
  t.is(late.requests.length, 1, "409 is not retried");
  t.is(late.requests[0].body, '{"decision":"approve"}');
  t.deepEqual(late.sleeps, []);
});

test("client - writes whose repeat is not harmless are retried on 429 only", async (t) => {
  const h = harness([error(503, "runtime_unavailable", { "retry-after": "1" })]);
  await t.throwsAsync(h.client.createAgent({ name: "a" }), { instanceOf: RunsApiError });
  t.is(h.requests.length, 1, "a 503 may come after the agent was created");
  const limited = harness([error(429, "rate_limited", { "retry-after": "2" }), json(201, { id: "agt_1" })]);
  await limited.client.createApiKey({ scopes: ["run:read"] });
  t.deepEqual(limited.sleeps, [2000]);
  t.is(limited.requests.length, 2);
});

test("client - a 429 that is not retryable (a spent budget) is thrown at once, not slept through", async (t) => {
  const h = harness([error(429, "quota_exceeded", { "retry-after": "2592000" }, { retryable: false, type: "rate_limit_error" }), json(200, run("completed"))]);
  const err = await t.throwsAsync(h.client.startRun({ agent: "agt_1", input: "x" }), { instanceOf: RunsApiError });
  t.is(err?.code, "quota_exceeded");
  t.is(err?.retryAfterS, 2592000);
  t.deepEqual(h.sleeps, []);
  t.is(h.requests.length, 1);
});

test("client - a network failure is retried for a read, not for a non-idempotent write", async (t) => {
  const h = harness([new TypeError("fetch failed"), json(200, run("completed"))]);
  await h.client.getRun("run_1");
  t.is(h.requests.length, 2);
  const w = harness([new TypeError("fetch failed")]);
  await t.throwsAsync(w.client.createAgent({ name: "a" }), { message: "fetch failed" });
  t.is(w.requests.length, 1);
});

test("client - a proxy's non-JSON error page still becomes a RunsApiError", async (t) => {
  const h = harness([new Response("<html>bad gateway</html>", { status: 502 })], { maxRetries: 0 });
  const err = await t.throwsAsync(h.client.listRuns(), { instanceOf: RunsApiError });
  t.is(err?.status, 502);
  t.is(err?.code, "http_502");
  t.regex(err!.message, /bad gateway/);
});

test("client - query strings: repeated tags, optional values left out", async (t) => {
  const h = harness([json(200, { object: "list", data: [], has_more: false, next_cursor: null }), json(200, run("completed"))]);
  await h.client.listRuns({ agent_id: "agt_1", tag: ["a b", "c"], state: "idle", limit: 5, after: undefined });
  await h.client.getRun("run/1", { turnId: "turn_1" });
  t.is(h.requests[0].url, "http://runs.test/api/v1/runs?agent_id=agt_1&tag=a+b&tag=c&state=idle&limit=5");
  t.is(h.requests[1].url, "http://runs.test/api/v1/runs/run%2F1?turn_id=turn_1");
});

// ---- waitForTurn -----------------------------------------------------------------------

test("client - waitForTurn: first read after 1000 ms, then 1.5× up to 10 s, with the exact jittered waits", async (t) => {
  const answers: Answer[] = [];
  for (let i = 0; i < 9; i++) answers.push(json(200, run("in_progress")));
  answers.push(json(200, run("completed")));
  const h = harness(answers, { random: 0.5 });
  const polled: string[] = [];
  const result = await h.client.waitForTurn("run_1", "turn_1", { onPoll: (r) => polled.push(r.turn.status) });
  t.is(result.turn.status, "completed");
  t.deepEqual(h.sleeps, [1100, 1650, 2475, 3713, 5569, 8354, 11000, 11000, 11000, 11000]);
  t.is(polled.length, 9);
  t.true(h.requests.every((r) => r.method === "GET" && r.url === "http://runs.test/api/v1/runs/run_1?turn_id=turn_1"));
});

test("client - waitForTurn: a 429 does not end waiting (Retry-After or the next interval, whichever is longer)", async (t) => {
  const h = harness(
    [
      json(200, run("queued")),
      error(429, "rate_limited", { "retry-after": "5" }),
      error(429, "rate_limited", { "retry-after": "1" }),
      error(429, "rate_limited"),
      json(200, run("completed")),
    ],
    { random: 0 },
  );
  const result = await h.client.waitForTurn("run_1", "turn_1");
  t.is(result.turn.status, "completed");
  // 1000; then 1500 before the first 429; Retry-After 5 s beats 2250; 3375 beats 1 s; 5063 without Retry-After.
  t.deepEqual(h.sleeps, [1000, 1500, 5000, 3375, 5063]);
  t.is(h.requests.length, 5, "a 429 is not retried inside the read: the schedule handles it");
});

test("client - waitForTurn: 503 is retried as a read and waiting goes on", async (t) => {
  const h = harness([error(503, "runtime_unavailable", { "retry-after": "2" }), json(200, run("in_progress")), json(200, run("completed"))], { random: 0 });
  await h.client.waitForTurn("run_1", "turn_1");
  t.deepEqual(h.sleeps, [1000, 2000, 1500]);
});

test("client - waitForTurn: other errors end it", async (t) => {
  for (const [status, code] of [
    [404, "turn_not_found"],
    [410, "run_expired"],
    [401, "unauthorized"],
    [500, "internal_error"],
  ] as const) {
    const h = harness([json(200, run("in_progress")), error(status, code)], { random: 0 });
    const err = await t.throwsAsync(h.client.waitForTurn("run_1", "turn_1"), { instanceOf: RunsApiError });
    t.is(err?.code, code);
    t.deepEqual(h.sleeps, [1000, 1500]);
  }
  const exhausted = harness([error(503, "x"), error(503, "x"), error(503, "x")], { random: 0 });
  await t.throwsAsync(exhausted.client.waitForTurn("run_1", "turn_1"), { instanceOf: RunsApiError });
});

test("client - waitForTurn: no deadline by default; deadlineMs ends it with RunsWaitTimeoutError and sends no cancel", async (t) => {
  const inProgress = (n: number): Answer[] => Array.from({ length: n }, () => json(200, run("in_progress")));
  const long = harness([...inProgress(40), json(200, run("completed"))], { random: 0 });
  await long.client.waitForTurn("run_1", "turn_1");
  t.is(long.requests.length, 41, "forty non-final reads did not end the wait");

  const h = harness(inProgress(10), { random: 0 });
  const err = await t.throwsAsync(h.client.waitForTurn("run_1", "turn_1", { deadlineMs: 5000 }), { instanceOf: RunsWaitTimeoutError });
  t.is(err?.lastRun?.turn.status, "in_progress");
  // 1000 + 1500 + 2250 = 4750; the last wait is cut to the deadline, then one more read.
  t.deepEqual(h.sleeps, [1000, 1500, 2250, 250]);
  t.true(h.requests.every((r) => r.method === "GET"), "abandoning does not cancel the turn");
});

test("client - waitForTurn: an aborted signal ends it with the signal's reason", async (t) => {
  const controller = new AbortController();
  const h = harness([
    (r) => {
      controller.abort(new Error("user left"));
      return json(200, run("in_progress"));
    },
  ]);
  await t.throwsAsync(h.client.waitForTurn("run_1", "turn_1", { signal: controller.signal }), { message: "user left" });
  t.is(h.requests.length, 1);
});

test("client - createRunAndWait: a 202 from the server's wait falls back to waitForTurn", async (t) => {
  const h = harness([json(202, run("in_progress"), { location: "/api/v1/runs/run_1?turn_id=turn_1" }), json(200, run("completed"))], { random: 0 });
  const result = await h.client.createRunAndWait({ agent: "agt_1", input: "x" });
  t.is(result.turn.status, "completed");
  t.deepEqual(h.sleeps, [1000]);
  t.is(JSON.parse(h.requests[0].body!).background, undefined, "the server's wait is used");
  const done = harness([json(200, run("completed"))]);
  await done.client.createRunAndWait({ agent: "agt_1", input: "x" });
  t.is(done.requests.length, 1);
});

// ---- streams -----------------------------------------------------------------------------

function event(n: number, type = "text_delta", source: RunEvent["source"] = "runtime"): RunEvent {
  return { id: `evt_${n}`, sequence: n, source, type, run_id: "run_1", turn_id: "turn_1", created_at: 1, data: type === "text_delta" ? { delta: `d${n}` } : {} };
}

function frame(e: RunEvent): string {
  return `id: ${e.id}\nevent: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`;
}

/** An SSE response whose body yields `chunks` in order; an Error chunk cuts the connection there. */
function sse(chunks: Array<string | Error>): Response {
  const queue = [...chunks];
  const encoder = new TextEncoder();
  const body = new ReadableStream<Uint8Array>({
    pull(controller) {
      const next = queue.shift();
      if (next === undefined) controller.close();
      else if (next instanceof Error) controller.error(next);
      else controller.enqueue(encoder.encode(next));
    },
  });
  return new Response(body, { status: 200, headers: { "content-type": "text/event-stream" } });
}

async function collect(events: AsyncIterable<RunEvent>): Promise<RunEvent[]> {
  const out: RunEvent[] = [];
  for await (const e of events) out.push(e);
  return out;
}

test("client - streamRun: a cut stream resumes from the last complete event, no gap and no duplicate", async (t) => {
  const h = harness([
    sse([": ping\n\n", frame(event(1, "turn.started", "platform")), frame(event(2)), frame(event(3)).slice(0, 20), new TypeError("terminated")]),
    sse([frame(event(3)), frame(event(4)), frame(event(5, "turn.completed", "platform")), frame(event(6))]),
  ]);
  const events = await collect(h.client.streamRun({ agent: "agt_1", input: "x" }));
  t.deepEqual(events.map((e) => e.id), ["evt_1", "evt_2", "evt_3", "evt_4", "evt_5"], "ends after the turn's final event");
  t.is(h.requests[0].method, "POST");
  t.deepEqual(JSON.parse(h.requests[0].body!), { agent: "agt_1", input: "x", stream: true });
  t.is(h.requests[1].method, "GET");
  t.is(h.requests[1].url, "http://runs.test/api/v1/runs/run_1/events?stream=true&turn_id=turn_1");
  t.is(h.requests[1].headers["last-event-id"], "evt_2");
  t.deepEqual(h.sleeps, [500]);
});

test("client - streamRun: a cut before the first event repeats the POST with the same Idempotency-Key", async (t) => {
  const h = harness([
    sse([": ping\n\n", new TypeError("terminated")]),
    sse([frame(event(1, "turn.started", "platform")), frame(event(2, "turn.failed", "platform"))]),
  ]);
  const events = await collect(h.client.streamRun({ run_id: "run_1", input: "x", on_busy: "queue" }, { idempotencyKey: "k" }));
  t.deepEqual(events.map((e) => e.type), ["turn.started", "turn.failed"]);
  t.deepEqual(h.requests.map((r) => [r.method, r.headers["idempotency-key"]]), [
    ["POST", "k"],
    ["POST", "k"],
  ]);
});

const errorFrame = (code: string, type: string, retryable: boolean) =>
  `event: error\ndata: ${JSON.stringify({ error: { code, type, message: "m", param: null, retryable } })}\n\n`;

test("client - streamRun: a retryable event: error (503) resumes from the last event, like a cut; another error frame throws RunsApiError, JSON errors before the stream too", async (t) => {
  const h = harness([
    sse([frame(event(1, "turn.started", "platform")), frame(event(2)), errorFrame("event_history_unavailable", "unavailable_error", true)]),
    sse([frame(event(3)), frame(event(4, "turn.completed", "platform"))]),
  ], { random: 0 });
  const events = await collect(h.client.streamRun({ agent: "agt_1", input: "x" }));
  t.deepEqual(events.map((e) => e.id), ["evt_1", "evt_2", "evt_3", "evt_4"]);
  t.is(h.requests[1].url, "http://runs.test/api/v1/runs/run_1/events?stream=true&turn_id=turn_1");
  t.is(h.requests[1].headers["last-event-id"], "evt_2");

  const final = harness([sse([frame(event(1)), errorFrame("event_cursor_expired", "not_found_error", false)])]);
  const seen: string[] = [];
  const err = await t.throwsAsync(
    (async () => {
      for await (const e of final.client.streamRun({ agent: "agt_1", input: "x" })) seen.push(e.id);
    })(),
    { instanceOf: RunsApiError },
  );
  t.is(err?.code, "event_cursor_expired");
  t.deepEqual(seen, ["evt_1"]);
  t.is(final.requests.length, 1, "not retried");

  const refused = harness([error(409, "run_busy")]);
  const busy = await t.throwsAsync(collect(refused.client.streamRun({ run_id: "run_1", input: "x", on_busy: "reject" })), { instanceOf: RunsApiError });
  t.is(busy?.code, "run_busy");
  t.is(refused.requests.length, 1);
});

test("client - streamEvents: retryable error frames without progress are bounded like cuts, then the error is thrown", async (t) => {
  const failing = () => sse([errorFrame("event_history_unavailable", "unavailable_error", true)]);
  const h = harness([failing(), failing(), failing()], { random: 0 });
  const err = await t.throwsAsync(collect(h.client.streamEvents("run_1", { maxReconnects: 2 })), { instanceOf: RunsApiError });
  t.is(err?.code, "event_history_unavailable");
  t.is(err?.status, 503);
  t.is(h.requests.length, 3);
  t.deepEqual(h.sleeps, [500, 1000]);
});

test("client - streamEvents: follows a turn, reconnects on a clean close, ends on an empty resume", async (t) => {
  const h = harness([
    sse([frame(event(3)), frame(event(4))]),
    // The turn ended after evt_4 and its final event was not in this turn's stream: empty resume.
    sse([]),
  ]);
  const events = await collect(h.client.streamEvents("run_1", { turnId: "turn_1", after: "evt_2" }));
  t.deepEqual(events.map((e) => e.id), ["evt_3", "evt_4"]);
  t.is(h.requests[0].url, "http://runs.test/api/v1/runs/run_1/events?stream=true&turn_id=turn_1&after=evt_2");
  t.false("last-event-id" in h.requests[0].headers);
  t.is(h.requests[1].url, "http://runs.test/api/v1/runs/run_1/events?stream=true&turn_id=turn_1");
  t.is(h.requests[1].headers["last-event-id"], "evt_4");
});

test("client - streamEvents: reconnects are bounded; a stream that keeps being cut without progress throws", async (t) => {
  const cut = () => sse([new TypeError("terminated")]);
  const h = harness([cut(), cut(), cut(), cut()], { random: 0 });
  const client = h.client;
  await t.throwsAsync(collect(client.streamEvents("run_1", { maxReconnects: 3 })), { message: "terminated" });
  t.is(h.requests.length, 4);
  t.deepEqual(h.sleeps, [500, 1000, 2000]);
});

test("client - streamEvents: progress resets the reconnect budget", async (t) => {
  const h = harness([
    sse([frame(event(1)), new TypeError("terminated")]),
    sse([frame(event(2)), new TypeError("terminated")]),
    sse([frame(event(3)), new TypeError("terminated")]),
    sse([frame(event(4, "turn.completed", "platform"))]),
  ]);
  const events = await collect(h.client.streamEvents("run_1", { turnId: "turn_1", maxReconnects: 1 }));
  t.deepEqual(events.map((e) => e.id), ["evt_1", "evt_2", "evt_3", "evt_4"]);
  t.deepEqual(h.requests.map((r) => r.headers["last-event-id"] ?? null), [null, "evt_1", "evt_2", "evt_3"]);
});
