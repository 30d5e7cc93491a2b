import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { ApiError, eventRunOf, isFinalStatus, queryFlag, queryId, queryLimit } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { closeEventStreams, streamEvents } from "../sse.js";
import { loadRun, loadTurn } from "../loaders.js";
import { type Operation, route, runId } from "../operation.js";
import { EventListSchema } from "../schemas.js";

/** decisions §5: `limit` of the event list. */
export const EVENTS_LIMIT_DEFAULT = 100;
export const EVENTS_LIMIT_MAX = 1000;

export interface EventRoutesOptions {
  /** Interval of SSE `: ping` comments (default 15 s). */
  pingIntervalMs?: number;
}

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const EVENT_OPERATIONS = {
  listRunEvents: {
    method: "get",
    path: "/api/v1/runs/{runId}/events",
    operationId: "listRunEvents",
    summary: "Retained events, as a page or a Server-Sent Events stream",
    description:
      "stream=true answers text/event-stream: `id: <event id>`, `event: <type>`, `data: <Event JSON>`, a blank line; `: ping` every 15 s; an error after the stream began is `event: error` with the Error body (a MessageEvent whose data is that JSON; EventSource's own connection error is a plain Event without data). With turn_id the stream ends after the turn's final platform event. Resume with Last-Event-ID (wins over after).",
    tag: "events",
    scope: "run:read",
    params: z.object(runId),
    query: z.object({
      turn_id: queryId().optional().describe("Only this turn's events."),
      after: queryId().optional().describe("Event cursor (an event id); an event no longer retained: 410 event_cursor_expired; another run's: 400 invalid_cursor."),
      limit: queryLimit(EVENTS_LIMIT_MAX, EVENTS_LIMIT_DEFAULT),
      stream: queryFlag().describe("true: a Server-Sent Events stream."),
    }),
    headers: [{ name: "Last-Event-ID", in: "header", description: "Stream resume cursor (an event id).", schema: { type: "string" } }],
    success: {
      200: { description: "A page of events with history, or with stream=true the event stream.", json: EventListSchema, sse: true },
      204: { description: "stream=true with turn_id, resumed after that turn's final event: nothing more will come. An EventSource stops reconnecting on 204." },
    },
    errors: {
      400: ["invalid_request", "invalid_cursor"],
      404: ["run_not_found", "turn_not_found"],
      410: ["run_expired", "event_cursor_expired"],
      429: ["quota_exceeded"],
      503: ["event_boundary_pending", "event_history_unavailable"],
    },
  },
} satisfies Record<string, Operation>;

/**
 * GET /api/v1/runs/{runId}/events (scope run:read): the run's retained events as a list
 * envelope with `history`, or with `stream=true` a Server-Sent Events stream (decisions §5).
 *
 * Streaming: the resume cursor is the `Last-Event-ID` header, else `after`; when both are
 * sent the header wins, because a reconnecting EventSource repeats the original URL (and its
 * stale `after`) but sends the last event it received in the header. Without `turn_id` the
 * stream follows the run until the client leaves. With `turn_id` it carries that turn's
 * events and ends after the platform event that makes the turn final — the same end as the
 * POST /api/v1/runs stream it resumes (decisions §5: "a turn's stream ends after the platform
 * event that makes the turn final"); resuming a turn that already ended after its last event
 * is answered 204 No Content, on which an EventSource stops instead of reconnecting forever.
 */
export function eventRoutes(ctx: GatewayContext, options: EventRoutesOptions = {}) {
  return async function (app: FastifyInstance) {
    app.addHook("preClose", async () => closeEventStreams(ctx));

    route(app, EVENT_OPERATIONS.listRunEvents,
      async (request, reply) => {
        const auth = authOf(request);
        const { stream, turn_id: turnId, after, limit } = request.query;
        const run = await loadRun(ctx, auth.workspace._id, request.params.runId);
        const turn = turnId === undefined ? undefined : await loadTurn(ctx, run, turnId);

        if (stream) {
          const lastEventId = lastEventIdOf(request.headers["last-event-id"]);
          await streamEvents(ctx, request, reply, run, {
            afterId: lastEventId ?? after,
            cursorParam: lastEventId !== undefined ? "Last-Event-ID" : "after",
            turnId,
            endWithTurnId: turnId,
            endTurnFinal: turn !== undefined && isFinalStatus(turn.status),
            turnFirstSequence: turn?.first_event_seq,
            pingIntervalMs: options.pingIntervalMs,
          });
          return reply;
        }

        const page = await ctx.events.read(eventRunOf(run), { afterId: after, turnId, turnFirstSequence: turn?.first_event_seq, limit, nowMs: ctx.clock.nowMs() });
        // Rule 9. The turn was loaded before the read: a turn that was not final then and has
        // no event in the read has not recorded its first event yet (it would be recorded
        // before the turn became final), which the spec never reports as empty or expired.
        if (turn && after === undefined && page.events.length === 0 && !isFinalStatus(turn.status)) {
          throw new ApiError("event_boundary_pending", { param: "turn_id", retryAfterS: 1 });
        }
        // Every event after this point waits behind one not stored yet (a publish still in
        // flight, held up to the order horizon): nothing can be given in order, and a page
        // with has_more but no cursor would leave the client nowhere to go on from.
        if (page.events.length === 0 && page.hasMore) {
          throw new ApiError("event_history_unavailable", { retryAfterS: 1, message: "The next event is not stored yet. Retry shortly." });
        }
        const last = page.events.at(-1);
        return {
          object: "list" as const,
          data: page.events,
          has_more: page.hasMore,
          next_cursor: page.hasMore && last ? last.id : null,
          history: page.history,
        };
      },
    );
  };
}

/** An empty header counts as absent (EventSource sends none before its first event). */
function lastEventIdOf(raw: string | string[] | undefined): string | undefined {
  const value = Array.isArray(raw) ? raw[0] : raw;
  return value === undefined || value === "" ? undefined : value;
}
