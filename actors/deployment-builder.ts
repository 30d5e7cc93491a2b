import type { Logger } from "pino";
import { type Clock, type DeploymentDoc, DeploymentStatus, finishBuild, type MongoStore } from "../src/index.js";
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

  /** Builds `deployment` now (schedule's work; tests call it directly). */
  async build(deployment: DeploymentDoc): Promise<void> {
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
    // An activation asked for while it built is applied (src/deployments.ts). Between the
    // activation and `ready` a start without a version is briefly 409
    // agent_version_not_ready, which is retryable.
    const finished = await finishBuild(this.store, deployment, now);
    if (finished) this.log.info({ deployment: deployment._id, activated: finished === "activated" }, "deployment ready");
  }
}
