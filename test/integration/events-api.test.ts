import { createHash } from "node:crypto";
import anyTest, { type ExecutionContext, type TestFn } from "ava";
import http from "node:http";
import Fastify, { type FastifyInstance } from "fastify";
import pino from "pino";
import { jetstream, jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import { AsyncPublisher } from "../../src/js-publisher.js";
import { latePublisher } from "../helpers/late-publish.js";
import { JetStreamAppender } from "../../src/event-appender.js";
import { EventSource as SseClient } from "eventsource";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { connectNats, eventStreamName, eventSubject } from "../../src/nats.js";
import { EventKeyring } from "../../src/event-crypto.js";
import { JetStreamEventLog } from "../../src/event-log.js";
import { type EventCallback, type EventLog, type EventSource, type RunEvent, streamedEventOf } from "../../src/event-types.js";
import { ApiError } from "../../src/errors.js";
import { decodeEventId } from "../../src/event-ids.js";
import { headerSeq, SEQ_HEADER } from "../../src/event-envelope.js";
import { Ids, newId } from "../../src/ids.js";
import { systemClock } from "../../src/clock.js";
import type { Plan, TurnStatus } from "../../src/domain.js";
import type { RunDoc, TurnDoc } from "../../src/documents.js";
import type { GatewayContext } from "../../gateway/context.js";
import { closeEventStreams, openStreamCount, streamEvents } from "../../gateway/sse.js";

/**
 * GET /api/v1/runs/{runId}/events against the real service. The runs are written straight
 * into the store and their events appended through a JetStreamEventLog of the same master
 * key, so every test controls exactly which events exist (whatever the actors record for
 * real runs). Solo event retention is 4 s here, for cursor expiry; business is the default.
 */

interface Context {
  servers: TestServers;
  service: RunningService;
  nc: NatsConnection;
  jsm: JetStreamManager;
  log: JetStreamEventLog;
  business: { id: string; key: string; api: Api };
  solo: { id: string; key: string; api: Api };
  other: { id: string; key: string; api: Api };
}
const test = anyTest as TestFn<Context>;

// Long enough for a few requests after an event is appended under a full run's load (2 s
// was once spent before the last of them: "expired" where "partial" was meant).
const SOLO_EVENT_RETENTION_S = 4;
const BUSINESS_EVENT_RETENTION_S = 28 * 86_400;
const MASTER_KEY = Buffer.alloc(32, 7).toString("base64"); // testConfig's RUNS_MASTER_KEY

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers, { RUNS_EVENT_RETENTION_SOLO_S: String(SOLO_EVENT_RETENTION_S) });
  recordTurnReads(service);
  const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "events-api-test" });
  const jsm = await jetstreamManager(nc);
  const log = new JetStreamEventLog({ nc, js: jetstream(nc), jsm, keyring: new EventKeyring(MASTER_KEY), clock: systemClock });
  const business = await newWorkspace(service, "business");
  const solo = await newWorkspace(service, "solo");
  const other = await newWorkspace(service, "business");
  t.context = { servers, service, nc, jsm, log, business, solo, other };
});

test.after.always(async (t) => {
  await t.context.nc?.close();
  await t.context.service?.close();
  await t.context.servers?.stop();
});

// ---------------------------------------------------------------------------------------
// Fixtures

interface Fixture {
  run: RunDoc;
  turns: TurnDoc[];
  /** Appends events (sequence continues from the last append); returns them as stored. */
  append(items: Array<{ turn: number | null; type?: string; source?: EventSource; data?: unknown; ms?: number }>): Promise<RunEvent[]>;
}

/** Inserts a run with turns of the given statuses into the service's store. */
async function fixture(t: ExecutionContext<Context>, workspaceId: string, plan: Plan, statuses: TurnStatus[] = ["completed"]): Promise<Fixture> {
  const now = Date.now();
  const runId = newId("run");
  // Cast: the documents gain fields as the service grows; these tests need only these.
  const turns = statuses.map((status, index) => ({
    _id: newId("turn"),
    run_id: runId,
    workspace_id: workspaceId,
    index,
    status,
    agent_version: 1,
    input: [{ type: "input_text", text: `turn ${index}` }],
    output: [],
    error: null,
    created_at: now,
    started_at: status === "queued" ? null : now,
    completed_at: null,
    duration_ms: null,
    transcript: [],
    disposition: index === 0 ? "created" : "continued",
    steer_ids: [],
    first_event_seq: 0,
    epoch: 0,
  })) as TurnDoc[];
  const active = turns.find((turn) => turn.status === "in_progress" || turn.status === "cancelling");
  const run = {
    _id: runId,
    workspace_id: workspaceId,
    agent_id: newId("agt"),
    agent_version: 1,
    versions: [1],
    partition: 0,
    state: active ? "busy" : "idle",
    tags: [],
    plan,
    retention_s: 30 * 86_400,
    event_retention_s: plan === "solo" ? SOLO_EVENT_RETENTION_S : BUSINESS_EVENT_RETENTION_S,
    created_at: now,
    last_activity_at: now,
    expires_at: now + 30 * 86_400_000,
    // Fenced off from every node: the service's orphan check must not adopt (and so
    // finish) these hand-made busy runs, whose events the test writes itself.
    epoch: Number.MAX_SAFE_INTEGER,
    turn_count: turns.length,
    latest_turn_id: turns.at(-1)!._id,
    active_turn_id: active?._id ?? null,
    queued_turn_id: null,
    event_seq: 0, // the last recorded sequence (the actor's meaning): none yet
  } as RunDoc;
  const raw = await t.context.servers.raw();
  await raw.runs.insertOne(run);
  if (turns.length) await raw.turns.insertMany(turns);
  let next = 1;
  return {
    run,
    turns,
    async append(items) {
      const stored: RunEvent[] = [];
      const appender = t.context.log.appender({ id: run._id, workspace_id: workspaceId, plan }, next, { onStored: (e) => stored.push(e) });
      for (const item of items) {
        appender.append(
          item.turn === null ? null : turns[item.turn]._id,
          item.source ?? "runtime",
          item.type ?? "text_delta",
          item.data ?? { delta: `d${appender.nextSequence}` },
          item.ms ?? Date.now(),
        );
      }
      await appender.flush();
      next = appender.nextSequence;
      return stored;
    },
  };
}

/** run.created, then a turn's started / text / final events. */
function turnEvents(turn: number, final = "turn.completed") {
  return [
    { turn, source: "platform" as const, type: "turn.started", data: {} },
    { turn, type: "text_delta", data: { delta: "hel" } },
    { turn, type: "text_delta", data: { delta: "lo" } },
    { turn, source: "platform" as const, type: final, data: { run: { id: "see run" } } },
  ];
}

/**
 * The ids of the turns the service's store is asked for (`getTurn`), from the first call on:
 * recorded once for the whole file (tests run concurrently; each looks for its own turn).
 */
const turnReads: string[] = [];
function recordTurnReads(service: RunningService): void {
  const store = service.store;
  const getTurn = store.getTurn;
  store.getTurn = (id: string) => {
    turnReads.push(id);
    return getTurn.call(store, id);
  };
}

const eventsUrl = (runId: string, query = "") => `/api/v1/runs/${runId}/events${query ? `?${query}` : ""}`;

// ---------------------------------------------------------------------------------------
// A raw SSE client (node:http), so framing, headers and disconnects are seen as sent.

interface SseFrame {
  id?: string;
  event?: string;
  data?: string;
}

interface RawStream {
  status: number;
  headers: http.IncomingHttpHeaders;
  /** The body when the answer is not a stream. */
  json?: any;
  frames: SseFrame[];
  pings: number;
  ended: Promise<void>;
  isEnded(): boolean;
  waitFrames(n: number, timeoutMs?: number): Promise<SseFrame[]>;
  pause(): void;
  resume(): void;
  close(): void;
}

