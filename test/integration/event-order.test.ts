import anyTest, { type TestFn } from "ava";
import { startTestServers, type TestServers } from "../helpers/servers.js";
import { latePublisher } from "../helpers/late-publish.js";
import { connectNats, eventStreamName, provisionNats, type NatsResources } from "../../src/nats.js";
import { AsyncPublisher } from "../../src/js-publisher.js";
import { EventKeyring } from "../../src/event-crypto.js";
import { JetStreamAppender } from "../../src/event-appender.js";
import { JetStreamEventLog } from "../../src/event-log.js";
import { type EventReadRun, type RunEvent, runEventOf } from "../../src/event-types.js";
import { newId } from "../../src/ids.js";
import { systemClock } from "../../src/clock.js";

/**
 * Events stored out of sequence order (a publish lost with a dying NATS server and re-sent
 * after its ack timeout, while the next events were stored): every reader gives them in
 * run sequence order, resumes after any of them without skipping one, and a new owner
 * numbers after the highest stored. Real nats-server; the delay is made by holding one
 * publish back until the later ones are acknowledged, as the lost one was.
 */

interface Context {
  servers: TestServers;
  nats: NatsResources;
  keyring: EventKeyring;
  log: JetStreamEventLog;
  publisher: AsyncPublisher;
}
const test = anyTest as TestFn<Context>;
const MASTER = Buffer.alloc(32, 5).toString("base64");
const RETENTION = { runS: { solo: 3600, business: 3600 }, eventS: { solo: 3600, business: 3600 } };

test.before(async (t) => {
  const servers = await startTestServers();
  t.context = { servers } as Context;
  const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "event-order-test" });
  const nats = await provisionNats(nc, RETENTION);
  const keyring = new EventKeyring(MASTER);
  const log = new JetStreamEventLog({ nc: nats.nc, js: nats.js, jsm: nats.jsm, keyring, clock: systemClock });
  const publisher = new AsyncPublisher(nats.nc, systemClock);
  const stream = eventStreamName("business");
  publisher.raiseFloor(stream, (await nats.jsm.streams.info(stream)).state.last_seq);
  t.context = { servers, nats, keyring, log, publisher };
});

test.after.always(async (t) => {
  await t.context.nats?.nc.close();
  await t.context.servers?.stop();
});

function newRun(): EventReadRun {
  return { id: newId("run"), workspace_id: newId("ws"), plan: "business", event_retention_s: 3600, created_at: Date.now() };
}

/**
 * Appends events 1..count of `run`; the publish of event `late` waits until every other
 * event up to `lateUntil` is acknowledged (or, with `fail`, fails for good).
 */
async function appendWithLate(t: { context: Context }, run: EventReadRun, count: number, late: number, lateUntil: number, fail = false) {
  const { publisher, keyring } = t.context;
  const appender = new JetStreamAppender(latePublisher(publisher, late, lateUntil, fail), keyring.keyFor(run.workspace_id), run, 1, {});
  for (let seq = 1; seq <= count; seq++) appender.append("turn_1", "runtime", "text_delta", { delta: `#${seq}` }, Date.now());
  await appender.flush().catch((err: unknown) => {
    if (!fail) throw err;
  });
}

/** The sequences in stream order, as stored. */
async function storedOrder(t: { context: Context }, run: EventReadRun): Promise<number[]> {
  const { nats } = t.context;
  const out: number[] = [];
  let at = 1;
  for (let i = 0; i < 100; i++) {
    const msg = await nats.jsm.streams.getMessage(eventStreamName(run.plan), { seq: at, next_by_subj: `runs.ev.business.${run.id}` } as never);
    if (!msg) break;
    out.push(Number(msg.header.get("Runs-Seq")));
    at = msg.seq + 1;
  }
  return out;
}

async function readAll(log: JetStreamEventLog, run: EventReadRun, limit: number, afterId?: string): Promise<RunEvent[]> {
  const out: RunEvent[] = [];
  let after = afterId;
  for (let page = 0; page < 100; page++) {
    const read = await log.read(run, { afterId: after, limit, nowMs: Date.now() });
    out.push(...read.events);
    if (!read.hasMore) return out;
    after = read.events.at(-1)?.id ?? after;
  }
  throw new Error("more than 100 pages");
}

/** Subscribes until `count` events came (or 10 s); returns them. */
async function subscribeFor(log: JetStreamEventLog, run: EventReadRun, count: number, afterId?: string): Promise<RunEvent[]> {
  const received: RunEvent[] = [];
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), 10_000);
  await log.subscribe(run, { afterId }, (event) => {
    received.push(runEventOf(event));
    if (received.length >= count) controller.abort();
  }, controller.signal);
  clearTimeout(timer);
  return received;
}

