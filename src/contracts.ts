/**
 * What the gateway needs from the actor runtime, as contracts: the composition root
 * (node/service.ts) hands it the actors' implementations, so `gateway/` never imports
 * `actors/`.
 */
import type { DeploymentDoc } from "./documents.js";

/** Builds deployments in the background (actors/deployment-builder.ts). */
export interface DeploymentBuilds {
  /** Starts building a `building` deployment; its document says when it is `ready`. */
  schedule(deployment: DeploymentDoc): void;
}

/** Deployments by agent and version, cached once ready (immutable from then on). */
export interface DeploymentLookup {
  get(agentId: string, version: number): Promise<DeploymentDoc | null>;
}

/** A node's tool sandbox, as `/readyz` reports it (actors/sandbox.ts). */
export interface SandboxStatus {
  /** `bwrap`, or `off` (RUNS_SANDBOX=off: commands run unconfined). */
  mode: "bwrap" | "off";
  /** How limits are enforced: a cgroup hierarchy, rlimits per process, or not at all (off). */
  limits: "cgroup-v2" | "cgroup-v1" | "rlimit" | "none";
  /** Host uid the sandboxes run as. */
  uid: number | null;
  /** Whether deployments with a network allow list can run (socat present). */
  egress: boolean;
  /** Sandboxes running now, and the node's maximum. */
  running: number;
  max: number;
}