function openStream(baseUrl: string, path: string, key: string, headers: Record<string, string> = {}): Promise<RawStream> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${baseUrl}${path}`, { headers: { authorization: `Bearer ${key}`, accept: "text/event-stream", ...headers }, agent: false });
    req.on("error", reject);
    req.on("response", (res) => {
      const frames: SseFrame[] = [];
      let pings = 0;
      let buffer = "";
      let ended = false;
      const waiters: Array<() => void> = [];
      const notify = () => waiters.splice(0).forEach((w) => w());
      const endedPromise = new Promise<void>((done) => {
        res.on("end", () => ((ended = true), notify(), done()));
        res.on("close", () => ((ended = true), notify(), done()));
        res.on("error", () => undefined);
      });
      const stream: RawStream = {
        status: res.statusCode ?? 0,
        headers: res.headers,
        frames,
        get pings() {
          return pings;
        },
        ended: endedPromise,
        isEnded: () => ended,
        async waitFrames(n, timeoutMs = 10_000) {
          const deadline = Date.now() + timeoutMs;
          while (frames.length < n) {
            if (ended) throw new Error(`stream ended after ${frames.length} of ${n} frames`);
            const left = deadline - Date.now();
            if (left <= 0) throw new Error(`only ${frames.length} of ${n} frames within ${timeoutMs} ms`);
            await new Promise<void>((wake) => {
              const timer = setTimeout(wake, left);
              waiters.push(() => (clearTimeout(timer), wake()));
            });
          }
          return frames.slice(0, n);
        },
        pause: () => res.pause(),
        resume: () => res.resume(),
        close: () => req.destroy(),
      };
      if (!String(res.headers["content-type"]).startsWith("text/event-stream")) {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => (text += chunk));
        res.on("end", () => {
          stream.json = text ? JSON.parse(text) : undefined;
          resolve(stream);
        });
        return;
      }
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => {
        buffer += chunk;
        let cut: number;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const frame: SseFrame = {};
          let comment = false;
          for (const line of block.split("\n")) {
            if (line.startsWith(":")) {
              comment = true;
              if (line === ": ping") pings++;
              continue;
            }
            const colon = line.indexOf(": ");
            const field = line.slice(0, colon) as keyof SseFrame;
            frame[field] = line.slice(colon + 2);
          }
          if (!comment) frames.push(frame);
        }
        notify();
      });
      resolve(stream);
    });
    req.end();
  });
}

const parsed = (frames: SseFrame[]) => frames.map((f) => JSON.parse(f.data!) as RunEvent);

async function consumersOn(jsm: JetStreamManager, plan: Plan, runId: string): Promise<number> {
  let count = 0;
  for await (const info of jsm.consumers.list(eventStreamName(plan))) {
    const subjects = [info.config.filter_subject, ...(info.config.filter_subjects ?? [])];
    if (subjects.includes(eventSubject(plan, runId))) count++;
  }
  return count;
}

async function until(predicate: () => Promise<boolean>, timeoutMs = 10_000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await predicate()) return true;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return false;
}

/**
 * A bare Fastify app whose one route calls streamEvents with chosen options and event log,
 * for what the service's route does not expose (ping interval, endWithTurnId, failures).
 */
async function sseApp(
  t: ExecutionContext<Context>,
  events: EventLog,
  options: Parameters<typeof streamEvents>[4] = {},
  store: RunningService["store"] = t.context.service.store,
): Promise<{ app: FastifyInstance; url: string; ctx: GatewayContext }> {
  // Every reader may read here: the key and run checks of an open stream always pass.
  const auth = { authenticate: async () => ({}), onInvalidated: () => () => undefined };
  const ctx = { events, clock: systemClock, ids: Ids, store, nc: t.context.nc, log: pino({ level: "silent" }), config: { sseStreams: { solo: 100, business: 100 } }, auth } as unknown as GatewayContext;
  const app = Fastify();
  app.addHook("preClose", async () => closeEventStreams(ctx));
  app.setErrorHandler((err, _request, reply) => {
    if (err instanceof ApiError) return reply.status(err.status).send(err.toBody());
    return reply.status(500).send({ error: String(err) });
  });
  app.get<{ Params: { runId: string } }>("/runs/:runId/events", async (request, reply) => {
    const run = await t.context.service.store.getRun(request.params.runId);
    await streamEvents(ctx, request, reply, run!, options);
    return reply;
  });
  await app.listen({ port: 0, host: "127.0.0.1" });
  t.teardown(() => app.close());
  const address = app.server.address() as { port: number };
  return { app, url: `http://127.0.0.1:${address.port}`, ctx };
}

// ---------------------------------------------------------------------------------------
// Lists

test("events - list pages with limit and after, in sequence order, history complete then null", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business");
  const stored = await f.append([{ turn: null, source: "platform", type: "run.created", data: {} }, ...turnEvents(0)]);
  t.is(stored.length, 5);

  const seen: RunEvent[] = [];
  let after: string | undefined;
  const pages: any[] = [];
  for (;;) {
    const res = await business.api.get(eventsUrl(f.run._id, `limit=2${after ? `&after=${after}` : ""}`));
    t.is(res.status, 200, JSON.stringify(res.body));
    pages.push(res.body);
    seen.push(...res.body.data);
    if (!res.body.has_more) break;
    t.is(res.body.next_cursor, res.body.data.at(-1).id);
    after = res.body.next_cursor;
  }
  t.deepEqual(pages.map((p) => p.data.length), [2, 2, 1]);
  t.is(pages[0].object, "list");
  t.deepEqual(pages[0].history, { status: "complete", retention_days: 28 });
  t.deepEqual(pages[1].history, { status: null, retention_days: 28 });
  t.is(pages[2].next_cursor, null);
  t.deepEqual(seen, stored, "every event once, in order, as stored");
  t.deepEqual(seen.map((e) => e.sequence), [1, 2, 3, 4, 5]);
  const first = seen[1];
  t.deepEqual(Object.keys(first).sort(), ["created_at", "data", "id", "run_id", "sequence", "source", "turn_id", "type"]);
  t.is(first.turn_id, f.turns[0]._id);
  t.true(first.created_at < 1e11, "Unix seconds");

  const all = await business.api.get(eventsUrl(f.run._id));
  t.is(all.body.data.length, 5, "default limit covers the run");
  t.false(all.body.has_more);
});

test("events - limit is 1 to 1000, default 100; anything else is 400 param limit", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business");
  const stored = await f.append(Array.from({ length: 101 }, () => ({ turn: 0 })));
  const defaults = await business.api.get(eventsUrl(f.run._id));
  t.is(defaults.body.data.length, 100);
  t.true(defaults.body.has_more);
  t.is(defaults.body.next_cursor, stored[99].id);
  t.is((await business.api.get(eventsUrl(f.run._id, "limit=1000"))).body.data.length, 101);
  t.is((await business.api.get(eventsUrl(f.run._id, "limit=1"))).body.data.length, 1);
  for (const bad of ["0", "1001", "abc", "1.5", "-1", ""]) {
    const res = await business.api.get(eventsUrl(f.run._id, `limit=${bad}`));
    t.is(res.status, 400, bad);
    t.is(res.body.error.code, "invalid_request", bad);
    t.is(res.body.error.param, "limit", bad);
  }
  const badStream = await business.api.get(eventsUrl(f.run._id, "stream=yes"));
  t.is(badStream.status, 400);
  t.is(badStream.body.error.param, "stream");
});

test("events - turn_id selects one turn; unknown turn or another run's turn is 404 turn_not_found", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["completed", "completed"]);
  await f.append([{ turn: null, source: "platform", type: "run.created" }, ...turnEvents(0), ...turnEvents(1)]);
  const second = await business.api.get(eventsUrl(f.run._id, `turn_id=${f.turns[1]._id}`));
  t.is(second.status, 200);
  t.deepEqual(second.body.data.map((e: RunEvent) => e.sequence), [6, 7, 8, 9]);
  t.true(second.body.data.every((e: RunEvent) => e.turn_id === f.turns[1]._id));
  t.deepEqual(second.body.history, { status: "complete", retention_days: 28 });

  const unknown = await business.api.get(eventsUrl(f.run._id, "turn_id=turn_nope"));
  t.is(unknown.status, 404);
  t.is(unknown.body.error.code, "turn_not_found");
  const elsewhere = await fixture(t, business.id, "business");
  const foreign = await business.api.get(eventsUrl(f.run._id, `turn_id=${elsewhere.turns[0]._id}`));
  t.is(foreign.status, 404);
  t.is(foreign.body.error.code, "turn_not_found");
});

test("events - unknown run and another workspace's run are 404 run_not_found; an expired run is 410 run_expired", async (t) => {
  const { business, other, service } = t.context;
  const f = await fixture(t, business.id, "business");
  for (const query of ["", "stream=true"]) {
    const unknown = await business.api.get(eventsUrl("run_nope", query));
    t.is(unknown.status, 404);
    t.is(unknown.body.error.code, "run_not_found");
    const foreign = await other.api.get(eventsUrl(f.run._id, query));
    t.is(foreign.status, 404);
    t.is(foreign.body.error.code, "run_not_found");
  }
  const expiredId = newId("run");
  await (await t.context.servers.raw()).tombstones.insertOne({ _id: expiredId, workspace_id: business.id, reason: "expired", at: Date.now(), expires_at: Date.now() + 86_400_000 });
  const expired = await business.api.get(eventsUrl(expiredId));
  t.is(expired.status, 410);
  t.is(expired.body.error.code, "run_expired");
});

test("events - run:read is required", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business");
  const created = await business.api.post("/api/v1/api-keys", { label: "no run read", scopes: ["models:read"] });
  t.is(created.status, 201, JSON.stringify(created.body));
  const res = await business.api.withKey(created.body.key).get(eventsUrl(f.run._id));
  t.is(res.status, 403);
  t.is(res.body.error.code, "permission_denied");
  t.is((await business.api.withKey(undefined).get(eventsUrl(f.run._id))).status, 401);
});

