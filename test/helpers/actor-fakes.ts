/**
 * In-memory stand-ins for what a RunActor is given (ActorResources), for unit tests of
 * the actor's decisions without NATS or a store. The store keeps the RunStore
 * contract's fencing rules; turns are parked until the test finishes them, so a test
 * can hold an actor at a chosen step and race commands against it.
 */
import { rmSync } from "node:fs";
import { mkdtemp } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import pino from "pino";
import { SteeringTargetEndedError, type RunningTurn, type TurnRunRequest, type TurnRunResult } from "../../actors/agent-runner.js";
import { type ActorResources } from "../../actors/run-actor.js";
import type { ActorStep } from "../../actors/actor-resources.js";
import type { Clock, Timer } from "../../src/clock.js";
import { BoundedWork } from "../../src/bounded-work.js";
import { DeploymentCache } from "../../src/deployments.js";
import { Ids } from "../../src/ids.js";
import { Sandbox } from "../../actors/sandbox.js";
import { CheckpointConflictError } from "../../actors/checkpoints.js";
import { FencedError, type RunStore } from "../../src/contracts.js";
import { runExpired } from "../../src/domain.js";
import type { DeploymentDoc, RunDoc, TombstoneDoc, TurnDoc } from "../../src/documents.js";
import type { UsageRecordDoc } from "../../src/usage.js";
import type { WebhookStore } from "../../src/webhooks.js";

type WebhookEvent = Parameters<WebhookStore["enqueue"]>[0];
import { type AppenderOptions, type EventAppender, type EventLog, type EventRunRef, EventWriteError, type RunEvent } from "../../src/event-types.js";

const clone = <T>(value: T): T => structuredClone(value);

/** The RunStore contract in memory: fenced writes, unique inserts, copies in and out. */
export class MemoryRunStore implements RunStore {
  readonly runs = new Map<string, RunDoc>();
  readonly turns = new Map<string, TurnDoc>();
  readonly tombstones = new Map<string, TombstoneDoc>();
  readonly deployments = new Map<string, DeploymentDoc>();
  readonly activeVersions = new Map<string, number>();
  /** Every write, in order, for assertions on what was stored when. */
  readonly writes: string[] = [];
  /** Makes the next turn write that matches fail once, as a store that went away would. */
  failTurnWriteOnce?: (id: string, set: Partial<TurnDoc>) => boolean;
  /** What that failed write throws (default a plain Error: not a temporary failure). */
  failTurnWriteError?: Error;
  /** Makes every turn write that matches fail, with {@link failTurnWriteError}, until cleared (a store away for long). */
  failTurnWrites?: (id: string, set: Partial<TurnDoc>) => boolean;

