/**
 * The sweeps remove what is due in bounded steps, never in one delete of everything due:
 * FerretDB (the embedded store) reads all the matches of a delete and removes them in one
 * SQL statement with a bound variable each, and SQLite takes at most 32,766, so a larger
 * backlog (retention lowered, a store restored, a long outage) failed at every sweep.
 * Real FerretDB and driver; the usage ledger and the idempotency records.
 */
import test, { type ExecutionContext } from "ava";
import { type Collection, MongoClient } from "mongodb";
import { type RunningService, startService } from "../../node/service.js";
import { deleteOldest, SWEEP_BATCH } from "../../src/mongo-guard.js";
import { MongoStore, STORE_CLIENT_OPTIONS } from "../../src/mongo-store.js";
import { UsageLedger } from "../../src/usage-ledger.js";
import { systemClock } from "../../src/clock.js";
import { Ids } from "../../src/ids.js";
import { WebhookStore } from "../../src/webhooks.js";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { jetstream, jetstreamManager, type JetStreamManager, type MsgRequest } from "@nats-io/jetstream";
import { Objm, type ObjectStore } from "@nats-io/obj";
import { CHECKPOINTS_BUCKET, connectNats, eventStreamName, eventSubject, FILES_BUCKET } from "../../src/nats.js";
import { FileStore, orphanGraceMs, type UploadClaim } from "../../src/file-store.js";
import { BlobKeyring } from "../../src/blob-crypto.js";
import { purgeUnnamedChunks } from "../../src/object-chunks.js";
import { bashThen } from "../helpers/agent-configs.js";
import { Api, collectedLogs, newWorkspace, startTestServers, startTestService, testConfig, type TestServers } from "../helpers/servers.js";

const DUE = 33_000;

/** Inserts `make(from)` … `make(to - 1)`, 5,000 at a time. */
async function insertRange(collection: Collection<any>, from: number, to: number, make: (i: number) => Record<string, unknown>): Promise<void> {
  for (let start = from; start < to; start += 5_000) {
    await collection.insertMany(Array.from({ length: Math.min(5_000, to - start) }, (_, k) => make(start + k)), { ordered: false });
  }
}

/** Test servers and a client of their store for `work`; all stopped after it. */
async function withStore(work: (servers: TestServers, client: MongoClient) => Promise<void>): Promise<void> {
  const servers = await startTestServers();
  const client = new MongoClient(servers.mongoUri, { maxPoolSize: 4, ...STORE_CLIENT_OPTIONS });
  try {
    await work(servers, client);
  } finally {
    await client.close();
    await servers.stop();
  }
}

/**
 * Starts runs on an agent whose turn writes note.txt in the run's workspace (so each run has
 * a workspace directory and a checkpoint); each start's turn completed, its run id.
 */
async function workspaceRuns(t: ExecutionContext, api: Api): Promise<() => Promise<string>> {
  const agent = await api.agentWith({ model: "faux/scripted", tools: ["bash"], script: bashThen("echo kept > note.txt", "wrote") });
  return async () => {
    const run = (await api.post("/api/v1/runs", { agent, input: "go" })).body;
    t.is(run.turn?.status, "completed", JSON.stringify(run));
    return run.id as string;
  };
}

/** Test servers and a service on them for `work`; all stopped after it. */
async function withService(work: (servers: TestServers, service: RunningService) => Promise<void>, env: Record<string, string> = {}): Promise<void> {
  const servers = await startTestServers();
  const service = await startTestService(servers, env);
  try {
    await work(servers, service);
  } finally {
    await service.close();
    await servers.stop();
  }
}

