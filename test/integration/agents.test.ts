import anyTest, { type TestFn } from "ava";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";

const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; api: Api; other: Api }>;

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers);
  const ws = await newWorkspace(service);
  const other = await newWorkspace(service);
  t.context = { servers, service, api: ws.api, other: other.api };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

test("agents - create, get and list with cursors; other workspaces see nothing", async (t) => {
  const { api, other } = t.context;
  const created = await api.post("/api/v1/agents", { name: "alpha", description: "first" });
  t.is(created.status, 201);
  t.regex(created.body.id, /^agt_/);
  t.is(created.body.object, "agent");
  t.is(created.body.active_version, null);
  t.is(created.body.description, "first");
  const got = await api.get(`/api/v1/agents/${created.body.id}`);
  t.deepEqual(got.body, created.body);
  for (let i = 0; i < 3; i++) await api.post("/api/v1/agents", { name: `more-${i}` });
  const page1 = await api.get("/api/v1/agents?limit=2");
  t.is(page1.body.data.length, 2);
  t.true(page1.body.has_more);
  const ids: string[] = page1.body.data.map((a: any) => a.id);
  let cursor = page1.body.next_cursor;
  for (let i = 0; i < 100 && cursor; i++) {
    const page = await api.get(`/api/v1/agents?limit=2&after=${cursor}`);
    ids.push(...page.body.data.map((a: any) => a.id));
    cursor = page.body.has_more ? page.body.next_cursor : null;
  }
  t.is(new Set(ids).size, ids.length, "no duplicates across pages");
  t.true(ids.includes(created.body.id));
  t.is((await other.get(`/api/v1/agents/${created.body.id}`)).status, 404);
  t.is((await other.get(`/api/v1/agents/${created.body.id}`)).body.error.code, "agent_not_found");
  const otherCursor = await other.get(`/api/v1/agents?after=${page1.body.next_cursor}`);
  t.is(otherCursor.status, 400);
  t.is(otherCursor.body.error.code, "invalid_cursor");
});

test("agents - validation names the field", async (t) => {
  const { api } = t.context;
  t.is((await api.post("/api/v1/agents", {})).body.error.param, "name");
  t.is((await api.post("/api/v1/agents", { name: "" })).body.error.param, "name");
  t.is((await api.post("/api/v1/agents", { name: "x", colour: 1 })).body.error.param, "colour");
});

test("deployments - versions 1, 2, 3, building then ready, activation and upgrade_policy", async (t) => {
  const { api } = t.context;
  const agent = (await api.post("/api/v1/agents", { name: "deploys" })).body;
  const d1 = await api.deploy(agent.id, { model: "faux/scripted" });
  t.is(d1.version, 1);
  t.is(d1.status, "building");
  t.is((await api.waitDeployment(agent.id, 1)).status, "ready");
  t.is((await api.get(`/api/v1/agents/${agent.id}`)).body.active_version, 1);

  const d2 = await api.deploy(agent.id, { model: "faux/scripted", instructions: "be brief" }, { activate: false, upgrade_policy: "new_run_only" });
  t.is(d2.version, 2);
  const ready2 = await api.waitDeployment(agent.id, 2);
  t.is(ready2.status, "ready");
  t.is((ready2 as any).upgrade_policy, "new_run_only");
  t.is((await api.get(`/api/v1/agents/${agent.id}`)).body.active_version, 1, "not activated");

  const activated = await api.post(`/api/v1/agents/${agent.id}/deployments/2/activate`);
  t.is(activated.status, 200);
  t.is(activated.body.active_version, 2);

  const d3 = await api.deploy(agent.id, { model: "faux/scripted" }, { activate: false });
  t.is(d3.version, 3);
  const list = await api.get(`/api/v1/agents/${agent.id}/deployments`);
  t.deepEqual(
    list.body.data.map((d: any) => d.version),
    [1, 2, 3],
  );
  t.is((await api.get(`/api/v1/agents/${agent.id}/deployments/9`)).status, 404);
  t.is((await api.get(`/api/v1/agents/${agent.id}/deployments/abc`)).body.error.param, "version");
});

