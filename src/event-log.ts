import { headers as natsHeaders, type NatsConnection } from "@nats-io/transport-node";
import {
  DeliverPolicy,
  type Consumer,
  type JetStreamClient,
  type JetStreamManager,
  type JsMsg,
} from "@nats-io/jetstream";
import type { Plan } from "./domain.js";
import { ApiError } from "./errors.js";
import { EventKeyring, open, seal } from "./event-crypto.js";
import { decodeEventId, encodeEventId, type EventPosition } from "./event-ids.js";
import { MAX_STORED_EVENT_BYTES, sanitizeEvent } from "./event-sanitize.js";
import { AsyncPublisher, type StoredAck } from "./js-publisher.js";
import { eventStreamName, eventSubject } from "./nats.js";
import { systemClock, unixSeconds, type Clock } from "./clock.js";
import { HistoryStatus, historyStatus } from "./history-status.js";

/**
 * The run event log (spec Events, decisions §5, DESIGN §5): events are numbered by the run's
 * single owner, sanitized, encrypted per workspace and appended to the JetStream stream of the
 * run's retention class on `runs.ev.<plan>.<run_id>`.
 *
 * Stored message: payload = secretbox(JSON of {@link StoredEnvelope}); headers `Runs-Seq`
 * (the event's sequence) and `Runs-Turn` (its turn id, empty for run-level events); message
 * id `<run_id>:<sequence>` so a re-publish of the same event is dropped by the stream.
 * The event `id` is not stored: it encodes the stream sequence, known only from the ack, and
 * is rebuilt by the reader from the message's stream sequence and `Runs-Seq`.
 */

export const EventSource = { runtime: "runtime", platform: "platform" } as const;
export type EventSource = (typeof EventSource)[keyof typeof EventSource];

/** An event as the API shows it. */
export interface RunEvent {
  id: string;
  sequence: number;
  source: EventSource;
  type: string;
  run_id: string;
  turn_id: string | null;
  /** Unix seconds. */
  created_at: number;
  data: unknown;
}


export interface EventHistory {
  /** null for a read with a cursor. */
  status: HistoryStatus | null;
  /** null while the run has no event stream (never recorded an event). */
  retention_days: number | null;
}

export interface EventPage {
  events: RunEvent[];
  hasMore: boolean;
  history: EventHistory;
}

/** What the writer needs of a run. */
export interface EventRunRef {
  id: string;
  workspace_id: string;
  plan: Plan;
}

/** What a reader needs of a run (fields of RunDoc; times in Unix ms). */
export interface EventReadRun extends EventRunRef {
  event_retention_s: number;
  /** Unix ms. Every run records `run.created` when created, so a run older than its event retention had events. */
  created_at: number;
  /** RunDoc.event_seq: > 0 once the run has recorded events. Optional; tells "all expired" from "never any" after JetStream dropped everything. */
  event_seq?: number;
}

export interface ReadOptions {
  /** Event id to read after (exclusive). */
  afterId?: string;
  /** Only this turn's events. */
  turnId?: string;
  limit: number;
  nowMs: number;
}

export interface SubscribeOptions {
  afterId?: string;
  turnId?: string;
}

export interface AppenderOptions {
  /** Called once per stored event, in sequence order, with the complete event (id included). Exceptions are ignored. */
  onStored?: (event: RunEvent) => void;
  /**
   * Run sequence of the first event of turns that began before this appender (after a
   * failover), so their later events still tell where the turn began. A turn not listed
   * begins at the first event this appender writes for it.
   */
  turnFirstSeqs?: Record<string, number>;
  /** Maximum publishes awaiting their ack; further appends wait in memory (default 256). */
  maxInFlight?: number;
}

/** Writes the events of one run; used only by the run's owner. */
export interface EventAppender {
  /**
   * Numbers, sanitizes, encrypts and publishes one event without waiting for its ack.
   * Publishes leave in call order. Never throws for a store failure: see {@link flush}.
   * Returns the event's sequence.
   */
  append(turnId: string | null, source: EventSource, type: string, data: unknown, createdAtMs: number): number;
  /** Resolves when every appended event is stored; rejects with {@link EventWriteError} if any failed. */
  flush(): Promise<void>;
  /** The sequence the next append will take. */
  readonly nextSequence: number;
  /** The first failure, once one happened (events appended after it are dropped). */
  readonly failure: EventWriteError | null;
}

