import { existsSync, readFileSync } from "node:fs";
import { z } from "zod";
import { ERROR_CATALOGUE, type ErrorCode } from "../src/index.js";
import { idempotencyKey, ref, type Operation, type Parameter, type Success } from "./operation.js";
import { OPERATIONS } from "./operations.js";
import { errorCatalogue, schemas } from "./schemas.js";

/**
 * The OpenAPI 3.1 document of the gateway (decisions §8: served at /api/v1/openapi.json).
 *
 * Bodies come from the zod schemas of gateway/schemas.ts, emitted once as JSON Schema
 * draft 2020-12 under `components.schemas`. Operations are the routes' own declarations
 * (gateway/operations.ts lists them; each is declared once, beside its handler): their
 * parameters are the fields of the path and query schemas the routes validate with, and
 * they list every status the route can answer: the success answers, and for each error status the
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
  408: "The request's body did not arrive in time (an upload: it ran too long)",
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
    add(429, ["rate_limited"]);
    add(500, ["internal_error"]);
    add(503, ["runtime_unavailable"]);
  }
  if (op.body) add(400, ["invalid_request"]);
  if (op.body) add(413, ["payload_too_large"]);
  // A body not whole within RUNS_REQUEST_BODY_TIMEOUT_MS (an upload: within its own limit).
  if (op.body) add(408, ["request_timeout"]);
  if (op.idempotencyKey) add(400, ["invalid_request"]);
  // A path parameter whose percent-encoding is malformed is refused before any route.
  if (op.path.includes("{")) add(400, ["invalid_request"]);
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
  if (status === 401) headers["WWW-Authenticate"] = { $ref: "#/components/headers/WWW-Authenticate" };
  if (success?.location) headers.Location = { $ref: "#/components/headers/Location" };
  return Object.keys(headers).length ? headers : undefined;
}

function successResponse(op: Operation, status: number, success: Success): Record<string, unknown> {
  const content: Record<string, unknown> = {};
  if (success.json === "__openapi") content["application/json"] = { schema: { type: "object" } };
  else if (success.json) content["application/json"] = { schema: ref(nameOf(success.json)) };
  if (success.text) content[success.text] = { schema: { type: "string" } };
  const response: Record<string, unknown> = { description: success.description };
  if (Object.keys(content).length > 0) response.content = content;
  if (success.sse) {
    // The stream is not a second entry of `content`: generators (openapi-typescript with
    // openapi-fetch) would type the answer as JSON-or-string and the JSON fields would be
    // unreachable. Asked for with stream=true, it is read as a stream (openapi-fetch:
    // parseAs: "stream"); its media type is described here, in the shape of `content`.
    response.description = `${success.description} With stream=true the answer is text/event-stream instead (x-stream-content; a generated client reads it as a stream, e.g. openapi-fetch's parseAs: "stream").`;
    response["x-stream-content"] = {
      "text/event-stream": {
        schema: { type: "string", description: "Frames `id: <event id>\\nevent: <type>\\ndata: <Event JSON>\\n\\n`; `: ping` comments; `event: error` with an Error body before closing on a late error." },
        "x-event-schema": ref("Event"),
      },
    };
  }
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

/** The components.schemas name of a registered schema (a declaration naming an unregistered one is a mistake). */
function nameOf(schema: z.ZodType): string {
  const id = schemas.get(schema)?.id;
  if (!id) throw new Error("An operation names a body schema that gateway/schema-registry.ts does not register.");
  return id;
}

/** A request part's schema as a parameter's JSON Schema: what the handler receives (output), its description moved to the parameter. */
function parameterSchema(schema: z.ZodType): { schema: Record<string, unknown>; description?: string } {
  const { $schema: _s, description, ...rest } = z.toJSONSchema(schema, { target: "draft-2020-12", io: "output" }) as Record<string, unknown>;
  return description === undefined ? { schema: rest } : { schema: rest, description: String(description) };
}

/** The documented parameters of an operation: its path and query schemas field by field, then the headers it reads. */
export function parametersOf(op: Operation): Parameter[] {
  const out: Parameter[] = [];
  for (const [where, object] of [["path", op.params], ["query", op.query]] as const) {
    for (const [name, field] of Object.entries(object?.shape ?? {}) as [string, z.ZodType][]) {
      const { schema, description } = parameterSchema(field);
      // A wildcard (Fastify's "*") is documented under the name the path gives it.
      const documented = name === "*" ? (/\{([^}]+)\}$/.exec(op.path)?.[1] ?? name) : name;
      const required = where === "path" || !field.safeParse(undefined).success;
      out.push({
        name: documented,
        in: where,
        ...(required ? { required } : {}),
        ...(description === undefined ? {} : { description }),
        schema,
        ...(schema.type === "array" ? { style: "form", explode: true } : {}),
      });
    }
  }
  return [...out, ...(op.headers ?? [])];
}

