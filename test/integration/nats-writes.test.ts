import anyTest, { type TestFn } from "ava";
import type { Msg, NatsConnection } from "@nats-io/transport-node";
import { coalesceWrites, connectNats } from "../../src/nats.js";
import { startTestServers, type TestServers } from "../helpers/servers.js";

/**
 * connectNats coalesces a connection's socket writes to one per turn of the event loop
 * (src/nats.ts, coalesceWrites). Against a real nats-server: what is queued across
 * microtasks leaves in one write and arrives whole and in order, a large burst is not
 * held back, requests and flush still work, and a close writes what was queued.
 */

interface Context {
  servers: TestServers;
}
const test = anyTest as TestFn<Context>;

test.before(async (t) => {
  t.context = { servers: await startTestServers() };
});

test.after.always(async (t) => {
  await t.context.servers?.stop();
});

const connectTo = (t: { context: Context }, name: string) =>
  connectNats({ url: t.context.servers.natsUrl, user: "runs", password: t.context.servers.servicePassword, name });

/** Counts the writes to the connection's socket from now on (the client's transport of this version). */
function countWrites(nc: NatsConnection): { readonly count: number } {
  const socket = (nc as unknown as { protocol: { transport: { socket: { write: (...args: unknown[]) => boolean } } } }).protocol.transport.socket;
  const counter = { count: 0 };
  const write = socket.write.bind(socket);
  socket.write = (...args: unknown[]) => {
    counter.count++;
    return write(...args);
  };
  return counter;
}

/** Collects `count` messages on `subject` (bounded by 10 s). */
async function collect(nc: NatsConnection, subject: string, count: number): Promise<{ done: Promise<string[]> }> {
  const got: string[] = [];
  const sub = nc.subscribe(subject, { max: count });
  const done = (async () => {
    const timer = setTimeout(() => sub.unsubscribe(), 10_000);
    for await (const m of sub) got.push((m as Msg).string());
    clearTimeout(timer);
    return got;
  })();
  await nc.flush();
  return { done };
}

test("publishes spread over 200 microtasks of one loop turn leave in one socket write and arrive whole, in order", async (t) => {
  const pub = await connectTo(t, "writes-pub");
  const sub = await connectTo(t, "writes-sub");
  try {
    const { done } = await collect(sub, "writes.order", 200);
    const writes = countWrites(pub);
    await new Promise<void>((resolve) => {
      setTimeout(async () => {
        for (let i = 0; i < 200; i++) {
          pub.publish("writes.order", `m${i}`);
          await Promise.resolve();
        }
        resolve();
      }, 0);
    });
    await pub.flush();
    // The 200 publishes in one write, then flush's PING in another.
    t.true(writes.count <= 2, `${writes.count} writes`);
    t.deepEqual(await done, Array.from({ length: 200 }, (_, i) => `m${i}`));
  } finally {
    await pub.close();
    await sub.close();
  }
});

test("a burst past the client's write threshold is written before the loop turn ends", async (t) => {
  const pub = await connectTo(t, "writes-burst");
  const sub = await connectTo(t, "writes-burst-sub");
  try {
    const { done } = await collect(sub, "writes.burst", 16);
    const writes = countWrites(pub);
    const payload = new Uint8Array(64 * 1024).fill(7);
    for (let i = 0; i < 16; i++) pub.publish("writes.burst", payload);
    // Still in the same synchronous run. The client writes inline when a command finds
    // the queue holding something and the two pass its threshold: every second publish.
    t.true(writes.count >= 7, `${writes.count} writes`);
    t.is((await done).length, 16);
  } finally {
    await pub.close();
    await sub.close();
  }
});

test("requests get their replies and publishes queued just before close are delivered", async (t) => {
  const client = await connectTo(t, "writes-client");
  const responder = await connectTo(t, "writes-responder");
  const sub = await connectTo(t, "writes-close-sub");
  try {
    responder.subscribe("writes.echo", { callback: (_err, m) => void m.respond(`re:${m.string()}`) });
    await responder.flush();
    for (let i = 0; i < 50; i++) t.is((await client.request("writes.echo", `q${i}`, { timeout: 5_000 })).string(), `re:q${i}`);
    // The stock client loses these (its close ends the socket before its queued write).
    const { done } = await collect(sub, "writes.last", 30);
    for (let i = 0; i < 30; i++) client.publish("writes.last", `l${i}`);
    await client.close();
    t.deepEqual(await done, Array.from({ length: 30 }, (_, i) => `l${i}`));
  } finally {
    if (!client.isClosed()) await client.close();
    await responder.close();
    await sub.close();
  }
});

test("a connection without the internals it was written against is left as it is", (t) => {
  const stranger = { protocol: { flushPending() {} } } as unknown as NatsConnection;
  t.false(coalesceWrites(stranger));
  t.false(coalesceWrites({} as NatsConnection));
});
