import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { ApiError, checkModelEndpoint, decodeCursor, type DeliveryDoc, encodeCursor, invalid, list, MAX_WEBHOOKS_PER_WORKSPACE, NetworkPolicyError, partitionOf, unixSeconds, type WebhookAttempt, type WebhookDoc } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { type AuthContext, requireScope } from "../auth.js";
import { type Operation, page, route } from "../operation.js";
import { WebhookCreateRequestSchema, WebhookDeletedSchema, WebhookDeliveryListSchema, WebhookDeliverySchema, WebhookListSchema, WebhookSchema, WebhookUpdateRequestSchema } from "../schemas.js";

const WebhookParams = z.object({ webhookId: z.string().describe("Webhook id (`wh_…`).") });
const DeliveryParams = z.object({ webhookId: z.string().describe("Webhook id (`wh_…`)."), deliveryId: z.string().describe("Delivery id (`whd_…`).") });
const NOT_FOUND = { 400: ["invalid_request" as const], 404: ["not_found" as const] };

export function renderWebhook(doc: WebhookDoc, secret?: string) {
  const out = {
    id: doc._id,
    object: "webhook" as const,
    url: doc.url,
    description: doc.description,
    event_types: doc.event_types,
    agent_id: doc.agent_id,
    enabled: doc.enabled,
    disabled_reason: doc.disabled_reason,
    created_at: unixSeconds(doc.created_at),
    updated_at: unixSeconds(doc.updated_at),
  };
  return secret === undefined ? out : { ...out, secret };
}

const renderAttempt = (a: WebhookAttempt) => ({ n: a.n, at: unixSeconds(a.at), status_code: a.status_code, latency_ms: a.latency_ms, error: a.error });