test("deployments - a start sent after an activation answered runs on the new version, while other starts of the agent share their reads of it", async (t) => {
  // A workspace of its own: its two dozen turns at once would take the shared workspace's
  // active turns (10 on solo), and the other tests' turns would fail concurrency_limit_reached.
  const { api } = await newWorkspace(t.context.service, "business");
  const agent = (await api.post("/api/v1/agents", { name: "activation-race" })).body;
  await api.deploy(agent.id, { model: "faux/scripted" });
  await api.waitDeployment(agent.id, 1);
  await api.deploy(agent.id, { model: "faux/scripted" }, { activate: false });
  await api.waitDeployment(agent.id, 2);
  const start = () => api.post("/api/v1/runs", { agent: agent.id, input: "hi", background: true });
  // Starts of the agent in flight all along, eight at a time: their reads of it overlap.
  let stop = false;
  const beside = (async () => {
    for (let i = 0; i < 100 && !stop; i++) await Promise.all(Array.from({ length: 8 }, start));
  })();
  await new Promise((resolve) => setTimeout(resolve, 150));
  const activated = await api.post(`/api/v1/agents/${agent.id}/deployments/2/activate`);
  t.is(activated.status, 200);
  const after = await Promise.all(Array.from({ length: 16 }, start));
  stop = true;
  await beside;
  t.deepEqual(after.map((r) => [r.status, r.body.agent_version]), Array.from({ length: 16 }, () => [202, 2]));
});

test("deployments - abuse: a key without env_vars:reveal cannot deploy an endpoint of its choosing that is sent an environment value (api_key_env): 403 naming the field; nothing is deployed", async (t) => {
  const { api } = t.context;
  const agent = (await api.post("/api/v1/agents", { name: "exfil" })).body;
  const custom = (apiKeyEnv?: string) => ({ config: { model: { provider: "openai-compatible", base_url: "https://203.0.113.7/v1", model: "m", ...(apiKeyEnv ? { api_key_env: apiKeyEnv } : {}) }, tools: [] } });
  const lesser = (await api.post("/api/v1/api-keys", { scopes: ["agents:read", "agents:write", "run:read", "run:write", "env_vars:read"] })).body.key as string;
  const refused = await api.withKey(lesser).post(`/api/v1/agents/${agent.id}/deployments`, custom("MY_SECRET"), "exfil-1");
  t.is(refused.status, 403, JSON.stringify(refused.body));
  t.is(refused.body.error.code, "permission_denied");
  t.is(refused.body.error.param, "config.model.api_key_env");
  t.regex(refused.body.error.message, /env_vars:reveal/);
  t.is((await api.get(`/api/v1/agents/${agent.id}/deployments`)).body.data.length, 0, "nothing deployed");
  // Without a value to send it is that key's to deploy; with the scope, the value too.
  t.is((await api.withKey(lesser).post(`/api/v1/agents/${agent.id}/deployments`, custom(), "exfil-2")).status, 201);
  // (run:read too: an endpoint of the key's choosing is sent the agent's turns, below.)
  const revealer = (await api.post("/api/v1/api-keys", { scopes: ["agents:read", "agents:write", "run:read", "env_vars:read", "env_vars:reveal"] })).body.key as string;
  t.is((await api.withKey(revealer).post(`/api/v1/agents/${agent.id}/deployments`, custom("MY_SECRET"), "exfil-3")).status, 201);
});

