import anyTest, { type TestFn } from "ava";
import fc from "fast-check";
import type { FastifyInstance } from "fastify";
import { newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";

/**
 * Property-based fuzzing of the whole API (issue 12): generated malformed requests on
 * every operation of the OpenAPI document (bodies, query strings, headers, path ids,
 * cursors, multipart parts, SSE resume ids). Every answer must be below 500, carry the
 * contract's error body with a `param` that names something of the request, and come
 * within its bound; afterwards no Idempotency-Key stays claimed and no run stays busy.
 *
 * Seeded and reproducible: FUZZ_SEED replays a run (the seed is printed on failure),
 * FUZZ_RUNS sets the number of requests (default 10,000; e.g. FUZZ_RUNS=200000 for a soak).
 */
const RUNS = Number(process.env.FUZZ_RUNS ?? 10_000);
const SEED = Number(process.env.FUZZ_SEED ?? Date.now() % 2 ** 31);
const REQUEST_BOUND_MS = 10_000;

interface Operation {
  method: string;
  path: string;
  /** Names a `param` may take for this operation: parameters, body fields, headers. */
  names: Set<string>;
}

const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; app: FastifyInstance; key: string; ids: Record<string, string>; operations: Operation[] }>;

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers, {
    RUNS_RATE_SOLO: "1000000",
    RUNS_RATE_EXPENSIVE_SOLO: "1000000",
    RUNS_ACTIVE_TURNS_SOLO: "1000",
    RUNS_WAIT_TIMEOUT_MS: "2000",
  });
  const ws = await newWorkspace(service);
  const app = service.app!;
  // Real ids to aim at, next to made-up ones.
  const agent = await ws.api.agentWith({ model: "faux/scripted" });
  const run = (await ws.api.post("/api/v1/runs", { agent, input: "seed" })).body;
  await ws.api.request("PUT", "/api/v1/environment-values/FUZZ_VALUE", { body: { value: "v" } });
  const keys = (await ws.api.get("/api/v1/api-keys")).body.data;
  const ids = { agentId: agent, runId: run.id, turnId: run.turn.id, version: "1", name: "FUZZ_VALUE", keyId: keys[0].id, fileId: "file_00000000000000000000000" };
  const doc = (await ws.api.get("/api/v1/openapi.json")).body;
  const operations: Operation[] = [];
  for (const [path, item] of Object.entries(doc.paths as Record<string, Record<string, any>>)) {
    for (const [method, op] of Object.entries(item)) {
      if (!["get", "post", "put", "delete", "patch"].includes(method)) continue;
      const names = new Set<string>(["Idempotency-Key", "Last-Event-ID", "body"]);
      for (const p of [...(item.parameters ?? []), ...(op.parameters ?? [])]) names.add(p.name);
      const schema = op.requestBody?.content?.["application/json"]?.schema ?? op.requestBody?.content?.["multipart/form-data"]?.schema;
      collectFields(doc, schema, names);
      operations.push({ method: method.toUpperCase(), path, names });
    }
  }
  t.context = { servers, service, app, key: ws.key, ids, operations };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

/** Property names of a JSON schema (following $ref, one level of nesting, unions). */
function collectFields(doc: any, schema: any, out: Set<string>, depth = 0): void {
  if (!schema || depth > 3) return;
  if (schema.$ref) return collectFields(doc, schema.$ref.split("/").slice(1).reduce((o: any, k: string) => o?.[k], doc), out, depth);
  for (const key of ["anyOf", "oneOf", "allOf"]) for (const s of schema[key] ?? []) collectFields(doc, s, out, depth + 1);
  for (const [name, child] of Object.entries(schema.properties ?? {})) {
    out.add(name);
    collectFields(doc, child, out, depth + 1);
  }
}

// ---- generators ------------------------------------------------------------------

