import { MongoServerError, type AnyBulkWriteOperation, type Collection, type Document, type Filter, type UpdateFilter } from "mongodb";

interface Queued<T> {
  filter: Filter<T>;
  update: UpdateFilter<T>;
  settle: (error: unknown, matched?: boolean) => void;
}

/**
 * Group commit for one collection's single-document updates, the counterpart of
 * {@link InsertBatcher}. An update made while none is in flight is sent at once as an
 * `updateOne`; updates made meanwhile wait for it and then go together in one unordered
 * `bulkWrite`. On MongoDB that is one command for many; on the FerretDB this project
 * builds, also one SQLite transaction (deploy/tools/README.md, `update-batch.patch`):
 * measured there, 0.35–0.47 instead of 0.99–1.07 ms of FerretDB CPU per update.
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
  private flushing = false;

  constructor(
    private readonly collection: Collection<T>,
    private readonly maxBatch = 64,
  ) {}

  /** Updates the document `filter` names (at most one); resolves to whether one matched. */
  update(filter: Filter<T>, update: UpdateFilter<T>): Promise<boolean> {
    return new Promise<boolean>((resolve, reject) => {
      this.queue.push({ filter, update, settle: (error, matched) => (error === undefined ? resolve(matched === true) : reject(error)) });
      if (!this.flushing) void this.flush();
    });
  }

  private async flush(): Promise<void> {
    this.flushing = true;
    try {
      while (this.queue.length > 0) await this.write(this.queue.splice(0, this.maxBatch));
    } finally {
      this.flushing = false;
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
        // The server answered but refused statements (MongoDB reports them one by one,
        // FerretDB fails the command at the first): told apart below, so a refused update
        // fails only its own caller. No answer (the connection, a timeout): all failed.
        if (!(err instanceof MongoServerError)) {
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
