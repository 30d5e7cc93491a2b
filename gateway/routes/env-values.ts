import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { ApiError, decodeCursor, encodeCursor, type EnvValueEntry, envValueNotFound, list, queryFlag, unixSeconds } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { requireScope } from "../auth.js";
import { RateClass } from "../rate-limits.js";
import { type Operation, page, route, envName } from "../operation.js";
import { EnvValueDeletedSchema, EnvValueListSchema, EnvValuePutRequestSchema, EnvValueSchema } from "../schemas.js";

// The name is taken with a wildcard (operation.ts, envName). A name containing "/" fails
// the name pattern like any other bad name.
const ONE = "/api/v1/environment-values/*";
const NameParams = z.object(envName);

export function renderEnvValue(entry: EnvValueEntry) {
  const out = {
    object: "environment_value" as const,
    name: entry.name,
    created_at: unixSeconds(entry.created_at),
    updated_at: unixSeconds(entry.updated_at),
  };
  return entry.value === undefined ? out : { ...out, value: entry.value };
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
    params: NameParams,
    body: { schema: EnvValuePutRequestSchema, required: true },
    success: { 200: { description: "The value's name and timestamps (never the value).", json: EnvValueSchema } },
  },
  listEnvironmentValues: {
    method: "get",
    path: "/api/v1/environment-values",
    operationId: "listEnvironmentValues",
    summary: "List environment values",
    tag: "environment-values",
    scope: "env_vars:read",
    query: z.object(page(100, 20)),
    success: { 200: { description: "Names and timestamps.", json: EnvValueListSchema } },
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
    params: NameParams,
    query: z.object({ reveal: queryFlag().describe("true: include value (scope env_vars:reveal).") }),
    success: { 200: { description: "The value's name and timestamps, and value when revealed.", json: EnvValueSchema } },
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
    params: NameParams,
    success: { 200: { description: "Deleted.", json: EnvValueDeletedSchema } },
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

    route(app, ENV_VALUE_OPERATIONS.putEnvironmentValue, async (request) => {
      const auth = authOf(request);
      return renderEnvValue(await store.put(auth.workspace._id, request.params["*"], request.body.value));
    });

    route(app, ENV_VALUE_OPERATIONS.listEnvironmentValues,
      async (request) => {
        const auth = authOf(request);
        const limit = request.query.limit;
        const after = request.query.after === undefined ? undefined : decodeCursor(request.query.after, "env_values", auth.workspace._id);
        const entries = await store.list(auth.workspace._id, limit + 1, after?.k);
        const page = entries.slice(0, limit);
        const last = page[page.length - 1];
        const next = last ? encodeCursor({ s: "env_values", o: auth.workspace._id, k: last.name, id: last.name }) : null;
        return list(page.map(renderEnvValue), entries.length > limit, next);
      },
    );

    route(app, ENV_VALUE_OPERATIONS.getEnvironmentValue,
      async (request, reply) => {
        const auth = authOf(request);
        const reveal = request.query.reveal;
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

    route(app, ENV_VALUE_OPERATIONS.deleteEnvironmentValue, async (request) => {
      const auth = authOf(request);
      const name = request.params["*"];
      if (!(await store.delete(auth.workspace._id, name))) throw envValueNotFound(name);
      return { name, object: "environment_value.deleted" as const, deleted: true as const };
    });
  };
}
