import { chmod, mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import pino, { type Logger } from "pino";
import { loadConfig, type Config } from "../../src/config.js";
import { freePort, startFerretDb, startNatsServer, type ServerProcess } from "../../node/servers.js";
import { startService, type RunningService } from "../../node/service.js";
import { createWorkspace } from "../../node/workspaces.js";
import type { Plan } from "../../src/domain.js";
import { openRawDb, type RawDb } from "./raw-db.js";

/** Real nats-server and FerretDB on free loopback ports, in a temp dir, for one test file. */
export interface TestServers {
  dir: string;
  nats: ServerProcess;
  ferret: ServerProcess;
  natsUrl: string;
  mongoUri: string;
  servicePassword: string;
  tapPassword: string;
  /**
   * The database of this cluster: every service started on these servers shares it,
   * as nodes sharing one NATS must (they share partition ownership).
   */
  dbName: string;
  /** The test's own connection to that database (opened once, closed by `stop`). */
  raw(): Promise<RawDb>;
  stop(): Promise<void>;
}

export async function startTestServers(): Promise<TestServers> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "runs-test-"));
  // Sandboxes run as an unprivileged uid that must reach the nodes' workspaces below.
  await chmod(dir, 0o711);
  const servicePassword = "svc-test-password";
  const tapPassword = "tap-test-password";
  const natsPort = await freePort();
  const nats = await startNatsServer({
    port: natsPort,
    storeDir: path.join(dir, "nats"),
    logFile: path.join(dir, "nats.log"),
    servicePassword,
    tapPassword,
  });
  let ferret: ServerProcess;
  let mongoUri = process.env.RUNS_TEST_MONGODB_URI;
  if (mongoUri) {
    ferret = { name: "external", port: 0, child: undefined as never, pid: 0, stop: async () => undefined, kill: () => undefined };
  } else {
    const mongoPort = await freePort();
    try {
      ferret = await startFerretDb({ port: mongoPort, dataDir: path.join(dir, "ferretdb"), logFile: path.join(dir, "ferretdb.log") });
    } catch (err) {
      // A NATS server left running would keep the test's worker alive after its failure.
      await nats.stop().catch(() => undefined);
      throw err;
    }
    mongoUri = `mongodb://127.0.0.1:${mongoPort}/`;
  }
  let raw: Promise<RawDb> | undefined;
  const servers: TestServers = {
    dir,
    nats,
    ferret,
    natsUrl: `nats://127.0.0.1:${natsPort}`,
    mongoUri,
    servicePassword,
    tapPassword,
    dbName: `runs_${Math.random().toString(36).slice(2, 10)}`,
    raw: () => (raw ??= openRawDb(servers.mongoUri, servers.dbName)),
    async stop() {
      if (raw) await (await raw).close().catch(() => undefined);
      // Fault tests replace `nats`/`ferret` with restarted servers: stop the current ones.
      await Promise.all([servers.nats.stop(), servers.ferret.stop()]);
      await rm(dir, { recursive: true, force: true });
    },
  };
  return servers;
}

/** Starts the servers' NATS again on `port` and its store dir (a fault test stopped it); `servers.nats` is the new one. */
export async function restartNats(servers: TestServers, port: number): Promise<void> {
  servers.nats = await startNatsServer({
    port,
    storeDir: path.join(servers.dir, "nats"),
    logFile: path.join(servers.dir, "nats.log"),
    servicePassword: servers.servicePassword,
    tapPassword: servers.tapPassword,
  });
}

/** Starts the servers' FerretDB again on `port` and its data dir (a fault test stopped it); `servers.ferret` is the new one. */
export async function restartFerret(servers: TestServers, port: number): Promise<void> {
  servers.ferret = await startFerretDb({ port, dataDir: path.join(servers.dir, "ferretdb"), logFile: path.join(servers.dir, "ferretdb.log") });
}

/** A config for a node against the test servers; `env` overrides settings as the environment would. */
export function testConfig(servers: TestServers, env: Record<string, string> = {}): Config {
  return loadConfig({
    PORT: "0",
    HOST: "127.0.0.1",
    RUNS_DATA_DIR: path.join(servers.dir, `node-${Math.random().toString(36).slice(2, 8)}`),
    NATS_URL: servers.natsUrl,
    NATS_USER: "runs",
    NATS_PASSWORD: servers.servicePassword,
    MONGODB_URI: servers.mongoUri,
    MONGODB_DB: servers.dbName,
    // Distinct per service: several services in one test process are several nodes.
    RUNS_NODE_ID: `test-node-${Math.random().toString(36).slice(2, 8)}`,
    RUNS_MASTER_KEY: Buffer.alloc(32, 7).toString("base64"),
    RUNS_PARTITIONS: "8",
    RUNS_LEASE_TTL_MS: "3000",
    LOG_LEVEL: process.env.RUNS_TEST_LOG_LEVEL ?? "silent",
    // Tests poll freely; the rate-limit tests lower these.
    RUNS_RATE_SOLO: "1000000",
    RUNS_RATE_BUSINESS: "1000000",
    RUNS_RATE_EXPENSIVE_SOLO: "1000000",
    RUNS_RATE_EXPENSIVE_BUSINESS: "1000000",
    ...env,
  });
}

