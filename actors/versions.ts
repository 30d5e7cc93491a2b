import type { DeploymentLookup, RunDoc, RunStore } from "../src/index.js";

/**
 * The version a run's next turn runs on (spec rule 10): the active deployment's
 * `upgrade_policy` decides; `automatic` moves to the active version, `new_run_only`
 * keeps the run's version.
 */
export async function nextVersionFor(store: Pick<RunStore, "activeVersionOf">, deployments: DeploymentLookup, run: RunDoc): Promise<number> {
  const active = await store.activeVersionOf(run.agent_id);
  if (!active || active === run.agent_version) return run.agent_version;
  const deployment = await deployments.get(run.agent_id, active);
  if (!deployment || deployment.status !== "ready") return run.agent_version;
  return deployment.upgrade_policy === "automatic" ? active : run.agent_version;
}
