import type { FastifyInstance } from "fastify";
import type { GatewayContext } from "../context.js";
import { type Operation, route } from "../operation.js";

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const HEALTH_OPERATIONS = {
  healthz: {
    method: "get",
    path: "/healthz",
    operationId: "healthz",
    summary: "Liveness",
    tag: "operations",
    scope: "public",
    success: { 200: { description: "The process is alive.", json: "Health" } },
  },
  readyz: {
    method: "get",
    path: "/readyz",
    operationId: "readyz",
    summary: "Readiness: NATS and the store reachable, node serving",
    tag: "operations",
    scope: "public",
    success: {
      200: { description: "Ready.", json: "Readiness" },
      503: { description: "Not ready (status unavailable, with which part is down).", json: "Readiness" },
    },
  },
  metrics: {
    method: "get",
    path: "/metrics",
    operationId: "metrics",
    summary: "Prometheus metrics",
    tag: "operations",
    scope: "public",
    success: { 200: { description: "Prometheus text exposition format (Content-Type: text/plain; version=0.0.4).", text: "text/plain" } },
  },
} satisfies Record<string, Operation>;

/** Liveness, readiness and a small Prometheus endpoint (decisions §8). */
export function healthRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    const responses = new Map<string, number>();
    app.addHook("onResponse", async (request, reply) => {
      const route = request.routeOptions.url ?? "unmatched";
      const key = `${request.method} ${route} ${reply.statusCode}`;
      responses.set(key, (responses.get(key) ?? 0) + 1);
    });

    route(app, HEALTH_OPERATIONS.healthz, async () => ({ status: "ok" }));

    route(app, HEALTH_OPERATIONS.readyz, async (_request, reply) => {
      const nats = !ctx.nc.isClosed() && !ctx.nc.isDraining();
      const store = await ctx.store.ping();
      const actors = ctx.actorsReady ? ctx.actorsReady() : true;
      const ready = nats && store && actors;
      // The sandbox is reported, not required here: a node without one never starts.
      const sandbox = ctx.sandboxStatus?.();
      return reply.status(ready ? 200 : 503).send({ status: ready ? "ready" : "unavailable", nats, store, actors, ...(sandbox ? { sandbox } : {}) });
    });

    route(app, HEALTH_OPERATIONS.metrics, async (_request, reply) => {
      const lines = ["# HELP runs_http_responses_total HTTP responses by method, route and status.", "# TYPE runs_http_responses_total counter"];
      for (const [key, count] of responses) {
        const [method, route, status] = key.split(" ");
        lines.push(`runs_http_responses_total{method="${method}",route="${route}",status="${status}"} ${count}`);
      }
      const memory = process.memoryUsage();
      lines.push("# TYPE runs_process_resident_memory_bytes gauge", `runs_process_resident_memory_bytes ${memory.rss}`);
      return reply.type("text/plain; version=0.0.4").send(`${lines.join("\n")}\n`);
    });
  };
}
