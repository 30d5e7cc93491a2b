/**
 * Small helpers of the benchmark: statistics, a keep-alive HTTP client, an SSE frame
 * counter, bounded concurrent loops and process memory readings. Loopback only.
 */
import http from "node:http";
import { readFileSync, readdirSync } from "node:fs";

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** The q-quantile (0..1) of `values` (nearest rank). */
export function quantile(values: number[], q: number): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[rank]!;
}

export interface Summary {
  median: number;
  min: number;
  max: number;
  runs: number[];
}

export function summarize(values: number[]): Summary {
  return { median: quantile(values, 0.5), min: Math.min(...values), max: Math.max(...values), runs: values };
}

/** One repetition of a load: its rate and per-operation latencies (ms). */
export interface LoadResult {
  ops: number;
  errors: number;
  elapsedMs: number;
  rate: number;
  p50: number;
  p99: number;
}

/**
 * Runs `op` from `concurrency` workers until `total` operations are done or `maxMs`
 * passed (whichever first): bounded in count and in time.
 */
export async function load(
  concurrency: number,
  total: number,
  maxMs: number,
  op: (i: number, worker: number) => Promise<boolean | void>,
): Promise<LoadResult> {
  const latencies: number[] = [];
  let next = 0;
  let errors = 0;
  const start = performance.now();
  const deadline = start + maxMs;
  const worker = async (w: number) => {
    while (next < total && performance.now() < deadline) {
      const i = next++;
      const t0 = performance.now();
      try {
        const ok = await op(i, w);
        if (ok === false) errors++;
        else latencies.push(performance.now() - t0);
      } catch {
        errors++;
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, (_, w) => worker(w)));
  const elapsedMs = performance.now() - start;
  return {
    ops: latencies.length,
    errors,
    elapsedMs,
    rate: (latencies.length / elapsedMs) * 1000,
    p50: quantile(latencies, 0.5),
    p99: quantile(latencies, 0.99),
  };
}

// ---- HTTP ----------------------------------------------------------------------------

export const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });

export interface HttpAnswer {
  status: number;
  body: any;
  headers: http.IncomingHttpHeaders;
}

/** One JSON request over a keep-alive connection. */
export function request(
  base: string,
  method: string,
  path: string,
  options: { key?: string; body?: unknown; idempotencyKey?: string; timeoutMs?: number } = {},
): Promise<HttpAnswer> {
  const url = new URL(path, base);
  const payload = options.body === undefined ? undefined : JSON.stringify(options.body);
  const headers: Record<string, string> = {};
  if (options.key) headers.authorization = `Bearer ${options.key}`;
  if (options.idempotencyKey) headers["idempotency-key"] = options.idempotencyKey;
  if (payload !== undefined) {
    headers["content-type"] = "application/json";
    headers["content-length"] = String(Buffer.byteLength(payload));
  }
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: url.hostname, port: url.port, path: url.pathname + url.search, method, headers, agent, timeout: options.timeoutMs ?? 180_000 },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString("utf8");
          let body: unknown = text;
          try {
            body = text ? JSON.parse(text) : undefined;
          } catch {
            // keep text
          }
          resolve({ status: res.statusCode ?? 0, body, headers: res.headers });
        });
        res.on("error", reject);
      },
    );
    req.on("timeout", () => req.destroy(new Error("request timed out")));
    req.on("error", reject);
    if (payload !== undefined) req.write(payload);
    req.end();
  });
}

export interface SseCount {
  status: number;
  events: number;
  /** Events of this type. */
  typed: number;
  firstEventMs: number;
  endMs: number;
  sawFinal: boolean;
}

const FRAME_END = Buffer.from("\n\n");
const FINAL_TURN_TYPES = new Set(["completed", "failed", "cancelled", "incomplete"]);

/**
 * Opens an SSE stream (GET, or POST with a body) and counts its frames until the server
 * ends it or `timeoutMs` passes. `typed` counts frames whose event type is `countType`.
 */