  async insertRunOnce(doc: RunDoc): Promise<boolean> {
    if (this.runs.has(doc._id)) return false;
    this.runs.set(doc._id, clone(doc));
    this.writes.push(`insert run ${doc._id}`);
    return true;
  }
  async getRun(id: string): Promise<RunDoc | null> {
    const run = this.runs.get(id);
    return run ? clone(run) : null;
  }
  async claimRun(id: string, epoch: number): Promise<RunDoc | null> {
    const run = this.runs.get(id);
    if (!run || run.epoch > epoch) return null;
    run.epoch = epoch;
    return clone(run);
  }
  async updateRunFenced(id: string, epoch: number, set: Partial<RunDoc>): Promise<void> {
    const run = this.runs.get(id);
    if (!run || run.epoch !== epoch) throw new FencedError(id);
    Object.assign(run, clone(set));
    this.writes.push(`update run ${Object.keys(set).sort().join(",")}`);
  }
  async deleteRunFenced(id: string, epoch: number): Promise<void> {
    const run = this.runs.get(id);
    if (!run || run.epoch !== epoch) throw new FencedError(id);
    this.runs.delete(id);
    this.writes.push(`delete run ${id}`);
  }
  async insertTurnOnce(doc: TurnDoc): Promise<boolean> {
    if (this.turns.has(doc._id)) return false;
    this.turns.set(doc._id, clone(doc));
    this.writes.push(`insert turn ${doc._id} ${doc.status}`);
    return true;
  }
  async getTurn(id: string): Promise<TurnDoc | null> {
    const turn = this.turns.get(id);
    return turn ? clone(turn) : null;
  }
  async updateTurnFenced(id: string, epoch: number, set: Partial<TurnDoc>): Promise<void> {
    if (this.failTurnWriteOnce?.(id, set)) {
      this.failTurnWriteOnce = undefined;
      throw this.failTurnWriteError ?? new Error("store unavailable (injected)");
    }
    if (this.failTurnWrites?.(id, set)) throw this.failTurnWriteError ?? new Error("store unavailable (injected)");
    const turn = this.turns.get(id);
    if (!turn || turn.epoch > epoch) throw new FencedError(id);
    Object.assign(turn, clone(set), { epoch });
    this.writes.push(`update turn ${id}${set.status ? ` ${set.status}` : ""}`);
  }
  async listTurns(runId: string, options: { afterIndex?: number; limit?: number; withTranscript?: boolean } = {}): Promise<TurnDoc[]> {
    return [...this.turns.values()]
      .filter((turn) => turn.run_id === runId && (options.afterIndex === undefined || turn.index > options.afterIndex))
      .sort((a, b) => a.index - b.index)
      .slice(0, options.limit ?? Infinity)
      .map((turn) => (options.withTranscript ? clone(turn) : { ...clone(turn), transcript: [] }));
  }
  async deleteTurnsOf(runId: string): Promise<void> {
    for (const [id, turn] of this.turns) if (turn.run_id === runId) this.turns.delete(id);
  }
  async insertTombstone(doc: TombstoneDoc): Promise<void> {
    if (!this.tombstones.has(doc._id)) this.tombstones.set(doc._id, clone(doc));
  }
  async getTombstone(id: string): Promise<TombstoneDoc | null> {
    const tombstone = this.tombstones.get(id);
    return tombstone ? clone(tombstone) : null;
  }
  async tombstonesDueIn(partitions: number[], nowMs: number): Promise<TombstoneDoc[]> {
    return [...this.tombstones.values()].filter((t) => t.partition !== undefined && partitions.includes(t.partition) && t.parts_due_at !== undefined && t.parts_due_at <= nowMs).map(clone);
  }
  async setPartsDue(runId: string, dueAt: number | null): Promise<void> {
    const tombstone = this.tombstones.get(runId);
    if (!tombstone) return;
    if (dueAt === null) delete tombstone.parts_due_at;
    else tombstone.parts_due_at = dueAt;
  }
  async activeVersionOf(agentId: string): Promise<number | null> {
    return this.activeVersions.get(agentId) ?? null;
  }
  async getDeployment(agentId: string, version: number): Promise<DeploymentDoc | null> {
    const doc = this.deployments.get(`${agentId}:${version}`);
    return doc ? clone(doc) : null;
  }
  async busyRunsIn(partitions: number[]): Promise<Array<Pick<RunDoc, "_id" | "partition" | "epoch">>> {
    return [...this.runs.values()].filter((run) => partitions.includes(run.partition) && run.state === "busy");
  }
  async expiredRunsIn(partitions: number[], nowMs: number, turnLimitMs: number): Promise<Array<Pick<RunDoc, "_id" | "partition">>> {
    return [...this.runs.values()].filter((run) => partitions.includes(run.partition) && runExpired(run, nowMs, turnLimitMs));
  }
  async sweepRecords(): Promise<void> {}

  /** A ready deployment of `agentId` (the version's config runs the scripted model). */
  addDeployment(agentId: string, version: number, options: Partial<DeploymentDoc> = {}): void {
    this.deployments.set(`${agentId}:${version}`, {
      _id: `${agentId}:${version}`,
      workspace_id: "ws_test",
      agent_id: agentId,
      version,
      status: "ready",
      upgrade_policy: "automatic",
      config: { model: "faux/scripted" },
      activate: false,
      error: null,
      created_at: 0,
      ready_at: 0,
      ...options,
    });
  }
}

