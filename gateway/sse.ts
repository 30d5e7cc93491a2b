import type { OutgoingHttpHeaders, ServerResponse } from "node:http";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { Subscription } from "@nats-io/transport-node";
import { ApiError, drained, eventRunOf, EventSource, isFinalStatus, type Plan, type RunDoc, type StreamedEvent, Subjects, type Timer } from "../src/index.js";
import { FrameBuffer, oneLine } from "./sse-frames.js";
import type { GatewayContext } from "./context.js";
import { loadRun } from "./loaders.js";

/** decisions §5: a `: ping` comment every 15 s keeps proxies from closing an idle stream. */
export const SSE_PING_INTERVAL_MS = 15_000;
/** How often an open stream checks its key again (a rotated key's grace ends at a time no revocation announces). */
const KEY_CHECK_INTERVAL_MS = 5_000;

/** Checks of a run's readability by open streams, shared for a few seconds per run (streams of one run ping together). */
const runChecks = new WeakMap<GatewayContext, Map<string, { atMs: number; check: Promise<void> }>>();
const RUN_CHECK_SHARED_MS = 5_000;

/** Resolves when the run is still readable by its workspace; rejects with its 404 or 410 otherwise. */
function runStillReadable(ctx: GatewayContext, run: RunDoc): Promise<void> {
  let checks = runChecks.get(ctx);
  if (!checks) runChecks.set(ctx, (checks = new Map()));
  const now = ctx.clock.nowMs();
  const shared = checks.get(run._id);
  if (shared && now - shared.atMs < RUN_CHECK_SHARED_MS) return shared.check;
  if (checks.size > 10_000) checks.clear();
  const check = loadRun(ctx, run.workspace_id, run._id).then(() => undefined);
  checks.set(run._id, { atMs: now, check });
  return check;
}

/**
 * How long a stream that ends with a turn waits for that turn's final platform event after
 * the turn is known to be final and nothing else arrived. Then what the subscription did
 * not deliver (it stalls when its consumer's server dies) is read from the log directly;
 * only a lost or expired final event ends the stream with `event: error`
 * event_history_unavailable.
 */
export const FINAL_EVENT_GRACE_MS = 10_000;

/** Frames gathered beyond this size are written at once rather than at the end of the loop turn. */
const FLUSH_BYTES = 64 * 1024;

/** The platform event types that make a turn final (decisions §5). */
export const FINAL_TURN_EVENT_TYPES: ReadonlySet<string> = new Set(["turn.completed", "turn.failed", "turn.cancelled", "turn.incomplete"]);

export interface StreamEventsOptions {
  /** Resume after this event id (exclusive): the `Last-Event-ID` header or `after` query. */
  afterId?: string;
  /** Only this turn's events. */
  turnId?: string;
  /**
   * End the stream after the platform event that makes this turn final. Without it the
   * stream follows the run until the client leaves or the server shuts down.
   */
  endWithTurnId?: string;
  /**
   * True when the caller saw that turn final (the events route reads the turn anyway, and
   * a final turn stays final): the stream does not read it again. A turn's document holds
   * its whole output and transcript, and on the embedded store a second read of a large
   * turn cost as much as streaming a tenth of its events. Otherwise the stream reads the
   * turn's status itself, after its cursor check, so that a turn ending meanwhile is seen.
   */
  endTurnFinal?: boolean;
  /** The `turnId` turn's first run sequence, when the caller read the turn (else the stream reads it when it reads the turn). */
  turnFirstSequence?: number;
  /** Parameter named by a cursor error answered before the stream began (default `after`). */
  cursorParam?: string;
  /** Interval of `: ping` comments (default {@link SSE_PING_INTERVAL_MS}); tests use ~200 ms. */
  pingIntervalMs?: number;
  /** See {@link FINAL_EVENT_GRACE_MS}. */
  finalEventGraceMs?: number;
  /**
   * The stream's slot, taken by the caller before it did what the stream reports ({@link
   * reserveStream}: a streamed start past the limit is refused before it is admitted). The
   * stream frees it when it ends; without it, the stream takes one or answers 429.
   */
  slot?: StreamSlot;
}

/** A workspace's event stream counted against its limit on this node, until freed (once). */
export type StreamSlot = () => void;

