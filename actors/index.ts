export { ActorHost } from "./actor-host.js";
export { RunActor, DeploymentCache, type ActorResources } from "./run-actor.js";
export { DeploymentBuilder } from "./deployment-builder.js";
export { partitionOf, rendezvousOwner, PartitionLeases } from "./partition-leases.js";
export { listModels, resolveModel } from "./agent-runner.js";
export { WorkspaceCheckpoints, CheckpointError } from "./checkpoints.js";
export { ActiveTurns } from "./active-turns.js";
export { Sandbox, SandboxFailure, SandboxUnavailableError, type SandboxStatus } from "./sandbox.js";
export { EgressProxy, parseTestHosts } from "./egress-proxy.js";