export interface LoggedEvent {
  sequence: number;
  turn_id: string | null;
  source: string;
  type: string;
  data: unknown;
  /** When the log stored it (the appender's time here; JetStream's own clock in the service). */
  ms?: number;
}

/** The EventLog contract in memory: appends are stored at once, in order. */
export class MemoryEventLog implements EventLog {
  readonly byRun = new Map<string, LoggedEvent[]>();

  events(runId: string): LoggedEvent[] {
    return this.byRun.get(runId) ?? [];
  }
  types(runId: string): string[] {
    return this.events(runId).map((event) => event.type);
  }

  /** While true, appends are not stored: the appender fails as JetStream's does (at its first lost event, until resumed). */
  failWrites = false;

  appender(run: EventRunRef, nextRunSeq: number, options: AppenderOptions = {}): EventAppender {
    const log = this.byRun.get(run.id) ?? [];
    this.byRun.set(run.id, log);
    let next = nextRunSeq;
    let failure: EventWriteError | null = null;
    return {
      append: (turnId, source, type, data, createdAtMs) => {
        const sequence = next++;
        if (!failure && this.failWrites) failure = new EventWriteError(sequence, new Error("no ack from JetStream in time"));
        if (failure) return sequence;
        // A resent start repeats sequences: the store keeps the first (JetStream de-duplicates).
        if (!log.some((event) => event.sequence === sequence)) log.push({ sequence, turn_id: turnId, source, type, data, ms: createdAtMs });
        const event: RunEvent = { id: `evt_${sequence}`, sequence, source, type, run_id: run.id, turn_id: turnId, created_at: Math.floor(createdAtMs / 1000), data };
        options.onStored?.(event);
        return sequence;
      },
      flush: async () => {
        if (failure) throw failure;
      },
      get nextSequence() {
        return next;
      },
      get failure() {
        return failure;
      },
      resume: () => {
        failure = null;
      },
    };
  }
  async lastSequence(run: { id: string }): Promise<number> {
    return this.events(run.id).at(-1)?.sequence ?? 0;
  }
  /** When set, reads fail with it (the event log unavailable). */
  readFailure?: Error;
  /** The run's events in order, after `afterId` and of `turnId` when given (the actor reads them to resume a start and to recover a turn). */
  async read(run: { id: string }, options: { limit: number; afterId?: string; turnId?: string; since?: { ms: number; fromSequence: number } }): Promise<{ events: RunEvent[]; hasMore: boolean; history: never }> {
    if (this.readFailure) throw this.readFailure;
    const after = options.afterId === undefined ? 0 : Number(options.afterId.slice("evt_".length));
    // From a time, as JetStream's start time: events stored before it are not read.
    const since = options.afterId === undefined ? options.since : undefined;
    const log = this.events(run.id).filter((e) => e.sequence > after && (options.turnId === undefined || e.turn_id === options.turnId) && (since === undefined || (e.ms ?? 0) >= since.ms));
    const events = log.slice(0, options.limit).map((e) => ({ id: `evt_${e.sequence}`, sequence: e.sequence, source: e.source, type: e.type, run_id: run.id, turn_id: e.turn_id, created_at: 0, data: e.data }) as RunEvent);
    return { events, hasMore: log.length > options.limit, history: undefined as never };
  }
  async subscribe(): Promise<never> {
    throw new Error("not used by the actor");
  }
  async purge(run: EventRunRef): Promise<void> {
    this.byRun.delete(run.id);
  }
}

/** A turn the test holds: it ends when the test says so, or with `aborted` when aborted. */
export interface ParkedTurn {
  request: TurnRunRequest;
  steers: string[];
  aborted: boolean;
  ended: boolean;
  finish(result: Partial<TurnRunResult> & Pick<TurnRunResult, "outcome">): void;
}

export class ParkedTurns {
  readonly started: ParkedTurn[] = [];
  /** Whether an aborted turn ends at once (`aborted`), or only when the test finishes it. */
  endOnAbort = true;

