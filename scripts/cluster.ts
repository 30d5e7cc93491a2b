/**
 * A local cluster on loopback: a 3-server NATS cluster (JetStream clustered, R3
 * streams and buckets), one FerretDB, and N runtime nodes as child processes
 * (`node --import tsx node/main.ts`). Used by the cluster tests (`startCluster`) and
 * from the command line:
 *
 *   node --import tsx scripts/cluster.ts [--nodes 3] [--nats 3] [--partitions 64]
 *
 * prints the node URLs and a workspace key; Ctrl-C stops everything and removes the
 * temp dir (pass --keep to keep it for the logs).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, openSync, closeSync } from "node:fs";
import { chmod, mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { NatsConnection } from "@nats-io/transport-node";
import { Kvm, type KV } from "@nats-io/kv";
import { jetstreamManager } from "@nats-io/jetstream";
import { loadConfig } from "../src/config.js";
import { MongoStore } from "../src/mongo-store.js";
import { connectNats, LEASES_BUCKET, provisionNats } from "../src/nats.js";
import { freePort, PROJECT_ROOT, startFerretDb, startNatsServer, type ServerProcess } from "../node/servers.js";
import { createWorkspace } from "../node/workspaces.js";
import { partitionOf } from "../src/partition.js";
import type { Plan } from "../src/domain.js";

/**
 * Node settings for a cluster under a fault load (the cluster tests, `npm run chaos`): a
 * 3 s lease and a short drain so that failover takes seconds, waits within the clients'
 * bounds, and workspace limits out of the way (the load is about faults, not limits).
 */
export const FAULT_LOAD_ENV: Readonly<Record<string, string>> = {
  RUNS_LEASE_TTL_MS: "3000",
  RUNS_DRAIN_MS: "2000",
  RUNS_PARTITIONS: "32",
  RUNS_WAIT_TIMEOUT_MS: "20000",
  RUNS_ACTIVE_TURNS_BUSINESS: "10000",
  RUNS_RATE_BUSINESS: "1000000",
  RUNS_RATE_EXPENSIVE_BUSINESS: "1000000",
};

export interface ClusterOptions {
  /** Runtime nodes (default 3). */
  nodes?: number;
  /** NATS servers (default 3; JetStream needs 3 for R3 to survive one loss). */
  natsServers?: number;
  /** Extra environment for every node (RUNS_LEASE_TTL_MS, RUNS_DRAIN_MS, ...). */
  env?: Record<string, string>;
  /** Plan of the workspace created for the key (default business). */
  plan?: Plan;
  /** Parent of the temp dir (default the OS temp dir). */
  baseDir?: string;
  /** Keep the temp dir (logs, stores) after `stop`. */
  keepDir?: boolean;
  /** Bound for a node to answer /readyz after its start (default 60 s). */
  readyTimeoutMs?: number;
}

export interface ClusterNode {
  index: number;
  id: string;
  port: number;
  url: string;
  logFile: string;
  /** The running process, undefined while the node is down. */
  child: ChildProcess | undefined;
  /** Whether the process is stopped with SIGSTOP. */
  paused: boolean;
}

export interface ClusterNats {
  index: number;
  name: string;
  port: number;
  clusterPort: number;
  url: string;
  server: ServerProcess | undefined;
}

export interface Cluster {
  dir: string;
  nats: ClusterNats[];
  /** All NATS client URLs, comma-separated (the nodes' NATS_URL). */
  natsUrl: string;
  natsUser: string;
  natsPassword: string;
  mongoUri: string;
  mongoDb: string;
  masterKey: string;
  partitions: number;
  nodes: ClusterNode[];
  /** The workspace created at start and its all-scopes key. */
  workspaceId: string;
  key: string;
  /** The cluster's store (same database as the nodes), for reading documents in tests. */
  store: MongoStore;
  /** A NATS connection to the cluster (all servers), for reading leases. */
  nc: NatsConnection;

