import { existsSync, readFileSync } from "node:fs";
import { z } from "zod";
import { ERROR_CATALOGUE, type ErrorCode } from "../src/index.js";
import { idempotencyKey, ref, type Operation, type Success } from "./operation.js";
import { OPERATIONS } from "./operations.js";
import { errorCatalogue, schemas } from "./schemas.js";

/**
 * The OpenAPI 3.1 document of the gateway (decisions §8: served at /api/v1/openapi.json).
 *
 * Bodies come from the zod schemas of gateway/schemas.ts, emitted once as JSON Schema
 * draft 2020-12 under `components.schemas`. Operations are the routes' own declarations
 * (gateway/operations.ts lists them; each is declared once, beside its handler), with every
 * status the route can answer: the success answers, and for each error status the
 * catalogue codes it can carry (in the response's description and, machine-readably, in
 * its `x-error-codes`). The root's `x-error-codes` is the whole catalogue of
 * src/errors.ts. test/integration/openapi.test.ts checks the operations against the
 * routes Fastify registered and validates real answers against them.
 */

export { OPERATIONS };

const STATUS_TEXT: Record<number, string> = {
  400: "Invalid request",
  401: "Missing, invalid or revoked API key",
  403: "Missing scope or permission",
  404: "Not found in the authorized workspace",
  408: "The upload ran too long",
  409: "Conflict with the runtime state or an earlier request",
  410: "Gone",
  413: "Payload exceeds a supported limit",
  429: "Rate limit exceeded",
  500: "Internal failure",
  502: "Upstream unavailable",
  503: "Temporarily unavailable; retry after Retry-After",
};

/** The error codes an operation can answer, by status: its own plus those of auth, rate limits and bodies. */
export function errorCodesOf(op: Operation): Map<number, ErrorCode[]> {
  const codes = new Map<number, Set<ErrorCode>>();
  const add = (status: number, list: readonly ErrorCode[]) => {
    let set = codes.get(status);
    if (!set) codes.set(status, (set = new Set()));
    for (const code of list) set.add(code);
  };
  if (op.scope !== "public") {
    add(401, ["unauthorized"]);
    add(403, ["permission_denied"]);
    if (op.rate !== "exempt") add(429, ["rate_limited"]);
    add(500, ["internal_error"]);
    add(503, ["runtime_unavailable"]);
  }
  if (op.body) add(400, ["invalid_request"]);
  if (op.body) add(413, ["payload_too_large"]);
  if (op.idempotencyKey) add(400, ["invalid_request"]);
  for (const [status, list] of Object.entries(op.errors ?? {})) add(Number(status), list ?? []);
  return new Map([...codes].sort(([a], [b]) => a - b).map(([status, set]) => [status, [...set]]));
}

const RATE_HEADERS = {
  "X-RateLimit-Limit": { $ref: "#/components/headers/X-RateLimit-Limit" },
  "X-RateLimit-Remaining": { $ref: "#/components/headers/X-RateLimit-Remaining" },
  "X-RateLimit-Reset": { $ref: "#/components/headers/X-RateLimit-Reset" },
};

function headersFor(op: Operation, status: number, success?: Success): Record<string, unknown> | undefined {
  const headers: Record<string, unknown> = {};
  // Authentication comes before the rate limiter (no workspace is known yet), so 401 carries no rate headers.
  if (op.scope !== "public" && status !== 401) Object.assign(headers, RATE_HEADERS);
  if (!success && (status === 429 || status === 503)) headers["Retry-After"] = { $ref: "#/components/headers/Retry-After" };
  if (success?.location) headers.Location = { $ref: "#/components/headers/Location" };
  return Object.keys(headers).length ? headers : undefined;
}

function successResponse(op: Operation, status: number, success: Success): Record<string, unknown> {
  const content: Record<string, unknown> = {};
  if (success.json === "__openapi") content["application/json"] = { schema: { type: "object" } };
  else if (success.json) content["application/json"] = { schema: ref(success.json) };
  if (success.sse) {
    content["text/event-stream"] = {
      schema: { type: "string", description: "Frames `id: <event id>\\nevent: <type>\\ndata: <Event JSON>\\n\\n`; `: ping` comments; `event: error` with an Error body before closing on a late error." },
      "x-event-schema": ref("Event"),
    };
  }
  if (success.text) content[success.text] = { schema: { type: "string" } };
  const response: Record<string, unknown> = { description: success.description, content };
  const headers = headersFor(op, status, success);
  if (headers) response.headers = headers;
  return response;
}

function errorResponse(op: Operation, status: number, codes: ErrorCode[]): Record<string, unknown> {
  const response: Record<string, unknown> = {
    description: `${STATUS_TEXT[status] ?? "Error"}. Codes: ${codes.join(", ")}.`,
    content: { "application/json": { schema: ref("Error") } },
    "x-error-codes": codes,
  };
  const headers = headersFor(op, status);
  if (headers) response.headers = headers;
  return response;
}