test("sweeps - a backlog past SQLite's 32,766 variables is removed in bounded steps, oldest first; what is not due stays", async (t) => {
  t.timeout(180_000);
  await withStore(async (servers, client) => {
    const store = await MongoStore.over(client, servers.dbName);
    await store.provision();
    const db = client.db(servers.dbName);
    const ledger = new UsageLedger(db, systemClock);
    await ledger.provision();
    const usage = db.collection<{ _id: string; at: number }>("usage");
    const cutoff = 1_000_000_000;
    const record = (i: number, at: number) => ({
      _id: `turn_sweep${String(i).padStart(10, "0")}`, workspace_id: "ws_sweep", run_id: "run_sweep", agent_id: "agt_sweep", agent_version: 1, model: "faux/scripted", at,
      input_tokens: 1, output_tokens: 1, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: null,
    });
    await insertRange(usage, 0, DUE, (i) => record(i, 1_000 + i));
    await usage.insertMany(Array.from({ length: 10 }, (_, k) => record(DUE + k, cutoff + k)) as never[]);

    if (!process.env.RUNS_TEST_MONGODB_URI) {
      // What the sweep did before: one delete of everything due. The embedded store refuses it.
      await t.throwsAsync(usage.deleteMany({ at: { $lt: cutoff } }), undefined, "one delete of 33,000 documents fails on FerretDB/SQLite");
      t.is(await usage.countDocuments({}), DUE + 10, "and removes nothing");
    }

    // A sweep's bounds: steps, and time (the first step is always taken).
    t.is(await deleteOldest(usage, "at", cutoff, { maxSteps: 20, budgetMs: 60_000 }), 20 * SWEEP_BATCH, "20 steps of 1,000");
    t.is(await usage.countDocuments({ at: { $lt: 1_000 + 20 * SWEEP_BATCH } }), 0, "the oldest first");
    t.is(await deleteOldest(usage, "at", cutoff, { maxSteps: 1_000, budgetMs: 0 }), SWEEP_BATCH, "no time left: one step");
    // The ledger's sweep takes the rest of the backlog at once (it is well within its bounds).
    t.is(await ledger.sweep(cutoff), DUE - 21 * SWEEP_BATCH);
    t.is(await ledger.sweep(cutoff), 0);
    t.deepEqual((await usage.find({}).toArray()).map((d) => d.at), Array.from({ length: 10 }, (_, k) => cutoff + k), "not due: kept");

    // The idempotency records' sweep takes the same steps: times tied across a step's end go
    // with it, a record due exactly now goes, one due a millisecond later stays.
    const idempotency = db.collection("idempotency");
    const now = 9_000_000;
    await idempotency.insertMany(Array.from({ length: 2_500 }, (_, i) => ({ _id: `idem_${i}`, expires_at: 5_000 + Math.floor(i / 7) })) as never[]);
    await idempotency.insertMany([{ _id: "idem_now", expires_at: now }, { _id: "idem_later", expires_at: now + 1 }] as never[]);
    await store.sweepRecords(now);
    t.deepEqual((await idempotency.find({}).toArray()).map((d) => d._id), ["idem_later"]);
    await store.close();
  });
});

test("sweeps - deleting a run with more turns than one delete can take (33,000) answers without waiting for them and removes every turn, then its other parts", async (t) => {
  t.timeout(180_000);
  await withService(async (servers, service) => {
    const ws = await newWorkspace(service);
    const run = (await ws.api.post("/api/v1/runs", { agent: await ws.api.agentWith({ model: "faux/scripted" }), input: "one" })).body;
    t.is(run.turn.status, "completed");
    const raw = await servers.raw();
    const first = (await raw.turns.findOne({ run_id: run.id }))!;
    // The run's other turns, as a long-lived run would have them (written here: 33,000 real turns take too long).
    await insertRange(raw.turns, 1, DUE + 1, (i) => ({ ...first, _id: `${first._id}_${i}`, index: i, transcript: [], output: [] }));
    t.is(await raw.turns.countDocuments({ run_id: run.id }), DUE + 1);
    const began = Date.now();
    const deleted = await ws.api.request("DELETE", `/api/v1/runs/${run.id}`, { idempotencyKey: `del-${run.id}` });
    const answeredMs = Date.now() - began;
    t.is(deleted.status, 200, JSON.stringify(deleted.body));
    t.is((await ws.api.get(`/api/v1/runs/${run.id}`)).status, 404);
    // The turns go asynchronously (runs-api.md: DELETE): the answer did not wait for them.
    let left = await raw.turns.countDocuments({ run_id: run.id });
    for (let i = 0; i < 600 && left > 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      left = await raw.turns.countDocuments({ run_id: run.id });
    }
    t.log(`answered in ${answeredMs} ms, every turn removed after ${Date.now() - began} ms`);
    t.is(left, 0, "every turn removed");
    let tombstone = await raw.tombstones.findOne({ _id: run.id });
    for (let i = 0; i < 100 && tombstone && "parts_due_at" in tombstone; i++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      tombstone = await raw.tombstones.findOne({ _id: run.id });
    }
    t.false("parts_due_at" in tombstone!, "then its other parts: nothing is left to check");
  });
});

test("sweeps - deleting a webhook whose delivery log outgrew one delete (33,000 deliveries) answers deleted and removes the log", async (t) => {
  t.timeout(180_000);
  await withService(async (servers, service) => {
    const ws = await newWorkspace(service);
    const hook = (await ws.api.post("/api/v1/webhooks", { url: "https://example.com/hook", event_types: ["*"] })).body;
    const raw = await servers.raw();
    const deliveries = raw.db.collection("webhook_deliveries");
    const attempts = raw.db.collection("webhook_attempts");
    const now = Date.now();
    const delivery = (i: number) => ({
      _id: `whd_sweep${String(i).padStart(10, "0")}`, workspace_id: "ws_other", webhook_id: hook.id, partition: 0, run_id: null, message_id: `msg_${i}`,
      event_type: "turn.completed", body: "{}", status: "delivered", attempts: 1, next_attempt_at: now, last_attempt: null, created_at: now - i, completed_at: now,
    });
    await insertRange(deliveries, 0, DUE, delivery);
    t.log(`inserted in ${Date.now() - now} ms`);
    await attempts.insertMany([0, 1, DUE - 1].map((i) => ({ _id: `wha_sweep${i}`, delivery_id: delivery(i)._id, webhook_id: hook.id, n: 1 })) as never[]);
    const began = Date.now();
    const deleted = await ws.api.request("DELETE", `/api/v1/webhooks/${hook.id}`);
    t.log(`deleted in ${Date.now() - began} ms`);
    t.is(deleted.status, 200, JSON.stringify(deleted.body));
    t.deepEqual(deleted.body, { id: hook.id, object: "webhook.deleted", deleted: true });
    t.is(await deliveries.countDocuments({ webhook_id: hook.id }), 0, "the delivery log removed");
    t.is(await attempts.countDocuments({ webhook_id: hook.id }), 0, "and its attempts");
  });
});

