/** Reading a route's run and turn, with the contract's 404 and 410 answers. */
import { ApiError, type RunDoc, runExpired, type TurnDoc } from "../src/index.js";
import type { GatewayContext } from "./context.js";

/** The run of the workspace; 404 naming `param` (the path's `runId`, the body's `run_id`, or none: a start's own run). */
export async function loadRun(ctx: Pick<GatewayContext, "store" | "clock" | "config">, workspaceId: string, runId: string, param: string | null = "runId"): Promise<RunDoc> {
  const run = await ctx.store.getRun(runId);
  if (run && run.workspace_id === workspaceId) {
    // Past retention the run is gone even before the sweeper deleted it.
    if (runExpired(run, ctx.clock.nowMs(), ctx.config.turnLimitMs)) throw new ApiError("run_expired");
    return run;
  }
  const tombstone = await ctx.store.getTombstone(runId);
  if (tombstone && tombstone.workspace_id === workspaceId && tombstone.reason === "expired") {
    throw new ApiError("run_expired");
  }
  throw new ApiError("run_not_found", { param });
}

/** A turn of `run`, from the final-turn cache when it is final; 404 naming `turn_id`. */
export async function loadTurn(ctx: GatewayContext, run: RunDoc, turnId: string): Promise<TurnDoc> {
  const turn = await ctx.finalTurns.get(turnId, () => ctx.store.getTurn(turnId));
  if (!turn || turn.run_id !== run._id) throw new ApiError("turn_not_found", { param: "turn_id" });
  return turn;
}
