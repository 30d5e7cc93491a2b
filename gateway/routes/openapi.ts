import type { FastifyInstance } from "fastify";
import type { GatewayContext } from "../context.js";
import { buildOpenApiDocument } from "../openapi.js";

/** `GET /api/v1/openapi.json` (decisions §8): public, built once per gateway. */
export function openapiRoutes(_ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    const document = JSON.stringify(buildOpenApiDocument());
    app.get("/api/v1/openapi.json", { config: { public: true } }, async (_request, reply) =>
      reply.type("application/json; charset=utf-8").send(document),
    );
  };
}
