import anyTest, { type TestFn } from "ava";
import net from "node:net";
import { brotliCompressSync, gzipSync } from "node:zlib";
import pino from "pino";
import { Api, collectedLogs, newWorkspace, startTestServers, testConfig, type TestServers } from "../helpers/servers.js";
import { startService, type RunningService } from "../../node/service.js";
import { sample } from "../helpers/metrics.js";
import { OPERATIONS } from "../../gateway/operations.js";

/** /metrics, request ids and the log lines of a request and of a run, on a real service. */
const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; logs: Array<Record<string, unknown>> }>;

test.before(async (t) => {
  const servers = await startTestServers();
  const { logs, log } = collectedLogs();
  const config = testConfig(servers, { LOG_LEVEL: "info", RUNS_ACTIVE_TURNS_SOLO: "100" });
  const service = await startService(config, { log });
  t.context = { servers, service, logs };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

const sleeper = (seconds: number) => ({ model: "faux/scripted", tools: ["bash"], script: [{ tool_call: { name: "bash", arguments: { command: `sleep ${seconds}` } } }, { text: "slept" }] });

test.serial("metrics - /api traffic by route template and status, latency, turns, streams, NATS and store health, event loop, process", async (t) => {
  const { service } = t.context;
  const ws = await newWorkspace(service);
  const anon = new Api(service.url!);
  const agent = await ws.api.agentWith(sleeper(2));
  const started = await ws.api.post("/api/v1/runs", { agent, input: "work", background: true });
  t.is(started.status, 202, JSON.stringify(started.body));
  const queued = await ws.api.post("/api/v1/runs", { run_id: started.body.id, input: "next", on_busy: "queue", background: true });
  t.is(queued.status, 202, JSON.stringify(queued.body));
  t.is((await ws.api.get(`/api/v1/runs/${started.body.id}`)).status, 200);
  t.is((await ws.api.get(`/api/v1/runs/run_unknown123`)).status, 404);
  t.is((await anon.get("/api/v1/runs/secret-looking-path-9f8e7d")).status, 401);
  t.is((await ws.api.get("/api/v1/no/such/route/secret-looking-path-1a2b3c")).status, 404);

  const during = await anon.get("/metrics");
  t.is(during.status, 200);
  t.regex(during.headers.get("content-type") ?? "", /^text\/plain; version=0\.0\.4/);
  const text = during.body as string;
  t.is(sample(text, "runs_http_requests_total", { method: "POST", route: "/api/v1/runs", status: "202" }), 2);
  t.is(sample(text, "runs_http_requests_total", { method: "GET", route: "/api/v1/runs/:runId", status: "200" }), 1);
  t.is(sample(text, "runs_http_requests_total", { method: "GET", route: "/api/v1/runs/:runId", status: "404" }), 1);
  t.is(sample(text, "runs_http_requests_total", { method: "GET", route: "/api/v1/runs/:runId", status: "401" }), 1);
  t.is(sample(text, "runs_http_requests_total", { method: "GET", route: "unmatched", status: "404" }), 1);
  t.is(sample(text, "runs_http_request_duration_seconds_count", { method: "POST", route: "/api/v1/runs", status: "202" }), 2);
  t.true((sample(text, "runs_http_request_duration_seconds_sum", { method: "POST", route: "/api/v1/runs", status: "202" }) ?? -1) > 0);
  t.false(text.includes("secret-looking-path"), "labels hold route templates, never raw URLs");
  t.is(sample(text, "runs_active_turns"), 1);
  t.is(sample(text, "runs_queued_turns"), 1);
  t.is(sample(text, "runs_sse_streams"), 0);
  t.is(sample(text, "runs_nats_up"), 1);
  t.is(sample(text, "runs_store_up"), 1);
  t.true((sample(text, "runs_nodejs_eventloop_lag_seconds") ?? -1) >= 0);
  t.true((sample(text, "runs_process_cpu_user_seconds_total") ?? -1) > 0);
  t.true((sample(text, "runs_process_resident_memory_bytes") ?? 0) > 0);

  // An open event stream is counted while it is open.
  const controller = new AbortController();
  const stream = await fetch(`${service.url}/api/v1/runs/${started.body.id}/events?stream=true`, { headers: { authorization: `Bearer ${ws.key}` }, signal: controller.signal });
  t.is(stream.status, 200);
  t.is(sample((await anon.get("/metrics")).body, "runs_sse_streams"), 1);
  controller.abort();

  await ws.api.waitRun(started.body.id, (run) => run.state === "idle", 30_000);
  const after = (await anon.get("/metrics")).body as string;
  t.is(sample(after, "runs_active_turns"), 0);
  t.is(sample(after, "runs_queued_turns"), 0);
  t.is(sample(after, "runs_http_requests_total", { method: "GET", route: "/api/v1/runs/:runId/events", status: "200" }), 1);
  // A turn that used tokens: its usage is counted, but not shown without RUNS_METRICS_TOKEN.
  const counted = await ws.api.post("/api/v1/runs", { agent: await ws.api.agentWith({ model: "faux/scripted", tools: [], script: [{ text: "counted", usage: { input: 7, output: 3 } }] }, "counted"), input: "x" });
  t.is(counted.body.state, "idle", JSON.stringify(counted.body));
  t.is(counted.body.usage?.input_tokens, 7, "the turn's usage was recorded");
  const open = (await anon.get("/metrics")).body as string;
  t.false(open.includes(ws.id), "the public scrape names no workspace");
  t.notRegex(open, /runs_tokens_total|runs_cost_usd_total/);
});

test.serial("headers - every /api answer says no-store (a revealed value, a new key, a run's data are kept by no cache) and nosniff; the console's pages keep their own", async (t) => {
  const { service } = t.context;
  const ws = await newWorkspace(service);
  await ws.api.request("PUT", "/api/v1/environment-values/CACHED_NOT", { body: { value: "v" } });
  const answers = [
    await ws.api.get("/api/v1/environment-values/CACHED_NOT?reveal=true"),
    await ws.api.post("/api/v1/api-keys", { scopes: ["run:read"] }),
    // The rotation served without /api/v1 (decisions): a new secret too (authz probe).
    await ws.api.post(`/api-keys/${(await ws.api.post("/api/v1/api-keys", { scopes: ["run:read"] })).body.id}/rotate`, {}),
    await ws.api.get("/api/v1/runs"),
    await ws.api.get("/api/v1/runs/run_none"),
    await ws.api.withKey(undefined).get("/api/v1/runs"),
    await ws.api.get("/api/v1/openapi.json"),
  ];
  t.is(answers[2]!.status, 201, JSON.stringify(answers[2]!.body));
  t.regex(answers[2]!.body.key, /^rk_/);
  for (const answer of answers) {
    t.is(answer.headers.get("cache-control"), "no-store", String(answer.status));
    t.is(answer.headers.get("x-content-type-options"), "nosniff");
  }
  t.is((await ws.api.get("/")).headers.get("cache-control"), "no-cache", "the console page as before");
  t.is((await ws.api.get("/healthz")).headers.get("x-content-type-options"), "nosniff");
});

test.serial("request ids - every answer carries x-request-id; a client's plain id is kept, anything else replaced; the request's log lines carry it", async (t) => {
  const { service, logs } = t.context;
  const ws = await newWorkspace(service);
  const generated = await ws.api.get("/api/v1/runs");
  t.regex(generated.headers.get("x-request-id") ?? "", /^req_[A-Za-z0-9]+$/);

  const mine = await ws.api.request("GET", "/api/v1/runs", { headers: { "x-request-id": "client-7f3a.42:B" } });
  t.is(mine.headers.get("x-request-id"), "client-7f3a.42:B");
  const unauthorized = await new Api(service.url!).request("GET", "/api/v1/runs", { headers: { "x-request-id": "client-401" } });
  t.is(unauthorized.status, 401);
  t.is(unauthorized.headers.get("x-request-id"), "client-401");

  for (const bad of ["has space", "x".repeat(129), "quote\"and{brace}", "ünïcode"]) {
    const res = await ws.api.request("GET", "/api/v1/runs", { headers: { "x-request-id": bad } }).catch(() => undefined);
    if (!res) continue; // fetch refuses some header values itself: nothing reached us
    const id = res.headers.get("x-request-id") ?? "";
    t.not(id, bad);
    t.regex(id, /^req_[A-Za-z0-9]+$/);
  }
  t.false(logs.some((line) => JSON.stringify(line).includes("quote\\\"and{brace}")), "a refused id is never written to the log");

  const lines = logs.filter((line) => line.reqId === "client-7f3a.42:B");
  t.true(lines.some((line) => line.msg === "incoming request"), JSON.stringify(lines));
  t.true(lines.some((line) => line.msg === "request completed"), JSON.stringify(lines));
  t.false(JSON.stringify(lines).includes(ws.key), "the key never appears in a log line");
});

test.serial("logs - a run's log lines carry its workspace and run ids", async (t) => {
  const { service, logs } = t.context;
  const ws = await newWorkspace(service);
  const agent = await ws.api.agentWith({ model: "faux/scripted" });
  const started = await ws.api.post("/api/v1/runs", { agent, input: "hello" });
  t.is(started.status, 200, JSON.stringify(started.body));
  const deleted = await ws.api.request("DELETE", `/api/v1/runs/${started.body.id}`, { idempotencyKey: "del-1" });
  t.true([200, 204].includes(deleted.status), JSON.stringify(deleted.body));
  const removed = logs.find((line) => line.msg === "run removed" && line.run_id === started.body.id);
  t.truthy(removed, "the actor logged the removal");
  t.is(removed!.workspace_id, ws.id);
});

/** Writes raw bytes to the service's port and reads until the server closes. */
function rawExchange(url: string, bytes: string): Promise<string> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(port), hostname, () => socket.write(bytes));
    let answer = "";
    socket.setTimeout(5_000, () => socket.destroy(new Error("no answer within 5 s")));
    socket.on("data", (d) => (answer += d));
    socket.on("close", () => resolve(answer));
    socket.on("error", reject);
  });
}

