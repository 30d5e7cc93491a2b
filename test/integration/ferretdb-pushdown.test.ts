import anyTest, { type TestFn } from "ava";
import { BSON, MongoClient, ObjectId, type Collection, type Document, type Filter, type Sort } from "mongodb";
import { startTestServers, type TestServers } from "../helpers/servers.js";
import { seededRandom } from "../../scripts/seeded-random.js";

/**
 * The build's FerretDB patch (deploy/tools/ferretdb/typed-pushdown.patch) lets SQLite's
 * indexes narrow and order rows. It must never change an answer: every query below
 * is compared with the same query wrapped in `$and`, which the patch does not push
 * down (FerretDB then filters and sorts every row in Go, as it did before the patch).
 * The documents mix every type the pushdown must be careful with: arrays (matched by
 * an element), strings starting with "[", numbers of three BSON types, dates and
 * booleans (numbers to SQLite), ObjectIds (hex text to SQLite), null and missing.
 */

/** Any _id type, any fields. */
type Mixed = { _id: string | number | ObjectId; [field: string]: unknown };

interface Context {
  servers: TestServers;
  client: MongoClient;
  colls: Record<"mixed" | "typed", Collection<Mixed>>;
}
const test = anyTest as TestFn<Context>;

const embedded = !process.env.RUNS_TEST_MONGODB_URI;
const { EJSON } = BSON;

const MISSING = Symbol("missing");
const scalars: unknown[] = ["x", "y", "xa", "", "[q", 0, 1, 2.5, -3, 10, 2 ** 40, true, false, null, new Date(5), new ObjectId("64b000000000000000000001")];
// Arrays of strings and documents holding strings: the membership pushdown (string
// equality, $all) looks into them with json_each and must keep every match (and the
// Go filter drop a document's string). FerretDB stores no nested arrays.
const values: unknown[] = [...scalars, ["x"], [1, 7], [], ["y", 2], { k: 1 }, ["x", "xa"], { k: "x" }, ["[q", "y"], MISSING];

function pick<T>(rand: () => number, from: readonly T[]): T {
  return from[Math.floor(rand() * from.length)]!;
}

/**
 * "mixed": any value anywhere, arrays included (the pushdown mostly backs off).
 * "typed": as real collections are: fields hold one type with a few odd scalars;
 * b holds arrays only where a is "z", c anywhere; a never (the pushdown applies).
 */
function documents(rand: () => number, n: number, kind: "mixed" | "typed"): Mixed[] {
  const docs: Mixed[] = [];
  // A string starting with "[" looks like an array to the patch's check; typed fields have none.
  const odd = values.filter((v) => kind === "mixed" || !(Array.isArray(v) || v === "[q"));
  for (let i = 0; i < n; i++) {
    const _id = i % 11 === 0 ? new ObjectId(`64b0000000000000000${String(i).padStart(5, "0")}`) : i % 13 === 0 ? i : `d_${String(i).padStart(4, "0")}`;
    const doc: Mixed = { _id, u: i };
    for (const f of ["a", "b", "c"]) {
      const usual = f === "b" ? Math.floor(rand() * 40) : pick(rand, ["x", "y", "xa", "z"]);
      const oddOnes = kind === "typed" && (f === "c" || (f === "b" && doc.a === "z")) ? values : odd;
      const v = rand() < 0.7 ? usual : pick(rand, oddOnes);
      if (v !== MISSING) doc[f] = v;
    }
    docs.push(doc);
  }
  return docs;
}

function condition(rand: () => number): unknown {
  const r = rand();
  const bound = () => (rand() < 0.6 ? pick(rand, [0, 1, 2.5, 10, 20, -3, 39]) : pick(rand, ["", "x", "xa", "y", "[", "z"]));
  if (r < 0.3) return pick(rand, scalars);
  if (r < 0.4) return { $eq: pick(rand, scalars) };
  if (r < 0.55) return { $in: [pick(rand, scalars), pick(rand, scalars), pick(rand, scalars)] };
  if (r < 0.65) return { $all: rand() < 0.5 ? [pick(rand, ["x", "y", "xa", "[q"])] : [pick(rand, ["x", "y", "xa"]), pick(rand, scalars)] };
  if (r < 0.9) {
    const ops: Document = {};
    ops[pick(rand, ["$gt", "$gte"])] = bound();
    if (rand() < 0.6) ops[pick(rand, ["$lt", "$lte"])] = bound();
    return ops;
  }
  return { $ne: pick(rand, scalars) };
}