/** Open streams per gateway, so a shutdown can end them instead of waiting for their clients. */
const openStreams = new WeakMap<GatewayContext, Set<AbortController>>();
/** Open streams per workspace on this gateway (each holds a JetStream consumer). */
const workspaceStreams = new WeakMap<GatewayContext, Map<string, number>>();

/**
 * Refuses a stream past the workspace's plan limit (429 quota_exceeded), before any
 * consumer is opened. Per gateway node: a client spread over N nodes may hold N times it.
 */
function checkStreamQuota(ctx: GatewayContext, workspaceId: string, plan: Plan): void {
  const open = workspaceStreams.get(ctx)?.get(workspaceId) ?? 0;
  const cap = ctx.config.sseStreams[plan];
  if (open >= cap) {
    // Retry-After: a stream frees its slot when its client goes; a few seconds is a fair wait.
    // Retryable: a slot frees as soon as one of the workspace's streams ends.
    throw new ApiError("quota_exceeded", { retryAfterS: 5, retryable: true, message: `The workspace holds ${cap} open event streams on this node, its limit; close one first.` });
  }
}

/** Event streams open on this gateway, all workspaces (for /metrics). */
export function openStreamCount(ctx: GatewayContext): number {
  let open = 0;
  for (const n of workspaceStreams.get(ctx)?.values() ?? []) open += n;
  return open;
}

/** Takes one of the workspace's event stream slots on this node: 429 quota_exceeded when none is free. */
export function reserveStream(ctx: GatewayContext, workspaceId: string, plan: Plan): StreamSlot {
  checkStreamQuota(ctx, workspaceId, plan);
  countStream(ctx, workspaceId, 1);
  let freed = false;
  return () => {
    if (freed) return;
    freed = true;
    countStream(ctx, workspaceId, -1);
  };
}

function countStream(ctx: GatewayContext, workspaceId: string, delta: 1 | -1): void {
  let counts = workspaceStreams.get(ctx);
  if (!counts) workspaceStreams.set(ctx, (counts = new Map()));
  const next = (counts.get(workspaceId) ?? 0) + delta;
  if (next <= 0) counts.delete(workspaceId);
  else counts.set(workspaceId, next);
}

/**
 * Ends every open event stream of this gateway (without an error frame: clients reconnect with
 * Last-Event-ID). Called from the event routes' `preClose` hook; Fastify's close would otherwise
 * wait for live streams to end by themselves.
 */
export function closeEventStreams(ctx: GatewayContext): void {
  for (const controller of openStreams.get(ctx) ?? []) controller.abort(new Error("server closing"));
}

/**
 * Answers `request` with a Server-Sent Events stream of the run's events (decisions §5):
 * each event is `id: <event id>`, `event: <type>`, `data: <event JSON>` and a blank line;
 * a `: ping` comment is sent every {@link StreamEventsOptions.pingIntervalMs}.
 *
 * Before anything is written, the cursor and the event store are checked with a one-event
 * `read` (without the turn filter, so it costs at most two messages): an error there —
 * 400 invalid_cursor, 410 event_cursor_expired, 503 event_history_unavailable — is thrown,
 * and the caller's error handler answers it as ordinary JSON. After that the reply is
 * hijacked, and an error is sent as `event: error` with the error body, then the stream
 * closes. (A cursor that expires in the instant between the check and the subscription is
 * reported that way too.)
 *
 * Resolves when the stream is over: the client left (its JetStream consumer is deleted at
 * once), the turn named by `endWithTurnId` became final, an error was sent, or the server
 * is closing. Writes respect backpressure: a slow client pauses the subscription instead of
 * buffering without bound.
 *
 * For POST /api/v1/runs with `stream: true`, call it after admission with
 * `{ turnId, endWithTurnId: turnId }` and no cursor: the client receives the admitted turn's
 * events from its first one (history included, so nothing recorded before the stream opened
 * is missed) up to and including its final platform event, whose `data.run` is the final Run.
 */
