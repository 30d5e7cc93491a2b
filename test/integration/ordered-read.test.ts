import anyTest, { type TestFn } from "ava";
import { mkdtemp, rm } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import type { Msg, NatsConnection } from "@nats-io/transport-node";
import { jetstream, jetstreamManager, type JetStreamClient, type JetStreamManager } from "@nats-io/jetstream";
import { freePort, startNatsServer, type ServerProcess } from "../../node/servers.js";
import { connectNats } from "../../src/nats.js";
import { MAX_PULLS, PULL_BYTES, readOrdered, storedAtMs, type OrderedReadOptions, type OrderedReadState } from "../../src/ordered-read.js";
import { systemClock } from "../../src/clock.js";

/** A nats-server of this file's own (one test restarts it), a stream `ORD` on `ord.>`. */
interface Context {
  dir: string;
  port: number;
  /** The running server, replaced when a test restarts it (held by reference: tests get a copy of the context). */
  nats: { server: ServerProcess };
  nc: NatsConnection;
  js: JetStreamClient;
  jsm: JetStreamManager;
}
const test = anyTest as TestFn<Context>;
const PASSWORD = "svc-test-password";
const STREAM = "ORD";

async function startServer(dir: string, port: number): Promise<ServerProcess> {
  return startNatsServer({ port, storeDir: path.join(dir, "nats"), logFile: path.join(dir, "nats.log"), servicePassword: PASSWORD, tapPassword: "tap-test-password" });
}

test.before(async (t) => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "runs-ordered-read-"));
  const port = await freePort();
  const server = await startServer(dir, port);
  const nc = await connectNats({ url: `nats://127.0.0.1:${port}`, user: "runs", password: PASSWORD, name: "ordered-read-test" });
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({ name: STREAM, subjects: ["ord.>"], max_msg_size: 2 * 1024 * 1024 });
  t.context = { dir, port, nats: { server }, nc, js: jetstream(nc), jsm };
});

test.after.always(async (t) => {
  await t.context.nc?.close().catch(() => undefined);
  await t.context.nats?.server.stop();
  if (t.context.dir) await rm(t.context.dir, { recursive: true, force: true });
});

let subjects = 0;
/** A subject of its own with `count` messages, the i-th (from 1) carrying `i` and `size(i)` bytes in all. */
async function fill(t: { context: Context }, count: number, size: (i: number) => number = () => 16): Promise<string> {
  const subject = `ord.s${++subjects}`;
  await storeMore(t, subject, 1, count, size);
  return subject;
}

async function storeMore(t: { context: Context }, subject: string, from: number, to: number, size: (i: number) => number = () => 16): Promise<void> {
  const acks: Promise<unknown>[] = [];
  for (let i = from; i <= to; i++) {
    const body = Buffer.alloc(Math.max(size(i), 12), 0x2e);
    body.write(`${i}:`, 0, "latin1");
    acks.push(t.context.js.publish(subject, body));
    if (acks.length >= 256) await Promise.all(acks.splice(0));
  }
  await Promise.all(acks);
}

const numberOf = (msg: Msg) => Number(Buffer.from(msg.data.subarray(0, 12)).toString("latin1").split(":")[0]);

async function consumerCount(t: { context: Context }): Promise<number> {
  return (await t.context.jsm.streams.info(STREAM)).state.consumer_count;
}

/** Reads `subject` until `count` messages came, through `handler` (returning what it returns); the read and the numbers seen. */
async function readUntil(
  t: { context: Context },
  options: Omit<OrderedReadOptions, "stream">,
  count: number,
  handler: (msg: Msg, streamSeq: number) => void | Promise<void> = () => undefined,
  observe?: (state: () => OrderedReadState) => void,
): Promise<{ seen: number[]; done: Promise<void>; controller: AbortController }> {
  const seen: number[] = [];
  const controller = new AbortController();
  const done = readOrdered(t.context.nc, t.context.jsm, systemClock, { stream: STREAM, ...options }, (msg, streamSeq) => {
    seen.push(numberOf(msg));
    if (seen.length >= count) controller.abort();
    return handler(msg, streamSeq);
  }, controller.signal, observe);
  return { seen, done, controller };
}

/** Runs `store` until the connection is back and JetStream takes it (bounded). */
async function storedOnceBack(t: { context: Context }, store: () => Promise<void>): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await store();
    } catch (err) {
      if (attempt >= 40) throw err;
      await new Promise((r) => setTimeout(r, 250));
    }
  }
}

/** Waits (at most 2 s) until `seen` holds `count` messages; the caller asserts what they are. */
async function seenAtLeast(seen: readonly number[], count: number): Promise<void> {
  for (let i = 0; i < 80 && seen.length < count; i++) await new Promise((r) => setTimeout(r, 25));
}

const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