test("events - another run's cursor is 400 invalid_cursor, for lists and streams", async (t) => {
  const { business } = t.context;
  const a = await fixture(t, business.id, "business");
  const b = await fixture(t, business.id, "business");
  const [evA] = await a.append([{ turn: 0 }]);
  await b.append([{ turn: 0 }]);
  const list = await business.api.get(eventsUrl(b.run._id, `after=${evA.id}`));
  t.is(list.status, 400);
  t.is(list.body.error.code, "invalid_cursor");
  t.is(list.body.error.param, "after");
  const viaQuery = await openStream(business.api.baseUrl, eventsUrl(b.run._id, `stream=true&after=${evA.id}`), business.key);
  t.is(viaQuery.status, 400);
  t.is(viaQuery.json.error.code, "invalid_cursor");
  t.is(viaQuery.json.error.param, "after");
  const viaHeader = await openStream(business.api.baseUrl, eventsUrl(b.run._id, "stream=true"), business.key, { "last-event-id": evA.id });
  t.is(viaHeader.status, 400);
  t.is(viaHeader.json.error.code, "invalid_cursor");
  t.is(viaHeader.json.error.param, "Last-Event-ID");
  const garbage = await business.api.get(eventsUrl(b.run._id, "after=evt_garbage"));
  t.is(garbage.status, 400);
  t.is(garbage.body.error.code, "invalid_cursor");
});

test("events - an event cursor made up from the run id alone is 400 invalid_cursor, whatever stream sequence it names", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business");
  await f.append([{ turn: 0 }, { turn: 0 }]);
  // The old id format anyone could build: version 1 | stream seq | run seq | sha256(run id)[0..6].
  const runHash = createHash("sha256").update(f.run._id).digest().subarray(0, 6);
  const statuses = new Set<number>();
  for (const streamSeq of [1, 2, 100, 120]) {
    const forged = "evt_" + Buffer.concat([Buffer.from([1, streamSeq, 1]), runHash]).toString("base64url");
    const res = await business.api.get(eventsUrl(f.run._id, `after=${forged}`));
    statuses.add(res.status);
    t.is(res.body.error?.code, "invalid_cursor", `stream seq ${streamSeq}: ${JSON.stringify(res.body)}`);
  }
  t.deepEqual([...statuses], [400], "one answer, whether or not the sequence exists");
});

test("events - retention_days is what the run's events are kept for now: a run created before its plan's event retention was lowered reports the lower (found by a probe: it reported its own 7 days)", async (t) => {
  const { solo, servers } = t.context;
  const f = await fixture(t, solo.id, "solo", ["in_progress"]);
  await (await servers.raw()).runs.updateOne({ _id: f.run._id }, { $set: { event_retention_s: 7 * 86_400 } });
  await f.append([{ turn: null, source: "platform", type: "run.created" }]);
  const res = await solo.api.get(eventsUrl(f.run._id));
  t.is(res.status, 200);
  t.is(res.body.history.retention_days, SOLO_EVENT_RETENTION_S / 86_400);
});

test("events - history: a run without events is empty with retention_days null", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business");
  const res = await business.api.get(eventsUrl(f.run._id));
  t.is(res.status, 200);
  t.deepEqual(res.body, { object: "list", data: [], has_more: false, next_cursor: null, history: { status: "empty", retention_days: null } });
});

test("events - rule 9: an admitted turn whose first event is not recorded is 503 event_boundary_pending with Retry-After", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["completed", "in_progress", "queued"]);
  await f.append([{ turn: null, source: "platform", type: "run.created" }, ...turnEvents(0)]);
  for (const turn of [f.turns[1], f.turns[2]]) {
    const res = await business.api.get(eventsUrl(f.run._id, `turn_id=${turn._id}`));
    t.is(res.status, 503, turn.status);
    t.is(res.body.error.code, "event_boundary_pending");
    t.is(res.body.error.retryable, true);
    t.is(res.headers.get("retry-after"), "1");
  }
  // Once the first event is recorded the same read answers.
  await f.append([{ turn: 1, source: "platform", type: "turn.started" }]);
  const started = await business.api.get(eventsUrl(f.run._id, `turn_id=${f.turns[1]._id}`));
  t.is(started.status, 200);
  t.deepEqual(started.body.history, { status: "complete", retention_days: 28 });
  // A final turn with nothing retained is reported by history, never as pending.
  const g = await fixture(t, business.id, "business", ["completed", "completed"]);
  await g.append([{ turn: null, source: "platform", type: "run.created" }, ...turnEvents(0)]);
  const none = await business.api.get(eventsUrl(g.run._id, `turn_id=${g.turns[1]._id}`));
  t.is(none.status, 200);
  t.is(none.body.history.status, "expired");
});

test("events - rule 9: a run whose stored events are gone while its latest is still within retention (its stream purged) is 503 event_history_unavailable, with or without a cursor, never expired; one whose latest is past retention is expired", async (t) => {
  const { business, jsm } = t.context;
  const created = await business.api.post("/api/v1/runs", { agent: await business.api.agentWith({ model: "faux/scripted" }), input: "soon lost" });
  t.is(created.status, 200);
  const runId = created.body.id as string;
  const listed = await business.api.get(eventsUrl(runId));
  t.is(listed.body.history.status, "complete");
  const cursor = listed.body.data[0].id as string;
  await jsm.streams.purge(eventStreamName("business"), { filter: eventSubject("business", runId) });
  for (const query of ["", `after=${encodeURIComponent(cursor)}`]) {
    const res = await business.api.get(eventsUrl(runId, query));
    t.is(res.status, 503, `${query}: ${JSON.stringify(res.body)}`);
    t.is(res.body.error.code, "event_history_unavailable");
    t.true(res.body.error.retryable);
    t.is(res.headers.get("retry-after"), "1");
    t.notRegex(res.body.error.message, /jetstream|nats|stream|mongo|ferret/i);
  }
  // The same empty stream for a run whose latest activity is past its event retention: expired, as rule 7 says.
  const raw = await t.context.servers.raw();
  await raw.runs.updateOne({ _id: runId }, { $set: { last_activity_at: Date.now() - BUSINESS_EVENT_RETENTION_S * 1000 - 1_000 } });
  const old = await business.api.get(eventsUrl(runId));
  t.is(old.status, 200, JSON.stringify(old.body));
  t.is(old.body.history.status, "expired");
  t.deepEqual(old.body.data, []);
  // Within the run's own retention (created when it was longer) but past the stream's (lowered since): expired too.
  await raw.runs.updateOne({ _id: runId }, { $set: { event_retention_s: 2 * BUSINESS_EVENT_RETENTION_S, last_activity_at: Date.now() - BUSINESS_EVENT_RETENTION_S * 1000 - 86_400_000 } });
  const lowered = await business.api.get(eventsUrl(runId));
  t.is(lowered.status, 200, JSON.stringify(lowered.body));
  t.is(lowered.body.history.status, "expired");
});

test("events - a read of one turn's events from a time and its first sequence (a new owner's check of a lost turn) reads from there, holds nothing for the earlier events it skipped, ", async (t) => {
  const { business, log } = t.context;
  const f = await fixture(t, business.id, "business", ["completed", "in_progress"]);
  await f.append([{ turn: null, source: "platform", type: "run.created" }, ...turnEvents(0)]);
  await new Promise((resolve) => setTimeout(resolve, 50));
  const since = Date.now();
  const later = await f.append([{ turn: 1, source: "platform", type: "turn.started" }, { turn: 1, type: "tool_execution_start", data: { toolCallId: "c1" } }]);
  const ref = { id: f.run._id, workspace_id: business.id, plan: "business" as const, event_retention_s: BUSINESS_EVENT_RETENTION_S, created_at: f.run.created_at };
  const read = await log.read(ref, { turnId: f.turns[1]._id, since: { ms: since, fromSequence: later[0]!.sequence }, limit: 1000, nowMs: Date.now() });
  t.deepEqual(read.events.map((e) => e.sequence), later.map((e) => e.sequence));
  t.false(read.hasMore);
  // Without the time, the same read starts at the run's first event and finds the same.
  const whole = await log.read(ref, { turnId: f.turns[1]._id, limit: 1000, nowMs: Date.now() });
  t.deepEqual(whole.events.map((e) => e.sequence), later.map((e) => e.sequence));
});