export async function startTestService(servers: TestServers, env: Record<string, string> = {}): Promise<RunningService> {
  const config = testConfig(servers, env);
  return startService(config, { log: pino({ level: config.logLevel }) });
}

/** A logger at `info` whose lines (parsed) collect in `logs`, for tests that read what a service logged. */
export function collectedLogs(): { logs: Array<Record<string, unknown>>; log: Logger } {
  const logs: Array<Record<string, unknown>> = [];
  const sink = new Writable({
    write(chunk, _encoding, done) {
      for (const line of String(chunk).split("\n")) if (line) logs.push(JSON.parse(line));
      done();
    },
  });
  return { logs, log: pino({ level: "info" }, sink) };
}

/** A small HTTP client for the API under test. */
export class Api {
  constructor(
    readonly baseUrl: string,
    readonly key?: string,
  ) {}

  withKey(key: string | undefined): Api {
    return new Api(this.baseUrl, key);
  }

  async request(
    method: string,
    url: string,
    options: { body?: unknown; idempotencyKey?: string; headers?: Record<string, string>; rawBody?: string } = {},
  ): Promise<{ status: number; body: any; headers: Headers }> {
    const headers: Record<string, string> = { ...options.headers };
    if (this.key) headers.authorization = `Bearer ${this.key}`;
    if (options.idempotencyKey) headers["idempotency-key"] = options.idempotencyKey;
    let body: string | undefined;
    if (options.rawBody !== undefined) body = options.rawBody;
    else if (options.body !== undefined) body = JSON.stringify(options.body);
    if (body !== undefined) headers["content-type"] ??= "application/json";
    const res = await fetch(`${this.baseUrl}${url}`, { method, headers, body, signal: AbortSignal.timeout(180_000) });
    const text = await res.text();
    let parsed: unknown = text;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {
      // not JSON; keep the text
    }
    return { status: res.status, body: parsed, headers: res.headers };
  }

  get(url: string) {
    return this.request("GET", url);
  }

  post(url: string, body?: unknown, idempotencyKey: string | undefined = `k-${Math.random().toString(36).slice(2)}`) {
    return this.request("POST", url, { body, idempotencyKey });
  }

  /** Creates an agent with a ready, active deployment of `config`; returns the agent id. */
  async agentWith(config: Record<string, unknown>, name = "test-agent"): Promise<string> {
    const agent = await this.post("/api/v1/agents", { name });
    if (agent.status !== 201) throw new Error(`agent create failed: ${JSON.stringify(agent.body)}`);
    const deployed = await this.deploy(agent.body.id, config);
    await this.waitDeployment(agent.body.id, deployed.version);
    return agent.body.id as string;
  }

  async deploy(agentId: string, config: Record<string, unknown>, extra: Record<string, unknown> = {}) {
    const res = await this.post(`/api/v1/agents/${agentId}/deployments`, { config, ...extra });
    if (res.status !== 201) throw new Error(`deploy failed: ${res.status} ${JSON.stringify(res.body)}`);
    return res.body as { version: number; status: string };
  }

  /** Polls a deployment until it leaves `building` (bounded). */
  async waitDeployment(agentId: string, version: number): Promise<{ status: string }> {
    for (let i = 0; i < 200; i++) {
      const res = await this.get(`/api/v1/agents/${agentId}/deployments/${version}`);
      if (res.body?.status !== "building") return res.body;
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
    throw new Error("deployment stayed building");
  }

  /** Polls a run's turn until it is final (bounded). */
  async waitTurn(runId: string, turnId: string, timeoutMs = 30_000): Promise<any> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const res = await this.get(`/api/v1/runs/${runId}?turn_id=${turnId}`);
      if (["completed", "failed", "cancelled", "incomplete"].includes(res.body?.turn?.status)) return res.body;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    throw new Error(`turn ${turnId} not final within ${timeoutMs} ms`);
  }

  /** Polls until `predicate` holds for the run (bounded). */
  async waitRun(runId: string, predicate: (run: any) => boolean, timeoutMs = 30_000): Promise<any> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const res = await this.get(`/api/v1/runs/${runId}`);
      if (predicate(res.body)) return res.body;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    throw new Error(`run ${runId} did not reach the expected state within ${timeoutMs} ms`);
  }
}

/** A workspace with an all-scopes key on the service's store. */
export async function newWorkspace(service: RunningService, plan: Plan = "solo"): Promise<{ id: string; key: string; api: Api }> {
  const created = await createWorkspace(service.store, { plan, nowMs: Date.now() });
  const key = created.api_key.key as string;
  return { id: created.workspace.id, key, api: new Api(service.url!, key) };
}