const sorts: Array<Sort | undefined> = [undefined, { b: -1, _id: -1 }, { b: 1, _id: 1 }, { a: 1, b: -1, _id: -1 }, { _id: 1 }, { a: 1, _id: 1 }, { c: -1, _id: 1 }];

test.before(async (t) => {
  const servers = await startTestServers();
  const client = new MongoClient(servers.mongoUri, { maxPoolSize: 8 });
  await client.connect();
  const colls = { mixed: client.db(servers.dbName).collection<Mixed>("mixed"), typed: client.db(servers.dbName).collection<Mixed>("typed") };
  for (const [kind, coll] of Object.entries(colls)) {
    await coll.createIndex({ a: 1, b: -1, _id: -1 }, { name: "a_b_id" });
    await coll.createIndex({ b: 1 }, { name: "b" });
    await coll.createIndex({ c: 1, a: 1 }, { name: "c_a" });
    await coll.createIndex({ a: 1, u: 1 }, { name: "a_u", unique: true });
    await coll.insertMany(documents(seededRandom(7), 600, kind as "mixed" | "typed"));
  }
  t.context = { servers, client, colls };
});

test.after.always(async (t) => {
  await t.context.client?.close();
  await t.context.servers?.stop();
});

const ids = (docs: Document[]) => docs.map((d) => EJSON.stringify(d._id));

for (const kind of ["mixed", "typed"] as const) {
  test.serial(`ferretdb pushdown - 300 random filters, sorts and limits on ${kind} documents answer as FerretDB's own evaluation does`, async (t) => {
    const coll = t.context.colls[kind];
    const rand = seededRandom(kind === "mixed" ? 11 : 12);
    let pushedDown = 0;
    let sortedByIndex = 0;
    for (let q = 0; q < 300; q++) {
      const filter: Filter<Mixed> = {};
      for (const f of ["a", "b", "c", "_id"]) if (rand() < (f === "_id" ? 0.2 : 0.45)) filter[f] = condition(rand);
      const sort = pick(rand, sorts);
      const limit = rand() < 0.5 ? 1 + Math.floor(rand() * 20) : 0;
      const what = EJSON.stringify({ filter, sort, limit });
      const find = (f: Filter<Mixed>) => {
        const cursor = coll.find(f);
        if (sort) cursor.sort(sort);
        if (limit) cursor.limit(limit);
        return cursor.toArray();
      };
      const [got, want] = await Promise.all([find(filter), find({ $and: [filter] })]);
      // Every sort ends in _id: the order is total, so the sequences must be equal.
      if (sort) t.deepEqual(ids(got), ids(want), what);
      else if (!limit) t.deepEqual(ids(got).sort(), ids(want).sort(), what);
      else {
        // No order and a limit: any `limit` of the matches (an index may read them in another order).
        const every = new Set(ids(await coll.find({ $and: [filter] }).toArray()));
        t.is(got.length, Math.min(limit, every.size), what);
        t.is(new Set(ids(got)).size, got.length, `no duplicates: ${what}`);
        t.true(ids(got).every((id) => every.has(id)), `only matches: ${what}`);
      }
      t.is(await coll.countDocuments(filter), await coll.countDocuments({ $and: [filter] }), `count ${what}`);
      if (embedded) {
        const explained = await t.context.client.db(t.context.servers.dbName).command({ explain: { find: kind, filter, ...(sort ? { sort } : {}) } });
        if (explained.filterPushdown === true) pushedDown++;
        if (sort && explained.sortPushdown === true) sortedByIndex++;
      }
    }
    // The typed sample exercised the pushdown (filters and sorts), not only the fallback.
    if (embedded && kind === "typed") {
      t.true(pushedDown >= 60, `filters pushed down: ${pushedDown} of 300`);
      t.true(sortedByIndex >= 5, `sorts taken from an index: ${sortedByIndex} of 300`);
    }
    // Arrays everywhere: the typed conditions mostly back off, string memberships do not.
    if (embedded && kind === "mixed") t.true(pushedDown >= 60, `filters pushed down: ${pushedDown} of 300`);
    t.log(`${kind}: ${pushedDown} filters pushed down, ${sortedByIndex} sorts from an index`);
  });
}

