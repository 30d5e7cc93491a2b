import { createInbox, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { AckPolicy, DeliverPolicy, type JetStreamManager } from "@nats-io/jetstream";
import type { Clock, Timer } from "./clock.js";
import { MAX_STORED_EVENT_BYTES } from "./event-sanitize.js";

/**
 * An ordered read of one subject of a stream, from a stream sequence on, that never holds more
 * than a bounded number of messages and bytes it has received and not yet handed over.
 *
 * `@nats-io/jetstream`'s ordered consumer holds up to its batch of messages (256 here) whatever
 * their size: with events of up to {@link MAX_STORED_EVENT_BYTES}, ~170 MB for one slow reader.
 * Its byte-bounded mode caps a pull at 100 messages and, when a message does not fit what a pull
 * has left, stalls until two heartbeats are missed. This read issues its own pulls (the same
 * `CONSUMER.MSG.NEXT` requests): at most {@link MAX_PULLS} at a time, each of {@link PULL_BATCH}
 * messages and {@link PULL_BYTES} bytes (more than any stored event), and none while what it holds
 * exceeds one pull's bytes; a pull that ends for its bytes is followed by the next at once.
 * Held bytes therefore stay below (MAX_PULLS + 1) × PULL_BYTES, ~2.2 MiB (plus, on each slot, a
 * message larger than a pull's bytes, which the server refuses to any pull and which is then
 * asked for alone: stored events never are).
 *
 * It also does less per message than the library (no JsMsg, no async iterator; the reply subject
 * read for the three numbers needed), the part of an SSE replay's CPU that is the NATS client's.
 *
 * Each outstanding pull has a reply subject and subscription of its own (one per slot under the
 * read's inbox): the server serves waiting pulls in turn, a message each, and a message carries
 * its stream subject, so only the subscription it arrives on tells which pull it belongs to.
 *
 * Ordering is the ordered consumer's: an ephemeral consumer without acks; a delivery sequence
 * that is not the next one, a heartbeat naming a later delivery than the last one received, a
 * consumer gone, a status it does not expect, heartbeats missed while a pull waits, or the
 * connection reconnecting make it recreate the consumer after the last message received (with
 * backoff that only a message or heartbeat clears, giving up after {@link RESET_GIVE_UP_MS}).
 */

/** Messages per pull request. */
export const PULL_BATCH = 256;
/** Bytes per pull request: more than any stored event message (payload, headers, subject, reply). */
export const PULL_BYTES = MAX_STORED_EVENT_BYTES + 64 * 1024;
/** Pull requests outstanding at once (one being filled while the next waits). */
export const MAX_PULLS = 2;
const PULL_EXPIRES_MS = 30_000;
const HEARTBEAT_MS = 5_000;
/** Recreating a lost consumer is retried this long before the read fails. */
export const RESET_GIVE_UP_MS = 30_000;
const API_PREFIX = "$JS.API";

export interface OrderedReadOptions {
  stream: string;
  subject: string;
  /** The first stream sequence to read (1: from the start). */
  startSeq: number;
  /** Tests shorten these. */
  pullBatch?: number;
  pullBytes?: number;
  heartbeatMs?: number;
  resetGiveUpMs?: number;
}

/**
 * Called with each message in stream order, its stream sequence and how many messages of the
 * subject the stream held after it when it was sent. A returned promise is awaited before the
 * next message is handed over; what it throws or rejects with ends the read with that error.
 */
export type OrderedMessageHandler = (msg: Msg, streamSeq: number, pending: number) => void | PromiseLike<void>;

/** What a read holds now (tests check the bound). */
export interface OrderedReadState {
  heldMessages: number;
  heldBytes: number;
  pulls: number;
  resets: number;
}

/**
 * Reads until `signal` aborts (resolves, after removing its consumer) or fails: the handler's
 * error as it is, a NATS failure as an Error. Fails at once when the first consumer cannot be
 * created.
 */
export function readOrdered(
  nc: NatsConnection,
  jsm: JetStreamManager,
  clock: Clock,
  options: OrderedReadOptions,
  onMessage: OrderedMessageHandler,
  signal: AbortSignal,
  observe?: (read: () => OrderedReadState) => void,
): Promise<void> {
  const read = new OrderedRead(nc, jsm, clock, options, onMessage);
  observe?.(() => read.state());
  return read.run(signal);
}

/** The header of an idle heartbeat naming the consumer's last delivery sequence. */
const LAST_DELIVERY_HEADER = "Nats-Last-Consumer";

const reconnectListeners = new WeakMap<NatsConnection, Set<() => void>>();

/** The reads to tell when `nc` reconnects (one status iterator per connection, shared by its reads). */
function onReconnect(nc: NatsConnection): Set<() => void> {
  let listeners = reconnectListeners.get(nc);
  if (!listeners) {
    const created = new Set<() => void>();
    reconnectListeners.set(nc, (listeners = created));
    void (async () => {
      for await (const status of nc.status()) if (status.type === "reconnect") for (const listener of created) listener();
    })().catch(() => undefined);
  }
  return listeners;
}

/** The stored time of a delivered message, from its reply subject (ms since the epoch). */
export function storedAtMs(msg: Msg): number {
  const tokens = (msg.reply ?? "").split(".");
  const at = ackTokensStart(tokens.length);
  return at < 0 ? 0 : Number(tokens[at + 3]) / 1e6;
}

/** Where the delivered count starts in a `$JS.ACK` subject's tokens: 9 tokens (v1), 12 or more (v2, with domain and account); -1 otherwise. */
function ackTokensStart(count: number): number {
  return count === 9 ? 4 : count >= 12 ? 6 : -1;
}

/**
 * A message's size as the server counts it against a pull's bytes: subject, reply, headers and
 * payload. The client's messages know it (`size()`, not in the `Msg` type); else headers are
 * counted as their encoded form.
 */
function sizeOf(msg: Msg): number {
  const sized = msg as Msg & { size?: () => number };
  if (typeof sized.size === "function") return sized.size();
  return msg.subject.length + (msg.reply?.length ?? 0) + msg.data.length + (msg.headers ? msg.headers.toString().length : 0);
}

interface Pull {
  messages: number;
  bytes: number;
}

interface Held {
  msg: Msg;
  streamSeq: number;
  pending: number;
  bytes: number;
}

class OrderedRead {
  private readonly batch: number;
  private readonly pullBytes: number;
  private readonly heartbeatMs: number;
  private readonly giveUpMs: number;
  private readonly pullBody: Uint8Array;
  private readonly oneMessageBody: Uint8Array;
  private subs: Subscription[] = [];
  /** The consumer's generation whose messages are taken (0 while there is none); older ones are dropped. */
  private live = 0;
  private generations = 0;
  private inbox = "";
  private consumer = "";
  private nextUrl = "";
  /** The next stream sequence to ask for when the consumer is recreated. */
  private nextSeq: number;
  private expectedDelivery = 1;
  /** The outstanding pull of each slot (reply subject `<inbox>.<slot>`), if any. */
  private slots: Array<Pull | undefined> = [];
  private openPulls = 0;
  /** Messages received and not yet handed over, from `heldAt` on (handed-over entries are cleared). */
  private held: Array<Held | undefined> = [];
  private heldAt = 0;
  private heldBytes = 0;
  /** A handler's promise is being awaited. */
  private blocked = false;
  private resetting = false;
  private resets = 0;
  /** A message larger than a pull's bytes came: the next pull asks for one message, any size. */
  private oversized = false;
  private lastHeardMs = 0;
  /** The pause before the next attempt to recreate the consumer (0 while healthy). */
  private backoffMs = 0;
  /** When the resets since the last message or heartbeat began. */
  private troubleSinceMs: number | undefined;
  /** Pulls and messages in flight may have been lost with the old connection. */
  private readonly reconnected = () => this.reset();
  private watchdog: Timer | undefined;
  private finished = false;
  private readonly done: Promise<void>;
  private finish!: (err?: unknown) => void;

  constructor(
    private readonly nc: NatsConnection,
    private readonly jsm: JetStreamManager,
    private readonly clock: Clock,
    private readonly options: OrderedReadOptions,
    private readonly onMessage: OrderedMessageHandler,
  ) {
    this.batch = options.pullBatch ?? PULL_BATCH;
    this.pullBytes = options.pullBytes ?? PULL_BYTES;
    this.heartbeatMs = options.heartbeatMs ?? HEARTBEAT_MS;
    this.giveUpMs = options.resetGiveUpMs ?? RESET_GIVE_UP_MS;
    this.nextSeq = options.startSeq;
    // The server refuses a pull whose heartbeat is more than half its expiry.
    const timing = { expires: Math.max(PULL_EXPIRES_MS, 3 * this.heartbeatMs) * 1e6, idle_heartbeat: this.heartbeatMs * 1e6 };
    this.pullBody = Buffer.from(JSON.stringify({ batch: this.batch, max_bytes: this.pullBytes, ...timing }));
    this.oneMessageBody = Buffer.from(JSON.stringify({ batch: 1, ...timing }));
    this.done = new Promise<void>((resolve, reject) => {
      this.finish = (err) => {
        if (this.finished) return;
        this.finished = true;
        if (err === undefined) resolve();
        else reject(err);
      };
    });
    this.done.catch(() => undefined); // observed by run(); never an unhandled rejection before it
  }

  state(): OrderedReadState {
    return { heldMessages: this.held.length - this.heldAt, heldBytes: this.heldBytes, pulls: this.openPulls, resets: this.resets };
  }

  async run(signal: AbortSignal): Promise<void> {
    if (signal.aborted) return;
    await this.create(); // fails the read at once: nothing was handed over yet
    const stop = () => this.finish();
    signal.addEventListener("abort", stop, { once: true });
    if (signal.aborted) this.finish();
    this.lastHeardMs = this.clock.nowMs();
    this.watchdog = this.clock.every(this.heartbeatMs, () => this.checkHeard(), { keepAlive: false });
    const reconnects = onReconnect(this.nc);
    reconnects.add(this.reconnected);
    this.pull();
    try {
      await this.done;
    } finally {
      reconnects.delete(this.reconnected);
      signal.removeEventListener("abort", stop);
      this.watchdog.cancel();
      await this.dropConsumer();
    }
  }

  /** Creates a consumer from `nextSeq` on, listening on a new inbox (messages for an old one are dropped with it). */
  private async create(): Promise<void> {
    const inbox = createInbox();
    const generation = ++this.generations;
    const subs = Array.from({ length: MAX_PULLS }, (_, slot) =>
      this.nc.subscribe(`${inbox}.${slot}`, { callback: (err, msg) => (err ? this.fail(err) : this.onDelivery(generation, slot, msg)) }),
    );
    // Closed but not by this read (the connection closed): nothing more will come.
    const closed = () => {
      if (generation === this.live) this.fail(new Error("the NATS subscription closed"));
    };
    for (const sub of subs) void sub.closed.then(closed, closed);
    const name = `runs_read_${inbox.slice(inbox.lastIndexOf(".") + 1)}`;
    try {
      await this.jsm.consumers.add(this.options.stream, {
        name,
        filter_subjects: [this.options.subject],
        deliver_policy: DeliverPolicy.StartSequence,
        opt_start_seq: this.nextSeq,
        ack_policy: AckPolicy.None,
        max_deliver: 1,
        mem_storage: true,
        num_replicas: 1,
        inactive_threshold: 5 * 60 * 1e9,
      });
    } catch (err) {
      if (!this.nc.isClosed()) {
        for (const sub of subs) sub.unsubscribe();
        // A request that timed out while the connection was down may still be sent when it is
        // back and create the consumer: the delete, sent after it, removes it then.
        void this.jsm.consumers.delete(this.options.stream, name).catch(() => undefined);
      }
      throw err;
    }
    this.live = generation;
    this.subs = subs;
    this.inbox = inbox;
    this.consumer = name;
    this.nextUrl = `${API_PREFIX}.CONSUMER.MSG.NEXT.${this.options.stream}.${name}`;
    this.expectedDelivery = 1;
    this.slots = Array.from({ length: MAX_PULLS }, () => undefined);
    this.openPulls = 0;
  }

  /** A message or heartbeat came: the consumer works, resets start again without backoff. */
  private healthy(): void {
    this.backoffMs = 0;
    this.troubleSinceMs = undefined;
  }

  private onDelivery(generation: number, slot: number, msg: Msg): void {
    if (this.finished || generation !== this.live) return; // an old consumer's, or after the end
    this.lastHeardMs = this.clock.nowMs();
    const reply = msg.reply;
    if (!reply) return this.onStatus(msg, slot);
    const tokens = reply.split(".");
    const at = ackTokensStart(tokens.length);
    if (at < 0) return this.reset();
    const delivery = Number(tokens[at + 2]);
    if (delivery !== this.expectedDelivery) return this.reset(); // a message was lost between server and here
    this.expectedDelivery++;
    const streamSeq = Number(tokens[at + 1]);
    this.nextSeq = streamSeq + 1;
    if (this.backoffMs !== 0) this.healthy();
    const bytes = sizeOf(msg);
    const pull = this.slots[slot];
    if (pull) {
      pull.messages--;
      pull.bytes -= bytes;
      // The server ends a pull after its last message, or on a message that used its bytes exactly.
      if (pull.messages <= 0 || pull.bytes <= 0) this.endPull(slot);
    }
    const pending = Number(tokens[at + 4]);
    if (!this.blocked && this.heldAt === this.held.length) this.hand(msg, streamSeq, pending);
    else {
      this.held.push({ msg, streamSeq, pending, bytes });
      this.heldBytes += bytes;
    }
    this.pull();
  }

  private onStatus(msg: Msg, slot: number): void {
    const code = msg.headers?.code ?? 0;
    const description = msg.headers?.description ?? "";
    if (code === 100) {
      // An idle heartbeat names the consumer's last delivery: one not received was lost on the way.
      const last = Number(msg.headers?.get(LAST_DELIVERY_HEADER) ?? NaN);
      if (Number.isSafeInteger(last) && last !== this.expectedDelivery - 1) return this.reset();
      this.healthy();
      return;
    }
    // A pull that got all its messages with bytes left over: already counted as ended.
    if (code === 409 && /^batch completed/i.test(description)) return;
    if (code === 404 || code === 408 || (code === 409 && /exceeds maxbytes/i.test(description))) {
      // The slot's pull ended: no messages, expired, or its next message did not fit its bytes.
      const ended = this.slots[slot];
      if (ended) this.endPull(slot);
      if (code === 409 && ended && ended.bytes >= this.pullBytes) this.oversized = true; // fits no pull
      this.pull();
      return;
    }
    this.reset(); // consumer deleted, leadership changed, no responders, …
  }

  private endPull(slot: number): void {
    this.slots[slot] = undefined;
    this.openPulls--;
  }

  /** Asks for more on each free slot while what is held is under one pull's bytes. */
  private pull(): void {
    for (let slot = 0; slot < MAX_PULLS; slot++) {
      if (this.finished || this.resetting || this.heldBytes >= this.pullBytes || this.held.length - this.heldAt >= this.batch) return;
      if (this.slots[slot]) continue;
      const alone = this.oversized;
      this.oversized = false;
      const pull = alone ? { messages: 1, bytes: Number.MAX_SAFE_INTEGER } : { messages: this.batch, bytes: this.pullBytes };
      const body = alone ? this.oneMessageBody : this.pullBody;
      if (this.openPulls === 0) this.lastHeardMs = this.clock.nowMs(); // heartbeats are due from now
      this.slots[slot] = pull;
      this.openPulls++;
      try {
        this.nc.publish(this.nextUrl, body, { reply: `${this.inbox}.${slot}` });
      } catch (err) {
        return this.fail(err);
      }
    }
  }

  /** Hands one message to the handler; a returned promise blocks the rest until it settles. */
  private hand(msg: Msg, streamSeq: number, pending: number): void {
    let result: void | PromiseLike<void>;
    try {
      result = this.onMessage(msg, streamSeq, pending);
    } catch (err) {
      return this.fail(err);
    }
    if (!result) return;
    this.blocked = true;
    Promise.resolve(result).then(
      () => {
        this.blocked = false;
        this.drain();
      },
      (err: unknown) => this.fail(err),
    );
  }

  /** Hands over held messages until one blocks, then asks for more. */
  private drain(): void {
    while (!this.finished && !this.blocked && this.heldAt < this.held.length) {
      const item = this.held[this.heldAt]!;
      this.held[this.heldAt++] = undefined; // the message is the handler's now: not kept alive here
      this.heldBytes -= item.bytes;
      this.hand(item.msg, item.streamSeq, item.pending);
    }
    if (this.heldAt === this.held.length) {
      this.held = [];
      this.heldAt = 0;
    } else if (this.heldAt >= this.batch) {
      // A reader that never catches up never empties the array: drop the cleared entries.
      this.held = this.held.slice(this.heldAt);
      this.heldAt = 0;
    }
    this.pull();
  }

  /** Heartbeats are missed while a pull waits: the consumer or the server went away. */
  private checkHeard(): void {
    if (this.finished || this.resetting) return;
    if (this.openPulls > 0 && this.clock.nowMs() - this.lastHeardMs > 2 * this.heartbeatMs) this.reset();
  }

  /** Recreates the consumer after the last message received, retrying with backoff. */
  private reset(): void {
    if (this.finished || this.resetting) return;
    this.resetting = true;
    this.resets++;
    void this.dropConsumer();
    this.troubleSinceMs ??= this.clock.nowMs();
    void (async () => {
      let lastError: unknown = new Error("the consumer was lost again after each of its recreations");
      while (!this.finished) {
        if (this.nc.isClosed()) return this.fail(new Error("the NATS connection closed"));
        // Backoff carries over resets until a message or heartbeat shows the consumer working,
        // so a consumer that is created but whose pulls fail at once is not recreated in a loop.
        if (this.backoffMs > 0) {
          if (this.clock.nowMs() + this.backoffMs - this.troubleSinceMs! > this.giveUpMs) return this.fail(lastError);
          await this.clock.sleep(this.backoffMs, { keepAlive: false });
          if (this.finished) return;
        }
        this.backoffMs = Math.min(Math.max(250, this.backoffMs * 2), 5_000);
        try {
          await this.create();
          if (this.finished) return void this.dropConsumer(); // ended meanwhile: run() has already cleaned up
          this.resetting = false;
          this.lastHeardMs = this.clock.nowMs();
          this.pull();
          return;
        } catch (err) {
          lastError = err;
        }
      }
    })();
  }

  /** Stops listening and removes the consumer (it would expire on its own after its inactive threshold). */
  private async dropConsumer(): Promise<void> {
    const subs = this.subs;
    const consumer = this.consumer;
    this.live = 0;
    this.subs = [];
    this.consumer = "";
    if (!this.nc.isClosed()) for (const sub of subs) sub.unsubscribe();
    if (consumer) await this.jsm.consumers.delete(this.options.stream, consumer).catch(() => undefined);
  }

  private fail(err: unknown): void {
    this.finish(err ?? new Error("ordered read failed"));
  }
}
