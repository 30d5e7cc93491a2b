import anyTest, { type TestFn } from "ava";
import { headers as natsHeaders, nanos, type NatsConnection } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { startTestServers, type TestServers } from "../helpers/servers.js";
import { connectNats, eventStreamName, eventSubject, provisionNats, type NatsResources } from "../../src/nats.js";
import { AsyncPublisher, parseAck, PublishError } from "../../src/js-publisher.js";
import { EventKeyring } from "../../src/event-crypto.js";
import { decodeEventId, encodeEventId } from "../../src/event-ids.js";
import { JetStreamEventLog } from "../../src/event-log.js";
import { EventWriteError, type EventReadRun, type RunEvent, runEventOf } from "../../src/event-types.js";
import { ApiError } from "../../src/errors.js";
import { newId } from "../../src/ids.js";
import type { Plan } from "../../src/domain.js";
import { systemClock } from "../../src/clock.js";

interface Context {
  servers: TestServers;
  nats: NatsResources;
  log: JetStreamEventLog;
}
const test = anyTest as TestFn<Context>;

/** Solo events really expire after 2 s in JetStream; business ones are kept an hour. */
const SOLO_MAX_AGE_S = 2;
const MASTER = Buffer.alloc(32, 9).toString("base64");
const SECRET = "PLAINTEXT-CANARY-7f3a";

const RETENTION = { runS: { solo: 3600, business: 3600 }, eventS: { solo: SOLO_MAX_AGE_S, business: 3600 } };

test.before(async (t) => {
  const servers = await startTestServers();
  t.context = { servers } as Context;
  const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "event-log-test" });
  // provisionNats sets a 120 s duplicate window, which JetStream refuses above a shorter
  // max_age: create the short-lived solo stream first (provisionNats then keeps it).
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({
    name: eventStreamName("solo"),
    subjects: ["runs.ev.solo.>"],
    max_age: nanos(SOLO_MAX_AGE_S * 1000),
    duplicate_window: nanos(SOLO_MAX_AGE_S * 1000),
  });
  const nats = await provisionNats(nc, RETENTION);
  const log = new JetStreamEventLog({ nc: nats.nc, js: nats.js, jsm: nats.jsm, keyring: new EventKeyring(MASTER), clock: systemClock });
  t.context = { servers, nats, log };
});

test.after.always(async (t) => {
  await t.context.nats?.nc.close();
  await t.context.servers?.stop();
});

function newRun(plan: Plan = "business", retentionS = 3600, extra: Partial<EventReadRun> = {}): EventReadRun {
  return { id: newId("run"), workspace_id: newId("ws"), plan, event_retention_s: retentionS, created_at: Date.now(), ...extra };
}

/** Appends `types.length` events of `turnId` through one appender and waits for them. */
async function appendAll(log: JetStreamEventLog, run: EventReadRun, items: Array<{ turn: string | null; ms?: number; data?: unknown }>, from = 1) {
  const stored: RunEvent[] = [];
  const appender = log.appender(run, from, { onStored: (e) => stored.push(e) });
  for (const [i, item] of items.entries()) {
    appender.append(item.turn, "runtime", "text_delta", item.data ?? { delta: `${SECRET} #${from + i}` }, item.ms ?? Date.now());
  }
  await appender.flush();
  return stored;
}

async function readAll(log: JetStreamEventLog, run: EventReadRun, limit: number, turnId?: string) {
  const pages = [];
  let after: string | undefined;
  for (;;) {
    const page = await log.read(run, { afterId: after, turnId, limit, nowMs: Date.now() });
    pages.push(page);
    if (!page.hasMore) break;
    after = page.events.at(-1)!.id;
  }
  return pages;
}

function apiError(t: any, err: unknown, code: string, status: number) {
  t.true(err instanceof ApiError, String(err));
  t.is((err as ApiError).code, code);
  t.is((err as ApiError).status, status);
}