test("sweeps - the webhook delivery log's sweep takes every finished delivery past the log's week in steps, by its index; pending and recent ones stay", async (t) => {
  t.timeout(120_000);
  await withStore(async (servers, client) => {
    const db = client.db(servers.dbName);
    const store = new WebhookStore(db, Buffer.alloc(32, 7).toString("base64"), systemClock, Ids);
    await store.provision();
    const deliveries = db.collection("webhook_deliveries");
    const attempts = db.collection("webhook_attempts");
    const before = 1_000_000;
    const delivery = (i: number, status: string, completedAt: number | null, partition = 7) => ({
      _id: `whd_log${String(i).padStart(8, "0")}`, workspace_id: "ws_log", webhook_id: "wh_log", partition, run_id: null, message_id: `m${i}`,
      event_type: "turn.completed", body: "{}", status, attempts: 1, next_attempt_at: 0, last_attempt: null, created_at: i, completed_at: completedAt,
    });
    const old = Array.from({ length: 2_500 }, (_, i) => delivery(i, i % 2 ? "delivered" : "failed", 10 + i));
    const stay = [delivery(90_001, "pending", null), delivery(90_002, "delivered", before + 5), delivery(90_003, "delivered", 10, 8)];
    await deliveries.insertMany([...old, ...stay] as never[]);
    await attempts.insertMany([0, 1_999, 2_499, 90_002].map((i) => ({ _id: `wha_log${i}`, delivery_id: `whd_log${String(i).padStart(8, "0")}`, webhook_id: "wh_log", n: 1 })) as never[]);

    t.is(await store.sweep([7], before, { maxSteps: 1, budgetMs: 60_000 }), SWEEP_BATCH, "one step: 1,000");
    t.is(await store.sweep([7], before), 1_500, "then the rest, in steps, in one sweep");
    t.deepEqual((await deliveries.find({}).toArray()).map((d) => d._id).sort(), stay.map((d) => d._id), "pending, recent and other partitions' stay");
    t.deepEqual((await attempts.find({}).toArray()).map((d) => d._id), ["wha_log90002"], "the removed deliveries' attempts went with them");

    if (!process.env.RUNS_TEST_MONGODB_URI) {
      // Each step's read and delete seek the `done` index: no scan of the log or the collection.
      const finished = { status: { $in: ["delivered", "failed"] }, completed_at: { $gte: Number.MIN_SAFE_INTEGER, $lt: before } };
      for (const filter of [{ ...finished, partition: { $in: [7] } }, { ...finished, _id: { $in: ["whd_log00000001"] } }]) {
        const plan = ((await db.command({ explain: { find: "webhook_deliveries", filter } })).queryPlanner?.Plan ?? []) as string[];
        t.true(plan.some((line) => /SEARCH \S+ USING INDEX \S+_done /.test(line)), plan.join(" | "));
        t.false(plan.some((line) => /\bSCAN\b/.test(line)), plan.join(" | "));
      }
    }
  });
});

