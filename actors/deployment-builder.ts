import type { Logger } from "pino";
import { type Clock, type DeploymentDoc, DeploymentStatus, type MongoStore } from "../src/index.js";
import { resolveModel } from "./model-resolution.js";

/**
 * Builds deployments asynchronously: `building` → `ready` (activating it when asked)
 * or `failed` with an error. Builds are conditional on the `building` state, so a
 * build resumed after a crash, or run by two nodes, finishes once.
 */
export class DeploymentBuilder {
  private readonly inFlight = new Set<string>();

  constructor(
    private readonly store: MongoStore,
    private readonly clock: Clock,
    private readonly log: Logger,
  ) {}

  /** Schedules a build; returns at once. */
  schedule(deployment: DeploymentDoc): void {
    if (this.inFlight.has(deployment._id)) return;
    this.inFlight.add(deployment._id);
    setImmediate(() => {
      void this.build(deployment)
        .catch((err) => this.log.error({ err, deployment: deployment._id }, "deployment build failed to finish"))
        .finally(() => this.inFlight.delete(deployment._id));
    });
  }

  /** Resumes builds a stopped node left behind. */
  async resumePending(): Promise<void> {
    for (const deployment of await this.store.listBuildingDeployments()) this.schedule(deployment);
  }

  private async build(deployment: DeploymentDoc): Promise<void> {
    const resolved = resolveModel(deployment.config.model);
    const now = this.clock.nowMs();
    if ("error" in resolved) {
      await this.store.finishDeployment(deployment._id, {
        status: DeploymentStatus.failed,
        error: { code: "model_not_found", message: resolved.error },
        ready_at: null,
      });
      this.log.info({ deployment: deployment._id, error: resolved.error }, "deployment failed");
      return;
    }
    // Activate first, then mark ready: a client that saw `ready` can start on the active
    // version at once. (Between the two writes a start without a version is briefly
    // 409 agent_version_not_ready, which is retryable.) Read again: activation may have
    // been requested while it was building.
    const current = await this.store.getDeployment(deployment.agent_id, deployment.version);
    if (current?.status !== DeploymentStatus.building) return;
    if (current.activate) await this.store.setActiveVersion(deployment.agent_id, deployment.version);
    const finished = await this.store.finishDeployment(deployment._id, { status: DeploymentStatus.ready, ready_at: now, error: null });
    if (finished) this.log.info({ deployment: deployment._id, activated: current.activate }, "deployment ready");
  }
}
