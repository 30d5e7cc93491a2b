import test from "ava";
import net from "node:net";
import { collectedLogs, startTestServers, startTestService, testConfig } from "../helpers/servers.js";
import { startService } from "../../node/service.js";
import { MongoStore } from "../../src/mongo-store.js";

/**
 * A node whose start fails part way closes what it had opened by then: its store and
 * NATS connections, its partition leases' and sweepers' timers, its Fastify instance.
 * Otherwise the process that tried (a test's worker, a program embedding the service)
 * stays alive on them. Judged by what keeps this process's event loop alive, before and
 * after; real servers.
 */

/** How many of each kind of resource keep the event loop alive. */
function liveResources(): Map<string, number> {
  const counts = new Map<string, number>();
  for (const kind of process.getActiveResourcesInfo()) counts.set(kind, (counts.get(kind) ?? 0) + 1);
  return counts;
}

/** The kinds with more live resources now than in `before` (bounded wait for them to close: 10 s). */
async function leftOpen(before: Map<string, number>): Promise<Record<string, number>> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const extra: Record<string, number> = {};
    for (const [kind, n] of liveResources()) if (n > (before.get(kind) ?? 0)) extra[kind] = n - (before.get(kind) ?? 0);
    if (Object.keys(extra).length === 0 || Date.now() > deadline) return extra;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

test.serial("failed start - a port already taken: everything the node had started by then is closed, and the next start works", async (t) => {
  const servers = await startTestServers();
  const taken = net.createServer();
  await new Promise<void>((resolve) => taken.listen(0, "127.0.0.1", resolve));
  try {
    const port = (taken.address() as net.AddressInfo).port;
    const before = liveResources();
    const { logs, log } = collectedLogs();
    // The port is the last thing a node takes: the store, NATS, its leases and sweepers are all running by then.
    const error = await t.throwsAsync(startService(testConfig(servers, { PORT: String(port), LOG_LEVEL: "info" }), { log }));
    t.regex(error!.message, /EADDRINUSE/);
    t.deepEqual(await leftOpen(before), {}, "nothing the failed start opened keeps the process alive");
    t.true(
      logs.some((line) => line.msg === "the node could not start: closing what it had opened"),
      "the log says the node closed what it had opened",
    );
    // A start on the same servers after it is a node like any other.
    const service = await startTestService(servers);
    try {
      t.is((await fetch(`${service.url}/healthz`)).status, 200);
    } finally {
      await service.close();
    }
  } finally {
    taken.close();
    await servers.stop();
  }
});

test.serial("failed start - NATS refuses the node's password: the store connection it had opened is closed", async (t) => {
  const servers = await startTestServers();
  try {
    const before = liveResources();
    const error = await t.throwsAsync(startTestService(servers, { NATS_PASSWORD: "not-the-password" }));
    t.regex(error!.message, /auth/i);
    t.deepEqual(await leftOpen(before), {}, "nothing the failed start opened keeps the process alive");
  } finally {
    await servers.stop();
  }
});

test.serial("failed start - no store at the address: nothing is left open", async (t) => {
  const servers = await startTestServers();
  const closedPort = net.createServer();
  await new Promise<void>((resolve) => closedPort.listen(0, "127.0.0.1", resolve));
  const port = (closedPort.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => closedPort.close(() => resolve()));
  try {
    const before = liveResources();
    servers.mongoUri = `mongodb://127.0.0.1:${port}/`;
    await t.throwsAsync(startTestService(servers));
    t.deepEqual(await leftOpen(before), {}, "nothing the failed start opened keeps the process alive");
  } finally {
    await servers.stop();
  }
});

test.serial("failed start - a store that connects but fails its first command (buildInfo): its client is closed", async (t) => {
  const servers = await startTestServers();
  const ferret = new URL(servers.mongoUri);
  // Forwards to FerretDB, but cuts every connection that asks for buildInfo (retries included).
  const sockets = new Set<net.Socket>();
  const proxy = net.createServer((client) => {
    const upstream = net.connect(Number(ferret.port), ferret.hostname);
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.on("close", () => sockets.delete(socket));
      socket.on("error", () => undefined);
    }
    client.on("data", (chunk) => {
      if (chunk.includes("buildInfo")) {
        client.destroy();
        upstream.destroy();
      } else upstream.write(chunk);
    });
    upstream.on("data", (chunk) => client.write(chunk));
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  });
  await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
  try {
    const before = liveResources();
    const port = (proxy.address() as net.AddressInfo).port;
    await t.throwsAsync(MongoStore.connect(`mongodb://127.0.0.1:${port}/`, servers.dbName));
    // The proxy's own sockets are this process's too: the client's ends must all be gone.
    const deadline = Date.now() + 10_000;
    while (sockets.size > 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 100));
    t.is(sockets.size, 0, "every connection the client opened (its monitor's too) is closed");
    t.deepEqual(await leftOpen(before), {}, "nothing the failed connect opened keeps the process alive");
  } finally {
    for (const socket of sockets) socket.destroy();
    await new Promise<void>((resolve) => proxy.close(() => resolve()));
    await servers.stop();
  }
});
