import type { FastifyInstance } from "fastify";
import { invalid, parseTags } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { loadRun } from "../loaders.js";
import { type Operation, route, runId, RUN_READS } from "../operation.js";

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
    parameters: [runId],
    body: { schema: "TagsRequest", required: true },
    success: { 200: { description: "The run's full tag list.", json: "RunTags" } },
    errors: RUN_READS,
  },
} satisfies Record<string, Operation>;

/**
 * `POST /api/v1/runs/{runId}/tags`: set semantics, no Idempotency-Key. The run's
 * owning actor applies the edit, so concurrent editors never erase each other's tags.
 */
export function tagRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    route<{ Params: { runId: string } }>(app, TAG_OPERATIONS.updateRunTags, async (request) => {
      const auth = authOf(request);
      const body = request.body;
      if (typeof body !== "object" || body === null || Array.isArray(body)) throw invalid(null, "The body must be a JSON object with add and/or remove.");
      const fields = body as Record<string, unknown>;
      for (const field of Object.keys(fields)) if (field !== "add" && field !== "remove") throw invalid(field, `Unknown field ${field}.`);
      if (fields.add === undefined && fields.remove === undefined) throw invalid("add", "Give add, remove, or both.");
      // A tag list may hold more than 20 entries here: the limit applies to the result.
      const add = fields.add === undefined ? [] : parseTagList(fields.add, "add");
      const remove = fields.remove === undefined ? [] : parseTagList(fields.remove, "remove");
      const both = add.find((tag) => remove.includes(tag));
      if (both !== undefined) throw invalid("tags", `The tag ${JSON.stringify(both)} is in both add and remove.`);
      const run = await loadRun(ctx, auth.workspace._id, request.params.runId);
      const result = await ctx.router.send({ op: "tags", workspace_id: auth.workspace._id, run_id: run._id, add, remove });
      return { object: "run_tags", run_id: run._id, tags: result.tags ?? [] };
    });
  };
}

function parseTagList(value: unknown, param: string): string[] {
  if (!Array.isArray(value)) throw invalid(param, `${param} must be an array of tags.`);
  // Validates each tag; the count limit applies to the run's resulting list instead.
  return parseTags(value.slice(0, 1000), param, Number.POSITIVE_INFINITY);
}