test("deployments - abuse: a key without run:read cannot deploy an openai-compatible endpoint, which is sent every turn of the agent: 403 naming config.model (found by a review); models the service calls itself stay its to deploy", async (t) => {
  const { api } = t.context;
  const agent = (await api.post("/api/v1/agents", { name: "exfil-turns" })).body;
  const builder = api.withKey((await api.post("/api/v1/api-keys", { scopes: ["agents:read", "agents:write"] })).body.key as string);
  const endpoint = { config: { model: { provider: "openai-compatible", base_url: "https://203.0.113.7/v1", model: "m" }, tools: [] } };
  const refused = await builder.post(`/api/v1/agents/${agent.id}/deployments`, endpoint, "exfil-turns-1");
  t.is(refused.status, 403, JSON.stringify(refused.body));
  t.like(refused.body.error, { code: "permission_denied", param: "config.model" });
  t.regex(refused.body.error.message, /lacks the scope run:read: an openai-compatible endpoint is sent the turns/);
  t.is((await api.get(`/api/v1/agents/${agent.id}/deployments`)).body.data.length, 0, "nothing deployed");
  // Commands that may reach hosts of the key's choosing could send them the workspace: the same rule (found by a second review).
  const allowing = await builder.post(`/api/v1/agents/${agent.id}/deployments`, { config: { model: "faux/scripted", network: { allow: ["evil.example"] } } }, "exfil-turns-4");
  t.is(allowing.status, 403, JSON.stringify(allowing.body));
  t.like(allowing.body.error, { code: "permission_denied", param: "config.network.allow" });
  t.is((await api.get(`/api/v1/agents/${agent.id}/deployments`)).body.data.length, 0, "nothing deployed");
  t.is((await builder.post(`/api/v1/agents/${agent.id}/deployments`, { config: { model: "faux/scripted", network: { allow: [] } } }, "exfil-turns-5")).status, 201);
  t.is((await builder.post(`/api/v1/agents/${agent.id}/deployments`, { config: { model: "faux/scripted" } }, "exfil-turns-2")).status, 201);
  const reader = api.withKey((await api.post("/api/v1/api-keys", { scopes: ["agents:read", "agents:write", "run:read"] })).body.key as string);
  t.is((await reader.post(`/api/v1/agents/${agent.id}/deployments`, endpoint, "exfil-turns-3")).status, 201);
  t.is((await reader.post(`/api/v1/agents/${agent.id}/deployments`, { config: { model: "faux/scripted", network: { allow: ["evil.example"] } } }, "exfil-turns-6")).status, 201);
});

test("deployments - concurrent creates get distinct versions", async (t) => {
  const { api } = t.context;
  const agent = (await api.post("/api/v1/agents", { name: "race" })).body;
  const results = await Promise.all(Array.from({ length: 5 }, () => api.deploy(agent.id, { model: "faux/scripted" }, { activate: false })));
  t.deepEqual(
    results.map((r) => r.version).sort((a, b) => a - b),
    [1, 2, 3, 4, 5],
  );
});

test("deployments - a model no registry holds fails the build with an error naming it", async (t) => {
  const { api } = t.context;
  const agent = (await api.post("/api/v1/agents", { name: "bad-model" })).body;
  const d = await api.deploy(agent.id, { model: "nosuch/imaginary-model" });
  const built: any = await api.waitDeployment(agent.id, d.version);
  t.is(built.status, "failed");
  t.regex(built.error.message, /nosuch\/imaginary-model/);
  t.is((await api.get(`/api/v1/agents/${agent.id}`)).body.active_version, null, "a failed build is never active");
  const activate = await api.post(`/api/v1/agents/${agent.id}/deployments/${d.version}/activate`);
  t.is(activate.status, 409);
  t.is(activate.body.error.code, "agent_version_not_ready");
  t.false(activate.body.error.retryable, "a failed build never becomes ready");
  // Starting a run on it: the same, not retryable (a building version's 409 is).
  const start = await api.post("/api/v1/runs", { agent: agent.id, version: d.version, input: "x" });
  t.is(start.status, 409);
  t.is(start.body.error.code, "agent_version_not_ready");
  t.is(start.body.error.param, "version");
  t.false(start.body.error.retryable);
  // It says why and what to do (it had said "Version 1 is failed."; found by a probe).
  t.is(start.body.error.message, `Version ${d.version} failed to build (model_not_found); deploy a new version.`);
  const active = await api.post("/api/v1/runs", { agent: agent.id, input: "x" });
  t.is(active.status, 409);
  t.regex(active.body.error.message, /no active deployment yet: a deployment becomes active when its build is ready/);
});

