import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { BoundedWork, type ChunkBucket, type ChunkSuspect, type CommandReply, type Config, type FileStore, isTransientFailure, purgeUnnamedChunks, partitionOf, type RunCommand, Subjects, type Timer, type UsageLedger } from "../src/index.js";
import { CheckpointError } from "./checkpoints.js";
import { CommandReplies } from "./command-replies.js";
import { PartitionLeases } from "./partition-leases.js";
import { RunActor, type ActorResources } from "./run-actor.js";
import { keptWorkspaceIds, sweepKeptWorkspaces } from "./run-workspace.js";
import { removeGoneWorkspaces, removeLeftParts } from "./run-removal.js";
import type { KV } from "@nats-io/kv";
import type { JetStreamClient, JetStreamManager } from "@nats-io/jetstream";

const encoder = new TextEncoder();
const decoder = new TextDecoder();
/** How long a workspace directory of a run this node no longer holds is kept after its last use. */
const KEPT_WORKSPACE_MS = 6 * 60 * 60_000;
/**
 * Busy runs of gained partitions recovered at once, and waiting (past it: left to the
 * orphan check). 600 busy runs on the test servers: all at once took 1.6–1.9 s and a
 * scrape of /metrics during it ~180 ms; 32 at once 2.0–2.2 s and ~11 ms; 16, 2.5 s and ~5 ms.
 */
const RECOVERIES_AT_ONCE = 32;
const RECOVERIES_WAITING = 100_000;
/** How often the owner of partition 0 looks for object chunks no object names (purgeUnnamedChunks). */
export const UNNAMED_CHUNKS_EVERY_MS = 60 * 60_000;

/** Temporary failures inside a command (checkpoints too) answer 503, never 500. */
function isTemporary(error: unknown): boolean {
  return isTransientFailure(error) || error instanceof CheckpointError;
}

/** What the host needs besides what it hands its actors. */
export interface HostResources extends ActorResources {
  config: Config;
  nc: NatsConnection;
  files: FileStore;
  usage: ActorResources["usage"] & Pick<UsageLedger, "sweep">;
  /** The object buckets whose unnamed chunks the owner of partition 0 purges, hourly. */
  objectChunks: { js: JetStreamClient; jsm: Pick<JetStreamManager, "streams">; buckets: ChunkBucket[] };
}

/**
 * Hosts the run actors of the partitions this node owns: serves `runs.cmd.<p>` for
 * each held partition, recovers busy runs when a partition is gained, and stops the
 * partition's actors when it is lost.
 */
export class ActorHost {
  private readonly actors = new Map<string, RunActor>();
  private readonly subs = new Map<number, Subscription>();
  private readonly replies: CommandReplies;
  private readonly leases: PartitionLeases;
  /** What the actors get: the host's resources and the write gate of their partition. */
  private readonly actorResources: ActorResources;
  /** Partitions whose lease is in doubt: event writes wait on these. */
  private readonly doubts = new Map<number, { held: Promise<void>; confirm: () => void; lose: (err: Error) => void }>();
  private passivateTimer: Timer | undefined;
  private sweepTimer: Timer | undefined;
  private sweeping = false;
  private orphanTimer: Timer | undefined;
  private adopting = false;
  /**
   * Recoveries of the busy runs of gained partitions, a few at a time: a node taking over
   * a failed one's partitions (10,000 active turns, say) would otherwise read and write
   * every one of them at once. A run a command reaches first is recovered by that command
   * (its actor's mailbox); one left out (the queue full, or the node stopping) by the
   * orphan check.
   */
  private readonly recoveries = new BoundedWork(RECOVERIES_AT_ONCE, RECOVERIES_WAITING);
  private admitting = true;
  /** Gained partitions whose kept workspace directories are still to be looked at (checkGoneWorkspaces). */
  private readonly goneChecks = new Set<number>();
  private checkingGone = false;
  /** When the last pass over unnamed object chunks began (none yet: the first sweep that holds partition 0 makes one). */
  private chunksCheckedAt = Number.NEGATIVE_INFINITY;
  /** The pass under way, if any: the node's stop waits a little for it before the connections close. */
  private chunkPass: Promise<void> | undefined;
  /** Per bucket, the chunk subjects the last pass found unnamed: a later one purges those it finds unchanged past the grace. */
  private readonly chunkSuspects = new Map<string, Map<string, ChunkSuspect>>();

