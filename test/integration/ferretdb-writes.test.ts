import anyTest, { type TestFn } from "ava";
import { MongoClient } from "mongodb";
import { startTestServers, type TestServers } from "../helpers/servers.js";

/**
 * The build's FerretDB patch deploy/tools/ferretdb/write-queue.patch makes FerretDB's
 * SQLite transactions (every insert and update command) take turns in FerretDB instead
 * of retrying SQLite's write lock from its busy handler. These tests hold on MongoDB too:
 * concurrent writers from several clients (several nodes' pools) all land, and writers
 * whose client leaves while they wait hold up nobody. The first test also guards the
 * patch's own hazard: a transaction that waited for a pooled connection while holding
 * its turn stopped every writer for good (update commands keep their query's connection
 * until they end); a first version of the patch did, and failed it.
 */

interface Context {
  servers: TestServers;
  clients: MongoClient[];
}
const test = anyTest as TestFn<Context>;

test.before(async (t) => {
  const servers = await startTestServers();
  const clients = [0, 1, 2].map(() => new MongoClient(servers.mongoUri, { maxPoolSize: 64 }));
  await Promise.all(clients.map((c) => c.connect()));
  t.context = { servers, clients };
});

test.after.always(async (t) => {
  await Promise.all((t.context.clients ?? []).map((c) => c.close()));
  await t.context.servers?.stop();
});

test("concurrent inserts and updates from three clients all land, each document holding its last write", async (t) => {
  const { clients } = t.context;
  const db = (i: number) => clients[i]!.db("writes").collection<{ _id: string; n: number; by: number }>("docs");
  await db(0).insertMany(Array.from({ length: 150 }, (_, i) => ({ _id: `u${i}`, n: 0, by: -1 })));
  const writes: Promise<unknown>[] = [];
  for (let c = 0; c < 3; c++) {
    // Each client: 50 documents updated five times in a row (192 commands in flight across
    // the clients at a time) while 40 new documents are inserted beside them.
    for (let i = 0; i < 50; i++) {
      const id = `u${c * 50 + i}`;
      writes.push((async () => {
        for (let n = 1; n <= 5; n++) {
          const r = await db(c).updateOne({ _id: id }, { $set: { n, by: c } });
          if (r.matchedCount !== 1 || r.modifiedCount !== 1) throw new Error(`update ${id} #${n}: matched ${r.matchedCount}`);
        }
      })());
    }
    for (let i = 0; i < 40; i++) writes.push(db(c).insertOne({ _id: `i${c}_${i}`, n: i, by: c }));
  }
  const results = await Promise.allSettled(writes);
  const failed = results.filter((r): r is PromiseRejectedResult => r.status === "rejected");
  t.deepEqual(failed.map((r) => String(r.reason)), []);
  const docs = await db(1).find({}).toArray();
  t.is(docs.length, 150 + 120);
  for (const d of docs) {
    if (d._id.startsWith("u")) t.deepEqual([d.n, d.by], [5, Math.floor(Number(d._id.slice(1)) / 50)], d._id);
    else t.deepEqual([d.n, d.by], [Number(d._id.split("_")[1]), Number(d._id.slice(1).split("_")[0])], d._id);
  }
});

test("writers whose client leaves while they wait their turn hold up nobody", async (t) => {
  const { clients, servers } = t.context;
  const coll = (c: MongoClient) => c.db("writes").collection<{ _id: string; n: number }>("leaving");
  await coll(clients[0]!).insertMany(Array.from({ length: 60 }, (_, i) => ({ _id: `d${i}`, n: 0 })));
  // A fourth client queues 100 inserts and closes its connections at once, mid-queue,
  // while the three others update 60 documents.
  const leaving = new MongoClient(servers.mongoUri, { maxPoolSize: 64 });
  await leaving.connect();
  const abandoned = Array.from({ length: 100 }, (_, i) => coll(leaving).insertOne({ _id: `x${i}`, n: 2 }).then(() => "landed", () => "failed"));
  const patient = Array.from({ length: 60 }, (_, i) => coll(clients[i % 3]!).updateOne({ _id: `d${i}` }, { $set: { n: 1 } }));
  await leaving.close(true);
  t.true((await Promise.all(patient)).every((r) => r.modifiedCount === 1));
  const outcomes = await Promise.all(abandoned);
  t.is(outcomes.length, 100);
  t.true((await coll(clients[2]!).countDocuments({ _id: { $regex: /^x/ } })) <= 100);
  // The queue is free: one more write from each remaining client lands.
  for (let c = 0; c < 3; c++) t.is((await coll(clients[c]!).updateOne({ _id: "d0" }, { $set: { n: 10 + c } })).modifiedCount, 1);
});
