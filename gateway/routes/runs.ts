import type { FastifyInstance, FastifyReply } from "fastify";
import type { Subscription } from "@nats-io/transport-node";
import { ApiError, startVersionOf, decodeCursor, type Disposition, encodeCursor, Ids, invalid, isFinalStatus, list, listRuns, parseLimit, parseRunListQuery, parseRunRequest, renderRun, renderRunSummary, type RunCommand, type RunDoc, type RunRequest, runRequestFingerprint, Subjects, TurnStatus } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { idempotencyKeyOf } from "../idempotency.js";
import { loadRun, loadTurn } from "../loaders.js";
import { checkStreamQuota, streamEvents } from "../sse.js";

/** The identity of a POST /runs answer, kept in its idempotency record. */
interface RunAnswer extends Record<string, unknown> {
  run_id: string;
  turn_id: string;
  disposition?: Disposition;
  http_status?: number;
  /** The run as the admission left it; never stored with the key. */
  view?: Record<string, unknown>;
  /** A recorded error answer (the same key returns the same answer). */
  error?: { code: string; message: string; param: string | null };
}

/** Subscribes to a turn's final notice; `arrivedWithin` resolves true once it has arrived. */
function finalNotice(ctx: GatewayContext, turnId: string): { sub: Subscription; arrivedWithin: (timeoutMs: number) => Promise<boolean> } {
  const sub = ctx.nc.subscribe(Subjects.turnFinal(turnId), { max: 1 });
  const arrived = (async () => {
    for await (const _ of sub) return true;
    return false;
  })();
  return {
    sub,
    arrivedWithin: async (timeoutMs) => {
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(false), timeoutMs);
      });
      try {
        return await Promise.race([arrived, timeout]);
      } finally {
        clearTimeout(timer);
      }
    },
  };
}

