import type { SandboxStatus } from "../actors/index.js";
import { MAX_JSON_DEPTH, fieldOfPath, tooDeepPath } from "../src/json-depth.js";
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from "fastify";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "pino";
import type { Config } from "../src/config.js";
import type { Clock } from "../src/clock.js";
import { ApiError, invalid } from "../src/errors.js";
import { Ids } from "../src/ids.js";
import { StoreUnavailableError, type MongoStore } from "../src/mongo-store.js";
import type { DeploymentBuilder, DeploymentCache } from "../actors/index.js";
import type { EventLog } from "../src/event-log.js";
import type { FileStore } from "../src/file-store.js";
import type { EnvValues } from "../src/env-values.js";
import { Authenticator, requireScope, type AuthContext } from "./auth.js";
import { CommandRouter } from "./router.js";
import { IdempotencyRecords } from "./idempotency.js";
import { FinalTurnCache } from "./final-turns.js";
import { retryAfterSeconds } from "./unavailable.js";
import { trackConnection } from "../src/nats.js";
import { isTransientFailure } from "../src/transient.js";
import { RateClass, RateLimiter, type RateDecision } from "./rate-limits.js";
import type { KV } from "@nats-io/kv";
import { runRoutes } from "./routes/runs.js";
import { turnRoutes } from "./routes/turns.js";
import { tagRoutes } from "./routes/tags.js";
import { agentRoutes } from "./routes/agents.js";
import { apiKeyRoutes } from "./routes/api-keys.js";
import { healthRoutes } from "./routes/health.js";
import { eventRoutes } from "./routes/events.js";
import { envValueRoutes } from "./routes/env-values.js";
import { fileRoutes } from "./routes/files.js";
import { openapiRoutes } from "./routes/openapi.js";

/** Everything the routes use, built once at the composition root. */
export interface GatewayContext {
  config: Config;
  clock: Clock;
  store: MongoStore;
  nc: NatsConnection;
  log: Logger;
  router: CommandRouter;
  auth: Authenticator;
  idempotency: IdempotencyRecords;
  rateLimiter: RateLimiter;
  /** Final turns (immutable) as rendered, so reads of idle runs skip the turn read. */
  finalTurns: FinalTurnCache;
  builder: DeploymentBuilder;
  /** Ready deployments by id (immutable once ready). */
  deployments: DeploymentCache;
  events: EventLog;
  files: FileStore;
  envValues: EnvValues;
  /** Whether this node's actor host holds partitions (for /readyz); undefined for gateway-only nodes. */
  actorsReady?: () => boolean;
  /** This node's tool sandbox (for /readyz); undefined for gateway-only nodes. */
  sandboxStatus?: () => SandboxStatus;
}

declare module "fastify" {
  interface FastifyRequest {
    auth: AuthContext | null;
  }
  interface FastifyContextConfig {
    /** Scope the route requires; `public` routes need no key. */
    scope?: string;
    public?: boolean;
    /** `exempt`: never rate limited (cancel, key revocation); `expensive`: the lower limit too. */
    rate?: "exempt" | "expensive";
  }
}

export const BODY_LIMIT_BYTES = 16 * 1024 * 1024;

/** The authenticated caller of a route that requires a key. */
export function authOf(request: FastifyRequest): AuthContext {
  if (!request.auth) throw new ApiError("unauthorized");
  return request.auth;
}

function toApiError(err: unknown, log: Logger, request: FastifyRequest): ApiError {
  if (err instanceof ApiError) return err;
  if (isTransientFailure(err)) {
    log.warn({ err: err instanceof StoreUnavailableError ? err.cause : err, reqId: request.id }, "temporarily unavailable");
    return new ApiError("runtime_unavailable", { retryAfterS: retryAfterSeconds() });
  }
  const e = err as { statusCode?: number; code?: string; message?: string; validation?: unknown };
  if (e.code === "FST_ERR_CTP_BODY_TOO_LARGE") return new ApiError("payload_too_large", { message: "The request body is larger than 16 MiB." });
  if (e.code === "FST_ERR_CTP_INVALID_MEDIA_TYPE") return invalid(null, "Send the body as application/json.");
  if (e.code === "FST_ERR_CTP_EMPTY_JSON_BODY") return invalid(null, "The JSON body is empty.");
  if (typeof e.statusCode === "number" && e.statusCode >= 400 && e.statusCode < 500) {
    return invalid(null, e.message ?? "The request is invalid.");
  }
  const reference = Ids.reference();
  log.error({ err, reference, reqId: request.id, url: request.url }, "internal error");
  return new ApiError("internal_error", { reference });
}