test.serial("http layer - a request that is not valid HTTP is answered 400 in the contract's error format, on public and /api paths alike", async (t) => {
  const { service } = t.context;
  for (const bytes of ["GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", "GARBAGE\r\n\r\n", `GET /api/v1/runs HTTP/1.1\r\nHost: x\r\nX-Big: ${"a".repeat(20_000)}\r\n\r\n`]) {
    const answer = await rawExchange(service.url!, bytes);
    const [head, body] = answer.split("\r\n\r\n");
    t.regex(head!, /^HTTP\/1\.1 400 Bad Request\r\n/, head);
    t.regex(head!, /content-type: application\/json/i);
    const parsed = JSON.parse(body!);
    t.is(parsed.error.type, "invalid_request_error");
    t.is(parsed.error.code, "invalid_request");
    t.is(parsed.error.param, null);
  }
  t.is((await new Api(service.url!).get("/healthz")).status, 200, "the service goes on serving");
});

test.serial("http layer - a compressed body (Content-Encoding gzip, br) is refused 400 naming Content-Encoding, after authentication, and starts nothing; identity is read as usual; an unknown path is 404 whatever its body", async (t) => {
  const { service } = t.context;
  const ws = await newWorkspace(service);
  const agent = await ws.api.agentWith({ model: "faux/scripted", tools: [] });
  const json = JSON.stringify({ agent, input: "hello" });
  const post = (headers: Record<string, string>, body: string | Buffer) =>
    fetch(`${service.url}/api/v1/runs`, { method: "POST", headers: { "content-type": "application/json", "idempotency-key": `k-${Math.random()}`, ...headers }, body: typeof body === "string" ? body : new Uint8Array(body), signal: AbortSignal.timeout(20_000) });
  for (const [encoding, body] of [["gzip", gzipSync(json)], ["br", brotliCompressSync(json)], ["GZip, identity", gzipSync(json)]] as const) {
    const refused = await post({ authorization: `Bearer ${ws.key}`, "content-encoding": encoding }, body);
    t.is(refused.status, 400, encoding);
    t.like((await refused.json()).error, { code: "invalid_request", param: "Content-Encoding" }, encoding);
  }
  const anonymous = await post({ "content-encoding": "gzip" }, gzipSync(json));
  t.is(anonymous.status, 401, "the key is checked first");
  t.is((await ws.api.get("/api/v1/runs")).body.data.length, 0, "nothing started");
  // An unknown path is 404 whatever its body (it is not read): compressed, another type, not JSON.
  for (const [target, type, body] of [["/api/v1/nowhere", "application/json", new Uint8Array(gzipSync(json))], ["/nowhere", "text/plain", "hi"], ["/api/v1/runs/run_x/nowhere", "application/json", "{not json"]] as const) {
    const unknown = await fetch(`${service.url}${target}`, { method: "POST", headers: { authorization: `Bearer ${ws.key}`, "content-type": type, "content-encoding": "gzip" }, body, signal: AbortSignal.timeout(20_000) });
    t.is(unknown.status, 404, target);
    t.like((await unknown.json()).error, { code: "not_found" }, target);
  }
  for (const encoding of ["identity", "Identity, identity", ""]) {
    const plain = await post({ authorization: `Bearer ${ws.key}`, "content-encoding": encoding }, json);
    t.is(plain.status, 200, encoding);
    t.is((await plain.json()).turn.status, "completed");
  }
});

