/** The Fastify app: hooks, parsers, error answers and every route plugin. */
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from "fastify";
import { type IncomingMessage, type ServerResponse, STATUS_CODES } from "node:http";
import type { Socket } from "node:net";
import type { KV } from "@nats-io/kv";
import { ApiError, fieldOfPath, invalid, malformedQueryParam, MAX_JSON_DEPTH, tooDeepPath, trackConnection, within } from "../src/index.js";
import { Authenticator, requireScope } from "./auth.js";
import { CommandRouter } from "./router.js";
import { IdempotencyRecords } from "./idempotency.js";
import { FinalTurnCache } from "./final-turns.js";
import { RateLimiter } from "./rate-limits.js";
import { UploadSlots } from "./upload-slots.js";
import { applyRateLimit, BODY_LIMIT_BYTES, type GatewayContext, sendError, showRateLimit, toApiError, wrongBodyType } from "./context.js";
import { runRoutes } from "./routes/runs.js";
import { turnRoutes } from "./routes/turns.js";
import { tagRoutes } from "./routes/tags.js";
import { actionRoutes } from "./routes/actions.js";
import { agentRoutes } from "./routes/agents.js";
import { apiKeyRoutes } from "./routes/api-keys.js";
import { healthRoutes } from "./routes/health.js";
import { eventRoutes } from "./routes/events.js";
import { envValueRoutes } from "./routes/env-values.js";
import { fileRoutes } from "./routes/files.js";
import { usageRoutes } from "./routes/usage.js";
import { webhookRoutes } from "./routes/webhooks.js";
import { openapiRoutes } from "./routes/openapi.js";
import { consoleRoutes } from "./routes/console.js";
import { buildOpenApiDocument } from "./openapi.js";
import { GatewayMetrics } from "./metrics.js";
import { openStreamCount } from "./sse.js";
import { acceptedRequestId, REQUEST_ID_HEADER } from "./request-id.js";

/**
 * A request that is not valid HTTP (bad request line or headers, headers too large, too
 * slow to arrive) never reaches a route: Node's parser refuses it. It is answered in the
 * contract's error format like every other refusal, then the connection closes.
 */
