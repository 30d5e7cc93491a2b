import http from "node:http";
import anyTest, { type ExecutionContext, type TestFn } from "ava";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import type { ValidateFunction } from "ajv";
import { readFileSync } from "node:fs";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { OPERATIONS } from "../../gateway/operations.js";

/**
 * The OpenAPI document against the running service: every route Fastify registered is in
 * the document (and every documented operation is a route), and real answers — successes
 * and errors of each endpoint family — validate against the schema the document gives for
 * their path, method and status, with the headers it declares.
 */

interface Ctx {
  servers: TestServers;
  service: RunningService;
  api: Api;
  other: Api;
  /** A business workspace: runs expire after 3 s, 2 expensive operations per window. */
  business: Api;
  doc: any;
  ajv: InstanceType<typeof Ajv2020.default>;
  validators: Map<string, ValidateFunction>;
  covered: Set<string>;
}

const test = anyTest as TestFn<Ctx>;
const DOC_ID = "https://runs.invalid/openapi.json";

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers, { RUNS_RETENTION_BUSINESS_S: "3", RUNS_RATE_EXPENSIVE_BUSINESS: "2" });
  const ws = await newWorkspace(service);
  const other = await newWorkspace(service);
  const business = await newWorkspace(service, "business");
  const res = await fetch(`${service.url}/api/v1/openapi.json`);
  const doc = await res.json();
  const ajv = new Ajv2020.default({ strict: false, allErrors: true });
  addFormats.default(ajv);
  ajv.addSchema({ $id: DOC_ID, components: doc.components });
  t.context = { servers, service, api: ws.api, other: other.api, business: business.api, doc, ajv, validators: new Map(), covered: new Set() };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

type Answer = { status: number; body: any; headers: Headers };

function validatorFor(ctx: Ctx, schema: any): ValidateFunction {
  const key = JSON.stringify(schema);
  let validate = ctx.validators.get(key);
  if (!validate) {
    const absolute = JSON.parse(key.replaceAll('"#/components/', `"${DOC_ID}#/components/`));
    validate = ctx.ajv.compile(absolute);
    ctx.validators.set(key, validate);
  }
  return validate;
}

/**
 * Checks one real answer against the document: the status is documented for the operation,
 * the JSON body validates against its schema, an error's code is one the response lists,
 * and every header the response declares is present.
 */
function check(t: ExecutionContext<Ctx>, method: string, docPath: string, res: Answer, note = ""): void {
  const ctx = t.context;
  const where = `${method} ${docPath} ${res.status}${note ? ` (${note})` : ""}`;
  const op = ctx.doc.paths[docPath]?.[method.toLowerCase()];
  if (!op) return void t.fail(`${method} ${docPath} is not in the document`);
  const response = op.responses[String(res.status)];
  if (!response) return void t.fail(`${where}: status not documented; body ${JSON.stringify(res.body).slice(0, 300)}`);
  ctx.covered.add(`${method} ${docPath} ${res.status}`);
  const type = (res.headers.get("content-type") ?? "").split(";")[0]!.trim();
  // A stream's media type is described in x-stream-content (gateway/openapi.ts says why).
  const described = { ...response.content, ...response["x-stream-content"] };
  const media = described[type];
  if (!media) return void t.fail(`${where}: content type ${type} not documented (${Object.keys(described).join(", ")})`);
  if (type === "application/json") {
    const validate = validatorFor(ctx, media.schema);
    if (!validate(res.body)) {
      t.fail(`${where}: body does not match the document: ${ctx.ajv.errorsText(validate.errors)}; body ${JSON.stringify(res.body).slice(0, 500)}`);
    } else {
      t.pass();
    }
  }
  if (response["x-error-codes"]) t.true(response["x-error-codes"].includes(res.body?.error?.code), `${where}: code ${res.body?.error?.code} not listed`);
  for (const name of Object.keys(response.headers ?? {})) t.true(res.headers.has(name), `${where}: header ${name} missing`);
}

/** Reads a whole SSE answer (the stream must end by itself) and checks its frames' data. */
async function checkStream(t: ExecutionContext<Ctx>, method: string, docPath: string, res: Response): Promise<any[]> {
  const text = await res.text();
  const answer: Answer = { status: res.status, body: undefined, headers: res.headers };
  check(t, method, docPath, answer, "stream");
  const events: any[] = [];
  const eventSchema = validatorFor(t.context, { $ref: "#/components/schemas/Event" });
  const errorSchema = validatorFor(t.context, { $ref: "#/components/schemas/Error" });
  for (const frame of text.split("\n\n")) {
    const lines = frame.split("\n");
    const data = lines.find((l) => l.startsWith("data: "));
    if (!data) continue;
    const value = JSON.parse(data.slice(6));
    const isError = lines.includes("event: error");
    const validate = isError ? errorSchema : eventSchema;
    t.true(validate(value), `${method} ${docPath} stream frame: ${t.context.ajv.errorsText(validate.errors)}`);
    if (!isError) events.push(value);
  }
  return events;
}

