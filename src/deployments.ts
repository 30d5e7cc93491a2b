/**
 * Deployments' one home: which version a run starts on (spec rules 7–9) and which its
 * next turn runs on (rule 10), what activating a version does in each status, and the
 * cache of ready deployments (immutable once ready). The gateway and the actors both
 * decide through these; the build itself is actors/deployment-builder.ts.
 */
import type { DeploymentLookup, RunStore } from "./contracts.js";
import { DeploymentStatus, UpgradePolicy, type AgentDoc, type DeploymentDoc, type RunDoc } from "./documents.js";
import { ApiError } from "./errors.js";

/**
 * The version a new run starts on: the one asked for, else the agent's active one; it
 * must exist and be ready. Throws the contract's error otherwise, naming `version`
 * when one was asked for and `agent` when the active version was meant.
 */
export async function startVersionOf(agent: AgentDoc | null, requested: number | undefined, deployments: DeploymentLookup): Promise<number> {
  if (!agent) throw new ApiError("agent_not_found", { param: "agent" });
  const target = requested ?? agent.active_version;
  if (target === null) {
    throw new ApiError("agent_version_not_ready", {
      param: "agent",
      message: "The agent has no active deployment yet: a deployment becomes active when its build is ready (unless made with activate: false), or when activated.",
    });
  }
  const deployment = await deployments.get(agent._id, target);
  if (!deployment) throw new ApiError("agent_version_not_found", { param: "version" });
  if (deployment.status !== DeploymentStatus.ready) {
    throw new ApiError("agent_version_not_ready", {
      param: requested === undefined ? "agent" : "version",
      message:
        deployment.status === DeploymentStatus.failed
          ? `Version ${target} failed to build${deployment.error ? ` (${deployment.error.code})` : ""}; deploy a new version.`
          : `Version ${target} is ${deployment.status}.`,
      // A build that failed never becomes ready: the same request cannot succeed.
      retryable: deployment.status !== DeploymentStatus.failed,
    });
  }
  return target;
}

/**
 * The version a run's next turn runs on: the active deployment's `upgrade_policy`
 * decides; `automatic` moves to the active version, `new_run_only` keeps the run's.
 */
export async function nextVersionFor(store: Pick<RunStore, "activeVersionOf">, deployments: DeploymentLookup, run: RunDoc): Promise<number> {
  const active = await store.activeVersionOf(run.agent_id);
  if (!active || active === run.agent_version) return run.agent_version;
  const deployment = await deployments.get(run.agent_id, active);
  if (!deployment || deployment.status !== DeploymentStatus.ready) return run.agent_version;
  return deployment.upgrade_policy === UpgradePolicy.automatic ? active : run.agent_version;
}

/**
 * The run's fields once a turn starts on `version`: the version its workspace is on, and
 * that version among those it ran on (the list filter). Not at a turn's queueing: a queued
 * turn may be cancelled before it starts.
 */
export function onVersion(run: Pick<RunDoc, "versions">, version: number): Pick<RunDoc, "agent_version" | "versions"> {
  return { agent_version: version, versions: run.versions.includes(version) ? run.versions : [...run.versions, version] };
}

/**
 * What activating a version does: a ready one becomes active now; a building one is
 * marked to become active when its build finishes; a failed one is refused.
 */
export function activationOf(deployment: Pick<DeploymentDoc, "status" | "version">): "activate" | "when_ready" {
  switch (deployment.status) {
    case DeploymentStatus.ready:
      return "activate";
    case DeploymentStatus.building:
      return "when_ready";
    case DeploymentStatus.failed:
      throw new ApiError("agent_version_not_ready", { param: "version", message: `Version ${deployment.version} failed to build.`, retryable: false });
  }
}

/** The store's deployment writes that activation and builds make (MongoStore's). */
export interface ActivationStore {
  getDeployment(agentId: string, version: number): Promise<DeploymentDoc | null>;
  setActiveVersion(agentId: string, version: number): Promise<unknown>;
  requestActivation(id: string): Promise<unknown>;
  finishDeployment(id: string, set: Partial<DeploymentDoc>, options?: { unlessActivating?: boolean }): Promise<boolean>;
}

/*
 * A version activated while building becomes active when ready (decisions §3). The
 * activation and the build's end are written by different nodes, so each side writes
 * first and then reads what the other wrote: the activation asks (only while building)
 * and then activates itself if it finds the build ready; the build marks it ready only
 * while no activation was asked, and otherwise activates it first. Whichever order their
 * writes land in, one of them activates it.
 */

/** Activates `deployment` (the activate route); throws for a failed one. */
export async function activateVersion(store: ActivationStore, deployment: DeploymentDoc): Promise<void> {
  if (activationOf(deployment) === "activate") {
    await store.setActiveVersion(deployment.agent_id, deployment.version);
    return;
  }
  await store.requestActivation(deployment._id);
  const now = await store.getDeployment(deployment.agent_id, deployment.version);
  if (now?.status === DeploymentStatus.ready) await store.setActiveVersion(deployment.agent_id, deployment.version);
}

/**
 * Marks a built deployment ready, activating it first when activation was asked for (a
 * client that saw `ready` can start on the active version at once). Returns what it did;
 * null when the deployment had already left `building` (another node finished it).
 */
export async function finishBuild(store: ActivationStore, deployment: DeploymentDoc, readyAt: number): Promise<"ready" | "activated" | null> {
  const ready = { status: DeploymentStatus.ready, ready_at: readyAt, error: null };
  if (!deployment.activate && (await store.finishDeployment(deployment._id, ready, { unlessActivating: true }))) return "ready";
  const current = await store.getDeployment(deployment.agent_id, deployment.version);
  if (current?.status !== DeploymentStatus.building) return null;
  // Asked for (an activation is never withdrawn): activate, then mark ready.
  await store.setActiveVersion(deployment.agent_id, deployment.version);
  return (await store.finishDeployment(deployment._id, ready)) ? "activated" : null;
}

/**
 * Ready deployments, least recently used first out: at most `capacity` configs are
 * held, however many agents and versions tenants create. Deployments not ready yet
 * are read every time (their status changes).
 */
export class DeploymentCache implements DeploymentLookup {
  private readonly cache = new Map<string, DeploymentDoc>();
  constructor(
    private readonly store: Pick<RunStore, "getDeployment">,
    private readonly capacity = 1_000,
  ) {}

  get size(): number {
    return this.cache.size;
  }

  async get(agentId: string, version: number): Promise<DeploymentDoc | null> {
    const id = `${agentId}:${version}`;
    const hit = this.cache.get(id);
    if (hit) {
      // Map order is insertion order: moving the hit to the end keeps the order by use.
      this.cache.delete(id);
      this.cache.set(id, hit);
      return hit;
    }
    const doc = await this.store.getDeployment(agentId, version);
    if (doc && doc.status === DeploymentStatus.ready) {
      this.cache.set(id, doc);
      if (this.cache.size > this.capacity) this.cache.delete(this.cache.keys().next().value!);
    }
    return doc;
  }
}