  /** SIGKILL the node's process group (the node and the tool processes it started), as a crash. */
  killNode(i: number): Promise<void>;
  /** SIGTERM the node (graceful drain), await its exit (SIGKILL after `timeoutMs`). */
  stopNode(i: number, timeoutMs?: number): Promise<void>;
  /**
   * SIGSTOP the node's process group, or only the node process with `processOnly`
   * (its tool processes go on, as during a long event-loop stall).
   */
  pauseNode(i: number, options?: { processOnly?: boolean }): void;
  /** SIGCONT the node's process group. */
  resumeNode(i: number): void;
  /** Starts a stopped node again (same id, port and data dir) and waits until /readyz answers 200. */
  startNode(i: number): Promise<void>;
  /** Waits until the node answers /readyz with 200. */
  waitReady(i: number, timeoutMs?: number): Promise<void>;
  /** SIGKILL one NATS server. */
  killNats(i: number): void;
  /** Starts a killed NATS server again with its store dir. */
  startNats(i: number): Promise<void>;
  /**
   * Ends FerretDB, as a store outage: SIGTERM (or SIGKILL of its process group with
   * `crash`). The nodes' and `store`'s drivers see connection errors until `startStore`.
   */
  stopStore(options?: { crash?: boolean }): Promise<void>;
  /** Starts a stopped FerretDB again on the same port and data dir (its documents kept). */
  startStore(): Promise<void>;
  /** Whether FerretDB is running. */
  storeUp(): boolean;
  /** The node index holding the lease of the run's partition (from the leases bucket), if any. */
  ownerOf(runId: string): Promise<number | undefined>;
  /** Stops everything and removes the temp dir; safe to call twice and after a failed start. */
  stop(): Promise<void>;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Every node process group this program started, so a crash of the caller still ends them. */
const liveGroups = new Set<number>();
let exitHookInstalled = false;
function trackGroup(pid: number): void {
  liveGroups.add(pid);
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once("exit", () => {
    for (const group of liveGroups) signalGroup(group, "SIGKILL");
  });
}

function signalGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch {
    // already gone
  }
}

function exited(child: ChildProcess): boolean {
  return child.exitCode !== null || child.signalCode !== null;
}

function serverExited(server: ServerProcess): boolean {
  return exited(server.child);
}

function waitExit(child: ChildProcess, timeoutMs: number): Promise<boolean> {
  if (exited(child)) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), timeoutMs);
    child.once("exit", () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

/** Polls until JetStream answers with a meta leader (a fresh cluster elects one first). */
async function waitJetStream(nc: NatsConnection, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (let attempt = 0; attempt < 600 && Date.now() < deadline; attempt++) {
    try {
      const jsm = await jetstreamManager(nc, { timeout: 2_000 });
      await jsm.getAccountInfo();
      return;
    } catch (err) {
      last = err;
      await sleep(250);
    }
  }
  throw new Error(`JetStream did not become ready within ${timeoutMs} ms: ${String(last)}`);
}

/** Runs `provision` again while JetStream cannot place replicas yet, up to `timeoutMs`. */
async function untilPlaced<T>(provision: () => Promise<T>, timeoutMs: number): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (let attempt = 0; ; attempt++) {
    try {
      return await provision();
    } catch (err) {
      if (!/no suitable peers for placement/i.test(String(err)) || Date.now() > deadline || attempt >= 120) throw err;
      await sleep(250);
    }
  }
}

