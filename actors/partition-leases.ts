import type { KV } from "@nats-io/kv";
import type { Logger } from "pino";
import { type Clock, rendezvousOwner, type Timer, within } from "../src/index.js";

interface LeaseValue {
  node: string;
  expires_at: number;
}

interface Held {
  /** KV revision when claimed: the partition's fencing epoch. */
  epoch: number;
  /** Latest revision, for compare-and-set renewals. */
  revision: number;
  /** When the last renewal known to have landed was sent: the lease holds until this + ttl. */
  confirmedAt: number;
  /** Since when renewals could not be confirmed past the lease's end (undefined: not in doubt). */
  doubtSince?: number;
}

export interface LeaseEvents {
  gained(partition: number, epoch: number): Promise<void> | void;
  lost(partition: number): Promise<void> | void;
  /** Whether the partition's actors are idle, so it can be handed back. */
  isIdle(partition: number): boolean;
  /**
   * The lease may have lapsed (the KV did not answer renewals for a whole TTL) but was
   * not seen taken: keep the actors, hold what others could see (event writes) until
   * `confirmed` (a renewal landed on the held revision: nobody took it) or `lost`.
   */
  doubt?(partition: number): void;
  confirmed?(partition: number): void;
}

/** How long a partition may stay in doubt before it is given up (its actors stop). */
export const MAX_DOUBT_MS = 60_000;

/**
 * Partition ownership through a JetStream KV bucket: a lease is created only if
 * absent (or taken over once expired) and renewed by revision, so two nodes never
 * hold one partition at once. Heartbeats in a second bucket give the live nodes for
 * rendezvous placement.
 */
export class PartitionLeases {
  private readonly held = new Map<number, Held>();
  private timer: Timer | undefined;
  private ticking: Promise<void> | undefined;
  private stopped = false;
  private draining = false;
  /**
   * Since when every KV request of this node's ticks has succeeded. A lease of another
   * node that ran out is taken only once this is a TTL old: after an outage of the KV
   * (a stream leader election outlasts a short TTL) every lease looks lapsed, and its
   * holder, alive, gets a whole TTL to renew before anyone may take it.
   */
  private kvHealthySince: number;
  /** A KV request of the current tick failed (its renewals answered unknown). */
  private tickFailed = false;

  constructor(
    private readonly leases: KV,
    private readonly nodes: KV,
    private readonly nodeId: string,
    private readonly partitions: number,
    private readonly ttlMs: number,
    private readonly clock: Clock,
    private readonly events: LeaseEvents,
    private readonly log: Logger,
  ) {
    this.kvHealthySince = clock.nowMs();
  }

  /** The epoch of a partition this node holds, or undefined. */
  epochOf(partition: number): number | undefined {
    return this.held.get(partition)?.epoch;
  }

  heldPartitions(): number[] {
    return [...this.held.keys()];
  }

  async start(): Promise<void> {
    await this.tick();
    const interval = Math.max(200, Math.floor(this.ttlMs / 3));
    this.timer = this.clock.every(interval, () => void this.tick());
  }

  /** Stops claiming; partitions are released by `releaseAll`. */
  stopClaiming(): void {
    this.draining = true;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.timer?.cancel();
    await this.ticking;
  }

  /**
   * Gives every held partition back at once so another node can take over. Bounded:
   * when NATS is already gone the leases simply lapse after their TTL.
   */
  async releaseAll(): Promise<void> {
    this.draining = true;
    await this.ticking;
    const boundMs = Math.min(2_000, this.ttlMs);
    await Promise.all([...this.held.keys()].map((partition) => this.release(partition, boundMs)));
    try {
      await withTimeout(this.nodes.delete(this.nodeId), boundMs, this.clock);
    } catch (err) {
      this.log.warn({ err: String(err) }, "could not remove node heartbeat");
    }
  }

  tick(): Promise<void> {
    if (this.stopped) return Promise.resolve();
    if (this.ticking) return this.ticking;
    this.ticking = this.runTick()
      .catch((err) => {
        this.kvFailed();
        this.log.warn({ err }, "lease tick failed");
      })
      .finally(() => {
        this.ticking = undefined;
      });
    return this.ticking;
  }

  private async runTick(): Promise<void> {
    this.tickFailed = false;
    // Renewals first, in parallel, each bounded: a failing heartbeat (the nodes bucket
    // electing a leader) or a request stalled on a dead server must not let the leases lapse.
    await this.renewAll();
    if (this.draining) return;
    await withTimeout(this.nodes.put(this.nodeId, JSON.stringify({ expires_at: this.clock.nowMs() + this.ttlMs })), this.ttlMs / 3, this.clock);
    const now = this.clock.nowMs();
    const live = await withTimeout(this.liveNodes(now), this.ttlMs / 3, this.clock);
    for (let p = 0; p < this.partitions; p++) {
      const desired = rendezvousOwner(p, live) === this.nodeId;
      if (desired && !this.held.has(p)) await this.tryClaim(p, this.clock.nowMs());
      else if (!desired && this.held.has(p) && this.events.isIdle(p)) await this.release(p);
    }
    // Health counts from the end of a tick in which every KV request succeeded.
    if (!this.tickFailed && this.kvHealthySince === Number.POSITIVE_INFINITY) this.kvHealthySince = this.clock.nowMs();
  }

  private async liveNodes(now: number): Promise<string[]> {
    const live: string[] = [this.nodeId];
    const keys = await this.nodes.keys();
    for await (const key of keys) {
      if (key === this.nodeId) continue;
      const entry = await this.nodes.get(key);
      if (!entry || entry.operation !== "PUT") continue;
      const value = entry.json<{ expires_at: number }>();
      if (value.expires_at > now) live.push(key);
    }
    return live;
  }

