import type { Msg, MsgHdrs, NatsConnection } from "@nats-io/transport-node";
import {
  DeliverPolicy,
  type JetStreamClient,
  type JetStreamManager,
  type JsMsg,
  type MsgRequest,
  type StoredMsg,
} from "@nats-io/jetstream";
import { Plan } from "./domain.js";
import { ApiError } from "./errors.js";
import type { EventKeyring } from "./event-crypto.js";
import { decodeEventId, encodeEventId, type EventPosition } from "./event-ids.js";
import { FLOOR_HEADER, MAX_EVENTS_AHEAD, ORDER_HORIZON_MS, resumePosition, SequenceOrder, STORED_BELOW_HEADER, type StoredInfo } from "./event-order.js";
import { AsyncPublisher } from "./js-publisher.js";
import { readOrdered, storedAtMs, type OrderedReadOptions } from "./ordered-read.js";
import { eventStreamName, eventSubject } from "./nats.js";
import type { Clock } from "./clock.js";
import { HistoryStatus, historyStatus } from "./history-status.js";
import { JetStreamAppender } from "./event-appender.js";
import { decodeEnvelope, decodeHeadOrUnavailable, headerSeq, SEQ_HEADER, type StoredEnvelope, type StoredHead, toRunEvent, unavailable, withUnavailable } from "./event-envelope.js";
import type { AppenderOptions, EventAppender, EventCallback, EventLog, EventPage, EventReadRun, EventRunRef, ReadOptions, RunEvent, StreamedEvent, SubscribeOptions } from "./event-types.js";

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

const READ_BATCH = 256;
/** A turn whose first event is numbered past this is read from near it, not from the run's first (see turnStart). */
const TURN_SEEK_FROM = 2_048;
const FETCH_EXPIRES_MS = 2_000;

export interface JetStreamEventLogOptions {
  /** The connection the event acks come back on (see AsyncPublisher). */
  nc: NatsConnection;
  js: JetStreamClient;
  jsm: JetStreamManager;
  keyring: EventKeyring;
  clock: Clock;
  /** How long readers hold events for a missing one (default ORDER_HORIZON_MS; tests shorten it). */
  horizonMs?: number;
  /** Pull sizes and timings of subscriptions (defaults in src/ordered-read.ts; tests shorten them). */
  readTuning?: Pick<OrderedReadOptions, "pullBatch" | "pullBytes" | "heartbeatMs" | "resetGiveUpMs">;
  /**
   * Each plan's event retention in seconds, as provisioned: its stream's max_age, which may
   * be shorter than a run's own retention (lowered since the run was created). Without it,
   * a run's own retention is taken as when its events go.
   */
  streamRetentionS?: Readonly<Record<Plan, number>>;
}

export class JetStreamEventLog implements EventLog {
  private readonly js: JetStreamClient;
  private readonly jsm: JetStreamManager;
  private readonly keyring: EventKeyring;
  private readonly clock: Clock;
  private readonly publisher: AsyncPublisher;
  private readonly horizonMs: number;
  private readonly nc: NatsConnection;
  private readonly readTuning: JetStreamEventLogOptions["readTuning"];
  private readonly streamRetentionS: JetStreamEventLogOptions["streamRetentionS"];

  constructor(options: JetStreamEventLogOptions) {
    this.nc = options.nc;
    this.readTuning = options.readTuning;
    this.publisher = new AsyncPublisher(options.nc, options.clock);
    this.js = options.js;
    this.jsm = options.jsm;
    this.keyring = options.keyring;
    this.clock = options.clock;
    this.horizonMs = options.horizonMs ?? ORDER_HORIZON_MS;
    this.streamRetentionS = options.streamRetentionS;
    // Events sent before any ack came carry a floor too: each stream's last sequence now.
    for (const plan of Object.values(Plan)) {
      const stream = eventStreamName(plan);
      void this.jsm.streams.info(stream).then(
        (info) => this.publisher.raiseFloor(stream, info.state.last_seq),
        () => undefined, // not there yet, or NATS away: floors come with the first acks
      );
    }
  }

