/**
 * Completion webhooks, the pure part (issue 16): event types, which endpoint wants which
 * event, Standard Webhooks secrets and signatures, and the retry schedule.
 *
 * Signatures follow the Standard Webhooks specification (standardwebhooks.com): the signed
 * content is `<webhook-id>.<webhook-timestamp>.<body>`, HMAC-SHA256 keyed by the base64
 * bytes after `whsec_`, sent as `webhook-signature: v1,<base64>` (several, space-separated,
 * while a rotated secret is still honoured).
 */
import { createHmac, randomBytes } from "node:crypto";

export const WEBHOOK_EVENT_TYPES = ["turn.completed", "turn.failed", "turn.cancelled", "turn.incomplete", "turn.action_required", "run.deleted", "run.expired"] as const;
export type WebhookEventType = (typeof WEBHOOK_EVENT_TYPES)[number];
/** What an endpoint may ask for: event types, or every type. */
export const WEBHOOK_WILDCARD = "*";
/** Sent by POST /webhooks/{id}/test only (never matched by a subscription). */
export const WEBHOOK_TEST_EVENT = "webhook.test";

/** Whether an endpoint with these subscriptions wants an event of `type` for a run of `agentId`. */
export function wantsEvent(endpoint: { enabled: boolean; event_types: readonly string[]; agent_id: string | null }, type: WebhookEventType, agentId: string): boolean {
  if (!endpoint.enabled) return false;
  if (endpoint.agent_id !== null && endpoint.agent_id !== agentId) return false;
  return endpoint.event_types.includes(WEBHOOK_WILDCARD) || endpoint.event_types.includes(type);
}

const SECRET_PREFIX = "whsec_";
const SECRET_BYTES = 32;

/** A new secret, `whsec_` and 32 random bytes in base64. */
export function newWebhookSecret(): string {
  return `${SECRET_PREFIX}${randomBytes(SECRET_BYTES).toString("base64")}`;
}

/** The HMAC key of a secret: the base64 after `whsec_`. */
function keyOf(secret: string): Buffer {
  if (!secret.startsWith(SECRET_PREFIX)) throw new Error("a webhook secret starts with whsec_");
  return Buffer.from(secret.slice(SECRET_PREFIX.length), "base64");
}

/** `v1,<base64 HMAC-SHA256 of id.timestamp.body>` for each secret, space-separated. */
export function signWebhook(secrets: readonly string[], id: string, timestampS: number, body: string): string {
  return secrets.map((secret) => `v1,${createHmac("sha256", keyOf(secret)).update(`${id}.${timestampS}.${body}`).digest("base64")}`).join(" ");
}

/** The retry schedule: the first attempt at once, then these waits (each ±20%), until the horizon. */
const RETRY_WAITS_MS = [5_000, 30_000, 120_000, 600_000, 1_800_000, 3_600_000, 7_200_000, 14_400_000];

/**
 * When attempt `attempt` (1 = the first retry) may go, after a failure at `nowMs`; null once
 * past the horizon (the delivery has failed for good). `scale` shrinks the waits (tests).
 */
export function nextAttemptAt(attempt: number, nowMs: number, createdAtMs: number, horizonMs: number, random: number, scale = 1): number | null {
  const base = RETRY_WAITS_MS[Math.min(attempt - 1, RETRY_WAITS_MS.length - 1)]! * scale;
  const wait = Math.max(1, Math.round(base * (0.8 + 0.4 * random)));
  const at = nowMs + wait;
  return at - createdAtMs > horizonMs ? null : at;
}
