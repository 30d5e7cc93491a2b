import type { KV, KvWatchEntry } from "@nats-io/kv";
import type { Logger } from "pino";
import type { Clock, Timer } from "../src/index.js";

/** What a node announces for one workspace: its executing turns there, valid until `expires_at`. */
interface Announcement {
  count: number;
  expires_at: number;
}

/**
 * The turns executing in each workspace, across nodes, for the active-turn limit.
 *
 * Each node knows its own exactly, in memory, and announces how many it runs per
 * workspace in a JetStream KV key `<workspace>.<node>` — rewritten when the number
 * changes (one write in flight per workspace, always the latest number) and refreshed
 * before it expires. Every node watches the bucket, so a count is this node's own plus
 * the unexpired announcements of the others: a lookup, whatever the number of turns
 * (listing a key per turn cost a message per active turn at every turn start: 8,000
 * active turns made each start read 8,000). A crashed node's announcements stop counting
 * once they expire (one lease TTL).
 *
 * Across nodes the count lags by the time an announcement takes to arrive (a few ms),
 * so turns started on different nodes in that instant can together exceed the limit.
 */
export class ActiveTurns {
  private readonly local = new Map<string, Set<string>>();
  private readonly remote = new Map<string, Map<string, Announcement>>();
  /** Workspaces with a write in flight, and the write. */
  private readonly writing = new Map<string, Promise<void>>();
  /** Workspaces whose key holds this node's count (the last write was a put). */
  private readonly announced = new Set<string>();
  private readonly dirty = new Set<string>();
  private readonly node: string;
  private refresher: Timer | undefined;
  private stopWatch: (() => void) | undefined;
  private stopped = false;

  constructor(
    private readonly kv: KV,
    nodeId: string,
    private readonly clock: Clock,
    private readonly log: Logger,
    /** How long an announcement counts without a refresh (the lease TTL). */
    private readonly ttlMs: number,
  ) {
    // KV keys allow [-/_=.a-zA-Z0-9]; the node is the last dot-separated token.
    this.node = nodeId.replace(/[^-/_=a-zA-Z0-9]/g, "_");
  }

  /** Starts following the other nodes' announcements (they arrive within milliseconds) and refreshing this node's. */
  start(): void {
    this.watch();
    this.refresher = this.clock.every(
      Math.max(100, Math.floor(this.ttlMs / 3)),
      () => {
        for (const ws of this.local.keys()) this.announce(ws);
      },
      { keepAlive: false },
    );
  }

  /** Stops watching and withdraws this node's announcements (bounded). */
  async stop(): Promise<void> {
    this.stopped = true;
    this.refresher?.cancel();
    this.stopWatch?.();
    // Writes in flight first, so none lands after the withdrawal.
    const withdraw = Promise.all(this.writing.values()).then(() =>
      Promise.all([...this.announced].map((ws) => this.kv.delete(this.key(ws)).catch(() => undefined))),
    );
    await Promise.race([withdraw, this.clock.sleep(2_000, { keepAlive: false })]);
    this.local.clear();
    this.announced.clear();
  }

  started(workspaceId: string, turnId: string): void {
    let turns = this.local.get(workspaceId);
    if (!turns) this.local.set(workspaceId, (turns = new Set()));
    if (turns.has(turnId)) return;
    turns.add(turnId);
    this.announce(workspaceId);
  }

  ended(workspaceId: string, turnId: string): void {
    const turns = this.local.get(workspaceId);
    if (!turns?.delete(turnId)) return;
    this.announce(workspaceId);
  }

  /** Executing turns of a workspace: this node's, plus the others' unexpired announcements. */
  count(workspaceId: string): number {
    let n = this.local.get(workspaceId)?.size ?? 0;
    const now = this.clock.nowMs();
    for (const a of this.remote.get(workspaceId)?.values() ?? []) if (a.expires_at > now) n += a.count;
    return n;
  }

  private key(workspaceId: string): string {
    return `${workspaceId}.${this.node}`;
  }

  /** Writes this node's number for the workspace; a change during a write is written after it. */
  private announce(workspaceId: string): void {
    this.dirty.add(workspaceId);
    if (this.writing.has(workspaceId) || this.stopped) return;
    let written!: () => void;
    this.writing.set(workspaceId, new Promise<void>((resolve) => (written = resolve)));
    void (async () => {
      try {
        while (this.dirty.delete(workspaceId) && !this.stopped) {
          const count = this.local.get(workspaceId)?.size ?? 0;
          if (count === 0) {
            this.local.delete(workspaceId);
            await this.kv.delete(this.key(workspaceId));
            this.announced.delete(workspaceId);
          } else {
            const value: Announcement = { count, expires_at: this.clock.nowMs() + this.ttlMs };
            this.announced.add(workspaceId);
            await this.kv.put(this.key(workspaceId), JSON.stringify(value));
          }
        }
      } catch (err) {
        // The refresher writes it again; meanwhile other nodes count the last announcement.
        this.log.warn({ err: String(err), workspace_id: workspaceId }, "could not announce active turns");
      } finally {
        this.writing.delete(workspaceId);
        written();
      }
    })();
  }

  /** Follows every announcement, the existing ones first; restarts (backing off) until stopped. */
  private watch(): void {
    const loop = async () => {
      for (let attempt = 0; !this.stopped; attempt++) {
        try {
          const watcher = await this.kv.watch({ key: ">" });
          this.stopWatch = () => watcher.stop();
          for await (const entry of watcher) this.apply(entry);
        } catch (err) {
          if (!this.stopped) this.log.warn({ err: String(err) }, "active-turn watch failed; restarting");
        }
        if (this.stopped) return;
        // Unreferenced: a watch retrying on a closed connection must not keep the process alive.
        await this.clock.sleep(Math.min(5_000, 250 * 2 ** Math.min(attempt, 4)), { keepAlive: false });
      }
    };
    void loop();
  }

  private apply(entry: KvWatchEntry): void {
    const dot = entry.key.lastIndexOf(".");
    if (dot <= 0) return;
    const ws = entry.key.slice(0, dot);
    const node = entry.key.slice(dot + 1);
    if (node === this.node) return; // this node's own number is known exactly
    let nodes = this.remote.get(ws);
    if (entry.operation !== "PUT") {
      nodes?.delete(node);
      if (nodes?.size === 0) this.remote.delete(ws);
      return;
    }
    const value = parseAnnouncement(entry.value);
    if (!value) return;
    if (!nodes) this.remote.set(ws, (nodes = new Map()));
    nodes.set(node, value);
  }
}

const utf8 = new TextDecoder();

function parseAnnouncement(bytes: Uint8Array): Announcement | undefined {
  try {
    const v = JSON.parse(utf8.decode(bytes)) as Partial<Announcement>;
    if (typeof v.count === "number" && typeof v.expires_at === "number" && v.count >= 0) return { count: v.count, expires_at: v.expires_at };
  } catch {
    // not an announcement
  }
  return undefined;
}
