import type { DeploymentDoc, MongoStore, RunDoc } from "../src/index.js";

/**
 * The version a run's next turn runs on (spec rule 10): the active deployment's
 * `upgrade_policy` decides; `automatic` moves to the active version, `new_run_only`
 * keeps the run's version.
 */
export async function nextVersionFor(
  store: MongoStore,
  deployments: { get(agentId: string, version: number): Promise<DeploymentDoc | null> },
  run: RunDoc,
): Promise<number> {
  const agent = await store.agents.findOne({ _id: run.agent_id }, { projection: { active_version: 1 } });
  const active = agent?.active_version;
  if (!active || active === run.agent_version) return run.agent_version;
  const deployment = await deployments.get(run.agent_id, active);
  if (!deployment || deployment.status !== "ready") return run.agent_version;
  return deployment.upgrade_policy === "automatic" ? active : run.agent_version;
}