test("event-log - 1000 pipelined appends get gap-free sequences; paged reads return them once, in order", async (t) => {
  const { log } = t.context;
  const run = newRun();
  const turn = newId("turn");
  const started = Date.now();
  const stored = await appendAll(log, run, Array.from({ length: 1000 }, () => ({ turn })));
  t.log(`1000 appends stored in ${Date.now() - started} ms`);
  t.deepEqual(stored.map((e) => e.sequence), Array.from({ length: 1000 }, (_, i) => i + 1), "onStored in sequence order");
  const streamSeqs = stored.map((e) => decodeEventId(e.id, run.id).streamSeq);
  t.true(streamSeqs.every((s, i) => i === 0 || s > streamSeqs[i - 1]), "stream order equals sequence order");

  const pages = await readAll(log, run, 100);
  t.is(pages.length, 10);
  t.deepEqual(pages[0].history, { status: "complete", retention_days: 3600 / 86400 });
  for (const page of pages.slice(1)) t.deepEqual(page.history, { status: null, retention_days: 3600 / 86400 });
  const read = pages.flatMap((p) => p.events);
  t.is(new Set(read.map((e) => e.id)).size, 1000, "no duplicates");
  t.deepEqual(read, stored, "read events equal the stored (live) events, ids included");
  t.deepEqual(read[0], {
    id: read[0].id,
    sequence: 1,
    source: "runtime",
    type: "text_delta",
    run_id: run.id,
    turn_id: turn,
    created_at: read[0].created_at,
    data: { delta: `${SECRET} #1` },
  });
  t.true(Math.abs(read[0].created_at - started / 1000) < 5, "created_at is Unix seconds");
});

test("event-log - stored bytes carry no plaintext; headers carry only ids", async (t) => {
  const { log, nats } = t.context;
  const run = newRun();
  const turn = newId("turn");
  const [event] = await appendAll(log, run, [{ turn, data: { text: SECRET, nested: { secret: SECRET } } }]);
  const msg = await nats.jsm.streams.getMessage(eventStreamName("business"), { seq: decodeEventId(event.id, run.id).streamSeq });
  t.truthy(msg);
  const raw = Buffer.from(msg!.data);
  t.false(raw.includes(SECRET));
  t.false(raw.includes("text_delta"));
  t.false(raw.includes(run.id));
  t.is(msg!.header.get("Runs-Seq"), "1");
  t.is(msg!.header.get("Runs-Turn"), turn);
  t.deepEqual(
    [...msg!.header.keys()].filter((k) => !k.startsWith("Nats-")).sort(),
    ["Runs-Floor", "Runs-Seq", "Runs-Stored-Below", "Runs-Turn"],
  );
  // The two that let readers order events are numbers: a stream position and a sequence.
  t.regex(msg!.header.get("Runs-Floor"), /^\d+$/);
  t.is(msg!.header.get("Runs-Stored-Below"), "1");
});

test("event-log - sanitizing applies before storing (images omitted, size limit)", async (t) => {
  const { log } = t.context;
  const run = newRun();
  const image = Buffer.alloc(1000, 5).toString("base64");
  const huge = "z".repeat(900 * 1024);
  const stored: RunEvent[] = [];
  const appender = log.appender(run, 1, { onStored: (e) => stored.push(e) });
  appender.append(null, "runtime", "tool_execution_end", { result: { content: [{ type: "image", data: image, mimeType: "image/png" }], text: huge } }, Date.now());
  await appender.flush();
  const page = await log.read(run, { limit: 10, nowMs: Date.now() });
  const data = page.events[0].data as any;
  t.is(data.result.content[0].omitted, "not_persisted");
  t.is(data.result.content[0].bytes, 1000);
  t.is(data.result.text, `[truncated: ${900 * 1024} bytes]`);
  t.deepEqual(stored, page.events);
  t.true(Buffer.byteLength(JSON.stringify(page.events[0])) <= 675 * 1024);
});

