import type { FastifyInstance, FastifyRequest } from "fastify";
import { z } from "zod";
import { ApiError, type ApiKeyDoc, decodeCursor, encodeCursor, keyIsUsable, list, newApiKey, renderApiKey } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { type Handler, type Operation, page, route, keyId } from "../operation.js";
import { ApiKeyCreateRequestSchema, ApiKeyListSchema, ApiKeyRotateRequestSchema, ApiKeySchema, MAX_GRACE_PERIOD_S } from "../schemas.js";

export const DEFAULT_GRACE_PERIOD_S = 86_400;
export { MAX_GRACE_PERIOD_S };

/** The first of `scopes` a key does not hold. */
const missingScope = (held: ReadonlySet<string>, scopes: readonly string[]) => scopes.find((s) => !held.has(s));

/**
 * A key may hand out only scopes it holds itself: `api_keys:manage` alone must not
 * mint a key with every scope (or rotate a stronger key into a copy it receives).
 */
function requireHeld(held: ReadonlySet<string>, scopes: readonly string[]): void {
  const missing = missingScope(held, scopes);
  if (missing !== undefined) {
    throw new ApiError("permission_denied", { param: "scopes", message: `This API key lacks the scope ${missing}: a key may only grant scopes it holds.` });
  }
}

/**
 * A key may revoke or rotate only a key whose scopes it holds itself: `api_keys:manage`
 * alone must not end the workspace's stronger keys, every full key included (found by a
 * probe: a manage-only key revoked them all, or rotated one into a manage-only key).
 */
function requireHeldByCaller(held: ReadonlySet<string>, target: ApiKeyDoc): void {
  const missing = missingScope(held, target.scopes);
  if (missing !== undefined) {
    throw new ApiError("permission_denied", { param: "keyId", message: `This API key lacks the scope ${missing}, which that key holds: a key may only revoke or rotate keys whose scopes it holds.` });
  }
}

const KeyParams = z.object(keyId);

/** Keys with their `last_used_at`, which is kept apart from the key documents. */
async function withUsage(ctx: GatewayContext, keys: ApiKeyDoc[]): Promise<ApiKeyDoc[]> {
  const usage = await ctx.store.keys.lastUses(keys.map((k) => k._id));
  return keys.map((k) => ({ ...k, last_used_at: usage.get(k._id) ?? k.last_used_at }));
}

async function loadKey(ctx: GatewayContext, request: FastifyRequest, id: string): Promise<ApiKeyDoc> {
  const auth = authOf(request);
  const key = await ctx.store.keys.get(auth.workspace._id, id);
  if (!key) throw new ApiError("not_found", { param: "keyId", message: "No such API key." });
  return (await withUsage(ctx, [key]))[0]!;
}

/** Rotation is served at two paths (decisions §2): one declaration, two routes. */
function rotateOperation(path: string, operationId: string, summary: string) {
  return {
    method: "post",
    path,
    operationId,
    summary,
    description: "Creates a replacement key and schedules revocation of the old one after gracePeriodSeconds (default 86400). A revoked key: 409 conflict. Only a key whose scopes the caller's key all holds (else 403, param keyId), into scopes it holds (else 403, param scopes).",
    tag: "api-keys",
    scope: "api_keys:manage",
    rate: "expensive",
    params: KeyParams,
    body: { schema: ApiKeyRotateRequestSchema, required: true },
    success: { 201: { description: "The new key with its one-time secret and old_key_revokes_at.", json: ApiKeySchema } },
    errors: { 404: ["not_found"], 409: ["conflict"] },
  } satisfies Operation;
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
    body: { schema: ApiKeyCreateRequestSchema, required: true },
    success: { 201: { description: "The key with its one-time secret in key.", json: ApiKeySchema } },
  },
  listApiKeys: {
    method: "get",
    path: "/api/v1/api-keys",
    operationId: "listApiKeys",
    summary: "List API keys",
    description: "Newest first, revoked keys included; pages as every list does (limit, after).",
    tag: "api-keys",
    scope: "api_keys:manage",
    query: z.object(page(100, 20)),
    success: { 200: { description: "The workspace's keys, one page.", json: ApiKeyListSchema } },
    errors: { 400: ["invalid_request", "invalid_cursor"] },
  },
  getApiKey: {
    method: "get",
    path: "/api/v1/api-keys/{keyId}",
    operationId: "getApiKey",
    summary: "Retrieve an API key",
    tag: "api-keys",
    scope: "api_keys:manage",
    params: KeyParams,
    success: { 200: { description: "The key (no secret).", json: ApiKeySchema } },
    errors: { 400: ["invalid_request"], 404: ["not_found"] },
  },
  revokeApiKey: {
    method: "post",
    path: "/api/v1/api-keys/{keyId}/revoke",
    operationId: "revokeApiKey",
    summary: "Revoke an API key",
    description: "Refused on every node within 5 seconds. Repeating it changes nothing. Only a key whose scopes the caller's key all holds: else 403, param keyId.",
    tag: "api-keys",
    scope: "api_keys:manage",
    rate: "exempt",
    params: KeyParams,
    success: { 200: { description: "The revoked key.", json: ApiKeySchema } },
    errors: { 400: ["invalid_request"], 404: ["not_found"] },
  },
  rotateApiKey: rotateOperation("/api/v1/api-keys/{keyId}/rotate", "rotateApiKey", "Rotate an API key"),
  rotateApiKeyUnversioned: rotateOperation("/api-keys/{keyId}/rotate", "rotateApiKeyUnversioned", "Rotate an API key (also served without /api/v1)"),
} satisfies Record<string, Operation>;