/** `/api/v1/runs/:runId` and `/api/v1/runs/{runId}` both become `/api/v1/runs/{}`. */
function shape(path: string): string {
  return path.replace(/\{[^}]+\}/g, "{}").replace(/:[^/]+/g, "{}").replace(/\/?\*$/, "/{}");
}

/** The routes of `app.printRoutes({ commonPrefix: false })`: each line's segment joined to its ancestors'. */
function registeredRoutes(tree: string): { method: string; path: string }[] {
  const routes: { method: string; path: string }[] = [];
  const stack: string[] = [];
  for (const line of tree.split("\n")) {
    const match = /^((?:[│ ] {3})*)(?:├── |└── )(.*?)(?: \(([^)]*)\))?$/.exec(line);
    if (!match) continue;
    const depth = match[1]!.length / 4;
    stack.length = depth;
    stack.push(match[2]!);
    const methods = (match[3] ?? "-").split(",").map((m) => m.trim());
    for (const method of methods) if (method !== "-" && method !== "") routes.push({ method, path: stack.join("") });
  }
  return routes;
}

test.serial("openapi - served publicly, versioned from package.json; every registered route is documented and every operation is a route", async (t) => {
  const { doc, service } = t.context;
  const res = await new Api(service.url!).get("/api/v1/openapi.json");
  t.is(res.status, 200);
  t.is(res.body.openapi, "3.1.0");
  t.is(res.body.info.version, JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")).version);
  check(t, "GET", "/api/v1/openapi.json", res);
  // The validators do refuse: a Run without its turn, an error body without a code.
  t.false(validatorFor(t.context, { $ref: "#/components/schemas/Run" })({ ...res.body, turn: undefined }));
  t.false(validatorFor(t.context, { $ref: "#/components/schemas/Error" })({ error: { message: "x", type: "api_error", param: null, retryable: false } }));

  const routes = registeredRoutes(service.app!.printRoutes({ commonPrefix: false }));
  const documented = new Map<string, string>();
  for (const [path, item] of Object.entries<any>(doc.paths)) {
    for (const method of Object.keys(item)) documented.set(`${method.toUpperCase()} ${shape(path)}`, path);
  }
  const served = new Set<string>();
  for (const route of routes) {
    if (route.method === "HEAD" || route.method === "OPTIONS") continue;
    const key = `${route.method} ${shape(route.path)}`;
    served.add(key);
    t.true(documented.has(key), `route ${route.method} ${route.path} is documented`);
  }
  t.true(served.size >= 30, `found ${served.size} routes in printRoutes`);
  for (const key of documented.keys()) t.true(served.has(key), `operation ${key} is a route`);
});

test("openapi - operations: /healthz, /readyz, /metrics", async (t) => {
  const anon = new Api(t.context.service.url!);
  check(t, "GET", "/healthz", await anon.get("/healthz"));
  check(t, "GET", "/readyz", await anon.get("/readyz"));
  check(t, "GET", "/metrics", await anon.get("/metrics"));
});

test("openapi - 401 without or with a wrong key, 403 without the scope", async (t) => {
  const { api, service } = t.context;
  const anon = new Api(service.url!);
  check(t, "GET", "/api/v1/runs", await anon.get("/api/v1/runs"), "no key");
  check(t, "POST", "/api/v1/runs", await anon.withKey("rk_live_nope").post("/api/v1/runs", { agent: "agt_x", input: "x" }), "bad key");
  const limited = await api.post("/api/v1/api-keys", { label: "read only", scopes: ["run:read"] }, undefined);
  check(t, "POST", "/api/v1/api-keys", limited);
  const reader = api.withKey(limited.body.key);
  const denied = await reader.post("/api/v1/agents", { name: "x" });
  t.is(denied.status, 403);
  check(t, "POST", "/api/v1/agents", denied);
  check(t, "GET", "/api/v1/runs", await reader.get("/api/v1/runs"), "allowed");
  check(t, "GET", "/api/v1/files/{fileId}", await reader.get("/api/v1/files/file_x"), "403");
});

test("openapi - agents, deployments and models", async (t) => {
  const { api, other } = t.context;
  check(t, "GET", "/api/v1/models", await api.get("/api/v1/models"));
  const created = await api.post("/api/v1/agents", { name: "doc-agent", description: "documented" });
  check(t, "POST", "/api/v1/agents", created);
  check(t, "POST", "/api/v1/agents", await api.post("/api/v1/agents", { name: "" }), "400");
  check(t, "POST", "/api/v1/agents", await api.request("POST", "/api/v1/agents", { rawBody: "{not json" }), "400 bad JSON");
  const agentId = created.body.id;
  const page = await api.get("/api/v1/agents?limit=1");
  check(t, "GET", "/api/v1/agents", page);
  check(t, "GET", "/api/v1/agents", await api.get("/api/v1/agents?limit=0"), "400 limit");
  if (page.body.next_cursor) check(t, "GET", "/api/v1/agents", await other.get(`/api/v1/agents?after=${page.body.next_cursor}`), "400 invalid_cursor");
  check(t, "GET", "/api/v1/agents/{agentId}", await api.get(`/api/v1/agents/${agentId}`));
  check(t, "GET", "/api/v1/agents/{agentId}", await other.get(`/api/v1/agents/${agentId}`), "404 other workspace");

  const deployPath = "/api/v1/agents/{agentId}/deployments";
  const deployed = await api.post(`/api/v1/agents/${agentId}/deployments`, { config: { model: "faux/scripted", instructions: "x" } }, "dep-1");
  check(t, "POST", deployPath, deployed);
  check(t, "POST", deployPath, await api.post(`/api/v1/agents/${agentId}/deployments`, { config: { model: "faux/scripted" } }, "dep-1"), "409 key reuse");
  check(t, "POST", deployPath, await api.post(`/api/v1/agents/${agentId}/deployments`, { config: { model: "faux/scripted" } }, ""), "400 no key");
  check(t, "POST", deployPath, await api.post(`/api/v1/agents/${agentId}/deployments`, { config: { model: "faux/scripted", colour: 1 } }), "400 unknown field");
  check(t, "POST", deployPath, await api.post(`/api/v1/agents/agt_nope/deployments`, { config: { model: "faux/scripted" } }), "404");
  await api.waitDeployment(agentId, 1);
  check(t, "GET", deployPath, await api.get(`/api/v1/agents/${agentId}/deployments`));
  check(t, "GET", `${deployPath}/{version}`, await api.get(`/api/v1/agents/${agentId}/deployments/1`));
  check(t, "GET", `${deployPath}/{version}`, await api.get(`/api/v1/agents/${agentId}/deployments/9`), "404 version");
  check(t, "GET", `${deployPath}/{version}`, await api.get(`/api/v1/agents/${agentId}/deployments/abc`), "400 version");
  check(t, "POST", `${deployPath}/{version}/activate`, await api.post(`/api/v1/agents/${agentId}/deployments/1/activate`));
  check(t, "POST", `${deployPath}/{version}/activate`, await api.post(`/api/v1/agents/${agentId}/deployments/7/activate`), "404");
  const failing = await api.post(`/api/v1/agents/${agentId}/deployments`, { config: { model: "nobody/no-such-model" }, activate: false });
  check(t, "POST", deployPath, failing, "will fail");
  const failed = await api.waitDeployment(agentId, failing.body.version);
  t.is(failed.status, "failed");
  check(t, "GET", `${deployPath}/{version}`, await api.get(`/api/v1/agents/${agentId}/deployments/${failing.body.version}`), "failed deployment");
  check(t, "POST", `${deployPath}/{version}/activate`, await api.post(`/api/v1/agents/${agentId}/deployments/${failing.body.version}/activate`), "409 failed");
});

test("openapi - runs: start (wait, background, stream), read, list, turns, tags, cancel, delete and their errors", async (t) => {
  const { api, other } = t.context;
  const agent = await api.agentWith({ model: "faux/scripted" }, "doc-runs");
  const slow = await api.agentWith({ model: "faux/scripted", tools: ["bash"], script: [{ tool_call: { name: "bash", arguments: { command: "sleep 4" } } }, { text: "slept" }] }, "doc-slow");
  const failing = await api.agentWith({ model: "faux/scripted", script: [{ error: { message: "denied", status: 401 } }] }, "doc-failing");
  const empty = (await api.post("/api/v1/agents", { name: "no deployment" })).body.id;

  const started = await api.post("/api/v1/runs", { agent, input: "hello", tags: ["doc", "b"] }, "run-a");
  t.is(started.status, 200);
  check(t, "POST", "/api/v1/runs", started, "wait");
  const runId = started.body.id;
  const turnId = started.body.turn.id;
  check(t, "POST", "/api/v1/runs", await api.post("/api/v1/runs", { agent, input: "other input" }, "run-a"), "409 idempotency_conflict");
  const background = await api.post("/api/v1/runs", { run_id: runId, input: [{ type: "input_text", text: "again" }], background: true });
  t.is(background.status, 202);
  check(t, "POST", "/api/v1/runs", background, "background");
  await api.waitTurn(runId, background.body.turn.id);

  const streamed = await fetch(`${api.baseUrl}/api/v1/runs`, {
    method: "POST",
    headers: { authorization: `Bearer ${api.key}`, "content-type": "application/json", "idempotency-key": "run-stream" },
    body: JSON.stringify({ run_id: runId, input: "streamed", stream: true }),
  });
  const events = await checkStream(t, "POST", "/api/v1/runs", streamed);
  t.true(events.some((e) => e.type === "turn.completed"));

  for (const [body, note] of [
    [{ input: "x" }, "400 no selector"],
    [{ agent, run_id: runId, input: "x" }, "400 both"],
    [{ agent, input: "x", background: true, stream: true }, "400 background and stream"],
    [{ agent, input: "x", tags: ["a\tb"] }, "400 tag"],
    [{ run_id: runId, input: "x", version: 1 }, "400 version with run_id"],
    [{ agent: "agt_nope", input: "x" }, "404 agent_not_found"],
    [{ agent, version: 9, input: "x" }, "404 agent_version_not_found"],
    [{ agent: empty, input: "x" }, "409 agent_version_not_ready"],
    [{ run_id: "run_nope", input: "x" }, "404 run_not_found"],
  ] as const) {
    check(t, "POST", "/api/v1/runs", await api.post("/api/v1/runs", body), note);
  }
  check(t, "POST", "/api/v1/runs", await api.post("/api/v1/runs", { agent, input: "x" }, ""), "400 no Idempotency-Key");

  const failed = await api.post("/api/v1/runs", { agent: failing, input: "x" });
  t.is(failed.body.turn.status, "failed");
  check(t, "POST", "/api/v1/runs", failed, "failed turn");

  check(t, "GET", "/api/v1/runs/{runId}", await api.get(`/api/v1/runs/${runId}`));
  check(t, "GET", "/api/v1/runs/{runId}", await api.get(`/api/v1/runs/${runId}?turn_id=${turnId}`), "turn_id");
  check(t, "GET", "/api/v1/runs/{runId}", await api.get(`/api/v1/runs/${runId}?turn_id=turn_nope`), "404 turn");
  check(t, "GET", "/api/v1/runs/{runId}", await other.get(`/api/v1/runs/${runId}`), "404 other workspace");
  const listed = await api.get("/api/v1/runs?tag=doc&state=idle&limit=1");
  check(t, "GET", "/api/v1/runs", listed);
  check(t, "GET", "/api/v1/runs", await api.get("/api/v1/runs?state=sleeping"), "400 state");
  check(t, "GET", "/api/v1/runs", await api.get("/api/v1/runs?tag=a&tag=b&tag=c&tag=d&tag=e&tag=f"), "400 tags");

  const turns = await api.get(`/api/v1/runs/${runId}/turns?limit=2`);
  check(t, "GET", "/api/v1/runs/{runId}/turns", turns);
  const otherRun = failed.body.id;
  if (turns.body.next_cursor) {
    check(t, "GET", "/api/v1/runs/{runId}/turns", await api.get(`/api/v1/runs/${otherRun}/turns?after=${turns.body.next_cursor}`), "400 invalid_cursor");
  }
  check(t, "GET", "/api/v1/runs/{runId}/turns", await api.get(`/api/v1/runs/run_nope/turns`), "404");
  check(t, "GET", "/api/v1/runs/{runId}/turns/{turnId}", await api.get(`/api/v1/runs/${runId}/turns/${turnId}`));
  check(t, "GET", "/api/v1/runs/{runId}/turns/{turnId}", await api.get(`/api/v1/runs/${runId}/turns/turn_nope`), "404");

  check(t, "POST", "/api/v1/runs/{runId}/tags", await api.request("POST", `/api/v1/runs/${runId}/tags`, { body: { add: ["x"], remove: ["b"] } }));
  check(t, "POST", "/api/v1/runs/{runId}/tags", await api.request("POST", `/api/v1/runs/${runId}/tags`, { body: {} }), "400 empty");
  check(t, "POST", "/api/v1/runs/{runId}/tags", await api.request("POST", `/api/v1/runs/run_nope/tags`, { body: { add: ["x"] } }), "404");

  check(t, "POST", "/api/v1/runs/{runId}/cancel", await api.post(`/api/v1/runs/${runId}/cancel`), "idle 200");
  check(t, "POST", "/api/v1/runs/{runId}/cancel", await api.post(`/api/v1/runs/${runId}/cancel`, { turn_id: "turn_nope" }), "404 turn");
  check(t, "POST", "/api/v1/runs/{runId}/cancel", await api.post(`/api/v1/runs/${runId}/cancel`, { colour: 1 }), "400");

  const busy = await api.post("/api/v1/runs", { agent: slow, input: "nap", background: true });
  t.is(busy.status, 202);
  const busyId = busy.body.id;
  await api.waitRun(busyId, (run) => run.turn.status === "in_progress");
  check(t, "POST", "/api/v1/runs", await api.post("/api/v1/runs", { run_id: busyId, input: "x", on_busy: "reject" }), "409 run_busy");
  check(t, "DELETE", "/api/v1/runs/{runId}", await api.request("DELETE", `/api/v1/runs/${busyId}`, { idempotencyKey: "del-busy" }), "409 busy");
  const cancelling = await api.post(`/api/v1/runs/${busyId}/cancel`);
  t.is(cancelling.status, 202);
  check(t, "POST", "/api/v1/runs/{runId}/cancel", cancelling, "202");
  await api.waitTurn(busyId, busy.body.turn.id);
  check(t, "DELETE", "/api/v1/runs/{runId}", await api.request("DELETE", `/api/v1/runs/${busyId}`, { idempotencyKey: "del-1" }));
  check(t, "DELETE", "/api/v1/runs/{runId}", await api.request("DELETE", `/api/v1/runs/${busyId}`), "400 no key");
  check(t, "DELETE", "/api/v1/runs/{runId}", await api.request("DELETE", `/api/v1/runs/run_nope`, { idempotencyKey: "del-2" }), "404");
});

test("openapi - approvals: a waiting turn's pending_action, a decision and its errors", async (t) => {
  const { api, other } = t.context;
  const agent = await api.agentWith({
    model: "faux/scripted",
    tools: ["bash"],
    approval: { rules: [{ tool: "bash" }] },
    script: [{ tool_call: { name: "bash", arguments: { command: "echo hi" } } }, { text: "done" }],
  });
  const started = await api.post("/api/v1/runs", { agent, input: "go", background: true });
  const waiting = await api.waitRun(started.body.id, (r) => r.turn?.pending_action != null);
  check(t, "GET", "/api/v1/runs/{runId}", await api.get(`/api/v1/runs/${waiting.id}`), "pending_action");
  const url = `/api/v1/runs/${waiting.id}/actions/${waiting.turn.pending_action.id}`;
  const path = "/api/v1/runs/{runId}/actions/{actionId}";
  check(t, "POST", path, await api.post(url, { decision: "maybe" }), "400");
  check(t, "POST", path, await other.post(url, { decision: "approve" }), "404 run");
  check(t, "POST", path, await api.post(`/api/v1/runs/${waiting.id}/actions/act_nope`, { decision: "approve" }), "404 action");
  check(t, "POST", path, await api.post(url, { decision: "approve" }, "approve-1"), "200");
  check(t, "POST", path, await api.post(url, { decision: "deny" }, "approve-1"), "409 idempotency");
  check(t, "POST", path, await api.post(url, { decision: "deny" }), "409 decided");
  const done = await api.waitTurn(waiting.id, waiting.turn.id);
  t.is(done.turn.status, "completed");
  check(t, "GET", "/api/v1/runs/{runId}", await api.get(`/api/v1/runs/${waiting.id}`), "decided");
});

test("openapi - events: page, stream, and cursor errors", async (t) => {
  const { api } = t.context;
  const agent = await api.agentWith({ model: "faux/scripted" }, "doc-events");
  const first = await api.post("/api/v1/runs", { agent, input: "one" });
  const second = await api.post("/api/v1/runs", { agent, input: "two" });
  const runId = first.body.id;
  const path = "/api/v1/runs/{runId}/events";
  const page = await api.get(`/api/v1/runs/${runId}/events?limit=2`);
  check(t, "GET", path, page);
  check(t, "GET", path, await api.get(`/api/v1/runs/${runId}/events?turn_id=${first.body.turn.id}&after=${page.body.next_cursor}`), "after");
  check(t, "GET", path, await api.get(`/api/v1/runs/${second.body.id}/events?after=${page.body.next_cursor}`), "400 invalid_cursor");
  check(t, "GET", path, await api.get(`/api/v1/runs/${runId}/events?limit=0`), "400 limit");
  check(t, "GET", path, await api.get(`/api/v1/runs/${runId}/events?stream=maybe`), "400 stream");
  check(t, "GET", path, await api.get(`/api/v1/runs/${runId}/events?turn_id=turn_nope`), "404 turn");
  check(t, "GET", path, await api.get(`/api/v1/runs/run_nope/events`), "404 run");
  const stream = await fetch(`${api.baseUrl}/api/v1/runs/${runId}/events?stream=true&turn_id=${first.body.turn.id}`, { headers: { authorization: `Bearer ${api.key}` } });
  const events = await checkStream(t, "GET", path, stream);
  t.true(events.length > 0);
});

test("openapi - API keys: create, list, get, rotate (both paths), revoke and their errors", async (t) => {
  const { api } = t.context;
  const created = await api.post("/api/v1/api-keys", { label: "doc", scopes: ["run:read", "run:write"] }, undefined);
  check(t, "POST", "/api/v1/api-keys", created);
  check(t, "POST", "/api/v1/api-keys", await api.post("/api/v1/api-keys", { scopes: ["run:write"] }, undefined), "400 scopes");
  check(t, "GET", "/api/v1/api-keys", await api.get("/api/v1/api-keys"));
  const id = created.body.id;
  check(t, "GET", "/api/v1/api-keys/{keyId}", await api.get(`/api/v1/api-keys/${id}`));
  check(t, "GET", "/api/v1/api-keys/{keyId}", await api.get(`/api/v1/api-keys/not-a-uuid`), "400");
  check(t, "GET", "/api/v1/api-keys/{keyId}", await api.get(`/api/v1/api-keys/00000000-0000-4000-8000-000000000000`), "404");
  const rotated = await api.post(`/api/v1/api-keys/${id}/rotate`, { gracePeriodSeconds: 0 }, undefined);
  check(t, "POST", "/api/v1/api-keys/{keyId}/rotate", rotated);
  check(t, "POST", "/api/v1/api-keys/{keyId}/rotate", await api.post(`/api/v1/api-keys/${id}/rotate`, { gracePeriodSeconds: 10 }, undefined), "409 revoked");
  check(t, "POST", "/api/v1/api-keys/{keyId}/rotate", await api.post(`/api/v1/api-keys/${id}/rotate`, { mode: "test" }, undefined), "400 mode");
  const unversioned = await api.post(`/api-keys/${rotated.body.id}/rotate`, { label: "again" }, undefined);
  check(t, "POST", "/api-keys/{keyId}/rotate", unversioned);
  check(t, "POST", "/api-keys/{keyId}/rotate", await api.post(`/api-keys/00000000-0000-4000-8000-000000000000/rotate`, {}, undefined), "404");
  check(t, "POST", "/api/v1/api-keys/{keyId}/revoke", await api.post(`/api/v1/api-keys/${unversioned.body.id}/revoke`, undefined, undefined));
  check(t, "POST", "/api/v1/api-keys/{keyId}/revoke", await api.post(`/api/v1/api-keys/00000000-0000-4000-8000-000000000000/revoke`, undefined, undefined), "404");
  check(t, "GET", "/api/v1/runs", await api.withKey(created.body.key).get("/api/v1/runs"), "401 rotated without grace");
});

test("openapi - files: multipart upload, retrieval and errors", async (t) => {
  const { api } = t.context;
  const upload = (key: string | undefined, form: FormData) =>
    fetch(`${api.baseUrl}/api/v1/files`, {
      method: "POST",
      headers: { authorization: `Bearer ${api.key}`, ...(key ? { "idempotency-key": key } : {}) },
      body: form,
    }).then(async (res) => ({ status: res.status, headers: res.headers, body: await res.json() }));
  const form = () => {
    const f = new FormData();
    f.append("filename", "notes.txt");
    f.append("media_type", "text/plain");
    f.append("file", new Blob(["hello file"]), "notes.txt");
    return f;
  };
  const uploaded = await upload("file-1", form());
  t.is(uploaded.status, 201);
  check(t, "POST", "/api/v1/files", uploaded);
  check(t, "POST", "/api/v1/files", await upload(undefined, form()), "400 no key");
  const renamed = new FormData();
  renamed.append("filename", "other.txt");
  renamed.append("file", new Blob(["x"]), "other.txt");
  check(t, "POST", "/api/v1/files", await upload("file-1", renamed), "409 other file");
  const noFile = new FormData();
  noFile.append("filename", "x.txt");
  check(t, "POST", "/api/v1/files", await upload("file-2", noFile), "400 no file part");
  check(t, "POST", "/api/v1/files", await api.post("/api/v1/files", { file: "x" }), "400 JSON");
  check(t, "GET", "/api/v1/files/{fileId}", await api.get(`/api/v1/files/${uploaded.body.id}`));
  check(t, "GET", "/api/v1/files/{fileId}", await api.get(`/api/v1/files/file_nope`), "404");
});

test("openapi - environment values: put, list, get (revealed), delete and errors", async (t) => {
  const { api } = t.context;
  const one = "/api/v1/environment-values/{name}";
  check(t, "PUT", one, await api.request("PUT", "/api/v1/environment-values/DOC_TOKEN", { body: { value: "s3cret" } }));
  check(t, "PUT", one, await api.request("PUT", "/api/v1/environment-values/bad-name", { body: { value: "x" } }), "400 name");
  check(t, "PUT", one, await api.request("PUT", "/api/v1/environment-values/DOC_TOKEN", { body: { value: 1 } }), "400 value");
  check(t, "GET", "/api/v1/environment-values", await api.get("/api/v1/environment-values"));
  check(t, "GET", one, await api.get("/api/v1/environment-values/DOC_TOKEN"));
  const revealed = await api.get("/api/v1/environment-values/DOC_TOKEN?reveal=true");
  t.is(revealed.body.value, "s3cret");
  check(t, "GET", one, revealed, "revealed");
  const readOnly = await api.post("/api/v1/api-keys", { scopes: ["env_vars:read"] }, undefined);
  check(t, "GET", one, await api.withKey(readOnly.body.key).get("/api/v1/environment-values/DOC_TOKEN?reveal=true"), "403 reveal");
  check(t, "GET", one, await api.get("/api/v1/environment-values/NOPE"), "404");
  check(t, "DELETE", one, await api.request("DELETE", "/api/v1/environment-values/DOC_TOKEN"));
  check(t, "DELETE", one, await api.request("DELETE", "/api/v1/environment-values/DOC_TOKEN"), "404");
});

test("openapi - 410 run_expired and 429 rate_limited with Retry-After", async (t) => {
  const { business } = t.context;
  const agent = await business.agentWith({ model: "faux/scripted" }, "doc-expiry");
  const run = await business.post("/api/v1/runs", { agent, input: "short-lived" });
  check(t, "POST", "/api/v1/runs", run);
  await new Promise((resolve) => setTimeout(resolve, 3_500));
  const runId = run.body.id;
  check(t, "GET", "/api/v1/runs/{runId}", await business.get(`/api/v1/runs/${runId}`), "410");
  check(t, "GET", "/api/v1/runs/{runId}/turns", await business.get(`/api/v1/runs/${runId}/turns`), "410");
  check(t, "GET", "/api/v1/runs/{runId}/events", await business.get(`/api/v1/runs/${runId}/events`), "410");
  check(t, "POST", "/api/v1/runs/{runId}/tags", await business.request("POST", `/api/v1/runs/${runId}/tags`, { body: { add: ["x"] } }), "410");
  // The deployment used one of the two expensive operations of the window.
  let limited: Answer | undefined;
  for (let i = 0; i < 3 && !limited; i++) {
    const res = await business.post("/api/v1/api-keys", { scopes: ["run:read"] }, undefined);
    check(t, "POST", "/api/v1/api-keys", res, `attempt ${i}`);
    if (res.status === 429) limited = res;
  }
  t.truthy(limited, "429 within three key creations");
  t.true(Number(limited?.headers.get("retry-after")) >= 1);
});

/** `method url` sent with an absolute-form request target (`GET http://host/path`), as a proxy would. */
function absoluteForm(base: string, method: string, url: string, key?: string): Promise<number> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: hostname, port, method, path: `http://runs.example${url}`, headers: { ...(key ? { authorization: `Bearer ${key}` } : {}), "content-type": "application/json", "idempotency-key": "absolute" } }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode ?? 0));
    });
    req.on("error", reject);
    req.end(method === "GET" || method === "DELETE" ? undefined : "{}");
  });
}

