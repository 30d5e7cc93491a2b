/**
 * The MongoDB driver's failures, translated once for every adapter over the store:
 * transient ones become {@link StoreUnavailableError} (answered 503), a unique index's
 * refusal is recognised, and an insert can be "once".
 */
import { type Collection, type Document, type Filter, MongoBulkWriteError, MongoError, MongoNetworkError } from "mongodb";
import { bulkWriteErrors, type InsertBatcher } from "./insert-batcher.js";

/** The store could not be reached or answered with a transient failure. */
export class StoreUnavailableError extends Error {
  constructor(cause: unknown) {
    super("store unavailable", { cause });
    this.name = "StoreUnavailableError";
  }
}

const DUPLICATE_KEY = 11000;

/**
 * A unique index refused an insert. MongoDB and FerretDB both send code 11000, for a
 * single insert and for each refused document of a batch (checked on FerretDB 1.24);
 * the insert batcher keeps that code on the error it gives each caller.
 */
export function isDuplicateKey(err: unknown): boolean {
  return err instanceof MongoError && err.code === DUPLICATE_KEY;
}

/**
 * Socket failures the driver can let through as plain Node errors (seen: EPIPE when
 * FerretDB was killed mid-write), not as MongoNetworkError.
 */
const NETWORK_CODES = new Set(["EPIPE", "ECONNRESET", "ECONNREFUSED", "ECONNABORTED", "ETIMEDOUT", "EHOSTUNREACH", "ENETUNREACH", "ENOTCONN"]);

/** Driver errors that mean "try again later" rather than "your request is wrong". */
export function isTransient(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  if (err instanceof Error && !(err instanceof MongoError) && typeof code === "string") return NETWORK_CODES.has(code);
  if (!(err instanceof MongoError)) return false;
  // Network errors by class: the driver renames some (a pool cleared after a network error
  // is a MongoNetworkError named MongoPoolClearedError).
  if (err instanceof MongoNetworkError) return true;
  // A bulk write whose command failed as a whole: the driver wraps what failed (a connection
  // that timed out, a server it could not select, a bulk it refused to send) and keeps it
  // as `errorResponse`; that decides. Taken by the wrapper's class, every start batched with
  // others while the store was stopped answered 500 (found by a probe).
  if (err instanceof MongoBulkWriteError && bulkWriteErrors(err).length === 0 && !err.writeConcernError && err.errorResponse instanceof Error && err.errorResponse !== err) {
    if (isTransient(err.errorResponse)) return true;
  }
  return TRANSIENT_NAMES.has(err.name) || (typeof err.hasErrorLabel === "function" && err.hasErrorLabel("RetryableWriteError"));
}

/** Driver errors of a store that is away or saturated, not of a bad request (some classes are not exported). */
const TRANSIENT_NAMES = new Set([
  "MongoServerSelectionError",
  "MongoTopologyClosedError",
  "MongoNotConnectedError",
  "MongoServerClosedError",
  "MongoOperationTimeoutError",
  "MongoWaitQueueTimeoutError",
]);

/**
 * Translates driver failures once: transient ones become StoreUnavailableError. Every
 * adapter over the store (documents, files, environment values) goes through it.
 */
export async function guard<T>(work: () => Promise<T>): Promise<T> {
  try {
    return await work();
  } catch (err) {
    if (isTransient(err)) throw new StoreUnavailableError(err);
    throw err;
  }
}

/** Inserts `doc` unless a unique index refuses it; false when it did. */
export async function insertOnce<T extends Document>(inserts: InsertBatcher<T>, doc: T): Promise<boolean> {
  try {
    await guard(() => inserts.insert(doc));
    return true;
  } catch (err) {
    if (isDuplicateKey(err)) return false;
    throw err;
  }
}

/** How many `_id` look-ups {@link findEachById} has in flight at once. */
const BY_ID_AT_ONCE = 16;

/**
 * The documents of `ids` (each once, absent ones left out) that also match `also`, each
 * looked up by its `_id`: FerretDB on SQLite answers `_id: {$in: [...]}` by reading the
 * whole collection (or, beside another indexed condition, all of that condition's rows),
 * while an `_id` equality seeks its index. At most 16 look-ups at a time.
 */
