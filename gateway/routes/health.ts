import { timingSafeEqual } from "node:crypto";
import type { FastifyInstance } from "fastify";
import { ApiError, hashSecret } from "../../src/index.js";
import type { GatewayContext } from "../context.js";
import { type Operation, route } from "../operation.js";
import { HealthSchema, ReadinessSchema } from "../schemas.js";

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const HEALTH_OPERATIONS = {
  healthz: {
    method: "get",
    path: "/healthz",
    operationId: "healthz",
    summary: "Liveness",
    tag: "operations",
    scope: "public",
    // Only the HTTP layer refuses these (gateway/app.ts answerClientError).
    errors: { 400: ["invalid_request"] },
    success: { 200: { description: "The process is alive.", json: HealthSchema } },
  },
  readyz: {
    method: "get",
    path: "/readyz",
    operationId: "readyz",
    summary: "Readiness: NATS and the store reachable, node serving",
    tag: "operations",
    scope: "public",
    // Only the HTTP layer refuses these (gateway/app.ts answerClientError).
    errors: { 400: ["invalid_request"] },
    success: {
      200: { description: "Ready.", json: ReadinessSchema },
      503: { description: "Not ready (status unavailable, with which part is down).", json: ReadinessSchema },
    },
  },
  metrics: {
    method: "get",
    path: "/metrics",
    operationId: "metrics",
    summary: "Prometheus metrics",
    description:
      "Without RUNS_METRICS_TOKEN set, public and naming no workspace. With it set, it answers only `Authorization: Bearer <that token>` (401 otherwise), and adds the usage series by workspace (runs_tokens_total, runs_cost_usd_total).",
    tag: "operations",
    scope: "public",
    // 400: only the HTTP layer refuses these (gateway/app.ts answerClientError).
    errors: { 400: ["invalid_request"], 401: ["unauthorized"] },
    success: { 200: { description: "Prometheus text exposition format (Content-Type: text/plain; version=0.0.4): requests and latency by route template and status, active and queued turns, open event streams, NATS and store health, event-loop lag, process metrics.", text: "text/plain" } },
  },
} satisfies Record<string, Operation>;

/** Compared as digests (as API keys are hashed): equal lengths for timingSafeEqual, whatever was sent. */
const digest = (token: string) => Buffer.from(hashSecret(token));

/** Liveness, readiness and the Prometheus endpoint (decisions §8; gateway/metrics.ts). */
export function healthRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    route(app, HEALTH_OPERATIONS.healthz, async () => ({ status: "ok" as const }));

    route(app, HEALTH_OPERATIONS.readyz, async (_request, reply) => {
      const nats = ctx.health.natsUp();
      const store = await ctx.health.storeUp();
      const actors = ctx.actorsReady ? ctx.actorsReady() : true;
      const ready = nats && store && actors;
      // The sandbox is reported, not required here: a node without one never starts.
      const sandbox = ctx.sandboxStatus?.();
      return reply.status(ready ? 200 : 503).send({ status: ready ? "ready" : "unavailable", nats, store, actors, ...(sandbox ? { sandbox } : {}) });
    });

    const token = ctx.config.metricsToken;
    const expected = token === undefined ? undefined : digest(token);
    route(app, HEALTH_OPERATIONS.metrics, async (request, reply) => {
      if (expected) {
        const given = /^Bearer (\S+)$/i.exec(request.headers.authorization ?? "")?.[1];
        if (given === undefined || !timingSafeEqual(digest(given), expected)) {
          throw new ApiError("unauthorized", { message: "/metrics needs the operator's metrics token (Authorization: Bearer <RUNS_METRICS_TOKEN>)." });
        }
      }
      return reply.type(ctx.metrics.contentType).send(await ctx.metrics.text());
    });
  };
}