test("event-log - lastSequence follows appends and lets a new owner continue numbering", async (t) => {
  const { log } = t.context;
  const run = newRun();
  t.is(await log.lastSequence(run), 0);
  await appendAll(log, run, Array.from({ length: 7 }, () => ({ turn: "turn_a" })));
  t.is(await log.lastSequence(run), 7);
  const next = (await log.lastSequence(run)) + 1;
  await appendAll(log, run, [{ turn: "turn_a" }, { turn: "turn_a" }], next);
  t.is(await log.lastSequence(run), 9);
  const events = (await readAll(log, run, 100)).flatMap((p) => p.events);
  t.deepEqual(events.map((e) => e.sequence), [1, 2, 3, 4, 5, 6, 7, 8, 9]);
});

test("event-log - re-publishing a sequence is de-duplicated by message id", async (t) => {
  const { log } = t.context;
  const run = newRun();
  const first = await appendAll(log, run, [{ turn: null }, { turn: null }]);
  const again = await appendAll(log, run, [{ turn: null }], 2); // a second owner repeats sequence 2
  t.is(again[0].id, first[1].id, "the duplicate is acknowledged with the original's stream sequence");
  const events = (await readAll(log, run, 100)).flatMap((p) => p.events);
  t.deepEqual(events.map((e) => e.sequence), [1, 2]);
});

test("event-log - rule 7: a run without events is empty with retention_days null", async (t) => {
  const { log } = t.context;
  const page = await log.read(newRun(), { limit: 10, nowMs: Date.now() });
  t.deepEqual(page, { events: [], hasMore: false, history: { status: "empty", retention_days: null } });
});

test("event-log - rules 6-8: events older than the run's retention are hidden though stored (partial, expired, cursor 410)", async (t) => {
  const { log } = t.context;
  const now = Date.now();
  const old = now - 10_000;
  // Retention 2 s on the business stream (kept an hour): expiry is decided by the reader alone.
  const run = newRun("business", 2);
  const stored = await appendAll(log, run, [
    { turn: "turn_a", ms: old },
    { turn: "turn_a", ms: old },
    { turn: "turn_b", ms: old },
    { turn: "turn_b", ms: now },
    { turn: "turn_c", ms: now },
    { turn: "turn_c", ms: now },
  ]);
  const days = 2 / 86400;

  const all = await log.read(run, { limit: 10, nowMs: now });
  t.deepEqual(all.history, { status: "partial", retention_days: days });
  t.deepEqual(all.events.map((e) => e.sequence), [4, 5, 6]);

  const b = await log.read(run, { turnId: "turn_b", limit: 10, nowMs: now });
  t.deepEqual(b.history.status, "partial", "turn_b's first event expired");
  t.deepEqual(b.events.map((e) => e.sequence), [4]);
  const c = await log.read(run, { turnId: "turn_c", limit: 10, nowMs: now });
  t.deepEqual(c.history.status, "complete");
  t.deepEqual(c.events.map((e) => e.sequence), [5, 6]);
  const a = await log.read(run, { turnId: "turn_a", limit: 10, nowMs: now });
  t.deepEqual(a, { events: [], hasMore: false, history: { status: "expired", retention_days: days } });

  // A cursor naming an expired event is 410 even though the next event survives.
  for (const gone of [stored[0], stored[2]]) {
    apiError(t, await t.throwsAsync(log.read(run, { afterId: gone.id, limit: 10, nowMs: now })), "event_cursor_expired", 410);
  }
  const after4 = await log.read(run, { afterId: stored[3].id, limit: 10, nowMs: now });
  t.deepEqual(after4.events.map((e) => e.sequence), [5, 6]);
  t.deepEqual(after4.history, { status: null, retention_days: days });

  const later = now + 60_000;
  const expired = await log.read(run, { limit: 10, nowMs: later });
  t.deepEqual(expired, { events: [], hasMore: false, history: { status: "expired", retention_days: days } });
  apiError(t, await t.throwsAsync(log.read(run, { afterId: stored[5].id, limit: 10, nowMs: later })), "event_cursor_expired", 410);
});