test("openapi - a request with an absolute-form target reaches no route without its key: 401 on every authenticated operation, and a valid key is accepted", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const base = t.context.service.url!;
  let checked = 0;
  for (const op of OPERATIONS) {
    if (op.scope === "public") continue;
    t.is(await absoluteForm(base, op.method.toUpperCase(), urlOf(op)), 401, `${op.operationId} without a key`);
    checked++;
  }
  t.true(checked >= 30, `${checked} operations`);
  t.is(await absoluteForm(base, "GET", "/api/v1/runs", ws.key), 200, "a valid key is read");
  t.is(await absoluteForm(base, "GET", "/api/v1/models", ws.key), 200);
});

test("openapi - a path with a malformed percent-encoding is 400 invalid_request in the contract's error body, with its request id", async (t) => {
  const ws = await newWorkspace(t.context.service);
  for (const path of ["/api/v1/runs/%E0%A4%A", "/api/v1/agents/%zz", "/api/v1/environment-values/%zz"]) {
    const res = await ws.api.get(path);
    t.is(res.status, 400, path);
    t.deepEqual(Object.keys(res.body), ["error"], JSON.stringify(res.body));
    t.is(res.body.error.code, "invalid_request");
    t.is(res.body.error.type, "invalid_request_error");
    t.is(res.body.error.param, null);
    t.false(JSON.stringify(res.body).includes("FST_"), JSON.stringify(res.body));
    t.truthy(res.headers.get("x-request-id"));
    // As every /api answer (found by a probe: these had none of them).
    t.is(res.headers.get("cache-control"), "no-store", path);
    t.is(res.headers.get("x-content-type-options"), "nosniff", path);
    t.truthy(res.headers.get("x-ratelimit-limit"), path);
  }
  // A key is checked as for an unknown path: a wrong one is 401.
  const wrongKey = await ws.api.withKey("sk_live_wrong").get("/api/v1/runs/%zz");
  t.is(wrongKey.status, 401);
  t.is(wrongKey.headers.get("cache-control"), "no-store");
});

