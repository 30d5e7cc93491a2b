import type { KV } from "@nats-io/kv";
import { type Clock, isCasConflict } from "../src/index.js";

/** A slot held by one running upload. */
export interface UploadSlot {
  /** Extends the hold; false when the slot was taken over meanwhile (the holder was silent too long). */
  refresh(): Promise<boolean>;
  /** Gives the slot up (only if still held by this upload). */
  release(): Promise<void>;
}

/**
 * The concurrent-upload cap of a workspace, exact across nodes: the workspace has `cap`
 * numbered slots, keys of a JetStream KV bucket, and an upload runs only in a slot it
 * took by an atomic create (or by a compare-and-set over a hold that ran out: a holder
 * that died or stalled). Counting running uploads and then claiming one let concurrent
 * requests all see room and all start. A holder refreshes its hold while bytes arrive
 * and releases it at the end; the bucket's max age removes what a dead holder left.
 */
export class UploadSlots {
  constructor(
    private readonly kv: KV,
    private readonly clock: Clock,
    /** How long a hold lasts without a refresh (the upload takeover window). */
    private readonly holdMs: number,
  ) {}

  /**
   * A free slot of the workspace's `cap`, or undefined when every slot is held.
   * `holder` names the upload attempt. A hold taken whose answer was lost (a timeout)
   * stays until it runs out (`holdMs`).
   */
  async take(workspaceId: string, cap: number, holder: string): Promise<UploadSlot | undefined> {
    for (let slot = 0; slot < cap && slot < 1_000; slot++) {
      const key = `uploads.${workspaceId}.${slot}`;
      const revision = await this.tryTake(key, holder);
      if (revision !== undefined) return this.held(key, holder, revision);
    }
    return undefined;
  }

  /** The revision of a hold on `key` just taken, or undefined when another upload holds it. */
  private async tryTake(key: string, holder: string): Promise<number | undefined> {
    try {
      // create also succeeds over a deleted key (a released slot).
      return await this.kv.create(key, this.hold(holder));
    } catch (err) {
      if (!isCasConflict(err)) throw err;
    }
    const entry = await this.kv.get(key);
    if (!entry || entry.operation !== "PUT") return undefined; // released or taken in between: next slot
    const until = Number((entry.json() as { until?: unknown }).until);
    if (Number.isFinite(until) && until > this.clock.nowMs()) return undefined;
    try {
      return await this.kv.update(key, this.hold(holder), entry.revision);
    } catch (err) {
      if (isCasConflict(err)) return undefined; // another request took the run-out hold first
      throw err;
    }
  }

  private held(key: string, holder: string, revision: number): UploadSlot {
    // One write at a time: a release waits for a refresh in flight, so that it deletes
    // the hold at its latest revision.
    let last: Promise<unknown> = Promise.resolve();
    return {
      refresh: () => {
        const refreshed = last.then(async () => {
          try {
            revision = await this.kv.update(key, this.hold(holder), revision);
            return true;
          } catch (err) {
            if (!isCasConflict(err)) throw err;
            // Still this upload's (an earlier refresh was stored but its answer lost, so the
            // revision here is behind): go on from the stored one. Else it was taken over.
            const entry = await this.kv.get(key);
            if (entry?.operation !== "PUT" || (entry.json() as { holder?: unknown }).holder !== holder) return false;
            revision = entry.revision;
            return true;
          }
        });
        last = refreshed.catch(() => undefined);
        return refreshed;
      },
      release: async () => {
        await last;
        await this.kv.delete(key, { previousSeq: revision }).catch(() => undefined); // taken over, or the bucket's max age ends it
      },
    };
  }

  private hold(holder: string): string {
    return JSON.stringify({ holder, until: this.clock.nowMs() + this.holdMs });
  }
}