function setRateHeaders(reply: FastifyReply, decision: RateDecision): void {
  reply.header("x-ratelimit-limit", String(decision.limit));
  reply.header("x-ratelimit-remaining", String(decision.remaining));
  reply.header("x-ratelimit-reset", String(decision.resetS));
}

/** Per-workspace limits (decisions §7); every authenticated /api answer carries the headers. */
export async function applyRateLimit(ctx: GatewayContext, auth: AuthContext, rate: "exempt" | "expensive" | undefined, reply: FastifyReply): Promise<void> {
  const ws = auth.workspace;
  if (rate === "exempt") {
    // Cancel and revocation stay available when the standard limit is used up; their own
    // budget, ten times larger, only bounds what a flood of them makes the service store.
    setRateHeaders(reply, ctx.rateLimiter.peek(ws._id, ws.plan, RateClass.standard));
    const own = await ctx.rateLimiter.take(ws._id, ws.plan, RateClass.exempt);
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
  return reply.status(error.status).send(error.toBody());
}

export async function buildApp(
  ctx: Omit<GatewayContext, "router" | "auth" | "idempotency" | "rateLimiter" | "finalTurns"> & { rateLimits: KV },
): Promise<{ app: FastifyInstance; context: GatewayContext }> {
  const context: GatewayContext = {
    ...ctx,
    rateLimiter: new RateLimiter(ctx.rateLimits, ctx.config.rateLimits, ctx.clock),
    router: new CommandRouter(ctx.nc, ctx.config.partitions, ctx.config.routeRetryMs, ctx.log.child({ component: "router" }), 15_000, trackConnection(ctx.nc)),
    auth: new Authenticator(ctx.store, ctx.clock, ctx.config.authCacheMs, ctx.nc),
    idempotency: new IdempotencyRecords(ctx.store, ctx.clock),
    finalTurns: new FinalTurnCache(),
  };
  const app = Fastify({
    loggerInstance: ctx.log.child({ component: "http" }) as FastifyBaseLogger,
    bodyLimit: BODY_LIMIT_BYTES,
    // Any path segment reaches its route (an over-long id is then 404 with the contract's
    // body); the router's own 414 would answer in its own format. Node caps the URL anyway.
    routerOptions: { maxParamLength: 16_384 },
    genReqId: () => Ids.reference().replace("ref_", "req_"),
  });
  app.decorateRequest("auth", null);

  // Every /api route authenticates unless marked public, then checks its scope.
  app.addHook("onRequest", async (request, reply) => {
    const config = request.routeOptions.config;
    if (config?.public || !request.url.startsWith("/api")) return;
    if (!request.routeOptions.url) return; // unknown path: answered 404 below, after auth
    request.auth = await context.auth.authenticate(request);
    // Limited before the scope check, so a 403 carries the rate-limit headers too.
    await applyRateLimit(context, request.auth, config?.rate, reply);
    if (config?.scope) requireScope(request.auth, config.scope);
  });

  app.setErrorHandler((err, request, reply) => sendError(reply, toApiError(err, ctx.log, request)));
  app.setNotFoundHandler((request, reply) =>
    sendError(reply, new ApiError("not_found", { message: `No route ${request.method} ${request.url.split("?")[0]}.` })),
  );
  // An empty JSON body on a POST is treated as {} (cancel takes an optional body).
  app.addContentTypeParser("application/json", { parseAs: "string" }, (_request, body, done) => {
    const text = typeof body === "string" ? body : body.toString("utf8");
    if (text.trim() === "") return done(null, undefined);
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      return done(invalid(null, "The body is not valid JSON."), undefined);
    }
    const deep = tooDeepPath(parsed);
    if (deep) {
      // A body that is itself an array has no field to name.
      const param = Array.isArray(parsed) ? null : fieldOfPath(deep);
      return done(invalid(param, `${param ?? "The body"}: JSON may be nested at most ${MAX_JSON_DEPTH} levels deep.`), undefined);
    }
    done(null, parsed);
  });

  await app.register(healthRoutes(context));
  await app.register(runRoutes(context));
  await app.register(turnRoutes(context));
  await app.register(tagRoutes(context));
  await app.register(eventRoutes(context));
  await app.register(agentRoutes(context));
  await app.register(apiKeyRoutes(context));
  await app.register(envValueRoutes(context, context.envValues));
  await app.register(fileRoutes(context, { ...context.config.files, files: context.files }));
  await app.register(openapiRoutes(context));
  return { app, context };
}
