import anyTest, { type TestFn } from "ava";
import { MongoClient, type Collection } from "mongodb";
import { startTestServers, type TestServers } from "../helpers/servers.js";
import { UpdateBatcher } from "../../src/update-batcher.js";
import { FencedError, MongoStore, STORE_CLIENT_OPTIONS, type RunDoc } from "../../src/index.js";

interface Doc {
  _id: string;
  epoch: number;
  n: number;
  s?: string;
}
interface Context {
  servers: TestServers;
  client: MongoClient;
  /** update commands the driver sent, by collection, with their statement counts */
  updates: Map<string, number[]>;
}
const test = anyTest as TestFn<Context>;

test.before(async (t) => {
  const servers = await startTestServers();
  const client = new MongoClient(servers.mongoUri, { monitorCommands: true, maxPoolSize: 50 });
  await client.connect();
  const updates = new Map<string, number[]>();
  client.on("commandStarted", (e) => {
    if (e.commandName !== "update") return;
    const name = String(e.command.update);
    updates.set(name, [...(updates.get(name) ?? []), (e.command.updates as unknown[]).length]);
  });
  t.context = { servers, client, updates };
});

test.after.always(async (t) => {
  await t.context.client?.close();
  await t.context.servers?.stop();
});

async function seeded(t: { context: Context }, name: string, count: number): Promise<Collection<Doc>> {
  const c = t.context.client.db(t.context.servers.dbName).collection<Doc>(name);
  await c.insertMany(Array.from({ length: count }, (_, i) => ({ _id: `d${i}`, epoch: 1, n: 0 })));
  return c;
}

/** The real collection, with `methods` called through `wrap` (which may call the method, or not). */
function around<C extends object>(collection: C, methods: string[], wrap: (name: string, call: () => unknown) => unknown): C {
  return new Proxy(collection, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver);
      if (typeof prop !== "string" || !methods.includes(prop)) return value;
      return (...args: unknown[]) => wrap(prop, () => (value as (...a: unknown[]) => unknown).apply(target, args));
    },
  });
}

test("update-batcher - concurrent updates share commands, each caller learns it matched, every document holds its write", async (t) => {
  const c = await seeded(t, "batched", 300);
  const batcher = new UpdateBatcher(c);
  const matched = await Promise.all(Array.from({ length: 300 }, (_, i) => batcher.update({ _id: `d${i}`, epoch: 1 }, { $set: { n: i + 1, s: `v${i}` } })));
  t.deepEqual(matched, Array.from({ length: 300 }, () => true));
  const sent = t.context.updates.get("batched") ?? [];
  t.is(sent.reduce((a, b) => a + b, 0), 300, "each update sent once");
  t.true(sent.length >= 2 && sent.length <= 12, `300 concurrent updates took ${sent.length} update commands`);
  t.true(Math.max(...sent) <= 64, "at most 64 statements per command");
  for (const d of await c.find({}).toArray()) t.deepEqual([d.n, d.s], [Number(d._id.slice(1)) + 1, `v${d._id.slice(1)}`], d._id);
  // Alone, an update is sent at once, as one statement.
  t.true(await batcher.update({ _id: "d0" }, { $set: { n: -1 } }));
  t.deepEqual(t.context.updates.get("batched")!.slice(sent.length), [1]);
  t.false(await batcher.update({ _id: "absent" }, { $set: { n: -1 } }), "no document matched");
});

test("update-batcher - in a batch where some filters match nothing (a fence moved on, a document gone), each caller learns its own outcome", async (t) => {
  const c = await seeded(t, "fenced", 60);
  await c.updateMany({ _id: { $in: ["d7", "d21", "d40"] } }, { $set: { epoch: 2 } });
  await c.deleteOne({ _id: "d33" });
  const batcher = new UpdateBatcher(c);
  const before = t.context.updates.get("fenced")!.length;
  const matched = await Promise.all(Array.from({ length: 60 }, (_, i) => batcher.update({ _id: `d${i}`, epoch: 1 }, { $set: { n: 1 } })));
  t.deepEqual(matched.flatMap((m, i) => (m ? [] : [i])), [7, 21, 33, 40]);
  const sent = t.context.updates.get("fenced")!.slice(before);
  // The first goes alone, the other 59 wait for it and go as one; fewer of those having
  // matched, each is sent again alone.
  t.deepEqual(sent.slice(0, 2), [1, 59]);
  t.deepEqual(sent.slice(2), Array.from({ length: 59 }, () => 1));
  const docs = await c.find({}).sort({ _id: 1 }).toArray();
  t.is(docs.length, 59);
  for (const d of docs) t.is(d.n, ["d7", "d21", "d40"].includes(d._id) ? 0 : 1, d._id);
});