test.serial("ordered read - every message once, in order, across many small pulls, from a start sequence, with its stored time; the end removes its consumer", async (t) => {
  const subject = await fill(t, 1_000);
  const first = await t.context.jsm.streams.getMessage(STREAM, { last_by_subj: subject });
  const startSeq = first!.seq - 1_000 + 101; // the 101st message of the subject
  const before = await consumerCount(t);
  const storedAt: number[] = [];
  const { seen, done } = await readUntil(t, { subject, startSeq, pullBatch: 7, pullBytes: 4 * 1024 }, 900, (msg) => void storedAt.push(storedAtMs(msg)));
  await done;
  t.deepEqual(seen, range(101, 1_000));
  // Each message's stored time, read from its ack subject: stored in the last minute, in order.
  t.true(storedAt.every((ms, i) => ms > Date.now() - 60_000 && ms <= Date.now() && (i === 0 || ms >= storedAt[i - 1]!)));
  // The consumer is deleted without waiting; give the server a moment.
  for (let i = 0; i < 40 && (await consumerCount(t)) > before; i++) await new Promise((r) => setTimeout(r, 50));
  t.is(await consumerCount(t), before, "no consumer left behind");
});

test.serial("ordered read - a slow reader of large messages holds at most (MAX_PULLS + 1) pulls' bytes, not a batch of them, and the server never has more than MAX_PULLS of its pulls waiting", async (t) => {
  t.timeout(60_000);
  // 300 messages of ~300 KiB: the library's consumer would hold its whole batch (77 MB here,
  // ~170 MB with 256 events of the largest stored size). The server serves waiting pulls in
  // turn, a message each, and two of these fill a pull's bytes: the read must know which pull
  // each message belongs to (a version that charged them to the oldest pull let 3 wait: this
  // test failed on it). More than a batch, so a reader that never catches up also goes past its
  // array's trimming.
  const count = 300;
  const size = 300 * 1024;
  const subject = await fill(t, count, () => size);
  let state: (() => OrderedReadState) | undefined;
  let maxHeld = 0;
  let maxWaiting = 0;
  let release: (() => void) | undefined;
  const { seen, done } = await readUntil(
    t,
    { subject, startSeq: 1 },
    count,
    () => {
      maxHeld = Math.max(maxHeld, state!().heldBytes);
      // Every message waits until the test lets it go: a client that reads slowly.
      return new Promise<void>((resolve) => (release = resolve));
    },
    (s) => (state = s),
  );
  const waitingPulls = async () => {
    let waiting = 0;
    for await (const c of t.context.jsm.consumers.list(STREAM)) if (c.config.filter_subject === subject || c.config.filter_subjects?.includes(subject)) waiting += c.num_waiting;
    return waiting;
  };
  for (let i = 0; i < count * 4 && seen.length < count; i++) {
    await new Promise((r) => setTimeout(r, 5)); // let pulls come in while the reader is blocked
    maxHeld = Math.max(maxHeld, state!().heldBytes);
    maxWaiting = Math.max(maxWaiting, await waitingPulls());
    t.true(state!().pulls <= MAX_PULLS);
    release?.();
  }
  release?.();
  await done;
  t.deepEqual(seen, range(1, count));
  t.true(maxHeld > 0, "the reader did hold messages while blocked");
  t.true(maxHeld <= (MAX_PULLS + 1) * PULL_BYTES, `held at most ${maxHeld} bytes`);
  t.true(maxWaiting <= MAX_PULLS, `the server had at most ${maxWaiting} pulls waiting`);
  t.is(state!().resets, 0);
});

test.serial("ordered read - a message larger than a pull's bytes is still read, without a stall", async (t) => {
  const subject = await fill(t, 30, (i) => (i === 15 ? 64 * 1024 : 100));
  const started = Date.now();
  const { seen, done } = await readUntil(t, { subject, startSeq: 1, pullBatch: 8, pullBytes: 4 * 1024, heartbeatMs: 2_000 }, 30);
  await done;
  t.deepEqual(seen, range(1, 30));
  t.true(Date.now() - started < 2_000, `read in ${Date.now() - started} ms (a stall would wait for missed heartbeats)`);
});

test.serial("ordered read - its consumer deleted under it: recreated after the last message received, nothing lost or repeated", async (t) => {
  const subject = await fill(t, 400);
  let state: (() => OrderedReadState) | undefined;
  let deleted = false;
  const { seen, done } = await readUntil(
    t,
    { subject, startSeq: 1, pullBatch: 16 },
    400,
    async () => {
      if (seen.length !== 50 || deleted) return;
      deleted = true;
      // Blocked at the 50th message: the consumer goes away with messages still pulled.
      for await (const c of t.context.jsm.consumers.list(STREAM)) if (c.config.filter_subject === subject || c.config.filter_subjects?.includes(subject)) await t.context.jsm.consumers.delete(STREAM, c.name);
    },
    (s) => (state = s),
  );
  await done;
  t.true(deleted);
  t.deepEqual(seen, range(1, 400));
  t.true(state!().resets >= 1, `recreated ${state!().resets} times`);
});

