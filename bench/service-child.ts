/**
 * One service node in its own process (so the load generator does not share its event
 * loop or its core). Configured by BENCH_SERVICE_ENV (JSON of environment variables);
 * prints nothing, answers over IPC:
 *   {op:"mem"}            → {rss, heapUsed, external} after a full GC (needs --expose-gc)
 *   {op:"advance", ms}    → moves the service clock forward (idle passivation without waiting a minute)
 *   {op:"stop"}           → closes the service and exits
 * Sends {ready, url} once listening.
 */
import pino from "pino";
import { loadConfig } from "../src/config.js";
import { systemClock, type Clock } from "../src/clock.js";
import { startService } from "../node/service.js";

const env = JSON.parse(process.env.BENCH_SERVICE_ENV ?? "{}") as Record<string, string>;
let offsetMs = 0;
// Real timers; "now" moves forward on request (idle passivation without waiting a minute).
const clock: Clock = { ...systemClock, nowMs: () => Date.now() + offsetMs };

// Store call tracing (BENCH_TRACE_STORE=1): count and time driver calls by method and collection.
const storeStats = new Map<string, { count: number; totalMs: number }>();
if (process.env.BENCH_TRACE_STORE === "1") {
  const { Collection, FindCursor } = await import("mongodb");
  const wrap = (proto: any, method: string, name: (self: any) => string) => {
    const original = proto[method];
    proto[method] = async function (this: any, ...args: unknown[]) {
      const t0 = performance.now();
      try {
        return await original.apply(this, args);
      } finally {
        const key = `${method} ${name(this)}`;
        const s = storeStats.get(key) ?? { count: 0, totalMs: 0 };
        s.count++;
        s.totalMs += performance.now() - t0;
        storeStats.set(key, s);
      }
    };
  };
  for (const m of ["findOne", "insertOne", "updateOne", "countDocuments", "deleteOne", "deleteMany"]) wrap(Collection.prototype, m, (c) => c.collectionName);
  wrap(FindCursor.prototype, "toArray", (c) => c.namespace?.collection ?? "?");
}

const config = loadConfig(env);
const service = await startService(config, { log: pino({ level: env.LOG_LEVEL ?? "silent" }), clock });

const gc = (globalThis as { gc?: () => void }).gc;

// The parent's end: a bench that dies takes its service node with it.
process.on("disconnect", () => process.exit(1));

process.on("message", async (msg: { op: string; ms?: number; id: number }) => {
  const answer = (body: Record<string, unknown>) => process.send!({ id: msg.id, ...body });
  if (msg.op === "mem") {
    gc?.();
    gc?.();
    const m = process.memoryUsage();
    answer({ rss: m.rss, heapUsed: m.heapUsed, external: m.external });
  } else if (msg.op === "storeStats") {
    answer({ stats: Object.fromEntries(storeStats) });
    storeStats.clear();
  } else if (msg.op === "advance") {
    offsetMs += msg.ms ?? 0;
    answer({ offsetMs });
  } else if (msg.op === "stop") {
    await service.close().catch(() => undefined);
    answer({ stopped: true });
    setTimeout(() => process.exit(0), 50);
  }
});

process.send!({ ready: true, url: service.url });
