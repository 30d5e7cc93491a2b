/**
 * Where a background start's cost goes: 512 background echo starts at 64 clients (after
 * 256 to warm up), with the CPU time and the read and write system calls each process
 * used per start (from /proc) and the store calls per start (driver calls counted by the
 * service child).
 *
 *   BENCH_TRACE_STORE=1 node --import tsx bench/trace-admission.ts      (N=… for another count)
 *
 * WAIT=1 makes them default-wait turns (the answer holds the finished turn) and CLIENTS=…
 * sets the concurrency (64): `WAIT=1 CLIENTS=1 N=100` is the turn-latency trace, with p50.
 *
 * Used for the per-start figures in docs/performance.md; not part of `npm run bench`.
 */
import { readFileSync } from "node:fs";
import { startTestServers } from "../test/helpers/servers.js";
import { startServiceChild, benchWorkspace, agentWith } from "./service.js";
import { cpuSecondsOf, load, request, sleep } from "./lib.js";
const N = Number(process.env.N ?? 512);
const CLIENTS = Number(process.env.CLIENTS ?? 64);
const WAIT = process.env.WAIT === "1";
const servers = await startTestServers();
const db = `trace_${Date.now()}`;
const svc = await startServiceChild(servers, db, process.env.EXTRA ? JSON.parse(process.env.EXTRA) : {});
const ws = await benchWorkspace(servers.mongoUri, db);
// AGENT='{"tokens_per_second":0.05}' keeps each turn waiting in its model call past the measurement: admission and turn start alone.
const echo = await agentWith(svc.url, ws.key, { model: "faux/scripted", tools: [], ...(process.env.AGENT ? JSON.parse(process.env.AGENT) : {}) });
const cpu = cpuSecondsOf;
/** Read and write system calls of a process so far (/proc/<pid>/io counts every thread's). */
const io = (pid: number) => { const t = readFileSync(`/proc/${pid}/io`, "utf8"); const n = (f: string) => Number(t.match(new RegExp(`^${f}: (\\d+)`, "m"))?.[1] ?? 0); return { reads: n("syscr"), writes: n("syscw") }; };
const start = (bg = !WAIT) => request(svc.url, "POST", "/api/v1/runs", { key: ws.key, body: { agent: echo, input: "hello", background: bg }, idempotencyKey: `k-${Math.random().toString(36).slice(2)}`, timeoutMs: 20_000 });
const expected = WAIT ? 200 : 202;
await load(CLIENTS, Math.min(256, N), 60_000, async () => (await start()).status === expected); // warm-up
await sleep(2000);
await svc.call("storeStats");
// The servers run under a watchdog shell: `.pid` is the server itself.
const pids = { node: svc.proc.pid!, ferret: servers.ferret.pid, nats: servers.nats.pid, bench: process.pid };
const before = Object.fromEntries(Object.entries(pids).map(([k, p]) => [k, cpu(p)]));
const ioBefore = Object.fromEntries(Object.entries(pids).map(([k, p]) => [k, io(p)]));
const t0 = Date.now();
const r = await load(CLIENTS, N, 120_000, async () => (await start()).status === expected);
const admitMs = Date.now() - t0;
await sleep(3000);
const after = Object.fromEntries(Object.entries(pids).map(([k, p]) => [k, cpu(p)]));
const ioAfter = Object.fromEntries(Object.entries(pids).map(([k, p]) => [k, io(p)]));
console.log(`admitted ${r.ops} in ${admitMs} ms = ${(r.ops / admitMs * 1000).toFixed(0)}/s, errors ${r.errors}, p50 ${r.p50?.toFixed(2)} ms`);
for (const k of Object.keys(pids)) {
  const reads = (ioAfter[k]!.reads - ioBefore[k]!.reads) / r.ops;
  const writes = (ioAfter[k]!.writes - ioBefore[k]!.writes) / r.ops;
  console.log(`cpu ${k}: ${((after[k] - before[k]) * 1000 / r.ops).toFixed(2)} ms per start; ${reads.toFixed(1)} read and ${writes.toFixed(1)} write system calls per start`);
}
const stats = (await svc.call("storeStats")).stats;
for (const [k, v] of Object.entries<any>(stats).sort((a, b) => b[1].count - a[1].count)) console.log(`${k}: ${(v.count / r.ops).toFixed(2)}/start avg ${(v.totalMs / v.count).toFixed(1)} ms`);
await svc.stop(); await ws.store.close(); await servers.stop();
process.exit(0);