const nasty = fc.constantFrom("", " ", "%00", "..", "../../etc/passwd", "null", "undefined", "-1", "0", "1e309", "NaN", "9".repeat(40), "ü", "\u202e", "a".repeat(300), "evt_", "run_", "turn_", "agt_", "key_", "file_", "[]", "{}", "%2F");
const word = fc.oneof(nasty, fc.string({ maxLength: 40 }), fc.stringMatching(/^[A-Za-z0-9_-]{1,30}$/));
const jsonish = fc.oneof(
  { depthSize: "small" },
  fc.jsonValue({ maxDepth: 4 }),
  fc.record({ input: fc.jsonValue({ maxDepth: 3 }), agent: fc.oneof(word, fc.jsonValue({ maxDepth: 1 })), run_id: fc.oneof(word, fc.constant(undefined)) }, { requiredKeys: [] }),
  fc.record({ name: fc.oneof(word, fc.integer()), config: fc.jsonValue({ maxDepth: 3 }), scopes: fc.array(word, { maxLength: 4 }), value: fc.oneof(word, fc.integer()) }, { requiredKeys: [] }),
  fc.record({ add: fc.array(word, { maxLength: 3 }), remove: fc.jsonValue({ maxDepth: 1 }), on_busy: word, background: fc.jsonValue({ maxDepth: 0 }), stream: fc.jsonValue({ maxDepth: 0 }) }, { requiredKeys: [] }),
);

type Body = { kind: "none" } | { kind: "json"; value: unknown } | { kind: "raw"; text: string; type: string } | { kind: "multipart"; parts: Array<{ name: string; filename?: string; data: string }> };

const body: fc.Arbitrary<Body> = fc.oneof(
  fc.constant({ kind: "none" } as Body),
  jsonish.map((value) => ({ kind: "json", value }) as Body),
  fc.record({ kind: fc.constant("raw" as const), text: fc.oneof(fc.string({ maxLength: 200 }), fc.constantFrom("{", "[1,", '{"a":', "\u0000", "{}{}", '{"__proto__":{"x":1}}', "[".repeat(5000) + "]".repeat(5000))), type: fc.constantFrom("application/json", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "application/json; charset=latin1") }),
  fc.record({
    kind: fc.constant("multipart" as const),
    parts: fc.array(fc.record({ name: fc.constantFrom("file", "filename", "media_type", "other", ""), filename: fc.option(word, { nil: undefined }), data: fc.string({ maxLength: 100 }) }), { maxLength: 4 }),
  }),
);

const request = (ops: Operation[]) =>
  fc.record({
    op: fc.constantFrom(...ops),
    realIds: fc.boolean(),
    pathWords: fc.array(word, { minLength: 4, maxLength: 4 }),
    query: fc.array(fc.tuple(fc.constantFrom("limit", "after", "turn_id", "state", "tag", "agent_id", "version", "created_after", "created_before", "stream", "reveal", "x"), word), { maxLength: 4 }),
    idempotencyKey: fc.option(fc.oneof(word, fc.constant("k".repeat(256))), { nil: undefined }),
    lastEventId: fc.option(word, { nil: undefined }),
    body,
  });

function buildMultipart(parts: Array<{ name: string; filename?: string; data: string }>): { payload: string; type: string } {
  const boundary = "fuzzboundary";
  const chunks = parts.map((p) => `--${boundary}\r\nContent-Disposition: form-data; name="${p.name}"${p.filename !== undefined ? `; filename="${p.filename}"` : ""}\r\n\r\n${p.data}\r\n`);
  return { payload: `${chunks.join("")}--${boundary}--\r\n`, type: `multipart/form-data; boundary=${boundary}` };
}