test.serial("ferretdb pushdown - unique indexes keep MongoDB's uniqueness: two nulls collide, 1 and true do not", async (t) => {
  const coll = t.context.colls.typed;
  await coll.insertOne({ _id: "uniq_null_1", a: null, u: 20_001 });
  await t.throwsAsync(coll.insertOne({ _id: "uniq_null_2", a: null, u: 20_001 }), { message: /duplicate key/i });
  // true and 1, "[1]" and [1]: different values to MongoDB.
  // (An ObjectId and its hex string collide in FerretDB 1.24's own JSON-text columns,
  // with or without the patch: a known limit of the stock store, not exercised here.)
  const pairs: Array<[unknown, unknown]> = [
    [1, true],
    ["[1]", [1]],
  ];
  let u = 10_000;
  for (const [one, other] of pairs) {
    u++;
    await coll.insertOne({ _id: `uniq_${u}_1`, a: one, u });
    await t.notThrowsAsync(coll.insertOne({ _id: `uniq_${u}_2`, a: other, u }), EJSON.stringify([one, other]));
  }
  await t.throwsAsync(coll.insertOne({ _id: "uniq_dup", a: 1, u: 10_001 }), { message: /duplicate key/i });
});

test.serial("ferretdb pushdown - doubles beyond 2^53 and fields named like SQLite's rowid answer as FerretDB's own evaluation", async (t) => {
  const coll = t.context.client.db(t.context.servers.dbName).collection<Mixed>("edges");
  await coll.createIndex({ f: 1 }, { name: "f" });
  await coll.createIndex({ rowid: 1 }, { name: "rowid" });
  await coll.createIndex({ OID: 1, f: 1 }, { name: "oid_f" });
  await coll.insertMany([
    { _id: "dbl", f: 2 ** 60, rowid: 5, OID: "x" },
    { _id: "long", f: BSON.Long.fromString("1152921504606846977"), rowid: 6, OID: "x" },
    { _id: "tiny", f: 1e-310, rowid: 7, OID: "x" },
    { _id: "small", f: 3, rowid: 8, OID: "x" },
  ]);
  const cases: Array<{ filter: Filter<Mixed>; sort?: Sort; limit?: number }> = [
    { filter: { f: 2 ** 60 } },
    { filter: { f: { $lte: BSON.Long.fromString("1152921504606846976") } } },
    { filter: { f: { $gte: 0 } }, sort: { f: 1 }, limit: 1 },
    { filter: { f: { $gte: 0 } }, sort: { f: -1 }, limit: 2 },
    { filter: { f: { $gte: 0, $lte: 2 ** 62 } }, sort: { f: -1 }, limit: 2 },
    { filter: { f: { $gt: 0, $lt: 1 } } },
    { filter: { rowid: 5 } },
    { filter: { rowid: { $gte: 6 } } },
    { filter: { OID: "x", f: { $gte: 0, $lt: 10 } }, sort: { f: 1 } },
  ];
  for (const { filter, sort, limit } of cases) {
    const find = (f: Filter<Mixed>) => {
      const cursor = coll.find(f);
      if (sort) cursor.sort(sort);
      if (limit) cursor.limit(limit);
      return cursor.toArray();
    };
    t.deepEqual(ids(await find(filter)), ids(await find({ $and: [filter] })), EJSON.stringify({ filter, sort, limit }));
  }
  t.deepEqual((await coll.find({ rowid: 5 }).toArray()).map((d) => d._id), ["dbl"]);
});

test.serial("ferretdb pushdown - an array that appears later turns the pushdown off for that field, answers stay right", async (t) => {
  const coll = t.context.colls.typed;
  const filter = { b: { $gte: 100, $lte: 200 } };
  await coll.insertMany([
    { _id: "late_1", b: 150 },
    { _id: "late_2", b: [1, 160] },
    { _id: "late_3", b: "150" },
  ]);
  const got = await coll.find(filter).sort({ b: 1 }).toArray();
  t.deepEqual(ids(got), ids(await coll.find({ $and: [filter] }).sort({ b: 1 }).toArray()));
  t.deepEqual(got.map((d) => d._id).sort(), ["late_1", "late_2"]);
});