test("sweeps - what a removal left behind (its node died once the run's document was gone) is removed by the partition owner's sweep, found through the tombstone; a run whose delete failed after its tombstone keeps everything", async (t) => {
  t.timeout(120_000);
  await withService(async (servers, service) => {
    const ws = await newWorkspace(service);
    const start = await workspaceRuns(t, ws.api);
    const [left, live, deleted] = [await start(), await start(), await start()];
    const raw = await servers.raw();
    const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "leftovers-test" });
    try {
      const checkpoints = await new Objm(jetstream(nc)).open(CHECKPOINTS_BUCKET);
      const jsm = await jetstreamManager(nc);
      const events = async (runId: string) => {
        const info = await jsm.streams.info(eventStreamName("solo"), { subjects_filter: eventSubject("solo", runId) });
        return info.state.subjects?.[eventSubject("solo", runId)] ?? 0;
      };
      const parts = async (runId: string) => ({
        turns: await raw.turns.countDocuments({ run_id: runId }),
        events: (await events(runId)) > 0,
        // The node's data directory is node-… in the servers' directory.
        directory: readdirSync(servers.dir).some((name) => name.startsWith("node-") && existsSync(path.join(servers.dir, name, "workspaces", runId))),
        // A removed object keeps a marker: info says deleted.
        checkpoint: (await checkpoints.info(runId))?.deleted === false,
      });
      const all = { turns: 1, events: true, directory: true, checkpoint: true };
      /** The run's tombstone once its parts are marked gone (within 20 s), or as it is then. */
      const partsGone = async (runId: string) => {
        let tombstone = await raw.tombstones.findOne({ _id: runId });
        for (let i = 0; i < 100 && (!tombstone || "parts_due_at" in tombstone); i++) {
          await new Promise((resolve) => setTimeout(resolve, 200));
          tombstone = await raw.tombstones.findOne({ _id: runId });
        }
        return tombstone!;
      };
      t.deepEqual(await parts(left), all, "a run's parts before its removal");

      // A removal that finished: the tombstone names the run's partition and plan, and nothing is left to check.
      const { partition } = (await raw.runs.findOne({ _id: deleted }))!;
      t.is((await ws.api.request("DELETE", `/api/v1/runs/${deleted}`, { idempotencyKey: `del-${deleted}` })).status, 200);
      const done = await partsGone(deleted);
      t.like(done, { reason: "deleted", plan: "solo", partition });
      t.false("parts_due_at" in done, "all its parts went (after the answer): no check is due");
      t.deepEqual(await parts(deleted), { turns: 0, events: false, directory: false, checkpoint: false });

      // The state a node leaves when it dies right after the run's document went (tombstone
      // written, nothing else removed), its check due; and a tombstone whose run's delete failed
      // right after it (the run is still there).
      const now = Date.now();
      const runs = { left: (await raw.runs.findOne({ _id: left }))!, live: (await raw.runs.findOne({ _id: live }))! };
      // The document first: a sweep between the two would find the run and put its check off.
      await raw.runs.deleteOne({ _id: left });
      for (const run of [runs.left, runs.live]) {
        await raw.tombstones.insertOne({ _id: run._id, workspace_id: run.workspace_id, reason: "deleted", at: now, expires_at: now + 86_400_000, partition: run.partition, plan: run.plan, parts_due_at: now - 1 });
      }

      t.false("parts_due_at" in (await partsGone(left)), "the sweep found the tombstone and marked its run's parts gone");
      t.deepEqual(await parts(left), { turns: 0, events: false, directory: false, checkpoint: false }, "turns, events, workspace directory and checkpoint removed");
      t.is((await ws.api.get(`/api/v1/runs/${left}`)).status, 404);

      // The sweep may reach it after the other (in the same pass or a later one): wait for it (≤ 20 s).
      let liveTombstone = (await raw.tombstones.findOne({ _id: live }))!;
      for (let i = 0; i < 100 && !(liveTombstone.parts_due_at! > now); i++) {
        await new Promise((resolve) => setTimeout(resolve, 200));
        liveTombstone = (await raw.tombstones.findOne({ _id: live }))!;
      }
      t.true(liveTombstone.parts_due_at! > now, "a run that still exists is checked again later");
      t.deepEqual(await parts(live), all, "and keeps every part");
      t.is((await ws.api.get(`/api/v1/runs/${live}`)).status, 200);
      t.is((await ws.api.post("/api/v1/runs", { run_id: live, input: "again" })).body.turn?.status, "completed");
    } finally {
      await nc.close();
    }
  }, { RUNS_SWEEP_INTERVAL_MS: "200" });
});

test("sweeps - a node that gains a partition removes the workspace directories it kept of runs removed while another node held it; a live run's stays", async (t) => {
  t.timeout(120_000);
  const servers = await startTestServers();
  const dataDir = path.join(servers.dir, "node-keeper");
  const { logs, log } = collectedLogs();
  const config = testConfig(servers, { RUNS_DATA_DIR: dataDir });
  let service = await startService(config, { log });
  try {
    const ws = await newWorkspace(service);
    const start = await workspaceRuns(t, ws.api);
    const [gone, live] = [await start(), await start()];
    const dirOf = (runId: string) => path.join(dataDir, "workspaces", runId);
    t.true(existsSync(path.join(dirOf(gone), "note.txt")) && existsSync(path.join(dirOf(live), "note.txt")));
    await service.close();
    t.true(existsSync(dirOf(gone)), "a stopping node keeps its directories (the run may come back to it)");
    // Meanwhile another node held the partition and removed the run: its document and turns
    // went there, and this node's directory could not be reached.
    const raw = await servers.raw();
    await raw.runs.deleteOne({ _id: gone });
    await raw.turns.deleteMany({ run_id: gone });

    logs.length = 0;
    service = await startService(config, { log });
    // Each pass says how many directories it looked at: both, in one pass or more.
    const looked = () => logs.filter((line) => line.msg === "looked for kept workspace directories of runs removed while another node held their partition");
    for (let i = 0; i < 100 && looked().reduce((sum, line) => sum + Number(line.checked), 0) < 2; i++) await new Promise((resolve) => setTimeout(resolve, 100));
    t.is(looked().reduce((sum, line) => sum + Number(line.checked), 0), 2, JSON.stringify(looked()));
    t.is(looked().reduce((sum, line) => sum + Number(line.removed), 0), 1);
    t.false(existsSync(dirOf(gone)), "the removed run's directory went when its partition was gained");
    t.is(readFileSync(path.join(dirOf(live), "note.txt"), "utf8"), "kept\n", "the live run's stays as it was");
    const next = await new Api(service.url!, ws.key).post("/api/v1/runs", { run_id: live, input: "again" });
    t.is(next.body.turn?.status, "completed", JSON.stringify(next.body));
  } finally {
    await service.close();
    await servers.stop();
  }
});