test("event-log - rule 7: complete with turn_id pages from the turn's first event, interleaved with other turns", async (t) => {
  const { log } = t.context;
  const run = newRun();
  await appendAll(log, run, [{ turn: "t1" }, { turn: "t2" }, { turn: "t1" }, { turn: "t2" }, { turn: "t2" }, { turn: null }]);
  const pages = await readAll(log, run, 2, "t2");
  t.deepEqual(pages.map((p) => p.events.map((e) => e.sequence)), [[2, 4], [5]]);
  t.is(pages[0].history.status, "complete");
  t.is(pages[1].history.status, null);
  t.true(pages.flatMap((p) => p.events).every((e) => e.turn_id === "t2"));
});

test("event-log - a failover appender keeps the turn's first sequence when told", async (t) => {
  const { log } = t.context;
  const now = Date.now();
  const run = newRun("business", 2);
  await appendAll(log, run, [{ turn: "t1", ms: now - 10_000 }]);
  // A new owner continues turn t1 at sequence 2; t1 began at 1, which expired.
  const appender = log.appender(run, 2, { turnFirstSeqs: { t1: 1 } });
  appender.append("t1", "platform", "turn.incomplete", {}, now);
  await appender.flush();
  const page = await log.read(run, { turnId: "t1", limit: 10, nowMs: now });
  t.deepEqual(page.events.map((e) => e.sequence), [2]);
  t.is(page.history.status, "partial");
});

test("event-log - rules 6-7: events that JetStream really expired (max_age) read as partial, then expired", async (t) => {
  const { log } = t.context;
  const run = newRun("solo", SOLO_MAX_AGE_S);
  const first = await appendAll(log, run, [{ turn: "t" }, { turn: "t" }]);
  await new Promise((r) => setTimeout(r, 1200));
  await appendAll(log, run, [{ turn: "t" }, { turn: "t" }], 3);
  await new Promise((r) => setTimeout(r, 1100));
  const partial = await log.read({ ...run, event_seq: 4 }, { limit: 10, nowMs: Date.now() });
  t.is(partial.history.status, "partial");
  t.deepEqual(partial.events.map((e) => e.sequence), [3, 4]);
  const err = await t.throwsAsync(log.read(run, { afterId: first[1].id, limit: 10, nowMs: Date.now() }));
  apiError(t, err, "event_cursor_expired", 410);

  await new Promise((r) => setTimeout(r, 1500));
  const { nats } = t.context;
  t.is(await nats.jsm.streams.getMessage(eventStreamName("solo"), { seq: decodeEventId(first[0].id, run.id).streamSeq }), null, "JetStream dropped it (max_age)");
  const expired = await log.read({ ...run, event_seq: 4 }, { limit: 10, nowMs: Date.now() });
  t.deepEqual(expired, { events: [], hasMore: false, history: { status: "expired", retention_days: SOLO_MAX_AGE_S / 86400 } });
  // Without what the run document knows, an old run still reads as expired: every run records run.created.
  const oldRun = { ...run, created_at: Date.now() - 10_000 };
  t.is((await log.read(oldRun, { limit: 10, nowMs: Date.now() })).history.status, "expired");
});

test("event-log - decisions §5: another run's cursor is 400 invalid_cursor", async (t) => {
  const { log } = t.context;
  const run = newRun();
  const other = newRun();
  await appendAll(log, run, [{ turn: null }]);
  const [theirs] = await appendAll(log, other, [{ turn: null }]);
  apiError(t, await t.throwsAsync(log.read(run, { afterId: theirs.id, limit: 10, nowMs: Date.now() })), "invalid_cursor", 400);
  apiError(t, await t.throwsAsync(log.read(run, { afterId: "evt_nonsense", limit: 10, nowMs: Date.now() })), "invalid_cursor", 400);
  // A well-formed id of this run whose stream sequence holds another run's event (forged/colliding).
  const forged = encodeEventId({ streamSeq: decodeEventId(theirs.id, other.id).streamSeq, runSeq: 1, runId: run.id });
  apiError(t, await t.throwsAsync(log.read(run, { afterId: forged, limit: 10, nowMs: Date.now() })), "invalid_cursor", 400);
});

async function consumerCount(nats: NatsResources, plan: Plan): Promise<number> {
  return (await nats.jsm.streams.info(eventStreamName(plan))).state.consumer_count;
}