test.serial("http layer - a body of another type is told the type to send: JSON for JSON routes (a JSON body sent as text/plain had been told 'The body must be a JSON object'), multipart for an upload (it had been told JSON; found by a probe)", async (t) => {
  const { service } = t.context;
  const ws = await newWorkspace(service);
  const agent = await ws.api.agentWith({ model: "faux/scripted" });
  const send = (path: string, type: string, body: string) =>
    fetch(`${service.url}${path}`, { method: "POST", headers: { authorization: `Bearer ${ws.key}`, "content-type": type, "idempotency-key": `k-${Math.random()}` }, body, signal: AbortSignal.timeout(20_000) });
  for (const type of ["text/plain", "application/x-www-form-urlencoded", "application/octet-stream"]) {
    const run = await send("/api/v1/runs", type, JSON.stringify({ agent, input: "hello" }));
    t.is(run.status, 400, type);
    t.like((await run.json()).error, { code: "invalid_request", param: null, message: "Send the body as application/json." }, type);
    const file = await send("/api/v1/files", type, "some notes");
    t.is(file.status, 400, type);
    t.like((await file.json()).error, { code: "invalid_request", param: "file", message: "Send the file as multipart/form-data with a part named file." }, type);
  }
  t.is((await ws.api.get("/api/v1/runs")).body.data.length, 0, "nothing started");
  // An empty body sent as text/plain (fetch's type for body: "") is no body: a cancel answers as without one (found by a review).
  const run = (await ws.api.post("/api/v1/runs", { agent, input: "hi" })).body;
  const cancel = await send(`/api/v1/runs/${run.id}/cancel`, "text/plain", "");
  t.is(cancel.status, 200, JSON.stringify(await cancel.clone().json()));
});