  /**
   * The run's last stored `sequence` (0 when the stream holds none), so a new owner continues
   * numbering after failover. Events expired from the stream are not seen: take the maximum with
   * what the run document recorded (RunDoc.event_seq).
   */
  async lastSequence(run: Pick<EventRunRef, "id" | "plan">): Promise<number> {
    const stream = eventStreamName(run.plan);
    const subject = eventSubject(run.plan, run.id);
    try {
      const last = await this.jsm.streams.getMessage(stream, { last_by_subj: subject });
      if (!last) return 0;
      // The last stored event may have been stored late (src/event-order.ts): events numbered
      // after it are stored after its floor. Their number is bounded by the appender's window.
      let highest = headerSeq(last.header.get(SEQ_HEADER));
      let at = resumePosition(last.seq, last.header.get(FLOOR_HEADER));
      for (let i = 0; at < last.seq && i <= MAX_EVENTS_AHEAD; i++) {
        // STREAM.MSG.GET takes `next_by_subj` with `seq` (the client's type omits it).
        const msg = await this.jsm.streams.getMessage(stream, { seq: at, next_by_subj: subject } as unknown as MsgRequest);
        if (!msg || msg.seq >= last.seq) break;
        highest = Math.max(highest, headerSeq(msg.header.get(SEQ_HEADER)));
        at = msg.seq + 1;
      }
      return highest;
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
    // What the run's events are kept for now: its own retention, or its plan's stream's
    // where an operator lowered that since the run was created (README: at once).
    const retentionDays = Math.min(run.event_retention_s, this.streamRetentionS?.[run.plan] ?? Infinity) / 86_400;

    return withUnavailable(async () => {
      const last = await this.jsm.streams.getMessage(stream, { last_by_subj: subject });
      const turnStart = cursor || options.since || options.turnId === undefined ? undefined : await this.turnStart(stream, subject, options.turnFirstSequence, last);
      const startSeq = cursor ? await this.checkCursor(run, cursor, minMs) : (turnStart?.streamSeq ?? 1);
      if (!last) assertNotLost(run, this.storedSince(run.plan, minMs, options.nowMs));

      const selected: RunEvent[] = [];
      let firstOfSelection: StoredEnvelope | undefined;
      /** Takes the next event in sequence order; false once the page (and one more) is full. */
      const take = (item: Ordered): boolean => {
        const { envelope, streamSeq } = item;
        if (envelope.ms < minMs) return true; // older than the run's retention: never returned
        if (options.turnId !== undefined && envelope.event.turn_id !== options.turnId) return true;
        if (selected.length === 0) firstOfSelection = envelope;
        selected.push(toRunEvent(envelope, streamSeq, run.id));
        return selected.length <= options.limit;
      };
      const since = cursor ? undefined : options.since;
      const order = new SequenceOrder<Ordered>(cursor ? cursor.runSeq + 1 : (since?.fromSequence ?? turnStart?.runSeq ?? 1), this.horizonMs);
      let full = false;
      if (last && last.seq >= startSeq) {
        await this.scan(stream, subject, since ? { ms: since.ms } : { seq: startSeq }, (msg) => {
          const envelope = decodeEnvelope(key, msg.data);
          full = !order.push(envelope.event.sequence, { envelope, streamSeq: msg.seq }, () => storedInfo(msg.info.timestampNanos / 1e6, msg.headers)).every(take);
          return !full;
        });
      }
      // At the end of what is stored: events held for one that is not coming are released.
      if (!full) full = !order.release(options.releaseHeld ? Infinity : options.nowMs).every(take);
      const hasMore = selected.length > options.limit || order.holding;
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

    const turnStart =
      cursor || options.turnId === undefined
        ? undefined
        : await withUnavailable(async () => this.turnStart(stream, subject, options.turnFirstSequence, await this.jsm.streams.getMessage(stream, { last_by_subj: subject })));
    const startSeq = cursor ? await withUnavailable(() => this.checkCursor(run, cursor, this.clock.nowMs() - retentionMs)) : (turnStart?.streamSeq ?? 1);
    const order = new SequenceOrder<HeadAt>(cursor ? cursor.runSeq + 1 : (turnStart?.runSeq ?? 1), this.horizonMs);
    /** Hands one event in sequence order to the callback: a promise when it must be awaited. */
    const deliver = (head: StoredHead, streamSeq: number): void | Promise<void> => {
      if (head.ms < this.clock.nowMs() - retentionMs) return;
      if (options.turnId !== undefined && head.turn_id !== options.turnId) return;
      const event: StreamedEvent = {
        id: encodeEventId({ streamSeq, runSeq: head.sequence, runId: run.id }),
        sequence: head.sequence,
        source: head.source,
        type: head.type,
        turn_id: head.turn_id,
        json: head.json,
      };
      let pending: void | PromiseLike<void>;
      try {
        pending = onEvent(event);
      } catch (err) {
        throw new CallbackFailure(err);
      }
      // Most callbacks return nothing: awaiting only a promise saves a microtask per event.
      return pending ? Promise.resolve(pending).catch((err: unknown) => Promise.reject(new CallbackFailure(err))) : undefined;
    };
    /** The read returned (or failed): events released from holding and not yet handed over stay so. */
    let ended = false;
    /** Delivers `items` from `from` on, each after the one before settled. */
    const deliverFrom = (items: readonly HeadAt[], from: number): void | Promise<void> => {
      for (let i = from; i < items.length && !signal.aborted && !ended; i++) {
        const pending = deliver(items[i]!.head, items[i]!.streamSeq);
        if (pending) return pending.then(() => deliverFrom(items, i + 1));
      }
    };
    /** One stored message, in stream order. */
    const onMessage = (msg: Msg, streamSeq: number, storedAfter: number): void | Promise<void> => {
      if (signal.aborted) return;
      const head = decodeHeadOrUnavailable(key, msg.data);
      // The next event in order, nothing held (nearly always): no ordering to do.
      if (order.takeNext(head.sequence)) return deliver(head, streamSeq);
      let ready = order.push(head.sequence, { head, streamSeq }, () => storedInfo(storedAtMs(msg), msg.headers));
      // Nothing more is stored for now: events held for one that is not coming go out.
      if (order.holding && storedAfter === 0) ready = [...ready, ...order.release(this.clock.nowMs())];
      return deliverFrom(ready, 0);
    };
    try {
      await readOrdered(this.nc, this.jsm, this.clock, { ...this.readTuning, stream, subject, startSeq }, onMessage, signal);
    } catch (err) {
      // A failure of onEvent is the caller's own error, passed through; any other is the store's: 503.
      throw err instanceof CallbackFailure ? err.error : unavailable(err);
    } finally {
      ended = true;
    }
  }

  /** Deletes every stored event of the run (run deletion). */
  async purge(run: EventRunRef): Promise<void> {
    await withUnavailable(() => this.jsm.streams.purge(eventStreamName(run.plan), { filter: eventSubject(run.plan, run.id) }));
  }

  /** The oldest time an event of a run whose retention starts at `minMs` can still be stored: its stream's may be the shorter. */
  private storedSince(plan: Plan, minMs: number, nowMs: number): number {
    const streamS = this.streamRetentionS?.[plan];
    return streamS === undefined ? minMs : Math.max(minMs, nowMs - streamS * 1000);
  }

  /**
   * A cursor must name a stored, retained event of this run: else 410 (gone) or 400 (not
   * this run's), or 503 when the run's whole history is missing. Returns the stream sequence
   * to read from for the events after it.
   */
  private async checkCursor(run: EventReadRun, cursor: EventPosition, minMs: number): Promise<number> {
    const msg = await this.jsm.streams.getMessage(eventStreamName(run.plan), { seq: cursor.streamSeq });
    if (!msg) {
      if (!(await this.jsm.streams.getMessage(eventStreamName(run.plan), { last_by_subj: eventSubject(run.plan, run.id) }))) {
        assertNotLost(run, this.storedSince(run.plan, minMs, this.clock.nowMs()));
      }
      throw new ApiError("event_cursor_expired", { param: "after" });
    }
    if (msg.subject !== eventSubject(run.plan, run.id) || headerSeq(msg.header.get(SEQ_HEADER)) !== cursor.runSeq) {
      throw new ApiError("invalid_cursor", { param: "after", message: "This event cursor was issued for another run." });
    }
    const envelope = decodeEnvelope(this.keyring.keyFor(run.workspace_id), msg.data);
    if (envelope.ms < minMs) throw new ApiError("event_cursor_expired", { param: "after" });
    return resumePosition(cursor.streamSeq, msg.header.get(FLOOR_HEADER));
  }

  /**
   * Where a read of one turn's events may begin in the stream, for a turn that starts far
   * into its run (`firstSequence` past TURN_SEEK_FROM; else undefined: from the run's
   * first message, as for any read). The bisection looks for a stored message of the run
   * numbered below `firstSequence − MAX_EVENTS_AHEAD` (one lookup of the run's next
   * message per step, ~log2 of the stream's length; the run sequence read from the
   * message's plain header, nothing decrypted), and the read begins after that message's
   * floor ({@link FLOOR_HEADER}), as a cursor's does: every event numbered after it, by its
   * appender or by a later owner's, was first sent after that position was stored. (After
   * the message itself would not do: a stale owner's late message may be stored after a
   * new owner's events; found by a review.) Without the seek a turn's read decrypted the
   * whole run first: seconds for a run of 700,000 events (found by a probe).
   */
  private async turnStart(stream: string, subject: string, firstSequence: number | undefined, last: StoredMsg | null): Promise<{ streamSeq: number; runSeq: number } | undefined> {
    if (firstSequence === undefined || firstSequence <= TURN_SEEK_FROM || !last) return undefined;
    const below = firstSequence - MAX_EVENTS_AHEAD;
    // A stored message of the run: its position, run sequence and floor.
    const probeOf = (msg: StoredMsg) => ({ streamSeq: msg.seq, runSeq: headerSeq(msg.header.get(SEQ_HEADER)), resume: resumePosition(msg.seq, msg.header.get(FLOOR_HEADER)) });
    // The run's next stored message at or after a stream position.
    const nextAt = async (position: number) => {
      const msg = await this.jsm.streams.getMessage(stream, { seq: position, next_by_subj: subject } as unknown as MsgRequest);
      return msg && probeOf(msg);
    };
    // Positions up to `from` lead (before `hi`) to a message numbered below `below`, `lo` the
    // last one found; the next message at or after `hi` is not (or its number is unknown).
    const isBelow = (probe: { runSeq: number }) => probe.runSeq > 0 && probe.runSeq < below;
    const lastMessage = probeOf(last);
    if (isBelow(lastMessage)) return { streamSeq: lastMessage.resume, runSeq: firstSequence };
    let lo: ReturnType<typeof probeOf> | undefined;
    let from = 0;
    let hi = last.seq;
    for (let step = 0; hi - from > 1 && step < 64; step++) {
      const mid = Math.floor((from + hi) / 2);
      const next = await nextAt(mid);
      if (next && next.streamSeq < hi && isBelow(next)) {
        lo = next;
        from = next.streamSeq;
      } else {
        hi = mid;
      }
    }
    return lo ? { streamSeq: lo.resume, runSeq: firstSequence } : undefined;
  }

  /**
   * Feeds the run's stored messages from `start` on (a stream sequence, or the first stored
   * at or after a time), in order, to `visit` until it returns false or the messages pending
   * at the start are read. Uses an ordered consumer deleted at the end.
   */
  private async scan(stream: string, subject: string, start: { seq: number } | { ms: number }, visit: (msg: JsMsg) => boolean): Promise<void> {
    const consumer = await this.js.consumers.get(stream, {
      filter_subjects: subject,
      ...("seq" in start
        ? { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: start.seq }
        : { deliver_policy: DeliverPolicy.StartTime, opt_start_time: new Date(Math.max(0, start.ms)).toISOString() }),
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

/** A decoded event waiting for its turn in sequence order. */
interface Ordered {
  envelope: StoredEnvelope;
  streamSeq: number;
}

/** A subscription's event waiting for its turn in sequence order. */
interface HeadAt {
  head: StoredHead;
  streamSeq: number;
}

function storedInfo(storedMs: number, headers: MsgHdrs | undefined): StoredInfo {
  return { storedMs, storedBelow: headerSeq(headers?.get(STORED_BELOW_HEADER) ?? "") };
}

/** Marks an exception thrown by a subscriber's callback, so it is not reported as a store failure. */
class CallbackFailure {
  constructor(readonly error: unknown) {}
}

/**
 * How long before its latest event's expiry a run with no stored event is taken to have lost
 * its history rather than seen it expire (nodes' clocks, and an event recorded just before
 * the activity time that dates it).
 */
const LOST_HISTORY_MARGIN_MS = 60_000;

/**
 * Rule 9: a run that recorded events and has none stored while its latest should still be
 * retained lost its stream (purged, recreated, its server's data gone): 503
 * event_history_unavailable, never `expired` nor an expired cursor.
 */
function assertNotLost(run: EventReadRun, minMs: number): void {
  if ((run.event_seq ?? 0) > 0 && run.last_activity_at !== undefined && run.last_activity_at - LOST_HISTORY_MARGIN_MS > minMs) {
    throw new ApiError("event_history_unavailable", { retryAfterS: 1, message: "The run's event history is not where it was stored. Retry later; the run and its turns hold its results." });
  }
}