test("deployments - config validation: unknown fields, tools, script only for faux/scripted", async (t) => {
  const { api } = t.context;
  const agent = (await api.post("/api/v1/agents", { name: "validation" })).body;
  const url = `/api/v1/agents/${agent.id}/deployments`;
  const cases: Array<[unknown, string]> = [
    [{ config: { model: "faux/scripted", temperature: 1 } }, "config.temperature"],
    [{ config: { model: "faux/scripted", tools: ["rm"] } }, "config.tools.0"],
    [{ config: { model: { provider: "openai-compatible", base_url: "https://203.0.113.7/v1", model: "m".repeat(257) } } }, "config.model.model"],
    [{ config: { model: "faux/scripted", tools: ["bash", "bash"] } }, "config.tools"],
    [{ config: { model: "openai/gpt-4.1-mini", script: [{ text: "x" }] } }, "config.script"],
    [{ config: { model: "faux/scripted", script: [{ say: "x" }] } }, "config.script.0"],
    [{ config: { model: "no-slash" } }, "config.model"],
    // A million members took the request's fingerprint 8.6 s (found by an audit): 10,000 in all.
    [{ config: { model: "faux/scripted", script: [{ tool_call: { name: "bash", arguments: { rows: Array.from({ length: 6_000 }, () => 1) } } }, { tool_call: { name: "bash", arguments: Object.fromEntries(Array.from({ length: 4_001 }, (_, i) => [`k${i}`, i])) } }] } }, "config.script.1.tool_call.arguments"],
    // No length cap let a failed build quote megabytes in its error, on every read of it.
    [{ config: { model: `p/${"x".repeat(255)}` } }, "config.model"],
    // Only http(s), and no credentials in the address (found by an adversarial probe: each was 201).
    ...["ftp://8.8.8.8/v1", "file:///etc/passwd", "javascript:alert(1)", "gopher://203.0.113.7:70/", "http://u:p@203.0.113.7/v1", "https://key@203.0.113.7/v1", `https://203.0.113.7/${"v".repeat(2_048)}`, "https://203.0.113.7:0/v1", "https://models..example/v1"].map(
      (baseUrl): [unknown, string] => [{ config: { model: { provider: "openai-compatible", base_url: baseUrl, model: "m" } } }, "config.model.base_url"],
    ),
    [{ config: { model: "faux/scripted" }, upgrade_policy: "sometimes" }, "upgrade_policy"],
    [{}, "config"],
    [{ config: { model: "faux/scripted" }, extra: 1 }, "extra"],
  ];
  for (const [body, param] of cases) {
    const res = await api.post(url, body);
    t.is(res.status, 400, JSON.stringify(body));
    t.is(res.body.error.param, param, JSON.stringify(body));
  }
  const noKey = await api.request("POST", url, { body: { config: { model: "faux/scripted" } } });
  t.is(noKey.status, 400);
  t.is(noKey.body.error.param, "Idempotency-Key");
});

test("deployments - the same Idempotency-Key returns the same deployment", async (t) => {
  const { api } = t.context;
  const agent = (await api.post("/api/v1/agents", { name: "idem" })).body;
  const body = { config: { model: "faux/scripted" } };
  const a = await api.post(`/api/v1/agents/${agent.id}/deployments`, body, "same-key");
  const b = await api.post(`/api/v1/agents/${agent.id}/deployments`, body, "same-key");
  t.is(a.body.version, b.body.version);
  const c = await api.post(`/api/v1/agents/${agent.id}/deployments`, { config: { model: "faux/scripted", instructions: "x" } }, "same-key");
  t.is(c.status, 409);
  t.is(c.body.error.code, "idempotency_conflict");
  // Scoped to the workspace and the operation (decisions §4): the same key and body on
  // another agent is another request, not a second deployment.
  const other = (await api.post("/api/v1/agents", { name: "idem-other" })).body;
  const elsewhere = await api.post(`/api/v1/agents/${other.id}/deployments`, body, "same-key");
  t.is(elsewhere.status, 409, JSON.stringify(elsewhere.body));
  t.is(elsewhere.body.error.code, "idempotency_conflict");
  t.is((await api.get(`/api/v1/agents/${other.id}/deployments`)).body.data.length, 0);
});