function answerClientError(err: Error & { code?: string }, socket: Socket): void {
  if (err.code === "ECONNRESET" || socket.destroyed || !socket.writable) return;
  const error =
    err.code === "ERR_HTTP_REQUEST_TIMEOUT"
      ? new ApiError("request_timeout", { message: "The request did not arrive in time." })
      : invalid(null, err.code === "HPE_HEADER_OVERFLOW" ? "The request's headers are larger than the server accepts." : "The request is not valid HTTP.");
  const body = JSON.stringify(error.toBody());
  socket.end(
    `HTTP/1.1 ${error.status} ${STATUS_CODES[error.status]}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
  );
}

/** Whether a request says it carries a body (most do not: GETs, bodiless POSTs). */
function hasBody(request: FastifyRequest): boolean {
  return request.headers["transfer-encoding"] !== undefined || (request.headers["content-length"] ?? "0") !== "0";
}

/**
 * What a route cannot read as sent, refused (400) after its key and scope are checked:
 * - a compressed body (a Content-Encoding other than identity): it would be read as
 *   malformed JSON, or an upload stored compressed;
 * - a query parameter the route reads whose percent-encoded bytes are not UTF-8 (it names
 *   no value; the parser would keep it as typed). Parameters a route does not read are
 *   ignored, as their values are.
 */
function refuseUnreadable(request: FastifyRequest): void {
  const encoding = request.headers["content-encoding"];
  if (encoding !== undefined && !identityOnly(encoding) && hasBody(request)) {
    throw invalid("Content-Encoding", "Content-Encoding: the body must be sent uncompressed (identity).");
  }
  const query = (request.routeOptions.schema?.querystring as { shape?: Record<string, unknown> } | undefined)?.shape;
  if (query === undefined) return;
  const param = malformedQueryParam(request.url, (name) => Object.hasOwn(query, name));
  if (param !== undefined) throw invalid(param, `${param}: its percent-encoded bytes are not UTF-8.`);
}

function noRoute(request: FastifyRequest): ApiError {
  return new ApiError("not_found", { message: `No route ${request.method} ${request.url.split("?")[0]}.` });
}

/** `identity`, or a list of nothing else (Node joins a repeated header with commas). */
function identityOnly(encoding: string): boolean {
  return encoding.split(",").every((coding) => ["", "identity"].includes(coding.trim().toLowerCase()));
}

/**
 * A request's body must arrive whole within RUNS_REQUEST_BODY_TIMEOUT_MS of its start:
 * Fastify turns off Node's bound on that, and a probe's 50 POSTs that stopped mid-body
 * held 50 sockets for the 320 s watched. Past it, with the body still short:
 * - while its route reads it: 408 request_timeout, and the connection closes;
 * - after an answer sent before it arrived (a 401, a refused upload; found by a review):
 *   the connection ends. Not at the answer: closed with body bytes unread, a connection is
 *   reset, and the client may lose the answer (an upload's 401 seen as "fetch failed").
 * An upload's body is bounded by the upload's own limit (20 minutes) while it is read.
 */
function watchBodyArrival(request: FastifyRequest, reply: FastifyReply, ctx: Pick<GatewayContext, "clock" | "config">): void {
  const raw = request.raw;
  const timer = ctx.clock.after(
    ctx.config.requestBodyTimeoutMs,
    () => {
      if (raw.complete) return;
      if (reply.raw.writableEnded) return void raw.socket?.destroy();
      // Only a body its route's parser reads (listening for its data and errors) is answered.
      if (request.routeOptions.config?.multipart || raw.listenerCount("data") === 0 || raw.listenerCount("error") === 0) return;
      reply.header("connection", "close");
      raw.emit("error", new ApiError("request_timeout", { message: `The request's body did not arrive within ${ctx.config.requestBodyTimeoutMs / 1000} s.` }));
    },
    { keepAlive: false },
  );
  const done = () => timer.cancel();
  raw.once("end", done);
  raw.once("close", done);
}

/** How much longer than an upload may take any request may take to arrive whole (Node's requestTimeout). */
const REQUEST_TIMEOUT_MARGIN_MS = 60_000;

/** A readiness check or a scrape waits at most this long for the store's ping. */
const PING_BOUND_MS = 1_000;

