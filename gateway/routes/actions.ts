import { randomUUID } from "node:crypto";
import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { ApiError, renderAction } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { idempotencyKeyOf } from "../idempotency.js";
import { loadRun, loadTurn } from "../loaders.js";
import { type Operation, route, runId } from "../operation.js";
import { ActionDecisionSchema, ActionSchema } from "../schemas.js";

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const ACTION_OPERATIONS = {
  decideAction: {
    method: "post",
    path: "/api/v1/runs/{runId}/actions/{actionId}",
    operationId: "decideAction",
    summary: "Approve or deny a tool call that waits for a person",
    description:
      "The turn's pending_action names the call. approve: the call runs in the sandbox and the agent goes on. deny: the model gets the tool's error result with the reason. The same Idempotency-Key answers as the first time; a decision on an action decided before (by a person or by its timeout) is 409 action_already_decided.",
    tag: "runs",
    scope: "run:write",
    idempotencyKey: true,
    params: z.object({ ...runId, actionId: z.string().describe("Action id (`act_…`).") }),
    body: { schema: ActionDecisionSchema, required: true },
    success: { 200: { description: "The action with its decision.", json: ActionSchema } },
    errors: { 400: ["invalid_request"], 404: ["run_not_found", "action_not_found"], 409: ["action_already_decided", "idempotency_conflict"], 410: ["run_expired"] },
  },
} satisfies Record<string, Operation>;

/** The identity of a decision's answer, kept with its Idempotency-Key. */
interface DecisionAnswer extends Record<string, unknown> {
  run_id: string;
  action_id: string;
  /** Names the decision: a command resent under the same key is answered as the first. */
  decision_id: string;
  turn_id?: string;
  /** The Action object; never stored with the key (read again from the turn). */
  view?: Record<string, unknown>;
}

/**
 * `POST /api/v1/runs/{runId}/actions/{actionId}`: the run's owning actor applies the
 * decision (one writer), answers, then the turn goes on.
 */
export function actionRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    route(app, ACTION_OPERATIONS.decideAction, async (request) => {
      const auth = authOf(request);
      const key = idempotencyKeyOf(request)!;
      const workspaceId = auth.workspace._id;
      const { actionId } = request.params;
      const decision = request.body.decision;
      const reason = request.body.reason ?? null;
      const run = await loadRun(ctx, workspaceId, request.params.runId);
      const { result } = await ctx.idempotency.once<DecisionAnswer>(
        { workspaceId, operation: "runs.decide", key, fingerprint: { run_id: run._id, action_id: actionId, decision, reason }, fresh: () => ({ run_id: run._id, action_id: actionId, decision_id: randomUUID() }) },
        async (identity) => {
          const reply = await ctx.router.send({ op: "decide", workspace_id: workspaceId, run_id: run._id, action_id: actionId, decision, reason, decision_id: identity.decision_id });
          return { ...identity, turn_id: reply.turn_id, view: reply.action };
        },
        { record: ({ view: _view, ...identity }) => identity },
      );
      if (result.view) return result.view as z.output<typeof ActionSchema>;
      // The same key again: the decision as the turn keeps it.
      const turn = await loadTurn(ctx, run, result.turn_id!);
      const action = turn.actions?.find((a) => a.id === actionId);
      if (!action) throw new ApiError("action_not_found", { param: "actionId" });
      return renderAction(action, run._id, turn._id) as z.output<typeof ActionSchema>;
    });
  };
}