  constructor(
    private readonly r: HostResources,
    kv: { leases: KV; nodes: KV },
  ) {
    this.leases = new PartitionLeases(
      kv.leases,
      kv.nodes,
      r.config.nodeId,
      r.config.partitions,
      r.config.leaseTtlMs,
      r.clock,
      {
        gained: (p, epoch) => this.gained(p, epoch),
        lost: (p) => this.lost(p),
        isIdle: (p) => this.partitionIdle(p),
        doubt: (p) => this.doubt(p),
        confirmed: (p) => this.endDoubt(p),
      },
      r.log.child({ component: "leases" }),
    );
    // The gate asks the leases each time: past the confirmed lease's end a write waits,
    // whether or not a tick has noticed yet.
    this.replies = new CommandReplies(() => r.clock.nowMs());
    this.actorResources = { ...r, writeGate: (p) => (this.leases.checkDoubt(p) ? this.doubts.get(p)?.held : undefined) };
  }

  async start(): Promise<void> {
    await this.leases.start();
    const upkeep = { keepAlive: false };
    this.passivateTimer = this.r.clock.every(30_000, () => this.passivate(), upkeep);
    this.sweepTimer = this.r.clock.every(this.r.config.sweepIntervalMs, () => void this.sweep(), upkeep);
    this.orphanTimer = this.r.clock.every(Math.max(1_000, this.r.config.leaseTtlMs), () => void this.adoptOrphans(), upkeep);
  }

  /**
   * A stale owner can still insert a run (inserts are not fenced) after this node
   * claimed the partition and scanned it, or stop before starting an admitted turn; and a
   * recovery here can fail (the store or the event log away for a moment). Busy runs of
   * held partitions that no actor here holds, at this node's epoch or an older one, are
   * recovered (an actor's mailbox keeps a second recovery from racing the first).
   */
  async adoptOrphans(): Promise<void> {
    // Gained partitions' recoveries still under way: the check comes after them (it would
    // take the runs that wait their turn for orphans).
    const recoveries = this.recoveries.size;
    if (!this.admitting || this.adopting || recoveries.running + recoveries.waiting > 0) return;
    this.adopting = true;
    try {
      const held = this.leases.heldPartitions();
      if (!held.length) return;
      for (const run of await this.r.store.busyRunsIn(held)) {
        const epoch = this.leases.epochOf(run.partition);
        if (epoch === undefined) continue;
        // An actor of this node stopped without storing its finished turn: recover the run now.
        const unsettled = this.actors.get(run._id)?.isUnsettled === true;
        if (!unsettled && (run.epoch > epoch || this.actors.get(run._id)?.holdsRun)) continue;
        this.r.log.warn({ run_id: run._id, run_epoch: run.epoch, epoch }, unsettled ? "recovering a run whose finished turn could not be stored" : "recovering a run a stale owner left busy");
        // One run's recovery failing (the store refusing what it holds, say) is that run's:
        // the check goes on to the rest, which would otherwise wait behind it for good.
        await this.actorFor(run._id, run.partition, epoch)
          .recover()
          .catch((err: unknown) => this.r.log.warn({ err, run_id: run._id }, "recovery failed; retrying at the next orphan check"));
      }
    } catch (err) {
      this.r.log.warn({ err }, "orphan check failed; retrying at the next interval");
    } finally {
      this.adopting = false;
    }
  }

