import type { FastifyInstance } from "fastify";
import { type Operation, route } from "../operation.js";

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const OPENAPI_OPERATIONS = {
  getOpenApiDocument: {
    method: "get",
    path: "/api/v1/openapi.json",
    operationId: "getOpenApiDocument",
    summary: "This document",
    tag: "operations",
    scope: "public",
    success: { 200: { description: "The OpenAPI 3.1 document.", json: "__openapi" } },
  },
} satisfies Record<string, Operation>;

/**
 * `GET /api/v1/openapi.json` (decisions §8): public. The document is built once by the
 * app (gateway/openapi.ts, from every route's declaration) and handed in as JSON.
 */
export function openapiRoutes(document: string) {
  return async function (app: FastifyInstance) {
    route(app, OPENAPI_OPERATIONS.getOpenApiDocument, async (_request, reply) => reply.type("application/json; charset=utf-8").send(document));
  };
}