export async function buildApp(
  ctx: Omit<GatewayContext, "router" | "auth" | "idempotency" | "rateLimiter" | "uploadSlots" | "finalTurns" | "metrics" | "health"> & { rateLimits: KV },
): Promise<{ app: FastifyInstance; context: GatewayContext }> {
  const connection = trackConnection(ctx.nc);
  const natsConnected = () => connection.connected && !ctx.nc.isClosed();
  const health: GatewayContext["health"] = {
    // Connected by the client's account (it had only asked whether the connection was closed
    // for good, and said nats: true through an outage: fault probe). A server that stops
    // answering without closing the socket is found by the client's pings (src/nats.ts):
    // a PING of /readyz's own would wait behind the node's other traffic and make readiness
    // flap on a busy node (review).
    natsUp: () => natsConnected() && !ctx.nc.isDraining(),
    storeUp: () => within(ctx.store.ping(), PING_BOUND_MS, ctx.clock, () => false),
  };
  const context: GatewayContext = {
    ...ctx,
    rateLimiter: new RateLimiter(ctx.rateLimits, ctx.config.rateLimits, ctx.clock, (err) =>
      ctx.log.warn({ err }, "rate limits counted by this node alone for this window: the shared counter (JetStream KV) is unreachable"),
    ),
    uploadSlots: new UploadSlots(ctx.rateLimits, ctx.clock, ctx.config.files.takeoverMs),
    router: new CommandRouter({ nc: ctx.nc, partitions: ctx.config.partitions, retryMs: ctx.config.routeRetryMs, log: ctx.log.child({ component: "router" }), clock: ctx.clock, connection, here: ctx.commandHere }),
    auth: new Authenticator(ctx.store, ctx.clock, ctx.config.authCacheMs, ctx.nc),
    idempotency: new IdempotencyRecords(ctx.store, ctx.clock, undefined, ctx.log.child({ component: "idempotency" })),
    finalTurns: new FinalTurnCache(),
    metrics: new GatewayMetrics({
      turns: ctx.turnCounts,
      sseStreams: () => openStreamCount(context),
      natsConnected,
      storeReachable: health.storeUp,
    }, ctx.config.metricsToken !== undefined),
    health,
  };
  const app = Fastify({
    loggerInstance: ctx.log.child({ component: "http" }) as FastifyBaseLogger,
    bodyLimit: BODY_LIMIT_BYTES,
    // Node's bound on a whole request's arrival, which Fastify turns off by default: the
    // backstop behind the body deadline below, past the longest an upload may take (a
    // multipart body that stalls before or after its file part; a client that trickles a
    // body after an early answer). Node checks it every 30 s; 408, then the socket closes.
    requestTimeout: Math.max(ctx.config.files.timeLimitMs, ctx.config.requestBodyTimeoutMs) + REQUEST_TIMEOUT_MARGIN_MS,
    // Any path segment reaches its route (an over-long id is then 404 with the contract's
    // body); the router's own 414 would answer in its own format. Node caps the URL anyway.
    routerOptions: { maxParamLength: 16_384 },
    clientErrorHandler: answerClientError,
    genReqId: (req) => acceptedRequestId(req.headers[REQUEST_ID_HEADER]) ?? ctx.ids.reference().replace("ref_", "req_"),
    // What the router refuses before any route (a malformed percent-encoding in the path, an
    // over-long parameter) is answered in the contract's error body too, with the request id.
    // No hook runs for these: the headers every answer carries are set here, and a key is
    // authenticated and counted as for an unknown path (a bad key is 401, a good one's
    // answer carries X-RateLimit-*).
    frameworkErrors: (error, request, reply) => {
      reply.header(REQUEST_ID_HEADER, request.id);
      markAnswer(request, reply);
      const message = error.code === "FST_ERR_BAD_URL" ? "The request path is not a valid URL: a percent-encoding in it is malformed." : "The request path could not be routed.";
      countUnrouted(context, request, reply).then(
        () => sendError(reply, new ApiError("invalid_request", { message })),
        (err: unknown) => sendError(reply, toApiError(err, ctx.log, request, ctx.ids)),
      );
    },
  });
  app.decorateRequest("auth", null);
  closeConnectionsOnClose(app);
  // Late idempotency completions (POST /runs answers without waiting for them) are written before the store closes.
  app.addHook("onClose", () => context.idempotency.settled());
  // First, so every answer (401s, 404s, hijacked event streams) carries the id and is counted.
  app.addHook("onRequest", async (request, reply) => {
    reply.header(REQUEST_ID_HEADER, request.id);
    if (hasBody(request)) watchBodyArrival(request, reply, ctx);
  });
  context.metrics.instrument(app);
  ctx.usage.onRecorded((record) => context.metrics.countUsage(record));

  // Every /api route authenticates unless marked public, then checks its scope. Decided by
  // the route the request matched, never by its target as sent: an absolute-form target
  // (`GET http://host/api/v1/models`) reaches the same route without starting with /api.
  // Every /api answer to a request with a valid key carries X-RateLimit-* (decisions §7):
  // an unknown /api path is authenticated and counted as any route is (then 404), and a
  // public /api route (the OpenAPI document) shows the key's state without counting.
  app.addHook("onRequest", async (request, reply) => {
    markAnswer(request, reply);
    const config = request.routeOptions.config;
    const route = request.routeOptions.url;
    if (route === undefined) {
      // An unknown path: 404 here, before any body is read (a body the path never takes
      // would otherwise be parsed first, and a malformed one answered 400).
      await countUnrouted(context, request, reply);
      throw noRoute(request);
    }
    if (!route.startsWith("/api")) return;
    if (config?.public) {
      if (request.headers.authorization === undefined) return;
      const auth = await context.auth.authenticate(request).catch(() => undefined);
      if (auth) showRateLimit(context, auth, reply);
      return;
    }
    request.auth = await context.auth.authenticate(request);
    // Limited before the scope check, so a 403 carries the rate-limit headers too.
    await applyRateLimit(context, request.auth, config?.rate, reply);
    if (config?.scope) requireScope(request.auth, config.scope);
    refuseUnreadable(request);
  });

  app.setErrorHandler((err, request, reply) => sendError(reply, toApiError(err, ctx.log, request, ctx.ids)));
  app.setNotFoundHandler((request, reply) => sendError(reply, noRoute(request)));
  // JSON only: a JSON body sent as text/plain was parsed as a string and answered "The body
  // must be a JSON object" (found by a probe); now it is told the type to send. An empty one
  // is no body (fetch sends `body: ""` as text/plain), as for JSON below.
  app.removeContentTypeParser("text/plain");
  app.addContentTypeParser("text/plain", { parseAs: "string" }, (request, body, done) => {
    const text = typeof body === "string" ? body : body.toString("utf8");
    if (text.trim() === "") return done(null, undefined);
    done(wrongBodyType(request), undefined);
  });
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
  await app.register(actionRoutes(context));
  await app.register(eventRoutes(context));
  await app.register(agentRoutes(context));
  await app.register(apiKeyRoutes(context));
  await app.register(envValueRoutes(context));
  await app.register(fileRoutes(context));
  await app.register(usageRoutes(context));
  await app.register(webhookRoutes(context));
  await app.register(openapiRoutes(JSON.stringify(buildOpenApiDocument())));
  await app.register(consoleRoutes());
  return { app, context };
}

