import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { ApiError, decodeCursor, encodeCursor, type EnvValueEntry, envValueNotFound, invalid, list, parseLimit, parseWith, unixSeconds } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { requireScope } from "../auth.js";
import { RateClass } from "../rate-limits.js";

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

/**
 * Environment values (decisions §3), scopes env_vars:read / env_vars:write, and
 * env_vars:reveal for `?reveal=true`.
 */
export function envValueRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    const store = ctx.envValues;

    app.put<NameParams>(ONE, { config: { scope: "env_vars:write" } }, async (request) => {
      const auth = authOf(request);
      const body = parseWith(PutBodySchema, request.body);
      if (body.value === undefined) throw invalid("value", "value is required.");
      return renderEnvValue(await store.put(auth.workspace._id, request.params["*"], body.value));
    });

    app.get<{ Querystring: { limit?: string; after?: string } }>(
      "/api/v1/environment-values",
      { config: { scope: "env_vars:read" } },
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

    app.get<NameParams & { Querystring: { reveal?: string } }>(
      ONE,
      { config: { scope: "env_vars:read" } },
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

    app.delete<NameParams>(ONE, { config: { scope: "env_vars:write" } }, async (request) => {
      const auth = authOf(request);
      const name = request.params["*"];
      if (!(await store.delete(auth.workspace._id, name))) throw envValueNotFound(name);
      return { name, object: "environment_value.deleted", deleted: true };
    });
  };
}
