import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { authOf, type GatewayContext } from "../context.js";
import { loadRun } from "../loaders.js";
import { type Operation, route, runId, RUN_READS } from "../operation.js";
import { RunTagsSchema, TagsRequestSchema } from "../schemas.js";

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const TAG_OPERATIONS = {
  updateRunTags: {
    method: "post",
    path: "/api/v1/runs/{runId}/tags",
    operationId: "updateRunTags",
    summary: "Add and remove tags",
    description: "Set semantics; no Idempotency-Key. Does not extend retention.",
    tag: "runs",
    scope: "run:write",
    params: z.object(runId),
    body: { schema: TagsRequestSchema, required: true },
    success: { 200: { description: "The run's full tag list.", json: RunTagsSchema } },
    errors: RUN_READS,
  },
} satisfies Record<string, Operation>;

/**
 * `POST /api/v1/runs/{runId}/tags`: set semantics, no Idempotency-Key. The run's
 * owning actor applies the edit, so concurrent editors never erase each other's tags.
 */
export function tagRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    route(app, TAG_OPERATIONS.updateRunTags, async (request) => {
      const auth = authOf(request);
      // A list may hold more than 20 tags here: the limit applies to the run's resulting list.
      const add = [...new Set(request.body.add ?? [])].sort();
      const remove = [...new Set(request.body.remove ?? [])].sort();
      const run = await loadRun(ctx, auth.workspace._id, request.params.runId);
      const result = await ctx.router.send({ op: "tags", workspace_id: auth.workspace._id, run_id: run._id, add, remove });
      return { object: "run_tags" as const, run_id: run._id, tags: result.tags ?? [] };
    });
  };
}
