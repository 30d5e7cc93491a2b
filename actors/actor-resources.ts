import type { Logger } from "pino";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Clock, Config, DeploymentLookup, EnvValues, EventLog, FileStore, IdSource, RunStore } from "../src/index.js";
import type { RunningTurn, TurnRunRequest } from "./agent-runner.js";
import type { WorkspaceCheckpoints } from "./checkpoints.js";
import type { ActiveTurns } from "./active-turns.js";
import type { Sandbox } from "./sandbox.js";

/**
 * What every actor of a node shares, as the contracts the actor needs (node/service.ts
 * hands in the real ones; test/unit/run-actor.test.ts, fakes).
 */
export interface ActorResources {
  config: Pick<Config, "activeTurnLimit" | "allowPrivateModelEndpoints" | "ambientProviders" | "dataDir" | "retention" | "turnLimitMs">;
  clock: Clock;
  ids: IdSource;
  store: RunStore;
  /** Live events and final notices go out on NATS subjects. */
  nc: Pick<NatsConnection, "publish">;
  events: EventLog;
  log: Logger;
  deployments: DeploymentLookup;
  checkpoints: Pick<WorkspaceCheckpoints, "save" | "restore" | "remove">;
  activeTurns: Pick<ActiveTurns, "count" | "started" | "ended">;
  files: Pick<FileStore, "getMany" | "read">;
  envValues: Pick<EnvValues, "resolveForTurn">;
  /** The node's tool sandbox. */
  sandbox: Sandbox;
  /** Node-wide state: while draining, queued turns are left for the next owner. */
  node: { draining: boolean };
  /** Runs a turn's agent loop; startTurn (agent-runner.ts) unless a test parks turns at will. */
  startTurn?: (request: TurnRunRequest) => RunningTurn;
}
