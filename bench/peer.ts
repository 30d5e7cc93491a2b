/**
 * The peer of `npm run bench` (issue 15): Restate, measured on the same machine in the same
 * run. On first use it installs `@restatedev/restate-server` and `@restatedev/restate-sdk`
 * into `.bench/peer/` (git-ignored; never a dependency of the service), then starts a
 * Restate server on loopback with a fresh data directory and an SDK endpoint serving an echo
 * virtual object (one key per invocation, as we start one run per request), registers it,
 * and measures what the bench compares with our default-wait echo turn and background start.
 *
 * Every wait is bounded; anything missing (no npm registry, another platform) skips the
 * section with the reason instead of failing the bench.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { freePort } from "../node/servers.js";
import { load, request, sleep, type LoadResult } from "./lib.js";

export const RESTATE_SERVER_VERSION = "1.7.12";
export const RESTATE_SDK_VERSION = "1.17.2";
const PEER_DIR = path.resolve(".bench/peer");

/** The SDK endpoint: an echo virtual object. Its SDK wants Node 22's Promise.withResolvers. */
const ECHO_SERVICE = `if (!Promise.withResolvers) {
  Promise.withResolvers = function () {
    let resolve, reject;
    const promise = new Promise((a, b) => { resolve = a; reject = b; });
    return { promise, resolve, reject };
  };
}
const restate = await import("@restatedev/restate-sdk");
const echo = restate.object({ name: "echo", handlers: { run: async (_ctx, input) => input } });
restate.serve({ services: [echo], port: Number(process.env.PORT) });
`;

export interface Peer {
  ingress: string;
  stop(): Promise<void>;
}

function serverBinary(): string {
  return path.join(PEER_DIR, "node_modules", "@restatedev", `restate-server-${process.platform}-${process.arch}`, "bin", "restate-server");
}

/** Installs the pinned Restate server and SDK into .bench/peer once; the reason when it cannot. */
export async function installPeer(log: (...args: unknown[]) => void): Promise<string | undefined> {
  const sdk = path.join(PEER_DIR, "node_modules", "@restatedev", "restate-sdk", "package.json");
  if (existsSync(serverBinary()) && existsSync(sdk)) return undefined;
  log(`installing @restatedev/restate-server@${RESTATE_SERVER_VERSION} and @restatedev/restate-sdk@${RESTATE_SDK_VERSION} into .bench/peer (first use)`);
  await mkdir(PEER_DIR, { recursive: true });
  await writeFile(path.join(PEER_DIR, "package.json"), JSON.stringify({ private: true, description: "npm run bench's peer (Restate); not part of the service" }));
  const code = await run("npm", ["install", "--no-audit", "--no-fund", "--no-save", `@restatedev/restate-server@${RESTATE_SERVER_VERSION}`, `@restatedev/restate-sdk@${RESTATE_SDK_VERSION}`], PEER_DIR, 300_000);
  if (code !== 0) return `npm install of Restate failed (exit ${code}); the peer section needs the npm registry`;
  if (!existsSync(serverBinary())) return `Restate ships no server binary for ${process.platform}-${process.arch}`;
  return undefined;
}

function run(command: string, args: string[], cwd: string, timeoutMs: number): Promise<number> {
  return new Promise((resolve) => {
    const child = spawn(command, args, { cwd, stdio: "ignore" });
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.on("exit", (code) => {
      clearTimeout(timer);
      resolve(code ?? 1);
    });
    child.on("error", () => {
      clearTimeout(timer);
      resolve(1);
    });
  });
}

async function until(what: string, check: () => Promise<boolean>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (let i = 0; i < 10_000 && Date.now() < deadline; i++) {
    if (await check().catch(() => false)) return;
    await sleep(100);
  }
  throw new Error(`Restate peer: ${what} not within ${timeoutMs} ms`);
}