function operationObject(op: Operation): Record<string, unknown> {
  const parameters = [...(op.parameters ?? [])];
  if (op.idempotencyKey) parameters.push(idempotencyKey);
  const out: Record<string, unknown> = {
    operationId: op.operationId,
    summary: op.summary,
    tags: [op.tag],
  };
  const notes = [op.description, op.scope === "public" ? "Public: no API key." : `Scope: ${op.scope}.`];
  if (op.rate === "exempt") notes.push("Never rate limited.");
  if (op.rate === "expensive") notes.push("Counts against the lower limit of expensive operations too.");
  out.description = notes.filter(Boolean).join(" ");
  if (op.scope === "public") out.security = [];
  else out["x-required-scope"] = op.scope;
  if (parameters.length) out.parameters = parameters;
  if (op.body) {
    const contentType = op.body.multipart ? "multipart/form-data" : "application/json";
    const media: Record<string, unknown> = { schema: ref(op.body.schema) };
    if (op.body.multipart) media.encoding = { file: { contentType: "application/octet-stream" } };
    out.requestBody = { required: op.body.required, content: { [contentType]: media } };
  }
  const responses: Record<string, unknown> = {};
  for (const [status, success] of Object.entries(op.success)) responses[status] = successResponse(op, Number(status), success);
  for (const [status, codes] of errorCodesOf(op)) responses[String(status)] = errorResponse(op, status, codes);
  out.responses = Object.fromEntries(Object.entries(responses).sort(([a], [b]) => Number(a) - Number(b)));
  return out;
}

/** components.schemas from the zod registry, as draft 2020-12 JSON Schema. */
export function componentSchemas(): Record<string, Record<string, unknown>> {
  const generated = z.toJSONSchema(schemas, {
    target: "draft-2020-12",
    io: "output",
    uri: (id) => `#/components/schemas/${id}`,
  }) as { schemas: Record<string, Record<string, unknown>> };
  const out: Record<string, Record<string, unknown>> = {};
  for (const [name, schema] of Object.entries(generated.schemas)) {
    // Each registered schema comes out as its own document; inside components they are plain schemas.
    const { $schema: _schema, $id: _id, ...rest } = schema;
    out[name] = rest;
  }
  return out;
}

function packageVersion(): string {
  for (const candidate of ["../package.json", "../../package.json"]) {
    const url = new URL(candidate, import.meta.url);
    if (!existsSync(url)) continue;
    const pkg = JSON.parse(readFileSync(url, "utf8")) as { name?: string; version?: string };
    if (pkg.name === "runs" && pkg.version) return pkg.version;
  }
  return "0.0.0";
}

/** Builds the document (pure apart from reading package.json's version). */
export function buildOpenApiDocument(): Record<string, unknown> {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const op of OPERATIONS) (paths[op.path] ??= {})[op.method] = operationObject(op);
  return {
    openapi: "3.1.0",
    jsonSchemaDialect: "https://json-schema.org/draft/2020-12/schema",
    info: {
      title: "Runs API",
      version: packageVersion(),
      description:
        "Durable AI agent runs behind a REST API. Authenticate with Authorization: Bearer <API_KEY>; every resource is scoped to the key's workspace. Rate limits are per workspace across keys: authenticated answers carry X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset (not 401, which is answered before the workspace is known); 429 and 503 carry Retry-After. Response objects list every field the service sends; new event types, event data fields and turn error codes may appear.",
    },
    servers: [{ url: "/" }],
    security: [{ bearer: [] }],
    tags: ["runs", "events", "agents", "api-keys", "files", "environment-values", "operations"].map((name) => ({ name })),
    paths,
    components: {
      securitySchemes: { bearer: { type: "http", scheme: "bearer", description: "An API key: rk_live_…" } },
      schemas: componentSchemas(),
      headers: {
        "X-RateLimit-Limit": { description: "The governing limit (requests per window).", required: true, schema: { type: "integer", minimum: 0 } },
        "X-RateLimit-Remaining": { description: "Requests left in the window.", required: true, schema: { type: "integer", minimum: 0 } },
        "X-RateLimit-Reset": { description: "Unix seconds when the window resets.", required: true, schema: { type: "integer", minimum: 0 } },
        "Retry-After": { description: "Seconds to wait before retrying (1 to 3 for runtime_unavailable).", required: true, schema: { type: "integer", minimum: 0 } },
        Location: { description: "/api/v1/runs/{runId}?turn_id={turnId}: where to read the turn.", required: true, schema: { type: "string" } },
      },
    },
    "x-error-codes": errorCatalogue(),
  };
}

/** Codes of the catalogue, for tests that walk it. */
export const CATALOGUED_CODES = Object.keys(ERROR_CATALOGUE) as ErrorCode[];
