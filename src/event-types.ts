/**
 * The event log's contract (src/event-log.ts implements it on JetStream) and the shape
 * of an event as the API shows it.
 */
import type { Plan } from "./domain.js";
import type { RunDoc } from "./documents.js";
import type { HistoryStatus } from "./history-status.js";

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
  /**
   * RunDoc.last_activity_at (Unix ms): about when its latest event was recorded. Optional;
   * with it, a run none of whose events is stored while its latest is still within
   * retention has lost its history (503 event_history_unavailable), not seen it expire.
   */
  last_activity_at?: number;
}

/** What the event log needs of a run document (gateway reads, an owner's recovery). */
export function eventRunOf(run: Pick<RunDoc, "_id" | "workspace_id" | "plan" | "event_retention_s" | "created_at" | "event_seq" | "last_activity_at">): EventReadRun {
  return {
    id: run._id,
    workspace_id: run.workspace_id,
    plan: run.plan,
    event_retention_s: run.event_retention_s,
    created_at: run.created_at,
    event_seq: run.event_seq,
    last_activity_at: run.last_activity_at,
  };
}

export interface ReadOptions {
  /** Event id to read after (exclusive). */
  afterId?: string;
  /** Only this turn's events. */
  turnId?: string;
  limit: number;
  nowMs: number;
  /**
   * Without `afterId`: read from the first message stored at or after this time (Unix ms)
   * rather than from the run's first, taking `fromSequence` as the first run sequence
   * wanted. For a reader after one turn's events (the turn's creation, less clock skew, and
   * its first sequence), not the whole run's. History status then says nothing.
   */
  since?: { ms: number; fromSequence: number };
  /** Events held behind a missing one are given at the end of what is stored, not held for the horizon. */
  releaseHeld?: boolean;
  /** With `turnId`: the turn's first run sequence (its document's `first_event_seq`; 0 unknown), so a long run's earlier events are skipped, not read. */
  turnFirstSequence?: number;
}

export interface SubscribeOptions {
  afterId?: string;
  turnId?: string;
  /** As {@link ReadOptions.turnFirstSequence}. */
  turnFirstSequence?: number;
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
  /**
   * An event is sent only when every event this many numbers before it is stored; later
   * appends wait in memory (default and maximum MAX_EVENTS_AHEAD of
   * src/event-order.ts, which readers rely on to put events back in order).
   */
  maxInFlight?: number;
  /**
   * Asked before each publish: a promise holds it (the owner's lease is in doubt) until
   * it resolves, or fails it when it rejects (the lease was lost). Undefined: go on.
   */
  gate?: () => Promise<void> | undefined;
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
  /**
   * After a failure, once {@link flush} has rejected (nothing of the failed era is in
   * flight): later events are stored again, numbered on. The events it dropped stay lost;
   * readers skip them, since each later event says every event below it is stored or gone.
   * The caller accounts the loss first (the turn whose events they were fails with
   * event_stream_write_failed).
   */
  resume(): void;
}

/**
 * An event as a subscription hands it over: the fields a reader decides on, and the event's
 * JSON taken from the stored bytes (no decoding and encoding again). The API's event is
 * `{"id":"<id>",` followed by `json` after its opening brace ({@link runEventOf}).
 */
export interface StreamedEvent {
  id: string;
  sequence: number;
  source: string;
  type: string;
  turn_id: string | null;
  /** The event's JSON without `id` (`{"sequence":…}`), UTF-8: a copy of the stored bytes, the subscriber's to keep. */
  json: Uint8Array;
}

export type EventCallback = (event: StreamedEvent) => void | Promise<void>;

/** The API's event of a streamed one. */
export function runEventOf(event: StreamedEvent): RunEvent {
  return { id: event.id, ...(JSON.parse(Buffer.from(event.json.buffer, event.json.byteOffset, event.json.length).toString("utf8")) as Omit<RunEvent, "id">) };
}

/** A streamed event of the API's event (tests, and logs that hold whole events). */
export function streamedEventOf(event: RunEvent): StreamedEvent {
  const { id, ...rest } = event;
  return { id, sequence: event.sequence, source: event.source, type: event.type, turn_id: event.turn_id, json: Buffer.from(JSON.stringify(rest), "utf8") };
}

/** The contract of the event log; {@link JetStreamEventLog} implements it. */
export interface EventLog {
  appender(run: EventRunRef, nextRunSeq: number, options?: AppenderOptions): EventAppender;
  /** The run's last stored `sequence` (0 when none is stored), so a new owner continues the numbering. */
  lastSequence(run: Pick<EventRunRef, "id" | "plan">): Promise<number>;
  read(run: EventReadRun, options: ReadOptions): Promise<EventPage>;
  /**
   * Feeds the run's events to `onEvent` as they are stored, from the cursor on, until
   * `signal` aborts, each as a {@link StreamedEvent}. A callback that returns a promise pauses the feed until it settles.
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
