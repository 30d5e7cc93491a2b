/**
 * The egress proxy through which a sandbox with a network allow list reaches the
 * network. The sandbox has no route out of its network namespace; inside it, socat
 * relays 127.0.0.1:3128 to a Unix socket of this proxy, bind-mounted into the
 * sandbox. One listening socket per command, so the proxy knows whose policy applies.
 *
 * It speaks the HTTP proxy protocol: `CONNECT host:port` (tunnels, for HTTPS and
 * anything else) and absolute-form requests (`GET http://host/path`, plain HTTP).
 * Each destination must match the allow list (exact names or `*.suffix`), and every
 * address it resolves to must pass the address guard; the proxy then connects to the
 * checked address itself. A refusal is answered 403 with a line naming the policy,
 * and reported once through `onDenied`.
 */
import http from "node:http";
import net from "node:net";
import { chmod, rm } from "node:fs/promises";
import type { Duplex } from "node:stream";
import type { Logger } from "pino";
import { ConfigurationError, hostAllowed, type Lookup, NetworkPolicyError, resolveAllowed } from "../src/index.js";

export interface EgressPolicy {
  allow: readonly string[];
}

export interface EgressDenial {
  host: string;
  port: number;
  reason: string;
}

export interface EgressProxyOptions {
  log: Logger;
  /**
   * TEST ONLY (`RUNS_EGRESS_TEST_HOSTS`): names mapped to loopback servers. The allow
   * list still applies to them; the address guard does not.
   */
  testHosts?: ReadonlyMap<string, { host: string; port: number }>;
  connectTimeoutMs?: number;
  /** Connections one command may hold open at once. */
  maxConnections?: number;
  /** A tunnel or request with no traffic for this long is closed. */
  idleTimeoutMs?: number;
  /** DNS, replaceable in tests. */
  lookup?: Lookup;
}

/** Header on the proxy's own refusals, so a client can tell them from a server's 403. */
export const POLICY_HEADER = "x-runs-network-policy";

export class EgressProxy {
  constructor(private readonly options: EgressProxyOptions) {}