export function runRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    app.post("/api/v1/runs", { config: { scope: "run:write" } }, async (request, reply) => {
      const auth = authOf(request);
      const body = parseRunRequest(request.body);
      const key = idempotencyKeyOf(request)!;
      const workspaceId = auth.workspace._id;

      // Uploaded files are looked up in one query; their bytes are read by the actor, within its budget.
      const fileIds = body.input.flatMap((part) => (part.type === "input_file" && part.file_id ? [part.file_id] : []));
      const found = new Set((await ctx.files.getMany(workspaceId, fileIds)).map((f) => f._id));
      const missing = fileIds.find((id) => !found.has(id));
      if (missing !== undefined) throw invalid("input", `No file ${missing} in this workspace; upload it with POST /api/v1/files first.`);
      // A stream past the workspace's limit is refused before anything is admitted.
      if (body.stream) checkStreamQuota(ctx, workspaceId, auth.workspace.plan);
      let startVersion: number | undefined;
      if (body.kind === "start") {
        startVersion = await startVersionOf(await ctx.store.getAgent(workspaceId, body.agent), body.version, ctx.deployments);
      } else {
        await loadRun(ctx, workspaceId, body.run_id, "run_id");
      }

      const claim = await ctx.idempotency.claim<RunAnswer>(workspaceId, "runs.create", key, runRequestFingerprint(body), () => ({
        run_id: body.kind === "start" ? Ids.run() : body.run_id,
        turn_id: Ids.turn(),
      }));
      let answer = claim.result;
      // Subscribe before admission so a fast turn's final notice is not missed.
      const waitFor = !body.background && !body.stream ? finalNotice(ctx, answer.turn_id) : undefined;
      try {
        if (claim.kind === "new" || !claim.done) {
          try {
            answer = await admit(ctx, workspaceId, body, answer, startVersion, auth.workspace.plan, claim.kind === "new");
          } catch (err) {
            // Refused without effect (busy, unknown run): the key stays free for a retry.
            if (err instanceof ApiError && err.status < 500) await ctx.idempotency.release(claim.id);
            throw err;
          }
          const { view: _view, ...identity } = answer;
          await ctx.idempotency.complete(claim.id, identity);
        }
        if (answer.error) {
          throw new ApiError(answer.error.code as never, { message: answer.error.message, param: answer.error.param });
        }
        if (body.stream) {
          // The turn's events from its first one, ending after the event that makes it final.
          const run = await loadRun(ctx, workspaceId, answer.run_id, "run_id");
          await streamEvents(ctx, request, reply, run, { turnId: answer.turn_id, endWithTurnId: answer.turn_id });
          return reply;
        }
        return await deliver(ctx, reply, workspaceId, answer, body, waitFor);
      } finally {
        waitFor?.sub.unsubscribe();
      }
    });

    app.get<{ Querystring: Record<string, unknown> }>("/api/v1/runs", { config: { scope: "run:read" } }, async (request) => {
      const auth = authOf(request);
      const workspaceId = auth.workspace._id;
      const query = request.query;
      const limit = parseLimit(query.limit, 20, 100);
      const filters = parseRunListQuery(query);
      let after: { lastActivityAt: number; id: string } | undefined;
      if (query.after !== undefined) {
        const cursor = decodeCursor(String(query.after), "runs", workspaceId);
        after = { lastActivityAt: Number(cursor.k), id: cursor.id };
      }
      const page = await listRuns(ctx.store, { workspaceId, filters, limit, after, scanLimit: ctx.config.tagScanLimit });
      const last = page.runs[page.runs.length - 1];
      const next = last ? encodeCursor({ s: "runs", o: workspaceId, k: String(last.last_activity_at), id: last._id }) : null;
      return list(page.runs.map(renderRunSummary), page.hasMore, next);
    });

    app.delete<{ Params: { runId: string } }>("/api/v1/runs/:runId", { config: { scope: "run:write" } }, async (request) => {
      const auth = authOf(request);
      const key = idempotencyKeyOf(request)!;
      const workspaceId = auth.workspace._id;
      const runId = request.params.runId;
      const claim = await ctx.idempotency.claim<{ run_id: string; deleted?: boolean }>(workspaceId, "runs.delete", key, { run_id: runId }, () => ({
        run_id: runId,
      }));
      if (claim.kind === "new" || !claim.done) {
        try {
          await loadRun(ctx, workspaceId, runId);
          await ctx.router.send({ op: "delete", workspace_id: workspaceId, run_id: runId });
        } catch (err) {
          // A refused delete (busy, unknown) leaves the key free for a later retry.
          if (err instanceof ApiError && err.status < 500) await ctx.idempotency.release(claim.id);
          throw err;
        }
        await ctx.idempotency.complete(claim.id, { run_id: runId, deleted: true });
      }
      return { id: runId, object: "run.deleted", deleted: true };
    });

    app.get<{ Params: { runId: string }; Querystring: { turn_id?: string } }>(
      "/api/v1/runs/:runId",
      { config: { scope: "run:read" } },
      async (request) => {
        const auth = authOf(request);
        const run = await loadRun(ctx, auth.workspace._id, request.params.runId);
        const turnId = request.query.turn_id;
        if (turnId !== undefined && (typeof turnId !== "string" || turnId === "")) throw invalid("turn_id", "turn_id must be a turn id.");
        const turn = await loadTurn(ctx, run, turnId ?? run.latest_turn_id);
        return renderRun(run, turn);
      },
    );

    app.post<{ Params: { runId: string }; Body: { turn_id?: unknown } | undefined }>(
      "/api/v1/runs/:runId/cancel",
      // Cancelling stays available under rate limiting.
      { config: { scope: "run:write", rate: "exempt" } },
      async (request, reply) => {
        const auth = authOf(request);
        const key = idempotencyKeyOf(request)!;
        const body = request.body ?? {};
        if (typeof body !== "object" || Array.isArray(body)) throw invalid(null, "The body must be a JSON object.");
        for (const field of Object.keys(body)) if (field !== "turn_id") throw invalid(field, `Unknown field ${field}.`);
        const turnId = body.turn_id;
        if (turnId !== undefined && (typeof turnId !== "string" || turnId === "")) throw invalid("turn_id", "turn_id must be a turn id.");
        const workspaceId = auth.workspace._id;
        const run = await loadRun(ctx, workspaceId, request.params.runId);
        if (turnId) await loadTurn(ctx, run, turnId);
        const claim = await ctx.idempotency.claim<{ run_id: string; turn_id?: string; http_status?: number }>(workspaceId, "runs.cancel", key, { run_id: run._id, turn_id: turnId ?? null }, () => ({
          run_id: run._id,
        }));
        let selected = claim.result.turn_id;
        let status = claim.result.http_status ?? 200;
        if (claim.kind === "new" || !claim.done) {
          const result = await ctx.router.send({ op: "cancel", workspace_id: workspaceId, run_id: run._id, turn_id: turnId }).catch(async (err) => {
            if (err instanceof ApiError && err.status < 500) await ctx.idempotency.release(claim.id);
            throw err;
          });
          selected = result.turn_id;
          status = result.http_status ?? 200;
          await ctx.idempotency.complete(claim.id, { run_id: run._id, turn_id: selected, http_status: status });
        }
        const fresh = await loadRun(ctx, workspaceId, run._id);
        const turn = await loadTurn(ctx, fresh, selected ?? fresh.latest_turn_id);
        // A 202 shows the turn as the cancel left it (cancelling), even when the agent
        // settled before this read: the final status is observed by reading the turn.
        if (status === 202 && isFinalStatus(turn.status)) {
          const cancelling = { ...turn, status: TurnStatus.cancelling, output: [], error: null, completed_at: null, duration_ms: null };
          return reply.status(202).send(renderRun({ ...fresh, state: "busy", active_turn_id: turn._id }, cancelling));
        }
        return reply.status(status).send(renderRun(fresh, turn));
      },
    );
  };
}