export type EventCallback = (event: RunEvent, json: string) => void | Promise<void>;

/** The contract of the event log; {@link JetStreamEventLog} implements it. */
export interface EventLog {
  appender(run: EventRunRef, nextRunSeq: number, options?: AppenderOptions): EventAppender;
  /** The run's last stored `sequence` (0 when none is stored), so a new owner continues the numbering. */
  lastSequence(run: Pick<EventRunRef, "id" | "plan">): Promise<number>;
  read(run: EventReadRun, options: ReadOptions): Promise<EventPage>;
  /**
   * Feeds the run's events to `onEvent` as they are stored, from the cursor on, until
   * `signal` aborts. `json` is the event serialized as the API shows it
   * (`JSON.stringify(event)`), taken from the stored bytes without re-encoding.
   * A callback that returns a promise pauses the feed until it settles.
   */
  subscribe(run: EventReadRun, options: SubscribeOptions, onEvent: EventCallback, signal: AbortSignal): Promise<void>;
  purge(run: EventRunRef): Promise<void>;
}

/** An event could not be stored (publish failed or was not acknowledged). */
export class EventWriteError extends Error {
  readonly sequence: number;
  constructor(sequence: number, cause: unknown) {
    super(`Event ${sequence} could not be stored: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
    this.name = "EventWriteError";
    this.sequence = sequence;
  }
}

/** The plaintext that is encrypted: the event without its id, plus what the reader needs. */
interface StoredEnvelope {
  v: 1;
  /** created_at in Unix ms: retention is decided at millisecond precision. */
  ms: number;
  /** Run sequence of the first event of this event's turn (absent for run-level events). */
  tf?: number;
  event: Omit<RunEvent, "id">;
}

const SEQ_HEADER = "Runs-Seq";
const TURN_HEADER = "Runs-Turn";
/** Room for the id the reader adds (an `evt_` id is under 40 characters). */
const ID_ALLOWANCE_BYTES = 64;
/** Messages fetched per pull when reading pages. */
const READ_BATCH = 256;
/** Bounds a page read if messages vanish (expire) between counting and fetching them. */
const FETCH_EXPIRES_MS = 2_000;

export interface JetStreamEventLogOptions {
  /** The connection the event acks come back on (see AsyncPublisher). */
  nc: NatsConnection;
  js: JetStreamClient;
  jsm: JetStreamManager;
  keyring: EventKeyring;
  clock?: Clock;
}

export class JetStreamEventLog implements EventLog {
  private readonly js: JetStreamClient;
  private readonly jsm: JetStreamManager;
  private readonly keyring: EventKeyring;
  private readonly clock: Clock;
  private readonly publisher: AsyncPublisher;

  constructor(options: JetStreamEventLogOptions) {
    this.publisher = new AsyncPublisher(options.nc);
    this.js = options.js;
    this.jsm = options.jsm;
    this.keyring = options.keyring;
    this.clock = options.clock ?? systemClock;
  }

  /**
   * The run's last stored `sequence` (0 when the stream holds none), so a new owner continues
   * numbering after failover. Events expired from the stream are not seen: take the maximum with
   * what the run document recorded (RunDoc.event_seq).
   */
  async lastSequence(run: Pick<EventRunRef, "id" | "plan">): Promise<number> {
    try {
      const msg = await this.jsm.streams.getMessage(eventStreamName(run.plan), { last_by_subj: eventSubject(run.plan, run.id) });
      return msg ? headerSeq(msg.header.get(SEQ_HEADER)) : 0;
    } catch (err) {
      throw unavailable(err);
    }
  }

  appender(run: EventRunRef, nextRunSeq: number, options: AppenderOptions = {}): EventAppender {
    if (!Number.isSafeInteger(nextRunSeq) || nextRunSeq < 1) throw new RangeError(`nextRunSeq must be ≥ 1, got ${nextRunSeq}`);
    return new JetStreamAppender(this.publisher, this.keyring.keyFor(run.workspace_id), run, nextRunSeq, options);
  }

  async read(run: EventReadRun, options: ReadOptions): Promise<EventPage> {
    const cursor = options.afterId === undefined ? undefined : decodeEventId(options.afterId, run.id);
    const stream = eventStreamName(run.plan);
    const subject = eventSubject(run.plan, run.id);
    const key = this.keyring.keyFor(run.workspace_id);
    const minMs = options.nowMs - run.event_retention_s * 1000;
    const retentionDays = run.event_retention_s / 86_400;

    return withUnavailable(async () => {
      if (cursor) await this.checkCursor(run, cursor, minMs);
      const last = await this.jsm.streams.getMessage(stream, { last_by_subj: subject });
      const startSeq = cursor ? cursor.streamSeq + 1 : 1;

      const selected: RunEvent[] = [];
      let firstOfSelection: StoredEnvelope | undefined;
      if (last && last.seq >= startSeq) {
        await this.scan(stream, subject, startSeq, (msg) => {
          const envelope = decodeEnvelope(key, msg.data);
          if (envelope.ms < minMs) return true; // older than the run's retention: never returned
          if (options.turnId !== undefined && envelope.event.turn_id !== options.turnId) return true;
          if (selected.length === 0) firstOfSelection = envelope;
          selected.push(toRunEvent(envelope, msg.seq, run.id));
          return selected.length <= options.limit;
        });
      }
      const hasMore = selected.length > options.limit;
      const events = selected.slice(0, options.limit);
      if (cursor) return { events, hasMore, history: { status: null, retention_days: retentionDays } };

      const status = historyStatus({
        recorded: last !== null || (run.event_seq ?? 0) > 0 || run.created_at < minMs,
        first: firstOfSelection && { sequence: firstOfSelection.event.sequence, turnFirstSequence: firstOfSelection.tf },
        forTurn: options.turnId !== undefined,
      });
      return { events, hasMore, history: { status, retention_days: status === HistoryStatus.empty ? null : retentionDays } };
    });
  }

  async subscribe(
    run: EventReadRun,
    options: SubscribeOptions,
    onEvent: EventCallback,
    signal: AbortSignal,
  ): Promise<void> {
    const cursor = options.afterId === undefined ? undefined : decodeEventId(options.afterId, run.id, "after");
    const stream = eventStreamName(run.plan);
    const subject = eventSubject(run.plan, run.id);
    const key = this.keyring.keyFor(run.workspace_id);
    const retentionMs = run.event_retention_s * 1000;
    if (signal.aborted) return;

    let consumer: Consumer;
    await withUnavailable(async () => {
      if (cursor) await this.checkCursor(run, cursor, this.clock.nowMs() - retentionMs);
    });
    try {
      consumer = await this.js.consumers.get(stream, {
        filter_subjects: subject,
        deliver_policy: DeliverPolicy.StartSequence,
        opt_start_seq: cursor ? cursor.streamSeq + 1 : 1,
      });
    } catch (err) {
      throw unavailable(err);
    }
    let messages: Awaited<ReturnType<Consumer["consume"]>>;
    try {
      messages = await consumer.consume({ max_messages: READ_BATCH });
    } catch (err) {
      await consumer.delete().catch(() => undefined);
      throw unavailable(err);
    }
    const stop = () => void messages.close().catch(() => undefined);
    signal.addEventListener("abort", stop, { once: true });
    try {
      if (signal.aborted) stop();
      for await (const msg of messages) {
        if (signal.aborted) break;
        const { envelope, text } = decodeStoredOrUnavailable(key, msg.data);
        if (envelope.ms < this.clock.nowMs() - retentionMs) continue;
        if (options.turnId !== undefined && envelope.event.turn_id !== options.turnId) continue;
        const event = toRunEvent(envelope, msg.seq, run.id);
        try {
          // Most callbacks return nothing: awaiting only a promise saves a microtask per event.
          const pending = onEvent(event, eventJson(event, text));
          if (pending) await pending;
        } catch (err) {
          throw new CallbackFailure(err);
        }
      }
    } catch (err) {
      // A failure of onEvent is the caller's own error, passed through; any other is the store's: 503.
      throw err instanceof CallbackFailure ? err.error : unavailable(err);
    } finally {
      signal.removeEventListener("abort", stop);
      await messages.close().catch(() => undefined);
      // The ordered consumer is ephemeral (inactive threshold) but is removed now, not later.
      await consumer.delete().catch(() => undefined);
    }
  }

  /** Deletes every stored event of the run (run deletion). */
  async purge(run: EventRunRef): Promise<void> {
    await withUnavailable(() => this.jsm.streams.purge(eventStreamName(run.plan), { filter: eventSubject(run.plan, run.id) }));
  }

  /** A cursor must name a stored, retained event of this run: else 410 (gone) or 400 (not this run's). */
  private async checkCursor(run: EventReadRun, cursor: EventPosition, minMs: number): Promise<void> {
    const msg = await this.jsm.streams.getMessage(eventStreamName(run.plan), { seq: cursor.streamSeq });
    if (!msg) throw new ApiError("event_cursor_expired", { param: "after" });
    if (msg.subject !== eventSubject(run.plan, run.id) || headerSeq(msg.header.get(SEQ_HEADER)) !== cursor.runSeq) {
      throw new ApiError("invalid_cursor", { param: "after", message: "This event cursor was issued for another run." });
    }
    const envelope = decodeEnvelope(this.keyring.keyFor(run.workspace_id), msg.data);
    if (envelope.ms < minMs) throw new ApiError("event_cursor_expired", { param: "after" });
  }

  /**
   * Feeds the run's stored messages from `startSeq` on, in order, to `visit` until it returns
   * false or the messages pending at the start are read. Uses an ordered consumer deleted at the end.
   */
  private async scan(stream: string, subject: string, startSeq: number, visit: (msg: JsMsg) => boolean): Promise<void> {
    const consumer = await this.js.consumers.get(stream, {
      filter_subjects: subject,
      deliver_policy: DeliverPolicy.StartSequence,
      opt_start_seq: startSeq,
    });
    try {
      let pending = (await consumer.info(true)).num_pending;
      while (pending > 0) {
        // Ask for exactly what is pending, so a fetch never waits for messages to arrive.
        const batch = await consumer.fetch({ max_messages: Math.min(pending, READ_BATCH), expires: FETCH_EXPIRES_MS });
        let got = 0;
        let done = false;
        for await (const msg of batch) {
          got++;
          pending = msg.info.pending;
          if (!visit(msg)) {
            done = true;
            break; // closing inside the loop would wait for the loop itself
          }
        }
        await batch.close().catch(() => undefined);
        if (done || got === 0) return; // got === 0: what was pending expired meanwhile
      }
    } finally {
      await consumer.delete().catch(() => undefined);
    }
  }
}

class JetStreamAppender implements EventAppender {
  private next: number;
  private inFlight = 0;
  /** Publishes waiting for room in flight, in sequence order. */
  private readonly backlog: Array<{ send: () => void; settle: (result: StoredAck | Error) => void }> = [];
  /** Completion chain: acks are handled, and onStored called, strictly in sequence order. */
  private tail: Promise<void> = Promise.resolve();
  private firstFailure: EventWriteError | null = null;
  private readonly turnFirstSeqs: Map<string, number>;
  private readonly subject: string;
  private readonly maxInFlight: number;

  constructor(
    private readonly publisher: AsyncPublisher,
    private readonly key: Uint8Array,
    private readonly run: EventRunRef,
    nextRunSeq: number,
    private readonly options: AppenderOptions,
  ) {
    this.next = nextRunSeq;
    this.subject = eventSubject(run.plan, run.id);
    this.turnFirstSeqs = new Map(Object.entries(options.turnFirstSeqs ?? {}));
    this.maxInFlight = options.maxInFlight ?? 256;
  }

  get nextSequence(): number {
    return this.next;
  }

  get failure(): EventWriteError | null {
    return this.firstFailure;
  }

  append(turnId: string | null, source: EventSource, type: string, data: unknown, createdAtMs: number): number {
    const sequence = this.next++;
    if (this.firstFailure) return sequence;
    let tf: number | undefined;
    if (turnId !== null) {
      tf = this.turnFirstSeqs.get(turnId);
      if (tf === undefined) this.turnFirstSeqs.set(turnId, (tf = sequence));
    }
    const shell: Omit<RunEvent, "id"> = {
      sequence,
      source,
      type,
      run_id: this.run.id,
      turn_id: turnId,
      created_at: unixSeconds(createdAtMs),
      data: null,
    };
    // The limit applies to the stored event as the API shows it: measure the other fields.
    const shellBytes = Buffer.byteLength(JSON.stringify(shell), "utf8") - "null".length;
    shell.data = sanitizeEvent(type, data, { maxDataBytes: MAX_STORED_EVENT_BYTES - shellBytes - ID_ALLOWANCE_BYTES });
    const envelope: StoredEnvelope = { v: 1, ms: createdAtMs, ...(tf === undefined ? {} : { tf }), event: shell };
    const payload = seal(this.key, Buffer.from(JSON.stringify(envelope), "utf8"));
    const hdrs = natsHeaders();
    hdrs.set(SEQ_HEADER, String(sequence));
    hdrs.set(TURN_HEADER, turnId ?? "");

    let settle!: (ack: StoredAck | Error) => void;
    const outcome = new Promise<StoredAck | Error>((resolve) => (settle = resolve));
    const send = () => {
      this.inFlight++;
      this.publisher.publish(this.subject, payload, `${this.run.id}:${sequence}`, hdrs).then(
        (ack) => settle(ack),
        (err: unknown) => settle(err instanceof Error ? err : new Error(String(err))),
      ).finally(() => {
        this.inFlight--;
        if (!this.firstFailure) this.backlog.shift()?.send();
      });
    };
    if (this.inFlight < this.maxInFlight && this.backlog.length === 0) send();
    else this.backlog.push({ send, settle });

    this.tail = this.tail.then(async () => {
      const result = await outcome;
      if (this.firstFailure) return;
      if (result instanceof Error) {
        this.firstFailure = new EventWriteError(sequence, result);
        // Later events are not sent: the stored history must not skip over the failed one.
        for (const waiting of this.backlog.splice(0)) waiting.settle(new Error("not sent after an earlier failure"));
        return;
      }
      if (!this.options.onStored) return;
      const event: RunEvent = { id: encodeEventId({ streamSeq: result.seq, runSeq: sequence, runId: this.run.id }), ...shell };
      try {
        this.options.onStored(event);
      } catch {
        // The live tap is best effort; a subscriber's failure must not stop the log.
      }
    });
    return sequence;
  }

  async flush(): Promise<void> {
    // Appends made while waiting extend the chain: wait until it is stable.
    let seen: Promise<void>;
    do {
      seen = this.tail;
      await seen;
    } while (seen !== this.tail);
    if (this.firstFailure) throw this.firstFailure;
  }
}

/** Marks an exception thrown by a subscriber's callback, so it is not reported as a store failure. */
class CallbackFailure {
  constructor(readonly error: unknown) {}
}

function headerSeq(value: string): number {
  const n = Number(value);
  return Number.isSafeInteger(n) && n > 0 ? n : 0;
}

const utf8 = new TextDecoder();

/** The stored envelope and its JSON text. */
function decodeStored(key: Uint8Array, data: Uint8Array): { envelope: StoredEnvelope; text: string } {
  const text = utf8.decode(open(key, data));
  return { envelope: JSON.parse(text) as StoredEnvelope, text };
}

function decodeEnvelope(key: Uint8Array, data: Uint8Array): StoredEnvelope {
  return decodeStored(key, data).envelope;
}

function decodeStoredOrUnavailable(key: Uint8Array, data: Uint8Array): { envelope: StoredEnvelope; text: string } {
  try {
    return decodeStored(key, data);
  } catch (err) {
    throw unavailable(err);
  }
}

const EVENT_KEY = '"event":';

/**
 * `JSON.stringify(event)` without re-encoding: the appender writes the envelope with
 * `event` as its last member, so the stored text ends with the event's own JSON, and the
 * API's event is that JSON with `id` put first. Falls back to encoding anything else.
 */
export function eventJson(event: RunEvent, storedText: string): string {
  const at = storedText.indexOf(EVENT_KEY);
  if (at > 0 && storedText.charCodeAt(at + EVENT_KEY.length) === 0x7b /* { */ && storedText.endsWith("}}")) {
    const body = storedText.slice(at + EVENT_KEY.length + 1, -1);
    return body === "}" ? `{"id":${JSON.stringify(event.id)}}` : `{"id":${JSON.stringify(event.id)},${body}`;
  }
  return JSON.stringify(event);
}

function toRunEvent(envelope: StoredEnvelope, streamSeq: number, runId: string): RunEvent {
  const { event } = envelope;
  return { id: encodeEventId({ streamSeq, runSeq: event.sequence, runId }), ...event };
}

function unavailable(cause: unknown): ApiError {
  if (cause instanceof ApiError) return cause;
  const err = new ApiError("event_history_unavailable", { retryAfterS: 1 });
  (err as { cause?: unknown }).cause = cause;
  return err;
}

/** Runs `fn`, turning every failure that is not already an API error into 503 event_history_unavailable. */
async function withUnavailable<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw unavailable(err);
  }
}