export async function startCluster(options: ClusterOptions = {}): Promise<Cluster> {
  const nodeCount = options.nodes ?? 3;
  const natsCount = options.natsServers ?? 3;
  const readyTimeoutMs = options.readyTimeoutMs ?? 60_000;
  const dir = await mkdtemp(path.join(options.baseDir ?? os.tmpdir(), "runs-cluster-"));
  // Sandboxes run as an unprivileged uid that must reach the nodes' workspaces below.
  await chmod(dir, 0o711);
  const natsUser = "runs";
  const natsPassword = randomBytes(12).toString("hex");
  const tapPassword = randomBytes(12).toString("hex");
  const masterKey = randomBytes(32).toString("base64");
  const mongoDb = "runs";
  const env: Record<string, string> = {
    RUNS_LEASE_TTL_MS: "3000",
    RUNS_DRAIN_MS: "2000",
    LOG_LEVEL: "info",
    ...options.env,
  };

  const nats: ClusterNats[] = [];
  const nodes: ClusterNode[] = [];
  let ferret: ServerProcess | undefined;
  let store: MongoStore | undefined;
  let nc: NatsConnection | undefined;
  let leases: KV | undefined;
  let stopping: Promise<void> | undefined;

  const stop = () =>
    (stopping ??= (async () => {
      for (const node of nodes) {
        if (node.child && !exited(node.child)) {
          signalGroup(node.child.pid!, "SIGCONT");
          signalGroup(node.child.pid!, "SIGKILL");
          await waitExit(node.child, 5_000);
        }
        if (node.child?.pid) liveGroups.delete(node.child.pid);
        node.child = undefined;
      }
      await nc?.close().catch(() => undefined);
      await store?.close().catch(() => undefined);
      await Promise.all(nats.map((n) => n.server?.stop().catch(() => undefined)));
      await ferret?.stop().catch(() => undefined);
      if (!options.keepDir) await rm(dir, { recursive: true, force: true }).catch(() => undefined);
    })());

  try {
    // NATS: client and route ports first, so every server can list the others' routes.
    for (let i = 0; i < natsCount; i++) {
      const port = await freePort();
      const clusterPort = await freePort();
      nats.push({ index: i, name: `nats-${i + 1}`, port, clusterPort, url: `nats://127.0.0.1:${port}`, server: undefined });
    }
    const launchNats = async (n: ClusterNats) => {
      const routes = nats.filter((o) => o !== n).map((o) => `nats://127.0.0.1:${o.clusterPort}`);
      const args = natsCount > 1 ? ["--cluster_name", "runs", "--cluster", `nats://127.0.0.1:${n.clusterPort}`, "--routes", routes.join(",")] : [];
      n.server = await startNatsServer({
        port: n.port,
        storeDir: path.join(dir, n.name),
        logFile: path.join(dir, `${n.name}.log`),
        servicePassword: natsPassword,
        tapPassword,
        serverName: n.name,
        args,
      });
    };
    const ferretPort = await freePort();
    // Every launch is waited for, even after one failed: stop() stops the servers that
    // started (one still starting when it ran would be left behind, holding the caller).
    const launches = await Promise.allSettled([
      startFerretDb({ port: ferretPort, dataDir: path.join(dir, "ferretdb"), logFile: path.join(dir, "ferretdb.log") }).then((server) => (ferret = server)),
      ...nats.map(launchNats),
    ]);
    const failed = launches.find((launch): launch is PromiseRejectedResult => launch.status === "rejected");
    if (failed) throw failed.reason;
    const mongoUri = `mongodb://127.0.0.1:${ferretPort}/`;
    const natsUrl = nats.map((n) => n.url).join(",");

    // JetStream resources at R3 before any node starts (the nodes also get
    // RUNS_NATS_REPLICAS=3; a node's provisionNats opens existing resources as they are).
    nc = await connectNats({ url: natsUrl, user: natsUser, password: natsPassword, name: "runs-cluster-launcher" });
    await waitJetStream(nc, 60_000);
    const replicas = Math.min(3, natsCount);
    env.RUNS_NATS_REPLICAS ??= String(replicas);
    const config = loadConfig({ ...env, NATS_URL: natsUrl });
    // The meta leader answers before every server is a current peer: an R3 stream may not
    // be placeable for a moment yet ("no suitable peers for placement"). Bounded retries.
    const launcher = nc;
    await untilPlaced(() => provisionNats(launcher, config.retention, config.natsReplicas, config.rateLimits.windowMs), 30_000);
    leases = await new Kvm(nc).open(LEASES_BUCKET);

    store = await MongoStore.connect(mongoUri, mongoDb);
    await store.provision();
    const created = await createWorkspace(store, { plan: options.plan ?? "business", name: "cluster", nowMs: Date.now() });

    for (let i = 0; i < nodeCount; i++) {
      const port = await freePort();
      nodes.push({
        index: i,
        id: `node-${i + 1}`,
        port,
        url: `http://127.0.0.1:${port}`,
        logFile: path.join(dir, `node-${i + 1}.log`),
        child: undefined,
        paused: false,
      });
    }

    const nodeEnv = (node: ClusterNode): NodeJS.ProcessEnv => ({
      ...process.env,
      ...env,
      PORT: String(node.port),
      HOST: "127.0.0.1",
      NATS_URL: natsUrl,
      NATS_USER: natsUser,
      NATS_PASSWORD: natsPassword,
      MONGODB_URI: mongoUri,
      MONGODB_DB: mongoDb,
      RUNS_MASTER_KEY: masterKey,
      RUNS_NODE_ID: node.id,
      RUNS_DATA_DIR: path.join(dir, node.id),
    });

    const waitReady = async (i: number, timeoutMs = readyTimeoutMs) => {
      const node = nodes[i];
      const deadline = Date.now() + timeoutMs;
      for (let attempt = 0; attempt < 10_000 && Date.now() < deadline; attempt++) {
        if (!node.child || exited(node.child)) throw new Error(`${node.id} exited while starting; see ${node.logFile}`);
        try {
          const res = await fetch(`${node.url}/readyz`, { signal: AbortSignal.timeout(2_000) });
          if (res.status === 200) return;
        } catch {
          // not listening yet
        }
        await sleep(150);
      }
      throw new Error(`${node.id} was not ready within ${timeoutMs} ms; see ${node.logFile}`);
    };

    const startNode = async (i: number) => {
      const node = nodes[i];
      if (node.child && !exited(node.child)) throw new Error(`${node.id} is running`);
      mkdirSync(path.dirname(node.logFile), { recursive: true });
      const fd = openSync(node.logFile, "a");
      try {
        // Own process group: a kill or pause reaches the tool processes the node started.
        node.child = spawn(process.execPath, ["--import", "tsx", path.join(PROJECT_ROOT, "node", "main.ts")], {
          cwd: PROJECT_ROOT,
          env: nodeEnv(node),
          stdio: ["ignore", fd, fd],
          detached: true,
        });
      } finally {
        closeSync(fd);
      }
      node.paused = false;
      trackGroup(node.child.pid!);
      await waitReady(i);
    };

    const killNode = async (i: number) => {
      const child = nodes[i].child;
      if (!child || exited(child)) return;
      signalGroup(child.pid!, "SIGKILL");
      await waitExit(child, 5_000);
      liveGroups.delete(child.pid!);
      nodes[i].paused = false;
    };

    const stopNode = async (i: number, timeoutMs = 30_000) => {
      const child = nodes[i].child;
      if (!child || exited(child)) return;
      if (nodes[i].paused) signalGroup(child.pid!, "SIGCONT");
      child.kill("SIGTERM");
      if (!(await waitExit(child, timeoutMs))) signalGroup(child.pid!, "SIGKILL");
      // Whatever the node left behind (tool processes) goes with it.
      signalGroup(child.pid!, "SIGKILL");
      await waitExit(child, 5_000);
      liveGroups.delete(child.pid!);
      nodes[i].paused = false;
    };

    await Promise.all(nodes.map((_, i) => startNode(i)));

    const cluster: Cluster = {
      dir,
      nats,
      natsUrl,
      natsUser,
      natsPassword,
      mongoUri,
      mongoDb,
      masterKey,
      partitions: config.partitions,
      nodes,
      workspaceId: created.workspace.id,
      key: created.api_key.key as string,
      store,
      nc,
      killNode,
      stopNode,
      pauseNode(i, pauseOptions = {}) {
        const child = nodes[i].child;
        if (!child || exited(child)) throw new Error(`${nodes[i].id} is not running`);
        if (pauseOptions.processOnly) child.kill("SIGSTOP");
        else signalGroup(child.pid!, "SIGSTOP");
        nodes[i].paused = true;
      },
      resumeNode(i) {
        const child = nodes[i].child;
        if (!child || exited(child)) throw new Error(`${nodes[i].id} is not running`);
        signalGroup(child.pid!, "SIGCONT");
        nodes[i].paused = false;
      },
      startNode,
      waitReady,
      killNats(i) {
        nats[i].server?.kill();
        nats[i].server = undefined;
      },
      async startNats(i) {
        if (nats[i].server && nats[i].server.child.exitCode === null && nats[i].server.child.signalCode === null) return;
        await launchNats(nats[i]);
      },
      async stopStore(storeOptions = {}) {
        const server = ferret;
        if (!server || serverExited(server)) return;
        if (storeOptions.crash) {
          const gone = new Promise((resolve) => server.child.once("exit", resolve));
          server.kill();
          await Promise.race([gone, sleep(5_000)]);
        } else {
          await server.stop();
        }
      },
      async startStore() {
        if (ferret && !serverExited(ferret)) return;
        // Same port: the nodes' MONGODB_URI names it, and their drivers reconnect to it.
        ferret = await startFerretDb({ port: ferretPort, dataDir: path.join(dir, "ferretdb"), logFile: path.join(dir, "ferretdb.log") });
      },
      storeUp() {
        return ferret !== undefined && !serverExited(ferret);
      },
      async ownerOf(runId) {
        const entry = await leases!.get(`p${partitionOf(runId, config.partitions)}`);
        if (!entry || entry.operation !== "PUT") return undefined;
        const { node } = entry.json<{ node: string }>();
        const index = nodes.findIndex((n) => n.id === node);
        return index === -1 ? undefined : index;
      },
      stop,
    };
    return cluster;
  } catch (err) {
    await stop();
    throw err;
  }
}