  /**
   * Listens on `socketPath` (made connectable for the sandbox's uid) until closed.
   * `onDenied` is called once per refused connection.
   */
  async open(socketPath: string, policy: EgressPolicy, onDenied: (denial: EgressDenial) => void): Promise<{ close(): Promise<void> }> {
    const { log } = this.options;
    const connectTimeoutMs = this.options.connectTimeoutMs ?? 10_000;
    const maxConnections = this.options.maxConnections ?? 64;
    const idleTimeoutMs = this.options.idleTimeoutMs ?? 300_000;
    const sockets = new Set<net.Socket | Duplex>();
    let open = 0;

    const deny = (host: string, port: number, reason: string): string => {
      onDenied({ host, port, reason });
      log.info({ host, port, reason }, "egress refused");
      return `network policy denied ${host}:${port} (${reason})\n`;
    };

    /** The address to connect to, or a refusal. */
    const destination = async (host: string, port: number): Promise<{ host: string; port: number } | { refused: string }> => {
      const name = host.toLowerCase().replace(/\.$/, "");
      if (!Number.isInteger(port) || port < 1 || port > 65535) return { refused: deny(name, port, "invalid port") };
      if (!hostAllowed(name, policy.allow)) return { refused: deny(name, port, "not in the deployment's allow list") };
      const mapped = this.options.testHosts?.get(name);
      if (mapped) return mapped;
      try {
        const { address } = await resolveAllowed(name, { lookup: this.options.lookup });
        return { host: address, port };
      } catch (err) {
        if (err instanceof NetworkPolicyError) return { refused: deny(name, port, err.reason) };
        return { refused: deny(name, port, "could not resolve") };
      }
    };

    const connect = (target: { host: string; port: number }): Promise<net.Socket> =>
      new Promise((resolve, reject) => {
        const upstream = net.connect({ host: target.host, port: target.port });
        const timer = setTimeout(() => upstream.destroy(new Error("connect timed out")), connectTimeoutMs);
        upstream.once("connect", () => {
          clearTimeout(timer);
          resolve(upstream);
        });
        upstream.once("error", (err) => {
          clearTimeout(timer);
          reject(err);
        });
      });

    const track = (socket: net.Socket | Duplex) => {
      sockets.add(socket);
      socket.once("close", () => sockets.delete(socket));
      socket.on("error", () => undefined);
      if ("setTimeout" in socket) socket.setTimeout(idleTimeoutMs, () => socket.destroy());
    };

    const server = http.createServer();
    server.maxHeadersCount = 100;
    server.headersTimeout = 30_000;
    server.requestTimeout = 0;

    server.on("connection", (socket: net.Socket) => track(socket));
    server.on("clientError", (_err, socket) => {
      if (socket.writable) socket.end("HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
      else socket.destroy();
    });

    server.on("connect", async (req: http.IncomingMessage, client: Duplex, head: Buffer) => {
      track(client);
      const refuse = (status: string, body: string) =>
        client.end(`HTTP/1.1 ${status}\r\n${POLICY_HEADER}: denied\r\ncontent-type: text/plain\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
      const target = parseAuthority(req.url ?? "");
      if (!target) return client.end("HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
      if (open >= maxConnections) return client.end("HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
      open++;
      client.once("close", () => open--);
      const dest = await destination(target.host, target.port);
      if ("refused" in dest) return refuse("403 Forbidden", dest.refused);
      let upstream: net.Socket;
      try {
        upstream = await connect(dest);
      } catch (err) {
        return client.end(`HTTP/1.1 502 Bad Gateway\r\nconnection: close\r\ncontent-length: 0\r\n\r\n`);
      }
      track(upstream);
      if (client.destroyed) return upstream.destroy();
      client.write("HTTP/1.1 200 Connection Established\r\n\r\n");
      if (head.length) upstream.write(head);
      upstream.pipe(client);
      client.pipe(upstream);
      upstream.once("close", () => client.destroy());
      client.once("close", () => upstream.destroy());
    });

    server.on("request", async (req: http.IncomingMessage, res: http.ServerResponse) => {
      let url: URL;
      try {
        url = new URL(req.url ?? "");
      } catch {
        res.writeHead(400, { connection: "close" }).end("absolute-form URL expected\n");
        return;
      }
      if (url.protocol !== "http:") {
        res.writeHead(400, { connection: "close" }).end("only http:// is proxied this way; use CONNECT\n");
        return;
      }
      if (open >= maxConnections) {
        res.writeHead(503, { connection: "close" }).end();
        return;
      }
      open++;
      res.once("close", () => open--);
      const port = url.port ? Number(url.port) : 80;
      const dest = await destination(url.hostname.replace(/^\[|\]$/g, ""), port);
      if ("refused" in dest) {
        res.writeHead(403, { [POLICY_HEADER]: "denied", "content-type": "text/plain", connection: "close" }).end(dest.refused);
        return;
      }
      const headers: http.OutgoingHttpHeaders = {};
      for (const [name, value] of Object.entries(req.headers)) {
        if (HOP_BY_HOP.has(name) || name.startsWith("proxy-")) continue;
        headers[name] = value;
      }
      headers.host = url.host;
      const upstream = http.request(
        // agent: false: no connection is pooled, let alone shared between sandboxes.
        { host: dest.host, port: dest.port, method: req.method, path: url.pathname + url.search, headers, timeout: connectTimeoutMs, agent: false },
        (answer) => {
          const out: http.OutgoingHttpHeaders = {};
          for (const [name, value] of Object.entries(answer.headers)) if (!HOP_BY_HOP.has(name)) out[name] = value;
          res.writeHead(answer.statusCode ?? 502, out);
          answer.pipe(res);
        },
      );
      upstream.on("timeout", () => upstream.destroy(new Error("timed out")));
      upstream.on("error", () => {
        if (!res.headersSent) res.writeHead(502, { connection: "close" }).end();
        else res.destroy();
      });
      req.pipe(upstream);
    });

    await rm(socketPath, { force: true });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(socketPath, () => {
        server.off("error", reject);
        resolve();
      });
    });
    await chmod(socketPath, 0o666);

    let closing: Promise<void> | undefined;
    return {
      close: () => {
        closing ??= (async () => {
          const closed = new Promise<void>((resolve) => server.close(() => resolve()));
          for (const socket of sockets) socket.destroy();
          server.closeAllConnections?.();
          await closed;
          await rm(socketPath, { force: true });
        })();
        return closing;
      },
    };
  }
}

const HOP_BY_HOP = new Set(["connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "proxy-authorization", "proxy-authenticate", "proxy-connection"]);

/** `host:port` of a CONNECT request (IPv6 in brackets), or undefined. */
export function parseAuthority(authority: string): { host: string; port: number } | undefined {
  const match = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\s/[\]]+)):(\d{1,5})$/.exec(authority);
  if (!match) return undefined;
  const port = Number(match[3]);
  if (port < 1 || port > 65535) return undefined;
  return { host: (match[1] ?? match[2])!.toLowerCase(), port };
}

/**
 * Parses `RUNS_EGRESS_TEST_HOSTS` ("name=127.0.0.1:port,…"). TEST ONLY: every target
 * must be a loopback address; anything else is refused with an error naming it.
 */
export function parseTestHosts(value: string | undefined): Map<string, { host: string; port: number }> {
  const map = new Map<string, { host: string; port: number }>();
  if (!value?.trim()) return map;
  for (const entry of value.split(",")) {
    const [name, target] = entry.split("=").map((s) => s?.trim());
    const parsed = target ? parseAuthority(target) : undefined;
    if (!name || !parsed) throw new ConfigurationError(`RUNS_EGRESS_TEST_HOSTS: "${entry}" is not name=host:port`);
    const loopback = parsed.host === "localhost" || parsed.host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(parsed.host);
    if (!loopback) throw new ConfigurationError(`RUNS_EGRESS_TEST_HOSTS: ${parsed.host} is not a loopback address (test use only)`);
    map.set(name.toLowerCase(), parsed);
  }
  return map;
}
