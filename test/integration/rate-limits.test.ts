import anyTest, { type TestFn } from "ava";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { grantSize } from "../../gateway/rate-limits.js";

const test = anyTest as TestFn<{ servers: TestServers; nodes: RunningService[] }>;

const LIMITS = {
  RUNS_RATE_WINDOW_MS: "4000",
  RUNS_RATE_SOLO: "12",
  RUNS_RATE_EXPENSIVE_SOLO: "2",
  RUNS_RATE_EXEMPT_SOLO: "6",
  RUNS_RATE_BUSINESS: "1000",
  RUNS_RATE_EXPENSIVE_BUSINESS: "1000",
};

test.before(async (t) => {
  const servers = await startTestServers();
  const env = { ...LIMITS, MONGODB_DB: "rate_limits" };
  // Two nodes on one NATS and one store: they must share every workspace's limit.
  const nodes = [await startTestService(servers, { ...env, RUNS_NODE_ID: "n1" }), await startTestService(servers, { ...env, RUNS_NODE_ID: "n2" })];
  t.context = { servers, nodes };
});

test.after.always(async (t) => {
  for (const node of t.context.nodes ?? []) await node.close();
  await t.context.servers?.stop();
});

/** Waits for the start of a fresh window so a test has the whole window to itself. */
async function freshWindow(ms = 4000): Promise<void> {
  const wait = ms - (Date.now() % ms) + 50;
  await new Promise((r) => setTimeout(r, wait));
}

test.serial("rate limits - small limits take exactly one token per grant", (t) => {
  t.is(grantSize(12), 1);
  t.is(grantSize(3000), 60);
});

test.serial("rate limits - one limit per workspace across two nodes and two keys; 429 with Retry-After and headers", async (t) => {
  const [a, b] = t.context.nodes;
  const ws = await newWorkspace(a!);
  const keyB = (await ws.api.post("/api/v1/api-keys", { scopes: ["run:read"] })).body.key as string;
  await freshWindow();
  const viaA = ws.api;
  const viaB = new Api(b!.url!, keyB);
  const statuses: number[] = [];
  let last: Awaited<ReturnType<Api["get"]>> | undefined;
  for (let i = 0; i < 20; i++) {
    last = await (i % 2 ? viaB : viaA).get("/api/v1/runs/run_none");
    statuses.push(last.status);
    t.truthy(last.headers.get("x-ratelimit-limit"));
    t.truthy(last.headers.get("x-ratelimit-remaining"));
    t.truthy(last.headers.get("x-ratelimit-reset"));
  }
  const served = statuses.filter((s) => s === 404).length;
  // The key creation above may share the window: at most 12 in all, never more.
  t.true(served <= 12 && served >= 10, `served ${served}: ${statuses}`);
  t.is(last!.status, 429);
  t.is(last!.body.error.code, "rate_limited");
  t.is(last!.body.error.type, "rate_limit_error");
  t.true(last!.body.error.retryable);
  const retryAfter = Number(last!.headers.get("retry-after"));
  t.true(retryAfter >= 1 && retryAfter <= 5, String(retryAfter));
  t.is(last!.headers.get("x-ratelimit-limit"), "12");
  t.is(last!.headers.get("x-ratelimit-remaining"), "0");

  // Cancelling a run and revoking a key stay available.
  const cancel = await viaA.post("/api/v1/runs/run_none/cancel", {});
  t.is(cancel.status, 404, "not 429");
  const keys = await a!.store.keys.list(ws.id, 100);
  const revoke = await viaA.post(`/api/v1/api-keys/${keys.find((k) => k.scopes.length === 1)!._id}/revoke`);
  t.is(revoke.status, 200);

  // The next window serves again.
  await freshWindow();
  t.is((await viaB.withKey(ws.key).get("/api/v1/runs/run_none")).status, 404);
});

test.serial("rate limits - every /api answer to a valid key carries X-RateLimit-* (decisions §7): an unknown /api path is counted and answered 404 (401 for a bad key), the public OpenAPI document shows the state without counting", async (t) => {
  const [a] = t.context.nodes;
  const ws = await newWorkspace(a!);
  await freshWindow();
  const paths = ["/api/v1/no-such-route", "/api/nope", "/api"];
  for (const path of paths) {
    const res = await ws.api.get(path);
    t.is(res.status, 404, path);
    t.is(res.body.error.code, "not_found", path);
    t.truthy(res.headers.get("x-ratelimit-limit"), path);
  }
  const patch = await ws.api.request("PATCH", "/api/v1/runs");
  t.is(patch.status, 404);
  t.is(patch.headers.get("x-ratelimit-limit"), "12");
  // Four counted: 12 - 4 left, and the document's read counted nothing.
  const doc = await ws.api.get("/api/v1/openapi.json");
  t.is(doc.status, 200);
  t.is(doc.headers.get("x-ratelimit-remaining"), "8");
  t.is((await ws.api.get("/api/v1/openapi.json")).headers.get("x-ratelimit-remaining"), "8");
  // Without a key: as before (no workspace to describe); with a bad one, 401 before 404.
  const anon = ws.api.withKey(undefined);
  const unknownAnon = await anon.get("/api/v1/no-such-route");
  t.is(unknownAnon.status, 404);
  t.is(unknownAnon.headers.get("x-ratelimit-limit"), null);
  t.is((await anon.get("/api/v1/openapi.json")).status, 200);
  const bad = await ws.api.withKey("rk_live_notakeynotakeynotakeynotakeynotakey0000").get("/api/v1/no-such-route");
  t.is(bad.status, 401);
  t.is((await ws.api.withKey("rk_live_notakeynotakeynotakeynotakeynotakey0000").get("/api/v1/openapi.json")).status, 200, "the public document is served to a bad key too");
  // Not /api: untouched.
  t.is((await ws.api.get("/no-such-page")).headers.get("x-ratelimit-limit"), null);
});

