import type { Clock, Timer } from "./clock.js";
import { createInbox, type MsgHdrs, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";

/** What JetStream acknowledged for one stored message. */
export interface StoredAck {
  stream: string;
  seq: number;
  duplicate: boolean;
}

/** JetStream refused or did not acknowledge a publish. */
export class PublishError extends Error {
  constructor(
    message: string,
    /** No stream took the subject (no responders), or no ack came in time: worth retrying. */
    readonly retryable: boolean,
    /** The stream is at its byte or message bound (RUNS_EVENT_STREAM_MAX_BYTES). */
    readonly full = false,
  ) {
    super(message);
    this.name = "PublishError";
  }
}

export interface AsyncPublisherOptions {
  /** How long an ack may take before the publish is retried or fails (default 5 s, as @nats-io/jetstream). */
  timeoutMs?: number;
  /**
   * How long a publish that timed out, found no stream or met a server in transition is
   * retried (default 20 s: past a stream leader election after a server of a cluster
   * died, which takes several seconds). The message id de-duplicates the attempts.
   */
  retryForMs?: number;
  /** At most this many attempts in all, whatever the time left (default 40). */
  attempts?: number;
  /** Pause before a further attempt, times the attempt number, at most 1 s (default 250 ms). */
  retryDelayMs?: number;
}

const DEFAULT_TIMEOUT_MS = 5_000;
const DEFAULT_RETRY_FOR_MS = 20_000;
/**
 * The longest a publish with the default options can take from its first send to its
 * storing: the retry budget plus the last attempt's ack timeout.
 */
export const MAX_PUBLISH_SPAN_MS = DEFAULT_RETRY_FOR_MS + DEFAULT_TIMEOUT_MS;

interface Waiting {
  deadline: number;
  settle: (result: StoredAck | PublishError) => void;
}

/**
 * JetStream publishes whose acks all come back on one subscription (as the Go client's
 * PublishAsync does), instead of one request per message. `@nats-io/jetstream`'s
 * publish is a request: a new reply mux entry, a timer and two Error objects with
 * captured stacks per message, which cost more CPU than the publish itself on the
 * event path (profile in docs/performance.md). Here a publish is a core publish with a
 * reply subject `<inbox>.<token>`, and one interval timer expires unanswered ones.
 *
 * Every publish carries a message id (`Nats-Msg-Id`), so a retry after a lost ack is
 * stored once; the ack of the retry reports `duplicate`.
 */
export class AsyncPublisher {
  private readonly prefix: string;
  private readonly sub: Subscription;
  private readonly waiting = new Map<string, Waiting>();
  /** Per stream, the highest sequence an ack reported (see {@link AsyncPublisher.floor}). */
  private readonly acked = new Map<string, number>();
  private readonly sweeper: Timer;
  private counter = 0;
  private closed = false;
  private readonly timeoutMs: number;
  private readonly retryForMs: number;
  private readonly attempts: number;
  private readonly retryDelayMs: number;

  constructor(
    private readonly nc: NatsConnection,
    private readonly clock: Clock,
    options: AsyncPublisherOptions = {},
  ) {
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.retryForMs = options.retryForMs ?? DEFAULT_RETRY_FOR_MS;
    this.attempts = options.attempts ?? 40;
    this.retryDelayMs = options.retryDelayMs ?? 250;
    this.prefix = `${createInbox()}.`;
    this.sub = nc.subscribe(`${this.prefix}*`, { callback: (err, msg) => (err ? undefined : this.onAck(msg)) });
    this.sweeper = clock.every(Math.min(250, this.timeoutMs), () => this.expire(), { keepAlive: false });
    void nc.closed().then(() => this.close());
  }

  /** Stores `payload` on `subject`; `headers` must not be reused for another message. */
  async publish(subject: string, payload: Uint8Array, msgId: string, headers: MsgHdrs): Promise<StoredAck> {
    headers.set("Nats-Msg-Id", msgId);
    const giveUpAt = this.clock.nowMs() + this.retryForMs;
    for (let attempt = 1; ; attempt++) {
      const result = await this.once(subject, payload, headers);
      if (!(result instanceof PublishError)) return result;
      const pause = Math.min(this.retryDelayMs * attempt, 1_000);
      if (!result.retryable || attempt >= this.attempts || this.closed || this.clock.nowMs() + pause >= giveUpAt) throw result;
      await this.clock.sleep(pause);
    }
  }

  /**
   * The highest sequence of `stream` this publisher has seen acknowledged, or its last
   * sequence when it was raised to it (undefined: neither yet). A message first sent after
   * this call is stored after that position.
   */
  floor(stream: string): number | undefined {
    return this.acked.get(stream);
  }

  /** Raises the floor of `stream` to `seq`, a sequence known to be stored (or 0 for an empty stream). */
  raiseFloor(stream: string, seq: number): void {
    if (seq > (this.acked.get(stream) ?? -1)) this.acked.set(stream, seq);
  }

  /** Fails what still waits for an ack and stops listening. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.sweeper.cancel();
    if (!this.nc.isClosed()) this.sub.unsubscribe();
    for (const [token, w] of this.waiting) {
      this.waiting.delete(token);
      w.settle(new PublishError("the NATS connection closed before the ack", false));
    }
  }

  private once(subject: string, payload: Uint8Array, headers: MsgHdrs): Promise<StoredAck | PublishError> {
    if (this.closed) return Promise.resolve(new PublishError("the publisher is closed", false));
    const token = (++this.counter).toString(36);
    return new Promise((settle) => {
      this.waiting.set(token, { deadline: this.clock.nowMs() + this.timeoutMs, settle });
      try {
        this.nc.publish(subject, payload, { reply: this.prefix + token, headers });
      } catch (err) {
        this.waiting.delete(token);
        settle(new PublishError(`publish failed: ${(err as Error).message}`, false));
      }
    });
  }

  private onAck(msg: Msg): void {
    const token = msg.subject.slice(this.prefix.length);
    const ack = parseAck(msg);
    if (!(ack instanceof PublishError)) this.raiseFloor(ack.stream, ack.seq);
    const w = this.waiting.get(token);
    if (!w) return; // expired meanwhile: its retry carries the same message id
    this.waiting.delete(token);
    w.settle(ack);
  }

  private expire(): void {
    const now = this.clock.nowMs();
    for (const [token, w] of this.waiting) {
      if (w.deadline > now) continue;
      this.waiting.delete(token);
      w.settle(new PublishError("no ack from JetStream in time", true));
    }
  }
}

const utf8 = new TextDecoder();

/** An ack, a JetStream API error, or a no-responders status (no stream takes the subject). */
export function parseAck(msg: Pick<Msg, "data" | "headers">): StoredAck | PublishError {
  if (msg.headers?.hasError && msg.data.length === 0) {
    const code = msg.headers.code;
    return new PublishError(code === 503 ? "no JetStream stream takes this subject (no responders)" : `publish answered status ${code}`, code === 503);
  }
  let body: { stream?: unknown; seq?: unknown; duplicate?: unknown; error?: { code?: number; err_code?: number; description?: string } };
  try {
    body = JSON.parse(utf8.decode(msg.data)) as typeof body;
  } catch {
    return new PublishError("invalid ack from JetStream", false);
  }
  if (body.error) {
    const code = body.error.code ?? 0;
    // 5xx is the server side in transition (a peer lost, a leader being elected): the
    // retry carries the same message id, so it is stored once.
    // A stream at its byte or message bound stays full: no retry helps.
    const full = /maximum (bytes|messages)/i.test(body.error.description ?? "");
    return new PublishError(`JetStream refused the message: ${body.error.description ?? "error"} (${code})`, code >= 500 && !full, full);
  }
  if (typeof body.stream !== "string" || body.stream === "" || typeof body.seq !== "number") {
    return new PublishError("invalid ack from JetStream", false);
  }
  return { stream: body.stream, seq: body.seq, duplicate: body.duplicate === true };
}
