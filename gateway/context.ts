/**
 * What every route shares: the context built once at the composition root, the
 * caller's authentication, error answers and the per-workspace rate limit. Routes
 * import this file, never app.ts (which imports them).
 */
import type { FastifyReply, FastifyRequest } from "fastify";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "pino";
import { ApiError, type Clock, type CommandReply, type Config, type DeploymentBuilds, type DeploymentLookup, type EnvValues, type EventLog, type FileStore, type IdSource, invalid, isTransientFailure, type MongoStore, type SandboxStatus, StoreUnavailableError, type UsageLedger, type WebhookStore } from "../src/index.js";
import type { AuthContext, Authenticator } from "./auth.js";
import type { CommandRouter } from "./router.js";
import type { IdempotencyRecords } from "./idempotency.js";
import type { FinalTurnCache } from "./final-turns.js";
import type { GatewayMetrics } from "./metrics.js";
import { retryAfterSeconds } from "./unavailable.js";
import { RateClass, type RateDecision, type RateLimiter } from "./rate-limits.js";
import type { UploadSlots } from "./upload-slots.js";

/** Everything the routes use, built once at the composition root. */
export interface GatewayContext {
  config: Config;
  clock: Clock;
  ids: IdSource;
  store: MongoStore;
  nc: NatsConnection;
  log: Logger;
  router: CommandRouter;
  auth: Authenticator;
  idempotency: IdempotencyRecords;
  rateLimiter: RateLimiter;
  /** The concurrent-upload cap's slots, shared by every node (gateway/upload-slots.ts). */
  uploadSlots: UploadSlots;
  /** Final turns (immutable) as rendered, so reads of idle runs skip the turn read. */
  finalTurns: FinalTurnCache;
  builder: DeploymentBuilds;
  /** Ready deployments by id (immutable once ready). */
  deployments: DeploymentLookup;
  events: EventLog;
  files: FileStore;
  envValues: EnvValues;
  /** Usage summaries and budgets (src/usage-ledger.ts). */
  usage: UsageLedger;
  /** Webhook endpoints and their deliveries (src/webhooks.ts). */
  webhooks: WebhookStore;
  /** Whether this node's actor host holds partitions (for /readyz); undefined for gateway-only nodes. */
  actorsReady?: () => boolean;
  /** This node's actor host's answer to a command for a partition it serves (undefined: ask the owner through NATS). */
  commandHere?: (runId: string, command: string) => Promise<CommandReply> | undefined;
  /** This node's tool sandbox (for /readyz); undefined for gateway-only nodes. */
  sandboxStatus?: () => SandboxStatus;
  /** This node's executing and queued turns and its recoveries of gained partitions' busy runs (for /metrics); undefined for gateway-only nodes. */
  turnCounts?: () => { active: number; queued: number; recovering: number; recoveriesWaiting: number };
  metrics: GatewayMetrics;
  /** Whether this node's NATS connection is up, and whether the store answers a ping within a second (/readyz and /metrics). */
  health: { natsUp(): boolean; storeUp(): Promise<boolean> };
}

declare module "fastify" {
  interface FastifyRequest {
    auth: AuthContext | null;
  }
  interface FastifyContextConfig {
    /** Scope the route requires; `public` routes need no key. */
    scope?: string;
    public?: boolean;
    /** `exempt`: not held back by the standard limit, only by a budget of its own (cancel, key revocation); `expensive`: the lower limit too. */
    rate?: "exempt" | "expensive";
    /**
     * The route reads a multipart body itself: it bounds the body's arrival (an upload's time
     * limit, not RUNS_REQUEST_BODY_TIMEOUT_MS) and takes no other type.
     */
    multipart?: boolean;
  }
}

export const BODY_LIMIT_BYTES = 16 * 1024 * 1024;

/** The authenticated caller of a route that requires a key. */
export function authOf(request: FastifyRequest): AuthContext {
  if (!request.auth) throw new ApiError("unauthorized");
  return request.auth;
}

/** What an upload sent in another type is told. */
export const MULTIPART_ONLY = "Send the file as multipart/form-data with a part named file.";