function tryParse(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

// ---- the property ----------------------------------------------------------------

test.serial(`fuzz - ${RUNS} malformed requests across every endpoint: no 5xx, the contract's error body, bounded time, nothing left claimed or busy`, async (t) => {
  t.timeout(600_000);
  const { app, key, ids, operations } = t.context;
  t.true(operations.length >= 25, `${operations.length} operations from the OpenAPI document`);
  const seen = new Set<string>();
  let sent = 0;
  const property = fc.asyncProperty(request(operations), async (r) => {
    let i = 0;
    const url =
      r.op.path.replace(/\{(\w+)\}/g, (_m, name: string) => encodeURIComponent(r.realIds && ids[name] !== undefined ? ids[name]! : r.pathWords[i++ % 4]!)) +
      (r.query.length ? `?${r.query.map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join("&")}` : "");
    const headers: Record<string, string> = { authorization: `Bearer ${key}` };
    if (r.idempotencyKey !== undefined) headers["idempotency-key"] = r.idempotencyKey;
    if (r.lastEventId !== undefined) headers["last-event-id"] = r.lastEventId;
    let payload: string | undefined;
    if (r.body.kind === "json") {
      payload = JSON.stringify(r.body.value) ?? "null";
      headers["content-type"] = "application/json";
    } else if (r.body.kind === "raw") {
      payload = r.body.text;
      headers["content-type"] = r.body.type;
    } else if (r.body.kind === "multipart") {
      const m = buildMultipart(r.body.parts);
      payload = m.payload;
      headers["content-type"] = m.type;
    }
    // SSE answers stream until the turn ends: a stream=true GET is read for its head only.
    const streaming = r.query.some(([k, v]) => k === "stream" && v === "true") && r.op.method === "GET";
    const started = Date.now();
    const res = await Promise.race([
      app.inject({ method: r.op.method as any, url, headers, payload, payloadAsStream: streaming }),
      new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`no answer within ${REQUEST_BOUND_MS} ms: ${r.op.method} ${url}`)), REQUEST_BOUND_MS)),
    ]);
    sent++;
    seen.add(`${r.op.method} ${r.op.path}`);
    let text = "";
    if (streaming) {
      // The head is the answer: an event stream is left, an error is read (it ends).
      const stream = res.stream();
      if ((res.headers["content-type"] ?? "").toString().startsWith("text/event-stream")) stream.destroy();
      else for await (const chunk of stream) text += chunk;
    } else text = res.body;
    const where = `${r.op.method} ${url} ${JSON.stringify(headers)} ${String(payload).slice(0, 200)} → ${res.statusCode} ${text.slice(0, 300)}`;
    if (res.statusCode >= 500) throw new Error(`5xx: ${where}`);
    if (Date.now() - started > REQUEST_BOUND_MS) throw new Error(`slow: ${where}`);
    if (res.statusCode >= 400 && !(res.headers["content-type"] ?? "").toString().startsWith("text/event-stream")) {
      const error = (JSON.parse(text) as { error?: Record<string, unknown> }).error;
      if (!error || typeof error.type !== "string" || typeof error.code !== "string" || typeof error.message !== "string" || !("param" in error)) {
        throw new Error(`not the contract's error body: ${where}`);
      }
      const param = error.param;
      if (param !== null) {
        if (typeof param !== "string") throw new Error(`param is not a string or null: ${where}`);
        const head = param.split(/[.[]/)[0]!;
        const parsedBody = r.body.kind === "json" ? r.body.value : r.body.kind === "raw" ? tryParse(r.body.text) : undefined;
        const bodyKeys = parsedBody && typeof parsedBody === "object" ? Object.keys(parsedBody) : [];
        const queryKeys = r.query.map(([k]) => k);
        const pathNames = [...r.op.path.matchAll(/\{(\w+)\}/g)].map((m) => m[1]!);
        const partNames = r.body.kind === "multipart" ? r.body.parts.map((p) => p.name) : [];
        const known = new Set([...r.op.names, ...bodyKeys, ...queryKeys, ...pathNames, ...partNames, "file", "filename", "media_type", "scopes"]);
        // A field's own name may hold "." or "[": the whole param, or its first segment.
        if (!known.has(param) && !known.has(head)) throw new Error(`param "${param}" names nothing of the request: ${where}`);
      }
    }
  });
  try {
    await fc.assert(property, { numRuns: RUNS, seed: SEED, endOnFailure: true, includeErrorInReport: true });
  } catch (err) {
    t.log(`FUZZ_SEED=${SEED} reproduces this run`);
    throw err;
  }
  t.is(sent, RUNS);
  t.is(seen.size, operations.length, `every operation was tried: missing ${operations.map((o) => `${o.method} ${o.path}`).filter((o) => !seen.has(o))}`);

  // Afterwards: no key is held by a request that has ended, no run is left busy.
  const store = await t.context.servers.raw();
  const deadline = Date.now() + 60_000;
  let busy = await store.runs.countDocuments({ state: "busy" });
  while (busy > 0 && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 250));
    busy = await store.runs.countDocuments({ state: "busy" });
  }
  t.is(busy, 0, "no run stays busy");
  // An admitted turn's answer does not wait for its key's record: the last ones may still be written.
  let claimed = await store.idempotency.countDocuments({ state: "pending" });
  for (let i = 0; i < 40 && claimed > 0; i++) {
    await new Promise((resolve) => setTimeout(resolve, 250));
    claimed = await store.idempotency.countDocuments({ state: "pending" });
  }
  t.is(claimed, 0, "no Idempotency-Key stays claimed");
  t.is(await store.db.collection("file_uploads").countDocuments({ state: "uploading" }), 0, "no upload stays in progress");
  t.log(`seed ${SEED}: ${sent} requests over ${seen.size} operations`);
});