test("events - one turn's events far into a long run are read, listed and streamed from near the turn, not from the run's first event (found by a probe: a turn's read decrypted the whole run first)", async (t) => {
  t.timeout(120_000);
  const { business, log, servers } = t.context;
  const f = await fixture(t, business.id, "business", ["completed", "completed"]);
  const earlier = await f.append([{ turn: null, source: "platform", type: "run.created" }, { turn: 0, source: "platform", type: "turn.started" }, ...Array.from({ length: 3_000 }, () => ({ turn: 0 })), { turn: 0, source: "platform", type: "turn.completed", data: { run: {} } }]);
  const later = await f.append(turnEvents(1));
  const turn1 = f.turns[1]._id;
  await (await servers.raw()).turns.updateOne({ _id: turn1 }, { $set: { first_event_seq: later[0]!.sequence } });
  // Where reads begin in the stream (the consumers the log makes), seen through the real JetStream clients.
  const starts: number[] = [];
  const seen = <T extends object>(target: T, method: string): T =>
    new Proxy(target, { get: (obj, prop) => (prop === method ? (stream: string, opts: { opt_start_seq?: number }) => (starts.push(opts.opt_start_seq ?? 0), (obj as any)[prop](stream, opts)) : Reflect.get(obj, prop, obj)) });
  const js = jetstream(t.context.nc);
  const jsm = t.context.jsm;
  const watched = new JetStreamEventLog({
    nc: t.context.nc,
    js: new Proxy(js, { get: (obj, prop) => (prop === "consumers" ? seen(obj.consumers, "get") : Reflect.get(obj, prop, obj)) }),
    jsm: new Proxy(jsm, { get: (obj, prop) => (prop === "consumers" ? seen(obj.consumers, "add") : Reflect.get(obj, prop, obj)) }),
    keyring: new EventKeyring(MASTER_KEY),
    clock: systemClock,
  });
  const ref = { id: f.run._id, workspace_id: business.id, plan: "business" as const, event_retention_s: BUSINESS_EVENT_RETENTION_S, created_at: f.run.created_at };
  // Most of turn 0 is skipped: the read begins at the floor of a message numbered below the
  // turn's first minus MAX_EVENTS_AHEAD (up to about twice that before the turn).
  const skipBelow = decodeEventId(earlier[earlier.length - 1_000]!.id, f.run._id).streamSeq;
  const read = await watched.read(ref, { turnId: turn1, turnFirstSequence: later[0]!.sequence, limit: 1000, nowMs: Date.now() });
  t.deepEqual(read.events, later);
  t.is(read.history.status, "complete");
  t.is(starts.length, 1);
  t.true(starts[0]! > skipBelow, `read from ${starts[0]}, turn 0's late events at ${skipBelow}`);
  const streamed: string[] = [];
  const controller = new AbortController();
  await watched.subscribe(ref, { turnId: turn1, turnFirstSequence: later[0]!.sequence }, (event) => {
    streamed.push(event.id);
    if (streamed.length === later.length) controller.abort();
  }, controller.signal);
  t.deepEqual(streamed, later.map((e) => e.id));
  t.is(starts.length, 2);
  t.true(starts[1]! > skipBelow, `subscribed from ${starts[1]}`);
  // Without the turn's first sequence, the same from the run's first (as before).
  t.deepEqual((await watched.read(ref, { turnId: turn1, limit: 1000, nowMs: Date.now() })).events, later);
  t.is(starts[2], 1);
  // Through the API, which passes the turn's first sequence: the same events, listed and
  // streamed, read from near the turn (the service's consumer requests, seen on NATS).
  const subject = eventSubject("business", f.run._id);
  const serviceStarts: number[] = [];
  const creates = t.context.nc.subscribe("$JS.API.CONSUMER.CREATE.>", {
    callback: (_err, msg) => {
      const config = (JSON.parse(new TextDecoder().decode(msg.data)) as { config?: { filter_subject?: string; filter_subjects?: string[]; opt_start_seq?: number } }).config;
      if (config?.filter_subject === subject || config?.filter_subjects?.includes(subject)) serviceStarts.push(config.opt_start_seq ?? 0);
    },
  });
  t.teardown(() => creates.unsubscribe());
  await t.context.nc.flush();
  const listed = await business.api.get(eventsUrl(f.run._id, `turn_id=${turn1}`));
  t.deepEqual(listed.body.data, later);
  t.is(listed.body.history.status, "complete");
  const stream = await openStream(business.api.baseUrl, eventsUrl(f.run._id, `stream=true&turn_id=${turn1}`), business.key);
  t.teardown(() => stream.close());
  t.deepEqual((await stream.waitFrames(later.length)).map((frame) => frame.id), later.map((e) => e.id));
  await t.context.nc.flush();
  // The list, the stream's look for what is left of the turn, and its subscription; the
  // stream's first check of the cursor reads one event of the run, from its first.
  t.true(serviceStarts.filter((start) => start > skipBelow).length >= 3, `the service read from ${JSON.stringify(serviceStarts)}`);
  t.deepEqual(serviceStarts.filter((start) => start <= skipBelow), [1], `the service read from ${JSON.stringify(serviceStarts)}`);
});

test("events - the seek to a turn far into its run finds the turn's events after an owner change, when the old owner's late event is stored after them (found by a review)", async (t) => {
  t.timeout(120_000);
  const { business, nc, log } = t.context;
  const f = await fixture(t, business.id, "business", ["completed", "completed"]);
  const runRef = { id: f.run._id, workspace_id: business.id, plan: "business" as const };
  const key = new EventKeyring(MASTER_KEY).keyFor(business.id);
  const publisher = new AsyncPublisher(nc, systemClock);
  const stream = eventStreamName("business");
  publisher.raiseFloor(stream, (await t.context.jsm.streams.info(stream)).state.last_seq);
  // The old owner: event 2,500's publish is held (lost with a NATS server, re-sent later), so
  // its appender sends up to 2,755 (256 ahead) and no further.
  const LATE = 2_500;
  let releaseLate!: () => void;
  const lateGate = new Promise<void>((resolve) => (releaseLate = resolve));
  const stored = new Set<number>();
  const oldOwner = new JetStreamAppender(
    { floor: (s: string) => publisher.floor(s), publish: async (subject, payload, msgId, headers) => { if (Number(msgId.split(":")[1]) === LATE) await lateGate; return publisher.publish(subject, payload, msgId, headers); } },
    key, runRef, 1, { onStored: (e) => void stored.add(e.sequence) },
  );
  oldOwner.append(null, "platform", "run.created", {}, Date.now());
  for (let i = 0; i < 2_754; i++) oldOwner.append(f.turns[0]._id, "runtime", "text_delta", { delta: "x" }, Date.now());
  // (Stored events are reported in order, so the held one holds the reports back: the stream is asked.)
  const lastStored = async () => headerSeq((await t.context.jsm.streams.getMessage(stream, { last_by_subj: eventSubject("business", f.run._id) }))?.header.get(SEQ_HEADER) ?? "");
  const until = Date.now() + 30_000;
  while ((await lastStored()) < 2_755 && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 20));
  t.is(await lastStored(), 2_755, "the old owner stored up to 2,755 around the held event");
  t.is(stored.size, LATE - 1);
  // The new owner ends turn 0 and runs turn 1 (its first event numbered 2,761: 2,500 < 2,761 − 256).
  const newOwner = log.appender(runRef, 2_756, {});
  for (let i = 0; i < 5; i++) newOwner.append(f.turns[0]._id, "runtime", "text_delta", { delta: "y" }, Date.now());
  const turn1: RunEvent[] = [];
  const later = log.appender(runRef, 2_761, { onStored: (e) => void turn1.push(e) });
  for (const item of turnEvents(1)) later.append(f.turns[1]._id, item.source ?? "runtime", item.type, item.data, Date.now());
  await newOwner.flush();
  await later.flush();
  // Then the old owner's held event is stored, last.
  releaseLate();
  await oldOwner.flush();
  const ref = { ...runRef, event_retention_s: BUSINESS_EVENT_RETENTION_S, created_at: f.run.created_at };
  const read = await log.read(ref, { turnId: f.turns[1]._id, turnFirstSequence: 2_761, limit: 1000, nowMs: Date.now() });
  t.deepEqual(read.events.map((e) => e.sequence), [2_761, 2_762, 2_763, 2_764]);
  t.is(read.history.status, "complete");
  const streamed: number[] = [];
  const controller = new AbortController();
  await log.subscribe(ref, { turnId: f.turns[1]._id, turnFirstSequence: 2_761 }, (event) => {
    streamed.push(event.sequence);
    if (streamed.length === 4) controller.abort();
  }, controller.signal);
  t.deepEqual(streamed, [2_761, 2_762, 2_763, 2_764]);
});