export function sseCount(
  base: string,
  method: "GET" | "POST",
  path: string,
  options: { key: string; body?: unknown; countType: string; timeoutMs: number },
): Promise<SseCount> {
  const url = new URL(path, base);
  const payload = options.body === undefined ? undefined : JSON.stringify(options.body);
  const headers: Record<string, string> = { authorization: `Bearer ${options.key}`, accept: "text/event-stream" };
  if (payload !== undefined) {
    headers["content-type"] = "application/json";
    headers["idempotency-key"] = `sse-${Math.random().toString(36).slice(2)}`;
  }
  const start = performance.now();
  return new Promise((resolve, reject) => {
    const result: SseCount = { status: 0, events: 0, typed: 0, firstEventMs: NaN, endMs: NaN, sawFinal: false };
    // Counted on the bytes as they come (no text decoding, no string per frame): this client
    // shares the machine's cores with the service it measures.
    const typeLine = Buffer.from(`event: ${options.countType}\n`);
    const turnLine = Buffer.from("event: turn.");
    let carry: Buffer | undefined;
    const req = http.request({ host: url.hostname, port: url.port, path: url.pathname + url.search, method, headers, agent: false }, (res) => {
      result.status = res.statusCode ?? 0;
      const timer = setTimeout(() => req.destroy(), options.timeoutMs);
      res.on("data", (chunk: Buffer) => {
        const buf = carry ? Buffer.concat([carry, chunk]) : chunk;
        let from = 0;
        for (;;) {
          const end = buf.indexOf(FRAME_END, from);
          if (end < 0) break;
          // Event frames are `id: …\nevent: <type>\ndata: …\n\n`; pings and error frames have no id.
          if (buf[from] === 0x69 && buf[from + 1] === 0x64 && buf[from + 2] === 0x3a) {
            if (result.events === 0) result.firstEventMs = performance.now() - start;
            result.events++;
            const typeAt = buf.indexOf(0x0a, from) + 1;
            if (buf.compare(typeLine, 0, typeLine.length, typeAt, typeAt + typeLine.length) === 0) result.typed++;
            else if (buf.compare(turnLine, 0, turnLine.length, typeAt, typeAt + turnLine.length) === 0) {
              const type = buf.toString("latin1", typeAt + turnLine.length, buf.indexOf(0x0a, typeAt));
              if (FINAL_TURN_TYPES.has(type)) result.sawFinal = true;
            }
          }
          from = end + 2;
        }
        carry = from < buf.length ? buf.subarray(from) : undefined;
      });
      const done = () => {
        clearTimeout(timer);
        result.endMs = performance.now() - start;
        resolve(result);
      };
      res.on("end", done);
      res.on("close", done);
      res.on("error", done);
    });
    req.on("error", reject);
    if (payload !== undefined) req.write(payload);
    req.end();
  });
}

// ---- processes --------------------------------------------------------------------------

/** A `<field>: <n> kB` line of a /proc file of `pid`, in bytes (0 when the process is gone). */
function procBytes(pid: number, file: string, field: string): number {
  try {
    const m = new RegExp(`${field}:\\s+(\\d+) kB`).exec(readFileSync(`/proc/${pid}/${file}`, "utf8"));
    return m ? Number(m[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

/** Resident set size of a process in bytes (0 when it is gone). */
export function rssOf(pid: number): number {
  return procBytes(pid, "status", "VmRSS");
}

/** CPU seconds (user + system) a process has used so far, from /proc/<pid>/stat (100 ticks a second). */
export function cpuSecondsOf(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/** Proportional set size (shared pages split among sharers) in bytes. */
export function pssOf(pid: number): number {
  return procBytes(pid, "smaps_rollup", "Pss");
}

/** Every descendant of `pid` (one scan of /proc; sandboxed processes keep their host pids and parents). */
export function descendantsOf(pid: number): number[] {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      const list = children.get(ppid) ?? [];
      list.push(Number(entry));
      children.set(ppid, list);
    } catch {
      // gone meanwhile
    }
  }
  const out: number[] = [];
  const queue = [pid];
  while (queue.length > 0) {
    for (const child of children.get(queue.shift()!) ?? []) {
      out.push(child);
      queue.push(child);
    }
  }
  return out;
}

/** Direct children of `pid` (scans /proc; bounded by the process table). */
export function childrenOf(pid: number): number[] {
  const out: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      // pid (comm) state ppid ...
      const close = stat.lastIndexOf(")");
      const ppid = Number(stat.slice(close + 2).split(" ")[1]);
      if (ppid === pid) out.push(Number(entry));
    } catch {
      // gone
    }
  }
  return out;
}

export const MiB = 1024 * 1024;
export const fmt = (n: number, digits = 1) => (Number.isFinite(n) ? n.toFixed(digits) : "–");
