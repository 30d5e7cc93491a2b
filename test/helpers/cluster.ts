import { FAULT_LOAD_ENV, startCluster, type Cluster, type ClusterOptions } from "../../scripts/cluster.js";
import { Api } from "./servers.js";

export { type Cluster } from "../../scripts/cluster.js";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * A local cluster for a test file: 3 NATS servers, FerretDB, 3 nodes with a 3 s lease,
 * a 2 s drain and the node logs at info in the cluster's temp dir
 * (RUNS_CLUSTER_KEEP=1 keeps that dir for reading the logs after a failure).
 */
export function startTestCluster(options: ClusterOptions = {}): Promise<Cluster> {
  return startCluster({
    nodes: 3,
    keepDir: process.env.RUNS_CLUSTER_KEEP === "1",
    ...options,
    env: {
      ...FAULT_LOAD_ENV,
      LOG_LEVEL: process.env.RUNS_TEST_LOG_LEVEL ?? "info",
      ...options.env,
    },
  });
}

/** The API of node `i` with the cluster's key. */
export function nodeApi(cluster: Cluster, i: number): Api {
  return new Api(cluster.nodes[i].url, cluster.key);
}

/** Brings every NATS server and node back up (after a test that killed some). */
export async function restoreCluster(cluster: Cluster): Promise<void> {
  for (let i = 0; i < cluster.nats.length; i++) await cluster.startNats(i);
  for (const node of cluster.nodes) {
    if (node.paused) cluster.resumeNode(node.index);
    if (!node.child || node.child.exitCode !== null || node.child.signalCode !== null) await cluster.startNode(node.index);
  }
  for (const node of cluster.nodes) await cluster.waitReady(node.index, 60_000);
}

export interface Answer {
  status: number;
  body: any;
  /** Requests sent, including retries. */
  attempts: number;
  /** The 503 answers and connection failures on the way. */
  unavailable: number;
}

/**
 * The spec's reference client, made patient for fault tests: retries 429, 502, 503,
 * 504 and connection failures with the same Idempotency-Key, waiting Retry-After,
 * moving to the next node on each retry (as a load balancer would), within
 * `maxAttempts` and `timeoutMs`.
 */
export async function postWithRetry(
  cluster: Cluster,
  firstNode: number,
  url: string,
  body: unknown,
  idempotencyKey: string,
  { maxAttempts = 12, timeoutMs = 60_000 } = {},
): Promise<Answer> {
  const deadline = Date.now() + timeoutMs;
  let unavailable = 0;
  let last: Answer | undefined;
  for (let attempt = 0; attempt < maxAttempts && Date.now() < deadline; attempt++) {
    const node = (firstNode + attempt) % cluster.nodes.length;
    try {
      const res = await nodeApi(cluster, node).request("POST", url, { body, idempotencyKey });
      last = { status: res.status, body: res.body, attempts: attempt + 1, unavailable };
      if (![429, 502, 503, 504].includes(res.status)) return last;
      unavailable++;
      const retryAfterS = Number(res.headers.get("retry-after") ?? 1);
      await sleep(Math.min(3, Math.max(0.2, retryAfterS)) * 1000);
    } catch {
      // Connection refused or reset: the node is down or restarting.
      unavailable++;
      await sleep(200);
    }
  }
  return last ?? { status: 0, body: undefined, attempts: maxAttempts, unavailable };
}

/** GET with retries on 5xx and connection failures (reads are repeatable). */
export async function getWithRetry(cluster: Cluster, url: string, timeoutMs = 20_000): Promise<{ status: number; body: any }> {
  const deadline = Date.now() + timeoutMs;
  let last: { status: number; body: any } = { status: 0, body: undefined };
  for (let attempt = 0; attempt < 1000 && Date.now() < deadline; attempt++) {
    const node = cluster.nodes[attempt % cluster.nodes.length];
    if (!node.child || node.paused) continue;
    try {
      const res = await new Api(node.url, cluster.key).get(url);
      last = res;
      if (res.status < 500) return res;
    } catch {
      // try the next node
    }
    await sleep(100);
  }
  return last;
}

const FINAL = ["completed", "failed", "cancelled", "incomplete"];

/** Waits (bounded) until the turn is final, reading through any live node. */
export async function waitFinal(cluster: Cluster, runId: string, turnId: string, timeoutMs = 30_000): Promise<any> {
  const deadline = Date.now() + timeoutMs;
  for (let attempt = 0; attempt < 2000 && Date.now() < deadline; attempt++) {
    const res = await getWithRetry(cluster, `/api/v1/runs/${runId}?turn_id=${turnId}`, Math.max(1_000, deadline - Date.now()));
    if (FINAL.includes(res.body?.turn?.status)) return res.body;
    await sleep(100);
  }
  throw new Error(`turn ${turnId} of run ${runId} not final within ${timeoutMs} ms`);
}

/** Every event of a run (bounded pages). */
export async function allEvents(cluster: Cluster, runId: string): Promise<any[]> {
  const events: any[] = [];
  let after: string | undefined;
  for (let page = 0; page < 50; page++) {
    const res = await getWithRetry(cluster, `/api/v1/runs/${runId}/events?limit=100${after ? `&after=${encodeURIComponent(after)}` : ""}`);
    if (res.status !== 200) throw new Error(`events of ${runId}: ${res.status} ${JSON.stringify(res.body)}`);
    events.push(...res.body.data);
    if (!res.body.has_more) return events;
    after = res.body.next_cursor;
  }
  throw new Error(`events of ${runId}: more than 50 pages`);
}

/** Starts background runs until one lands on a partition held by node `owner` (bounded). */
export async function runOwnedBy(cluster: Cluster, owner: number, agent: string, via: number, input = "work", attempts = 40): Promise<any> {
  for (let i = 0; i < attempts; i++) {
    const res = await nodeApi(cluster, via).post("/api/v1/runs", { agent, input, background: true });
    if (res.status !== 202) throw new Error(`start failed ${res.status} ${JSON.stringify(res.body)}`);
    if ((await cluster.ownerOf(res.body.id)) === owner) return res.body;
  }
  throw new Error(`no run on node ${owner} after ${attempts} starts`);
}

/** Polls `check` until it returns a value other than undefined (bounded). */
export async function until<T>(what: string, check: () => Promise<T | undefined>, timeoutMs = 20_000, everyMs = 100): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (let attempt = 0; attempt < 100_000 && Date.now() < deadline; attempt++) {
    const value = await check();
    if (value !== undefined) return value;
    await sleep(everyMs);
  }
  throw new Error(`${what}: not within ${timeoutMs} ms`);
}

export function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

export { sleep };