test("events - a streamed continuation of a long run reads its turn's events from near the turn, not from the run's first", async (t) => {
  t.timeout(120_000);
  const { business, nc } = t.context;
  // ~3,700 text deltas a turn (chunks of 12-20 characters).
  const agent = await business.api.agentWith({ model: "faux/scripted", tools: [], script: [{ text: "word ".repeat(12_000) }] }, "long-turns");
  const first = await business.api.post("/api/v1/runs", { agent, input: "go" });
  t.is(first.body.turn.status, "completed");
  const runId = first.body.id as string;
  const ids: string[] = [];
  for (let page = 0, after = ""; page < 10; page++) {
    const res = await business.api.get(eventsUrl(runId, `limit=1000${after}`));
    ids.push(...res.body.data.map((e: RunEvent) => e.id));
    if (!res.body.has_more) break;
    after = `&after=${encodeURIComponent(res.body.next_cursor)}`;
  }
  t.true(ids.length > 3_000, `${ids.length} events`);
  const skipBelow = decodeEventId(ids[ids.length - 1_000]!, runId).streamSeq;
  const subject = eventSubject("business", runId);
  const serviceStarts: number[] = [];
  const creates = nc.subscribe("$JS.API.CONSUMER.CREATE.>", {
    callback: (_err, msg) => {
      const config = (JSON.parse(new TextDecoder().decode(msg.data)) as { config?: { filter_subject?: string; filter_subjects?: string[]; opt_start_seq?: number } }).config;
      if (config?.filter_subject === subject || config?.filter_subjects?.includes(subject)) serviceStarts.push(config.opt_start_seq ?? 0);
    },
  });
  t.teardown(() => creates.unsubscribe());
  await nc.flush();
  const res = await fetch(`${business.api.baseUrl}/api/v1/runs`, {
    method: "POST",
    headers: { authorization: `Bearer ${business.key}`, "content-type": "application/json", "idempotency-key": `k-${runId}` },
    body: JSON.stringify({ run_id: runId, input: "again", stream: true }),
    signal: AbortSignal.timeout(60_000),
  });
  t.is(res.status, 200);
  const text = await res.text();
  t.regex(text, /event: turn\.completed\n/);
  t.false(/event: turn\.started\n[^]*event: turn\.started\n/.test(text), "only the new turn's events");
  await nc.flush();
  t.true(serviceStarts.some((start) => start > skipBelow), `the service read from ${JSON.stringify(serviceStarts)}`);
  t.true(serviceStarts.filter((start) => start <= skipBelow).length <= 1, `the service read from ${JSON.stringify(serviceStarts)}`);
});

test("events - a page whose events all wait behind one not stored yet is 503 event_history_unavailable with Retry-After, never an empty page with has_more and no cursor; the events before it are listed", async (t) => {
  const { business, nc } = t.context;
  const f = await fixture(t, business.id, "business", ["completed"]);
  // Events 1..4 of the run; 3's publish fails for good after 4 was stored (as one lost with a
  // dying NATS server): 4 is held for 3 until the order horizon (50 s in the service).
  const publisher = new AsyncPublisher(nc, systemClock);
  const stream = eventStreamName("business");
  publisher.raiseFloor(stream, (await t.context.jsm.streams.info(stream)).state.last_seq);
  const appender = new JetStreamAppender(latePublisher(publisher, 3, 4, true), new EventKeyring(MASTER_KEY).keyFor(business.id), { id: f.run._id, workspace_id: business.id, plan: "business" }, 1, {});
  for (let seq = 1; seq <= 4; seq++) appender.append(f.turns[0]._id, "runtime", "text_delta", { delta: `#${seq}` }, Date.now());
  await appender.flush().catch(() => undefined);
  const first = await business.api.get(eventsUrl(f.run._id));
  t.is(first.status, 200);
  t.deepEqual(first.body.data.map((e: RunEvent) => e.sequence), [1, 2]);
  t.true(first.body.has_more);
  const cursor = first.body.next_cursor as string;
  t.is(cursor, first.body.data[1].id);
  const after = await business.api.get(eventsUrl(f.run._id, `after=${encodeURIComponent(cursor)}`));
  t.is(after.status, 503, JSON.stringify(after.body));
  t.is(after.body.error.code, "event_history_unavailable");
  t.true(after.body.error.retryable);
  t.is(after.headers.get("retry-after"), "1");
  // A reader that wants what is stored now, in order, whatever may still come (a new owner's check) gets 4 too.
  const ref = { id: f.run._id, workspace_id: business.id, plan: "business" as const, event_retention_s: BUSINESS_EVENT_RETENTION_S, created_at: f.run.created_at };
  const released = await t.context.log.read(ref, { releaseHeld: true, limit: 1000, nowMs: Date.now() });
  t.deepEqual(released.events.map((e) => e.sequence), [1, 2, 4]);
  t.false(released.hasMore);
});

// ---------------------------------------------------------------------------------------
// Streams

test("events - stream: SSE framing and headers, history then live events, ids usable as cursors", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["in_progress"]);
  const early = await f.append([{ turn: null, source: "platform", type: "run.created", data: {} }, { turn: 0, source: "platform", type: "turn.started" }]);
  const stream = await openStream(business.api.baseUrl, eventsUrl(f.run._id, "stream=true"), business.key);
  t.teardown(() => stream.close());
  t.is(stream.status, 200);
  t.is(stream.headers["content-type"], "text/event-stream; charset=utf-8");
  t.is(stream.headers["cache-control"], "no-store");
  t.is(stream.headers["x-accel-buffering"], "no");
  await stream.waitFrames(2);
  const late = await f.append([{ turn: 0, type: "text_delta", data: { delta: "line\nbreak: and \"quotes\"" } }, { turn: 0, source: "platform", type: "turn.completed", data: { run: {} } }]);
  const frames = await stream.waitFrames(4);
  const all = [...early, ...late];
  t.deepEqual(frames.map((fr) => fr.id), all.map((e) => e.id));
  t.deepEqual(frames.map((fr) => fr.event), ["run.created", "turn.started", "text_delta", "turn.completed"]);
  t.deepEqual(parsed(frames), all, "data is the event JSON as retained");
  t.false(stream.isEnded(), "without turn_id the stream follows the run past a final turn");
  const listed = await business.api.get(eventsUrl(f.run._id, `after=${frames[1].id}`));
  t.deepEqual(listed.body.data, late);
});

test("events - stream resume: Last-Event-ID (or after) gives exactly the rest; the header wins over after", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["in_progress"]);
  const stored = await f.append(Array.from({ length: 6 }, () => ({ turn: 0 })));

  const byHeader = await openStream(business.api.baseUrl, eventsUrl(f.run._id, `stream=true&after=${stored[4].id}`), business.key, { "last-event-id": stored[1].id });
  t.teardown(() => byHeader.close());
  const byQuery = await openStream(business.api.baseUrl, eventsUrl(f.run._id, `stream=true&after=${stored[3].id}`), business.key);
  t.teardown(() => byQuery.close());
  t.deepEqual(parsed(await byHeader.waitFrames(4)), stored.slice(2));
  t.deepEqual(parsed(await byQuery.waitFrames(2)), stored.slice(4));
  // A live event reaches both exactly once.
  const [live] = await f.append([{ turn: 0 }]);
  t.deepEqual(parsed(await byHeader.waitFrames(5)).at(-1), live);
  t.deepEqual(parsed(await byQuery.waitFrames(3)).at(-1), live);
  await new Promise((resolve) => setTimeout(resolve, 300));
  t.is(byHeader.frames.length, 5, "no duplicate");
  t.is(byQuery.frames.length, 3, "no duplicate");

  // Cut a stream mid-way and reconnect from the last frame it received: no gap, no duplicate.
  const first = await openStream(business.api.baseUrl, eventsUrl(f.run._id, "stream=true"), business.key);
  const got = await first.waitFrames(3);
  first.close();
  const resumed = await openStream(business.api.baseUrl, eventsUrl(f.run._id, "stream=true"), business.key, { "last-event-id": got.at(-1)!.id! });
  t.teardown(() => resumed.close());
  const rest = await resumed.waitFrames(4);
  t.deepEqual([...parsed(got), ...parsed(rest)], [...stored, live]);
});

test("events - stream with turn_id carries that turn and ends after its final platform event", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["completed", "in_progress"]);
  await f.append([{ turn: null, source: "platform", type: "run.created" }, ...turnEvents(0)]);
  const stream = await openStream(business.api.baseUrl, eventsUrl(f.run._id, `stream=true&turn_id=${f.turns[1]._id}`), business.key);
  t.teardown(() => stream.close());
  t.is(stream.status, 200);
  const mine = await f.append([
    { turn: 1, source: "platform", type: "turn.started" },
    { turn: 1, type: "text_delta" },
    // A platform event of the turn that does not make it final, and another turn's final event.
    { turn: 1, source: "platform", type: "turn.steered" },
    { turn: 0, source: "platform", type: "turn.completed" },
    { turn: 1, source: "runtime", type: "turn.failed" },
    { turn: 1, source: "platform", type: "turn.incomplete", data: { run: { id: f.run._id } } },
    { turn: 1, type: "text_delta" },
  ]);
  await stream.ended;
  t.deepEqual(parsed(stream.frames), [mine[0], mine[1], mine[2], mine[4], mine[5]]);

  // Resuming a final turn after its last event: nothing left, answered 204 (an EventSource stops).
  await (await t.context.servers.raw()).turns.updateOne({ _id: f.turns[1]._id }, { $set: { status: "incomplete" } });
  await (await t.context.servers.raw()).runs.updateOne({ _id: f.run._id }, { $set: { state: "idle", active_turn_id: null } });
  const after = await openStream(business.api.baseUrl, eventsUrl(f.run._id, `stream=true&turn_id=${f.turns[1]._id}`), business.key, { "last-event-id": mine[6].id });
  t.is(after.status, 204);
  await after.ended;
  t.is(after.frames.length, 0);
});

