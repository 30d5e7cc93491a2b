/**
 * Baselines with the client code paths the service uses: @nats-io/transport-node request/
 * reply, @nats-io/jetstream publish with ack and ordered-consumer reads on a stream
 * configured like the event streams, the MongoDB driver with the service's pool options.
 */
import { headers as natsHeaders, type NatsConnection } from "@nats-io/transport-node";
import { DeliverPolicy, DiscardPolicy, RetentionPolicy, StorageType, jetstream, jetstreamManager, type JetStreamClient } from "@nats-io/jetstream";
import { MongoClient, type Collection } from "mongodb";
import { connectNats } from "../src/nats.js";
import { EventKeyring, seal } from "../src/event-crypto.js";
import { load, type LoadResult } from "./lib.js";

export const BENCH_STREAM = "BENCH_EVENTS";
const encoder = new TextEncoder();

export interface BareClients {
  nc: NatsConnection;
  responder: NatsConnection;
  js: JetStreamClient;
  mongo: MongoClient;
  runs: Collection<{ _id: string; [k: string]: unknown }>;
  /** Where the insert baselines write, so the read collection keeps its size. */
  inserts: Collection<{ _id: string; [k: string]: unknown }>;
  close(): Promise<void>;
}

export async function bareClients(natsUrl: string, password: string, mongoUri: string, db: string): Promise<BareClients> {
  const nc = await connectNats({ url: natsUrl, user: "runs", password, name: "bench-client" });
  const responder = await connectNats({ url: natsUrl, user: "runs", password, name: "bench-responder" });
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({
    name: BENCH_STREAM,
    subjects: ["bench.ev.>"],
    retention: RetentionPolicy.Limits,
    storage: StorageType.File,
    discard: DiscardPolicy.Old,
    max_age: 3600 * 1_000_000_000,
    num_replicas: 1,
    duplicate_window: 120 * 1_000_000_000,
  });
  // The same responder shape as the actor host: a subscription callback that responds.
  responder.subscribe("bench.echo", { callback: (_err, msg) => void msg.respond(msg.data) });
  await responder.flush();
  const mongo = new MongoClient(mongoUri, { serverSelectionTimeoutMS: 3_000, connectTimeoutMS: 3_000, maxPoolSize: 50 });
  await mongo.connect();
  const runs = mongo.db(db).collection<{ _id: string; [k: string]: unknown }>("runs");
  return {
    nc,
    responder,
    js: jetstream(nc),
    mongo,
    runs,
    inserts: mongo.db(db).collection<{ _id: string; [k: string]: unknown }>("runs_inserts"),
    async close() {
      await jsm.streams.delete(BENCH_STREAM).catch(() => undefined);
      await nc.drain().catch(() => undefined);
      await responder.drain().catch(() => undefined);
      await mongo.close();
    },
  };
}

/** A sealed event payload of realistic size (a text_delta envelope). */
export function eventPayload(seq: number): Uint8Array {
  const key = new EventKeyring(Buffer.alloc(32, 7).toString("base64")).keyFor("ws_bench");
  const envelope = {
    v: 1,
    ms: Date.now(),
    tf: 2,
    event: { sequence: seq, source: "runtime", type: "text_delta", run_id: "run_000000000BENCHBENCHBENCH", turn_id: "turn_00000000BENCHBENCHBENCH", created_at: 1, data: { contentIndex: 0, delta: "xxxxxxxxxxxxxxxx" } },
  };
  return seal(key, Buffer.from(JSON.stringify(envelope), "utf8"));
}

/** A run document shaped like the service's (RunDoc). */
export function runDoc(id: string, workspaceId: string, now: number, extra: Record<string, unknown> = {}): { _id: string; [k: string]: unknown } {
  return {
    _id: id,
    workspace_id: workspaceId,
    agent_id: "agt_bench",
    agent_version: 1,
    versions: [1],
    partition: 0,
    state: "idle",
    tags: [],
    plan: "business",
    retention_s: 30 * 86_400,
    event_retention_s: 28 * 86_400,
    created_at: now,
    last_activity_at: now,
    expires_at: now + 30 * 86_400_000,
    epoch: 1,
    turn_count: 1,
    latest_turn_id: `turn_${id.slice(4)}`,
    active_turn_id: null,
    queued_turn_id: null,
    event_seq: 3,
    ...extra,
  };
}