export async function findEachById<T extends Document & { _id: string }>(collection: Collection<T>, ids: readonly string[], also: Filter<T> = {}): Promise<T[]> {
  const unique = [...new Set(ids)];
  const found: T[] = [];
  for (let i = 0; i < unique.length; i += BY_ID_AT_ONCE) {
    const docs = await Promise.all(unique.slice(i, i + BY_ID_AT_ONCE).map((id) => guard(() => collection.findOne({ ...also, _id: id } as Filter<T>))));
    for (const doc of docs) if (doc) found.push(doc as T);
  }
  return found;
}

/**
 * The conditions of a page in (created_at, _id) order, newest first, after `after` (the last
 * of the page before): keyset paging. The bounds on created_at (a number) and _id (a string)
 * match every document; they state the sort keys' types, which lets the embedded store order
 * the rows from an index on (…, created_at, _id) and read only the page (as the runs list
 * does, src/run-list.ts); without such an index (the webhook list: at most 50) the store
 * still sorts in memory. Spread beside the list's equalities: it sets `created_at`, `_id`
 * and `$or`, so a list with conditions of its own on those cannot use it.
 */
export function newestFirst(after?: { createdAt: number; id: string }): Document {
  return {
    created_at: { $gte: Number.MIN_SAFE_INTEGER, $lte: after ? after.createdAt : Number.MAX_SAFE_INTEGER },
    _id: { $gte: "" },
    ...(after ? olderThan(after.createdAt, after.id) : {}),
  };
}

/** Documents before (createdAt, id) in (created_at, _id) order: an `$or` to spread into a filter. */
export function olderThan(createdAt: number, id: string): { $or: Document[] } {
  return { $or: [{ created_at: { $lt: createdAt } }, { created_at: createdAt, _id: { $lt: id } }] };
}

/** Documents one sweep step removes at most (see {@link deleteOldest}). */
export const SWEEP_BATCH = 1_000;

/** Bounds of one sweep of a collection: steps, and time (a step is begun only within it). */
export interface SweepBounds {
  maxSteps: number;
  budgetMs: number;
}

/** 1,000 steps within 10 s: a backlog of a million clears in one sweep when the store keeps up. */
export const SWEEP_BOUNDS: SweepBounds = { maxSteps: 1_000, budgetMs: 10_000 };

/**
 * Runs `step` while it reports a full batch, within `bounds` (the first step always runs);
 * what the steps removed, summed. The bounded deletes' one loop.
 */
export async function inSteps(bounds: SweepBounds, step: () => Promise<{ removed: number; full: boolean }>): Promise<number> {
  const until = Date.now() + bounds.budgetMs;
  let removed = 0;
  for (let n = 0; n < bounds.maxSteps && (n === 0 || Date.now() < until); n++) {
    const done = await step();
    removed += done.removed;
    if (!done.full) break;
  }
  return removed;
}

/**
 * Removes the documents whose `field` (a number, indexed) is below `before`, oldest first,
 * in steps of at most {@link SWEEP_BATCH} (plus documents tied with a step's last), while
 * steps come back full and within `bounds`; how many were removed. Never one `deleteMany`
 * over everything that is due: FerretDB reads all the matches and deletes them in one SQL
 * statement with a bound variable each (SQLite takes at most 32,766, so a larger backlog
 * failed at every sweep), holding its one writer meanwhile. Each step is an index range:
 * the `field` of the step's last document bounds its delete. Both ends are given: the
 * embedded store serves a sort from an index only for a number range bounded on both
 * sides (10x faster at 20,000 due; else it reads every due document at each step).
 */
export function deleteOldest<T extends Document>(collection: Collection<T>, field: string, before: number, bounds: SweepBounds = SWEEP_BOUNDS): Promise<number> {
  const due = { $gte: Number.MIN_SAFE_INTEGER, $lt: before };
  return inSteps(bounds, async () => {
    const oldest = await guard(() => collection.find({ [field]: due } as Filter<T>, { projection: { [field]: 1 } }).sort({ [field]: 1 }).limit(SWEEP_BATCH).toArray());
    if (oldest.length === 0) return { removed: 0, full: false };
    const full = oldest.length === SWEEP_BATCH;
    const last = Number((oldest[oldest.length - 1] as Record<string, unknown>)[field]);
    const bound = full ? { ...due, $lte: last } : due;
    return { removed: (await guard(() => collection.deleteMany({ [field]: bound } as Filter<T>))).deletedCount, full };
  });
}
