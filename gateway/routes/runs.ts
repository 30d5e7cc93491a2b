import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { z } from "zod";
import { ApiError, pendingActionOf, startVersionOf, decodeCursor, type Disposition, encodeCursor, invalid, isFinalStatus, list, listReadableRuns, queryId, renderRun, renderRunSummary, type RunCommand, type RunDoc, RunListQuerySchema, runListFilters, type RunRequest, runRequestFingerprint, toRunRequest, type TurnDoc, TurnStatus } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { idempotencyKeyOf } from "../idempotency.js";
import { loadRun, loadTurn } from "../loaders.js";
import { type TurnNotices, turnNotices } from "../turn-notices.js";
import { reserveStream, streamEvents } from "../sse.js";
import { type Operation, page, route, runId, RUN_READS } from "../operation.js";
import { CancelRequestSchema, RunDeletedSchema, RunListSchema, RunRequestSchema, RunSchema } from "../schemas.js";

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

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const RUN_OPERATIONS = {
  createRun: {
    method: "post",
    path: "/api/v1/runs",
    operationId: "createRun",
    summary: "Start a run or continue one",
    description:
      "Exactly one of agent (start) and run_id (continue). Default delivery waits up to 120 s for the turn: 200 when it is final, else 202 with Location. background: 202 after admission. stream: a Server-Sent Events stream of the turn's events ending after the event that makes it final.",
    tag: "runs",
    scope: "run:write",
    idempotencyKey: true,
    body: { schema: RunRequestSchema, required: true },
    success: {
      200: { description: "The turn is final (or, with stream: true, the event stream).", json: RunSchema, sse: true },
      202: { description: "The turn is admitted and not final yet (or background: true). Read the Location until turn.status is final.", json: RunSchema, location: true },
    },
    errors: {
      404: ["agent_not_found", "agent_version_not_found", "run_not_found"],
      409: ["agent_version_not_ready", "idempotency_conflict", "steering_target_ended", "run_busy"],
      410: ["run_expired"],
      429: ["quota_exceeded"],
      503: ["event_history_unavailable"],
    },
  },
  listRuns: {
    method: "get",
    path: "/api/v1/runs",
    operationId: "listRuns",
    summary: "List runs",
    tag: "runs",
    scope: "run:read",
    query: RunListQuerySchema.extend(page(100, 20)),
    success: { 200: { description: "Run summaries, most recent activity first.", json: RunListSchema } },
    errors: { 400: ["invalid_request", "invalid_cursor"] },
  },
  getRun: {
    method: "get",
    path: "/api/v1/runs/{runId}",
    operationId: "getRun",
    summary: "Retrieve a run with one turn",
    tag: "runs",
    scope: "run:read",
    params: z.object(runId),
    query: z.object({ turn_id: queryId().optional().describe("Select this turn (default the latest).") }),
    success: { 200: { description: "The run with the selected turn.", json: RunSchema } },
    errors: { 400: ["invalid_request"], 404: ["run_not_found", "turn_not_found"], 410: ["run_expired"] },
  },
  deleteRun: {
    method: "delete",
    path: "/api/v1/runs/{runId}",
    operationId: "deleteRun",
    summary: "Delete an idle run",
    description: "Fences new work and answers once the run is gone; its turns, events, workspace and workspace checkpoint are removed asynchronously (uploaded files belong to the workspace and keep their own retention); later reads are 404. A busy run: 409 run_busy.",
    tag: "runs",
    scope: "run:write",
    idempotencyKey: true,
    params: z.object(runId),
    success: { 200: { description: "Deleted.", json: RunDeletedSchema } },
    errors: { 400: ["invalid_request"], ...RUN_READS, 409: ["run_busy", "idempotency_conflict"] },
  },
  cancelRun: {
    method: "post",
    path: "/api/v1/runs/{runId}/cancel",
    operationId: "cancelRun",
    summary: "Cancel the active, queued or named turn",
    description:
      "Active turn: 202 with the turn cancelling. Queued turn: 200 cancelled. Finished turn or idle run: 200 with the existing result.",
    tag: "runs",
    scope: "run:write",
    rate: "exempt",
    idempotencyKey: true,
    params: z.object(runId),
    body: { schema: CancelRequestSchema, required: false },
    success: {
      200: { description: "The run as a retrieval returns it, the selected turn cancelled or already final.", json: RunSchema },
      202: { description: "The run with the selected turn cancelling while the runtime settles.", json: RunSchema },
    },
    errors: { 404: ["run_not_found", "turn_not_found"], 409: ["idempotency_conflict"], 410: ["run_expired"] },
  },
} satisfies Record<string, Operation>;

