import { existsSync, readFileSync } from "node:fs";
import { z } from "zod";
import { ENV_NAME_PATTERN, ERROR_CATALOGUE, type ErrorCode, MAX_TAG_FILTERS } from "../src/index.js";
import { errorCatalogue, schemas } from "./schemas.js";

/**
 * The OpenAPI 3.1 document of the gateway (decisions §8: served at /api/v1/openapi.json).
 *
 * Bodies come from the zod schemas of gateway/schemas.ts, emitted once as JSON Schema
 * draft 2020-12 under `components.schemas`. Operations are listed below by hand, one entry
 * per route the gateway registers, with every status the route can answer: the success
 * answers, and for each error status the catalogue codes it can carry (in the response's
 * description and, machine-readably, in its `x-error-codes`). The root's `x-error-codes`
 * is the whole catalogue of src/errors.ts. test/integration/openapi.test.ts checks the
 * operations against the routes Fastify registered and validates real answers against them.
 */

type Method = "get" | "post" | "put" | "delete";
type SchemaName = string;

interface Parameter {
  name: string;
  in: "path" | "query" | "header";
  required?: boolean;
  description?: string;
  schema: Record<string, unknown>;
  style?: string;
  explode?: boolean;
}

interface Success {
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

interface Operation {
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
  /** Error codes by status, beyond the ones every authenticated route or body can answer. */
  errors?: Partial<Record<number, ErrorCode[]>>;
}

const ref = (name: SchemaName) => ({ $ref: `#/components/schemas/${name}` });

const path = (name: string, description: string, schema: Record<string, unknown> = { type: "string" }): Parameter => ({
  name,
  in: "path",
  required: true,
  description,
  schema,
});
const query = (name: string, description: string, schema: Record<string, unknown> = { type: "string" }): Parameter => ({
  name,
  in: "query",
  description,
  schema,
});
const limit = (max: number, fallback: number) => query("limit", `Page size, 1 to ${max}.`, { type: "integer", minimum: 1, maximum: max, default: fallback });
const after = query("after", "Cursor: next_cursor of the previous page (opaque). A cursor of another list: 400 invalid_cursor.");

const runId = path("runId", "Run id (`run_…`).");
const turnId = path("turnId", "Turn id (`turn_…`).");
const agentId = path("agentId", "Agent id (`agt_…`).");
const version = path("version", "Deployment version.", { type: "integer", minimum: 1 });
const keyId = path("keyId", "API key id.", { type: "string", format: "uuid" });
const fileId = path("fileId", "File id (`file_…`).");
const envName = path("name", "Environment value name.", { type: "string", pattern: ENV_NAME_PATTERN.source });

const idempotencyKey: Parameter = {
  name: "Idempotency-Key",
  in: "header",
  required: true,
  description:
    "1 to 255 printable ASCII characters; missing or malformed: 400 invalid_request, param Idempotency-Key. A retry with the same key returns the first answer; the same key with a different request: 409.",
  schema: { type: "string", minLength: 1, maxLength: 255, pattern: "^[\\x20-\\x7E]+$" },
};

const RUN_READS: Partial<Record<number, ErrorCode[]>> = { 404: ["run_not_found"], 410: ["run_expired"] };

/** Every route the gateway serves. */
export const OPERATIONS: Operation[] = [
  // ----- runs
  {
    method: "post",
    path: "/api/v1/runs",
    operationId: "createRun",
    summary: "Start a run or continue one",
    description:
      "Exactly one of agent (start) and run_id (continue). Default delivery waits up to 120 s for the turn: 200 when it is final, else 202 with Location. background: 202 after admission. stream: a Server-Sent Events stream of the turn's events ending after the event that makes it final.",
    tag: "runs",
    scope: "run:write",
    idempotencyKey: true,
    body: { schema: "RunRequest", required: true },
    success: {
      200: { description: "The turn is final (or, with stream: true, the event stream).", json: "Run", sse: true },
      202: { description: "The turn is admitted and not final yet (or background: true). Read the Location until turn.status is final.", json: "Run", location: true },
    },
    errors: {
      404: ["agent_not_found", "agent_version_not_found", "run_not_found"],
      409: ["agent_version_not_ready", "idempotency_conflict", "steering_target_ended", "run_busy"],
      410: ["run_expired"],
      503: ["event_history_unavailable"],
    },
  },
  {
    method: "get",
    path: "/api/v1/runs",
    operationId: "listRuns",
    summary: "List runs",
    tag: "runs",
    scope: "run:read",
    parameters: [
      query("agent_id", "Runs of one agent."),
      query("version", "Runs with at least one turn on this deployment version.", { type: "integer", minimum: 1 }),
      query("state", "idle or busy runs.", { type: "string", enum: ["idle", "busy"] }),
      {
        name: "tag",
        in: "query",
        description: `Runs carrying every given tag (exact, case-sensitive); up to ${MAX_TAG_FILTERS} times. A filter of only common tags that cannot fill a page within the scan limit: 400 invalid_request, param tag.`,
        schema: { type: "array", items: ref("Tag"), maxItems: MAX_TAG_FILTERS },
        style: "form",
        explode: true,
      },
      query("created_after", "Runs created at or after this Unix time (seconds).", { type: "integer", minimum: 0 }),
      query("created_before", "Runs created at or before this Unix time (seconds).", { type: "integer", minimum: 0 }),
      limit(100, 20),
      after,
    ],
    success: { 200: { description: "Run summaries, most recent activity first.", json: "RunList" } },
    errors: { 400: ["invalid_request", "invalid_cursor"] },
  },
  {
    method: "get",
    path: "/api/v1/runs/{runId}",
    operationId: "getRun",
    summary: "Retrieve a run with one turn",
    tag: "runs",
    scope: "run:read",
    parameters: [runId, query("turn_id", "Select this turn (default the latest).")],
    success: { 200: { description: "The run with the selected turn.", json: "Run" } },
    errors: { 400: ["invalid_request"], 404: ["run_not_found", "turn_not_found"], 410: ["run_expired"] },
  },
  {
    method: "delete",
    path: "/api/v1/runs/{runId}",
    operationId: "deleteRun",
    summary: "Delete an idle run",
    description: "Fences new work; events, files and workspace are removed asynchronously; later reads are 404. A busy run: 409 run_busy.",
    tag: "runs",
    scope: "run:write",
    idempotencyKey: true,
    parameters: [runId],
    success: { 200: { description: "Deleted.", json: "RunDeleted" } },
    errors: { 400: ["invalid_request"], ...RUN_READS, 409: ["run_busy", "idempotency_conflict"] },
  },
  {
    method: "post",
    path: "/api/v1/runs/{runId}/cancel",
    operationId: "cancelRun",
    summary: "Cancel the active, queued or named turn",
    description:
      "Active turn: 202 with the turn cancelling. Queued turn: 200 cancelled. Finished turn or idle run: 200 with the existing result. Never rate limited.",
    tag: "runs",
    scope: "run:write",
    rate: "exempt",
    idempotencyKey: true,
    parameters: [runId],
    body: { schema: "CancelRequest", required: false },
    success: {
      200: { description: "The run as a retrieval returns it, the selected turn cancelled or already final.", json: "Run" },
      202: { description: "The run with the selected turn cancelling while the runtime settles.", json: "Run" },
    },
    errors: { 404: ["run_not_found", "turn_not_found"], 409: ["idempotency_conflict"], 410: ["run_expired"] },
  },
  {
    method: "post",
    path: "/api/v1/runs/{runId}/tags",
    operationId: "updateRunTags",
    summary: "Add and remove tags",
    description: "Set semantics; no Idempotency-Key. Does not extend retention.",
    tag: "runs",
    scope: "run:write",
    parameters: [runId],
    body: { schema: "TagsRequest", required: true },
    success: { 200: { description: "The run's full tag list.", json: "RunTags" } },
    errors: RUN_READS,
  },
  {
    method: "get",
    path: "/api/v1/runs/{runId}/turns",
    operationId: "listTurns",
    summary: "Turn history",
    tag: "runs",
    scope: "run:read",
    parameters: [runId, limit(100, 20), after],
    success: { 200: { description: "Turns, oldest first, queued and running ones included.", json: "TurnList" } },
    errors: { 400: ["invalid_request", "invalid_cursor"], ...RUN_READS },
  },
  {
    method: "get",
    path: "/api/v1/runs/{runId}/turns/{turnId}",
    operationId: "getTurn",
    summary: "One turn",
    tag: "runs",
    scope: "run:read",
    parameters: [runId, turnId],
    success: { 200: { description: "The turn.", json: "Turn" } },
    errors: { 404: ["run_not_found", "turn_not_found"], 410: ["run_expired"] },
  },
  {
    method: "get",
    path: "/api/v1/runs/{runId}/events",
    operationId: "listRunEvents",
    summary: "Retained events, as a page or a Server-Sent Events stream",
    description:
      "stream=true answers text/event-stream: `id: <event id>`, `event: <type>`, `data: <Event JSON>`, a blank line; `: ping` every 15 s; an error after the stream began is `event: error` with the Error body. With turn_id the stream ends after the turn's final platform event. Resume with Last-Event-ID (wins over after).",
    tag: "events",
    scope: "run:read",
    parameters: [
      runId,
      query("turn_id", "Only this turn's events."),
      query("after", "Event cursor (an event id); an event no longer retained: 410 event_cursor_expired; another run's: 400 invalid_cursor."),
      limit(1000, 100),
      query("stream", "true: a Server-Sent Events stream.", { type: "string", enum: ["true", "false"] }),
      { name: "Last-Event-ID", in: "header", description: "Stream resume cursor (an event id).", schema: { type: "string" } },
    ],
    success: { 200: { description: "A page of events with history, or with stream=true the event stream.", json: "EventList", sse: true } },
    errors: {
      400: ["invalid_request", "invalid_cursor"],
      404: ["run_not_found", "turn_not_found"],
      410: ["run_expired", "event_cursor_expired"],
      503: ["event_boundary_pending", "event_history_unavailable"],
    },
  },
  // ----- agents, deployments, models
  {
    method: "get",
    path: "/api/v1/models",
    operationId: "listModels",
    summary: "Models an agent config may name",
    tag: "agents",
    scope: "models:read",
    success: { 200: { description: "The registry's models plus faux/scripted.", json: "ModelList" } },
  },
  {
    method: "post",
    path: "/api/v1/agents",
    operationId: "createAgent",
    summary: "Create an agent",
    tag: "agents",
    scope: "agents:write",
    body: { schema: "AgentCreateRequest", required: true },
    success: { 201: { description: "The agent (no active version yet).", json: "Agent" } },
  },
  {
    method: "get",
    path: "/api/v1/agents",
    operationId: "listAgents",
    summary: "List agents",
    tag: "agents",
    scope: "agents:read",
    parameters: [limit(100, 20), after],
    success: { 200: { description: "Agents.", json: "AgentList" } },
    errors: { 400: ["invalid_request", "invalid_cursor"] },
  },
  {
    method: "get",
    path: "/api/v1/agents/{agentId}",
    operationId: "getAgent",
    summary: "Retrieve an agent",
    tag: "agents",
    scope: "agents:read",
    parameters: [agentId],
    success: { 200: { description: "The agent.", json: "Agent" } },
    errors: { 404: ["agent_not_found"] },
  },
  {
    method: "post",
    path: "/api/v1/agents/{agentId}/deployments",
    operationId: "createDeployment",
    summary: "Deploy a configuration as the next version",
    description: "Answers at once with status building; the build makes it ready (activated when activate is true) or failed.",
    tag: "agents",
    scope: "agents:write",
    rate: "expensive",
    idempotencyKey: true,
    parameters: [agentId],
    body: { schema: "DeploymentRequest", required: true },
    success: { 201: { description: "The deployment.", json: "Deployment" } },
    errors: { 404: ["agent_not_found"], 409: ["idempotency_conflict"] },
  },
  {
    method: "get",
    path: "/api/v1/agents/{agentId}/deployments",
    operationId: "listDeployments",
    summary: "List an agent's deployments",
    description: "By version, oldest first; `limit` (1–100, default 20) and `after` (a `next_cursor`) page through them.",
    tag: "agents",
    scope: "agents:read",
    parameters: [agentId, limit(100, 20), after],
    success: { 200: { description: "Deployments, one page.", json: "DeploymentList" } },
    errors: { 400: ["invalid_request", "invalid_cursor"], 404: ["agent_not_found"] },
  },
  {
    method: "get",
    path: "/api/v1/agents/{agentId}/deployments/{version}",
    operationId: "getDeployment",
    summary: "Retrieve a deployment",
    tag: "agents",
    scope: "agents:read",
    parameters: [agentId, version],
    success: { 200: { description: "The deployment.", json: "Deployment" } },
    errors: { 400: ["invalid_request"], 404: ["agent_not_found", "agent_version_not_found"] },
  },
  {
    method: "post",
    path: "/api/v1/agents/{agentId}/deployments/{version}/activate",
    operationId: "activateDeployment",
    summary: "Make a version the agent's active one",
    description: "A building version becomes active when ready; a failed one: 409 agent_version_not_ready.",
    tag: "agents",
    scope: "agents:write",
    parameters: [agentId, version],
    success: { 200: { description: "The agent.", json: "Agent" } },
    errors: { 400: ["invalid_request"], 404: ["agent_not_found", "agent_version_not_found"], 409: ["agent_version_not_ready"] },
  },
  // ----- API keys
  {
    method: "post",
    path: "/api/v1/api-keys",
    operationId: "createApiKey",
    summary: "Create an API key",
    tag: "api-keys",
    scope: "api_keys:manage",
    rate: "expensive",
    body: { schema: "ApiKeyCreateRequest", required: true },
    success: { 201: { description: "The key with its one-time secret in key.", json: "ApiKey" } },
  },
  {
    method: "get",
    path: "/api/v1/api-keys",
    operationId: "listApiKeys",
    summary: "List API keys",
    tag: "api-keys",
    scope: "api_keys:manage",
    success: { 200: { description: "The workspace's keys, one page.", json: "ApiKeyList" } },
  },
  {
    method: "get",
    path: "/api/v1/api-keys/{keyId}",
    operationId: "getApiKey",
    summary: "Retrieve an API key",
    tag: "api-keys",
    scope: "api_keys:manage",
    parameters: [keyId],
    success: { 200: { description: "The key (no secret).", json: "ApiKey" } },
    errors: { 400: ["invalid_request"], 404: ["not_found"] },
  },
  {
    method: "post",
    path: "/api/v1/api-keys/{keyId}/revoke",
    operationId: "revokeApiKey",
    summary: "Revoke an API key",
    description: "Refused on every node within 5 seconds. Never rate limited; repeating it changes nothing.",
    tag: "api-keys",
    scope: "api_keys:manage",
    rate: "exempt",
    parameters: [keyId],
    success: { 200: { description: "The revoked key.", json: "ApiKey" } },
    errors: { 400: ["invalid_request"], 404: ["not_found"] },
  },
  ...(["/api/v1/api-keys/{keyId}/rotate", "/api-keys/{keyId}/rotate"] as const).map(
    (rotatePath, i): Operation => ({
      method: "post",
      path: rotatePath,
      operationId: i === 0 ? "rotateApiKey" : "rotateApiKeyUnversioned",
      summary: i === 0 ? "Rotate an API key" : "Rotate an API key (also served without /api/v1)",
      description: "Creates a replacement key and schedules revocation of the old one after gracePeriodSeconds (default 86400). A revoked key: 409 conflict.",
      tag: "api-keys",
      scope: "api_keys:manage",
      rate: "expensive",
      parameters: [keyId],
      body: { schema: "ApiKeyRotateRequest", required: true },
      success: { 201: { description: "The new key with its one-time secret and old_key_revokes_at.", json: "ApiKey" } },
      errors: { 404: ["not_found"], 409: ["conflict"] },
    }),
  ),
  // ----- files
  {
    method: "post",
    path: "/api/v1/files",
    operationId: "uploadFile",
    summary: "Upload a file for input_file",
    description:
      "A repeat after a finished upload returns the file unchanged; while the first still runs: 503 upload_in_progress with Retry-After; 409 conflict when the key was used for another file or its upload expired. At most 20 minutes (408 request_timeout) and 512 MiB (413).",
    tag: "files",
    scope: "files:write",
    idempotencyKey: true,
    body: { schema: "FileUploadRequest", required: true, multipart: true },
    success: { 201: { description: "The stored file.", json: "File" } },
    errors: { 408: ["request_timeout"], 409: ["conflict"], 503: ["upload_in_progress"] },
  },
  {
    method: "get",
    path: "/api/v1/files/{fileId}",
    operationId: "getFile",
    summary: "Retrieve a file's metadata",
    tag: "files",
    scope: "files:read",
    parameters: [fileId],
    success: { 200: { description: "The file.", json: "File" } },
    errors: { 404: ["not_found"] },
  },
  // ----- environment values
  {
    method: "put",
    path: "/api/v1/environment-values/{name}",
    operationId: "putEnvironmentValue",
    summary: "Create or replace an environment value",
    description: "Encrypted at rest; how provider credentials reach agents.",
    tag: "environment-values",
    scope: "env_vars:write",
    parameters: [envName],
    body: { schema: "EnvironmentValuePutRequest", required: true },
    success: { 200: { description: "The value's name and timestamps (never the value).", json: "EnvironmentValue" } },
  },
  {
    method: "get",
    path: "/api/v1/environment-values",
    operationId: "listEnvironmentValues",
    summary: "List environment values",
    tag: "environment-values",
    scope: "env_vars:read",
    parameters: [limit(100, 20), after],
    success: { 200: { description: "Names and timestamps.", json: "EnvironmentValueList" } },
    errors: { 400: ["invalid_request", "invalid_cursor"] },
  },
  {
    method: "get",
    path: "/api/v1/environment-values/{name}",
    operationId: "getEnvironmentValue",
    summary: "Retrieve an environment value",
    description: "The value only with reveal=true, which also requires the scope env_vars:reveal (else 403).",
    tag: "environment-values",
    scope: "env_vars:read",
    parameters: [envName, query("reveal", "true: include value (scope env_vars:reveal).", { type: "string", enum: ["true", "false"] })],
    success: { 200: { description: "The value's name and timestamps, and value when revealed.", json: "EnvironmentValue" } },
    errors: { 400: ["invalid_request"], 404: ["not_found"] },
  },
  {
    method: "delete",
    path: "/api/v1/environment-values/{name}",
    operationId: "deleteEnvironmentValue",
    summary: "Delete an environment value",
    tag: "environment-values",
    scope: "env_vars:write",
    parameters: [envName],
    success: { 200: { description: "Deleted.", json: "EnvironmentValueDeleted" } },
    errors: { 400: ["invalid_request"], 404: ["not_found"] },
  },
  // ----- operations
  {
    method: "get",
    path: "/api/v1/openapi.json",
    operationId: "getOpenApiDocument",
    summary: "This document",
    tag: "operations",
    scope: "public",
    success: { 200: { description: "The OpenAPI 3.1 document.", json: "__openapi" } },
  },
  {
    method: "get",
    path: "/healthz",
    operationId: "healthz",
    summary: "Liveness",
    tag: "operations",
    scope: "public",
    success: { 200: { description: "The process is alive.", json: "Health" } },
  },
  {
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
  {
    method: "get",
    path: "/metrics",
    operationId: "metrics",
    summary: "Prometheus metrics",
    tag: "operations",
    scope: "public",
    success: { 200: { description: "Prometheus text exposition format (Content-Type: text/plain; version=0.0.4).", text: "text/plain" } },
  },
];

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