// ---- command line -------------------------------------------------------------------

function flagValue(args: string[], name: string): string | undefined {
  const i = args.indexOf(`--${name}`);
  return i === -1 ? undefined : args[i + 1];
}

async function main(args: string[]): Promise<void> {
  const count = (name: string, fallback: number) => {
    const value = Number(flagValue(args, name) ?? fallback);
    if (!Number.isInteger(value) || value < 1) throw new Error(`--${name} must be a positive integer`);
    return value;
  };
  const env: Record<string, string> = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (key.startsWith("RUNS_") && value !== undefined && key !== "RUNS_NODE_ID" && key !== "RUNS_DATA_DIR" && key !== "RUNS_MASTER_KEY") env[key] = value;
  }
  if (process.env.LOG_LEVEL) env.LOG_LEVEL = process.env.LOG_LEVEL;
  env.RUNS_PARTITIONS = String(count("partitions", Number(env.RUNS_PARTITIONS ?? 64)));
  const keep = args.includes("--keep");
  process.stdout.write("starting NATS cluster, FerretDB and runtime nodes…\n");
  const cluster = await startCluster({ nodes: count("nodes", 3), natsServers: count("nats", 3), env, keepDir: keep });
  process.stdout.write(
    [
      "",
      "runs cluster is up.",
      ...cluster.nodes.map((n) => `  ${n.id}: ${n.url}   (log ${n.logFile})`),
      `  NATS:    ${cluster.natsUrl}  (user runs, password ${cluster.natsPassword})`,
      `  MongoDB: ${cluster.mongoUri} (database ${cluster.mongoDb})`,
      `  files:   ${cluster.dir}${keep ? " (kept)" : " (removed at exit)"}`,
      "",
      `Workspace ${cluster.workspaceId}; its API key (all scopes):`,
      "",
      `  ${cluster.key}`,
      "",
      `Try: curl -s -H "Authorization: Bearer ${cluster.key}" ${cluster.nodes[0].url}/api/v1/runs`,
      "Ctrl-C stops everything.",
      "",
    ].join("\n"),
  );
  let stopping = false;
  const shutdown = (signal: string) => {
    if (stopping) return;
    stopping = true;
    process.stdout.write(`\n${signal}: stopping the cluster…\n`);
    const force = setTimeout(() => process.exit(1), 30_000);
    force.unref();
    void cluster.stop().finally(() => process.exit(0));
  };
  process.on("SIGINT", () => shutdown("SIGINT"));
  process.on("SIGTERM", () => shutdown("SIGTERM"));
  // Keep the event loop alive until a signal arrives.
  setInterval(() => undefined, 1 << 30);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).catch((err) => {
    process.stderr.write(`cluster: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  });
}