  /**
   * Purges the chunks a write that died left in the object buckets (src/object-chunks.ts):
   * those a pass found unnamed and that no chunk was written to for the bucket's grace.
   * Once an hour, whatever became of the last pass (a failed one is logged).
   */
  private async purgeLeftChunks(): Promise<void> {
    for (const bucket of this.r.objectChunks.buckets) {
      // A stopping node leaves the rest to the next owner of partition 0.
      if (!this.admitting) return;
      try {
        const clock = () => this.r.clock.nowMs();
        const pass = await purgeUnnamedChunks(this.r.objectChunks, bucket, clock, this.chunkSuspects.get(bucket.name) ?? new Map());
        this.chunkSuspects.set(bucket.name, pass.suspects);
        const said = { bucket: bucket.name, unnamed: pass.unnamed, purged: pass.purged, suspected: pass.suspects.size, forgotten: pass.forgotten, deleted_left: pass.deletedLeft };
        if (pass.incomplete) this.r.log.warn({ ...said, why: pass.incomplete }, "could not read every object entry: no object chunk purged; trying again in an hour");
        // Unnamed chunks may be a write in progress: suspected, purged at a later pass if nothing was written to them.
        else if (pass.unnamed || pass.forgotten) this.r.log.info(said, "looked for object chunks no object names");
      } catch (err) {
        this.r.log.warn({ err, bucket: bucket.name }, "could not look for object chunks no object names; trying again in an hour");
      }
    }
  }

  /**
   * Expiry is a sweeper (the store has no TTL indexes): each node expires the runs of
   * the partitions it owns, through their actors, and forgets old records. It also
   * removes the workspace directories it kept for runs it no longer holds, six hours
   * after they were last used (run-workspace.ts).
   */
  async sweep(): Promise<void> {
    if (this.sweeping) return;
    this.sweeping = true;
    try {
      const now = this.r.clock.nowMs();
      const held = this.leases.heldPartitions();
      // Gained partitions whose kept directories could not all be looked at: again now.
      if (this.goneChecks.size) void this.checkGoneWorkspaces();
      if (held.length) {
        for (const run of await this.r.store.expiredRunsIn(held, now, this.r.config.turnLimitMs)) {
          const epoch = this.leases.epochOf(run.partition);
          if (epoch === undefined) continue;
          // Each apart: one that cannot be removed now must not stop the sweep after it.
          try {
            if (await this.actorFor(run._id, run.partition, epoch).expire()) this.actors.delete(run._id);
          } catch (err) {
            this.r.log.warn({ err, run_id: run._id }, "could not remove an expired run; retrying at the next sweep");
          }
        }
      }
      // Each apart: one that cannot be swept now must not stop the sweeps after it.
      if (held.length) {
        try {
          // Within 10 s a pass: a run with a long history takes a while; the rest wait for the next one.
          const began = this.r.clock.nowMs();
          for (const tombstone of await this.r.store.tombstonesDueIn(held, now)) {
            if (this.r.clock.nowMs() - began > 10_000) break;
            await removeLeftParts(this.r, tombstone, now);
          }
        } catch (err) {
          this.r.log.warn({ err }, "the check of removed runs' parts failed; retrying at the next interval");
        }
      }
      try {
        await this.r.store.sweepRecords(now);
      } catch (err) {
        this.r.log.warn({ err }, "idempotency and tombstone sweep failed; retrying at the next interval");
      }
      if (this.r.config.usageRetentionMs > 0) {
        try {
          const usage = await this.r.usage.sweep(now - this.r.config.usageRetentionMs);
          if (usage) this.r.log.info({ usage_records: usage }, "usage records past their retention removed");
        } catch (err) {
          this.r.log.warn({ err }, "usage sweep failed; retrying at the next interval");
        }
      }
      const swept = await this.r.files.sweep(now, { uploadTimeLimitMs: this.r.config.files.timeLimitMs });
      if (swept.files || swept.uploads || swept.orphans) this.r.log.info({ files: swept.files, uploads: swept.uploads, orphans: swept.orphans }, "expired files, upload records and orphaned upload objects removed");
      if (swept.failed) this.r.log.warn({ objects: swept.failed }, "could not delete some objects of expired files or left-behind uploads; their records stay for the next sweep");
      // One node at a time does this (the owner of partition 0): the listing is of the whole
      // bucket, and may take minutes, so apart from the sweep (which goes on meanwhile).
      if (held.includes(0) && this.admitting && !this.chunkPass && now - this.chunksCheckedAt >= UNNAMED_CHUNKS_EVERY_MS) {
        this.chunksCheckedAt = now;
        this.chunkPass = this.purgeLeftChunks()
          .catch((err: unknown) => this.r.log.warn({ err }, "the pass over object chunks failed; trying again in an hour"))
          .finally(() => (this.chunkPass = undefined));
      }
      const partitions = this.r.config.partitions;
      const holds = (runId: string) => this.actors.has(runId) || this.leases.epochOf(partitionOf(runId, partitions)) !== undefined;
      const kept = await sweepKeptWorkspaces(this.r.config.dataDir, holds, { nowMs: now, olderThanMs: KEPT_WORKSPACE_MS });
      if (kept.removed) this.r.log.info({ workspaces: kept.removed }, "removed workspace directories kept for runs this node no longer holds");
      if (kept.failed) this.r.log.warn({ workspaces: kept.failed }, "could not remove some workspace directories kept for runs this node no longer holds; retrying at the next sweep");
    } catch (err) {
      this.r.log.warn({ err }, "sweep failed; retrying at the next interval");
    } finally {
      this.sweeping = false;
    }
  }