test("update-batcher - an update the server refuses fails only its own caller; the rest of its batch is written", async (t) => {
  const c = await seeded(t, "refused", 40);
  const batcher = new UpdateBatcher(c);
  const outcomes = await Promise.allSettled(
    Array.from({ length: 40 }, (_, i) =>
      // Changing `_id` is refused by every server.
      i === 13 ? batcher.update({ _id: `d${i}` }, { $set: { _id: "moved" } as never }) : batcher.update({ _id: `d${i}` }, { $set: { n: i } }),
    ),
  );
  t.deepEqual(outcomes.flatMap((o, i) => (o.status === "rejected" ? [i] : [])), [13]);
  t.true(outcomes.every((o, i) => i === 13 || (o.status === "fulfilled" && o.value === true)));
  for (const d of await c.find({}).toArray()) t.is(d.n, d._id === "d13" ? 0 : Number(d._id.slice(1)), d._id);
  t.is(await c.countDocuments({ _id: "moved" }), 0);
  // The batcher goes on.
  t.true(await batcher.update({ _id: "d13" }, { $set: { n: 99 } }));
});

test("update-batcher - no answer from the server fails every caller of the batch, without sending each again", async (t) => {
  const client = new MongoClient(t.context.servers.mongoUri, { serverSelectionTimeoutMS: 500 });
  await client.connect();
  const c = client.db(t.context.servers.dbName).collection<Doc>("unanswered");
  await c.insertMany(Array.from({ length: 10 }, (_, i) => ({ _id: `d${i}`, epoch: 1, n: 0 })));
  // The real collection, its calls counted.
  const calls = { bulkWrite: 0, updateOne: 0 };
  const counted = around(c, ["bulkWrite", "updateOne"], (name, call) => {
    calls[name as keyof typeof calls]++;
    return call();
  });
  const batcher = new UpdateBatcher(counted);
  await client.close();
  const outcomes = await Promise.allSettled(Array.from({ length: 10 }, (_, i) => batcher.update({ _id: `d${i}` }, { $set: { n: 1 } })));
  t.true(outcomes.every((o) => o.status === "rejected"));
  t.deepEqual(calls, { bulkWrite: 1, updateOne: 1 }, "one alone, then the other nine as one bulk, not again one by one");
  t.is(await t.context.client.db(t.context.servers.dbName).collection<Doc>("unanswered").countDocuments({ n: 1 }), 0);
});

test("update-batcher - an update the driver refuses to send fails only its own caller", async (t) => {
  const c = await seeded(t, "unsendable", 30);
  const batcher = new UpdateBatcher(c);
  const outcomes = await Promise.allSettled(
    Array.from({ length: 30 }, (_, i) =>
      // A field name holding a NUL byte cannot be written as BSON: refused before anything is sent.
      i === 20 ? batcher.update({ _id: `d${i}` }, { $set: { "bad\u0000name": 1 } as never }) : batcher.update({ _id: `d${i}` }, { $set: { n: i } }),
    ),
  );
  t.deepEqual(outcomes.flatMap((o, i) => (o.status === "rejected" ? [i] : [])), [20]);
  for (const d of await c.find({}).toArray()) t.is(d.n, d._id === "d20" ? 0 : Number(d._id.slice(1)), d._id);
});

test("store - fenced writes of runs and turns share commands on this store and still tell a stale epoch", async (t) => {
  const client = new MongoClient(t.context.servers.mongoUri, { monitorCommands: true, ...STORE_CLIENT_OPTIONS });
  const runsSent: number[] = [];
  client.on("commandStarted", (e) => {
    if (e.commandName === "update" && e.command.update === "runs") runsSent.push((e.command.updates as unknown[]).length);
  });
  const store = await MongoStore.over(client, "store_batched");
  try {
    const raw = t.context.client.db("store_batched").collection<Pick<RunDoc, "_id" | "epoch" | "state">>("runs");
    await raw.insertMany(Array.from({ length: 40 }, (_, i) => ({ _id: `run_${i}`, epoch: i === 25 ? 3 : 2, state: "busy" as RunDoc["state"] })));
    const outcomes = await Promise.allSettled(Array.from({ length: 40 }, (_, i) => store.updateRunFenced(`run_${i}`, 2, { state: "idle" as RunDoc["state"] })));
    t.deepEqual(outcomes.flatMap((o, i) => (o.status === "rejected" ? [i] : [])), [25]);
    t.true((outcomes[25] as PromiseRejectedResult).reason instanceof FencedError);
    t.true(runsSent.some((n) => n > 1), `update commands: ${runsSent.join(",")}`);
    t.is(await raw.countDocuments({ state: "idle" }), 39);
    t.is((await raw.findOne({ _id: "run_25" }))?.state, "busy", "the stale write changed nothing");
  } finally {
    await store.close();
  }
});