function operationObject(op: Operation): Record<string, unknown> {
  const parameters = parametersOf(op);
  if (op.idempotencyKey) parameters.push(idempotencyKey);
  const out: Record<string, unknown> = {
    operationId: op.operationId,
    summary: op.summary,
    tags: [op.tag],
  };
  const notes = [op.description, op.scope === "public" ? "Public: no API key." : `Scope: ${op.scope}.`];
  if (op.rate === "exempt") notes.push("Not held back by the workspace's request limit: it has a budget of its own (RUNS_RATE_EXEMPT_*, by default ten times larger), which only a flood meets (429).");
  if (op.rate === "expensive") notes.push("Counts against the lower limit of expensive operations too.");
  out.description = notes.filter(Boolean).join(" ");
  if (op.scope === "public") out.security = [];
  else out["x-required-scope"] = op.scope;
  if (parameters.length) out.parameters = parameters;
  if (op.body) {
    const contentType = op.body.multipart ? "multipart/form-data" : "application/json";
    const media: Record<string, unknown> = { schema: ref(nameOf(op.body.schema)) };
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

/** The package's own manifest (beside the sources, or one folder up when built into dist/). */
function packageManifest(): { version?: string; license?: string } {
  for (const candidate of ["../package.json", "../../package.json"]) {
    const url = new URL(candidate, import.meta.url);
    if (!existsSync(url)) continue;
    const pkg = JSON.parse(readFileSync(url, "utf8")) as { name?: string; version?: string; license?: string };
    if (pkg.name === "runs") return pkg;
  }
  return {};
}

function packageVersion(): string {
  return packageManifest().version ?? "0.0.0";
}

function packageLicense(): string {
  return packageManifest().license ?? "UNLICENSED";
}

/** Builds the document (pure apart from reading package.json's version). */
/** The document's tags, in the order a reader meets them, with what each groups. */
const TAG_DESCRIPTIONS = {
  runs: "Start, continue, wait for, cancel, tag, list and delete runs; read a run's turns.",
  events: "A run's retained, encrypted event log: pages, or a Server-Sent Events stream that resumes from an event id.",
  agents: "Agents, their numbered deployments (model, instructions, tools) and which version is active; the model catalogue.",
  "api-keys": "Scoped, rotatable API keys of the workspace.",
  files: "Files uploaded once and given to turns as input.",
  "environment-values": "Encrypted values a deployment's tools and model credentials may read by name.",
  webhooks: "Signed deliveries (Standard Webhooks) when turns end and runs are deleted or expire, with a delivery log.",
  usage: "Tokens and cost of the workspace's turns, by day, agent, version or model; a monthly budget.",
  operations: "Liveness, readiness, metrics and this document; no key needed.",
  console: "The web console's page and files; the page calls the API with the key a person gives it.",
} as const;

export function buildOpenApiDocument(): Record<string, unknown> {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const op of OPERATIONS) (paths[op.path] ??= {})[op.method] = operationObject(op);
  return {
    openapi: "3.1.0",
    info: {
      title: "Runs API",
      version: packageVersion(),
      license: { name: packageLicense() },
      description:
        "Durable AI agent runs behind a REST API. Authenticate with Authorization: Bearer <API_KEY>; every resource is scoped to the key's workspace. Rate limits are per workspace across keys: authenticated answers carry X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset (not 401, which is answered before the workspace is known); 429 and 503 carry Retry-After. Response objects list every field the service sends; new event types, event data fields and turn error codes may appear. x-error-codes gives each code's usual retryable; an answer's own error.retryable decides (a version that failed to build is agent_version_not_ready, not retryable).",
    },
    servers: [{ url: "/" }],
    security: [{ bearer: [] }],
    tags: Object.entries(TAG_DESCRIPTIONS).map(([name, description]) => ({ name, description })),
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
        "WWW-Authenticate": { description: 'The scheme a key is sent with: Bearer realm="runs".', required: true, schema: { type: "string" } },
      },
    },
    "x-error-codes": errorCatalogue(),
  };
}

/** Codes of the catalogue, for tests that walk it. */
export const CATALOGUED_CODES = Object.keys(ERROR_CATALOGUE) as ErrorCode[];
