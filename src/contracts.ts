/**
 * What the gateway needs from the actor runtime, as contracts: the composition root
 * (node/service.ts) hands it the actors' implementations, so `gateway/` never imports
 * `actors/`.
 */
import type { DeploymentDoc, RunDoc, TombstoneDoc, TurnDoc } from "./documents.js";

/** A fenced write matched nothing: another owner holds the run now. */
export class FencedError extends Error {
  constructor(readonly runId: string) {
    super(`write to ${runId} was fenced off`);
    this.name = "FencedError";
  }
}

/**
 * What the actor runtime reads and writes of runs, turns and deployments (DESIGN §3,
 * §4); src/mongo-store.ts implements it on MongoDB (and FerretDB), and the RunActor
 * unit tests on an in-memory fake. Every change to a run or its turns is fenced by the
 * owner's epoch: a write from an owner whose epoch is no longer the run's throws
 * {@link FencedError}. Only inserts rely on unique ids (`…Once` answer false for a
 * document that exists). Any method may throw a transient failure (the store is away).
 */
export interface RunStore {
  insertRunOnce(doc: RunDoc): Promise<boolean>;
  getRun(id: string): Promise<RunDoc | null>;
  /** Raises the run's epoch to `epoch` unless a newer owner did; the run as stored, or null when a newer epoch holds it (or it does not exist). */
  claimRun(id: string, epoch: number): Promise<RunDoc | null>;
  /** Sets fields of the run if its epoch is `epoch`. */
  updateRunFenced(id: string, epoch: number, set: Partial<RunDoc>): Promise<void>;
  deleteRunFenced(id: string, epoch: number): Promise<void>;
  insertTurnOnce(doc: TurnDoc): Promise<boolean>;
  getTurn(id: string): Promise<TurnDoc | null>;
  /** Sets fields of the turn unless a newer owner wrote it, and stamps `epoch` on it. */
  updateTurnFenced(id: string, epoch: number, set: Partial<TurnDoc>): Promise<void>;
  /** A run's turns in order; transcripts only when asked for. */
  listTurns(runId: string, options?: { afterIndex?: number; limit?: number; withTranscript?: boolean }): Promise<TurnDoc[]>;
  deleteTurnsOf(runId: string): Promise<void>;
  insertTombstone(doc: TombstoneDoc): Promise<void>;
  getTombstone(id: string): Promise<TombstoneDoc | null>;
  /** Tombstones of these partitions whose run's parts are due to be checked at `nowMs` (at most `limit`). */
  tombstonesDueIn(partitions: number[], nowMs: number, limit?: number): Promise<TombstoneDoc[]>;
  /** The next check of the run's parts, or `null`: all of them are removed (no check). */
  setPartsDue(runId: string, dueAt: number | null): Promise<void>;
  /** The agent's active version, or null (no agent, or none active). */
  activeVersionOf(agentId: string): Promise<number | null>;
  getDeployment(agentId: string, version: number): Promise<DeploymentDoc | null>;
  /** Busy runs of these partitions (recovery after a partition is gained). */
  busyRunsIn(partitions: number[]): Promise<Array<Pick<RunDoc, "_id" | "partition" | "epoch">>>;
  /** Runs of these partitions whose retention ran out, for the expiry sweeper (a busy one only past the turn limit too: domain.ts runExpired). */
  expiredRunsIn(partitions: number[], nowMs: number, turnLimitMs: number, limit?: number): Promise<Array<Pick<RunDoc, "_id" | "partition">>>;
  /** Removes expired idempotency records and tombstones. */
  sweepRecords(nowMs: number): Promise<void>;
}

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
  /** How their CPU is kept from the service's: CPU cgroups, nice 19 without them, or not at all. */
  cpu: "cgroup" | "nice" | "none";
  /** Whether a seccomp filter refuses commands the system calls of actors/sandbox-seccomp.ts (none off, or on an architecture without one). */
  seccomp: boolean;
  /** Host uid the sandboxes run as. */
  uid: number | null;
  /** Whether deployments with a network allow list can run (socat present). */
  egress: boolean;
  /** Sandboxes running now, and the node's maximum. */
  running: number;
  max: number;
}
