/**
 * One declaration per route: what the route is (method, path, scope, rate class,
 * Idempotency-Key, parameters, body and answers) is written once, next to its handler
 * in gateway/routes/, as an {@link Operation}. {@link route} registers the handler with
 * Fastify from it (URL and the `config` the auth and rate-limit hooks read), and
 * gateway/openapi.ts builds the OpenAPI document from the same objects.
 */
import type { FastifyInstance, RouteGenericInterface, RouteHandlerMethod } from "fastify";
import { ENV_NAME_PATTERN, type ErrorCode } from "../src/index.js";

export type Method = "get" | "post" | "put" | "delete";
export type SchemaName = string;

export interface Parameter {
  name: string;
  in: "path" | "query" | "header";
  required?: boolean;
  description?: string;
  schema: Record<string, unknown>;
  style?: string;
  explode?: boolean;
}

export interface Success {
  description: string;
  /** JSON body schema (a components.schemas name). */
  json?: SchemaName;
  /** The answer may instead be a Server-Sent Events stream of Event objects. */
  sse?: boolean;
  /** A plain-text body (Prometheus metrics). */
  text?: string;
  /** Sets Location: /api/v1/runs/{runId}?turn_id={turnId}. */
  location?: boolean;
}

export interface Operation {
  method: Method;
  path: string;
  operationId: string;
  summary: string;
  description?: string;
  tag: string;
  /** Required scope, or `public` (no key, no rate limit). */
  scope: string | "public";
  rate?: "exempt" | "expensive";
  idempotencyKey?: boolean;
  parameters?: Parameter[];
  body?: { schema: SchemaName; required: boolean; multipart?: boolean };
  success: Record<number, Success>;
  /** Fastify's URL when it differs from `path` (a wildcard for names that may hold `/`). */
  url?: string;
  /** Error codes by status, beyond the ones every authenticated route or body can answer. */
  errors?: Partial<Record<number, ErrorCode[]>>;
}

export const ref = (name: SchemaName) => ({ $ref: `#/components/schemas/${name}` });

export const path = (name: string, description: string, schema: Record<string, unknown> = { type: "string" }): Parameter => ({
  name,
  in: "path",
  required: true,
  description,
  schema,
});
export const query = (name: string, description: string, schema: Record<string, unknown> = { type: "string" }): Parameter => ({
  name,
  in: "query",
  description,
  schema,
});
export const limit = (max: number, fallback: number) => query("limit", `Page size, 1 to ${max}.`, { type: "integer", minimum: 1, maximum: max, default: fallback });
export const after = query("after", "Cursor: next_cursor of the previous page (opaque). A cursor of another list: 400 invalid_cursor.");

export const runId = path("runId", "Run id (`run_…`).");
export const turnId = path("turnId", "Turn id (`turn_…`).");
export const agentId = path("agentId", "Agent id (`agt_…`).");
export const version = path("version", "Deployment version.", { type: "integer", minimum: 1 });
export const keyId = path("keyId", "API key id.", { type: "string", format: "uuid" });
export const fileId = path("fileId", "File id (`file_…`).");
export const envName = path("name", "Environment value name.", { type: "string", pattern: ENV_NAME_PATTERN.source });

export const idempotencyKey: Parameter = {
  name: "Idempotency-Key",
  in: "header",
  required: true,
  description:
    "1 to 255 printable ASCII characters; missing or malformed: 400 invalid_request, param Idempotency-Key. A retry with the same key returns the first answer; the same key with a different request: 409.",
  schema: { type: "string", minLength: 1, maxLength: 255, pattern: "^[\\x20-\\x7E]+$" },
};

export const RUN_READS: Partial<Record<number, ErrorCode[]>> = { 404: ["run_not_found"], 410: ["run_expired"] };

/** A path in OpenAPI form (`/runs/{runId}`) in Fastify's (`/runs/:runId`). */
export function fastifyUrl(op: Pick<Operation, "path" | "url">): string {
  return op.url ?? op.path.replace(/\{([^}]+)\}/g, ":$1");
}

/** Registers `handler` as the route `op` declares. */
export function route<G extends RouteGenericInterface = RouteGenericInterface>(
  app: FastifyInstance,
  op: Operation,
  handler: RouteHandlerMethod<never, never, never, G>,
): void {
  app.route<G>({
    method: op.method.toUpperCase() as "GET" | "POST" | "PUT" | "DELETE",
    url: fastifyUrl(op),
    config: op.scope === "public" ? { public: true } : { scope: op.scope, ...(op.rate ? { rate: op.rate } : {}) },
    handler: handler as never,
  });
}