export function apiKeyRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    route(app, API_KEY_OPERATIONS.createApiKey, async (request, reply) => {
      const auth = authOf(request);
      const body = request.body;
      const scopes = body.scopes;
      requireHeld(auth.scopes, scopes);
      const { doc, secret } = newApiKey({
        workspaceId: auth.workspace._id,
        label: body.label ?? null,
        scopes,
        nowMs: ctx.clock.nowMs(),
        ids: ctx.ids,
      });
      await ctx.store.keys.insert(doc);
      return reply.status(201).send(renderApiKey(doc, ctx.clock.nowMs(), { secret }));
    });

    route(app, API_KEY_OPERATIONS.listApiKeys, async (request) => {
      const auth = authOf(request);
      const workspaceId = auth.workspace._id;
      const limit = request.query.limit;
      const after = request.query.after === undefined ? undefined : decodeCursor(request.query.after, "api_keys", workspaceId);
      const found = await ctx.store.keys.list(workspaceId, limit + 1, after ? { createdAt: Number(after.k), id: after.id } : undefined);
      const keys = await withUsage(ctx, found.slice(0, limit));
      const last = keys[keys.length - 1];
      const next = last ? encodeCursor({ s: "api_keys", o: workspaceId, k: String(last.created_at), id: last._id }) : null;
      const now = ctx.clock.nowMs();
      return list(keys.map((k) => renderApiKey(k, now)), found.length > limit, next);
    });

    route(app, API_KEY_OPERATIONS.getApiKey, async (request) => renderApiKey(await loadKey(ctx, request, request.params.keyId), ctx.clock.nowMs()));

    route(app, API_KEY_OPERATIONS.revokeApiKey, async (request) => {
      const key = await loadKey(ctx, request, request.params.keyId);
      const now = ctx.clock.nowMs();
      // A repeat of a done revocation changes nothing, nor does revoking a key its rotation's
      // grace already ended: answered as before, whoever asks.
      if (keyIsUsable(key, now)) {
        requireHeldByCaller(authOf(request).scopes, key);
        await ctx.store.keys.update(key._id, { revoked_at: now, updated_at: now });
        key.revoked_at = now;
        key.updated_at = now;
        ctx.auth.invalidate(key._id);
      }
      return renderApiKey(key, now);
    });

    const rotate: Handler<ReturnType<typeof rotateOperation>> = async (request, reply) => {
      const body = request.body;
      const old = await loadKey(ctx, request, request.params.keyId);
      const now = ctx.clock.nowMs();
      if (!keyIsUsable(old, now)) throw new ApiError("conflict", { param: "keyId", message: "A revoked key cannot be rotated." });
      // The caller may not end a key stronger than itself (its scopes kept or not)...
      requireHeldByCaller(authOf(request).scopes, old);
      const scopes = body.scopes ?? old.scopes;
      // ...and the rotated key's secret goes to the caller: it may not carry more than the caller holds.
      requireHeld(authOf(request).scopes, scopes);
      const graceS = body.gracePeriodSeconds ?? DEFAULT_GRACE_PERIOD_S;
      const revokesAt = now + graceS * 1000;
      const { doc, secret } = newApiKey({
        workspaceId: old.workspace_id,
        label: body.label === undefined ? old.label : body.label,
        scopes,
        nowMs: now,
        ids: ctx.ids,
      });
      await ctx.store.keys.insert(doc);
      const oldRevokesAt = old.revokes_at === null ? revokesAt : Math.min(old.revokes_at, revokesAt);
      await ctx.store.keys.update(old._id, { revokes_at: oldRevokesAt, updated_at: now });
      ctx.auth.invalidate(old._id);
      return reply.status(201).send(renderApiKey(doc, now, { secret, oldKeyRevokesAtMs: oldRevokesAt }));
    };
    route(app, API_KEY_OPERATIONS.rotateApiKey, rotate);
    route(app, API_KEY_OPERATIONS.rotateApiKeyUnversioned, rotate);
  };
}
