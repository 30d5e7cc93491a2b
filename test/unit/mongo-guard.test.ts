import test from "ava";
import { BSON, MongoBulkWriteError, MongoDriverError, MongoServerSelectionError, MongoNetworkError, MongoNotConnectedError, MongoOperationTimeoutError, MongoServerClosedError, MongoServerError, MongoTopologyClosedError } from "mongodb";
import { guard, isDuplicateKey, isTransient, StoreUnavailableError } from "../../src/mongo-guard.js";

const fails = (err: unknown) => guard(async () => Promise.reject(err));

test("mongo guard - socket failures become StoreUnavailableError (503), also when the driver lets a plain Node error through", async (t) => {
  const epipe = Object.assign(new Error("write EPIPE"), { code: "EPIPE", errno: -32, syscall: "write" });
  for (const err of [epipe, Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" }), new MongoNetworkError("connection closed")]) {
    const thrown = await fails(err).catch((e: unknown) => e);
    t.true(thrown instanceof StoreUnavailableError, String(err));
    t.is((thrown as Error).cause, err);
  }
});

test("mongo guard - other failures pass through unchanged: a bug is not a 503", async (t) => {
  const refused = new MongoServerError({ message: "E11000 duplicate key", code: 11000 });
  for (const err of [new Error("bad"), Object.assign(new Error("no such file"), { code: "ENOENT" }), new TypeError("x is undefined"), refused]) {
    t.is(await fails(err).catch((e: unknown) => e), err);
  }
  t.true(isDuplicateKey(refused));
  t.is(await guard(async () => 7), 7);
});

test("mongo guard - a store away or saturated is transient, whatever the driver names it; a refused request is not", (t) => {
  // Shaped as the driver's own subclasses it does not export: a cleared pool (a network error renamed) and a full wait queue.
  class MongoPoolClearedError extends MongoNetworkError {
    override get name(): string {
      return "MongoPoolClearedError";
    }
  }
  class MongoWaitQueueTimeoutError extends MongoDriverError {
    override get name(): string {
      return "MongoWaitQueueTimeoutError";
    }
  }
  const poolCleared = new MongoPoolClearedError("pool cleared");
  const waitQueue = new MongoWaitQueueTimeoutError("timed out waiting for a connection");
  for (const err of [poolCleared, waitQueue, new MongoServerClosedError(), new MongoOperationTimeoutError("timed out"), new MongoTopologyClosedError(), new MongoNotConnectedError("not connected")]) {
    t.true(isTransient(err), err.name);
  }
  for (const err of [new MongoServerError({ message: "immutable field _id", code: 66 }), new MongoDriverError("bad argument"), new Error("bad")]) {
    t.false(isTransient(err), err.message);
  }
});

test("mongo guard - a bulk write that failed as a whole (its command's connection timed out) is transient, a 503; one whose documents were refused is not", async (t) => {
  const whole = new MongoBulkWriteError(new MongoNetworkError("connection <monitor> to 127.0.0.1:27017 timed out"), {} as never);
  t.true(isTransient(whole));
  // Whatever transient failure it wraps (found by a review: server selection and timeouts carry no network fields).
  for (const inner of [new MongoServerSelectionError("Server selection timed out after 30000 ms", {} as never), new MongoOperationTimeoutError("timed out"), new MongoNotConnectedError("not connected")]) {
    t.true(isTransient(new MongoBulkWriteError(inner, {} as never)), inner.name);
  }
  t.true((await fails(whole).catch((e: unknown) => e)) instanceof StoreUnavailableError);
  const refused = new MongoBulkWriteError({ message: "E11000", code: 11000, writeErrors: [{ index: 0, code: 11000, errmsg: "E11000 duplicate key" }] as never }, {} as never);
  t.false(isTransient(refused));
  // Refused by the driver before it was sent (a field name BSON cannot hold): the caller's own fault.
  t.false(isTransient(new MongoBulkWriteError(new BSON.BSONError("key must not contain a null character"), {} as never)));
  t.is(await fails(refused).catch((e: unknown) => e), refused);
});