async function admit(
  ctx: GatewayContext,
  workspaceId: string,
  body: RunRequest,
  ids: RunAnswer,
  startVersion: number | undefined,
  plan: "solo" | "business",
  fresh: boolean,
): Promise<RunAnswer> {
  const cmd: RunCommand =
    body.kind === "start"
      ? {
          op: "start",
          workspace_id: workspaceId,
          run_id: ids.run_id,
          turn_id: ids.turn_id,
          agent_id: body.agent,
          version: startVersion!,
          input: body.input,
          tags: body.tags,
          plan,
          fresh,
        }
      : { op: "continue", workspace_id: workspaceId, run_id: body.run_id, turn_id: ids.turn_id, input: body.input, on_busy: body.on_busy };
  try {
    const result = await ctx.router.send(cmd);
    return { run_id: result.run_id, turn_id: result.turn_id ?? ids.turn_id, disposition: result.disposition, view: result.run };
  } catch (err) {
    // A final lifecycle answer (steering_target_ended) is the key's answer from now on;
    // a retryable one (run_busy) or a transient failure is not recorded.
    if (err instanceof ApiError && err.status === 409 && !err.retryable) {
      return { ...ids, error: { code: err.code, message: err.message, param: err.param } };
    }
    throw err;
  }
}

/**
 * Waits for the turn's final notice, up to the wait limit. The store is checked again
 * every few seconds, so a notice lost while NATS reconnected costs seconds, not the
 * whole wait.
 */
async function waitUntilFinal(ctx: GatewayContext, run: RunDoc, turnId: string, notice: ReturnType<typeof finalNotice>): Promise<void> {
  const deadline = Date.now() + ctx.config.waitTimeoutMs;
  try {
    for (let i = 0; i < 10_000; i++) {
      const turn = await loadTurn(ctx, run, turnId);
      // Settled once the run moved on too (the notice follows both writes, DESIGN §4).
      if (isFinalStatus(turn.status) && (await ctx.store.getRun(run._id))?.active_turn_id !== turnId) return;
      const left = deadline - Date.now();
      if (left <= 0) return;
      if (await notice.arrivedWithin(Math.min(left, 3_000))) return;
    }
  } finally {
    notice.sub.unsubscribe();
  }
}

/** Answers a start or continue: background at once, otherwise after the turn is final or the wait ends. */
async function deliver(
  ctx: GatewayContext,
  reply: FastifyReply,
  workspaceId: string,
  answer: RunAnswer,
  body: RunRequest,
  waitFor: ReturnType<typeof finalNotice> | undefined,
) {
  if (body.background && answer.view) {
    // Background: the run as the admission left it, straight from the owner's reply.
    const turnView = answer.view.turn as { id: string };
    reply.header("location", `/api/v1/runs/${answer.run_id}?turn_id=${turnView.id}`);
    return reply.status(202).send(answer.view);
  }
  let run = await loadRun(ctx, workspaceId, answer.run_id, "run_id");
  let turn = await loadTurn(ctx, run, answer.turn_id);
  // Settled once the turn is final and the run moved on too (its second write, DESIGN §4).
  if (!body.background && !(isFinalStatus(turn.status) && run.active_turn_id !== turn._id)) {
    // A steered answer names the active turn, whose notice we were not subscribed to.
    const notice = waitFor && turn._id === answer.turn_id ? waitFor : finalNotice(ctx, turn._id);
    await waitUntilFinal(ctx, run, turn._id, notice);
    run = await loadRun(ctx, workspaceId, answer.run_id, "run_id");
    turn = await loadTurn(ctx, run, turn._id);
  }
  const final = isFinalStatus(turn.status);
  if (!final || body.background) {
    // Background, or the wait ran out: 202 with where to look (runs-api.md, POST /runs).
    reply.header("location", `/api/v1/runs/${run._id}?turn_id=${turn._id}`);
    return reply.status(202).send(renderRun(run, turn, answer.disposition));
  }
  return reply.status(200).send(renderRun(run, turn, answer.disposition));
}
