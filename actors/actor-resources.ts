import type { Logger } from "pino";
import type { NatsConnection } from "@nats-io/transport-node";
import type { BoundedWork, Clock, Config, DeploymentLookup, EnvValues, EventLog, FileStore, IdSource, RunStore, UsageRecorder, WebhookStore } from "../src/index.js";
import type { RunningTurn, TurnRunRequest } from "./agent-runner.js";
import type { WorkspaceCheckpoints } from "./checkpoints.js";
import type { ActiveTurns } from "./active-turns.js";
import type { Sandbox } from "./sandbox.js";

/**
 * Steps a test may park an actor at: a start's turn stored but not its run; a finished
 * turn about to be written final; the run about to move on after a turn.
 */
export type ActorStep = "start:turn_stored" | "turn:finishing" | "turn:run_moving_on";

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
  nc: Pick<NatsConnection, "publish" | "info">;
  events: EventLog;
  log: Logger;
  deployments: DeploymentLookup;
  checkpoints: Pick<WorkspaceCheckpoints, "save" | "restore" | "remove" | "matches">;
  activeTurns: Pick<ActiveTurns, "count" | "started" | "ended">;
  files: Pick<FileStore, "getMany" | "read">;
  envValues: Pick<EnvValues, "resolveForTurn">;
  /** The usage ledger: a final turn's usage is recorded once, keyed by the turn. */
  usage: UsageRecorder;
  /** Webhook deliveries of turn and run events, recorded where the events are emitted. */
  webhooks: Pick<WebhookStore, "enqueue">;
  /** The node's tool sandbox. */
  sandbox: Sandbox;
  /** Node-wide state: while draining, queued turns are left for the next owner. */
  node: { draining: boolean };
  /**
   * The node's removals of deleted runs' parts, which run after the delete's answer: a
   * few at a time, a bounded queue behind them; one refused (the queue full) is left to
   * the check the run's tombstone schedules.
   */
  partRemovals: Pick<BoundedWork, "run" | "closed">;
  /**
   * Called at the actor's steps between two writes, and awaited: a test parks the actor
   * there to race commands, takeovers and failures against it. Unset in the service.
   */
  at?: (step: ActorStep, where: { runId: string; turnId?: string }) => Promise<void> | void;
  /**
   * While the partition's lease is in doubt (the KV did not answer renewals for a TTL),
   * a promise that holds the actors' event writes until the lease is confirmed and
   * rejects when it is lost; undefined otherwise. Set by the actor host.
   */
  writeGate?: (partition: number) => Promise<void> | undefined;
  /** Runs a turn's agent loop; startTurn (agent-runner.ts) unless a test parks turns at will. */
  startTurn?: (request: TurnRunRequest) => RunningTurn;
}
