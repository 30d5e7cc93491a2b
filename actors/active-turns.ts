import type { JetStreamManager } from "@nats-io/jetstream";
import type { KV } from "@nats-io/kv";

/**
 * The turns executing in each workspace, across nodes, for the active-turn limit: a
 * key `<workspace>.<turn>` per executing turn in a JetStream KV bucket. Counting reads
 * only that workspace's keys, never the store (whose count is a collection scan on
 * FerretDB). Keys of a crashed node are removed when its turns are recovered, and
 * expire with the bucket's TTL otherwise.
 *
 * An ended turn's key is purged from the bucket's stream (no delete marker is left),
 * so the server can count a workspace's keys in one stream-info request: the
 * subjects under `<workspace>.*` that still hold a message. Listing keys through a
 * consumer instead cost a consumer and one message per active turn at every turn start.
 */
export class ActiveTurns {
  private readonly stream: string;
  private readonly prefix: string;

  constructor(
    private readonly kv: KV,
    private readonly jsm: JetStreamManager,
    bucket: string,
  ) {
    this.stream = `KV_${bucket}`;
    this.prefix = `$KV.${bucket}.`;
  }

  async started(workspaceId: string, turnId: string): Promise<void> {
    await this.kv.put(key(workspaceId, turnId), "1");
  }

  async ended(workspaceId: string, turnId: string): Promise<void> {
    await this.jsm.streams.purge(this.stream, { filter: this.prefix + key(workspaceId, turnId) });
  }

  /** Executing turns of a workspace (every key under it holds one message). */
  async count(workspaceId: string): Promise<number> {
    const info = await this.jsm.streams.info(this.stream, { subjects_filter: `${this.prefix}${workspaceId}.*` });
    return Object.keys(info.state.subjects ?? {}).length;
  }
}

function key(workspaceId: string, turnId: string): string {
  return `${workspaceId}.${turnId}`;
}
