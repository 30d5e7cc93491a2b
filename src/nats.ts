import { connect, type NatsConnection } from "@nats-io/transport-node";
import { jetstream, jetstreamManager, JetStreamApiCodes, JetStreamApiError, RetentionPolicy, StorageType, DiscardPolicy, type JetStreamClient, type JetStreamManager } from "@nats-io/jetstream";
import { Kvm, type KV } from "@nats-io/kv";
import { Objm, type ObjectStore } from "@nats-io/obj";
import type { Plan } from "./domain.js";
import type { RetentionConfig } from "./config.js";

/** JetStream resources the service uses, opened once at the composition root. */
export interface NatsResources {
  nc: NatsConnection;
  js: JetStreamClient;
  jsm: JetStreamManager;
  /** Partition ownership leases (value: owner and expiry; revision at claim = epoch). */
  leases: KV;
  /** Node heartbeats for placement. */
  nodes: KV;
  /** Run workspace checkpoints. */
  checkpoints: ObjectStore;
  /** Uploaded files (POST /api/v1/files), named by file id. */
  files: ObjectStore;
  /** Rate-limit counters per workspace and window. */
  rateLimits: KV;
  /** One key per executing turn, `<workspace>.<turn>`, for the active-turn limit. */
  activeTurns: KV;
}

export const LEASES_BUCKET = "runs_leases";
export const NODES_BUCKET = "runs_nodes";
export const CHECKPOINTS_BUCKET = "runs_checkpoints";
export const RATE_LIMITS_BUCKET = "runs_ratelimits";
export const ACTIVE_TURNS_BUCKET = "runs_active_turns";
export const FILES_BUCKET = "runs_files";

/** The event stream of a retention class. */
export function eventStreamName(plan: Plan): string {
  return `RUNS_EVENTS_${plan.toUpperCase()}`;
}

export function eventSubject(plan: Plan, runId: string): string {
  return `runs.ev.${plan}.${runId}`;
}

export const Subjects = {
  command: (partition: number) => `runs.cmd.${partition}`,
  turnFinal: (turnId: string) => `runs.turn.${turnId}.final`,
  /** Published once the turn waits for a person's decision (its pending action is stored). */
  turnWaiting: (turnId: string) => `runs.turn.${turnId}.waiting`,
  /** Both notices of a turn (final, waiting): what a request waiting for the turn hears. */
  turnNotices: (turnId: string) => `runs.turn.${turnId}.*`,
  live: (workspaceId: string, runId: string) => `runs.live.${workspaceId}.${runId}`,
  authInvalidate: "runs.auth.invalidate",
} as const;

/** Whether the connection is up, kept current from the client's status events. */
export interface ConnectionState {
  readonly connected: boolean;
}

export function trackConnection(nc: NatsConnection): ConnectionState {
  const state = { connected: !nc.isClosed() };
  void (async () => {
    for await (const status of nc.status()) {
      if (status.type === "disconnect") state.connected = false;
      else if (status.type === "reconnect") state.connected = true;
      else if (status.type === "close") state.connected = false;
    }
  })();
  return state;
}

export async function connectNats(options: { url: string; user?: string; password?: string; name: string }): Promise<NatsConnection> {
  const nc = await connect({
    servers: options.url.split(","),
    user: options.user,
    pass: options.password,
    name: options.name,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 500,
    // A server that stops answering without closing the socket (frozen, a network gone) is
    // taken as disconnected after three unanswered pings, ~30–40 s (the default: 2 min each),
    // so /readyz and the router see it and the client reconnects.
    pingInterval: 10_000,
    maxPingOut: 3,
    timeout: 5_000,
    // Otherwise every request builds two Errors with stacks up front, to decorate a failure
    // that rarely comes (with a third, built in any case, 1–2.7 % of the node's samples in
    // the admission profiles). Our logs say which request failed.
    noAsyncTraces: true,
  });
  if (!coalesceWrites(nc)) {
    process.emitWarning("this NATS client's internals changed: its writes are not coalesced (src/nats.ts, coalesceWrites)", { code: "RUNS_NATS_WRITES" });
  }
  return nc;
}

const COALESCED = Symbol("runs.coalescedWrites");

/** The client internals `coalesceWrites` relies on (@nats-io/nats-core 3.x `ProtocolHandler`). */
interface ProtocolWrites {
  flushPending(): void;
  close(err?: Error): Promise<void>;
  outbound: { size(): number };
  pendingLimit: number;
}

/**
 * Makes the connection write what its commands queued once per turn of the event loop
 * (after I/O, in `setImmediate`) instead of once per microtask.
 *
 * The client queues each command and writes the queue to the socket from a microtask.
 * Our publishes are spread over microtasks (each event a turn emits is its own await),
 * so at 64 concurrent starts the connection made ~15 socket writes per start, each a
 * loopback TCP send of tens of microseconds here and a read on the server's side.
 * Coalesced, everything queued during one loop turn leaves in one write. A queue past
 * the client's own threshold is still written at once, and `flush()` still sends its
 * PING (one turn later). Closing the connection writes what is queued first: the
 * stock client ends its socket before its queued write runs, so publishes made just
 * before `close()` were lost (the test shows it). Best effort still, as in the stock
 * client (what the socket cannot take at once is dropped with it): the service drains
 * its connection at shutdown. Once per connection; returns false, changing nothing, if
 * the client's internals are not the ones this was written against.
 */