test("models - the registry's models plus faux/scripted", async (t) => {
  const { api } = t.context;
  const res = await api.get("/api/v1/models");
  t.is(res.status, 200);
  t.is(res.body.object, "list");
  const ids = res.body.data.map((m: any) => m.id);
  t.true(ids.includes("faux/scripted"));
  t.true(ids.some((id: string) => id.startsWith("openai/")));
});

test("turns - scripted provider errors map to the provider_* turn error codes", async (t) => {
  const { api } = t.context;
  const cases: Array<[number | undefined, string, boolean]> = [
    [401, "provider_authentication_failed", false],
    [403, "provider_authentication_failed", false],
    [402, "provider_quota_exhausted", false],
    [429, "provider_rate_limited", true],
    [503, "provider_service_unavailable", true],
    [undefined, "provider_failure", true],
  ];
  for (const [status, code, retryable] of cases) {
    const agent = await api.agentWith({ model: "faux/scripted", script: [{ error: { message: "upstream said no", ...(status ? { status } : {}) } }] });
    const res = await api.post("/api/v1/runs", { agent, input: "x" });
    t.is(res.status, 200);
    t.is(res.body.turn.status, "failed", String(status));
    t.is(res.body.turn.error.code, code, String(status));
    t.is(res.body.turn.error.source, "provider");
    t.is(res.body.turn.error.retryable, retryable);
    t.regex(res.body.turn.error.reference, /^ref_/);
    t.is(res.body.state, "idle");
  }
});

test("turns - a text step after a failing tool still completes (tool errors go back to the model)", async (t) => {
  const { api } = t.context;
  const agent = await api.agentWith({
    model: "faux/scripted",
    tools: ["bash"],
    script: [{ tool_call: { name: "bash", arguments: { command: "exit 3" } } }, { text: "recovered" }],
  });
  const res = await api.post("/api/v1/runs", { agent, input: "x" });
  t.is(res.body.turn.status, "completed");
  t.deepEqual(res.body.turn.output, [{ type: "output_text", text: "recovered" }]);
});

test("deployments - JSON nested 2,000 levels deep is 400 naming the field, and the Idempotency-Key stays free", async (t) => {
  const { api } = t.context;
  const agent = (await api.post("/api/v1/agents", { name: "deep" })).body.id;
  let deep: Record<string, unknown> = {};
  for (let i = 0; i < 2_000; i++) deep = { a: deep };
  const config = { model: "faux/scripted", script: [{ tool_call: { name: "bash", arguments: deep } }] };
  const res = await api.post(`/api/v1/agents/${agent}/deployments`, { config }, "deep-key");
  t.is(res.status, 400, JSON.stringify(res.body).slice(0, 300));
  t.is(res.body.error.param, "config.script.0.tool_call.arguments");
  // The key was not spent: the same key with a valid body deploys.
  const ok = await api.post(`/api/v1/agents/${agent}/deployments`, { config: { model: "faux/scripted" } }, "deep-key");
  t.is(ok.status, 201, JSON.stringify(ok.body));
  // Deep JSON anywhere else is refused before any handler: 400, never 5xx.
  const run = await api.post("/api/v1/runs", { agent, input: [{ type: "input_text", text: "x", extra: deep }] });
  t.is(run.status, 400, JSON.stringify(run.body).slice(0, 300));
  // A body that is a bare number JSON cannot hold (1e999 parses as Infinity) is refused as
  // a body that is not an object, not as JSON nested too deep.
  const infinite = await api.request("POST", "/api/v1/runs", { rawBody: "1e999", idempotencyKey: "inf-key" });
  t.is(infinite.status, 400, JSON.stringify(infinite.body));
  t.is(infinite.body.error.code, "invalid_request");
  t.notRegex(infinite.body.error.message, /nested/);
});