export function runRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    route(app, RUN_OPERATIONS.createRun, async (request, reply) => {
      const auth = authOf(request);
      const body = toRunRequest(request.body);
      const key = idempotencyKeyOf(request)!;
      const workspaceId = auth.workspace._id;

      // Uploaded files are looked up (their records, by id); their bytes are read by the actor, within its budget.
      const fileIds = body.input.flatMap((part) => (part.type === "input_file" && part.file_id ? [part.file_id] : []));
      const found = new Set((await ctx.files.getMany(workspaceId, fileIds)).map((f) => f._id));
      const missing = fileIds.find((id) => !found.has(id));
      if (missing !== undefined) throw invalid("input", `No file ${missing} in this workspace; upload it with POST /api/v1/files first.`);
      let startVersion: number | undefined;
      if (body.kind === "start") {
        startVersion = await startVersionOf(await ctx.store.getAgent(workspaceId, body.agent), body.version, ctx.deployments);
      } else {
        await loadRun(ctx, workspaceId, body.run_id, "run_id");
      }

      // A stream past the workspace's limit is refused before anything is admitted: its slot
      // is taken now (concurrent streamed starts cannot all pass a check and then be refused
      // after admission) and handed to the stream, or freed below if nothing is streamed.
      const slot = body.stream ? reserveStream(ctx, workspaceId, auth.workspace.plan) : undefined;
      let slotHandedOver = false;
      // Subscribed before admission (to the turn id the claim holds) so a fast turn's
      // final notice is not missed.
      let waitFor: TurnNotices | undefined;
      // Set when this request admitted the turn it subscribed to: its notice is still to come.
      let admittedHere = false;
      try {
        // Refused without effect (busy, unknown run): the key stays free for a retry.
        const { result: answer } = await ctx.idempotency.once<RunAnswer>(
          {
            workspaceId,
            operation: "runs.create",
            key,
            fingerprint: runRequestFingerprint(body),
            fresh: () => ({ run_id: body.kind === "start" ? ctx.ids.run() : body.run_id, turn_id: ctx.ids.turn() }),
          },
          async (identity, firstClaim) => {
            // A spent budget refuses new turns; a retry whose turn was admitted goes on (a
            // concurrent twin of a refused request finds no turn: it is checked too), and so
            // does one whose run was removed since (its turn with it): the actor answers it
            // without the run, and a refusal here would free the key to start another run.
            if (firstClaim || !((await ctx.store.getTurn(identity.turn_id)) || (await ctx.store.getTombstone(identity.run_id)))) {
              await ctx.usage.admit(workspaceId);
            }
            if (!body.background && !body.stream) waitFor = turnNotices(ctx, identity.run_id, identity.turn_id);
            const admitted = await admit(ctx, workspaceId, body, identity, startVersion, auth.workspace.plan, firstClaim);
            admittedHere = firstClaim;
            return admitted;
          },
          // The run as admission left it is answered, never stored with the key. An admitted
          // turn's answer does not wait for the record (a re-drive of its ids admits nothing new).
          { record: ({ view: _view, ...identity }) => identity, lateCompletion: (answer) => !answer.error },
        );
        if (!waitFor && !body.background && !body.stream) waitFor = turnNotices(ctx, answer.run_id, answer.turn_id);
        if (answer.error) {
          throw new ApiError(answer.error.code as never, { message: answer.error.message, param: answer.error.param });
        }
        if (slot) {
          // The turn's events from its first one, ending after the event that makes it final.
          const run = await loadRun(ctx, workspaceId, answer.run_id, runParamOf(body));
          slotHandedOver = true;
          await streamEvents(ctx, request, reply, run, { turnId: answer.turn_id, endWithTurnId: answer.turn_id, slot });
          return reply;
        }
        return await deliver(ctx, reply, workspaceId, answer, body, waitFor, admittedHere);
      } finally {
        waitFor?.sub.unsubscribe();
        if (!slotHandedOver) slot?.();
      }
    });

    route(app, RUN_OPERATIONS.listRuns, async (request) => {
      const auth = authOf(request);
      const workspaceId = auth.workspace._id;
      const query = request.query;
      const limit = query.limit;
      const filters = runListFilters(query);
      let after: { lastActivityAt: number; id: string } | undefined;
      if (query.after !== undefined) {
        const cursor = decodeCursor(query.after, "runs", workspaceId);
        after = { lastActivityAt: Number(cursor.k), id: cursor.id };
      }
      const page = await listReadableRuns(ctx.store, { workspaceId, filters, limit, after, scanLimit: ctx.config.tagScanLimit, nowMs: ctx.clock.nowMs(), turnLimitMs: ctx.config.turnLimitMs });
      const last = page.lastRead;
      const next = last ? encodeCursor({ s: "runs", o: workspaceId, k: String(last.last_activity_at), id: last._id }) : null;
      return list(page.runs.map(renderRunSummary), page.hasMore, next);
    });

    route(app, RUN_OPERATIONS.deleteRun, async (request) => {
      const auth = authOf(request);
      const key = idempotencyKeyOf(request)!;
      const workspaceId = auth.workspace._id;
      const runId = request.params.runId;
      // A refused delete (busy, unknown) leaves the key free for a later retry.
      await ctx.idempotency.once<{ run_id: string; deleted?: boolean }>(
        { workspaceId, operation: "runs.delete", key, fingerprint: { run_id: runId }, fresh: () => ({ run_id: runId }) },
        async (_identity, firstClaim) => deleteRunOnce(ctx, workspaceId, runId, firstClaim),
      );
      return { id: runId, object: "run.deleted" as const, deleted: true as const };
    });

    route(app, RUN_OPERATIONS.getRun,
      async (request) => {
        const auth = authOf(request);
        const run = await loadRun(ctx, auth.workspace._id, request.params.runId);
        const turnId = request.query.turn_id;
        const turn = await loadTurn(ctx, run, turnId ?? run.latest_turn_id);
        return renderRun(run, turn);
      },
    );

    // Cancelling stays available under rate limiting (its own budget: rate "exempt").
    route(
      app,
      RUN_OPERATIONS.cancelRun,
      async (request, reply) => {
        const auth = authOf(request);
        const key = idempotencyKeyOf(request)!;
        const turnId = request.body.turn_id;
        const workspaceId = auth.workspace._id;
        const run = await loadRun(ctx, workspaceId, request.params.runId);
        if (turnId) await loadTurn(ctx, run, turnId);
        // The owner selects the turn and records the request's id on it when it changes it;
        // a retry after a lost answer gets that turn again, or, if the first attempt changed
        // nothing, one of the turns the run had then (runs-api.md: a repeat "returns the turn
        // it first selected, never a later one").
        const { result: cancelled } = await ctx.idempotency.once<{ run_id: string; turn_id?: string; http_status?: number; cancel_id?: string; before_index?: number }>(
          {
            workspaceId,
            operation: "runs.cancel",
            key,
            fingerprint: { run_id: run._id, turn_id: turnId ?? null },
            fresh: () => ({ run_id: run._id, cancel_id: ctx.ids.cancel(), before_index: run.turn_count }),
          },
          async (identity, firstClaim) => {
            const resent = !firstClaim && identity.before_index !== undefined ? { before_index: identity.before_index } : undefined;
            const result = await ctx.router.send({ op: "cancel", workspace_id: workspaceId, run_id: run._id, turn_id: turnId, cancel_id: identity.cancel_id, resent });
            return { run_id: run._id, turn_id: result.turn_id, http_status: result.http_status ?? 200 };
          },
        );
        const selected = cancelled.turn_id;
        const status = cancelled.http_status ?? 200;
        const fresh = await loadRun(ctx, workspaceId, run._id);
        const turn = await loadTurn(ctx, fresh, selected ?? fresh.latest_turn_id);
        // A 202 shows the turn as the cancel left it (cancelling), even when the agent
        // settled before this read: the final status is observed by reading the turn.
        if (status === 202 && isFinalStatus(turn.status)) {
          const cancelling = { ...turn, status: TurnStatus.cancelling, output: [], error: null, completed_at: null, duration_ms: null };
          return reply.status(202).send(renderRun({ ...fresh, state: "busy", active_turn_id: turn._id }, cancelling));
        }
        return reply.status(status as 200 | 202).send(renderRun(fresh, turn));
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
      : { op: "continue", workspace_id: workspaceId, run_id: body.run_id, turn_id: ids.turn_id, input: body.input, on_busy: body.on_busy, ...(fresh ? {} : { resent: true }) };
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
 * After a read found the turn neither settled nor waiting for a person: waits until it is
 * final (and the run moved on), waits for a decision, or `deadline`. The store is read
 * after each waiting notice and every few seconds, so a notice lost while NATS reconnected
 * costs seconds, not the whole wait.
 */
async function waitUntilFinal(ctx: GatewayContext, run: RunDoc, turnId: string, notices: TurnNotices, deadline: number, key: KeyWatch): Promise<void> {
  for (let i = 0; i < 10_000; i++) {
    const left = deadline - ctx.clock.nowMs();
    if (left <= 0) return;
    if ((await notices.next(Math.min(left, ctx.config.waitStoreCheckMs))) === "final") return;
    await key.check();
    const turn = await loadTurn(ctx, run, turnId);
    if (settled(turn, await ctx.store.getRun(run._id))) return;
    // A turn that waits for a person's decision is not about to end: answer 202 now.
    if (pendingActionOf(turn.actions)) return;
  }
}

/**
 * What a run that is gone is named by in the answer: a continuation's body names it
 * (`run_id`); a start named none (a retry of one whose run was deleted since).
 */
function runParamOf(body: RunRequest): string | null {
  return body.kind === "continue" ? "run_id" : null;
}

/**
 * The key of a request that waits for its turn, watched as a stream's is (gateway/sse.ts):
 * a revocation heard from any node wakes the wait, and before the wait goes on and before a
 * waited answer is sent, the key is authenticated again if a change of keys was heard, its
 * rotation's grace has ended, or it was last read {@link KEY_RECHECK_MS} ago, so a turn's
 * result does not go to a key revoked meanwhile; its answer is 401. A turn answered within
 * those seconds from its final notice reads no store. A check that cannot be made (the store
 * away) leaves the wait as it is, and is made again at the next.
 */
interface KeyWatch {
  /** The notices a revocation wakes (the wait's current ones). */
  wakes(notices: TurnNotices | undefined): void;
  check(): Promise<void>;
  stop(): void;
}

function watchKey(ctx: GatewayContext, request: FastifyRequest): KeyWatch {
  const keyId = request.auth?.keyId;
  let usableUntilMs = request.auth?.usableUntilMs ?? null;
  // Keys changed between the request's authentication and this wait: checked at once.
  let changed = request.auth?.generation !== ctx.auth.generation;
  let checkedAtMs = ctx.clock.nowMs();
  let waking: TurnNotices | undefined;
  const stop = ctx.auth.onInvalidated((key) => {
    if (key !== undefined && keyId !== undefined && key !== keyId) return;
    changed = true;
    waking?.poke();
  });
  return {
    wakes: (notices) => (waking = notices),
    async check() {
      const now = ctx.clock.nowMs();
      // Also every few seconds, as a stream's key: an invalidation is a core NATS message,
      // and one lost while NATS reconnected would otherwise never be made up for.
      const due = changed || now - checkedAtMs >= KEY_RECHECK_MS || (usableUntilMs !== null && now >= usableUntilMs);
      if (!due) return;
      try {
        const auth = await ctx.auth.authenticate(request);
        usableUntilMs = auth.usableUntilMs;
        // A change heard while this read ran is read again at the next check.
        changed = changed && auth.generation !== ctx.auth.generation;
        checkedAtMs = now;
      } catch (err) {
        if (err instanceof ApiError && err.status === 401) throw err;
        // Not read (the store away): the change stays to be checked.
      }
    },
    stop,
  };
}

/** How often a waiting request's key is read again without a change heard (as a stream's, gateway/sse.ts). */
const KEY_RECHECK_MS = 5_000;

/** A final turn whose run moved on too (the notice follows both writes, DESIGN §4). */
function settled(turn: TurnDoc, run: RunDoc | null): boolean {
  return isFinalStatus(turn.status) && run?.active_turn_id !== turn._id;
}

/**
 * Answers a start or continue: background at once, otherwise after the turn is final or
 * the wait ends. A turn this request admitted (`admittedHere`, subscribed to before) is
 * answered from its final notice, which carries the run as both final writes left it:
 * no store read. Otherwise (a retry, a steered turn, a notice lost or too large to carry
 * the run, a turn that waits for a decision) the store is read, and a final notice that
 * arrives during the wait still answers with its view.
 */
async function deliver(
  ctx: GatewayContext,
  reply: FastifyReply,
  workspaceId: string,
  answer: RunAnswer,
  body: RunRequest,
  waitFor: TurnNotices | undefined,
  admittedHere: boolean,
) {
  if (body.background && answer.view) {
    // Background: the run as the admission left it, straight from the owner's reply.
    const turnView = answer.view.turn as { id: string };
    reply.header("location", `/api/v1/runs/${answer.run_id}?turn_id=${turnView.id}`);
    return reply.status(202).send(answer.view);
  }
  const deadline = ctx.clock.nowMs() + ctx.config.waitTimeoutMs;
  const key = watchKey(ctx, reply.request);
  // True when it answered. (Not the reply itself: a FastifyReply is thenable, and an async
  // function's result would be taken as that promise's value, undefined.)
  const fromNotice = async (notice: TurnNotices | undefined): Promise<boolean> => {
    const view = notice?.view();
    if (!view) return false;
    await key.check();
    reply.status(200).send(answer.disposition ? { ...view, disposition: answer.disposition } : view);
    return true;
  };
  // A steered answer names the active turn, not the one subscribed to before admission: its
  // notices are subscribed to before the reads, so an end between them is not missed (and
  // the claim's turn, which will never have one, is let go).
  const own = waitFor?.turnId === answer.turn_id;
  let notice: TurnNotices | undefined;
  try {
    // (No background request subscribes.)
    if (admittedHere && own) {
      key.wakes(waitFor);
      // How long a request that admitted its turn waits for the final notice before it reads the store.
      if ((await waitFor!.next(Math.min(ctx.config.waitTimeoutMs, ctx.config.waitStoreCheckMs))) === "final") {
        if (await fromNotice(waitFor)) return reply;
      }
      await key.check();
    }
    if (waitFor && !own) waitFor.sub.unsubscribe();
    notice = body.background ? undefined : own ? waitFor : turnNotices(ctx, answer.run_id, answer.turn_id);
    key.wakes(notice);
    let run = await loadRun(ctx, workspaceId, answer.run_id, runParamOf(body));
    let turn = await loadTurn(ctx, run, answer.turn_id);
    if (notice && !settled(turn, run) && !pendingActionOf(turn.actions)) {
      await waitUntilFinal(ctx, run, turn._id, notice, deadline, key);
      if (await fromNotice(notice)) return reply;
      run = await loadRun(ctx, workspaceId, answer.run_id, runParamOf(body));
      turn = await loadTurn(ctx, run, turn._id);
      await key.check();
    }
    const final = isFinalStatus(turn.status);
    if (!final || body.background) {
      // Background, or the wait ran out: 202 with where to look (runs-api.md, POST /runs).
      reply.header("location", `/api/v1/runs/${run._id}?turn_id=${turn._id}`);
      return reply.status(202).send(renderRun(run, turn, answer.disposition));
    }
    return reply.status(200).send(renderRun(run, turn, answer.disposition));
  } finally {
    key.stop();
    if (notice !== waitFor) notice?.sub.unsubscribe();
  }
}

/**
 * The work of one DELETE of a run. A repeat of a delete whose first attempt failed after
 * it took effect (a 503 while NATS or the owner went away) answers as the first would have:
 * deleted. So does an attempt whose run was deleted between its read and its command: an
 * earlier attempt with the same key, still running on a node that had paused, and this one
 * (taking over after the wait for it) raced to the owner. Its `run_not_found` would have
 * released the key, and a later repeat would then have been a first claim: 404.
 */
export async function deleteRunOnce(
  ctx: Pick<GatewayContext, "store" | "router" | "clock" | "config">,
  workspaceId: string,
  runId: string,
  firstClaim: boolean,
): Promise<{ run_id: string; deleted: true }> {
  const deletedMeanwhile = async (err: unknown) => err instanceof ApiError && err.code === "run_not_found" && (await deletedHere(ctx, workspaceId, runId));
  try {
    await loadRun(ctx, workspaceId, runId);
  } catch (err) {
    if (!firstClaim && (await deletedMeanwhile(err))) return { run_id: runId, deleted: true };
    throw err;
  }
  try {
    await ctx.router.send({ op: "delete", workspace_id: workspaceId, run_id: runId });
  } catch (err) {
    if (await deletedMeanwhile(err)) return { run_id: runId, deleted: true };
    throw err;
  }
  return { run_id: runId, deleted: true };
}

/** Whether the run was deleted (not expired) in this workspace: its tombstone says so. */
async function deletedHere(ctx: Pick<GatewayContext, "store">, workspaceId: string, runId: string): Promise<boolean> {
  const tombstone = await ctx.store.getTombstone(runId);
  return tombstone !== null && tombstone.workspace_id === workspaceId && tombstone.reason === "deleted";
}
