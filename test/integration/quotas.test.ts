import anyTest, { type TestFn } from "ava";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";

/** Tenant quotas that bound what one workspace can make a node hold (issue 12, finding 4). */
const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; api: Api; key: string; other: Api; sleeper: string }>;

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers, { RUNS_SSE_STREAMS_SOLO: "2", RUNS_FILE_RETENTION_SOLO_S: "2", RUNS_SWEEP_INTERVAL_MS: "300" });
  const ws = await newWorkspace(service);
  const other = await newWorkspace(service);
  const sleeper = await ws.api.agentWith({ model: "faux/scripted", tools: ["bash"], script: [{ tool_call: { name: "bash", arguments: { command: "sleep 20" } } }] });
  t.context = { servers, service, api: ws.api, key: ws.key, other: other.api, sleeper };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

/**
 * A request whose event stream stays open until `abort`. The Response is kept: fetch
 * cancels the unread body of a Response that is garbage collected, which closed a stream
 * the test still counted on (one CI run under load).
 */
async function open(api: Api, path: string, init: RequestInit = {}): Promise<{ status: number; body?: any; headers: Headers; abort: () => void; response: Response }> {
  const controller = new AbortController();
  const res = await fetch(`${api.baseUrl}${path}`, { ...init, headers: { authorization: `Bearer ${api.key}`, ...(init.headers ?? {}) }, signal: controller.signal });
  if (!(res.headers.get("content-type") ?? "").startsWith("text/event-stream")) return { status: res.status, body: await res.json(), headers: res.headers, abort: () => controller.abort(), response: res };
  return { status: res.status, headers: res.headers, abort: () => controller.abort(), response: res };
}

test.serial("sse - a workspace holds at most its plan's open event streams: the next is 429 quota_exceeded before anything is opened or admitted", async (t) => {
  t.timeout(60_000);
  const { api, other, sleeper } = t.context;
  const run = (await api.post("/api/v1/runs", { agent: sleeper, input: "sleep", background: true })).body;
  const first = await open(api, `/api/v1/runs/${run.id}/events?stream=true`);
  const second = await open(api, `/api/v1/runs/${run.id}/events?stream=true`);
  t.is(first.status, 200);
  t.is(second.status, 200);
  const third = await open(api, `/api/v1/runs/${run.id}/events?stream=true`);
  t.is(third.status, 429);
  t.is(third.body.error.code, "quota_exceeded");
  t.is(third.headers.get("retry-after"), "5", "a 429 says when to try again");
  t.true(third.body.error.retryable, "and that trying again may work (a slot frees when a stream ends; found by a probe)");
  // A streamed start is refused before admission: no run is created.
  const raw = await t.context.servers.raw();
  const before = await raw.runs.countDocuments({});
  const streamed = await open(api, "/api/v1/runs", { method: "POST", headers: { "content-type": "application/json", "idempotency-key": "streamed-1" }, body: JSON.stringify({ agent: sleeper, input: "x", stream: true }) });
  t.is(streamed.status, 429);
  t.is(await raw.runs.countDocuments({}), before, "nothing admitted");
  // Another workspace is not affected.
  const otherAgent = await other.agentWith({ model: "faux/scripted" });
  const otherRun = (await other.post("/api/v1/runs", { agent: otherAgent, input: "hi" })).body;
  const theirs = await open(other, `/api/v1/runs/${otherRun.id}/events?stream=true&turn_id=${otherRun.turn.id}`);
  t.is(theirs.status, 200);
  theirs.abort();
  // Once a stream ends, a new one opens.
  first.abort();
  let again = await open(api, `/api/v1/runs/${run.id}/events?stream=true`);
  for (let i = 0; i < 40 && again.status === 429; i++) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    again = await open(api, `/api/v1/runs/${run.id}/events?stream=true`);
  }
  t.is(again.status, 200);
  second.abort();
  again.abort();
  await api.post(`/api/v1/runs/${run.id}/cancel`, {});
});

test.serial("sse - concurrent streamed starts past the limit: only those given a stream are admitted; every 429 left nothing behind", async (t) => {
  t.timeout(60_000);
  const { api, sleeper } = t.context;
  const raw = await t.context.servers.raw();
  const before = await raw.runs.countDocuments({});
  // Two slots (RUNS_SSE_STREAMS_SOLO), six streamed starts at once.
  const answers = await Promise.all(
    Array.from({ length: 6 }, (_, i) =>
      open(api, "/api/v1/runs", { method: "POST", headers: { "content-type": "application/json", "idempotency-key": `streamed-race-${i}` }, body: JSON.stringify({ agent: sleeper, input: `race ${i}`, stream: true }) }),
    ),
  );
  const streamed = answers.filter((a) => a.status === 200);
  const refused = answers.filter((a) => a.status === 429);
  t.is(streamed.length + refused.length, 6, JSON.stringify(answers.map((a) => a.status)));
  t.true(streamed.length >= 1 && streamed.length <= 2, `${streamed.length} streams`);
  t.true(refused.every((a) => a.body.error.code === "quota_exceeded"));
  t.is(await raw.runs.countDocuments({}), before + streamed.length, "a run for each stream, none for a 429");
  for (const answer of streamed) answer.abort();
  for (const run of await raw.runs.find({ state: "busy" }).toArray()) await api.post(`/api/v1/runs/${run._id}/cancel`, {});
});

test.serial("files - an uploaded file lives for its plan's file retention, then it and its object are swept", async (t) => {
  t.timeout(60_000);
  const { api, service } = t.context;
  const boundary = "quota-boundary";
  const body = `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="short.txt"\r\nContent-Type: text/plain\r\n\r\nshort-lived\r\n--${boundary}--\r\n`;
  const res = await fetch(`${api.baseUrl}/api/v1/files`, { method: "POST", headers: { authorization: `Bearer ${api.key}`, "content-type": `multipart/form-data; boundary=${boundary}`, "idempotency-key": "short-1" }, body });
  t.is(res.status, 201);
  const file = (await res.json()) as { id: string };
  t.is((await api.get(`/api/v1/files/${file.id}`)).status, 200);
  const files = (await t.context.servers.raw()).db.collection("files");
  t.truthy(await files.findOne({ _id: file.id as never }));
  // Past the 2 s retention: not found at once, and the sweeper removes the document.
  let gone = false;
  for (let i = 0; i < 100 && !gone; i++) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    gone = (await files.findOne({ _id: file.id as never })) === null;
  }
  t.true(gone, "the file document was swept");
  t.is((await api.get(`/api/v1/files/${file.id}`)).status, 404);
  const run = await api.post("/api/v1/runs", { agent: await api.agentWith({ model: "faux/scripted" }), input: [{ type: "input_file", file_id: file.id }] });
  t.is(run.status, 400, "an expired file cannot be given to a turn");
  t.is(run.body.error.param, "input");
});
