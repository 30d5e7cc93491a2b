import type { FastifyInstance } from "fastify";
import { ApiError, decodeCursor, encodeCursor, list, parseLimit, renderTurn } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { loadRun } from "../loaders.js";

/** A turns cursor's position: a turn index, or the cursor is not one this list issued. */
function turnIndexOf(k: string): number {
  if (!/^[0-9]{1,9}$/.test(k)) throw new ApiError("invalid_cursor", { param: "after", message: "The cursor is not valid." });
  return Number(k);
}

/** Turn history: read from the turn documents, never from events. */
export function turnRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    app.get<{ Params: { runId: string }; Querystring: { limit?: string; after?: string } }>(
      "/api/v1/runs/:runId/turns",
      { config: { scope: "run:read" } },
      async (request) => {
        const auth = authOf(request);
        const run = await loadRun(ctx, auth.workspace._id, request.params.runId);
        const limit = parseLimit(request.query.limit, 20, 100);
        const afterIndex = request.query.after === undefined ? undefined : turnIndexOf(decodeCursor(request.query.after, "turns", run._id).k);
        const turns = await ctx.store.listTurns(run._id, { afterIndex, limit: limit + 1 });
        const page = turns.slice(0, limit);
        const last = page[page.length - 1];
        const next = last ? encodeCursor({ s: "turns", o: run._id, k: String(last.index), id: last._id }) : null;
        return list(page.map(renderTurn), turns.length > limit, next);
      },
    );

    app.get<{ Params: { runId: string; turnId: string } }>(
      "/api/v1/runs/:runId/turns/:turnId",
      { config: { scope: "run:read" } },
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