  /** The agent-runner stand-in to hand the actor (ActorResources.startTurn). */
  readonly start = (request: TurnRunRequest): RunningTurn => {
    let resolve!: (result: TurnRunResult) => void;
    const result = new Promise<TurnRunResult>((r) => (resolve = r));
    const parked: ParkedTurn = {
      request,
      steers: [],
      aborted: false,
      ended: false,
      finish: (partial) => {
        if (parked.ended) return;
        parked.ended = true;
        resolve({ output: [], transcript: [], ...partial });
      },
    };
    this.started.push(parked);
    return {
      steer: (text) => {
        if (parked.ended || parked.aborted) throw new SteeringTargetEndedError();
        parked.steers.push(text);
      },
      abort: () => {
        if (parked.aborted) return;
        parked.aborted = true;
        if (this.endOnAbort) parked.finish({ outcome: "aborted" });
      },
      result,
    };
  };

  get last(): ParkedTurn {
    const turn = this.started.at(-1);
    if (!turn) throw new Error("no turn started");
    return turn;
  }
}

/** Where a test holds the actor: `park(step)` blocks the next time the actor reaches `step`. */
export class ParkedSteps {
  private readonly parked = new Map<ActorStep, { reached: () => void; release: Promise<void> }>();

  /** The hook to hand the actor (ActorResources.at). */
  readonly at = async (step: ActorStep): Promise<void> => {
    const spot = this.parked.get(step);
    if (!spot) return;
    this.parked.delete(step);
    spot.reached();
    await spot.release;
  };

  /** Parks the actor the next time it reaches `step`; `reached` resolves when it is there. */
  park(step: ActorStep): { reached: Promise<void>; release: () => void } {
    let reached!: () => void;
    let release!: () => void;
    const reachedP = new Promise<void>((resolve) => (reached = resolve));
    const releaseP = new Promise<void>((resolve) => (release = resolve));
    this.parked.set(step, { reached, release: releaseP });
    return { reached: reachedP, release };
  }
}

/** A clock the test moves. */
/**
 * A clock that moves only when told: `now` may be set directly, and {@link advance}
 * moves it forward running every timer that falls due, in time order.
 */
export class TestClock implements Clock {
  private timers: { at: number; fn: () => void; every?: number }[] = [];
  constructor(public now = Date.UTC(2026, 10, 24, 12)) {}
  nowMs(): number {
    return this.now;
  }
  after(ms: number, fn: () => void): Timer {
    return this.schedule({ at: this.now + ms, fn });
  }
  every(ms: number, fn: () => void): Timer {
    return this.schedule({ at: this.now + ms, fn, every: Math.max(1, ms) });
  }
  sleep(ms: number): Promise<void> {
    return new Promise((resolve) => this.after(ms, resolve));
  }
  /** Timers not yet run or cancelled. */
  get pending(): number {
    return this.timers.length;
  }
  /** Moves time forward by `ms`, running the timers that fall due (at most 10,000 calls). */
  advance(ms: number): void {
    const end = this.now + ms;
    for (let calls = 0; calls < 10_000; calls++) {
      const next = this.timers.reduce<(typeof this.timers)[number] | undefined>((soonest, t) => (t.at <= end && (!soonest || t.at < soonest.at) ? t : soonest), undefined);
      if (!next) break;
      this.now = next.at;
      if (next.every) next.at += next.every;
      else this.timers = this.timers.filter((t) => t !== next);
      next.fn();
    }
    this.now = end;
  }
  private schedule(timer: { at: number; fn: () => void; every?: number }): Timer {
    this.timers.push(timer);
    return { cancel: () => void (this.timers = this.timers.filter((t) => t !== timer)) };
  }
}

export interface ActorWorld {
  resources: ActorResources;
  store: MemoryRunStore;
  events: MemoryEventLog;
  turns: ParkedTurns;
  steps: ParkedSteps;
  clock: TestClock;
  /** Subjects published on NATS (live events, final notices). */
  published: string[];
  /**
   * The object store's checkpoint, as a revision moved on by every save (which expects the
   * revision it replaces, as the real one does) and what each save expected. Unlike the
   * real one, a save of an empty workspace never saved before is stored too (these
   * tests' workspaces stay empty: no tool runs).
   */
  checkpoints: { saved: number; removed: string[]; revision: number; expected: number[] };
  /** Usage records the actor wrote (the ledger, in memory). */
  usage: UsageRecordDoc[];
  /** Webhook events the actor recorded, each once. */
  webhookEvents: WebhookEvent[];
}