test("deployments - abuse: tool-call arguments in a script the store cannot hold ($-prefixed, dotted, NUL keys; arrays in arrays; 1e999) are 400 naming the field, never 500; nothing is deployed", async (t) => {
  const { api } = t.context;
  const agent = (await api.post("/api/v1/agents", { name: "unstorable" })).body.id;
  const refused = (res: { status: number; body: any }) => {
    t.is(res.status, 400, JSON.stringify(res.body).slice(0, 300));
    t.is(res.body.error.type, "invalid_request_error");
    t.is(res.body.error.code, "invalid_request");
    t.false(res.body.error.retryable);
    t.is(res.body.error.param, "config.script.1.tool_call.arguments");
  };
  for (const args of [{ $where: "1" }, { ok: [{ "a.b": 1 }] }, { ok: { nested: { $gt: 1 } } }, { "nul\u0000key": 1 }, { grid: [[1], [2]] }, { ok: [{ rows: [[]] }] }]) {
    const config = { model: "faux/scripted", script: [{ text: "first" }, { tool_call: { name: "bash", arguments: { command: "echo hi", ...args } } }] };
    refused(await api.post(`/api/v1/agents/${agent}/deployments`, { config }));
  }
  // JSON.parse reads 1e999 as Infinity, which the store refuses.
  const infinite = '{"config":{"model":"faux/scripted","script":[{"text":"first"},{"tool_call":{"name":"bash","arguments":{"command":"echo hi","n":1e999}}}]}}';
  refused(await api.request("POST", `/api/v1/agents/${agent}/deployments`, { rawBody: infinite, idempotencyKey: "infinite-1" }));
  t.deepEqual((await api.get(`/api/v1/agents/${agent}/deployments`)).body.data, []);
  // The same keys as values, and keys merely holding "$" later on, are stored as given.
  const fine = await api.post(`/api/v1/agents/${agent}/deployments`, { config: { model: "faux/scripted", script: [{ tool_call: { name: "bash", arguments: { command: "$where a.b", "price$": "x" } } }] } });
  t.is(fine.status, 201, JSON.stringify(fine.body).slice(0, 300));
});

test("deployments - the runtime's deployment cache holds at most its capacity, least recently used out", async (t) => {
  const { api, service } = t.context;
  const { DeploymentCache } = await import("../../src/deployments.js");
  const agent = await api.agentWith({ model: "faux/scripted" });
  for (const v of [2, 3]) {
    await api.deploy(agent, { model: "faux/scripted" });
    await api.waitDeployment(agent, v);
  }
  const cache = new DeploymentCache(service.store, 2);
  for (const v of [1, 2]) t.is((await cache.get(agent, v))?.version, v);
  t.is(cache.size, 2);
  await cache.get(agent, 1); // 1 is now the most recently used
  t.is((await cache.get(agent, 3))?.version, 3);
  t.is(cache.size, 2, "bounded");
  // Version 2 went out: a get reads the store again (and evicts 1's neighbour by use).
  const reads: string[] = [];
  const spying = new DeploymentCache({ getDeployment: async (a: string, v: number) => (reads.push(`${v}`), service.store.getDeployment(a, v)) } as never, 2);
  for (const v of [1, 2, 1, 3, 1, 2]) await spying.get(agent, v);
  t.deepEqual(reads, ["1", "2", "3", "2"], "hits are not read again; the least recently used (2) was evicted by 3");
});

test("deployments - the list pages by version with limit and after; a forged cursor is 400", async (t) => {
  const { service } = t.context;
  const { api } = await newWorkspace(service, "business");
  const agent = (await api.post("/api/v1/agents", { name: "many" })).body.id;
  for (let i = 0; i < 12; i++) t.is((await api.post(`/api/v1/agents/${agent}/deployments`, { config: { model: "faux/scripted" }, activate: false })).status, 201);
  const versions: number[] = [];
  let url = `/api/v1/agents/${agent}/deployments?limit=5`;
  for (let page = 0; page < 10; page++) {
    const res = await api.get(url);
    t.is(res.status, 200);
    t.true(res.body.data.length <= 5);
    versions.push(...res.body.data.map((d: { version: number }) => d.version));
    if (!res.body.has_more) {
      t.is(res.body.next_cursor, null);
      break;
    }
    url = `/api/v1/agents/${agent}/deployments?limit=5&after=${res.body.next_cursor}`;
  }
  t.deepEqual(versions, Array.from({ length: 12 }, (_, i) => i + 1));
  t.is((await api.get(`/api/v1/agents/${agent}/deployments`)).body.data.length, 12, "default page size 20");
  const forged = await api.get(`/api/v1/agents/${agent}/deployments?after=${Buffer.from(JSON.stringify({ s: "deployments", o: agent, k: "3", id: "3" })).toString("base64url")}`);
  t.is(forged.status, 400);
  t.is(forged.body.error.code, "invalid_cursor");
  t.is((await api.get(`/api/v1/agents/${agent}/deployments?limit=0`)).body.error.param, "limit");
});