export async function streamEvents(
  ctx: GatewayContext,
  request: FastifyRequest,
  reply: FastifyReply,
  run: RunDoc,
  options: StreamEventsOptions = {},
): Promise<void> {
  const slot = options.slot ?? reserveStream(ctx, run.workspace_id, run.plan);
  // The turn's final notice is listened for before the stream reads the turn's status: a turn
  // that ends in between is still known final (its final event, should it not come, ends the
  // stream after the grace period instead of never).
  let finalNotice: Subscription | undefined;
  try {
    if (options.endWithTurnId !== undefined && !options.endTurnFinal) {
      try {
        finalNotice = ctx.nc.subscribe(Subjects.turnFinal(options.endWithTurnId), { max: 1 });
      } catch {
        // The connection is closed: the node is shutting down.
        throw new ApiError("event_history_unavailable", { retryAfterS: 1 });
      }
    }
    await serveStream(ctx, request, reply, run, options, finalNotice);
  } finally {
    finalNotice?.unsubscribe();
    slot();
  }
}

async function serveStream(
  ctx: GatewayContext,
  request: FastifyRequest,
  reply: FastifyReply,
  run: RunDoc,
  options: StreamEventsOptions,
  finalNotice: Subscription | undefined,
): Promise<void> {
  const eventRun = eventRunOf(run);
  const endTurnId = options.endWithTurnId;
  const finalGraceMs = options.finalEventGraceMs ?? FINAL_EVENT_GRACE_MS;

  // Everything that can fail as JSON fails here, before the first byte.
  let endTurnAlreadyFinal = endTurnId !== undefined && options.endTurnFinal === true;
  // Where the turn's events begin in the run: a long run's earlier events are not read.
  let turnFirstSequence = options.turnFirstSequence;
  try {
    await ctx.events.read(eventRun, { afterId: options.afterId, limit: 1, nowMs: ctx.clock.nowMs() });
    if (endTurnId !== undefined && !endTurnAlreadyFinal) {
      const turn = await ctx.store.getTurn(endTurnId);
      endTurnAlreadyFinal = turn !== null && isFinalStatus(turn.status);
      if (endTurnId === options.turnId) turnFirstSequence ??= turn?.first_event_seq;
    }
  } catch (err) {
    throw renameCursorParam(err, options.cursorParam);
  }
  // A final turn with nothing of it after the cursor: the client has it all, and the stream
  // ends at once. The actor writes the turn final first, then stores its final event, then
  // moves the run on (active_turn_id); only after that last write is "nothing after the
  // cursor" really the end — before it, the final event is still to come and is waited for.
  let nothingLeft = false;
  if (endTurnId !== undefined && endTurnAlreadyFinal) {
    try {
      const rest = await ctx.events.read(eventRun, { afterId: options.afterId, turnId: endTurnId, turnFirstSequence: endTurnId === options.turnId ? turnFirstSequence : undefined, limit: 1, nowMs: ctx.clock.nowMs() });
      if (rest.events.length === 0) {
        const fresh = await ctx.store.getRun(run._id);
        nothingLeft = !fresh || (fresh.active_turn_id !== endTurnId && fresh.queued_turn_id !== endTurnId);
      }
    } catch (err) {
      throw renameCursorParam(err, options.cursorParam);
    }
  }

  if (nothingLeft) {
    // 204 ends an EventSource for good (HTML: "fail the connection"); an empty 200 would make
    // it reconnect every few seconds forever, each time counting against the rate limit.
    await reply.code(204).send();
    return;
  }

  reply.hijack();
  const res = reply.raw;
  const headers: OutgoingHttpHeaders = {};
  // Headers hooks set on the reply (request id, rate limits) still go out.
  for (const [name, value] of Object.entries(reply.getHeaders())) if (value !== undefined) headers[name] = value;
  res.writeHead(200, {
    ...headers,
    "content-type": "text/event-stream; charset=utf-8",
    // What a stream carries (tool output, a run's data) is kept by no cache.
    "cache-control": "no-store",
    "x-accel-buffering": "no",
    connection: "keep-alive",
  });
  res.flushHeaders();

  const controller = new AbortController();
  const { signal } = controller;
  let streams = openStreams.get(ctx);
  if (!streams) openStreams.set(ctx, (streams = new Set()));
  streams.add(controller);
  // The response's close covers a client that leaves at any time (IncomingMessage's own
  // `close` fires once the request is read, which for a GET is right away).
  const onClose = () => controller.abort(new Error("client disconnected"));
  res.on("close", onClose);
  // A client that left during the reads before (its close already fired) is not waited for.
  // (Not the request's own stream: a request whose body was read is destroyed by then.)
  if (res.destroyed || res.socket?.destroyed === true) onClose();

  // Frames are gathered and written once per event-loop turn (or per 64 KiB): the
  // consumer hands over a batch of messages at a time, and one socket write per event
  // cost more than encoding it.
  const frames = new FrameBuffer();
  let flushQueued = false;
  const flush = () => {
    flushQueued = false;
    const chunk = frames.take();
    if (chunk && !res.writableEnded && !res.destroyed) res.write(chunk);
  };
  const sent = () => {
    if (frames.size >= FLUSH_BYTES) flush();
    else if (!flushQueued) {
      flushQueued = true;
      setImmediate(flush);
    }
  };

  // The stream lasts only while its reader may read: its key revoked (any node's revocation
  // is heard at once) or past a rotation's grace, or the run deleted or expired, ends it with
  // that error. Checked at each invalidation, the key every few seconds, the run at each ping;
  // a check that cannot be made (the store away) leaves the stream as it is.
  let noLongerReadable: ApiError | undefined;
  // One check at a time; one asked for meanwhile runs after it (a revocation is never dropped).
  let checking: Promise<void> | undefined;
  let next: { run: boolean } | undefined;
  const check = async (what: { run: boolean }) => {
    try {
      await ctx.auth.authenticate(request);
      if (what.run) await runStillReadable(ctx, run);
    } catch (err) {
      if (!signal.aborted && err instanceof ApiError && (err.status === 401 || err.status === 404 || err.status === 410)) {
        noLongerReadable = err;
        controller.abort(new Error("no longer readable"));
      }
    }
  };
  const recheck = (what: { run: boolean }): void => {
    if (signal.aborted) return;
    if (checking) {
      next = { run: what.run || next?.run === true };
      return;
    }
    checking = check(what).finally(() => {
      checking = undefined;
      const queued = next;
      next = undefined;
      if (queued) recheck(queued);
    });
  };
  const keyId = request.auth?.keyId;
  const stopListening = ctx.auth.onInvalidated((changed) => {
    if (changed === undefined || keyId === undefined || changed === keyId) recheck({ run: false });
  });
  const keyCheck = ctx.clock.every(KEY_CHECK_INTERVAL_MS, () => recheck({ run: false }));
  const ping = ctx.clock.every(options.pingIntervalMs ?? SSE_PING_INTERVAL_MS, () => {
    // A client that is not reading does not need pings piling up in its buffer.
    if (!res.writableNeedDrain && !res.writableEnded) {
      flush();
      res.write(": ping\n\n");
    }
    recheck({ run: true });
  });

  // When the stream ends with a turn: its final event normally ends it; the grace timer ends
  // it if that event never comes (lost or expired) once the turn is known to be final. One
  // timer checks the time of the last progress (re-arming a timer per event is costly).
  let finalKnown = endTurnAlreadyFinal;
  let graceTimer: Timer | undefined;
  let graceExpired = false;
  let lastProgressMs = 0;
  const checkGrace = () => {
    graceTimer = undefined;
    if (signal.aborted) return;
    const idleMs = ctx.clock.nowMs() - lastProgressMs;
    if (idleMs < finalGraceMs) {
      graceTimer = ctx.clock.after(finalGraceMs - idleMs, checkGrace);
      return;
    }
    graceExpired = true;
    controller.abort(new Error("final event missing"));
  };
  const armGrace = () => {
    if (!finalKnown || signal.aborted) return;
    lastProgressMs = ctx.clock.nowMs();
    graceTimer ??= ctx.clock.after(finalGraceMs, checkGrace);
  };
  if (finalNotice && !finalKnown) {
    void (async () => {
      for await (const _ of finalNotice) {
        finalKnown = true;
        armGrace();
      }
    })().catch(() => undefined);
  }
  armGrace();

  let ended = false;
  let lastId = options.afterId;
  /**
   * The subscription stalled while the turn ended (its consumer's NATS server died: the
   * read notices only after two missed heartbeats, 10–15 s): what it did not deliver is
   * read from the log directly, up to the turn's final event. True when that came (or
   * the server closed meanwhile).
   */
  const catchUp = async (): Promise<boolean> => {
    // The stream's own signal is spent by now: this one lets a closing server end the wait
    // for a slow client, which pauses the catch-up as it pauses the subscription.
    const paused = new AbortController();
    streams.add(paused);
    try {
      for (let page = 0; page < 20 && !res.destroyed; page++) {
        const read = await ctx.events.read(eventRun, { afterId: lastId, turnId: options.turnId, turnFirstSequence, limit: 500, nowMs: ctx.clock.nowMs() });
        for (const event of read.events) {
          frames.text(frameOf(event.id, event.type, JSON.stringify(event)));
          sent();
          lastId = event.id;
          if (endTurnId !== undefined && isFinalEventOf(event, endTurnId)) return true;
          if (res.writableNeedDrain) await drained(res, paused.signal);
          // The server closes: the stream ends as every open one does then, without an error frame.
          if (paused.signal.aborted) return true;
        }
        // Nothing new (more is held back for an event still to come): not worth asking again now.
        if (!read.hasMore || read.events.length === 0) return false;
      }
      return false;
    } finally {
      streams.delete(paused);
    }
  };
  try {
    await ctx.events.subscribe(
      eventRun,
      { afterId: options.afterId, turnId: options.turnId, turnFirstSequence },
      (event) => {
        if (signal.aborted) return;
        frames.event(event);
        sent();
        lastId = event.id;
        armGrace();
        if (endTurnId !== undefined && isFinalEventOf(event, endTurnId)) {
          ended = true;
          controller.abort(new Error("turn final"));
        }
        // A slow client pauses the subscription instead of buffering without bound.
        if (res.writableNeedDrain) return drained(res, signal);
      },
      signal,
    );
    if (graceExpired && !ended && !res.destroyed) ended = await catchUp();
    flush();
    if (noLongerReadable) writeError(res, noLongerReadable);
    else if (graceExpired && !ended) {
      writeError(res, new ApiError("event_history_unavailable", { message: "The turn is final but its final event could not be read. Read the run for its result." }));
    }
  } catch (err) {
    flush();
    writeError(res, toStreamError(ctx, err, request));
  } finally {
    flush();
    ping.cancel();
    keyCheck.cancel();
    stopListening();
    graceTimer?.cancel();
    res.off("close", onClose);
    streams.delete(controller);
    if (!res.writableEnded) res.end();
  }
}