/** Starts Restate on loopback ports with a fresh data dir and the echo endpoint, registered. */
export async function startPeer(): Promise<Peer> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "bench-restate-"));
  const [fabric, admin, ingress, endpoint] = [await freePort(), await freePort(), await freePort(), await freePort()];
  const config = [
    `base-dir = ${JSON.stringify(path.join(dir, "data"))}`,
    `node-name = "bench"`,
    `bind-address = "127.0.0.1:${fabric}"`,
    `advertised-address = "http://127.0.0.1:${fabric}/"`,
    "disable-telemetry = true",
    `log-filter = "error"`,
    "[admin]",
    `bind-address = "127.0.0.1:${admin}"`,
    "disable-web-ui = true",
    "[ingress]",
    `bind-address = "127.0.0.1:${ingress}"`,
  ].join("\n");
  await writeFile(path.join(dir, "restate.toml"), config);
  await writeFile(path.join(PEER_DIR, "echo.mjs"), ECHO_SERVICE);
  const children: ChildProcess[] = [];
  const stop = async () => {
    for (const child of children) child.kill("SIGTERM");
    await sleep(500);
    for (const child of children) if (child.exitCode === null) child.kill("SIGKILL");
    await rm(dir, { recursive: true, force: true });
  };
  try {
    children.push(spawn(serverBinary(), ["--config-file", path.join(dir, "restate.toml"), "--no-logo", "--listen-mode", "tcp"], { stdio: "ignore", env: { ...process.env, RESTATE_LOG_FILTER: "error" } }));
    children.push(spawn(process.execPath, [path.join(PEER_DIR, "echo.mjs")], { cwd: PEER_DIR, stdio: "ignore", env: { ...process.env, PORT: String(endpoint) } }));
    const adminUrl = `http://127.0.0.1:${admin}`;
    await until("the admin API", async () => (await request(adminUrl, "GET", "/health")).status === 200, 30_000);
    await until("registering the echo endpoint", async () => {
      const res = await request(adminUrl, "POST", "/deployments", { body: { uri: `http://127.0.0.1:${endpoint}`, force: true } });
      return res.status === 201 || res.status === 200;
    }, 30_000);
    const ingressUrl = `http://127.0.0.1:${ingress}`;
    await until("the first echo call", async () => (await request(ingressUrl, "POST", "/echo/warmup/run", { body: "hi", timeoutMs: 5_000 })).status === 200, 30_000);
    return { ingress: ingressUrl, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** Call-and-wait of the echo object, each call on a new key: like a default-wait start of a run. */
export function peerCall(peer: Peer, clients: number, total: number, maxMs: number): Promise<LoadResult> {
  const prefix = Math.random().toString(36).slice(2, 8);
  return load(clients, total, maxMs, async (i) => {
    const res = await request(peer.ingress, "POST", `/echo/${prefix}-${i}/run`, { body: "hello", timeoutMs: 20_000 });
    return res.status === 200 && res.body === "hello";
  });
}

/**
 * Idempotent one-way sends at `clients` (each a new key with an Idempotency-Key, like a
 * background start), then attaches to every invocation: the send rate, and the rate at
 * which they completed (from the first send to the last completion).
 */
export async function peerSend(peer: Peer, clients: number, total: number, maxMs: number): Promise<{ send: LoadResult; completedRate: number; completed: number }> {
  const prefix = Math.random().toString(36).slice(2, 8);
  const ids: string[] = [];
  const started = performance.now();
  const send = await load(clients, total, maxMs, async (i) => {
    const res = await request(peer.ingress, "POST", `/echo/${prefix}-${i}/run/send`, { body: "hello", idempotencyKey: `send-${prefix}-${i}`, timeoutMs: 20_000 });
    if (res.status !== 202 && res.status !== 200) return false;
    ids.push(res.body.invocationId);
  });
  let completed = 0;
  await load(clients, ids.length, maxMs, async (i) => {
    const res = await request(peer.ingress, "GET", `/restate/invocation/${ids[i]}/attach`, { timeoutMs: 20_000 });
    if (res.status === 200 && res.body === "hello") completed++;
    else return false;
  });
  return { send, completedRate: (completed / (performance.now() - started)) * 1000, completed };
}
