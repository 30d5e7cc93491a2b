import anyTest, { type TestFn } from "ava";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { SCOPES } from "../../src/scopes.js";
import { newApiKey } from "../../src/api-keys.js";
import { Ids } from "../../src/ids.js";

const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; api: Api; other: Api; anon: Api }>;

test.before(async (t) => {
  const servers = await startTestServers();
  // A short auth cache, as a multi-node deployment would run with.
  const service = await startTestService(servers, { RUNS_AUTH_CACHE_MS: "500" });
  const ws = await newWorkspace(service);
  const other = await newWorkspace(service);
  t.context = { servers, service, api: ws.api, other: other.api, anon: new Api(service.url!) };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

async function createKey(api: Api, scopes: string[], label: string | null = "test") {
  const res = await api.post("/api/v1/api-keys", { label, scopes });
  if (res.status !== 201) throw new Error(`key create failed ${res.status} ${JSON.stringify(res.body)}`);
  return res.body;
}

test("auth - missing, malformed and unknown keys are 401 unauthorized", async (t) => {
  const { anon } = t.context;
  for (const headers of [{} as Record<string, string>, { authorization: "Basic abc" }, { authorization: "Bearer rk_live_nope" }, { authorization: "Bearer" }]) {
    const res = await anon.request("GET", "/api/v1/runs/run_x", { headers });
    t.is(res.status, 401, JSON.stringify(headers));
    t.is(res.body.error.code, "unauthorized");
    t.is(res.body.error.type, "authentication_error");
    t.is(res.headers.get("www-authenticate"), 'Bearer realm="runs"', "the scheme it takes (RFC 9110)");
  }
  // A key sent without its scheme is told the header's form, not that no key came (found by a probe).
  const bare = await anon.request("GET", "/api/v1/runs/run_x", { headers: { authorization: "rk_live_abc" } });
  t.is(bare.body.error.message, "The Authorization header must be Bearer <API_KEY>.");
  t.is((await anon.request("GET", "/api/v1/runs/run_x")).body.error.message, "Missing API key: send Authorization: Bearer <API_KEY>.");
});

test("auth - a key without the route's scope is 403 permission_denied naming the scope", async (t) => {
  const { api } = t.context;
  const readOnly = await createKey(api, ["run:read"]);
  const limited = api.withKey(readOnly.key);
  const write = await limited.post("/api/v1/runs", { agent: "agt_x", input: "x" });
  t.is(write.status, 403);
  t.is(write.body.error.code, "permission_denied");
  t.is(write.body.error.type, "permission_error");
  t.regex(write.body.error.message, /run:write/);
  const agents = await limited.get("/api/v1/agents");
  t.is(agents.status, 403);
  t.regex(agents.body.error.message, /agents:read/);
  const read = await limited.get("/api/v1/runs/run_unknown");
  t.is(read.status, 404, "run:read is enough to read");
});

/** Every key of the workspace, page after page (other tests add keys meanwhile). */
async function allKeys(api: Api): Promise<any[]> {
  const keys: any[] = [];
  let after: string | null = null;
  for (let i = 0; i < 100; i++) {
    const page: { status: number; body: any } = await api.get(`/api/v1/api-keys?limit=100${after ? `&after=${after}` : ""}`);
    if (page.status !== 200) throw new Error(`list failed ${page.status} ${JSON.stringify(page.body)}`);
    keys.push(...page.body.data);
    if (!page.body.has_more) return keys;
    after = page.body.next_cursor;
  }
  throw new Error("more than 100 pages of keys");
}

test("keys - the list pages newest first (ties by id), each key once, as every list does; bad limits and cursors are 400", async (t) => {
  const { service } = t.context;
  const ws = await newWorkspace(service);
  const other = await newWorkspace(service);
  // 45 more keys, in threes created at the same millisecond (so that page cuts fall inside ties).
  const base = Date.now() - 1_000_000;
  for (let i = 0; i < 45; i++) {
    const { doc } = newApiKey({ workspaceId: ws.id, label: `k${i}`, scopes: ["run:read"], nowMs: base + Math.floor(i / 3) * 1000, ids: Ids });
    await service.store.keys.insert(doc);
  }
  const pages: any[] = [];
  let after: string | null = null;
  for (let i = 0; i < 10; i++) {
    const res: { status: number; body: any } = await ws.api.get(`/api/v1/api-keys${after ? `?after=${after}` : ""}`);
    t.is(res.status, 200, JSON.stringify(res.body));
    pages.push(res.body);
    if (!res.body.has_more) break;
    after = res.body.next_cursor;
  }
  t.deepEqual(pages.map((p) => p.data.length), [20, 20, 6], "20 a page by default: the 45 and the workspace's own key");
  t.deepEqual(pages.map((p) => [p.has_more, typeof p.next_cursor]), [[true, "string"], [true, "string"], [false, "object"]]);
  t.is(pages[2].next_cursor, null, "the list envelope: no cursor past the last page (runs-api.md)");
  const listed = pages.flatMap((p) => p.data);
  t.is(new Set(listed.map((k) => k.id)).size, 46, "each key once");
  const order = listed.map((k) => [k.created_at, k.id]);
  const sorted = [...order].sort((a, b) => (a[0] !== b[0] ? b[0] - a[0] : a[1] < b[1] ? 1 : -1));
  t.deepEqual(order, sorted, "newest first, ties by id");
  t.deepEqual((await ws.api.get("/api/v1/api-keys?limit=100")).body.data.length, 46);
  // Pages of 7: cuts inside ties (three keys share a second) lose and repeat nothing.
  const sevens: any[] = [];
  let cutsInTies = 0;
  after = null;
  for (let i = 0; i < 20; i++) {
    const res: { status: number; body: any } = await ws.api.get(`/api/v1/api-keys?limit=7${after ? `&after=${after}` : ""}`);
    const previous = sevens[sevens.length - 1];
    if (previous && res.body.data[0] && previous.created_at === res.body.data[0].created_at) cutsInTies++;
    sevens.push(...res.body.data);
    if (!res.body.has_more) break;
    after = res.body.next_cursor;
  }
  t.deepEqual(sevens.map((k) => k.id), listed.map((k) => k.id), "the same keys in the same order");
  t.true(cutsInTies >= 2, `cuts inside ties: ${cutsInTies}`);
  for (const limit of ["0", "101", "x", "1.5"]) {
    const res = await ws.api.get(`/api/v1/api-keys?limit=${limit}`);
    t.is(res.status, 400, limit);
    t.is(res.body.error.param, "limit", limit);
  }
  const garbage = await ws.api.get("/api/v1/api-keys?after=not-a-cursor");
  t.is(garbage.status, 400);
  t.is(garbage.body.error.code, "invalid_cursor");
  // A cursor is the list's and the workspace's: another workspace's, or another list's, is refused.
  const foreign = await other.api.get(`/api/v1/api-keys?after=${pages[0].next_cursor}`);
  t.is(foreign.status, 400);
  t.is(foreign.body.error.code, "invalid_cursor");
  const agentsCursor = (await ws.api.get(`/api/v1/agents?after=${pages[0].next_cursor}`));
  t.is(agentsCursor.status, 400);
  t.is(agentsCursor.body.error.code, "invalid_cursor");
});

test("keys - create returns the secret once; list and get never do", async (t) => {
  const { api } = t.context;
  const key = await createKey(api, ["run:read", "run:write"], "ci");
  t.regex(key.key, /^rk_live_[0-9A-Za-z]{32,}$/);
  t.is(key.key_prefix, key.key.slice(0, 12));
  t.is(key.object, "api_key");
  t.is(key.mode, "live");
  t.deepEqual(key.scopes, ["run:read", "run:write"]);
  t.is(key.label, "ci");
  t.is(key.revoked_at, null);
  t.is(key.last_used_at, null);
  t.regex(key.id, /^[0-9a-f-]{36}$/);
  const got = await api.get(`/api/v1/api-keys/${key.id}`);
  t.is(got.status, 200);
  t.false("key" in got.body);
  const listed = await allKeys(api);
  t.true(listed.some((k: any) => k.id === key.id));
  t.false(listed.some((k: any) => "key" in k));
  // The new key works.
  const use = await api.withKey(key.key).get("/api/v1/runs/run_none");
  t.is(use.status, 404);
});

test("keys - last_used_at is set when the key is used", async (t) => {
  const { api } = t.context;
  const key = await createKey(api, ["run:read"]);
  await api.withKey(key.key).get("/api/v1/runs/run_none");
  let seen = null;
  for (let i = 0; i < 40 && seen === null; i++) {
    seen = (await api.get(`/api/v1/api-keys/${key.id}`)).body.last_used_at;
    if (seen === null) await new Promise((r) => setTimeout(r, 50));
  }
  t.true(Number.isInteger(seen));
});

const badScopes: Array<[string, unknown]> = [
  ["unknown scope", ["run:read", "run:admin"]],
  ["duplicate", ["run:read", "run:read"]],
  ["write without read", ["run:write"]],
  ["reveal without read", ["env_vars:reveal"]],
  ["empty", []],
  ["more items than there are scopes", [...SCOPES, "run:read"]],
  ["not an array", "run:read"],
];
for (const [name, scopes] of badScopes) {
  test(`keys - scopes ${name} is 400 param scopes on create and rotate`, async (t) => {
    const { api } = t.context;
    const create = await api.post("/api/v1/api-keys", { scopes });
    t.is(create.status, 400);
    t.is(create.body.error.param, "scopes");
    const key = await createKey(api, ["run:read"]);
    const rotate = await api.post(`/api/v1/api-keys/${key.id}/rotate`, { scopes });
    t.is(rotate.status, 400);
    t.is(rotate.body.error.param, "scopes");
  });
}

test("keys - create takes mode live and refuses any other mode naming it (decisions §2)", async (t) => {
  const { api } = t.context;
  const live = await api.post("/api/v1/api-keys", { scopes: ["run:read"], mode: "live" });
  t.is(live.status, 201, JSON.stringify(live.body));
  t.is(live.body.mode, "live");
  for (const mode of ["test", "LIVE", "", null, 1]) {
    const refused = await api.post("/api/v1/api-keys", { scopes: ["run:read"], mode });
    t.is(refused.status, 400, JSON.stringify(mode));
    t.is(refused.body.error.param, "mode", JSON.stringify(mode));
  }
});

test("keys - rotation validation: label, mode, grace period, body, key id", async (t) => {
  const { api } = t.context;
  const key = await createKey(api, ["run:read"]);
  const url = `/api/v1/api-keys/${key.id}/rotate`;
  const cases: Array<[unknown, string | null]> = [
    [{ label: "x".repeat(81) }, "label"],
    [{ mode: "test" }, "mode"],
    [{ gracePeriodSeconds: -1 }, "gracePeriodSeconds"],
    [{ gracePeriodSeconds: 604801 }, "gracePeriodSeconds"],
    [{ gracePeriodSeconds: 1.5 }, "gracePeriodSeconds"],
    [{ gracePeriodSeconds: "10" }, "gracePeriodSeconds"],
    [{ surprise: true }, "surprise"],
    [[], null],
  ];
  for (const [body, param] of cases) {
    const res = await api.post(url, body);
    t.is(res.status, 400, JSON.stringify(body));
    t.is(res.body.error.param, param, JSON.stringify(body));
  }
  const noBody = await api.request("POST", url, { idempotencyKey: "k" });
  t.is(noBody.status, 400);
  const badId = await api.post("/api/v1/api-keys/not-a-uuid/rotate", {});
  t.is(badId.status, 400);
  t.is(badId.body.error.param, "keyId");
  const unknown = await api.post("/api/v1/api-keys/00000000-0000-4000-8000-000000000000/rotate", {});
  t.is(unknown.status, 404);
  t.is(unknown.body.error.code, "not_found");
  const ok = await api.post(url, { label: "x".repeat(80), mode: "live", gracePeriodSeconds: 604800 });
  t.is(ok.status, 201);
});

test("keys - rotation keeps scopes by default, returns the new secret and old_key_revokes_at", async (t) => {
  const { api } = t.context;
  const key = await createKey(api, ["run:read", "agents:read"], "svc");
  const before = Date.now();
  const rotated = await api.post(`/api/v1/api-keys/${key.id}/rotate`, {});
  t.is(rotated.status, 201);
  t.not(rotated.body.id, key.id);
  t.regex(rotated.body.key, /^rk_live_/);
  t.deepEqual(rotated.body.scopes, ["run:read", "agents:read"]);
  t.is(rotated.body.label, "svc");
  const revokesAt = Date.parse(rotated.body.old_key_revokes_at);
  t.true(Math.abs(revokesAt - (before + 86_400_000)) < 10_000, "default grace period is 86400 s");
  // Both keys work during the grace period.
  t.is((await api.withKey(key.key).get("/api/v1/runs/run_none")).status, 404);
  t.is((await api.withKey(rotated.body.key).get("/api/v1/runs/run_none")).status, 404);
});

test("keys - the old key answers 401 once its grace period ends", async (t) => {
  const { api } = t.context;
  const key = await createKey(api, ["run:read"]);
  const rotated = await api.post(`/api/v1/api-keys/${key.id}/rotate`, { gracePeriodSeconds: 2, scopes: ["run:read", "run:write"] });
  t.is(rotated.status, 201);
  t.deepEqual(rotated.body.scopes, ["run:read", "run:write"]);
  t.is((await api.withKey(key.key).get("/api/v1/runs/run_none")).status, 404, "still valid in grace");
  await new Promise((r) => setTimeout(r, 2_600));
  const old = await api.withKey(key.key).get("/api/v1/runs/run_none");
  t.is(old.status, 401);
  t.is((await api.withKey(rotated.body.key).get("/api/v1/runs/run_none")).status, 404);
  const listed = await api.get(`/api/v1/api-keys/${key.id}`);
  t.true(Number.isInteger(listed.body.revoked_at), "shown revoked once the grace period ended");
});

test("keys - grace period 0 revokes the old key at once; rotating a revoked key is 409", async (t) => {
  const { api } = t.context;
  const key = await createKey(api, ["run:read"]);
  const rotated = await api.post(`/api/v1/api-keys/${key.id}/rotate`, { gracePeriodSeconds: 0 });
  t.is(rotated.status, 201);
  t.is((await api.withKey(key.key).get("/api/v1/runs/run_none")).status, 401);
  const again = await api.post(`/api/v1/api-keys/${key.id}/rotate`, {});
  t.is(again.status, 409);
});

test("keys - rotation is also served without the /api/v1 prefix", async (t) => {
  const { api } = t.context;
  const key = await createKey(api, ["run:read"]);
  const res = await api.post(`/api-keys/${key.id}/rotate`, { gracePeriodSeconds: 10 });
  t.is(res.status, 201);
  t.truthy(res.body.old_key_revokes_at);
  const unauth = await new Api(api.baseUrl).post(`/api-keys/${key.id}/rotate`, {});
  t.is(unauth.status, 401);
});

test("keys - a revoked key is refused at once and shows revoked_at", async (t) => {
  const { api } = t.context;
  const key = await createKey(api, ["run:read"]);
  t.is((await api.withKey(key.key).get("/api/v1/runs/run_none")).status, 404);
  const revoked = await api.post(`/api/v1/api-keys/${key.id}/revoke`);
  t.is(revoked.status, 200);
  t.true(Number.isInteger(revoked.body.revoked_at));
  const after = await api.withKey(key.key).get("/api/v1/runs/run_none");
  t.is(after.status, 401);
  t.is(after.body.error.code, "unauthorized");
});

test("keys - a POST that waits for its turn is answered 401, at the revocation and without the turn's result, when its key is revoked meanwhile (it had answered the whole result once the turn ended: authz probe)", async (t) => {
  const { api } = t.context;
  // About 8 s of streaming text at 4 tokens a second.
  const agent = await api.agentWith({ model: "faux/scripted", tokens_per_second: 4 });
  for (const how of ["start", "continue"] as const) {
    const key = await createKey(api, ["run:read", "run:write"]);
    const holder = api.withKey(key.key);
    let body: Record<string, unknown> = { agent, input: "secret ".repeat(30) };
    if (how === "continue") {
      const run = await holder.post("/api/v1/runs", { agent, input: "hi", background: true });
      await holder.waitTurn(run.body.id, run.body.turn.id);
      body = { run_id: run.body.id, input: "secret ".repeat(30) };
    }
    const started = Date.now();
    const waiting = holder.post("/api/v1/runs", body);
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    const revokedAt = Date.now();
    t.is((await api.post(`/api/v1/api-keys/${key.id}/revoke`)).status, 200);
    const answer = await waiting;
    t.is(answer.status, 401, `${how}: ${JSON.stringify(answer.body).slice(0, 200)}`);
    t.is(answer.body.error.code, "unauthorized");
    t.notRegex(JSON.stringify(answer.body), /secret/, how);
    t.true(Date.now() - revokedAt < 3_000, `${how}: answered ${Date.now() - revokedAt} ms after the revocation (${Date.now() - started} ms in all), not at the turn's end`);
  }
  // A rotation's grace that ends while the POST waits: 401 too, though no revocation is heard then.
  const key = await createKey(api, ["run:read", "run:write"]);
  const waiting = api.withKey(key.key).post("/api/v1/runs", { agent, input: "secret ".repeat(30) });
  await new Promise((resolve) => setTimeout(resolve, 1_000));
  t.is((await api.post(`/api/v1/api-keys/${key.id}/rotate`, { gracePeriodSeconds: 2 })).status, 201);
  const answer = await waiting;
  t.is(answer.status, 401, JSON.stringify(answer.body).slice(0, 200));
  t.notRegex(JSON.stringify(answer.body), /secret/);
});

test("keys - another workspace's key is 404", async (t) => {
  const { api, other } = t.context;
  const key = await createKey(api, ["run:read"]);
  t.is((await other.get(`/api/v1/api-keys/${key.id}`)).status, 404);
  t.is((await other.post(`/api/v1/api-keys/${key.id}/revoke`)).status, 404);
  t.is((await other.post(`/api/v1/api-keys/${key.id}/rotate`, {})).status, 404);
});

test("keys - managing keys needs api_keys:manage", async (t) => {
  const { api } = t.context;
  const key = await createKey(api, ["run:read", "run:write"]);
  const res = await api.withKey(key.key).post("/api/v1/api-keys", { scopes: ["run:read"] });
  t.is(res.status, 403);
  t.regex(res.body.error.message, /api_keys:manage/);
});

test("keys - a key may create or rotate only keys whose scopes it holds (no escalation through api_keys:manage)", async (t) => {
  const { api, service } = t.context;
  const manager = await createKey(api, ["api_keys:manage"]);
  const limited = new Api(service.url!, manager.key);
  const escalate = await limited.post("/api/v1/api-keys", { scopes: [...SCOPES] });
  t.is(escalate.status, 403);
  t.is(escalate.body.error.code, "permission_denied");
  t.is(escalate.body.error.param, "scopes");
  t.regex(escalate.body.error.message, /lacks the scope (?!api_keys:manage)/);
  // Its own scopes, or fewer, it may hand out.
  t.is((await limited.post("/api/v1/api-keys", { scopes: ["api_keys:manage"] })).status, 201);
  // Rotating a stronger key would hand the caller that key's scopes: refused too (the key is
  // stronger than the caller, which is what the answer names).
  const strong = await createKey(api, ["run:read", "run:write"]);
  const rotate = await limited.post(`/api/v1/api-keys/${strong.id}/rotate`, {});
  t.is(rotate.status, 403);
  t.is(rotate.body.error.param, "keyId");
  const rotateUp = await limited.post(`/api/v1/api-keys/${manager.id}/rotate`, { scopes: ["api_keys:manage", "run:read"] });
  t.is(rotateUp.status, 403);
  t.is((await limited.post(`/api/v1/api-keys/${manager.id}/rotate`, {})).status, 201);
});

test("keys - a key may revoke or rotate only keys whose scopes it holds: api_keys:manage alone cannot end a stronger key (found by a probe)", async (t) => {
  const { api, service } = t.context;
  const manager = await createKey(api, ["api_keys:manage"]);
  const limited = new Api(service.url!, manager.key);
  const strong = await createKey(api, [...SCOPES]);
  const refused = [
    await limited.post(`/api/v1/api-keys/${strong.id}/revoke`),
    // Rotated into a key the caller may hold, the stronger key would end with its grace.
    await limited.post(`/api/v1/api-keys/${strong.id}/rotate`, { scopes: ["api_keys:manage"], gracePeriodSeconds: 0 }),
  ];
  for (const res of refused) {
    t.is(res.status, 403, JSON.stringify(res.body));
    t.like(res.body.error, { code: "permission_denied", param: "keyId" });
    t.regex(res.body.error.message, /lacks the scope \S+, which that key holds/);
  }
  const still = await api.withKey(strong.key).get("/api/v1/api-keys");
  t.is(still.status, 200);
  t.is((await api.get(`/api/v1/api-keys/${strong.id}`)).body.revoked_at, null);
  // Scopes omitted (the old key's kept): the same answer.
  const kept = await limited.post(`/api/v1/api-keys/${strong.id}/rotate`, { gracePeriodSeconds: 0 });
  t.is(kept.status, 403);
  t.is(kept.body.error.param, "keyId");
  // A key already revoked: its revocation repeated is answered as before, by any manager.
  const revokedStrong = await createKey(api, [...SCOPES]);
  t.is((await api.post(`/api/v1/api-keys/${revokedStrong.id}/revoke`)).status, 200);
  const repeat = await limited.post(`/api/v1/api-keys/${revokedStrong.id}/revoke`);
  t.is(repeat.status, 200, JSON.stringify(repeat.body));
  t.not(repeat.body.revoked_at, null);
  // So is a key its rotation's grace ended (found by a second review): nothing to change, its time kept.
  const rotatedAway = await createKey(api, [...SCOPES]);
  t.is((await api.post(`/api/v1/api-keys/${rotatedAway.id}/rotate`, { gracePeriodSeconds: 0 })).status, 201);
  const ended = (await api.get(`/api/v1/api-keys/${rotatedAway.id}`)).body;
  t.not(ended.revoked_at, null);
  const again = await limited.post(`/api/v1/api-keys/${rotatedAway.id}/revoke`);
  t.is(again.status, 200, JSON.stringify(again.body));
  t.is(again.body.revoked_at, ended.revoked_at);
  // Keys within its own scopes (itself included) it may still rotate and revoke.
  const peer = await createKey(api, ["api_keys:manage"]);
  const rotated = await limited.post(`/api/v1/api-keys/${peer.id}/rotate`, { gracePeriodSeconds: 0 });
  t.is(rotated.status, 201);
  t.is((await limited.post(`/api/v1/api-keys/${rotated.body.id}/revoke`)).status, 200);
  t.is((await limited.post(`/api/v1/api-keys/${manager.id}/revoke`)).status, 200);
  // A full key may revoke any key of the workspace.
  t.is((await api.withKey(strong.key).post(`/api/v1/api-keys/${strong.id}/revoke`)).status, 200);
});
