import type { FastifyInstance } from "fastify";
import type { GatewayContext } from "../context.js";

/** Liveness, readiness and a small Prometheus endpoint (decisions §8). */
export function healthRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    const responses = new Map<string, number>();
    app.addHook("onResponse", async (request, reply) => {
      const route = request.routeOptions.url ?? "unmatched";
      const key = `${request.method} ${route} ${reply.statusCode}`;
      responses.set(key, (responses.get(key) ?? 0) + 1);
    });

    app.get("/healthz", { config: { public: true } }, async () => ({ status: "ok" }));

    app.get("/readyz", { config: { public: true } }, async (_request, reply) => {
      const nats = !ctx.nc.isClosed() && !ctx.nc.isDraining();
      const store = await ctx.store.ping();
      const actors = ctx.actorsReady ? ctx.actorsReady() : true;
      const ready = nats && store && actors;
      // The sandbox is reported, not required here: a node without one never starts.
      const sandbox = ctx.sandboxStatus?.();
      return reply.status(ready ? 200 : 503).send({ status: ready ? "ready" : "unavailable", nats, store, actors, ...(sandbox ? { sandbox } : {}) });
    });

    app.get("/metrics", { config: { public: true } }, async (_request, reply) => {
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