/** A URL for `op` with made-up ids: validation answers before any of them is looked up. */
function urlOf(op: (typeof OPERATIONS)[number], overrides: Record<string, string> = {}): string {
  const ids: Record<string, string> = { runId: "run_x", turnId: "turn_x", agentId: "agt_x", version: "1", keyId: "00000000-0000-0000-0000-000000000000", fileId: "file_x", name: "X", ...overrides };
  return op.path.replace(/\{([^}]+)\}/g, (_, name: string) => ids[name] ?? "x");
}

test("openapi - every declared body, query and path schema validates its route: 400 naming the parameter, after authentication", async (t) => {
  const { api } = await newWorkspace(t.context.service);
  const anonymous = api.withKey(undefined);
  let checked = 0;
  for (const op of OPERATIONS) {
    const method = op.method.toUpperCase();
    if (op.body && !op.body.multipart) {
      // Not an object: refused by the declared body schema, naming no field.
      const refused = await api.request(method, urlOf(op), { rawBody: "[1]", idempotencyKey: "validation" });
      t.is(refused.status, 400, op.operationId);
      t.is(refused.body.error.code, "invalid_request", op.operationId);
      t.is(refused.body.error.param, null, op.operationId);
      // The same request without a key: authentication answers first.
      t.is((await anonymous.request(method, urlOf(op), { rawBody: "[1]", idempotencyKey: "validation" })).status, op.scope === "public" ? 400 : 401, op.operationId);
      checked++;
    }
    if (op.query && "limit" in op.query.shape) {
      const refused = await api.request(method, `${urlOf(op)}?limit=0`);
      t.is(refused.status, 400, op.operationId);
      t.is(refused.body.error.param, "limit", op.operationId);
      checked++;
    }
    for (const [name, bad] of [["version", "first"], ["keyId", "not-a-uuid"]] as const) {
      if (!op.params || !(name in op.params.shape)) continue;
      const refused = await api.request(method, urlOf(op, { [name]: bad }), method === "GET" ? {} : { body: {}, idempotencyKey: "validation" });
      t.is(refused.status, 400, `${op.operationId} ${name}`);
      t.is(refused.body.error.param, name, `${op.operationId} ${name}`);
      checked++;
    }
  }
  t.true(checked >= 20, `${checked} declarations checked`);
});

test.after("openapi - coverage of documented responses", (t) => {
  const { doc, covered } = t.context;
  let total = 0;
  for (const [path, item] of Object.entries<any>(doc.paths)) {
    for (const [method, op] of Object.entries<any>(item)) total += Object.keys(op.responses).length;
    void path;
  }
  t.log(`exercised ${covered.size} of ${total} documented (operation, status) pairs`);
});
