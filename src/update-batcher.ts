import type { AnyBulkWriteOperation, Collection, Document, Filter, UpdateFilter } from "mongodb";
import { isTransient } from "./mongo-guard.js";

interface Queued<T> {
  filter: Filter<T>;
  update: UpdateFilter<T>;
  settle: (error: unknown, matched?: boolean) => void;
}

/**
 * Group commit for one collection's single-document updates, the counterpart of
 * {@link InsertBatcher}. An update made while none is in flight is sent at once (alone:
 * as an `updateOne`); updates made meanwhile wait for it to end and then go together in
 * one unordered `bulkWrite`. On MongoDB that is one command for many; on the FerretDB this project
 * builds, also one SQLite transaction (deploy/tools/README.md, `update-batch.patch`):
 * measured there (`bench/trace-store-commands.ts`), 0.20–0.38 instead of 0.74–1.35 ms
 * of FerretDB CPU per update.
 *
 * Each caller learns whether its filter matched a document. A bulk reports only how
 * many matched: when that is all of them, each did; when fewer matched (a fenced write
 * whose epoch moved on, a document gone) or the server refused a statement, every update
 * of the batch is sent again alone to tell which. So an update given here must be idempotent
 * (`$set` of fixed values, no `$inc` or `$push`), and its caller must await it before
 * updating the same document again (the owning actor does: a document's later update
 * is never overwritten by an earlier one sent again). A failure of the whole command
 * without an answer (the connection lost, a timeout) rejects every caller of the batch,
 * as an `updateOne` that failed so would: whether it took effect is unknown either way.
 */
export class UpdateBatcher<T extends Document> {
  private queue: Queued<T>[] = [];
  /** Each batch in flight, by a number of its own: when it was sent, and the documents it updates. */
  private readonly inFlight = new Map<number, { sentMs: number; docs: Set<unknown> }>();
  private sent = 0;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly collection: Collection<T>,
    private readonly maxBatch = 64,
    /**
     * One batch is in flight at a time; another is sent beside it only once it has been
     * out for `stallMs` (a command that never answers, on a connection gone half-open: the
     * store sets no socket timeout), up to `maxInFlight`, so such a command holds back its
     * own callers, as an `updateOne` would, not every later update of the node. (Four
     * always in flight measured ~5 % slower: smaller batches.)
     */
    private readonly stallMs = 1_000,
    private readonly maxInFlight = 4,
  ) {}

  /** Updates the document `filter` names (at most one); resolves to whether one matched. */
  update(filter: Filter<T>, update: UpdateFilter<T>): Promise<boolean> {
    return new Promise<boolean>((resolve, reject) => {
      this.queue.push({ filter, update, settle: (error, matched) => (error === undefined ? resolve(matched === true) : reject(error)) });
      this.send();
    });
  }

  /** Sends what waits: when nothing is in flight, or beside batches that stalled. */
  private send(): void {
    while (this.queue.length > 0 && this.mayStart()) {
      const batch = this.take();
      if (batch.length === 0) break; // every waiting update is of a document a batch in flight holds
      const id = this.sent++;
      this.inFlight.set(id, { sentMs: performance.now(), docs: new Set(batch.map((q) => q.filter._id)) });
      void this.write(batch).finally(() => {
        this.inFlight.delete(id);
        this.send();
      });
    }
    if (this.queue.length > 0 && !this.timer && this.inFlight.size < this.maxInFlight) {
      // Looked at again when the oldest batch in flight would count as stalled.
      this.timer = setTimeout(() => {
        this.timer = undefined;
        this.send();
      }, this.stallMs);
      this.timer.unref();
    }
  }

  private mayStart(): boolean {
    if (this.inFlight.size === 0) return true;
    if (this.inFlight.size >= this.maxInFlight) return false;
    return performance.now() - Math.min(...[...this.inFlight.values()].map((b) => b.sentMs)) >= this.stallMs;
  }

  /**
   * The next batch, in queue order: at most one update of a document, and none of a
   * document a batch in flight holds (two flows of one actor, a cancel and a turn's end,
   * may both update a turn: a later update must not land before an earlier one that
   * stalled). The rest wait, in their order.
   */
  private take(): Queued<T>[] {
    const held = new Set<unknown>();
    for (const b of this.inFlight.values()) for (const doc of b.docs) held.add(doc);
    const batch: Queued<T>[] = [];
    const rest: Queued<T>[] = [];
    for (const q of this.queue) {
      const doc = q.filter._id;
      if (batch.length < this.maxBatch && !held.has(doc)) batch.push(q);
      else rest.push(q);
      held.add(doc);
    }
    this.queue = rest;
    return batch;
  }

  private async write(batch: Queued<T>[]): Promise<void> {
    if (batch.length > 1) {
      try {
        const ops: AnyBulkWriteOperation<T>[] = batch.map((q) => ({ updateOne: { filter: q.filter, update: q.update } }));
        const result = await this.collection.bulkWrite(ops, { ordered: false });
        if (result.matchedCount === batch.length) {
          for (const q of batch) q.settle(undefined, true);
          return;
        }
      } catch (err) {
        // No answer (the connection, a timeout): all failed, as each alone would have.
        // Anything else is one statement's (the server refused it: MongoDB reports them one
        // by one, FerretDB fails the command at the first; or the driver refused to send
        // one, e.g. a document over 16 MiB): told apart below, so it fails only its caller.
        if (isTransient(err)) {
          for (const q of batch) q.settle(err);
          return;
        }
      }
    }
    await Promise.all(batch.map((q) => this.writeAlone(q)));
  }

  private async writeAlone(q: Queued<T>): Promise<void> {
    try {
      const result = await this.collection.updateOne(q.filter, q.update);
      q.settle(undefined, result.matchedCount > 0);
    } catch (err) {
      q.settle(err);
    }
  }
}
