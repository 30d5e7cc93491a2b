import { MongoBulkWriteError, MongoServerError, type Collection, type Document, type OptionalUnlessRequiredId, type WriteError } from "mongodb";

interface Queued<T> {
  doc: T;
  settle: (error?: unknown) => void;
}

/**
 * Group commit for one collection's inserts. An insert made while none is in flight is
 * sent at once; inserts made meanwhile wait for it and then go together in one unordered
 * `insertMany`. Under load, one command (and on FerretDB one SQLite transaction) then
 * carries many documents; alone, an insert costs what `insertOne` costs.
 *
 * Each caller learns the fate of its own document: a document refused by a unique index
 * rejects with a duplicate-key `MongoServerError` (code 11000) while the others of the
 * batch are stored; a failure of the whole command rejects every caller of the batch.
 */
export class InsertBatcher<T extends Document> {
  private queue: Queued<T>[] = [];
  private flushing = false;

  constructor(
    private readonly collection: Collection<T>,
    private readonly maxBatch = 256,
  ) {}

  insert(doc: T): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.queue.push({ doc, settle: (error) => (error === undefined ? resolve() : reject(error)) });
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
    if (batch.length === 1) {
      const [only] = batch as [Queued<T>];
      try {
        await this.collection.insertOne(only.doc as OptionalUnlessRequiredId<T>);
        only.settle();
      } catch (err) {
        only.settle(err);
      }
      return;
    }
    try {
      await this.collection.insertMany(
        batch.map((q) => q.doc as OptionalUnlessRequiredId<T>),
        { ordered: false },
      );
      for (const q of batch) q.settle();
    } catch (err) {
      const refused = refusedDocuments(err);
      if (!refused) {
        for (const q of batch) q.settle(err);
        return;
      }
      batch.forEach((q, i) => q.settle(refused.get(i)));
    }
  }
}

/**
 * The documents of an unordered insertMany that the server refused, by index, each as
 * the error its own insertOne would have raised; undefined when the command failed as a
 * whole (nothing says which documents were stored).
 */
function refusedDocuments(err: unknown): Map<number, MongoServerError> | undefined {
  if (!(err instanceof MongoBulkWriteError)) return undefined;
  const writeErrors = bulkWriteErrors(err);
  if (writeErrors.length === 0 || err.writeConcernError) return undefined;
  const refused = new Map<number, MongoServerError>();
  for (const we of writeErrors) {
    refused.set(we.index, new MongoServerError({ message: we.errmsg ?? "write error", errmsg: we.errmsg, code: we.code }));
  }
  return refused;
}

/** A bulk write's per-document errors (the driver gives one error unwrapped); none when its command failed as a whole. */
export function bulkWriteErrors(err: MongoBulkWriteError): readonly WriteError[] {
  const writeErrors: WriteError | readonly WriteError[] | undefined = err.writeErrors;
  if (Array.isArray(writeErrors)) return writeErrors;
  return writeErrors ? [writeErrors as WriteError] : [];
}