test.serial("event-log - subscribe delivers the rest after a cursor, then live events; abort removes the consumer", async (t) => {
  const { log, nats } = t.context;
  const run = newRun("business");
  const stored = await appendAll(log, run, Array.from({ length: 10 }, () => ({ turn: "t" })));
  const before = await consumerCount(nats, "business");
  const received: RunEvent[] = [];
  const controller = new AbortController();
  let wake: () => void = () => undefined;
  const done = log.subscribe(run, { afterId: stored[4].id }, (e) => {
    received.push(runEventOf(e));
    wake();
  }, controller.signal);
  const waitFor = (n: number) =>
    new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`only ${received.length} events`)), 10_000);
      const check = () => {
        if (received.length >= n) {
          clearTimeout(timer);
          resolve();
        }
      };
      wake = check;
      check();
    });
  await waitFor(5);
  t.deepEqual(received.map((e) => e.sequence), [6, 7, 8, 9, 10]);
  t.deepEqual(received, stored.slice(5));
  t.is(await consumerCount(nats, "business"), before + 1);

  const live = await appendAll(log, run, [{ turn: "t" }, { turn: "t" }, { turn: "t" }], 11);
  await waitFor(8);
  t.deepEqual(received.slice(5), live);

  controller.abort();
  await done;
  t.is(await consumerCount(nats, "business"), before, "the ordered consumer is deleted on abort");
});

test.serial("event-log - subscribe with turn_id and an expired cursor", async (t) => {
  const { log, nats } = t.context;
  const run = newRun("business", 2);
  const stored = await appendAll(log, run, [{ turn: "a", ms: Date.now() - 10_000 }, { turn: "a" }, { turn: "b" }, { turn: "a" }]);
  const before = await consumerCount(nats, "business");
  const controller = new AbortController();
  await t.throwsAsync(log.subscribe(run, { afterId: stored[0].id }, () => undefined, controller.signal), { instanceOf: ApiError, message: /no longer retained/ });
  const received: number[] = [];
  const done = log.subscribe(run, { turnId: "a" }, (e) => {
    received.push(e.sequence);
    if (received.length === 2) controller.abort();
  }, controller.signal);
  await done;
  t.deepEqual(received, [2, 4], "the expired event is skipped, other turns filtered");
  t.is(await consumerCount(nats, "business"), before);
});

test.serial("event-log - page reads leave no consumer behind", async (t) => {
  const { log, nats } = t.context;
  const run = newRun();
  await appendAll(log, run, Array.from({ length: 30 }, () => ({ turn: null })));
  const before = await consumerCount(nats, "business");
  await readAll(log, run, 7);
  await log.read(run, { limit: 3, nowMs: Date.now() });
  t.is(await consumerCount(nats, "business"), before);
});

test("event-log - purge deletes the run's events only", async (t) => {
  const { log } = t.context;
  const run = newRun();
  const other = newRun();
  await appendAll(log, run, [{ turn: null }, { turn: null }]);
  await appendAll(log, other, [{ turn: null }]);
  await log.purge(run);
  t.is(await log.lastSequence(run), 0);
  t.is(await log.lastSequence(other), 1);
  t.is((await log.read({ ...run, event_seq: 2 }, { limit: 10, nowMs: Date.now() })).history.status, "expired");
});

test("event-log - rule 9: an unreachable store is 503 event_history_unavailable; a failed write rejects flush", async (t) => {
  const { servers } = t.context;
  const nc: NatsConnection = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "doomed" });
  const nats = await provisionNats(nc, RETENTION);
  const log = new JetStreamEventLog({ nc: nats.nc, js: nats.js, jsm: nats.jsm, keyring: new EventKeyring(MASTER), clock: systemClock });
  const run = newRun();
  await nc.close();
  apiError(t, await t.throwsAsync(log.read(run, { limit: 10, nowMs: Date.now() })), "event_history_unavailable", 503);
  apiError(t, await t.throwsAsync(log.lastSequence(run)), "event_history_unavailable", 503);
  const appender = log.appender(run, 1);
  appender.append(null, "platform", "run.created", {}, Date.now());
  appender.append(null, "platform", "turn.queued", {}, Date.now());
  const err = await t.throwsAsync(appender.flush(), { instanceOf: EventWriteError });
  t.is((err as EventWriteError).sequence, 1);
  t.is(appender.nextSequence, 3);
});

