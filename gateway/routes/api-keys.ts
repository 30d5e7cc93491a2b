import type { FastifyInstance, FastifyRequest } from "fastify";
import { z } from "zod";
import { ApiError, type ApiKeyDoc, invalid, keyIsUsable, list, newApiKey, parseWith, renderApiKey, scopeListProblem } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { type Operation, route, keyId } from "../operation.js";

export const DEFAULT_GRACE_PERIOD_S = 86_400;
export const MAX_GRACE_PERIOD_S = 604_800;

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

const Label = z.string().max(80).nullable();
const Scopes = z.array(z.string());

const CreateSchema = z.object({ label: Label.optional(), scopes: Scopes }).strict();
const RotateSchema = z
  .object({
    label: Label.optional(),
    scopes: Scopes.optional(),
    mode: z.string().optional(),
    gracePeriodSeconds: z.number().int().min(0).max(MAX_GRACE_PERIOD_S).optional(),
  })
  .strict();

function checkScopes(scopes: string[]): string[] {
  const problem = scopeListProblem(scopes);
  if (problem) throw invalid("scopes", problem);
  return scopes;
}

/**
 * A key may hand out only scopes it holds itself: `api_keys:manage` alone must not
 * mint a key with every scope (or rotate a stronger key into a copy it receives).
 */
function requireHeld(held: ReadonlySet<string>, scopes: readonly string[]): void {
  const missing = scopes.find((s) => !held.has(s));
  if (missing !== undefined) {
    throw new ApiError("permission_denied", { param: "scopes", message: `This API key lacks the scope ${missing}: a key may only grant scopes it holds.` });
  }
}

type KeyParams = { Params: { keyId: string } };

/** Keys with their `last_used_at`, which is kept apart from the key documents. */
async function withUsage(ctx: GatewayContext, keys: ApiKeyDoc[]): Promise<ApiKeyDoc[]> {
  const usage = await ctx.store.keys.lastUses(keys.map((k) => k._id));
  return keys.map((k) => ({ ...k, last_used_at: usage.get(k._id) ?? k.last_used_at }));
}

async function loadKey(ctx: GatewayContext, request: FastifyRequest<KeyParams>): Promise<ApiKeyDoc> {
  const auth = authOf(request);
  const id = request.params.keyId;
  if (!UUID.test(id)) throw invalid("keyId", "keyId must be a UUID.");
  const key = await ctx.store.keys.get(auth.workspace._id, id);
  if (!key) throw new ApiError("not_found", { param: "keyId", message: "No such API key." });
  return (await withUsage(ctx, [key]))[0]!;
}

/** Rotation is served at two paths (decisions §2): one declaration, two routes. */
function rotateOperation(path: string, operationId: string, summary: string): Operation {
  return {
    method: "post",
    path,
    operationId,
    summary,
    description: "Creates a replacement key and schedules revocation of the old one after gracePeriodSeconds (default 86400). A revoked key: 409 conflict.",
    tag: "api-keys",
    scope: "api_keys:manage",
    rate: "expensive",
    parameters: [keyId],
    body: { schema: "ApiKeyRotateRequest", required: true },
    success: { 201: { description: "The new key with its one-time secret and old_key_revokes_at.", json: "ApiKey" } },
    errors: { 404: ["not_found"], 409: ["conflict"] },
  };
}

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const API_KEY_OPERATIONS = {
  createApiKey: {
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
  listApiKeys: {
    method: "get",
    path: "/api/v1/api-keys",
    operationId: "listApiKeys",
    summary: "List API keys",
    tag: "api-keys",
    scope: "api_keys:manage",
    success: { 200: { description: "The workspace's keys, one page.", json: "ApiKeyList" } },
  },
  getApiKey: {
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
  revokeApiKey: {
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
  rotateApiKey: rotateOperation("/api/v1/api-keys/{keyId}/rotate", "rotateApiKey", "Rotate an API key"),
  rotateApiKeyUnversioned: rotateOperation("/api-keys/{keyId}/rotate", "rotateApiKeyUnversioned", "Rotate an API key (also served without /api/v1)"),
} satisfies Record<string, Operation>;

export function apiKeyRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    route(app, API_KEY_OPERATIONS.createApiKey, async (request, reply) => {
      const auth = authOf(request);
      const body = parseWith(CreateSchema, request.body);
      const scopes = checkScopes(body.scopes);
      requireHeld(auth.scopes, scopes);
      const { doc, secret } = newApiKey({
        workspaceId: auth.workspace._id,
        label: body.label ?? null,
        scopes,
        nowMs: ctx.clock.nowMs(),
      });
      await ctx.store.keys.insert(doc);
      return reply.status(201).send(renderApiKey(doc, ctx.clock.nowMs(), { secret }));
    });

    route(app, API_KEY_OPERATIONS.listApiKeys, async (request) => {
      const auth = authOf(request);
      const now = ctx.clock.nowMs();
      const keys = await withUsage(ctx, await ctx.store.keys.list(auth.workspace._id));
      return list(keys.map((k) => renderApiKey(k, now)), false, null);
    });

    route<KeyParams>(app, API_KEY_OPERATIONS.getApiKey, async (request) => renderApiKey(await loadKey(ctx, request), ctx.clock.nowMs()));

    route<KeyParams>(app, API_KEY_OPERATIONS.revokeApiKey, async (request) => {
      const key = await loadKey(ctx, request);
      const now = ctx.clock.nowMs();
      if (key.revoked_at === null) {
        await ctx.store.keys.update(key._id, { revoked_at: now, updated_at: now });
        key.revoked_at = now;
        key.updated_at = now;
        ctx.auth.invalidate();
      }
      return renderApiKey(key, now);
    });

    const rotate = async (request: FastifyRequest<KeyParams>, reply: import("fastify").FastifyReply) => {
      if (request.body === undefined || request.body === null || typeof request.body !== "object" || Array.isArray(request.body)) {
        throw invalid(null, "The body must be a JSON object.");
      }
      const body = parseWith(RotateSchema, request.body);
      if (body.mode !== undefined && body.mode !== "live") throw invalid("mode", "Rotation always issues a live key; mode may only be live.");
      const old = await loadKey(ctx, request);
      const now = ctx.clock.nowMs();
      if (!keyIsUsable(old, now)) throw new ApiError("conflict", { param: "keyId", message: "A revoked key cannot be rotated." });
      const scopes = body.scopes === undefined ? old.scopes : checkScopes(body.scopes);
      // The rotated key's secret goes to the caller: it may not carry more than the caller holds.
      requireHeld(authOf(request).scopes, scopes);
      const graceS = body.gracePeriodSeconds ?? DEFAULT_GRACE_PERIOD_S;
      const revokesAt = now + graceS * 1000;
      const { doc, secret } = newApiKey({
        workspaceId: old.workspace_id,
        label: body.label === undefined ? old.label : body.label,
        scopes,
        nowMs: now,
      });
      await ctx.store.keys.insert(doc);
      const oldRevokesAt = old.revokes_at === null ? revokesAt : Math.min(old.revokes_at, revokesAt);
      await ctx.store.keys.update(old._id, { revokes_at: oldRevokesAt, updated_at: now });
      ctx.auth.invalidate();
      return reply.status(201).send(renderApiKey(doc, now, { secret, oldKeyRevokesAtMs: oldRevokesAt }));
    };
    route<KeyParams>(app, API_KEY_OPERATIONS.rotateApiKey, rotate);
    route<KeyParams>(app, API_KEY_OPERATIONS.rotateApiKeyUnversioned, rotate);
  };
}