/** True for the platform event that makes `turnId` final. */
export function isFinalEventOf(event: Pick<StreamedEvent, "source" | "turn_id" | "type">, turnId: string): boolean {
  return event.source === EventSource.platform && event.turn_id === turnId && FINAL_TURN_EVENT_TYPES.has(event.type);
}

/** One SSE frame of an event and its JSON (pages read on a catch-up; streamed events go through {@link FrameBuffer}). JSON never contains a raw line break, so `data` is one line. */
function frameOf(id: string, type: string, json: string): string {
  return `id: ${id}\nevent: ${oneLine(type)}\ndata: ${json}\n\n`;
}

function writeError(res: ServerResponse, error: ApiError): void {
  if (res.destroyed || res.writableEnded) return;
  // No `id:` line: Last-Event-ID stays on the last real event.
  res.write(`event: error\ndata: ${JSON.stringify(error.toBody())}\n\n`);
}

function toStreamError(ctx: GatewayContext, err: unknown, request: FastifyRequest): ApiError {
  if (err instanceof ApiError) return err;
  const reference = ctx.ids.reference();
  ctx.log.error({ err, reference, reqId: request.id, url: request.url }, "event stream failed");
  return new ApiError("internal_error", { reference });
}

/** The event log names its cursor `after`; a cursor sent as Last-Event-ID is named so. */
function renameCursorParam(err: unknown, param: string | undefined): unknown {
  if (!(err instanceof ApiError) || param === undefined || err.param !== "after") return err;
  return new ApiError(err.code, { message: err.message, param, retryAfterS: err.retryAfterS, reference: err.reference });
}