let sandboxOff: Promise<Sandbox> | undefined;

/** The worlds' data folders: removed when the test file's process ends (a world has no teardown of its own). */
const dataDirs: string[] = [];
process.once("exit", () => {
  for (const dir of dataDirs) rmSync(dir, { recursive: true, force: true });
});

/** Everything a RunActor needs, in memory; the sandbox is the real one in mode off (no turn runs a tool). */
export async function actorWorld(): Promise<ActorWorld> {
  const store = new MemoryRunStore();
  const events = new MemoryEventLog();
  const turns = new ParkedTurns();
  const steps = new ParkedSteps();
  const clock = new TestClock();
  const published: string[] = [];
  const checkpoints = { saved: 0, removed: [] as string[], revision: 0, expected: [] as number[] };
  const dataDir = await mkdtemp(path.join(os.tmpdir(), "runs-actor-unit-"));
  dataDirs.push(dataDir);
  const log = pino({ level: "silent" });
  sandboxOff ??= Sandbox.start({ mode: "off", maxConcurrent: 4, runtimeDir: path.join(dataDir, "sandbox"), nodeId: "unit", log });
  const active = new Map<string, Set<string>>();
  const usage: UsageRecordDoc[] = [];
  const webhookEvents: WebhookEvent[] = [];
  const resources: ActorResources = {
    config: {
      activeTurnLimit: { solo: 2, business: 10 },
      allowPrivateModelEndpoints: false,
      ambientProviders: new Set(),
      dataDir,
      retention: { runS: { solo: 86_400, business: 86_400 }, eventS: { solo: 86_400, business: 86_400 }, fileS: { solo: 86_400, business: 86_400 } },
      turnLimitMs: 60_000,
    },
    clock,
    ids: Ids,
    store,
    nc: { publish: (subject: string) => void published.push(subject) },
    events,
    log,
    deployments: new DeploymentCache(store),
    checkpoints: {
      save: async (runId: string, _dir: string, _savedBefore: boolean, _workspaceId: string, expected: number) => {
        checkpoints.expected.push(expected);
        if (expected !== checkpoints.revision) throw new CheckpointConflictError(runId, checkpoints.revision);
        checkpoints.saved++;
        return ++checkpoints.revision;
      },
      restore: async () => checkpoints.revision,
      matches: async () => ({ current: true, revision: checkpoints.revision }),
      remove: async (runId: string) => void checkpoints.removed.push(runId),
    },
    activeTurns: {
      started: (workspaceId: string, turnId: string) => void (active.get(workspaceId) ?? active.set(workspaceId, new Set()).get(workspaceId)!).add(turnId),
      ended: (workspaceId: string, turnId: string) => void active.get(workspaceId)?.delete(turnId),
      count: (workspaceId: string) => active.get(workspaceId)?.size ?? 0,
    },
    files: {
      getMany: async () => [],
      read: async () => {
        throw new Error("no files in these tests");
      },
    },
    envValues: { resolveForTurn: async () => ({}) },
    usage: {
      record: async (doc) => {
        if (usage.some((r) => r._id === doc._id)) return false;
        usage.push(doc);
        return true;
      },
    },
    webhooks: {
      enqueue: async (event) => {
        if (webhookEvents.some((e) => e.eventKey === event.eventKey)) return 0;
        webhookEvents.push(event);
        return 1;
      },
    },
    sandbox: await sandboxOff,
    node: { draining: false },
    partRemovals: new BoundedWork(4, 1_000),
    startTurn: turns.start,
    at: steps.at,
  };
  return { resources, store, events, turns, steps, clock, published, checkpoints, usage, webhookEvents };
}
