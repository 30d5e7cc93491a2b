import type { AnyBulkWriteOperation, Collection, Document, Filter, UpdateFilter } from "mongodb";
import { isTransient } from "./mongo-guard.js";

interface Queued<T> {
  filter: Filter<T>;
  update: UpdateFilter<T>;
  settle: (error: unknown, matched?: boolean) => void;
}

/**
 * Group commit for one collection's single-document updates, the counterpart of
 * {@link InsertBatcher}. An update made while fewer than `maxInFlight` batches are out
 * is sent at once (alone: as an `updateOne`); updates made meanwhile wait for one to end
 * and then go together in one unordered `bulkWrite`. On MongoDB that is one command for many; on the FerretDB this project
 * builds, also one SQLite transaction (deploy/tools/README.md, `update-batch.patch`):
 * measured there, 0.35–0.47 instead of 0.83–1.11 ms of FerretDB CPU per update
 * (`bench/trace-store-commands.ts`).
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
  private inFlight = 0;

  constructor(
    private readonly collection: Collection<T>,
    private readonly maxBatch = 64,
    /**
     * Batches in flight at most (a batch whose updates are sent again alone has them out
     * at once). More than one, so that a command that never answers (a connection gone
     * half-open: the store sets no socket timeout) holds back its own callers, as an
     * `updateOne` would, and not every later update of the node; all of them would take
     * that many such commands at once.
     */
    private readonly maxInFlight = 4,
  ) {}

  /** Updates the document `filter` names (at most one); resolves to whether one matched. */
  update(filter: Filter<T>, update: UpdateFilter<T>): Promise<boolean> {
    return new Promise<boolean>((resolve, reject) => {
      this.queue.push({ filter, update, settle: (error, matched) => (error === undefined ? resolve(matched === true) : reject(error)) });
      this.send();
    });
  }

  /** Sends what waits, while fewer than `maxInFlight` commands are out; each one's end sends on. */
  private send(): void {
    while (this.queue.length > 0 && this.inFlight < this.maxInFlight) {
      this.inFlight++;
      void this.write(this.queue.splice(0, this.maxBatch)).finally(() => {
        this.inFlight--;
        this.send();
      });
    }
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