  /** Turns this node executes now and turns queued behind them (for /metrics). */
  turnCounts(): { active: number; queued: number; recovering: number; recoveriesWaiting: number } {
    let active = 0;
    let queued = 0;
    for (const actor of this.actors.values()) {
      if (actor.hasActiveTurn) active++;
      if (actor.hasQueuedTurn) queued++;
    }
    const recoveries = this.recoveries.size;
    return { active, queued, recovering: recoveries.running, recoveriesWaiting: recoveries.waiting };
  }

  /** The partitions this node holds now (webhook deliveries follow them). */
  heldPartitions(): number[] {
    return this.leases.heldPartitions();
  }

  /** Number of partitions held (for readiness). */
  get heldCount(): number {
    return this.leases.heldPartitions().length;
  }

  /**
   * Graceful shutdown: stop admitting (gateways route elsewhere), let active turns
   * finish for up to `drainMs`, interrupt what remains (incomplete,
   * worker_execution_interrupted, or worker_action_interrupted for a turn stopped in a
   * tool call), then give every partition back at once. `drainMs` 0: interrupt at once
   * (a node whose start failed).
   */
  async stop(drainMs = this.r.config.drainMs): Promise<void> {
    this.admitting = false;
    // What waits is left to the partitions' next owners.
    this.recoveries.close();
    this.r.node.draining = true;
    this.leases.stopClaiming();
    this.passivateTimer?.cancel();
    this.sweepTimer?.cancel();
    this.orphanTimer?.cancel();
    const deadline = this.r.clock.nowMs() + drainMs;
    while (this.busyActors().length > 0 && this.r.clock.nowMs() < deadline) {
      await this.r.clock.sleep(100);
    }
    const remaining = this.busyActors();
    if (remaining.length) this.r.log.warn({ turns: remaining.length }, "drain time over: interrupting active turns");
    await Promise.all(remaining.map((actor) => actor.interrupt().catch((err) => this.r.log.error({ err, run_id: actor.runId }, "interrupt failed"))));
    await this.leases.stop();
    await this.leases.releaseAll();
    // A pass over object chunks ends with its bucket (it checks between them), so as not to
    // run on against closed connections; a bucket's listing may take a minute: waited 5 s.
    if (this.chunkPass) await Promise.race([this.chunkPass, this.r.clock.sleep(5_000, { keepAlive: false })]);
    for (const actor of this.actors.values()) actor.stop("node stopped");
    this.actors.clear();
  }