test.serial("rate limits - cancels are not held back by the standard limit, but a flood of them meets their own", async (t) => {
  const [a] = t.context.nodes;
  const ws = await newWorkspace(a!);
  await freshWindow();
  for (let i = 0; i < 14 && (await ws.api.get("/api/v1/runs/run_none")).status !== 429; i++);
  t.is((await ws.api.get("/api/v1/runs/run_none")).status, 429, "the standard limit is used up");
  const statuses: number[] = [];
  let refused: Awaited<ReturnType<Api["post"]>> | undefined;
  for (let i = 0; i < 8; i++) {
    const res = await ws.api.post("/api/v1/runs/run_none/cancel", {});
    statuses.push(res.status);
    if (res.status === 429) refused = res;
    // A served cancel's headers are its own budget's too, not the spent standard limit's "0 left" (found by a probe).
    else {
      t.is(res.headers.get("x-ratelimit-limit"), "6");
      t.is(res.headers.get("x-ratelimit-remaining"), String(5 - i));
    }
  }
  t.deepEqual(statuses, [404, 404, 404, 404, 404, 404, 429, 429], "six cancels in the window (RUNS_RATE_EXEMPT_SOLO), then 429");
  // The refusal's headers describe the limit that governed it: the cancels' own budget.
  t.is(refused!.headers.get("x-ratelimit-limit"), "6");
  t.is(refused!.headers.get("x-ratelimit-remaining"), "0");
  t.truthy(refused!.headers.get("retry-after"));
  await freshWindow();
  t.is((await ws.api.post("/api/v1/runs/run_none/cancel", {})).status, 404, "the next window serves cancels again");
});

test.serial("rate limits - expensive operations have their own lower limit; another workspace is unaffected", async (t) => {
  const [a, b] = t.context.nodes;
  const ws = await newWorkspace(a!);
  const other = await newWorkspace(b!);
  await freshWindow();
  const results = [];
  for (let i = 0; i < 3; i++) results.push((await (i % 2 ? new Api(b!.url!, ws.key) : ws.api).post("/api/v1/api-keys", { scopes: ["run:read"] })).status);
  t.deepEqual(results, [201, 201, 429]);
  t.is((await ws.api.get("/api/v1/agents")).status, 200, "ordinary requests still have room");
  t.is((await other.api.post("/api/v1/api-keys", { scopes: ["run:read"] })).status, 201);
});

test.serial("rate limits - a file upload is an expensive operation (decisions §7): the third in a window is 429", async (t) => {
  const [a] = t.context.nodes;
  const ws = await newWorkspace(a!);
  await freshWindow();
  const boundary = "----runs-rate-upload";
  const statuses: number[] = [];
  for (let i = 0; i < 3; i++) {
    const body = `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="n${i}.txt"\r\nContent-Type: text/plain\r\n\r\nnote ${i}\r\n--${boundary}--\r\n`;
    const res = await fetch(`${a!.url}/api/v1/files`, {
      method: "POST",
      headers: { authorization: `Bearer ${ws.key}`, "idempotency-key": `rate-upload-${i}`, "content-type": `multipart/form-data; boundary=${boundary}` },
      body,
      signal: AbortSignal.timeout(30_000),
    });
    await res.arrayBuffer();
    statuses.push(res.status);
  }
  t.deepEqual(statuses, [201, 201, 429], "RUNS_RATE_EXPENSIVE_SOLO is 2 here");
});

test.serial("keys - a key revoked through one node is refused by the other within 5 seconds, and its open event stream there ends", async (t) => {
  const [a, b] = t.context.nodes;
  await freshWindow();
  const ws = await newWorkspace(a!, "business");
  const created = (await ws.api.post("/api/v1/api-keys", { scopes: ["run:read"] })).body;
  const viaB = new Api(b!.url!, created.key);
  t.is((await viaB.get("/api/v1/runs/run_none")).status, 404, "node b knows the key (and caches it)");
  // An event stream the key holds open on node b ends too: the revocation names the key to every node.
  const run = (await ws.api.post("/api/v1/runs", { agent: await ws.api.agentWith({ model: "faux/scripted" }), input: "watched" })).body;
  const stream = await fetch(`${b!.url}/api/v1/runs/${run.id}/events?stream=true`, { headers: { authorization: `Bearer ${created.key}` }, signal: AbortSignal.timeout(15_000) });
  t.is(stream.status, 200);
  const streamed = (async () => {
    let text = "";
    const decoder = new TextDecoder();
    for await (const chunk of stream.body as unknown as AsyncIterable<Uint8Array>) text += decoder.decode(chunk, { stream: true });
    return text;
  })();
  t.is((await ws.api.post(`/api/v1/api-keys/${created.id}/revoke`)).status, 200);
  const revokedAt = Date.now();
  const text = await streamed;
  // Well within the 5 s of its periodic key check: the announcement ended it.
  t.true(Date.now() - revokedAt < 2_500, `the stream ended ${Date.now() - revokedAt} ms after the revocation`);
  t.regex(text, /event: error\ndata: \{"error":\{[^\n]*"code":"unauthorized"/);
  let status = 0;
  while (Date.now() - revokedAt < 5_000) {
    status = (await viaB.get("/api/v1/runs/run_none")).status;
    if (status === 401) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  t.is(status, 401);
  t.log(`refused by the other node ${Date.now() - revokedAt} ms after the revocation`);
});