const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

test("event order - an event stored after later ones is listed in sequence order, on every page size", async (t) => {
  const run = newRun();
  await appendWithLate(t, run, 10, 3, 10);
  t.deepEqual(await storedOrder(t, run), [1, 2, 4, 5, 6, 7, 8, 9, 10, 3], "stored out of order, as after a lost publish");

  const whole = await t.context.log.read(run, { limit: 100, nowMs: Date.now() });
  t.deepEqual(whole.events.map((e) => e.sequence), range(1, 10));
  t.false(whole.hasMore);
  for (const limit of [1, 2, 3, 4]) {
    const paged = await readAll(t.context.log, run, limit);
    t.deepEqual(paged.map((e) => e.id), whole.events.map((e) => e.id), `pages of ${limit}: each event once, same ids, in order`);
  }
});

test("event order - resuming after the late event finds the ones stored before it; after any event, the rest in order", async (t) => {
  const run = newRun();
  await appendWithLate(t, run, 10, 3, 10);
  const all = (await t.context.log.read(run, { limit: 100, nowMs: Date.now() })).events;
  for (const [i, event] of all.entries()) {
    const rest = await t.context.log.read(run, { afterId: event.id, limit: 100, nowMs: Date.now() });
    t.deepEqual(rest.events.map((e) => e.sequence), range(i + 2, 10), `after ${event.sequence}`);
  }
});

test("event order - a subscription delivers in sequence order, from the start and after the late event", async (t) => {
  const run = newRun();
  await appendWithLate(t, run, 10, 3, 10);
  const all = (await t.context.log.read(run, { limit: 100, nowMs: Date.now() })).events;
  t.deepEqual(all.map((e) => e.sequence), range(1, 10));
  t.deepEqual(await subscribeFor(t.context.log, run, 10), all);
  const third = all.find((e) => e.sequence === 3)!;
  t.deepEqual((await subscribeFor(t.context.log, run, 7, third.id)).map((e) => e.sequence), range(4, 10), "after event 3 (stored last)");
});

test("event order - a new owner numbers after the highest stored event, not after the last stored one", async (t) => {
  const run = newRun();
  await appendWithLate(t, run, 6, 4, 6);
  t.deepEqual(await storedOrder(t, run), [1, 2, 3, 5, 6, 4]);
  t.is(await t.context.log.lastSequence(run), 6);
});

test("event order - a gap that never fills holds the events after it only for the horizon, for reads and subscriptions", async (t) => {
  const { nats, keyring } = t.context;
  const horizonMs = 1_500;
  const log = new JetStreamEventLog({ nc: nats.nc, js: nats.js, jsm: nats.jsm, keyring, clock: systemClock, horizonMs });
  const run = newRun();
  await appendWithLate(t, run, 5, 3, 5, true);
  t.deepEqual(await storedOrder(t, run), [1, 2, 4, 5], "3 failed for good; 4 and 5 were sent before");
  const early = await log.read(run, { limit: 100, nowMs: Date.now() });
  t.deepEqual(early.events.map((e) => e.sequence), [1, 2], "4 and 5 wait for 3 while it may still come");
  t.true(early.hasMore);
  const cursor = early.events[1].id;
  await new Promise((resolve) => setTimeout(resolve, horizonMs + 200));
  const late = await log.read(run, { limit: 100, nowMs: Date.now() });
  t.deepEqual(late.events.map((e) => e.sequence), [1, 2, 4, 5], "past the horizon: 3 is given up");
  t.false(late.hasMore);
  t.deepEqual((await log.read(run, { afterId: cursor, limit: 100, nowMs: Date.now() })).events.map((e) => e.sequence), [4, 5]);
  t.deepEqual((await subscribeFor(log, run, 4)).map((e) => e.sequence), [1, 2, 4, 5]);
});

test("event order - a subscription awaits a callback's promise for events released from holding too, and passes its rejection through", async (t) => {
  const run = newRun();
  await appendWithLate(t, run, 10, 3, 10);
  const seen: number[] = [];
  let inFlight = 0;
  const boom = new Error("client went away");
  const err = await t.throwsAsync(t.context.log.subscribe(run, {}, async (event) => {
    t.is(inFlight, 0, "one callback at a time");
    inFlight++;
    await new Promise((resolve) => setTimeout(resolve, 5));
    inFlight--;
    seen.push(event.sequence);
    // 4..10 were stored before 3 and held until it came: 6 is released from holding.
    if (event.sequence === 6) throw boom;
  }, new AbortController().signal));
  t.is(err, boom);
  t.deepEqual(seen, range(1, 6));
});
