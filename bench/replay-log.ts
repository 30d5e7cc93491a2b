/**
 * The event log's replay path alone, no HTTP: a run of N stored text_delta events (as the
 * scripted model produces them) read through `JetStreamEventLog.subscribe` into SSE frames,
 * beside the bare ordered-consumer read of the same messages, alternating, each 5 times.
 *
 *   node --import tsx bench/replay-log.ts            (N=… for another count)
 *
 * Used for the replay figures in docs/performance.md; not part of `npm run bench`.
 */
import { DeliverPolicy } from "@nats-io/jetstream";
import { startTestServers } from "../test/helpers/servers.js";
import { connectNats, eventStreamName, eventSubject, provisionNats } from "../src/nats.js";
import { EventKeyring } from "../src/event-crypto.js";
import { JetStreamEventLog } from "../src/event-log.js";
import type { EventReadRun } from "../src/event-types.js";
import { newId } from "../src/ids.js";
import { systemClock } from "../src/clock.js";
import { FrameBuffer } from "../gateway/sse-frames.js";

const N = Number(process.env.N ?? 50_000);
const ROUNDS = Number(process.env.ROUNDS ?? 5);
const servers = await startTestServers();
const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "replay-bench" });
const nats = await provisionNats(nc, { eventS: { solo: 3600, business: 3600 } });
const log = new JetStreamEventLog({ nc: nats.nc, js: nats.js, jsm: nats.jsm, keyring: new EventKeyring(Buffer.alloc(32, 9).toString("base64")), clock: systemClock });
const run: EventReadRun = { id: newId("run"), workspace_id: newId("ws"), plan: "business", event_retention_s: 3600, created_at: Date.now() };
const turnId = newId("turn");

const appender = log.appender(run as never, 1);
const t0 = performance.now();
for (let seq = 1; seq <= N; seq++) appender.append(turnId, "runtime", "text_delta", { delta: "xxxx".repeat(3 + (seq % 3)), content_index: 0 }, Date.now());
await appender.flush();
console.log(`appended ${N} in ${((performance.now() - t0) / 1000).toFixed(1)} s`);

/** CPU of this process per message of the last read, in µs (user + system). */
const cpu = { bare: [] as number[], replay: [] as number[] };
const cpuSince = (from: NodeJS.CpuUsage) => {
  const used = process.cpuUsage(from);
  return (used.user + used.system) / N;
};

async function bare(): Promise<number> {
  const start = performance.now();
  const cpu0 = process.cpuUsage();
  const consumer = await nats.js.consumers.get(eventStreamName(run.plan), { filter_subjects: eventSubject(run.plan, run.id), deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: 1 });
  const messages = await consumer.consume({ max_messages: 256 });
  let read = 0;
  for await (const msg of messages) {
    void msg.data;
    if (++read >= N) break;
  }
  cpu.bare.push(cpuSince(cpu0));
  await messages.close().catch(() => undefined);
  await consumer.delete().catch(() => undefined);
  return (read / (performance.now() - start)) * 1000;
}

async function replay(): Promise<number> {
  const start = performance.now();
  const cpu0 = process.cpuUsage();
  const controller = new AbortController();
  let read = 0;
  let bytes = 0;
  const frames = new FrameBuffer();
  await log.subscribe(run, { turnId }, (event) => {
    // The SSE frames as gateway/sse.ts gathers them, taken per 64 KiB.
    frames.event(event);
    if (frames.size >= 64 * 1024) bytes += frames.take()!.length;
    if (++read >= N) controller.abort();
  }, controller.signal);
  bytes += frames.take()?.length ?? 0;
  cpu.replay.push(cpuSince(cpu0));
  if (bytes === 0) throw new Error("nothing read");
  return (read / (performance.now() - start)) * 1000;
}

const rates = { bare: [] as number[], replay: [] as number[] };
for (let i = 0; i < ROUNDS; i++) {
  // ONLY=replay leaves the bare read out (for a profile of the replay alone).
  if (process.env.ONLY !== "replay") rates.bare.push(await bare());
  rates.replay.push(await replay());
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
if (rates.bare.length) console.log(`bare ordered read: ${rates.bare.map((r) => r.toFixed(0)).join(" ")} (median ${median(rates.bare).toFixed(0)}) msg/s`);
console.log(`log.subscribe → frames: ${rates.replay.map((r) => r.toFixed(0)).join(" ")} (median ${median(rates.replay).toFixed(0)}) event/s`);
if (rates.bare.length) console.log(`ratio ${(median(rates.replay) / median(rates.bare)).toFixed(2)}`);
const fmt = (xs: number[]) => `${xs.map((x) => x.toFixed(2)).join(" ")} (median ${median(xs).toFixed(2)})`;
if (cpu.bare.length) console.log(`CPU of this process per message, bare read: ${fmt(cpu.bare)} µs`);
console.log(`CPU of this process per event, replay: ${fmt(cpu.replay)} µs`);
await nats.nc.close();
await servers.stop();
process.exit(0);
