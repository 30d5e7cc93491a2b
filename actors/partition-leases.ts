import type { KV } from "@nats-io/kv";
import type { Logger } from "pino";
import { type Clock, rendezvousOwner, type Timer } from "../src/index.js";

interface LeaseValue {
  node: string;
  expires_at: number;
}

interface Held {
  /** KV revision when claimed: the partition's fencing epoch. */
  epoch: number;
  /** Latest revision, for compare-and-set renewals. */
  revision: number;
}

export interface LeaseEvents {
  gained(partition: number, epoch: number): Promise<void> | void;
  lost(partition: number): Promise<void> | void;
  /** Whether the partition's actors are idle, so it can be handed back. */
  isIdle(partition: number): boolean;
}

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

  constructor(
    private readonly leases: KV,
    private readonly nodes: KV,
    private readonly nodeId: string,
    private readonly partitions: number,
    private readonly ttlMs: number,
    private readonly clock: Clock,
    private readonly events: LeaseEvents,
    private readonly log: Logger,
  ) {}

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
      .catch((err) => this.log.warn({ err }, "lease tick failed"))
      .finally(() => {
        this.ticking = undefined;
      });
    return this.ticking;
  }

  private async runTick(): Promise<void> {
    const now = this.clock.nowMs();
    // Renewals first, each bounded: a failing heartbeat (the nodes bucket electing a
    // leader) or a request stalled on a dead server must not let the leases lapse.
    await this.renewAll(now);
    if (this.draining) return;
    await withTimeout(this.nodes.put(this.nodeId, JSON.stringify({ expires_at: now + this.ttlMs })), this.ttlMs / 3, this.clock);
    const live = await this.liveNodes(now);
    for (let p = 0; p < this.partitions; p++) {
      const desired = rendezvousOwner(p, live) === this.nodeId;
      if (desired && !this.held.has(p)) await this.tryClaim(p, now);
      else if (!desired && this.held.has(p) && this.events.isIdle(p)) await this.release(p);
    }
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

  private async renewAll(now: number): Promise<void> {
    for (const [partition, held] of [...this.held]) {
      try {
        held.revision = await withTimeout(this.leases.update(key(partition), this.leaseValue(now), held.revision), this.ttlMs / 3, this.clock);
      } catch (err) {
        // A timed-out update may have landed; if the lease still names this node, it is ours.
        const entry = await withTimeout(this.leases.get(key(partition)), this.ttlMs / 3, this.clock).catch(() => null);
        if (entry?.operation === "PUT" && entry.json<LeaseValue>().node === this.nodeId && entry.revision >= held.revision) {
          held.revision = entry.revision;
          continue;
        }
        this.log.warn({ partition, err: String(err) }, "lease lost");
        this.held.delete(partition);
        await this.events.lost(partition);
      }
    }
  }

  private async tryClaim(partition: number, now: number): Promise<void> {
    let revision: number | undefined;
    try {
      revision = await this.leases.create(key(partition), this.leaseValue(now));
    } catch {
      const entry = await this.leases.get(key(partition));
      if (!entry) return;
      if (entry.operation === "PUT") {
        const value = entry.json<LeaseValue>();
        if (value.expires_at > now && value.node !== this.nodeId) return;
      }
      try {
        revision = await this.leases.update(key(partition), this.leaseValue(now), entry.revision);
      } catch {
        return; // someone else won the race
      }
    }
    this.held.set(partition, { epoch: revision, revision });
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
  let timer: Timer | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = clock.after(ms, () => reject(new Error(`lease request timed out after ${ms} ms`)));
  });
  return Promise.race([work, timeout]).finally(() => timer?.cancel());
}

function key(partition: number): string {
  return `p${partition}`;
}