test("sweeps - an expired file's record goes only once its object is gone: a delete that fails (NATS away) leaves both for the next sweep", async (t) => {
  t.timeout(60_000);
  await withService(async (servers, service) => {
    const ws = await newWorkspace(service);
    const form = new FormData();
    form.append("file", new Blob([Buffer.from("tenant bytes that must go at retention")]), "note.txt");
    const res = await fetch(`${service.url}/api/v1/files`, { method: "POST", headers: { authorization: `Bearer ${ws.key}`, "idempotency-key": "file-sweep-1" }, body: form });
    const file = (await res.json()) as { id: string };
    t.is(res.status, 201, JSON.stringify(file));
    const raw = await servers.raw();
    const doc = (await raw.db.collection("files").findOne({ _id: file.id as never }))!;
    // Swept as of a time past its retention: the service's own sweep (at the real time) leaves it alone.
    const later = Number(doc.expires_at) + 1_000;
    const keys = new BlobKeyring(Buffer.alloc(32, 7).toString("base64"));
    const connect = (name: string) => connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name });
    const away = await connect("files-sweep-away");
    const awayFiles = new FileStore(service.store.db, await new Objm(jetstream(away)).open(FILES_BUCKET), systemClock, Ids, keys);
    await away.close();
    t.like(await awayFiles.sweep(later, { uploadTimeLimitMs: 20 * 60_000 }), { files: 0, failed: 1 }, "the object's delete failed: nothing removed");
    t.truthy(await raw.db.collection("files").findOne({ _id: file.id as never }), "the record stays, naming the object");
    const nc = await connect("files-sweep");
    try {
      const bucket = await new Objm(jetstream(nc)).open(FILES_BUCKET);
      t.is((await bucket.info(doc.object_name))?.deleted, false, "and the object is there");
      const files = new FileStore(service.store.db, bucket, systemClock, Ids, keys);
      t.like(await files.sweep(later, { uploadTimeLimitMs: 20 * 60_000 }), { files: 1, failed: 0 });
      t.is(await raw.db.collection("files").findOne({ _id: file.id as never }), null);
      t.not((await bucket.info(doc.object_name))?.deleted, false, "the object is deleted (or absent)");
    } finally {
      await nc.close();
    }
  });
});

test("sweeps - an upload attempt's object that no record names any more (taken over after its node went silent, or whose delete failed) is deleted by the file sweep once no attempt can still write it; a file's never", async (t) => {
  t.timeout(60_000);
  await withService(async (servers, service) => {
    const ws = await newWorkspace(service);
    const keys = new BlobKeyring(Buffer.alloc(32, 7).toString("base64"));
    const connect = (name: string) => connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name });
    const nc = await connect("orphans");
    try {
      const bucket = await new Objm(jetstream(nc)).open(FILES_BUCKET);
      const files = new FileStore(service.store.db, bucket, systemClock, Ids, keys);
      const owned = async (claim: Promise<UploadClaim>) => {
        const c = await claim;
        if (c.kind !== "owned") throw new Error(`expected an owned attempt, got ${c.kind}`);
        return c.session;
      };
      const stored = async (name: string) => (await bucket.info(name))?.deleted === false;
      const orphans = service.store.db.collection("file_orphans");

      // An attempt stored its object, and its node died before recording the file.
      const silent = await owned(files.claim(ws.id, "orphan-1", "fp-1", 60_000));
      await bucket.putBlob({ name: silent.fileId }, Buffer.from("bytes of a silent attempt"));
      // The repeat takes the key over (silent past a window of 0 ms): a new file id.
      const repeat = await owned(files.claim(ws.id, "orphan-1", "fp-1", 0));
      t.not(repeat.fileId, silent.fileId);
      t.truthy(await orphans.findOne({ _id: silent.fileId as never }), "the silent attempt's object is recorded");

      // Another attempt is given up while NATS is away: its object's delete fails.
      const failing = await owned(files.claim(ws.id, "orphan-2", "fp-2", 60_000));
      await bucket.putBlob({ name: failing.fileId }, Buffer.from("bytes of an abandoned attempt"));
      const away = await connect("orphans-away");
      const awayFiles = new FileStore(service.store.db, await new Objm(jetstream(away)).open(FILES_BUCKET), systemClock, Ids, keys);
      await away.close();
      await awayFiles.abandon(failing, "failed");
      t.true(await stored(failing.fileId), "its object is still there");
      t.truthy(await orphans.findOne({ _id: failing.fileId as never }), "and recorded");

      // An attempt whose finish was stored with its answer lost: the route gives it up, and
      // its file (the key's) keeps its bytes.
      const finished = await owned(files.claim(ws.id, "orphan-3", "fp-3", 60_000));
      const bytes = Buffer.from("bytes of a finished attempt");
      await bucket.putBlob({ name: finished.fileId }, bytes);
      const file = await files.finish(finished, { filename: "a.txt", media_type: "text/plain" }, { bytes: bytes.length, sha256: "0".repeat(64) });
      await files.abandon(finished, "failed");
      t.true(await stored(finished.fileId), "a done attempt's object is not removed");
      t.truthy(await files.get(ws.id, file._id));
      // And recorded as left behind by a takeover that raced its finish (two writers of one
      // record): the sweep finds the file that names it.
      await orphans.insertOne({ _id: finished.fileId as never, at: Date.now() });

      // Not before the longest upload could have ended: the silent attempt may still be writing.
      const grace = orphanGraceMs(20 * 60_000);
      t.is(grace, 30 * 60_000);
      t.like(await files.sweep(Date.now(), { uploadTimeLimitMs: 20 * 60_000 }), { orphans: 0 });
      t.like(await files.sweep(Date.now() + grace + 1_000, { uploadTimeLimitMs: 60 * 60_000 }), { orphans: 0 }, "a longer upload limit waits longer");
      t.true((await stored(silent.fileId)) && (await stored(failing.fileId)));
      t.like(await files.sweep(Date.now() + grace + 1_000, { uploadTimeLimitMs: 20 * 60_000 }), { orphans: 3, failed: 0 });
      t.false(await stored(silent.fileId), "the silent attempt's object is deleted");
      t.false(await stored(failing.fileId), "the abandoned attempt's too");
      t.true(await stored(finished.fileId), "a file's object stays");
      t.is((await files.read(ws.id, file._id))?.data.toString(), bytes.toString());
      t.is(await orphans.countDocuments({}), 0);
    } finally {
      await nc.close();
    }
  });
});

