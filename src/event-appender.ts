/**
 * Appending one run's events: numbered by the run's owner, sanitized, encrypted and
 * published in order without waiting for each ack; {@link JetStreamAppender.flush}
 * says whether all were stored.
 */
import { headers as natsHeaders } from "@nats-io/transport-node";
import { unixSeconds } from "./clock.js";
import { seal } from "./event-crypto.js";
import { MAX_STORED_EVENT_BYTES, sanitizeEvent } from "./event-sanitize.js";
import { ID_ALLOWANCE_BYTES, SEQ_HEADER, type StoredEnvelope, TURN_HEADER } from "./event-envelope.js";
import { type AppenderOptions, type EventAppender, type EventRunRef, type EventSource, EventWriteError, type RunEvent } from "./event-types.js";
import { encodeEventId } from "./event-ids.js";
import { FLOOR_HEADER, MAX_EVENTS_AHEAD, STORED_BELOW_HEADER } from "./event-order.js";
import { eventStreamName, eventSubject } from "./nats.js";
import type { AsyncPublisher, StoredAck } from "./js-publisher.js";

export class JetStreamAppender implements EventAppender {
  private next: number;
  /** Every event numbered below this one is stored. */
  private storedBelow: number;
  /** Stored events numbered above `storedBelow`. */
  private readonly storedAhead = new Set<number>();
  /**
   * Events waiting for the window to move, in sequence order, from `backlogHead` on (an
   * index, not `shift()`: a turn that appends 50,000 events at once would move the whole
   * array for each one sent).
   */
  private backlog: Array<{ sequence: number; send: () => void; settle: (result: StoredAck | Error) => void }> = [];
  private backlogHead = 0;
  /** Completion chain: acks are handled, and onStored called, strictly in sequence order. */
  private tail: Promise<void> = Promise.resolve();
  private firstFailure: EventWriteError | null = null;
  private readonly turnFirstSeqs: Map<string, number>;
  private readonly subject: string;
  private readonly stream: string;
  private readonly maxInFlight: number;

  constructor(
    private readonly publisher: Pick<AsyncPublisher, "publish" | "floor">,
    private readonly key: Uint8Array,
    private readonly run: EventRunRef,
    nextRunSeq: number,
    private readonly options: AppenderOptions,
  ) {
    this.next = nextRunSeq;
    this.storedBelow = nextRunSeq;
    this.subject = eventSubject(run.plan, run.id);
    this.stream = eventStreamName(run.plan);
    this.turnFirstSeqs = new Map(Object.entries(options.turnFirstSeqs ?? {}));
    this.maxInFlight = Math.min(options.maxInFlight ?? MAX_EVENTS_AHEAD, MAX_EVENTS_AHEAD);
  }

  get nextSequence(): number {
    return this.next;
  }

  get failure(): EventWriteError | null {
    return this.firstFailure;
  }

  append(turnId: string | null, source: EventSource, type: string, data: unknown, createdAtMs: number): number {
    if (this.firstFailure) return this.next++;
    // The sequence is taken only once the event is built: an event that could not be
    // built and took one would be a gap that holds every reader of the run (src/event-order.ts).
    const sequence = this.next;
    const tf = turnId === null ? undefined : (this.turnFirstSeqs.get(turnId) ?? sequence);
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
    // Readers scan this shape without parsing it (scanHead, src/event-envelope.ts): changing
    // the members, their order or `event` as the last one needs another `v`.
    const envelope: StoredEnvelope = { v: 1, ms: createdAtMs, ...(tf === undefined ? {} : { tf }), event: shell };
    const payload = seal(this.key, Buffer.from(JSON.stringify(envelope), "utf8"));
    this.next++;
    if (turnId !== null && tf === sequence) this.turnFirstSeqs.set(turnId, sequence);
    const hdrs = natsHeaders();
    hdrs.set(SEQ_HEADER, String(sequence));
    hdrs.set(TURN_HEADER, turnId ?? "");

    let settle!: (ack: StoredAck | Error) => void;
    const outcome = new Promise<StoredAck | Error>((resolve) => (settle = resolve));
    const send = () => {
      // Taken at the first send (retries keep them): where a reader resumes after this
      // event, and which earlier events a reader need not wait for (src/event-order.ts).
      const floor = this.publisher.floor(this.stream);
      if (floor !== undefined) hdrs.set(FLOOR_HEADER, String(floor));
      hdrs.set(STORED_BELOW_HEADER, String(this.storedBelow));
      const publish = () => this.publisher.publish(this.subject, payload, `${this.run.id}:${sequence}`, hdrs);
      const held = this.options.gate?.();
      (held ? held.then(publish) : publish()).then(
        (ack) => {
          this.markStored(sequence);
          settle(ack);
        },
        (err: unknown) => settle(err instanceof Error ? err : new Error(String(err))),
      );
    };
    // A window, not a count in flight: one event retried for long holds back the events
    // `maxInFlight` after it, so none is stored that far ahead of it (src/event-order.ts).
    if (this.backlogHead === this.backlog.length && sequence < this.storedBelow + this.maxInFlight) send();
    else this.backlog.push({ sequence, send, settle });

    this.tail = this.tail.then(async () => {
      const result = await outcome;
      if (this.firstFailure) return;
      if (result instanceof Error) {
        this.firstFailure = new EventWriteError(sequence, result);
        // Later events are not sent: the stored history must not skip over the failed one.
        for (const waiting of this.takeBacklog()) waiting.settle(new Error("not sent after an earlier failure"));
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

  /** Moves the window past the stored events and sends what it now lets through. */
  private markStored(sequence: number): void {
    if (sequence !== this.storedBelow) {
      this.storedAhead.add(sequence);
      return;
    }
    this.storedBelow++;
    while (this.storedAhead.delete(this.storedBelow)) this.storedBelow++;
    while (!this.firstFailure && this.backlogHead < this.backlog.length && this.backlog[this.backlogHead]!.sequence < this.storedBelow + this.maxInFlight) {
      this.backlog[this.backlogHead++]!.send();
    }
    // Drop what was sent once it is most of the array.
    if (this.backlogHead > 1024 && this.backlogHead * 2 > this.backlog.length) {
      this.backlog = this.backlog.slice(this.backlogHead);
      this.backlogHead = 0;
    }
  }

  /** Empties the backlog, returning what waited in it. */
  private takeBacklog(): typeof this.backlog {
    const waiting = this.backlog.slice(this.backlogHead);
    this.backlog = [];
    this.backlogHead = 0;
    return waiting;
  }

  resume(): void {
    if (!this.firstFailure) return;
    this.firstFailure = null;
    // Every event below this one is stored, or was given up by this appender: none of those
    // is sent again, so readers meeting a later event need not wait for them.
    this.storedBelow = this.next;
    this.storedAhead.clear();
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