test("store - told the store does not commit bulks together (stock FerretDB), its updates go one by one", async (t) => {
  const client = new MongoClient(t.context.servers.mongoUri, { monitorCommands: true, ...STORE_CLIENT_OPTIONS });
  const sent: number[] = [];
  client.on("commandStarted", (e) => {
    if (e.commandName === "update" && e.command.update === "runs") sent.push((e.command.updates as unknown[]).length);
  });
  const store = await MongoStore.over(client, "store_single", { batchUpdates: false });
  try {
    const raw = t.context.client.db("store_single").collection<Pick<RunDoc, "_id" | "epoch" | "state">>("runs");
    await raw.insertMany(Array.from({ length: 20 }, (_, i) => ({ _id: `run_${i}`, epoch: 2, state: "busy" as RunDoc["state"] })));
    await Promise.all(Array.from({ length: 20 }, (_, i) => store.updateRunFenced(`run_${i}`, 2, { state: "idle" as RunDoc["state"] })));
    t.deepEqual(sent, Array.from({ length: 20 }, () => 1));
    t.is(await raw.countDocuments({ state: "idle" }), 20);
  } finally {
    await store.close();
  }
});

test("update-batcher - a command that does not answer holds back its own callers only: after the stall time the next batch goes beside it", async (t) => {
  const c = await seeded(t, "stalled", 12);
  // The real collection, but its first updateOne never answers (a connection gone half-open).
  let first = true;
  const stalling = around(c, ["updateOne"], (_name, call) => {
    if (!first) return call();
    first = false;
    return new Promise(() => undefined);
  });
  const batcher = new UpdateBatcher(stalling, 64, 200);
  const hung = batcher.update({ _id: "d0" }, { $set: { n: 1 } });
  const startedMs = performance.now();
  const others = await Promise.all(Array.from({ length: 11 }, (_, i) => batcher.update({ _id: `d${i + 1}` }, { $set: { n: 1 } })));
  const waitedMs = performance.now() - startedMs;
  t.deepEqual(others, Array.from({ length: 11 }, () => true));
  t.true(waitedMs >= 190 && waitedMs < 5_000, `the others went after ${waitedMs.toFixed(0)} ms`);
  t.is(await c.countDocuments({ n: 1 }), 11);
  t.is(await Promise.race([hung.then(() => "answered"), new Promise((resolve) => setTimeout(() => resolve("still waiting"), 50))]), "still waiting");
});

test("update-batcher - an update of a document whose earlier update stalled waits for it, even past the stall time; two updates of one document never share a batch", async (t) => {
  const c = await seeded(t, "ordered", 3);
  // The first updateOne (d0 := 1) answers only after 600 ms, three stall times.
  let first = true;
  const sent: string[] = [];
  const slow = around(c, ["updateOne", "bulkWrite"], (name, call) => {
    sent.push(name);
    if (name !== "updateOne" || !first) return call();
    first = false;
    return new Promise((resolve) => setTimeout(resolve, 600)).then(call);
  });
  const batcher = new UpdateBatcher(slow, 64, 200);
  const earlier = batcher.update({ _id: "d0" }, { $set: { n: 1 } });
  await new Promise((resolve) => setImmediate(resolve));
  const later = [batcher.update({ _id: "d0" }, { $set: { n: 2 } }), batcher.update({ _id: "d1" }, { $set: { n: 2 } }), batcher.update({ _id: "d0" }, { $set: { n: 3 } })];
  // d1 goes beside the stalled batch after the stall time; d0's updates wait for it, one by one.
  const d1 = await later[1];
  t.true(d1);
  t.is((await c.findOne({ _id: "d1" }))?.n, 2);
  t.deepEqual(await Promise.all([earlier, later[0], later[2]]), [true, true, true]);
  t.is((await c.findOne({ _id: "d0" }))?.n, 3, "the last update of d0 is the one it holds");
  t.deepEqual(sent, ["updateOne", "updateOne", "updateOne", "updateOne"], "no batch held two updates of d0");
});
