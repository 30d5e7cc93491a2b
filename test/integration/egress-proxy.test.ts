/**
 * The egress proxy over its Unix socket, with a real HTTP server on loopback behind
 * the test host map. Nothing here resolves or connects to anything but loopback:
 * refused names are refused before any lookup, or by an injected lookup.
 */
import test from "ava";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import pino from "pino";
import { EgressProxy, POLICY_HEADER, type EgressDenial } from "../../actors/egress-proxy.js";

interface Ctx {
  dir: string;
  server: http.Server;
  port: number;
  connections: { count: number };
}

const t_ = test as import("ava").TestFn<Ctx>;

t_.before(async (t) => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "runs-egress-"));
  const connections = { count: 0 };
  const server = http.createServer((req, res) => res.end(`hello from ${req.headers.host} ${req.url}`));
  server.on("connection", () => connections.count++);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.context = { dir, server, port: (server.address() as net.AddressInfo).port, connections };
});

t_.after.always(async (t) => {
  t.context.server.closeAllConnections();
  t.context.server.close();
  await rm(t.context.dir, { recursive: true, force: true });
});

/** Sends raw bytes to the proxy socket and collects what comes back until it closes or `until` matches. */
function exchange(socketPath: string, request: string, until?: RegExp, then?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ path: socketPath });
    let data = "";
    let sent = false;
    const timer = setTimeout(() => {
      socket.destroy();
      resolve(data);
    }, 5_000);
    socket.on("data", (chunk) => {
      data += chunk.toString();
      if (until && !sent && until.test(data)) {
        sent = true;
        if (then) socket.write(then);
        else {
          clearTimeout(timer);
          socket.destroy();
          resolve(data);
        }
      }
    });
    socket.on("error", reject);
    socket.on("close", () => {
      clearTimeout(timer);
      resolve(data);
    });
    socket.write(request);
  });
}

async function proxy(t: import("ava").ExecutionContext<Ctx>, allow: string[]) {
  const denials: EgressDenial[] = [];
  const egress = new EgressProxy({
    log: pino({ level: "silent" }),
    testHosts: new Map([["allowed.test", { host: "127.0.0.1", port: t.context.port }]]),
    // Any lookup here would be a bug in the test: names are refused before resolving.
    lookup: async (host) => (host === "localhost" ? [{ address: "127.0.0.1", family: 4 }] : [{ address: "10.9.8.7", family: 4 }]),
  });
  const socketPath = path.join(t.context.dir, `${Math.random().toString(36).slice(2, 8)}.sock`);
  const handle = await egress.open(socketPath, { allow }, (d) => denials.push(d));
  return { socketPath, handle, denials };
}

t_.serial("egress-proxy - a CONNECT to an allowed host tunnels to it", async (t) => {
  const { socketPath, handle, denials } = await proxy(t, ["allowed.test"]);
  const answer = await exchange(
    socketPath,
    `CONNECT allowed.test:${t.context.port} HTTP/1.1\r\nhost: allowed.test\r\n\r\n`,
    /\r\n\r\n/,
    "GET /tunnelled HTTP/1.1\r\nhost: allowed.test\r\nconnection: close\r\n\r\n",
  );
  t.regex(answer, /^HTTP\/1\.1 200 Connection Established/);
  t.regex(answer, /hello from allowed\.test \/tunnelled/);
  t.deepEqual(denials, []);
  await handle.close();
});

t_.serial("egress-proxy - a plain absolute-form request is forwarded with its Host", async (t) => {
  const { socketPath, handle } = await proxy(t, ["*.test"]);
  const answer = await exchange(socketPath, `GET http://allowed.test:${t.context.port}/plain?q=1 HTTP/1.1\r\nhost: allowed.test\r\nproxy-authorization: x\r\nconnection: close\r\n\r\n`);
  t.regex(answer, /^HTTP\/1\.1 200/);
  t.regex(answer, new RegExp(`hello from allowed\\.test:${t.context.port} /plain\\?q=1`));
  await handle.close();
});

t_.serial("egress-proxy - hosts off the list and private addresses are refused with 403, reported once, and never reached", async (t) => {
  const { socketPath, handle, denials } = await proxy(t, ["allowed.test", "localhost", "127.0.0.1", "internal.example"]);
  const before = t.context.connections.count;
  const attempts: Array<[string, RegExp]> = [
    [`CONNECT other.test:443 HTTP/1.1\r\n\r\n`, /not in the deployment's allow list/],
    [`CONNECT localhost:${t.context.port} HTTP/1.1\r\n\r\n`, /loopback/],
    [`CONNECT 127.0.0.1:${t.context.port} HTTP/1.1\r\n\r\n`, /loopback/],
    [`CONNECT internal.example:443 HTTP/1.1\r\n\r\n`, /private address 10\.9\.8\.7/],
    [`GET http://other.test/x HTTP/1.1\r\nhost: other.test\r\n\r\n`, /not in the deployment's allow list/],
  ];
  for (const [request, reason] of attempts) {
    const answer = await exchange(socketPath, request);
    t.regex(answer, /^HTTP\/1\.1 403/, request);
    t.regex(answer, new RegExp(`${POLICY_HEADER}: denied`, "i"));
    t.regex(answer, reason, request);
  }
  t.is(denials.length, attempts.length);
  t.deepEqual(denials[1], { host: "localhost", port: t.context.port, reason: "loopback address 127.0.0.1" });
  t.is(t.context.connections.count, before, "the loopback server saw no connection");
  await handle.close();
});

t_.serial("egress-proxy - malformed requests are answered 400 and the proxy keeps serving", async (t) => {
  const { socketPath, handle } = await proxy(t, ["allowed.test"]);
  t.regex(await exchange(socketPath, "NONSENSE\r\n\r\n"), /^HTTP\/1\.1 400/);
  t.regex(await exchange(socketPath, "CONNECT allowed.test HTTP/1.1\r\n\r\n"), /^HTTP\/1\.1 400/);
  t.regex(await exchange(socketPath, "GET /relative HTTP/1.1\r\nhost: x\r\n\r\n"), /^HTTP\/1\.1 400/);
  t.regex(await exchange(socketPath, `GET http://allowed.test:${t.context.port}/ok HTTP/1.1\r\nhost: allowed.test\r\nconnection: close\r\n\r\n`), /^HTTP\/1\.1 200/);
  await handle.close();
});

t_.serial("egress-proxy - close ends open tunnels and removes the socket", async (t) => {
  const { socketPath, handle } = await proxy(t, ["allowed.test"]);
  const socket = net.connect({ path: socketPath });
  const closed = new Promise<void>((resolve) => socket.on("close", () => resolve()));
  socket.on("error", () => undefined);
  await new Promise<void>((resolve) => {
    socket.once("data", () => resolve());
    socket.write(`CONNECT allowed.test:${t.context.port} HTTP/1.1\r\n\r\n`);
  });
  await handle.close();
  await closed;
  t.false(existsSync(socketPath));
  await t.notThrowsAsync(handle.close());
});
