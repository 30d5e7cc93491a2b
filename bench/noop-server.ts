/**
 * Baseline HTTP server in its own process, built like the gateway (Fastify 5, same
 * logger off, keep-alive): `GET /noop` answers `{}`; `GET /read/:id` answers the run
 * document read by `_id` through the MongoDB driver with the service's client options.
 *
 * `POST /floor/turn` is the floor of a durable turn over HTTP: what any design that
 * records a turn's admission and its result must at least do, and nothing of the
 * service's own work (no key, rate limit, idempotency record, agent, loop, or sealing:
 * the events are sealed once, up front, like the bare baseline's). One run-shaped
 * document inserted, two events published with acks (started, ended), one update of the
 * document fenced by `_id` and epoch, then the answer. `POST /floor/turn-batched` does the
 * same with the writes group-committed across requests (inserts by the service's
 * InsertBatcher, updates in bulks of at most 16 with one in flight: FerretDB 1.24
 * deadlocks on larger concurrent bulks, docs/performance.md). `POST /floor/admit` is the
 * admission alone: the document inserted and the first event published, then `202`, with
 * no end written (what a background start must at least do before it answers).
 * `POST /floor/background` (and `-batched`) is a background start's floor whole: the
 * admission, then `202`, then the end (the second event and the fenced update) written
 * after the answer; `GET /floor/tails` counts the ends still being written (and failed),
 * so the bench can tell how fast the admitted turns were finished.
 *
 * Configured by BENCH_MONGO_URI / BENCH_MONGO_DB and BENCH_NATS_URL / BENCH_NATS_PASSWORD
 * (the floor routes' JetStream: the baselines' BENCH_EVENTS stream, which must exist);
 * sends {ready, url} over IPC.
 */
import Fastify, { type FastifyReply, type FastifyRequest } from "fastify";
import { MongoClient } from "mongodb";
import { jetstream } from "@nats-io/jetstream";
import { connectNats } from "../src/nats.js";
import { InsertBatcher } from "../src/insert-batcher.js";
import { eventPayload, runDoc } from "./baselines.js";

type Doc = { _id: string; [k: string]: unknown };
const client = new MongoClient(process.env.BENCH_MONGO_URI!, { serverSelectionTimeoutMS: 3_000, connectTimeoutMS: 3_000, maxPoolSize: 50 });
await client.connect();
const runs = client.db(process.env.BENCH_MONGO_DB!).collection<Doc>("runs");
const floorRuns = client.db(process.env.BENCH_MONGO_DB!).collection<Doc>("runs_floor");
const nc = await connectNats({ url: process.env.BENCH_NATS_URL!, user: "runs", password: process.env.BENCH_NATS_PASSWORD!, name: "bench-floor" });
const js = jetstream(nc);

const app = Fastify({ logger: false });
app.get("/noop", async () => ({}));
app.get<{ Params: { id: string } }>("/read/:id", async (request, reply) => {
  const doc = await runs.findOne({ _id: request.params.id });
  if (!doc) return reply.status(404).send({});
  return doc;
});

const started = eventPayload(1);
const ended = eventPayload(2);
let next = 0;
const floorId = () => `run_floor${process.pid}x${(next++).toString(36)}`;

/** The floor turn with the given writes: insert, two acknowledged publishes, fenced update. */
async function floorTurn(insert: (doc: Doc) => Promise<unknown>, finish: (id: string) => Promise<void>): Promise<string> {
  const id = floorId();
  await insert(runDoc(id, "ws_bench_floor", Date.now(), { epoch: 1, state: "running" }));
  await js.publish(`bench.ev.floor.${id}`, started, { msgID: `${id}:1` });
  await js.publish(`bench.ev.floor.${id}`, ended, { msgID: `${id}:2` });
  await finish(id);
  return id;
}

const finishOne = async (id: string) => {
  const res = await floorRuns.updateOne({ _id: id, epoch: 1 }, { $set: { state: "idle", last_activity_at: Date.now() } });
  if (res.matchedCount !== 1) throw new Error(`floor update matched ${res.matchedCount}`);
};
app.post("/floor/admit", async (_request, reply) => {
  const id = floorId();
  await floorRuns.insertOne(runDoc(id, "ws_bench_floor", Date.now(), { epoch: 1, state: "running" }));
  await js.publish(`bench.ev.floor.${id}`, started, { msgID: `${id}:1` });
  return reply.status(202).send({ id });
});
app.post("/floor/turn", async (_request, reply) => reply.status(200).send({ id: await floorTurn((doc) => floorRuns.insertOne(doc), finishOne) }));

const inserts = new InsertBatcher(floorRuns);
const updates: { id: string; settle: (error?: unknown) => void }[] = [];
let updating = false;
/** Updates queued while one bulk is in flight go together in the next (at most 16). */
async function writeUpdates(): Promise<void> {
  updating = true;
  try {
    while (updates.length > 0) {
      const batch = updates.splice(0, 16);
      const now = Date.now();
      try {
        const res = await floorRuns.bulkWrite(
          batch.map((u) => ({ updateOne: { filter: { _id: u.id, epoch: 1 }, update: { $set: { state: "idle", last_activity_at: now } } } })),
          { ordered: false },
        );
        const error = res.matchedCount === batch.length ? undefined : new Error(`floor bulk matched ${res.matchedCount} of ${batch.length}`);
        for (const u of batch) u.settle(error);
      } catch (err) {
        for (const u of batch) u.settle(err);
      }
    }
  } finally {
    updating = false;
  }
}
const finishBatched = (id: string) =>
  new Promise<void>((resolve, reject) => {
    updates.push({ id, settle: (error) => (error === undefined ? resolve() : reject(error)) });
    if (!updating) void writeUpdates();
  });
app.post("/floor/turn-batched", async (_request, reply) => reply.status(200).send({ id: await floorTurn((doc) => inserts.insert(doc), finishBatched) }));

let tails = 0;
let tailErrors = 0;
/** Admission before the answer, the turn's end after it. */
function floorBackground(insert: (doc: Doc) => Promise<unknown>, finish: (id: string) => Promise<void>) {
  return async (_request: FastifyRequest, reply: FastifyReply) => {
    const id = floorId();
    await insert(runDoc(id, "ws_bench_floor", Date.now(), { epoch: 1, state: "running" }));
    await js.publish(`bench.ev.floor.${id}`, started, { msgID: `${id}:1` });
    tails++;
    void js
      .publish(`bench.ev.floor.${id}`, ended, { msgID: `${id}:2` })
      .then(() => finish(id))
      .catch(() => tailErrors++)
      .finally(() => tails--);
    return reply.status(202).send({ id });
  };
}
app.post("/floor/background", floorBackground((doc) => floorRuns.insertOne(doc), finishOne));
app.post("/floor/background-batched", floorBackground((doc) => inserts.insert(doc), finishBatched));
app.get("/floor/tails", async () => ({ pending: tails, errors: tailErrors }));

await app.listen({ port: 0, host: "127.0.0.1" });
const address = app.server.address();
const port = typeof address === "object" && address ? address.port : 0;

process.on("disconnect", () => process.exit(1));
process.on("message", async (msg: { op: string }) => {
  if (msg.op === "stop") {
    await app.close();
    await nc.close();
    await client.close();
    process.exit(0);
  }
});
process.send!({ ready: true, url: `http://127.0.0.1:${port}` });
