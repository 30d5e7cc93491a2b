/**
 * FerretDB's CPU per store command of the kinds a turn sends, 64 at a time (bulks as
 * stated), against the test servers' FerretDB (read from /proc), with the driver's side
 * (this process) beside it: a findOne by `_id`, an updateOne by `_id`, inserts one by one
 * and in bulks of 16, fenced updates one by one and in bulks of 16 (one in flight) and 64
 * (four in flight). Two rounds.
 *
 *   node --import tsx bench/trace-store-commands.ts
 *
 * Used for the per-command figures in docs/performance.md and deploy/tools/README.md; not
 * part of `npm run bench`.
 */
import { MongoClient } from "mongodb";
import { startTestServers } from "../test/helpers/servers.js";
import { cpuSecondsOf, load } from "./lib.js";

const servers = await startTestServers();
const client = new MongoClient(servers.mongoUri, { maxPoolSize: 100 });
await client.connect();
const db = client.db("store_commands");
const cpu = cpuSecondsOf;
const N = 3000;
const pad = "x".repeat(600);

async function measure(name: string, ops: number, docsPerOp: number, op: (i: number) => Promise<unknown>, concurrency = 64): Promise<void> {
  const ferret0 = cpu(servers.ferret.pid);
  const node0 = cpu(process.pid);
  const r = await load(concurrency, ops, 120_000, async (i) => void (await op(i)));
  const docs = r.ops * docsPerOp;
  const per = (seconds: number) => ((seconds * 1000) / docs).toFixed(3);
  console.log(`${name.padEnd(42)} ${((docs / r.elapsedMs) * 1000).toFixed(0).padStart(6)} docs/s  FerretDB ${per(cpu(servers.ferret.pid) - ferret0)} ms/doc  driver ${per(cpu(process.pid) - node0)} ms/doc${r.errors ? `  (${r.errors} failed)` : ""}`);
}

type Doc = { _id: string } & Record<string, unknown>;
const keys = db.collection<Doc>("idempotency");
const runs = db.collection<Doc>("runs");
const agents = db.collection<Doc>("agents");
const inserted = db.collection<Doc>("inserted");
await runs.createIndex({ workspace_id: 1, last_activity_at: -1, _id: -1 });
for (let i = 0; i < 50; i++) await agents.insertOne({ _id: `a${i}`, workspace_id: "w", active_version: 1, pad });
for (let round = 0; round < 2; round++) {
  const base = round * 1e6;
  const now = Date.now();
  await keys.insertMany(Array.from({ length: N }, (_, i) => ({ _id: `k${base + i}`, workspace_id: "w", state: "pending", result: { run_id: `r${i}`, turn_id: `t${i}` }, expires_at: now + 1e8 })));
  await runs.insertMany(Array.from({ length: N * 2 }, (_, i) => ({ _id: `r${base + i}`, workspace_id: "w", state: "busy", epoch: 1, tags: [], last_activity_at: now, expires_at: now + 1e8, pad })));
  const idle = { $set: { state: "idle", last_activity_at: Date.now(), active_turn_id: null } };
  await measure("findOne by _id", N, 1, (i) => agents.findOne({ _id: `a${i % 50}` }));
  await measure("updateOne by _id", N, 1, (i) => keys.updateOne({ _id: `k${base + i}` }, { $set: { state: "done" } }));
  await measure("insertOne", N, 1, (i) => inserted.insertOne({ _id: `o${base + i}`, expires_at: 1 }));
  await measure("insertMany of 16, 4 in flight", N / 16, 16, (i) => inserted.insertMany(Array.from({ length: 16 }, (_, j) => ({ _id: `m${base + i * 16 + j}`, expires_at: 1 })), { ordered: false }), 4);
  await measure("fenced updateOne {_id, epoch}", N / 2, 1, (i) => runs.updateOne({ _id: `r${base + i}`, epoch: 1 }, idle));
  const bulk = (from: number, size: number) => runs.bulkWrite(Array.from({ length: size }, (_, j) => ({ updateOne: { filter: { _id: `r${base + from + j}`, epoch: 1 }, update: idle } })), { ordered: false });
  await measure("fenced bulks of 16, 1 in flight", N / 32, 16, (i) => bulk(N / 2 + i * 16, 16), 1);
  await measure("fenced bulks of 64, 4 in flight", N / 64, 64, (i) => bulk(N + i * 64, 64), 4);
}
await client.close();
await servers.stop();
process.exit(0);
