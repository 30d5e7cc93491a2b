import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { ApiError, decodeCursor, encodeCursor, type EnvValueEntry, envValueNotFound, invalid, list, parseLimit, parseWith, unixSeconds } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { requireScope } from "../auth.js";
import { RateClass } from "../rate-limits.js";
import { type Operation, route, query, limit, after, envName } from "../operation.js";

// The name is taken with a wildcard, not a `:name` parameter: Fastify answers 414 for a
// parameter longer than its maxParamLength (100), and names may be 128 characters. A
// name containing "/" fails the name pattern like any other bad name.
const ONE = "/api/v1/environment-values/*";
type NameParams = { Params: { "*": string } };

const PutBodySchema = z.object({ value: z.unknown() }).strict();

export function renderEnvValue(entry: EnvValueEntry) {
  const out: Record<string, unknown> = {
    object: "environment_value",
    name: entry.name,
    created_at: unixSeconds(entry.created_at),
    updated_at: unixSeconds(entry.updated_at),
  };
  if (entry.value !== undefined) out.value = entry.value;
  return out;
}

function parseReveal(raw: unknown): boolean {
  if (raw === undefined || raw === "false") return false;
  if (raw === "true") return true;
  throw invalid("reveal", "reveal must be true or false.");
}

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const ENV_VALUE_OPERATIONS = {
  putEnvironmentValue: {
    method: "put",
    path: "/api/v1/environment-values/{name}",
    operationId: "putEnvironmentValue",
    // Names may hold characters a path parameter would not match whole.
    url: ONE,
    summary: "Create or replace an environment value",
    description: "Encrypted at rest; how provider credentials reach agents.",
    tag: "environment-values",
    scope: "env_vars:write",
    parameters: [envName],
    body: { schema: "EnvironmentValuePutRequest", required: true },
    success: { 200: { description: "The value's name and timestamps (never the value).", json: "EnvironmentValue" } },
  },
  listEnvironmentValues: {
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
  getEnvironmentValue: {
    method: "get",
    path: "/api/v1/environment-values/{name}",
    operationId: "getEnvironmentValue",
    url: ONE,
    summary: "Retrieve an environment value",
    description: "The value only with reveal=true, which also requires the scope env_vars:reveal (else 403).",
    tag: "environment-values",
    scope: "env_vars:read",
    parameters: [envName, query("reveal", "true: include value (scope env_vars:reveal).", { type: "string", enum: ["true", "false"] })],
    success: { 200: { description: "The value's name and timestamps, and value when revealed.", json: "EnvironmentValue" } },
    errors: { 400: ["invalid_request"], 404: ["not_found"] },
  },
  deleteEnvironmentValue: {
    method: "delete",
    path: "/api/v1/environment-values/{name}",
    operationId: "deleteEnvironmentValue",
    url: ONE,
    summary: "Delete an environment value",
    tag: "environment-values",
    scope: "env_vars:write",
    parameters: [envName],
    success: { 200: { description: "Deleted.", json: "EnvironmentValueDeleted" } },
    errors: { 400: ["invalid_request"], 404: ["not_found"] },
  },
} satisfies Record<string, Operation>;

/**
 * Environment values (decisions §3), scopes env_vars:read / env_vars:write, and
 * env_vars:reveal for `?reveal=true`.
 */
export function envValueRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    const store = ctx.envValues;

    route<NameParams>(app, ENV_VALUE_OPERATIONS.putEnvironmentValue, async (request) => {
      const auth = authOf(request);
      const body = parseWith(PutBodySchema, request.body);
      if (body.value === undefined) throw invalid("value", "value is required.");
      return renderEnvValue(await store.put(auth.workspace._id, request.params["*"], body.value));
    });

    route<{ Querystring: { limit?: string; after?: string } }>(app, ENV_VALUE_OPERATIONS.listEnvironmentValues,
      async (request) => {
        const auth = authOf(request);
        const limit = parseLimit(request.query.limit, 20, 100);
        const after = request.query.after === undefined ? undefined : decodeCursor(request.query.after, "env_values", auth.workspace._id);
        const entries = await store.list(auth.workspace._id, limit + 1, after?.k);
        const page = entries.slice(0, limit);
        const last = page[page.length - 1];
        const next = last ? encodeCursor({ s: "env_values", o: auth.workspace._id, k: last.name, id: last.name }) : null;
        return list(page.map(renderEnvValue), entries.length > limit, next);
      },
    );

    route<NameParams & { Querystring: { reveal?: string } }>(app, ENV_VALUE_OPERATIONS.getEnvironmentValue,
      async (request, reply) => {
        const auth = authOf(request);
        const reveal = parseReveal(request.query.reveal);
        if (reveal) {
          requireScope(auth, "env_vars:reveal");
          // Revealing is an expensive operation (decisions §7), on top of the standard
          // limit the request already passed; only known when the query is read.
          const decision = await ctx.rateLimiter.take(auth.workspace._id, auth.workspace.plan, RateClass.expensive);
          if (!decision.allowed) {
            reply.header("x-ratelimit-limit", String(decision.limit));
            reply.header("x-ratelimit-remaining", String(decision.remaining));
            reply.header("x-ratelimit-reset", String(decision.resetS));
            throw new ApiError("rate_limited", { retryAfterS: decision.retryAfterS, message: `Revealing values is limited to ${decision.limit} per window. Retry after ${decision.retryAfterS} s.` });
          }
        }
        const entry = await store.get(auth.workspace._id, request.params["*"], reveal);
        if (!entry) throw envValueNotFound(request.params["*"]);
        return renderEnvValue(entry);
      },
    );

    route<NameParams>(app, ENV_VALUE_OPERATIONS.deleteEnvironmentValue, async (request) => {
      const auth = authOf(request);
      const name = request.params["*"];
      if (!(await store.delete(auth.workspace._id, name))) throw envValueNotFound(name);
      return { name, object: "environment_value.deleted", deleted: true };
    });
  };
}
