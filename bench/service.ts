/**
 * Starting the processes the benchmark measures: a service node (bench/service-child.ts)
 * and the Fastify baseline (bench/noop-server.ts), each in its own Node process with IPC.
 */
import { spawn, type ChildProcess } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { MongoStore } from "../src/mongo-store.js";
import { createWorkspace } from "../node/workspaces.js";
import type { Plan } from "../src/domain.js";
import type { TestServers } from "../test/helpers/servers.js";
import { request, sleep } from "./lib.js";

const HERE = path.dirname(fileURLToPath(import.meta.url));

export interface Child {
  proc: ChildProcess;
  url: string;
  call(op: string, extra?: Record<string, unknown>): Promise<any>;
  stop(): Promise<void>;
}

async function startChild(file: string, env: NodeJS.ProcessEnv, nodeArgs: string[] = []): Promise<Child> {
  const proc = spawn(process.execPath, ["--import", "tsx", "--expose-gc", ...nodeArgs, path.join(HERE, file)], {
    stdio: ["ignore", "inherit", "inherit", "ipc"],
    env: { ...process.env, ...env },
  });
  let nextId = 1;
  const waiting = new Map<number, (msg: any) => void>();
  const ready = new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${file} did not start within 60 s`)), 60_000);
    proc.on("message", (msg: any) => {
      if (msg.ready) {
        clearTimeout(timer);
        resolve(msg.url);
      } else if (msg.id) waiting.get(msg.id)?.(msg);
    });
    proc.once("exit", (code) => reject(new Error(`${file} exited with ${code}`)));
  });
  const url = await ready;
  const call = (op: string, extra: Record<string, unknown> = {}) =>
    new Promise<any>((resolve, reject) => {
      const id = nextId++;
      const timer = setTimeout(() => reject(new Error(`${op} timed out`)), 60_000);
      waiting.set(id, (msg) => {
        clearTimeout(timer);
        waiting.delete(id);
        resolve(msg);
      });
      proc.send({ op, id, ...extra });
    });
  return {
    proc,
    url,
    call,
    async stop() {
      if (proc.exitCode !== null) return;
      const exited = new Promise((resolve) => proc.once("exit", resolve));
      proc.send({ op: "stop", id: nextId++ });
      const timer = setTimeout(() => proc.kill("SIGKILL"), 45_000);
      await exited;
      clearTimeout(timer);
    },
  };
}

export function serviceEnv(servers: TestServers, db: string, extra: Record<string, string> = {}): Record<string, string> {
  return {
    PORT: "0",
    HOST: "127.0.0.1",
    RUNS_DATA_DIR: path.join(servers.dir, `node-${db}`),
    NATS_URL: servers.natsUrl,
    NATS_USER: "runs",
    NATS_PASSWORD: servers.servicePassword,
    MONGODB_URI: servers.mongoUri,
    MONGODB_DB: db,
    RUNS_MASTER_KEY: Buffer.alloc(32, 7).toString("base64"),
    RUNS_LEASE_TTL_MS: "10000",
    RUNS_DRAIN_MS: "0",
    LOG_LEVEL: "silent",
    // The bench measures the service, not its limits.
    RUNS_RATE_SOLO: "100000000",
    RUNS_RATE_BUSINESS: "100000000",
    RUNS_RATE_EXPENSIVE_SOLO: "100000000",
    RUNS_RATE_EXPENSIVE_BUSINESS: "100000000",
    RUNS_ACTIVE_TURNS_BUSINESS: "100000",
    RUNS_WAIT_TIMEOUT_MS: "120000",
    ...extra,
  };
}

export async function startServiceChild(servers: TestServers, db: string, extra: Record<string, string> = {}): Promise<Child> {
  // BENCH_NODE_ARGS: V8 flags for the service nodes (e.g. --trace-deopt), which NODE_OPTIONS refuses.
  const nodeArgs = [
    ...(process.env.BENCH_PROFILE ? ["--cpu-prof", `--cpu-prof-dir=${path.resolve(".bench/prof")}`] : []),
    ...(process.env.BENCH_NODE_ARGS ?? "").split(" ").filter(Boolean),
  ];
  const child = await startChild("service-child.ts", { BENCH_SERVICE_ENV: JSON.stringify(serviceEnv(servers, db, extra)) }, nodeArgs);
  // Ready once the node holds partitions (readyz), bounded.
  for (let i = 0; i < 200; i++) {
    const res = await request(child.url, "GET", "/readyz").catch(() => undefined);
    if (res?.status === 200) break;
    await sleep(50);
  }
  return child;
}

export function startNoopServer(servers: TestServers, db: string): Promise<Child> {
  return startChild("noop-server.ts", { BENCH_MONGO_URI: servers.mongoUri, BENCH_MONGO_DB: db, BENCH_NATS_URL: servers.natsUrl, BENCH_NATS_PASSWORD: servers.servicePassword });
}

/** A workspace with an all-scopes key, created through the store as the admin command does. */
export async function benchWorkspace(mongoUri: string, db: string, plan: Plan = "business"): Promise<{ id: string; key: string; store: MongoStore }> {
  const store = await MongoStore.connect(mongoUri, db);
  const created = await createWorkspace(store, { plan, nowMs: Date.now() });
  return { id: created.workspace.id, key: created.api_key.key as string, store };
}

/** An agent with a ready, active deployment of `config`. */
export async function agentWith(url: string, key: string, config: Record<string, unknown>): Promise<string> {
  const agent = await request(url, "POST", "/api/v1/agents", { key, body: { name: "bench" } });
  if (agent.status !== 201) throw new Error(`agent: ${agent.status} ${JSON.stringify(agent.body)}`);
  const id = agent.body.id as string;
  const dep = await request(url, "POST", `/api/v1/agents/${id}/deployments`, { key, body: { config }, idempotencyKey: `dep-${Math.random()}` });
  if (dep.status !== 201) throw new Error(`deploy: ${dep.status} ${JSON.stringify(dep.body)}`);
  for (let i = 0; i < 400; i++) {
    const res = await request(url, "GET", `/api/v1/agents/${id}/deployments/${dep.body.version}`, { key });
    if (res.body?.status === "ready") return id;
    if (res.body?.status === "failed") throw new Error(`deployment failed: ${JSON.stringify(res.body)}`);
    await sleep(25);
  }
  throw new Error("deployment stayed building");
}