test("events - a final turn's stream reads the turn from the store once per node, however often it is reopened (its document holds the whole output and transcript)", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["completed"]);
  const stored = await f.append([{ turn: null, source: "platform", type: "run.created" }, ...turnEvents(0)]);
  const turnId = f.turns[0]._id;

  for (let i = 0; i < 3; i++) {
    const stream = await openStream(business.api.baseUrl, eventsUrl(f.run._id, `stream=true&turn_id=${turnId}`), business.key);
    t.is(stream.status, 200);
    await stream.ended;
    t.deepEqual(parsed(stream.frames), stored.slice(1), `stream ${i + 1}: the turn's events, ending with its final one`);
  }
  // Resumed after the final event: still answered 204, from the turn as first read.
  const after = await openStream(business.api.baseUrl, eventsUrl(f.run._id, `stream=true&turn_id=${turnId}`), business.key, { "last-event-id": stored.at(-1)!.id });
  t.is(after.status, 204);
  t.deepEqual(turnReads.filter((id) => id === turnId), [turnId], "one store read of the turn for four streams (was two per stream)");

  // Abuse: the turn, now in the gateway's memory, is still no other run's or workspace's.
  const elsewhere = await fixture(t, business.id, "business");
  const foreign = await business.api.get(eventsUrl(elsewhere.run._id, `stream=true&turn_id=${turnId}`));
  t.is(foreign.status, 404);
  t.is(foreign.body.error.code, "turn_not_found");
  const otherWorkspace = await t.context.other.api.get(eventsUrl(f.run._id, `stream=true&turn_id=${turnId}`));
  t.is(otherWorkspace.status, 404);
  t.is(otherWorkspace.body.error.code, "run_not_found");
});

test("events - a final turn too large for the gateway's cache (over 1 MiB of output) is read once per stream, not twice", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["completed"]);
  const stored = await f.append([{ turn: null, source: "platform", type: "run.created" }, ...turnEvents(0)]);
  const turnId = f.turns[0]._id;
  await (await t.context.servers.raw()).turns.updateOne({ _id: turnId }, { $set: { output: [{ type: "output_text", text: "x".repeat(1_100_000) }] } });

  for (let i = 0; i < 2; i++) {
    const stream = await openStream(business.api.baseUrl, eventsUrl(f.run._id, `stream=true&turn_id=${turnId}`), business.key);
    t.is(stream.status, 200);
    await stream.ended;
    t.deepEqual(parsed(stream.frames), stored.slice(1));
  }
  t.deepEqual(turnReads.filter((id) => id === turnId), [turnId, turnId], "read at each stream (not kept), once");
});

test("events - reconnecting with an expired cursor is 410 event_cursor_expired as JSON, never a skip ahead", async (t) => {
  const { solo } = t.context;
  const f = await fixture(t, solo.id, "solo", ["in_progress"]);
  const old = await f.append([{ turn: 0 }, { turn: 0 }]);
  await new Promise((resolve) => setTimeout(resolve, SOLO_EVENT_RETENTION_S * 1000 + 700));
  await f.append([{ turn: 0 }]); // a surviving later event must not be skipped to
  const stream = await openStream(solo.api.baseUrl, eventsUrl(f.run._id, "stream=true"), solo.key, { "last-event-id": old[0].id });
  t.is(stream.status, 410);
  t.true(String(stream.headers["content-type"]).startsWith("application/json"));
  t.is(stream.json.error.code, "event_cursor_expired");
  t.is(stream.json.error.param, "Last-Event-ID");
  const list = await solo.api.get(eventsUrl(f.run._id, `after=${old[1].id}`));
  t.is(list.status, 410);
  t.is(list.body.error.code, "event_cursor_expired");
  // Still retained after the requests above (so none of them could have skipped to it).
  const fresh = await solo.api.get(eventsUrl(f.run._id));
  t.is(fresh.status, 200);
  t.is(fresh.body.history.status, "partial");
  t.is(fresh.body.data.length, 1);
});

test.serial("events - a client that disconnects leaves no JetStream consumer behind", async (t) => {
  const { business, jsm } = t.context;
  const f = await fixture(t, business.id, "business", ["in_progress"]);
  await f.append([{ turn: 0 }, { turn: 0 }]);
  t.is(await consumersOn(jsm, "business", f.run._id), 0);
  const streams = await Promise.all(Array.from({ length: 3 }, () => openStream(business.api.baseUrl, eventsUrl(f.run._id, "stream=true"), business.key)));
  await Promise.all(streams.map((s) => s.waitFrames(2)));
  t.is(await consumersOn(jsm, "business", f.run._id), 3, "one consumer per open stream");
  for (const s of streams) s.close();
  t.true(await until(async () => (await consumersOn(jsm, "business", f.run._id)) === 0, 5_000), "consumers deleted on disconnect");
});

test("events - a real EventSource client (eventsource package) receives the events with their ids and types", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["in_progress"]);
  const stored = await f.append([{ turn: null, source: "platform", type: "run.created" }, { turn: 0, source: "platform", type: "turn.started" }]);
  const received: Array<{ type: string; id: string; data: RunEvent }> = [];
  let opened = false;
  const es = new SseClient(`${business.api.baseUrl}${eventsUrl(f.run._id, "stream=true")}`, {
    fetch: (input, init) => {
      const headers = new Headers(init?.headers);
      headers.set("authorization", `Bearer ${business.key}`);
      return fetch(input, { ...init, headers });
    },
  });
  t.teardown(() => es.close());
  es.onopen = () => (opened = true);
  for (const type of ["run.created", "turn.started", "text_delta", "turn.completed"]) {
    es.addEventListener(type, (message) => received.push({ type: message.type, id: message.lastEventId, data: JSON.parse(message.data) }));
  }
  t.true(await until(async () => received.length === 2), "history arrives");
  const live = await f.append([{ turn: 0, type: "text_delta" }, { turn: 0, source: "platform", type: "turn.completed", data: { run: {} } }]);
  t.true(await until(async () => received.length === 4), "live events arrive");
  t.true(opened);
  const all = [...stored, ...live];
  t.deepEqual(received.map((r) => r.type), all.map((e) => e.type));
  t.deepEqual(received.map((r) => r.id), all.map((e) => e.id));
  t.deepEqual(received.map((r) => r.data), all);
});

test("events - EventSource reconnects with Last-Event-ID after the server cuts the stream, without gap or duplicate", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["in_progress"]);
  const stored = await f.append([{ turn: 0 }, { turn: 0 }]);
  const lastEventIds: Array<string | null> = [];
  let connections = 0;
  const es = new SseClient(`${business.api.baseUrl}${eventsUrl(f.run._id, "stream=true")}`, {
    fetch: async (input, init) => {
      connections++;
      const headers = new Headers(init?.headers);
      lastEventIds.push(headers.get("last-event-id"));
      headers.set("authorization", `Bearer ${business.key}`);
      const res = await fetch(input, { ...init, headers });
      // Cut the first connection after its first two events have been read.
      if (connections > 1 || !res.body) return res;
      const reader = res.body.getReader();
      let seen = "";
      const cut = new ReadableStream<Uint8Array>({
        async pull(controller) {
          const completeFrames = seen.split("\n\n").slice(0, -1).filter((block) => /(^|\n)id: /.test(block));
          if (completeFrames.length >= 2) {
            await reader.cancel();
            controller.close();
            return;
          }
          const { value, done } = await reader.read();
          if (done) return controller.close();
          seen += new TextDecoder().decode(value);
          controller.enqueue(value);
        },
      });
      return new Response(cut, { status: res.status, headers: res.headers });
    },
  });
  t.teardown(() => es.close());
  const received: RunEvent[] = [];
  es.addEventListener("text_delta", (message) => received.push(JSON.parse(message.data)));
  t.true(await until(async () => received.length === 2));
  t.true(await until(async () => connections === 2, 8_000), "reconnected");
  const live = await f.append([{ turn: 0 }]);
  t.true(await until(async () => received.length === 3));
  await new Promise((resolve) => setTimeout(resolve, 200));
  t.deepEqual(received, [...stored, ...live]);
  t.deepEqual(lastEventIds, [null, stored[1].id]);
});

