import { readFile } from "node:fs/promises";
import { ferretDbEnv } from "../../node/servers.js";
import { withStoreClients } from "../helpers/store-clients.js";

/**
 * The build's FerretDB patch deploy/tools/ferretdb/write-queue.patch makes FerretDB's
 * SQLite writes (the transaction of every insert and update command, deletes, DDL) take
 * turns in FerretDB instead of retrying SQLite's write lock from its busy handler. These
 * tests hold on MongoDB too: concurrent writers from several clients (several nodes'
 * pools) all land, with deletes and DDL among them. The first test guards the patch's own hazard, met by an earlier
 * version: a transaction waiting for a pooled connection while holding its turn stopped
 * every writer for good (update commands keep their query's connection until they end).
 * Commands with time limits: ferretdb-time-limits.test.ts (a FerretDB of their own).
 */

const test = withStoreClients();

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

test("deletes and new collections and indexes made during a burst of writes all land", async (t) => {
  const { clients } = t.context;
  const db = (i: number) => clients[i]!.db("writes");
  const burst = (i: number) => db(i).collection<{ _id: string; n: number }>("burst");
  await burst(0).insertMany(Array.from({ length: 120 }, (_, i) => ({ _id: `b${i}`, n: 0 })));
  const updates = Array.from({ length: 120 }, (_, i) => burst(i % 3).updateOne({ _id: `b${i}` }, { $set: { n: 1 } }));
  // Statements outside transactions (deletes, DDL) meet the same write lock.
  const side = [
    ...Array.from({ length: 6 }, (_, i) => db(i % 3).collection(`fresh${i}`).insertOne({ n: i })),
    ...Array.from({ length: 3 }, (_, i) => burst(i).createIndex({ n: 1, [`k${i}`]: 1 }, { name: `burst_${i}` })),
    ...Array.from({ length: 20 }, (_, i) => burst(i % 3).deleteOne({ _id: `b${100 + i}` })),
  ];
  const results = await Promise.allSettled([...updates, ...side]);
  t.deepEqual(results.filter((r) => r.status === "rejected").map((r) => String((r as PromiseRejectedResult).reason)), []);
  t.is(await burst(1).countDocuments({}), 100);
  t.is(await burst(1).countDocuments({ n: 1 }), 100);
  for (let i = 0; i < 6; i++) t.is(await db(2).collection(`fresh${i}`).countDocuments({}), 1);
  const names = (await burst(0).indexes()).map((x) => x.name);
  for (let i = 0; i < 3; i++) t.true(names.includes(`burst_${i}`), names.join(","));
});

/**
 * deploy/tools/ferretdb/update-batch.patch: the one-document statements of an `update`
 * command (a bulk of `updateOne`s naming `_id`) are written in one transaction when the
 * command ends. What a statement reads must still include what the statements before it
 * wrote, as it does unbatched (and on MongoDB).
 */
test("a bulk's statements each see what the statements before them wrote (same document, a fence, a multi-update)", async (t) => {
  const c = t.context.clients[0]!.db("writes").collection<{ _id: string; epoch?: number; n?: number; stale?: boolean; g?: number; h?: number }>("bulk_order");
  await c.insertMany([{ _id: "a", epoch: 1, n: 0 }, { _id: "b", n: 0 }, { _id: "c", n: 0 }]);
  const r = await c.bulkWrite(
    [
      { updateOne: { filter: { _id: "a", epoch: 1 }, update: { $set: { epoch: 2 } } } },
      // Fenced on the epoch the first statement moved on: matches nothing.
      { updateOne: { filter: { _id: "a", epoch: 1 }, update: { $set: { stale: true } } } },
      { updateOne: { filter: { _id: "a", epoch: 2 }, update: { $set: { n: 5 } } } },
      { updateOne: { filter: { _id: "b" }, update: { $set: { g: 1 } } } },
      // A statement of many documents reads after the ones before it were written.
      { updateMany: { filter: { g: 1 }, update: { $set: { h: 1 } } } },
      { updateOne: { filter: { _id: "c", h: 1 }, update: { $set: { n: 9 } } } },
    ],
    { ordered: true },
  );
  t.is(r.matchedCount, 4);
  t.deepEqual(await c.find({}).sort({ _id: 1 }).toArray(), [
    { _id: "a", epoch: 2, n: 5 },
    { _id: "b", n: 0, g: 1, h: 1 },
    { _id: "c", n: 0 },
  ]);
});

