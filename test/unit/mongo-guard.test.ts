import test from "ava";
import { MongoNetworkError, MongoServerError } from "mongodb";
import { guard, isDuplicateKey, StoreUnavailableError } from "../../src/mongo-guard.js";

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