export function renderDelivery(doc: DeliveryDoc, attempts?: WebhookAttempt[]) {
  const out = {
    id: doc._id,
    object: "webhook.delivery" as const,
    webhook_id: doc.webhook_id,
    message_id: doc.message_id,
    event_type: doc.event_type,
    run_id: doc.run_id,
    status: doc.status,
    attempts: doc.attempts,
    next_attempt_at: doc.status === "pending" ? unixSeconds(doc.next_attempt_at) : null,
    last_attempt: doc.last_attempt ? renderAttempt(doc.last_attempt) : null,
    created_at: unixSeconds(doc.created_at),
    completed_at: doc.completed_at === null ? null : unixSeconds(doc.completed_at),
  };
  return attempts ? { ...out, attempt_log: attempts.map(renderAttempt) } : out;
}

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const WEBHOOK_OPERATIONS = {
  createWebhook: {
    method: "post",
    path: "/api/v1/webhooks",
    operationId: "createWebhook",
    summary: "Create a webhook",
    description: "The answer holds the signing secret (whsec_…), shown only now and on rotation. Deliveries start for events after this (another node within 2 s). Needs run:read too: deliveries carry runs' inputs and outputs.",
    tag: "webhooks",
    scope: "webhooks:write",
    body: { schema: WebhookCreateRequestSchema, required: true },
    success: { 201: { description: "The webhook with its secret.", json: WebhookSchema } },
    errors: { 400: ["invalid_request"], 404: ["agent_not_found"] },
  },
  listWebhooks: {
    method: "get",
    path: "/api/v1/webhooks",
    operationId: "listWebhooks",
    summary: "List webhooks",
    tag: "webhooks",
    scope: "webhooks:read",
    query: z.object(page(100, 20)),
    success: { 200: { description: "Webhooks, newest first.", json: WebhookListSchema } },
    errors: { 400: ["invalid_request", "invalid_cursor"] },
  },
  getWebhook: {
    method: "get",
    path: "/api/v1/webhooks/{webhookId}",
    operationId: "getWebhook",
    summary: "Retrieve a webhook",
    tag: "webhooks",
    scope: "webhooks:read",
    params: WebhookParams,
    success: { 200: { description: "The webhook (no secret).", json: WebhookSchema } },
    errors: NOT_FOUND,
  },
  updateWebhook: {
    method: "patch",
    path: "/api/v1/webhooks/{webhookId}",
    operationId: "updateWebhook",
    summary: "Change a webhook",
    description: "Fields given replace the webhook's; enabled: true restarts delivery after a 410 Gone stopped it (pending deliveries go out again). Changing url, event_types or agent_id, or enabling it, needs run:read too.",
    tag: "webhooks",
    scope: "webhooks:write",
    params: WebhookParams,
    body: { schema: WebhookUpdateRequestSchema, required: true },
    success: { 200: { description: "The webhook (no secret).", json: WebhookSchema } },
    errors: { 400: ["invalid_request"], 404: ["not_found", "agent_not_found"] },
  },
  deleteWebhook: {
    method: "delete",
    path: "/api/v1/webhooks/{webhookId}",
    operationId: "deleteWebhook",
    summary: "Delete a webhook",
    description: "Its pending deliveries are dropped with it.",
    tag: "webhooks",
    scope: "webhooks:write",
    params: WebhookParams,
    success: { 200: { description: "Deleted.", json: WebhookDeletedSchema } },
    errors: NOT_FOUND,
  },
  rotateWebhookSecret: {
    method: "post",
    path: "/api/v1/webhooks/{webhookId}/rotate-secret",
    operationId: "rotateWebhookSecret",
    summary: "Rotate a webhook's secret",
    description: "Deliveries are signed with the new secret and, for 24 hours, also with the previous one (two v1 signatures), so receivers can switch without losing one.",
    tag: "webhooks",
    scope: "webhooks:write",
    params: WebhookParams,
    success: { 200: { description: "The webhook with its new secret.", json: WebhookSchema } },
    errors: NOT_FOUND,
  },
  testWebhook: {
    method: "post",
    path: "/api/v1/webhooks/{webhookId}/test",
    operationId: "testWebhook",
    summary: "Send a test delivery",
    description: "A webhook.test event, delivered like any other (signed, retried); follow it in the deliveries.",
    tag: "webhooks",
    scope: "webhooks:write",
    params: WebhookParams,
    success: { 202: { description: "The delivery, pending.", json: WebhookDeliverySchema } },
    errors: NOT_FOUND,
  },
  listWebhookDeliveries: {
    method: "get",
    path: "/api/v1/webhooks/{webhookId}/deliveries",
    operationId: "listWebhookDeliveries",
    summary: "List a webhook's deliveries",
    tag: "webhooks",
    scope: "webhooks:read",
    params: WebhookParams,
    query: z.object(page(100, 20)),
    success: { 200: { description: "Deliveries with their last attempt, newest first.", json: WebhookDeliveryListSchema } },
    errors: { 400: ["invalid_request", "invalid_cursor"], 404: ["not_found"] },
  },
  getWebhookDelivery: {
    method: "get",
    path: "/api/v1/webhooks/{webhookId}/deliveries/{deliveryId}",
    operationId: "getWebhookDelivery",
    summary: "Retrieve a delivery with every attempt",
    tag: "webhooks",
    scope: "webhooks:read",
    params: DeliveryParams,
    success: { 200: { description: "The delivery and its attempt log.", json: WebhookDeliverySchema } },
    errors: NOT_FOUND,
  },
  redeliverWebhook: {
    method: "post",
    path: "/api/v1/webhooks/{webhookId}/deliveries/{deliveryId}/redeliver",
    operationId: "redeliverWebhook",
    summary: "Deliver a message again",
    description: "A new delivery of the same message (same webhook-id and body), attempted afresh. Needs run:read too.",
    tag: "webhooks",
    scope: "webhooks:write",
    params: DeliveryParams,
    success: { 202: { description: "The new delivery, pending.", json: WebhookDeliverySchema } },
    errors: NOT_FOUND,
  },
} satisfies Record<string, Operation>;

const webhookNotFound = (id: string) => new ApiError("not_found", { message: `No webhook ${id} in this workspace.`, param: "webhookId" });