test("events - a real run: the actor's platform and runtime events, listed and streamed per turn", async (t) => {
  const { business } = t.context;
  const agent = await business.api.agentWith({ model: "faux/scripted" });
  const started = await business.api.post("/api/v1/runs", { agent, input: "hello events" });
  t.is(started.status, 200, JSON.stringify(started.body));
  const runId = started.body.id;
  const turnId = started.body.turn.id;

  const list = await business.api.get(eventsUrl(runId));
  t.is(list.status, 200);
  t.deepEqual(list.body.history, { status: "complete", retention_days: 28 });
  const events: RunEvent[] = list.body.data;
  t.deepEqual(events.map((e) => e.sequence), events.map((_, i) => i + 1));
  t.is(events[0].type, "run.created");
  t.is(events[0].source, "platform");
  t.true(events.some((e) => e.source === "runtime" && e.type === "text_delta"));
  const final = events.at(-1)!;
  t.is(final.source, "platform");
  t.is(final.type, "turn.completed");
  t.is((final.data as any).run.turn.status, "completed");

  // The turn's stream replays it and ends with its final event; resuming after that ends at once.
  const stream = await openStream(business.api.baseUrl, eventsUrl(runId, `stream=true&turn_id=${turnId}`), business.key);
  await stream.ended;
  t.deepEqual(parsed(stream.frames), events.filter((e) => e.turn_id === turnId));
  const resumed = await openStream(business.api.baseUrl, eventsUrl(runId, `stream=true&turn_id=${turnId}`), business.key, { "last-event-id": final.id });
  await resumed.ended;
  t.is(resumed.status, 204);
  t.is(resumed.frames.length, 0);

  // A standard EventSource that resumes the finished turn is told so once and stops: no
  // reconnect every few seconds, each counted against the rate limit.
  let connections = 0;
  const es = new SseClient(`${business.api.baseUrl}${eventsUrl(runId, `stream=true&turn_id=${turnId}&after=${final.id}`)}`, {
    fetch: async (input, init) => {
      connections++;
      const headers = new Headers(init?.headers);
      headers.set("authorization", `Bearer ${business.key}`);
      return fetch(input, { ...init, headers });
    },
  });
  t.teardown(() => es.close());
  const stateAtError = await new Promise<number>((resolve) => es.addEventListener("error", () => resolve(es.readyState)));
  t.is(stateAtError, SseClient.CLOSED);
  await new Promise((resolve) => setTimeout(resolve, 3_500)); // past EventSource's default 3 s retry
  t.is(connections, 1);
});

test("events - stream: an open stream ends with an unauthorized error frame at once when its key is revoked, and shows none of what the run does after", async (t) => {
  const { business, service } = t.context;
  const agent = await business.api.agentWith({ model: "faux/scripted" });
  const run = (await business.api.post("/api/v1/runs", { agent, input: "before" })).body;
  const reader = (await business.api.post("/api/v1/api-keys", { scopes: ["run:read"] })).body;
  const stream = await openStream(service.url!, eventsUrl(run.id, "stream=true"), reader.key);
  t.is(stream.status, 200);
  const before = (await stream.waitFrames(1)).length;
  t.true(before >= 1);
  const revokedAt = Date.now();
  t.is((await business.api.post(`/api/v1/api-keys/${reader.id}/revoke`)).status, 200);
  await Promise.race([stream.ended, new Promise((resolve) => setTimeout(resolve, 10_000))]);
  t.true(stream.isEnded(), "the stream ended");
  t.true(Date.now() - revokedAt < 5_000, `ended ${Date.now() - revokedAt} ms after the revocation`);
  const last = stream.frames.at(-1)!;
  t.is(last.event, "error");
  t.is(JSON.parse(last.data!).error.code, "unauthorized");
  // What the run does next is not sent to it (it has ended); the owner's key still reads it.
  t.is((await business.api.post("/api/v1/runs", { run_id: run.id, input: "SECRET-AFTER-REVOKE" })).status, 200);
  t.false(stream.frames.some((frame) => frame.data?.includes("SECRET-AFTER-REVOKE")));
});

test("events - stream: a client that leaves while the stream makes its first reads is not streamed to: its slot is freed at once, not held while the run lives", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["completed"]);
  await f.append([{ turn: null, source: "platform", type: "run.created" }, ...turnEvents(0)]);
  // The stream's first read (its cursor check) takes 400 ms; the client leaves after 50.
  const slow: EventLog = Object.assign(Object.create(t.context.log) as EventLog, {
    read: async (...args: Parameters<EventLog["read"]>) => {
      await new Promise((resolve) => setTimeout(resolve, 400));
      return t.context.log.read(...args);
    },
  });
  const { url, ctx } = await sseApp(t, slow);
  const req = http.request(`${url}/runs/${f.run._id}/events`, { headers: { accept: "text/event-stream" }, agent: false });
  req.on("error", () => undefined);
  req.end();
  await new Promise((resolve) => setTimeout(resolve, 50));
  req.destroy();
  t.true(await until(async () => openStreamCount(ctx) === 0, 3_000), `${openStreamCount(ctx)} streams still open`);
});

test("events - stream: a follow stream of a run deleted (or past retention) meanwhile ends at its next ping with that error, instead of pinging for good", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["completed"]);
  await f.append([{ turn: null, source: "platform", type: "run.created" }, ...turnEvents(0)]);
  const { url } = await sseApp(t, t.context.log, { pingIntervalMs: 200 });
  const stream = await openStream(url, `/runs/${f.run._id}/events`, business.key);
  await stream.waitFrames(5);
  await (await t.context.servers.raw()).runs.deleteOne({ _id: f.run._id });
  await Promise.race([stream.ended, new Promise((resolve) => setTimeout(resolve, 5_000))]);
  t.true(stream.isEnded());
  const last = stream.frames.at(-1)!;
  t.is(last.event, "error");
  t.is(JSON.parse(last.data!).error.code, "run_not_found");
});

// ---------------------------------------------------------------------------------------
// streamEvents directly (options the route does not expose)

test("sse - pings arrive at the configured interval while no event flows", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["in_progress"]);
  const { url } = await sseApp(t, t.context.log, { pingIntervalMs: 150 });
  const stream = await openStream(url, `/runs/${f.run._id}/events`, business.key);
  t.teardown(() => stream.close());
  t.is(stream.status, 200);
  // Three pings within 10 s: at the default interval (15 s) not one would have come.
  for (let i = 0; i < 100 && stream.pings < 3; i++) await new Promise((resolve) => setTimeout(resolve, 100));
  t.true(stream.pings >= 3, `pings: ${stream.pings}`);
  t.is(stream.frames.length, 0, "pings are comments, not events");
});

test("sse - endWithTurnId (the POST stream): from the turn's first event to its final platform event, then the end", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["completed", "queued"]);
  await f.append([{ turn: null, source: "platform", type: "run.created" }, ...turnEvents(0)]);
  const turnId = f.turns[1]._id;
  const { url } = await sseApp(t, t.context.log, { turnId, endWithTurnId: turnId });
  // Recorded before the stream opens: still delivered (the stream starts at the turn's first event).
  const before = await f.append([{ turn: 1, source: "platform", type: "turn.queued" }]);
  const stream = await openStream(url, `/runs/${f.run._id}/events`, business.key);
  const after = await f.append([...turnEvents(1, "turn.cancelled"), { turn: 1 }]);
  await stream.ended;
  t.deepEqual(parsed(stream.frames), [...before, ...after.slice(0, 4)]);
});

test("sse - a turn known final whose final event never comes ends with event: error after the grace period", async (t) => {
  const { business, service } = t.context;
  const f = await fixture(t, business.id, "business", ["in_progress"]);
  const turnId = f.turns[0]._id;
  await f.append([{ turn: 0, source: "platform", type: "turn.started" }]);
  const { url } = await sseApp(t, t.context.log, { turnId, endWithTurnId: turnId, finalEventGraceMs: 300 });
  const stream = await openStream(url, `/runs/${f.run._id}/events`, business.key);
  await stream.waitFrames(1);
  await (await t.context.servers.raw()).turns.updateOne({ _id: turnId }, { $set: { status: "completed" } });
  t.context.nc.publish(`runs.turn.${turnId}.final`, "");
  await stream.ended;
  t.is(stream.frames.length, 2);
  t.is(stream.frames[1].event, "error");
  t.is(stream.frames[1].id, undefined, "an error frame moves no cursor");
  t.is(JSON.parse(stream.frames[1].data!).error.code, "event_history_unavailable");
});

/**
 * An event log whose subscription stalls (as when its consumer's NATS server died): it
 * delivers `first`, then nothing until aborted. Reads go to `log` and are counted.
 */