test.serial("event-log - subscribe passes a callback's own error through and still removes its consumer", async (t) => {
  const { log, nats } = t.context;
  const run = newRun();
  await appendAll(log, run, [{ turn: null }, { turn: null }]);
  const before = await consumerCount(nats, "business");
  const boom = new Error("client went away");
  const err = await t.throwsAsync(log.subscribe(run, {}, () => {
    throw boom;
  }, new AbortController().signal));
  t.is(err, boom);
  t.is(await consumerCount(nats, "business"), before);
});

// ---- AsyncPublisher: acks on one subscription --------------------------------------------

async function publisherConnection(t: { context: Context }, name: string): Promise<NatsConnection> {
  return connectNats({ url: t.context.servers.natsUrl, user: "runs", password: t.context.servers.servicePassword, name });
}

test("publisher - a publish is acked with its stream sequence; the same message id again is a duplicate of it", async (t) => {
  const nc = await publisherConnection(t, "publisher-ack");
  const publisher = new AsyncPublisher(nc, systemClock);
  const subject = eventSubject("business", newId("run"));
  const acks = await Promise.all(Array.from({ length: 50 }, (_, i) => publisher.publish(subject, new TextEncoder().encode(`m${i}`), `pub-test:${subject}:${i}`, natsHeaders())));
  t.true(acks.every((a) => a.stream === eventStreamName("business") && !a.duplicate));
  t.is(new Set(acks.map((a) => a.seq)).size, 50);
  const again = await publisher.publish(subject, new TextEncoder().encode("m7"), `pub-test:${subject}:7`, natsHeaders());
  t.true(again.duplicate);
  t.is(again.seq, acks[7]!.seq);
  const stored = await t.context.nats.jsm.streams.getMessage(eventStreamName("business"), { last_by_subj: subject });
  t.is(stored?.seq, acks[49]!.seq, "the duplicate was not stored again");
  await nc.close();
});

test("publisher - a subject no stream takes fails retryable after the given attempts", async (t) => {
  const nc = await publisherConnection(t, "publisher-nostream");
  const publisher = new AsyncPublisher(nc, systemClock, { attempts: 3, retryDelayMs: 20 });
  const started = Date.now();
  const err = await t.throwsAsync(publisher.publish("nostream.subject", new Uint8Array([1]), "x:1", natsHeaders()), { instanceOf: PublishError });
  t.true(err!.retryable);
  t.regex(err!.message, /no responders/);
  t.true(Date.now() - started >= 20 + 40, "waited between the three attempts");
  await nc.close();
});

test("publisher - retries of a retryable failure stop at the time budget, whatever attempts are left", async (t) => {
  const nc = await publisherConnection(t, "publisher-budget");
  const publisher = new AsyncPublisher(nc, systemClock, { retryForMs: 600, attempts: 1_000, retryDelayMs: 100 });
  const started = Date.now();
  const err = await t.throwsAsync(publisher.publish("nostream.subject", new Uint8Array([1]), "x:2", natsHeaders()), { instanceOf: PublishError });
  const took = Date.now() - started;
  t.true(err!.retryable);
  // 100 + 200 ms pauses fit in the budget, the next 300 ms one would not.
  t.true(took >= 300 && took < 1_500, `gave up after ${took} ms`);
  await nc.close();
});