test.serial("http layer - a body that stops arriving is answered 408 once RUNS_REQUEST_BODY_TIMEOUT_MS passes and its connection closed; a slow body that arrives whole is served (found by a probe: such sockets stayed open for good)", async (t) => {
  t.timeout(60_000);
  const { servers } = t.context;
  const service = await startService(testConfig(servers, { RUNS_REQUEST_BODY_TIMEOUT_MS: "1500", RUNS_UPLOAD_TIME_LIMIT_MS: "120000" }), { log: pino({ level: "silent" }) });
  try {
    // The backstop for what the deadline does not watch (a multipart body stalled around its
    // file part): Node's own bound on a request's arrival, a minute past the upload's limit.
    t.is(service.app!.server.requestTimeout, 180_000);
    const { api, key } = await newWorkspace(service);
    const run = (await api.post("/api/v1/runs", { agent: await api.agentWith({ model: "faux/scripted" }), input: "hi" })).body;
    const head = (path: string, extra: string) => `POST ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nIdempotency-Key: stall-${Math.random()}\r\n${extra}\r\n`;
    const stalled = [
      head("/api/v1/runs", "Content-Length: 1000\r\n") + '{"agent":',
      head("/api/v1/runs", "Transfer-Encoding: chunked\r\n") + '9\r\n{"agent":\r\n',
      head(`/api/v1/runs/${run.id}/tags`, "Content-Length: 100\r\n") + '{"add":[',
    ];
    for (const bytes of stalled) {
      const started = Date.now();
      const answer = await rawExchange(service.url!, bytes);
      const tookMs = Date.now() - started;
      const [status, body] = [answer.split("\r\n")[0], answer.split("\r\n\r\n")[1]];
      t.is(status, "HTTP/1.1 408 Request Timeout", answer);
      t.regex(answer, /\r\nconnection: close\r\n/i, answer);
      t.is(JSON.parse(body!).error.code, "request_timeout");
      t.true(tookMs >= 1_400 && tookMs < 5_000, `answered and closed after ${tookMs} ms`);
    }
    // A body that arrives slowly, but whole within the bound, is served.
    const { port } = new URL(service.url!);
    const body = JSON.stringify({ add: ["slow"] });
    const slow = await new Promise<string>((resolve, reject) => {
      const socket = net.connect(Number(port), "127.0.0.1", () => {
        socket.write(head(`/api/v1/runs/${run.id}/tags`, `Content-Length: ${body.length}\r\nConnection: close\r\n`) + body.slice(0, 5));
        setTimeout(() => socket.write(body.slice(5)), 700);
      });
      let answer = "";
      socket.setTimeout(5_000, () => socket.destroy(new Error("no answer within 5 s")));
      socket.on("data", (d) => (answer += d));
      socket.on("close", () => resolve(answer));
      socket.on("error", reject);
    });
    t.regex(slow, /^HTTP\/1\.1 200 OK\r\n/, slow);
    // An answer before the body arrived whole (a bad key: 401; a type no route reads: 400)
    // is read whole by the client, and the connection ends once the rest is not whole in time
    // (not at once: a close with body bytes unread would reset it, losing the answer).
    const early = [
      [`POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer rk_live_nope\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"agent":`, 401],
      [head("/api/v1/runs", "Content-Length: 1000\r\n").replace("application/json", "application/xml") + "<agent", 400],
    ] as const;
    for (const [bytes, status] of early) {
      const started = Date.now();
      const answer = await rawExchange(service.url!, bytes);
      t.regex(answer, new RegExp(`^HTTP/1\\.1 ${status} `), answer);
      const tookMs = Date.now() - started;
      t.true(tookMs >= 1_400 && tookMs < 5_000, `closed after ${tookMs} ms`);
    }
    t.deepEqual((await api.get(`/api/v1/runs/${run.id}`)).body.tags, ["slow"]);
    t.is((await new Api(service.url!).get("/healthz")).status, 200, "the service goes on serving");
  } finally {
    await service.close();
  }
});