export function coalesceWrites(nc: NatsConnection): boolean {
  const protocol = (nc as unknown as { protocol?: Partial<ProtocolWrites> }).protocol;
  if (
    typeof protocol?.flushPending !== "function" ||
    typeof protocol.close !== "function" ||
    typeof protocol.outbound?.size !== "function" ||
    typeof protocol.pendingLimit !== "number"
  ) {
    return false;
  }
  const handler = protocol as ProtocolWrites & { [COALESCED]?: true };
  if (handler[COALESCED]) return true;
  handler[COALESCED] = true;
  const flushNow = handler.flushPending;
  const close = handler.close;
  handler.close = function (this: ProtocolWrites, err?: Error) {
    flushNow.call(this);
    return close.call(this, err);
  };
  let scheduled = false;
  handler.flushPending = function (this: ProtocolWrites) {
    if (this.outbound.size() >= this.pendingLimit) return flushNow.call(this);
    if (scheduled) return;
    scheduled = true;
    setImmediate(() => {
      scheduled = false;
      flushNow.call(this);
    });
  };
  return true;
}

/**
 * Opens (creating when absent) every stream, bucket and object store. Idempotent:
 * every node runs it at start. `replicas` is 3 on a NATS cluster.
 */
export async function provisionNats(
  nc: NatsConnection,
  retention: Pick<RetentionConfig, "eventS">,
  replicas = 1,
  rateWindowMs = 60_000,
  turnLimitMs = 12 * 3_600_000,
  bytes: { events?: number; objects?: number } = {},
): Promise<NatsResources> {
  const js = jetstream(nc);
  const jsm = await jetstreamManager(nc);
  for (const plan of ["solo", "business"] as const) {
    const name = eventStreamName(plan);
    const config = {
      name,
      subjects: [`runs.ev.${plan}.>`],
      retention: RetentionPolicy.Limits,
      storage: StorageType.File,
      discard: DiscardPolicy.Old,
      max_age: retention.eventS[plan] * 1_000_000_000,
      num_replicas: replicas,
      allow_rollup_hdrs: false,
      // JetStream refuses a de-duplication window longer than max_age (short test retention).
      duplicate_window: Math.min(120, retention.eventS[plan]) * 1_000_000_000,
      // Bounded, a full stream refuses new events (the turn fails event_stream_write_failed,
      // visibly) rather than dropping the oldest events of runs still retained.
      ...(bytes.events ? { max_bytes: bytes.events, discard: DiscardPolicy.New } : {}),
    };
    const info = await jsm.streams.info(name).catch((err: unknown) => {
      if (err instanceof JetStreamApiError && err.code === JetStreamApiCodes.StreamNotFound) return null;
      throw err;
    });
    if (!info) {
      await jsm.streams.add(config);
      continue;
    }
    // Retention, its byte bound and the de-duplication window move together: a shorter
    // retention than the window it was made with is refused by JetStream otherwise.
    const maxBytes = bytes.events || -1;
    const changed = info.config.max_age !== config.max_age || info.config.max_bytes !== maxBytes || info.config.duplicate_window !== config.duplicate_window;
    if (changed) {
      await jsm.streams.update(name, { ...info.config, max_age: config.max_age, max_bytes: maxBytes, discard: bytes.events ? DiscardPolicy.New : DiscardPolicy.Old, duplicate_window: config.duplicate_window });
    }
  }
  const kvm = new Kvm(js);
  const leases = await kvm.create(LEASES_BUCKET, { history: 1, replicas });
  const nodes = await kvm.create(NODES_BUCKET, { history: 1, replicas });
  const objects = { replicas, ...(bytes.objects ? { max_bytes: bytes.objects } : {}) };
  const checkpoints = await new Objm(js).create(CHECKPOINTS_BUCKET, objects);
  const files = await new Objm(js).create(FILES_BUCKET, objects);
  // Counters outlive their window briefly, then expire on their own.
  const rateLimits = await kvm.create(RATE_LIMITS_BUCKET, { history: 1, replicas, ttl: Math.max(2 * rateWindowMs, 60_000) });
  // A key a crashed node never removed expires an hour after the longest possible turn.
  const activeTurns = await kvm.create(ACTIVE_TURNS_BUCKET, { history: 1, replicas, ttl: turnLimitMs + 3_600_000 });
  return { nc, js, jsm, leases, nodes, checkpoints, files, rateLimits, activeTurns };
}

/** A KV compare-and-set (create, update, conditional delete) that lost: the key's last revision was not the one expected. */
export function isCasConflict(err: unknown): boolean {
  return (
    err instanceof JetStreamApiError &&
    (err.code === JetStreamApiCodes.StreamWrongLastSequence || err.code === JetStreamApiCodes.StreamWrongLastSequenceUnknown)
  );
}