test.serial("ordered read - a live read waits for new messages and gets them as they are stored", async (t) => {
  const subject = await fill(t, 5);
  let state: (() => OrderedReadState) | undefined;
  const { seen, done } = await readUntil(t, { subject, startSeq: 1, heartbeatMs: 500 }, 25, undefined, (s) => (state = s));
  await seenAtLeast(seen, 5);
  t.deepEqual(seen, range(1, 5));
  await new Promise((r) => setTimeout(r, 1_500)); // heartbeats come meanwhile: no reset
  await storeMore(t, subject, 6, 25);
  await done;
  t.deepEqual(seen, range(1, 25));
  t.is(state!().resets, 0);
});

test.serial("ordered read - a handler's error ends the read with it; the first consumer not created fails it at once", async (t) => {
  const subject = await fill(t, 10);
  const boom = new Error("handler failed");
  const { done } = await readUntil(t, { subject, startSeq: 1 }, 10, (_msg, streamSeq) => {
    if (streamSeq > 0) throw boom;
  });
  t.is(await t.throwsAsync(done), boom);
  const rejected = await readUntil(t, { subject, startSeq: 1 }, 10, () => Promise.reject(boom));
  t.is(await t.throwsAsync(rejected.done), boom);
  const controller = new AbortController();
  await t.throwsAsync(readOrdered(t.context.nc, t.context.jsm, systemClock, { stream: "NO_SUCH_STREAM", subject, startSeq: 1 }, () => undefined, controller.signal));
});

test.serial("ordered read - the server restarted mid-read: missed heartbeats recreate the consumer and the read goes on after the last message; a server that stays away fails the read in bounded time", async (t) => {
  t.timeout(60_000);
  const subject = await fill(t, 20);
  let state: (() => OrderedReadState) | undefined;
  const { seen, done } = await readUntil(t, { subject, startSeq: 1, heartbeatMs: 500, resetGiveUpMs: 20_000 }, 40, undefined, (s) => (state = s));
  await seenAtLeast(seen, 20);
  t.deepEqual(seen, range(1, 20));
  await t.context.nats.server.stop();
  await new Promise((r) => setTimeout(r, 1_500)); // heartbeats are missed meanwhile
  t.context.nats.server = await startServer(t.context.dir, t.context.port);
  await storedOnceBack(t, () => storeMore(t, subject, 21, 40));
  await done;
  t.deepEqual(seen, range(1, 40));
  t.true(state!().resets >= 1);

  const gone = await fill(t, 3);
  const away = await readUntil(t, { subject: gone, startSeq: 1, heartbeatMs: 300, resetGiveUpMs: 2_000 }, 10);
  await seenAtLeast(away.seen, 3);
  await t.context.nats.server.stop();
  const stopped = Date.now();
  try {
    await t.throwsAsync(away.done);
    t.true(Date.now() - stopped < 8_000, `failed after ${Date.now() - stopped} ms`);
  } finally {
    t.context.nats.server = await startServer(t.context.dir, t.context.port);
    // The tests after this one use the connection: wait until it is back.
    await storedOnceBack(t, async () => void (await t.context.jsm.streams.info(STREAM)));
  }
});

test.serial("ordered read - the connection drops and reconnects (the server stays up): the consumer is recreated at once, not after missed heartbeats; the read goes on after the last message received, nothing lost or repeated", async (t) => {
  t.timeout(30_000);
  // A loopback proxy between this read's connection and the server, whose sockets the test cuts.
  const sockets = new Set<net.Socket>();
  const proxy = net.createServer((client) => {
    const upstream = net.connect(t.context.port, "127.0.0.1");
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.on("close", () => sockets.delete(socket));
      socket.on("error", () => undefined);
    }
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
  const nc = await connectNats({ url: `nats://127.0.0.1:${(proxy.address() as net.AddressInfo).port}`, user: "runs", password: PASSWORD, name: "ordered-read-proxied" });
  try {
    const jsm = await jetstreamManager(nc);
    const subject = await fill(t, 20);
    const seen: number[] = [];
    let state: (() => OrderedReadState) | undefined;
    const controller = new AbortController();
    // Heartbeats every 30 s: missed ones would be noticed after a minute, past this test's timeout.
    const done = readOrdered(nc, jsm, systemClock, { stream: STREAM, subject, startSeq: 1, heartbeatMs: 30_000 }, (msg) => {
      seen.push(numberOf(msg));
      if (seen.length >= 40) controller.abort();
    }, controller.signal, (s) => (state = s));
    await seenAtLeast(seen, 20);
    t.deepEqual(seen, range(1, 20));
    const reconnected = (async () => {
      for await (const status of nc.status()) if (status.type === "reconnect") return;
    })();
    for (const socket of sockets) socket.destroy();
    await storeMore(t, subject, 21, 30); // stored while the read's connection is down
    await reconnected;
    await storeMore(t, subject, 31, 40);
    await done;
    t.deepEqual(seen, range(1, 40));
    t.true(state!().resets >= 1, "the consumer was recreated after the reconnect");
  } finally {
    await nc.close().catch(() => undefined);
    for (const socket of sockets) socket.destroy();
    proxy.close();
  }
});
