import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { ApiError, decodeCursor, encodeCursor, list, renderTurn } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { loadRun } from "../loaders.js";
import { type Operation, page, route, runId, turnId, RUN_READS } from "../operation.js";
import { TurnListSchema, TurnSchema } from "../schemas.js";

/** A turns cursor's position: a turn index, or the cursor is not one this list issued. */
function turnIndexOf(k: string): number {
  if (!/^[0-9]{1,9}$/.test(k)) throw new ApiError("invalid_cursor", { param: "after", message: "The cursor is not valid." });
  return Number(k);
}

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const TURN_OPERATIONS = {
  listTurns: {
    method: "get",
    path: "/api/v1/runs/{runId}/turns",
    operationId: "listTurns",
    summary: "Turn history",
    tag: "runs",
    scope: "run:read",
    params: z.object(runId),
    query: z.object(page(100, 20)),
    success: { 200: { description: "Turns, oldest first, queued and running ones included.", json: TurnListSchema } },
    errors: { 400: ["invalid_request", "invalid_cursor"], ...RUN_READS },
  },
  getTurn: {
    method: "get",
    path: "/api/v1/runs/{runId}/turns/{turnId}",
    operationId: "getTurn",
    summary: "One turn",
    tag: "runs",
    scope: "run:read",
    params: z.object({ ...runId, ...turnId }),
    success: { 200: { description: "The turn.", json: TurnSchema } },
    errors: { 404: ["run_not_found", "turn_not_found"], 410: ["run_expired"] },
  },
} satisfies Record<string, Operation>;

/** Turn history: read from the turn documents, never from events. */
export function turnRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    route(app, TURN_OPERATIONS.listTurns,
      async (request) => {
        const auth = authOf(request);
        const run = await loadRun(ctx, auth.workspace._id, request.params.runId);
        const limit = request.query.limit;
        const afterIndex = request.query.after === undefined ? undefined : turnIndexOf(decodeCursor(request.query.after, "turns", run._id).k);
        const turns = await ctx.store.listTurns(run._id, { afterIndex, limit: limit + 1 });
        const page = turns.slice(0, limit);
        const last = page[page.length - 1];
        const next = last ? encodeCursor({ s: "turns", o: run._id, k: String(last.index), id: last._id }) : null;
        return list(page.map(renderTurn), turns.length > limit, next);
      },
    );

    route(app, TURN_OPERATIONS.getTurn,
      async (request) => {
        const auth = authOf(request);
        const run = await loadRun(ctx, auth.workspace._id, request.params.runId);
        const turnId = request.params.turnId;
        const turn = await ctx.finalTurns.get(turnId, () => ctx.store.getTurn(turnId));
        if (!turn || turn.run_id !== run._id) throw new ApiError("turn_not_found", { param: "turnId" });
        return renderTurn(turn);
      },
    );
  };
}