/**
 * A put whose writer stops mid-object (as a node killed during an upload or a checkpoint
 * save): `parts` chunks given (the put stores all but the last), then the source never
 * ends, so no meta names them; the writer's connection is closed afterwards.
 */
async function stalledPut(objects: ObjectStore, name: string, parts: number): Promise<void> {
  let sent = 0;
  const source = new ReadableStream<Uint8Array>({
    pull(controller) {
      if (sent++ < parts) controller.enqueue(new Uint8Array(64).fill(sent));
      else return new Promise<void>(() => undefined);
    },
  });
  void objects.put({ name, options: { max_chunk_size: 64 } }, source).catch(() => undefined);
}

/** The chunk subjects of `bucket`, by subject: how many chunks each holds. */
async function chunkSubjects(jsm: JetStreamManager, bucket: string): Promise<Record<string, number>> {
  return (await jsm.streams.info(`OBJ_${bucket}`, { subjects_filter: `$O.${bucket}.C.>` })).state.subjects ?? {};
}

test("sweeps - object chunks a write that died left (no object names them) are purged once no chunk was written to them for the grace; objects' chunks, a write still going on and a deleted object stay as they are", async (t) => {
  t.timeout(60_000);
  await withStore(async (servers) => {
    const connect = (name: string) => connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name });
    const nc = await connect("chunks-test");
    const writer = await connect("chunks-writer-that-dies");
    try {
      const jsm = await jetstreamManager(nc);
      const bucket = `t_chunks_${Date.now()}`;
      const objects = await new Objm(jetstream(nc)).create(bucket);
      const kept = new Uint8Array(200).map((_, i) => i);
      const keptInfo = await objects.put({ name: "kept", options: { max_chunk_size: 64 } }, new Blob([kept]).stream());
      await objects.put({ name: "gone" }, new Blob([new Uint8Array(10)]).stream());
      await objects.delete("gone");
      // More objects than one pull of the metas brings: every one of them is found named.
      const many = 1_500;
      for (let i = 0; i < many; i += 50) {
        await Promise.all(Array.from({ length: 50 }, (_, k) => objects.put({ name: `n${i + k}` }, new Blob([new Uint8Array([k])]).stream())));
      }
      // Two writes that died: each stored chunks, never a meta (the connection went with the node).
      const dying = await new Objm(jetstream(writer)).open(bucket);
      await stalledPut(dying, "died-1", 3);
      await stalledPut(dying, "died-2", 2);
      const stored = async () => Object.values(await chunkSubjects(jsm, bucket)).reduce((sum, n) => sum + n, 0);
      for (let i = 0; i < 100 && (await stored()) < 4 + many + 2 + 1; i++) await new Promise((resolve) => setTimeout(resolve, 50));
      await writer.close();
      const before = await chunkSubjects(jsm, bucket);
      const keptSubject = `$O.${bucket}.C.${keptInfo.nuid}`;
      // The put holds each chunk until the next bytes come: a writer stopped after n parts stored n - 1.
      const holding = (n: number) => Object.values(before).filter((count) => count === n).length;
      t.deepEqual([holding(1), holding(2), holding(4)], [many + 1, 1, 1], "the small objects and one dead write, the other dead write, the kept object");
      t.is(Object.keys(before).length, 1 + many + 2);
      t.is(before[keptSubject], 4, "the object's four chunks");

      const grace = 60_000;
      const chunkBucket = { name: bucket, graceMs: grace };
      const js = jetstream(nc);
      const nats = { js, jsm };
      const t0 = Date.now();
      const at = (ms: number) => () => ms;
      t.is((await purgeUnnamedChunks(nats, chunkBucket, at(t0), new Map(), 1)).suspects.size, 1, "at most one looked at when the bound is one");
      // A pass suspects the unnamed subjects; a later one purges those with no chunk written
      // to them for the grace, by the node's clock (the server's timestamps are not compared).
      const first = await purgeUnnamedChunks(nats, chunkBucket, at(t0), new Map());
      t.like(first, { unnamed: 2, purged: 0, forgotten: 0, deletedLeft: 1 }, "the deleted object's meta is recent: kept");
      // The two dead writes: one stored two chunks, the other one (the objects hold one or four).
      t.deepEqual([...first.suspects.keys()].map((s) => before[s]).sort(), [1, 2]);
      const slow = [...first.suspects.keys()].find((s) => before[s] === 1)!;
      const died = [...first.suspects.keys()].find((s) => before[s] === 2)!;
      const within = await purgeUnnamedChunks(nats, chunkBucket, at(t0 + grace - 1), first.suspects);
      t.like(within, { unnamed: 2, purged: 0, forgotten: 1 }, "within the grace they may be a write in progress; the deleted object's meta, written before the first pass, is past it: forgotten");
      t.is(await objects.info("gone"), null, "the deleted object's meta is gone: no object by that name");
      const entries = (suspects: Map<string, unknown>) => [...suspects].sort(([a], [b]) => (a < b ? -1 : 1));
      t.deepEqual(entries(within.suspects), entries(first.suspects), "found when first found");
      t.deepEqual(await chunkSubjects(jsm, bucket), before);

      // A listing that misses one meta (however: here the first one a pull brings is hidden)
      // purges nothing: that object's chunks would look unnamed.
      const hiding = {
        jsm,
        js: {
          consumers: {
            get: async (...args: Parameters<typeof js.consumers.get>) => {
              const consumer = await js.consumers.get(...args);
              let hidden = false;
              return {
                info: () => consumer.info(),
                delete: () => consumer.delete(),
                fetch: async (options: never) => {
                  const messages = await consumer.fetch(options);
                  return (async function* () {
                    for await (const msg of messages) {
                      if (!hidden) hidden = true;
                      else yield msg;
                    }
                  })();
                },
              };
            },
          },
        },
      } as never;
      const partial = await purgeUnnamedChunks(hiding, chunkBucket, at(t0 + grace), within.suspects);
      t.regex(partial.incomplete ?? "", /^1 of \d+ metas listed not read$/);
      t.like(partial, { unnamed: 0, purged: 0 });
      t.deepEqual(entries(partial.suspects), entries(within.suspects), "the suspects kept as they were");
      t.deepEqual(await chunkSubjects(jsm, bucket), before, "nothing purged");
      // But the deleted objects' metas it read are forgotten all the same (a backlog too large to list shrinks).
      await objects.put({ name: "gone2" }, new Blob([new Uint8Array(10)]).stream());
      await objects.delete("gone2");
      const forgetting = await purgeUnnamedChunks(hiding, chunkBucket, at(Date.now() + 2 * grace), within.suspects);
      t.truthy(forgetting.incomplete);
      t.like(forgetting, { purged: 0, forgotten: 1, deletedLeft: 0 });
      t.is(await objects.info("gone2"), null);

      // One of them is written to meanwhile: a write going on, not purged, its wait begun again.
      await js.publish(slow, new Uint8Array(64).fill(9));
      // And a chunk lands on the other right after the pass read its last: the purge stops before it.
      const late = {
        js,
        jsm: {
          streams: new Proxy(jsm.streams, {
            get: (target, name) =>
              name === "getMessage"
                ? async (stream: string, query: MsgRequest) => {
                    const last = await target.getMessage(stream, query);
                    if (typeof query === "object" && "last_by_subj" in query && query.last_by_subj === died) await js.publish(died, new Uint8Array(64).fill(7));
                    return last;
                  }
                : Reflect.get(target, name),
          }),
        },
      } as never;
      const past = await purgeUnnamedChunks(late, chunkBucket, at(t0 + grace), within.suspects);
      t.like(past, { unnamed: 2, purged: 1, forgotten: 0 });
      t.deepEqual([...past.suspects.keys()], [slow]);
      t.is(past.suspects.get(slow)!.at, t0 + grace);
      const between = await chunkSubjects(jsm, bucket);
      t.is(between[died], 1, "the dead write's chunks are purged up to the last one the pass read; the later one stays");
      t.is(between[slow], 2, "the written-to one keeps its chunks");
      const later = await purgeUnnamedChunks(nats, chunkBucket, at(t0 + 2 * grace), past.suspects);
      t.like(later, { unnamed: 2, purged: 1, forgotten: 0 });
      t.deepEqual([...later.suspects.keys()], [died], "the late chunk is suspected anew");
      t.like(await purgeUnnamedChunks(nats, chunkBucket, at(t0 + 3 * grace), later.suspects), { unnamed: 1, purged: 1 });
      t.like(await purgeUnnamedChunks(nats, chunkBucket, at(t0 + 4 * grace), new Map()), { unnamed: 0, purged: 0, forgotten: 0 });
      const left = await chunkSubjects(jsm, bucket);
      t.is(Object.keys(left).length, 1 + many, "only the objects' chunks are left");
      t.is(left[keptSubject], 4);
      t.deepEqual(new Uint8Array((await objects.getBlob("kept"))!), kept, "the object reads back whole");
      await objects.delete("gone");
      t.is(await objects.info("gone"), null, "a delete repeated after its meta is forgotten finds nothing, as after any delete");
      t.deepEqual(new Uint8Array((await objects.getBlob(`n${many - 1}`))!), new Uint8Array([49]));
    } finally {
      await writer.close().catch(() => undefined);
      await nc.close();
    }
  });
});