/** Webhooks (issue 16): scopes webhooks:read / webhooks:write. */
/**
 * A webhook sends runs' inputs and outputs to its URL, and sending data to an address of
 * one's choosing is reading it: what decides that (creating one, its URL, events, agent
 * filter, enabling it, a redelivery) takes run:read, as a deployment's api_key_env takes
 * env_vars:reveal. Found by a probe: webhooks:write alone received full turns.
 */
function requireRunRead(auth: AuthContext, what: string): void {
  requireScope(auth, "run:read", { why: `a webhook sends runs' inputs and outputs to its URL, so ${what} needs it` });
}

export function webhookRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    const store = ctx.webhooks;
    /** An address the guard refuses is refused now, where the mistake is made (a name is checked again at every delivery). */
    const checkUrl = async (url: string) => {
      try {
        await checkModelEndpoint(url, { allowPrivate: ctx.config.webhooks.allowPrivate });
      } catch (err) {
        if (err instanceof NetworkPolicyError) throw invalid("url", `${err.reason}: deliveries may not go there.`);
        throw err;
      }
    };
    const load = async (workspaceId: string, id: string) => (await store.get(workspaceId, id)) ?? Promise.reject(webhookNotFound(id));

    /** An agent filter names an agent of the workspace (another's, or none, would never match: 404). */
    const checkAgent = async (workspaceId: string, agentId: string | null | undefined) => {
      if (agentId && !(await ctx.store.getAgent(workspaceId, agentId))) throw new ApiError("agent_not_found", { param: "agent_id" });
    };

    route(app, WEBHOOK_OPERATIONS.createWebhook, async (request, reply) => {
      const auth = authOf(request);
      requireRunRead(auth, "creating one");
      await checkUrl(request.body.url);
      await checkAgent(auth.workspace._id, request.body.agent_id);
      if ((await store.count(auth.workspace._id)) >= MAX_WEBHOOKS_PER_WORKSPACE) {
        throw invalid(null, `The workspace has ${MAX_WEBHOOKS_PER_WORKSPACE} webhooks, the most it may have; delete one first.`);
      }
      const created = await store.create({
        workspaceId: auth.workspace._id,
        url: request.body.url,
        description: request.body.description ?? null,
        eventTypes: [...new Set(request.body.event_types)],
        agentId: request.body.agent_id ?? null,
        enabled: request.body.enabled ?? true,
      });
      // Other creates took the last places while this one was being made.
      if (!created) throw invalid(null, `Webhooks created at the same time took the workspace's last places (${MAX_WEBHOOKS_PER_WORKSPACE} at most, the most it may have); try again, or delete one first.`);
      const { doc, secret } = created;
      ctx.log.info({ workspace_id: auth.workspace._id, webhook_id: doc._id, event_types: doc.event_types }, "webhook created");
      return reply.status(201).send(renderWebhook(doc, secret));
    });

    route(app, WEBHOOK_OPERATIONS.listWebhooks, async (request) => {
      const auth = authOf(request);
      const limit = request.query.limit;
      const cursor = request.query.after === undefined ? undefined : decodeCursor(request.query.after, "webhooks", auth.workspace._id);
      const docs = await store.list(auth.workspace._id, limit + 1, cursor ? { createdAt: Number(cursor.k), id: cursor.id } : undefined);
      const shown = docs.slice(0, limit);
      const last = shown[shown.length - 1];
      const next = last ? encodeCursor({ s: "webhooks", o: auth.workspace._id, k: String(last.created_at), id: last._id }) : null;
      return list(shown.map((doc) => renderWebhook(doc)), docs.length > limit, next);
    });

    route(app, WEBHOOK_OPERATIONS.getWebhook, async (request) => renderWebhook(await load(authOf(request).workspace._id, request.params.webhookId)));

    route(app, WEBHOOK_OPERATIONS.updateWebhook, async (request) => {
      const auth = authOf(request);
      const body = request.body;
      if (body.url !== undefined || body.event_types !== undefined || body.agent_id !== undefined || body.enabled === true) {
        requireRunRead(auth, "changing what it sends or where, or enabling it,");
      }
      if (body.url !== undefined) await checkUrl(body.url);
      await checkAgent(auth.workspace._id, body.agent_id);
      const set: Parameters<typeof store.update>[2] = {};
      if (body.url !== undefined) set.url = body.url;
      if (body.event_types !== undefined) set.event_types = [...new Set(body.event_types)];
      if (body.agent_id !== undefined) set.agent_id = body.agent_id;
      if (body.description !== undefined) set.description = body.description;
      if (body.enabled !== undefined) set.enabled = body.enabled;
      const doc = await store.update(auth.workspace._id, request.params.webhookId, set);
      if (!doc) throw webhookNotFound(request.params.webhookId);
      return renderWebhook(doc);
    });

    route(app, WEBHOOK_OPERATIONS.deleteWebhook, async (request) => {
      const auth = authOf(request);
      const deleted = await store.delete(auth.workspace._id, request.params.webhookId);
      if (!deleted) throw webhookNotFound(request.params.webhookId);
      ctx.log.info({ workspace_id: auth.workspace._id, webhook_id: request.params.webhookId }, "webhook deleted");
      if ("logLeft" in deleted) {
        ctx.log.warn({ err: deleted.logLeft, workspace_id: auth.workspace._id, webhook_id: request.params.webhookId }, "could not remove all of the deleted webhook's delivery log; the log's sweep removes the rest when its week is over");
      }
      return { id: request.params.webhookId, object: "webhook.deleted" as const, deleted: true as const };
    });

    route(app, WEBHOOK_OPERATIONS.rotateWebhookSecret, async (request) => {
      const auth = authOf(request);
      const rotated = await store.rotateSecret(auth.workspace._id, request.params.webhookId);
      if (!rotated) throw webhookNotFound(request.params.webhookId);
      ctx.log.info({ workspace_id: auth.workspace._id, webhook_id: rotated.doc._id }, "webhook secret rotated");
      return renderWebhook(rotated.doc, rotated.secret);
    });

    route(app, WEBHOOK_OPERATIONS.testWebhook, async (request, reply) => {
      const endpoint = await load(authOf(request).workspace._id, request.params.webhookId);
      const doc = await store.enqueueTest(endpoint, partitionOf(endpoint._id, ctx.config.partitions));
      return reply.status(202).send(renderDelivery(doc));
    });

    route(app, WEBHOOK_OPERATIONS.listWebhookDeliveries, async (request) => {
      const auth = authOf(request);
      const endpoint = await load(auth.workspace._id, request.params.webhookId);
      const limit = request.query.limit;
      const cursor = request.query.after === undefined ? undefined : decodeCursor(request.query.after, "webhook_deliveries", endpoint._id);
      const docs = await store.listDeliveries(endpoint._id, limit + 1, cursor ? { createdAt: Number(cursor.k), id: cursor.id } : undefined);
      const shown = docs.slice(0, limit);
      const last = shown[shown.length - 1];
      const next = last ? encodeCursor({ s: "webhook_deliveries", o: endpoint._id, k: String(last.created_at), id: last._id }) : null;
      return list(shown.map((doc) => renderDelivery(doc)), docs.length > limit, next);
    });

    const loadDelivery = async (workspaceId: string, webhookId: string, deliveryId: string) => {
      const endpoint = await load(workspaceId, webhookId);
      const doc = await store.getDelivery(endpoint._id, deliveryId);
      if (!doc) throw new ApiError("not_found", { message: `No delivery ${deliveryId} of webhook ${webhookId}.`, param: "deliveryId" });
      return doc;
    };

    route(app, WEBHOOK_OPERATIONS.getWebhookDelivery, async (request) => {
      const doc = await loadDelivery(authOf(request).workspace._id, request.params.webhookId, request.params.deliveryId);
      return renderDelivery(doc, await store.attemptsOf(doc._id));
    });

    route(app, WEBHOOK_OPERATIONS.redeliverWebhook, async (request, reply) => {
      const auth = authOf(request);
      requireRunRead(auth, "delivering a message again");
      const original = await loadDelivery(auth.workspace._id, request.params.webhookId, request.params.deliveryId);
      return reply.status(202).send(renderDelivery(await store.redeliver(original)));
    });
  };
}