/**
 * What every answer says: the API's answers may carry a secret (a revealed value, a new
 * key) or a tenant's data, so no cache keeps them, and no browser takes an answer for
 * another type.
 */
function markAnswer(request: FastifyRequest, reply: FastifyReply): void {
  reply.header("x-content-type-options", "nosniff");
  if (API_TARGET.test(request.url)) reply.header("cache-control", "no-store");
}

/** A request no route takes: its key, when it sends one to /api, authenticated and counted as a route's would be. */
async function countUnrouted(context: GatewayContext, request: FastifyRequest, reply: FastifyReply): Promise<void> {
  if (request.headers.authorization === undefined || !API_TARGET.test(request.url)) return;
  request.auth = await context.auth.authenticate(request);
  await applyRateLimit(context, request.auth, undefined, reply);
}

/**
 * A request target of the API, in origin form (`/api/…`) or absolute form (`http://host/api/…`):
 * under /api, or the key rotation served without /api/v1 (`/api-keys/…`, decisions).
 */
const API_TARGET = /^(?:[a-z][a-z0-9+.-]*:\/\/[^/?#]*)?\/api(?:-keys)?(?:[/?#]|$)/i;

/**
 * A node that closes must not wait on connections: Node counts one that has not sent a
 * whole request (connected and silent, or headers still coming, also a kept-alive
 * connection's next request) as busy until its
 * headers timeout, and one whose request finishes after the close began stays open for
 * its keep-alive (72 s with Fastify). At close, the first kind are ended; requests in
 * flight finish, and their connections close after the answer (`Connection: close`
 * where the headers are still to go).
 */
function closeConnectionsOnClose(app: FastifyInstance): void {
  const silent = new Set<Socket>();
  const inFlight = new Set<ServerResponse>();
  let closing = false;
  app.server.on("connection", (socket: Socket) => {
    silent.add(socket);
    socket.once("close", () => silent.delete(socket));
  });
  app.server.on("request", (request: IncomingMessage, response: ServerResponse) => {
    silent.delete(request.socket);
    inFlight.add(response);
    if (closing) response.shouldKeepAlive = false;
    response.once("finish", () => {
      if (closing) request.socket.end();
      // Kept alive, it waits for its next request: silent again until that one's headers are in.
      else if (!request.socket.destroyed) silent.add(request.socket);
    });
    response.once("close", () => inFlight.delete(response));
  });
  app.addHook("preClose", async () => {
    closing = true;
    for (const socket of silent) socket.destroy();
    silent.clear();
    for (const response of inFlight) if (!response.headersSent) response.shouldKeepAlive = false;
  });
}