test("a statement refused in the middle of a bulk leaves the statements before it written", async (t) => {
  const c = t.context.clients[1]!.db("writes").collection<{ _id: string; n: number }>("bulk_refused");
  await c.insertMany([{ _id: "a", n: 0 }, { _id: "b", n: 0 }, { _id: "c", n: 0 }]);
  const failed = await t.throwsAsync(
    c.bulkWrite(
      [
        { updateOne: { filter: { _id: "a" }, update: { $set: { n: 1 } } } },
        { updateOne: { filter: { _id: "b" }, update: { $set: { _id: "moved" } as never } } },
        { updateOne: { filter: { _id: "c" }, update: { $set: { n: 3 } } } },
      ],
      { ordered: true },
    ),
  );
  t.truthy(failed);
  t.deepEqual(await c.find({}).sort({ _id: 1 }).toArray(), [{ _id: "a", n: 1 }, { _id: "b", n: 0 }, { _id: "c", n: 0 }]);
});

test("bulks of 200 updates, four in flight from each of three clients, all land", async (t) => {
  const { clients } = t.context;
  const db = (i: number) => clients[i]!.db("writes").collection<{ _id: string; n: number; by: number }>("bulk_many");
  await db(0).insertMany(Array.from({ length: 2400 }, (_, i) => ({ _id: `m${i}`, n: 0, by: -1 })));
  // Stock FerretDB held a pooled connection per statement until the command ended: 12
  // bulks of 200 wanted 2,400 of its 100 connections at once.
  const bulks = Array.from({ length: 12 }, (_, b) =>
    db(b % 3).bulkWrite(
      Array.from({ length: 200 }, (_, j) => ({ updateOne: { filter: { _id: `m${b * 200 + j}` }, update: { $set: { n: j + 1, by: b } } } })),
      { ordered: false },
    ),
  );
  const results = await Promise.all(bulks);
  t.deepEqual(results.map((r) => r.matchedCount), Array.from({ length: 12 }, () => 200));
  const docs = await db(1).find({}).toArray();
  t.is(docs.filter((d) => d.by === Math.floor(Number(d._id.slice(1)) / 200) && d.n === (Number(d._id.slice(1)) % 200) + 1).length, 2400);
});

test("the build's FerretDB says its bulk updates commit together (the store batches its updates on it)", async (t) => {
  const info = await t.context.clients[0]!.db("admin").command({ buildInfo: 1 });
  if (typeof info.ferretdbVersion !== "string") return t.pass("MongoDB: bulk updates are one command there anyway");
  t.is(info.ferretdbFeatures?.updateBatch, true);
});

test("the FerretDB the servers start runs with the Go settings node/servers.ts gives it", async (t) => {
  if (!t.context.servers.ferret.pid) return t.pass("an external store (RUNS_TEST_MONGODB_URI): no FerretDB started");
  const environ = (await readFile(`/proc/${t.context.servers.ferret.pid}/environ`, "utf8")).split("\0");
  const expected = ferretDbEnv(process.env);
  const got = environ.filter((entry) => /^(GOGC|GOMEMLIMIT|GOMAXPROCS)=/.test(entry)).sort();
  t.deepEqual(got, [`GOGC=${expected.GOGC}`, `GOMAXPROCS=${expected.GOMAXPROCS}`, `GOMEMLIMIT=${expected.GOMEMLIMIT}`]);
});
