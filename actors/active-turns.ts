import type { KV } from "@nats-io/kv";

/**
 * The turns executing in each workspace, across nodes, for the active-turn limit: a
 * key `<workspace>.<turn>` per executing turn in a JetStream KV bucket. Counting reads
 * only that workspace's keys, never the store (whose count is a collection scan on
 * FerretDB). Keys of a crashed node are removed when its turns are recovered, and
 * expire with the bucket's TTL otherwise.
 */
export class ActiveTurns {
  constructor(private readonly kv: KV) {}

  async started(workspaceId: string, turnId: string): Promise<void> {
    await this.kv.put(key(workspaceId, turnId), "1");
  }

  async ended(workspaceId: string, turnId: string): Promise<void> {
    await this.kv.purge(key(workspaceId, turnId));
  }

  /** Executing turns of a workspace, counted up to `cap + 1`. */
  async count(workspaceId: string, cap: number): Promise<number> {
    let n = 0;
    const keys = await this.kv.keys(`${workspaceId}.*`);
    for await (const _ of keys) {
      if (++n > cap) break;
    }
    return n;
  }
}

function key(workspaceId: string, turnId: string): string {
  return `${workspaceId}.${turnId}`;
}