test("sweeps - the owner of partition 0 looks for unnamed chunks in the files and checkpoints buckets at its first sweep and suspects a dead write's, purging nothing at once; the next pass is an hour away; files and checkpoints stay readable", async (t) => {
  t.timeout(120_000);
  const servers = await startTestServers();
  const { logs, log } = collectedLogs();
  const config = testConfig(servers, { RUNS_SWEEP_INTERVAL_MS: "200" });
  let service = await startService(config, { log });
  const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "chunks-wiring" });
  const writer = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "chunks-writer-that-dies" });
  try {
    const ws = await newWorkspace(service);
    const runId = await (await workspaceRuns(t, ws.api))();
    const form = new FormData();
    form.append("file", new Blob([Buffer.from("a tenant's file")]), "note.txt");
    const res = await fetch(`${service.url}/api/v1/files`, { method: "POST", headers: { authorization: `Bearer ${ws.key}`, "idempotency-key": "chunks-file" }, body: form });
    const file = (await res.json()) as { id: string };
    t.is(res.status, 201, JSON.stringify(file));
    await service.close();
    // Meanwhile a node died in the middle of an upload and of a checkpoint save.
    const jsm = await jetstreamManager(nc);
    for (const bucket of [FILES_BUCKET, CHECKPOINTS_BUCKET]) await stalledPut(await new Objm(jetstream(writer)).open(bucket), `died-in-${bucket}`, 2);
    const planted = async () => Object.keys(await chunkSubjects(jsm, FILES_BUCKET)).length + Object.keys(await chunkSubjects(jsm, CHECKPOINTS_BUCKET)).length;
    for (let i = 0; i < 100 && (await planted()) < 4; i++) await new Promise((resolve) => setTimeout(resolve, 50));
    await writer.close();
    const before = { files: await chunkSubjects(jsm, FILES_BUCKET), checkpoints: await chunkSubjects(jsm, CHECKPOINTS_BUCKET) };
    t.is(Object.keys(before.files).length, 2, "the file's chunks and the dead upload's");
    t.is(Object.keys(before.checkpoints).length, 2, "the run's checkpoint and the dead save's");

    logs.length = 0;
    service = await startService(config, { log });
    const looked = () => logs.filter((line) => line.msg === "looked for object chunks no object names");
    for (let i = 0; i < 200 && looked().length < 2; i++) await new Promise((resolve) => setTimeout(resolve, 100));
    t.deepEqual(
      looked().map((line) => [line.bucket, line.unnamed, line.purged, line.suspected]).sort(),
      [[CHECKPOINTS_BUCKET, 1, 0, 1], [FILES_BUCKET, 1, 0, 1]],
      "one unnamed write in each: suspected, not purged (it may be in progress)",
    );
    t.deepEqual({ files: await chunkSubjects(jsm, FILES_BUCKET), checkpoints: await chunkSubjects(jsm, CHECKPOINTS_BUCKET) }, before);
    // The next passes are an hour away: the sweeps since did not look again.
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    t.is(looked().length, 2);
    const files = new FileStore(service.store.db, await new Objm(jetstream(nc)).open(FILES_BUCKET), systemClock, Ids, new BlobKeyring(config.masterKey!));
    t.is((await files.read(ws.id, file.id))?.data.toString(), "a tenant's file");
    const api = new Api(service.url!, ws.key);
    const next = await api.post("/api/v1/runs", { run_id: runId, input: "again" });
    t.is(next.body.turn?.status, "completed", JSON.stringify(next.body));
  } finally {
    await writer.close().catch(() => undefined);
    await nc.close();
    await service.close();
    await servers.stop();
  }
});