test.serial("pages - an asset name that is a property of every object (toString, __proto__, constructor) is 404, not 500", async (t) => {
  const anon = new Api(t.context.service.url!);
  for (const base of ["/docs/assets", "/console"]) {
    for (const name of ["toString", "__proto__", "constructor", "hasOwnProperty", "..%2Fpackage.json"]) {
      const res = await anon.get(`${base}/${name}`);
      t.is(res.status, 404, `${base}/${name}: ${JSON.stringify(res.body)}`);
      t.is(res.body.error.code, "not_found");
    }
  }
  t.is((await anon.get("/docs/assets/init.js")).status, 200);
  t.is((await anon.get("/console/app.css")).status, 200);
});

test.serial("http layer - a closing node waits on no connection: silent ones and half-sent headers (also a kept-alive connection's next request) are ended, a request in flight gets its answer and its keep-alive connection closes after it", async (t) => {
  t.timeout(60_000);
  const { servers } = t.context;
  const service = await startService(testConfig(servers), { log: pino({ level: "silent" }) });
  const { port } = new URL(service.url!);
  const open = (bytes: string) =>
    new Promise<net.Socket>((resolve, reject) => {
      const socket = net.connect(Number(port), "127.0.0.1", () => {
        if (bytes) socket.write(bytes);
        resolve(socket);
      });
      socket.on("error", reject);
    });
  const silent = await open("");
  const halfHeaders = await open("GET /healthz HTTP/1.1\r\nHost: x\r\n");
  // Kept alive after one answered request, then half of the next one's headers.
  const keptAlive = await open("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  await new Promise<void>((resolve) => keptAlive.once("data", () => resolve()));
  keptAlive.write("GET /healthz HTTP/1.1\r\nHost: x\r\n");
  const ended = (socket: net.Socket) => new Promise<void>((resolve) => (socket.destroyed ? resolve() : socket.once("close", () => resolve())));
  // A request in flight (a start that waits for its 2 s turn) still gets its answer.
  const { api } = await newWorkspace(service);
  const agent = await api.agentWith(sleeper(2));
  const inFlight = api.post("/api/v1/runs", { agent, input: "go" });
  await new Promise((resolve) => setTimeout(resolve, 500));
  const started = Date.now();
  await service.close();
  const tookMs = Date.now() - started;
  await Promise.all([ended(silent), ended(halfHeaders), ended(keptAlive)]);
  t.true(tookMs < 10_000, `closed in ${tookMs} ms`);
  const answer = await inFlight;
  t.is(answer.status, 200, JSON.stringify(answer.body));
  t.is(answer.body.turn.status, "completed");
});

test.serial("bodies - a POST that takes no body (activate, revoke, a webhook's test, …) refuses a field sent to it, 400 naming it, as every other body does; none and {} are taken (a field had been ignored: README probe)", async (t) => {
  const { service } = t.context;
  const ws = await newWorkspace(service);
  const bodiless = OPERATIONS.filter((op) => op.method === "post" && !op.body);
  t.true(bodiless.length >= 5, bodiless.map((op) => op.path).join(", "));
  for (const op of bodiless) {
    const url = op.path
      .replace(/\{version\}/g, "1")
      .replace(/\{keyId\}/g, "00000000-0000-4000-8000-000000000000")
      .replace(/\{(\w+)\}/g, (_, name: string) => `${name.replace(/Id$/, "").slice(0, 3)}_none`);
    const refused = await ws.api.post(url, { unexpected: 1 });
    t.is(refused.status, 400, `${url}: ${JSON.stringify(refused.body)}`);
    t.is(refused.body.error.param, "unexpected", url);
    for (const body of [undefined, {}]) {
      const taken = await ws.api.post(url, body);
      // Taken, then answered for the ids that name nothing.
      t.is(taken.status, 404, `${url} ${JSON.stringify(body)}: ${JSON.stringify(taken.body)}`);
    }
  }
});
