import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { ApiError, invalid, MAX_USAGE_RANGE_MS, monthStart, queryInt, renderBudget, USAGE_GROUPS } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { type Operation, route } from "../operation.js";
import { BudgetDeletedSchema, BudgetRequestSchema, BudgetSchema, UsageSummarySchema } from "../schemas.js";

const seconds = (what: string) => queryInt(0, 999_999_999_999, "must be a Unix timestamp in seconds.").optional().describe(what);

export const UsageQuerySchema = z.object({
  from: seconds("Start, inclusive (Unix seconds). Default: the start of the current UTC month."),
  to: seconds("End, exclusive (Unix seconds). Default: now. At most 366 days after from."),
  group_by: z.enum(USAGE_GROUPS, { error: `must be one of ${USAGE_GROUPS.join(", ")}.` }).default("day").describe("Buckets by UTC day, agent, agent version or model. Default day."),
});

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const USAGE_OPERATIONS = {
  getUsage: {
    method: "get",
    path: "/api/v1/usage",
    operationId: "getUsage",
    summary: "Usage and cost of the workspace",
    description:
      "Totals of the workspace's final turns in [from, to), bucketed, and its budget's state. Read from a ledger written as each turn becomes final: runs deleted or expired since still count. Records are kept for the service's RUNS_USAGE_RETENTION_DAYS (400 days by default), so a range further back counts only what is left.",
    tag: "usage",
    scope: "run:read",
    query: UsageQuerySchema,
    success: { 200: { description: "Totals and buckets.", json: UsageSummarySchema } },
    errors: { 400: ["invalid_request"] },
  },
  getBudget: {
    method: "get",
    path: "/api/v1/usage/budget",
    operationId: "getBudget",
    summary: "The workspace's monthly budget",
    tag: "usage",
    scope: "run:read",
    success: { 200: { description: "The budget and this month's spend.", json: BudgetSchema } },
    errors: { 404: ["not_found"] },
  },
  putBudget: {
    method: "put",
    path: "/api/v1/usage/budget",
    operationId: "putBudget",
    summary: "Set the workspace's monthly budget",
    description: "Once a limit is spent, new turns (start or continue) are refused with 429 quota_exceeded until the next UTC month or a higher budget; a turn in progress finishes.",
    tag: "usage",
    scope: "api_keys:manage",
    body: { schema: BudgetRequestSchema, required: true },
    success: { 200: { description: "The budget and this month's spend.", json: BudgetSchema } },
    errors: { 400: ["invalid_request"] },
  },
  deleteBudget: {
    method: "delete",
    path: "/api/v1/usage/budget",
    operationId: "deleteBudget",
    summary: "Remove the workspace's monthly budget",
    tag: "usage",
    scope: "api_keys:manage",
    success: { 200: { description: "Removed (also when there was none).", json: BudgetDeletedSchema } },
  },
} satisfies Record<string, Operation>;

/** Usage summaries (scope run:read) and the workspace's budget (set by api_keys:manage holders). */
export function usageRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    route(app, USAGE_OPERATIONS.getUsage, async (request) => {
      const auth = authOf(request);
      const nowMs = ctx.clock.nowMs();
      const fromS = request.query.from ?? Math.floor(monthStart(nowMs) / 1000);
      const toS = request.query.to ?? Math.floor(nowMs / 1000) + 1;
      if (fromS >= toS) throw invalid(request.query.from === undefined ? "to" : "from", "from must be before to.");
      if ((toS - fromS) * 1000 > MAX_USAGE_RANGE_MS) throw invalid("from", "A summary covers at most 366 days; narrow from and to.");
      const [tally, budget] = await Promise.all([
        ctx.usage.summary(auth.workspace._id, fromS * 1000, toS * 1000, request.query.group_by),
        ctx.usage.budgetState(auth.workspace._id),
      ]);
      return {
        object: "usage" as const,
        from: fromS,
        to: toS,
        group_by: request.query.group_by,
        total: tally.total,
        data: tally.data,
        budget: budget ? renderBudget(budget) : null,
      };
    });

    route(app, USAGE_OPERATIONS.getBudget, async (request) => {
      const state = await ctx.usage.budgetState(authOf(request).workspace._id);
      if (!state) throw new ApiError("not_found", { message: "The workspace has no budget; set one with PUT /api/v1/usage/budget." });
      return renderBudget(state);
    });

    route(app, USAGE_OPERATIONS.putBudget, async (request) => {
      const auth = authOf(request);
      const state = await ctx.usage.setBudget(auth.workspace._id, {
        monthly_cost_usd: request.body.monthly_cost_usd ?? null,
        monthly_tokens: request.body.monthly_tokens ?? null,
      });
      ctx.log.info({ workspace_id: auth.workspace._id, monthly_cost_usd: request.body.monthly_cost_usd ?? null, monthly_tokens: request.body.monthly_tokens ?? null }, "workspace budget set");
      return renderBudget(state!);
    });

    route(app, USAGE_OPERATIONS.deleteBudget, async (request) => {
      const auth = authOf(request);
      await ctx.usage.setBudget(auth.workspace._id, { monthly_cost_usd: null, monthly_tokens: null });
      ctx.log.info({ workspace_id: auth.workspace._id }, "workspace budget removed");
      return { object: "usage.budget.deleted" as const, deleted: true as const };
    });
  };
}