let unique = 0;
const uid = () => `${process.pid}x${Date.now().toString(36)}x${(unique++).toString(36)}`;

export async function natsRequestReply(c: BareClients, concurrency: number, total: number): Promise<LoadResult> {
  const payload = encoder.encode(JSON.stringify({ op: "tags", workspace_id: "ws_bench", run_id: "run_bench", add: [], remove: [] }));
  return load(concurrency, total, 20_000, async () => {
    const msg = await c.nc.request("bench.echo", payload, { timeout: 5_000 });
    JSON.parse(new TextDecoder().decode(msg.data));
  });
}

/** Publish with ack; `inFlight` publishes outstanding at once (1 = one after another). */
export async function jsPublish(c: BareClients, inFlight: number, total: number): Promise<LoadResult> {
  const subject = `bench.ev.pub.${uid()}`;
  const payload = eventPayload(1);
  return load(inFlight, total, 20_000, async (i) => {
    const h = natsHeaders();
    h.set("Runs-Seq", String(i + 1));
    h.set("Runs-Turn", "turn_bench");
    await c.js.publish(subject, payload, { msgID: `${subject}:${i}`, headers: h, retries: 5 });
  });
}

/** Fills a subject with `count` events (pipelined); returns the subject. */
export async function fillSubject(c: BareClients, count: number): Promise<string> {
  const subject = `bench.ev.read.${uid()}`;
  const payload = eventPayload(1);
  await load(256, count, 60_000, async (i) => {
    await c.js.publish(subject, payload, { msgID: `${subject}:${i}` });
  });
  return subject;
}

/** Reads `count` messages of `subject` with an ordered consumer, as the SSE path does (consume, 256 at a time). */
export async function orderedRead(c: Pick<BareClients, "js">, subject: string, count: number, stream = BENCH_STREAM): Promise<{ rate: number; elapsedMs: number; read: number }> {
  const start = performance.now();
  const consumer = await c.js.consumers.get(stream, { filter_subjects: subject, deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: 1 });
  const messages = await consumer.consume({ max_messages: 256 });
  let read = 0;
  const timer = setTimeout(() => void messages.close(), 60_000);
  for await (const msg of messages) {
    void msg.data;
    if (++read >= count) break;
  }
  clearTimeout(timer);
  await messages.close().catch(() => undefined);
  await consumer.delete().catch(() => undefined);
  const elapsedMs = performance.now() - start;
  return { rate: (read / elapsedMs) * 1000, elapsedMs, read };
}

export async function storeInsert(c: BareClients, concurrency: number, total: number): Promise<LoadResult> {
  const now = Date.now();
  return load(concurrency, total, 20_000, async () => {
    await c.inserts.insertOne(runDoc(`run_bench${uid()}`, "ws_bench_baseline", now));
  });
}

export async function storeRead(c: BareClients, ids: string[], concurrency: number, total: number): Promise<LoadResult> {
  return load(concurrency, total, 20_000, async () => {
    const doc = await c.runs.findOne({ _id: ids[Math.floor(Math.random() * ids.length)]! });
    return doc !== null;
  });
}

/** One store insert then one JetStream publish with ack, back to back (what a background admission must at least do). */
export async function insertThenPublish(c: BareClients, concurrency: number, total: number): Promise<LoadResult> {
  const now = Date.now();
  const payload = eventPayload(1);
  return load(concurrency, total, 20_000, async () => {
    const id = `run_bench${uid()}`;
    await c.inserts.insertOne(runDoc(id, "ws_bench_baseline", now));
    await c.js.publish(`bench.ev.adm.${id}`, payload, { msgID: `${id}:1` });
  });
}