function stallingLog(log: EventLog, first: RunEvent): EventLog & { reads: number } {
  const stalled = {
    reads: 0,
    appender: (): never => {
      throw new Error("unused");
    },
    lastSequence: async () => 0,
    read: (run: Parameters<EventLog["read"]>[0], options: Parameters<EventLog["read"]>[1]) => (stalled.reads++, log.read(run, options)),
    async subscribe(_run: unknown, _options: unknown, onEvent: EventCallback, signal: AbortSignal) {
      await onEvent(streamedEventOf(first));
      await new Promise<void>((resolve) => (signal.aborted ? resolve() : signal.addEventListener("abort", () => resolve(), { once: true })));
    },
    purge: async () => undefined,
  };
  return stalled;
}

test("sse - a turn that ends between the stream's read of its status and its subscribing is still seen final: a lost final event ends the stream after the grace period", async (t) => {
  const { business, service } = t.context;
  const f = await fixture(t, business.id, "business", ["in_progress"]);
  const turnId = f.turns[0]._id;
  await f.append([{ turn: 0, source: "platform", type: "turn.started" }]);
  // The turn ends right after the stream read it as running: written final, its notice sent,
  // its final event never stored.
  const store = Object.create(service.store) as typeof service.store;
  store.getTurn = async (id: string) => {
    const doc = await service.store.getTurn(id);
    if (id === turnId) {
      await (await t.context.servers.raw()).turns.updateOne({ _id: turnId }, { $set: { status: "completed" } });
      t.context.nc.publish(`runs.turn.${turnId}.final`, "");
      await t.context.nc.flush();
    }
    return doc;
  };
  const { url } = await sseApp(t, t.context.log, { turnId, endWithTurnId: turnId, finalEventGraceMs: 300 }, store);
  const stream = await openStream(url, `/runs/${f.run._id}/events`, business.key);
  const ended = await Promise.race([stream.ended.then(() => true), new Promise<false>((resolve) => setTimeout(() => resolve(false), 5_000))]);
  t.true(ended, "the stream ended within 5 s (before the fix it stayed open, pinging, until the client left)");
  if (!ended) {
    stream.close();
    return;
  }
  t.deepEqual(stream.frames.map((frame) => frame.event), ["turn.started", "error"]);
  t.is(JSON.parse(stream.frames[1].data!).error.code, "event_history_unavailable");
});

test("sse - a subscription that stalls (its consumer's server died) while the turn ends: after the grace the rest is read from the log, the stream ends with the final event, no error", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["in_progress"]);
  const turnId = f.turns[0]._id;
  const [started] = await f.append([{ turn: 0, source: "platform", type: "turn.started" }]);
  const stalled = stallingLog(t.context.log, started!);
  const { url } = await sseApp(t, stalled, { turnId, endWithTurnId: turnId, finalEventGraceMs: 300 });
  const stream = await openStream(url, `/runs/${f.run._id}/events`, business.key);
  await stream.waitFrames(1);
  const rest = await f.append([{ turn: 0 }, { turn: 0, source: "platform", type: "turn.completed" }]);
  await (await t.context.servers.raw()).turns.updateOne({ _id: turnId }, { $set: { status: "completed" } });
  t.context.nc.publish(`runs.turn.${turnId}.final`, "");
  await stream.ended;
  t.deepEqual(stream.frames.map((fr) => fr.event), ["turn.started", rest[0]!.type, "turn.completed"]);
  t.deepEqual(parsed(stream.frames), [started, ...rest]);
});

test("sse - abuse: a client that stops reading during that catch-up pauses it: the log is not read ahead of the socket (a turn of large events cannot fill the node's memory)", async (t) => {
  t.timeout(60_000);
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["in_progress"]);
  const turnId = f.turns[0]._id;
  const [started] = await f.append([{ turn: 0, source: "platform", type: "turn.started" }]);
  // 1,200 events of 16 KiB (~19 MiB): three catch-up pages of 500.
  const big = "x".repeat(16 * 1024);
  for (let i = 0; i < 6; i++) await f.append(Array.from({ length: 200 }, () => ({ turn: 0, data: { delta: big } })));
  await f.append([{ turn: 0, source: "platform", type: "turn.completed" }]);
  const stalled = stallingLog(t.context.log, started!);
  const { url } = await sseApp(t, stalled, { turnId, endWithTurnId: turnId, finalEventGraceMs: 300 });
  const stream = await openStream(url, `/runs/${f.run._id}/events`, business.key);
  await stream.waitFrames(1);
  stream.pause();
  const readsBefore = stalled.reads;
  await (await t.context.servers.raw()).turns.updateOne({ _id: turnId }, { $set: { status: "completed" } });
  t.context.nc.publish(`runs.turn.${turnId}.final`, "");
  // The grace runs out and the catch-up starts; the client reads nothing for 2 s.
  await new Promise((resolve) => setTimeout(resolve, 2_000));
  t.is(stalled.reads - readsBefore, 1, "one page read, the next waits for the socket");
  t.false(stream.isEnded());
  // Read on: every event comes, in order, and the stream ends with the final one.
  stream.resume();
  await stream.ended;
  t.is(stream.frames.length, 1 + 1_200 + 1);
  t.is(stream.frames.at(-1)!.event, "turn.completed");
  t.deepEqual(stream.frames.map((fr) => JSON.parse(fr.data!).sequence), Array.from({ length: 1_202 }, (_, i) => i + 1));
});

test("sse - an error after the stream began is sent as event: error with the error body, then the stream closes", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["in_progress"]);
  const [event] = await f.append([{ turn: 0 }]);
  const failing: EventLog = {
    appender: () => {
      throw new Error("unused");
    },
    lastSequence: async () => 0,
    read: (run, options) => t.context.log.read(run, options),
    async subscribe(_run, _options, onEvent) {
      await onEvent(streamedEventOf(event));
      throw new ApiError("event_history_unavailable", { retryAfterS: 1 });
    },
    purge: async () => undefined,
  };
  const { url } = await sseApp(t, failing);
  const stream = await openStream(url, `/runs/${f.run._id}/events`, business.key);
  await stream.ended;
  t.is(stream.status, 200);
  t.deepEqual(stream.frames.map((fr) => fr.event), ["text_delta", "error"]);
  t.deepEqual(JSON.parse(stream.frames[1].data!), new ApiError("event_history_unavailable").toBody());
});

test("sse - closing the server ends open streams instead of waiting for their clients", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["in_progress"]);
  await f.append([{ turn: 0 }]);
  const { app, url } = await sseApp(t, t.context.log);
  const stream = await openStream(url, `/runs/${f.run._id}/events`, business.key);
  await stream.waitFrames(1);
  const began = Date.now();
  await app.close();
  await stream.ended;
  t.true(Date.now() - began < 3_000, `closed in ${Date.now() - began} ms`);
  t.true(await until(async () => (await consumersOn(t.context.jsm, "business", f.run._id)) === 0, 3_000));
});

test("sse - an event store failure before the first byte is answered as JSON 503", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["in_progress"]);
  const down: EventLog = {
    appender: () => {
      throw new Error("unused");
    },
    lastSequence: async () => 0,
    read: async () => {
      throw new ApiError("event_history_unavailable", { retryAfterS: 1 });
    },
    subscribe: async () => t.fail("must not subscribe"),
    purge: async () => undefined,
  };
  const { url } = await sseApp(t, down);
  const stream = await openStream(url, `/runs/${f.run._id}/events`, business.key);
  t.is(stream.status, 503);
  t.is(stream.json.error.code, "event_history_unavailable");
});

test("sse - a client that stops reading pauses the subscription instead of buffering", async (t) => {
  const { business } = t.context;
  const f = await fixture(t, business.id, "business", ["in_progress"]);
  const big = "x".repeat(64 * 1024);
  let delivered = 0;
  let finished = false;
  const firehose: EventLog = {
    appender: () => {
      throw new Error("unused");
    },
    lastSequence: async () => 0,
    read: async () => ({ events: [], hasMore: false, history: { status: "empty", retention_days: null } }),
    async subscribe(run, _options, onEvent, signal) {
      for (let i = 1; i <= 2_000 && !signal.aborted; i++) {
        const event: RunEvent = { id: `evt_${i}`, sequence: i, source: "runtime", type: "text_delta", run_id: run.id, turn_id: null, created_at: 0, data: { delta: big } };
        await onEvent(streamedEventOf(event));
        delivered++;
      }
      finished = true;
    },
    purge: async () => undefined,
  };
  const { url } = await sseApp(t, firehose);
  const stream = await openStream(url, `/runs/${f.run._id}/events`, business.key);
  stream.pause();
  await new Promise((resolve) => setTimeout(resolve, 1_000));
  t.false(finished);
  t.true(delivered < 400, `delivered ${delivered} of 2000 (${(delivered * 64) / 1024} MiB) to a client that reads nothing`);
  stream.close();
  t.true(await until(async () => finished, 2_000), "the subscription ends with the client");
});