  /** Actors whose turn runs, or is being finished (its checkpoint, its final writes and their retries): drained alike (review). */
  private busyActors(): RunActor[] {
    return [...this.actors.values()].filter((actor) => actor.hasActiveTurn || actor.isFinishingTurn);
  }

  private async gained(partition: number, epoch: number): Promise<void> {
    const sub = this.r.nc.subscribe(Subjects.command(partition), {
      callback: (err, msg) => {
        if (err) return;
        void this.answer(partition, () => JSON.parse(decoder.decode(msg.data)) as RunCommand).then((reply) => msg.respond(encoder.encode(JSON.stringify(reply))));
      },
    });
    this.subs.set(partition, sub);
    const busy = await this.r.store.busyRunsIn([partition]);
    for (const run of busy) {
      void this.recoveries
        .run(async () => {
          // Lost (or regained at another epoch) while this waited: not this turn's work.
          if (this.leases.epochOf(partition) !== epoch) return;
          await this.actorFor(run._id, partition, epoch).recover();
        })
        .then(
          (taken) => {
            if (!taken && this.admitting) this.r.log.warn({ run_id: run._id, partition }, "recoveries queue full: the run is left to the orphan check");
          },
          (err) => this.r.log.error({ err, run_id: run._id }, "recovery failed"),
        );
    }
    if (busy.length) this.r.log.info({ partition, runs: busy.length }, "recovering busy runs");
    this.goneChecks.add(partition);
    void this.checkGoneWorkspaces();
  }

  /**
   * Looks at the directories this node kept of gained partitions' runs and removes those of
   * runs removed meanwhile (actors/run-removal.ts). One pass at a time, over every partition
   * gained until it starts (a node's start gains many at once: one listing for all); a
   * partition whose pass could not finish is looked at again after the next sweep.
   */
  private async checkGoneWorkspaces(): Promise<void> {
    if (this.checkingGone) return;
    this.checkingGone = true;
    const again = new Set<number>();
    try {
      for (let pass = 0; pass < 10 && this.goneChecks.size > 0 && this.admitting; pass++) {
        const partitions = new Set(this.goneChecks);
        this.goneChecks.clear();
        const partitionOfRun = (runId: string) => partitionOf(runId, this.r.config.partitions);
        try {
          const kept = (await keptWorkspaceIds(this.r.config.dataDir)).filter((runId) => {
            const p = partitionOfRun(runId);
            return partitions.has(p) && this.leases.epochOf(p) !== undefined;
          });
          const done = await removeGoneWorkspaces(this.r, kept, (runId) => this.actors.has(runId));
          for (const runId of done.failed) again.add(partitionOfRun(runId));
          if (done.checked) {
            this.r.log.info(
              { partitions: partitions.size, checked: done.checked, removed: done.removed, failed: done.failed.length },
              "looked for kept workspace directories of runs removed while another node held their partition",
            );
          }
        } catch (err) {
          for (const p of partitions) again.add(p);
          this.r.log.warn({ err }, "could not list the kept workspace directories; looking again after the next sweep");
        }
      }
    } finally {
      this.checkingGone = false;
      for (const p of again) this.goneChecks.add(p);
    }
  }

  /** The lease may have lapsed: hold the partition's event writes (its actors go on). */
  private doubt(partition: number): void {
    if (this.doubts.has(partition)) return;
    let confirm!: () => void;
    let lose!: (err: Error) => void;
    const held = new Promise<void>((resolve, reject) => {
      confirm = resolve;
      lose = reject;
    });
    held.catch(() => undefined); // each waiting write handles the rejection
    this.doubts.set(partition, { held, confirm, lose });
  }