test("deployments - a user name or password stored before base_url refused them is shown as ***, in the config and in a quoted error (turns cannot use it: fetch refuses such a URL)", async (t) => {
  const { api, servers } = t.context;
  const agent = (await api.post("/api/v1/agents", { name: "legacy-endpoint" })).body;
  const deployed = await api.post(`/api/v1/agents/${agent.id}/deployments`, { config: { model: { provider: "openai-compatible", base_url: "https://203.0.113.7/v1", model: "m" }, tools: [] } });
  t.is(deployed.status, 201, JSON.stringify(deployed.body));
  const raw = (await servers.raw()).db.collection<{ _id: string; config: { model: { base_url: string } }; error: { code: string; message: string } | null }>("deployments");
  const id = `${agent.id}:${deployed.body.version}`;
  // Its build done first: the build's own write of the document would race the ones below.
  for (let i = 0; i < 200 && (await api.get(`/api/v1/agents/${agent.id}/deployments/${deployed.body.version}`)).body.status === "building"; i++) await new Promise((resolve) => setTimeout(resolve, 25));
  // As stored; as the config shows it (a URL: its own fields masked); as an error quoting it shows it.
  const stored = [
    ["https://user:s3cret-pass@203.0.113.7/v1", "https://***:***@203.0.113.7/v1", "https://***@203.0.113.7/v1"],
    ["https://sk-s3cret-key@203.0.113.7/v1", "https://***@203.0.113.7/v1", "https://***@203.0.113.7/v1"],
    ["https://:s3cret-pass@203.0.113.7/v1", "https://:***@203.0.113.7/v1", "https://***@203.0.113.7/v1"],
    ["https://user:p@ss-s3cret@203.0.113.7/v1?q=a", "https://***:***@203.0.113.7/v1?q=a", "https://***@203.0.113.7/v1?q=a"],
    // Forms a URL parser takes (found by a second review: the first regex missed them).
    ["https:user:s3cret-pass@203.0.113.7/v1", "https://***:***@203.0.113.7/v1", "https:***@203.0.113.7/v1"],
    ["https:\\user:s3cret-pass@203.0.113.7/v1", "https://***:***@203.0.113.7/v1", "https:\\***@203.0.113.7/v1"],
    // Not a URL (no check refused it then): its credentials are hidden all the same (found by a review).
    ["https://user:s3cret-pass@models example/v1", "https://***@models example/v1", "https://***@models example/v1"],
    ["https://user:s3cret/pass@models example/v1", "https://***@models example/v1", "https://***@models example/v1"],
  ] as const;
  for (const [legacy, shown, quoted] of stored) {
    const error = { code: "agent_version_not_ready", message: `The base_url "${legacy}" of the openai-compatible model is not a URL` };
    await raw.updateOne({ _id: id }, { $set: { "config.model.base_url": legacy, error } });
    const got = await api.get(`/api/v1/agents/${agent.id}/deployments/${deployed.body.version}`);
    t.is(got.status, 200);
    t.is(got.body.config.model.base_url, shown, legacy);
    t.is(got.body.error.message, `The base_url "${quoted}" of the openai-compatible model is not a URL`, legacy);
    const listed = await api.get(`/api/v1/agents/${agent.id}/deployments`);
    t.is(listed.body.data[0].config.model.base_url, shown);
    for (const body of [got.body, listed.body]) t.false(JSON.stringify(body).includes("s3cret"), legacy);
    // Only what readers see changes: the stored document is not rewritten.
    t.is((await raw.findOne({ _id: id }))?.config.model.base_url, legacy);
  }
});