test("publisher - an ack that never comes times out; closing the connection fails what still waits", async (t) => {
  const nc = await publisherConnection(t, "publisher-timeout");
  // A core subscriber that never answers: the server sees a responder, so only the timeout ends the wait.
  const silent = nc.subscribe("silent.subject");
  const quick = new AsyncPublisher(nc, systemClock, { timeoutMs: 200, attempts: 1 });
  const started = Date.now();
  const err = await t.throwsAsync(quick.publish("silent.subject", new Uint8Array([1]), "s:1", natsHeaders()), { instanceOf: PublishError });
  t.regex(err!.message, /no ack/);
  t.true(Date.now() - started < 2_000);

  const patient = new AsyncPublisher(nc, systemClock, { timeoutMs: 60_000 });
  const waiting = patient.publish("silent.subject", new Uint8Array([1]), "s:2", natsHeaders());
  await new Promise((resolve) => setTimeout(resolve, 50));
  silent.unsubscribe();
  await nc.close();
  const closed = await t.throwsAsync(waiting, { instanceOf: PublishError });
  t.regex(closed!.message, /closed/);
});

test("publisher - parseAck reads acks, JetStream errors and status replies", (t) => {
  const enc = new TextEncoder();
  t.deepEqual(parseAck({ data: enc.encode('{"stream":"S","seq":4}'), headers: undefined }), { stream: "S", seq: 4, duplicate: false });
  t.deepEqual(parseAck({ data: enc.encode('{"stream":"S","seq":4,"duplicate":true}'), headers: undefined }), { stream: "S", seq: 4, duplicate: true });
  const refused = parseAck({ data: enc.encode('{"error":{"code":400,"err_code":10060,"description":"expected stream sequence does not match"}}'), headers: undefined });
  t.true(refused instanceof PublishError && !refused.retryable && /does not match/.test(refused.message));
  const unavailable = parseAck({ data: enc.encode('{"error":{"code":503,"description":"JetStream system temporarily unavailable"}}'), headers: undefined });
  t.true(unavailable instanceof PublishError && unavailable.retryable);
  // A server-side failure while a peer is lost is worth the retry too (same message id).
  const peerLost = parseAck({ data: enc.encode('{"error":{"code":500,"description":"no quorum"}}'), headers: undefined });
  t.true(peerLost instanceof PublishError && peerLost.retryable);
  t.true(parseAck({ data: enc.encode("not json"), headers: undefined }) instanceof PublishError);
  t.true(parseAck({ data: enc.encode('{"seq":1}'), headers: undefined }) instanceof PublishError);
});

test.serial("event-log - subscribe passes a callback's rejected promise through as its own error and still removes its consumer", async (t) => {
  const { log, nats } = t.context;
  const run = newRun();
  await appendAll(log, run, [{ turn: null }, { turn: null }, { turn: null }]);
  const before = await consumerCount(nats, "business");
  const boom = new Error("drain failed");
  const seen: number[] = [];
  const err = await t.throwsAsync(log.subscribe(run, {}, async (event) => {
    seen.push(event.sequence);
    if (event.sequence === 2) throw boom;
  }, new AbortController().signal));
  t.is(err, boom, "not a 503: the callback's own error");
  t.deepEqual(seen, [1, 2], "nothing after the failed one");
  t.is(await consumerCount(nats, "business"), before);
});

test("event log - a service restarted with a retention shorter than the de-duplication window it was made with starts: retention and window move together (and back)", async (t) => {
  const servers = await startTestServers();
  t.teardown(() => servers.stop());
  const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "event-log-retention-test" });
  t.teardown(() => nc.close());
  const retention = (eventS: number) => ({ runS: { solo: 3600, business: 3600 }, eventS: { solo: 3600, business: eventS } });
  const stream = eventStreamName("business");
  await provisionNats(nc, retention(3600));
  const jsm = await jetstreamManager(nc);
  t.is((await jsm.streams.info(stream)).config.duplicate_window, nanos(120_000));
  // Was refused ("stream name already in use with a different configuration") and stopped the start.
  await provisionNats(nc, retention(15));
  let config = (await jsm.streams.info(stream)).config;
  t.is(config.max_age, nanos(15_000));
  t.is(config.duplicate_window, nanos(15_000));
  await provisionNats(nc, retention(3600));
  config = (await jsm.streams.info(stream)).config;
  t.is(config.max_age, nanos(3_600_000));
  t.is(config.duplicate_window, nanos(120_000));
});
