import test from "ava";
import { activationOf, DeploymentCache, nextVersionFor, startVersionOf } from "../../src/deployments.js";
import type { AgentDoc, DeploymentDoc, RunDoc } from "../../src/documents.js";
import { ApiError } from "../../src/errors.js";

const agent = (active: number | null): AgentDoc => ({ _id: "agt_1", workspace_id: "ws_1", name: "a", description: null, active_version: active, created_at: 0 });
const deployment = (version: number, status: DeploymentDoc["status"], policy: DeploymentDoc["upgrade_policy"] = "automatic"): DeploymentDoc => ({
  _id: `agt_1:${version}`,
  workspace_id: "ws_1",
  agent_id: "agt_1",
  version,
  status,
  upgrade_policy: policy,
  config: { model: "faux/scripted" },
  activate: false,
  error: null,
  created_at: 0,
  ready_at: null,
});
const lookup = (...docs: DeploymentDoc[]) => ({ get: async (_agent: string, version: number) => docs.find((d) => d.version === version) ?? null });

async function errorOf(promise: Promise<unknown>): Promise<{ code: string; param: string | null }> {
  try {
    await promise;
  } catch (err) {
    if (err instanceof ApiError) return { code: err.code, param: err.param };
    throw err;
  }
  throw new Error("expected an ApiError");
}

test("deployments - the start version: asked for, else active; must exist and be ready (rules 7–9)", async (t) => {
  t.is(await startVersionOf(agent(2), undefined, lookup(deployment(2, "ready"))), 2);
  t.is(await startVersionOf(agent(2), 1, lookup(deployment(1, "ready"), deployment(2, "ready"))), 1);
  t.deepEqual(await errorOf(startVersionOf(null, undefined, lookup())), { code: "agent_not_found", param: "agent" });
  t.deepEqual(await errorOf(startVersionOf(agent(null), undefined, lookup())), { code: "agent_version_not_ready", param: "agent" });
  t.deepEqual(await errorOf(startVersionOf(agent(1), 3, lookup(deployment(1, "ready")))), { code: "agent_version_not_found", param: "version" });
  t.deepEqual(await errorOf(startVersionOf(agent(1), 2, lookup(deployment(2, "building")))), { code: "agent_version_not_ready", param: "version" });
  t.deepEqual(await errorOf(startVersionOf(agent(2), undefined, lookup(deployment(2, "failed")))), { code: "agent_version_not_ready", param: "agent" });
});

test("deployments - the next turn's version follows the active deployment's upgrade policy (rule 10)", async (t) => {
  const run = { agent_id: "agt_1", agent_version: 1 } as RunDoc;
  const store = (active: number | null) => ({ activeVersionOf: async () => active });
  t.is(await nextVersionFor(store(2), lookup(deployment(2, "ready", "automatic")), run), 2);
  t.is(await nextVersionFor(store(2), lookup(deployment(2, "ready", "new_run_only")), run), 1);
  t.is(await nextVersionFor(store(2), lookup(deployment(2, "building")), run), 1, "not ready: stays");
  t.is(await nextVersionFor(store(null), lookup(), run), 1);
  t.is(await nextVersionFor(store(1), lookup(), run), 1);
});

test("deployments - activation by status: ready now, building when ready, failed refused", (t) => {
  t.is(activationOf(deployment(1, "ready")), "activate");
  t.is(activationOf(deployment(1, "building")), "when_ready");
  const error = t.throws(() => activationOf(deployment(3, "failed")));
  t.true(error instanceof ApiError);
  t.like(error, { code: "agent_version_not_ready", param: "version", message: "Version 3 failed to build." });
});

test("deployments - the cache keeps ready deployments only, least recently used out", async (t) => {
  const reads: string[] = [];
  const docs = [deployment(1, "ready"), deployment(2, "ready"), deployment(3, "building")];
  const cache = new DeploymentCache({ getDeployment: async (_a, v) => (reads.push(String(v)), docs.find((d) => d.version === v) ?? null) }, 2);
  await cache.get("agt_1", 1);
  await cache.get("agt_1", 1);
  await cache.get("agt_1", 3);
  await cache.get("agt_1", 3);
  t.deepEqual(reads, ["1", "3", "3"], "ready once, building every time");
  await cache.get("agt_1", 2);
  await cache.get("agt_1", 1); // 1 is now the most recent; 2 the least
  t.is(cache.size, 2);
  t.deepEqual(reads, ["1", "3", "3", "2"]);
});