  /** Confirmed (nobody took the lease): the held writes go out, in order. */
  private endDoubt(partition: number): void {
    this.doubts.get(partition)?.confirm();
    this.doubts.delete(partition);
  }

  private lost(partition: number): void {
    this.doubts.get(partition)?.lose(new Error(`partition ${partition} lost while its lease was in doubt`));
    this.doubts.delete(partition);
    this.subs.get(partition)?.unsubscribe();
    this.subs.delete(partition);
    for (const [id, actor] of this.actors) {
      if (actor.partition !== partition) continue;
      actor.stop("partition lost");
      this.actors.delete(id);
    }
  }

  private partitionIdle(partition: number): boolean {
    for (const actor of this.actors.values()) if (actor.partition === partition && !actor.canMove) return false;
    return true;
  }

  /**
   * A command for a partition this node serves (its subscription open), answered in this
   * process: the answer the subscription gives (resends, ownership and doubt checked
   * alike), without the command and its reply crossing NATS. Undefined where this node
   * does not serve the partition: the command goes to its owner through NATS.
   * Both cross as JSON, as through NATS, so neither side holds the other's objects.
   */
  commandHere(runId: string, command: string): Promise<CommandReply> | undefined {
    const partition = partitionOf(runId, this.r.config.partitions);
    if (!this.subs.has(partition)) return undefined;
    return this.answer(partition, () => JSON.parse(command) as RunCommand).then((reply) => JSON.parse(JSON.stringify(reply)) as CommandReply);
  }

  /** The reply to the command `read` gives; a failure (a malformed command too) becomes one. */
  private answer(partition: number, read: () => RunCommand): Promise<CommandReply> {
    return (async () => this.serve(partition, read()))().catch((error: unknown) => {
      // A temporary failure (JetStream or the store unavailable for a moment) is a
      // 503 the client retries with its Idempotency-Key, not a 500.
      const temporary = isTemporary(error);
      this.r.log[temporary ? "warn" : "error"]({ err: error, partition }, "command failed");
      return { ok: false, code: temporary ? "runtime_unavailable" : "internal_error" } satisfies CommandReply;
    });
  }

  private async serve(partition: number, cmd: RunCommand): Promise<CommandReply> {
    // A resend of a command this node ran (or runs) gets that answer, also while draining or in doubt.
    const earlier = this.replies.known(cmd.command_id);
    if (earlier) return earlier;
    const epoch = this.leases.epochOf(partition);
    if (epoch === undefined || !this.admitting || partitionOf(cmd.run_id, this.r.config.partitions) !== partition) {
      return { ok: false, not_owner: true };
    }
    // In doubt, a command would wait on held writes past the router's timeout: it is not
    // run here, and the router asks again until an owner answers (or answers 503).
    if (this.leases.checkDoubt(partition)) return { ok: false, in_doubt: true };
    // A resend (its first reply was lost) is answered as the first, not run again.
    return this.replies.answer(cmd.command_id, async () => {
      const actor = this.actorFor(cmd.run_id, partition, epoch);
      const reply = await actor.command(cmd);
      if (actor.isStopped) this.actors.delete(cmd.run_id);
      return reply;
    });
  }

  private actorFor(runId: string, partition: number, epoch: number): RunActor {
    let actor = this.actors.get(runId);
    if (!actor || actor.isStopped || actor.epoch !== epoch) {
      actor = new RunActor(runId, partition, epoch, this.actorResources);
      this.actors.set(runId, actor);
    }
    return actor;
  }

  /** Drops idle actors that were not used for a while; their state is all in the store. */
  private passivate(): void {
    const cutoff = this.r.clock.nowMs() - 60_000;
    for (const [id, actor] of this.actors) {
      if (actor.isIdle && actor.lastUsedMs < cutoff) this.actors.delete(id);
    }
  }
}