  private leaseValue(now: number): string {
    const value: LeaseValue = { node: this.nodeId, expires_at: now + this.ttlMs };
    return JSON.stringify(value);
  }

  /** A KV request failed or timed out: lapsed leases of others wait a TTL of health again. */
  private kvFailed(): void {
    this.tickFailed = true;
    this.kvHealthySince = Number.POSITIVE_INFINITY;
  }

  private async renewAll(): Promise<void> {
    await Promise.all([...this.held].map(([partition, held]) => this.renew(partition, held)));
  }

  private async renew(partition: number, held: Held): Promise<void> {
    const sentAt = this.clock.nowMs();
    try {
      held.revision = await withTimeout(this.leases.update(key(partition), this.leaseValue(sentAt), held.revision), this.ttlMs / 3, this.clock);
      this.confirm(partition, held, sentAt);
      return;
    } catch (err) {
      // A timed-out update may have landed: a later revision naming this node is ours,
      // with the lease that update wrote (from its expires_at). The revision held itself
      // is not: it is the previous renewal (the update did not land, or a replica has not
      // seen it), and that renewal's lease runs out.
      const entry = await withTimeout(this.leases.get(key(partition)), this.ttlMs / 3, this.clock).catch(() => undefined);
      if (this.held.get(partition) !== held) return; // released or lost meanwhile
      const value = entry?.operation === "PUT" ? entry.json<LeaseValue>() : undefined;
      if (value?.node === this.nodeId && entry!.revision > held.revision) {
        held.revision = entry!.revision;
        this.confirm(partition, held, value.expires_at - this.ttlMs);
        return;
      }
      // Taken: gone, or another node's (or a delete) after the revision held.
      if (entry === null || (entry !== undefined && value?.node !== this.nodeId && entry.revision > held.revision)) {
        this.log.warn({ partition, err: String(err) }, "lease lost");
        this.held.delete(partition);
        await this.events.lost(partition);
        return;
      }
      // Not known: the KV did not answer, or a replica behind the renewals did.
      this.kvFailed();
      this.checkDoubt(partition, String(err));
      if (held.doubtSince !== undefined && this.clock.nowMs() - held.doubtSince >= MAX_DOUBT_MS) {
        this.log.warn({ partition, doubt_ms: this.clock.nowMs() - held.doubtSince }, "lease lost: in doubt too long");
        this.held.delete(partition);
        await this.events.lost(partition);
      }
    }
  }

  /** A renewal sent at `sentAt` landed: the lease holds until sentAt + ttl. */
  private confirm(partition: number, held: Held, sentAt: number): void {
    held.confirmedAt = Math.max(held.confirmedAt, sentAt);
    if (held.doubtSince === undefined || !this.live(held)) return;
    this.log.info({ partition, doubt_ms: this.clock.nowMs() - held.doubtSince }, "lease confirmed after doubt; event writes go on");
    held.doubtSince = undefined;
    this.events.confirmed?.(partition);
  }

  /** Whether the lease last confirmed still holds (a tenth of the TTL covers clock drift and latency). */
  private live(held: Held): boolean {
    return this.clock.nowMs() < held.confirmedAt + this.ttlMs - this.ttlMs / 10;
  }

  /**
   * Puts the partition in doubt once its confirmed lease has run out: asked by every
   * renewal that fails and by the actors before each event write (the write gate), so
   * no write goes out after the lease's end, however long a tick takes.
   * Returns whether the partition is in doubt.
   */
  checkDoubt(partition: number, why = "lease ran out before a renewal was confirmed"): boolean {
    const held = this.held.get(partition);
    if (!held) return false;
    if (held.doubtSince !== undefined) return true;
    if (this.live(held)) return false;
    held.doubtSince = this.clock.nowMs();
    this.log.warn({ partition, err: why }, "lease in doubt: renewals unanswered for a TTL; holding event writes");
    this.events.doubt?.(partition);
    return true;
  }

  private async tryClaim(partition: number, now: number): Promise<void> {
    let revision: number | undefined;
    try {
      revision = await withTimeout(this.leases.create(key(partition), this.leaseValue(now)), this.ttlMs / 3, this.clock);
    } catch {
      const entry = await withTimeout(this.leases.get(key(partition)), this.ttlMs / 3, this.clock);
      if (!entry) return;
      if (entry.operation === "PUT") {
        const value = entry.json<LeaseValue>();
        if (value.node !== this.nodeId) {
          if (value.expires_at > now) return;
          if (now - this.kvHealthySince < this.ttlMs) return; // its holder may not have been able to renew
        }
      }
      try {
        revision = await withTimeout(this.leases.update(key(partition), this.leaseValue(now), entry.revision), this.ttlMs / 3, this.clock);
      } catch {
        return; // someone else won the race, or the KV did not answer
      }
    }
    this.held.set(partition, { epoch: revision, revision, confirmedAt: now });
    this.log.debug({ partition, epoch: revision }, "partition claimed");
    await this.events.gained(partition, revision);
  }

  private async release(partition: number, boundMs = this.ttlMs): Promise<void> {
    const held = this.held.get(partition);
    if (!held) return;
    this.held.delete(partition);
    await this.events.lost(partition);
    try {
      await withTimeout(this.leases.delete(key(partition), { previousSeq: held.revision }), boundMs, this.clock);
    } catch (err) {
      this.log.warn({ partition, err: String(err) }, "lease release failed");
    }
  }
}

/** Rejects when `work` takes longer than `ms` (the request itself is not cancelled). */
function withTimeout<T>(work: Promise<T>, ms: number, clock: Clock): Promise<T> {
  return within(work, ms, clock, (): never => {
    throw new Error(`lease request timed out after ${ms} ms`);
  });
}

function key(partition: number): string {
  return `p${partition}`;
}