/** What a body of a type its route does not take is told: the type to send. */
export function wrongBodyType(request: FastifyRequest): ApiError {
  return request.routeOptions.config?.multipart ? invalid("file", MULTIPART_ONLY) : invalid(null, "Send the body as application/json.");
}

export function toApiError(err: unknown, log: Logger, request: FastifyRequest, ids: IdSource): ApiError {
  if (err instanceof ApiError) return err;
  if (isTransientFailure(err)) {
    log.warn({ err: err instanceof StoreUnavailableError ? err.cause : err, reqId: request.id }, "temporarily unavailable");
    return new ApiError("runtime_unavailable", { retryAfterS: retryAfterSeconds() });
  }
  const e = err as { statusCode?: number; code?: string; message?: string; validation?: unknown };
  if (e.code === "FST_ERR_CTP_BODY_TOO_LARGE") return new ApiError("payload_too_large", { message: "The request body is larger than 16 MiB." });
  if (e.code === "FST_ERR_CTP_INVALID_MEDIA_TYPE") return wrongBodyType(request);
  if (e.code === "FST_ERR_CTP_EMPTY_JSON_BODY") return invalid(null, "The JSON body is empty.");
  if (typeof e.statusCode === "number" && e.statusCode >= 400 && e.statusCode < 500) {
    return invalid(null, e.message ?? "The request is invalid.");
  }
  const reference = ids.reference();
  log.error({ err, reference, reqId: request.id, url: request.url }, "internal error");
  return new ApiError("internal_error", { reference });
}

function setRateHeaders(reply: FastifyReply, decision: RateDecision): void {
  reply.header("x-ratelimit-limit", String(decision.limit));
  reply.header("x-ratelimit-remaining", String(decision.remaining));
  reply.header("x-ratelimit-reset", String(decision.resetS));
}

/**
 * The rate-limit headers of a request not counted against the limit (a public /api
 * route's): the standard limit as this node last counted it.
 */
export function showRateLimit(ctx: GatewayContext, auth: AuthContext, reply: FastifyReply): void {
  setRateHeaders(reply, ctx.rateLimiter.peek(auth.workspace._id, auth.workspace.plan, RateClass.standard));
}

/** Per-workspace limits (decisions §7); every authenticated /api answer carries the headers. */
export async function applyRateLimit(ctx: GatewayContext, auth: AuthContext, rate: "exempt" | "expensive" | undefined, reply: FastifyReply): Promise<void> {
  const ws = auth.workspace;
  if (rate === "exempt") {
    // Cancel and revocation stay available when the standard limit is used up; their own
    // budget, ten times larger, only bounds what a flood of them makes the service store.
    // The headers describe the limit that governs them (runs-api.md), served or refused: a
    // cancel served with the standard limit's "0 remaining" had read as refused.
    const own = await ctx.rateLimiter.take(ws._id, ws.plan, RateClass.exempt);
    setRateHeaders(reply, own);
    if (!own.allowed) {
      throw new ApiError("rate_limited", { retryAfterS: own.retryAfterS, message: `The workspace's limit of ${own.limit} cancels and revocations per window is used up. Retry after ${own.retryAfterS} s.` });
    }
    return;
  }
  let governing = await ctx.rateLimiter.take(ws._id, ws.plan, RateClass.standard);
  if (governing.allowed && rate === "expensive") governing = await ctx.rateLimiter.take(ws._id, ws.plan, RateClass.expensive);
  setRateHeaders(reply, governing);
  if (!governing.allowed) {
    throw new ApiError("rate_limited", {
      retryAfterS: governing.retryAfterS,
      message: `The workspace's rate limit of ${governing.limit} requests per window is used up. Retry after ${governing.retryAfterS} s.`,
    });
  }
}

export function sendError(reply: FastifyReply, error: ApiError): FastifyReply {
  if (error.retryAfterS !== undefined) reply.header("retry-after", String(error.retryAfterS));
  // RFC 9110: a 401 names the scheme it takes.
  if (error.status === 401) reply.header("www-authenticate", 'Bearer realm="runs"');
  return reply.status(error.status).send(error.toBody());
}

