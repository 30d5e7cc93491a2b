import { createHash } from "node:crypto";
import type { ApiKeyDoc } from "./documents.js";
import type { IdSource } from "./ids.js";
import { unixSeconds } from "./clock.js";

export function hashSecret(secret: string): string {
  return createHash("sha256").update(secret).digest("hex");
}

/** A new key document and its one-time secret. */
export function newApiKey(input: { workspaceId: string; label: string | null; scopes: string[]; nowMs: number; ids: IdSource }): {
  doc: ApiKeyDoc;
  secret: string;
} {
  const secret = input.ids.apiKeySecret();
  const doc: ApiKeyDoc = {
    _id: input.ids.apiKeyId(),
    workspace_id: input.workspaceId,
    hash: hashSecret(secret),
    key_prefix: secret.slice(0, 12),
    label: input.label,
    scopes: [...input.scopes],
    mode: "live",
    created_at: input.nowMs,
    updated_at: input.nowMs,
    last_used_at: null,
    revoked_at: null,
    revokes_at: null,
  };
  return { doc, secret };
}

/** Whether a key authenticates at `nowMs`. */
export function keyIsUsable(doc: ApiKeyDoc, nowMs: number): boolean {
  if (doc.revoked_at !== null && doc.revoked_at <= nowMs) return false;
  if (doc.revokes_at !== null && doc.revokes_at <= nowMs) return false;
  return true;
}

/** The API key object of the spec; `secret` only at create and rotate. */
export function renderApiKey(doc: ApiKeyDoc, nowMs: number, extra: { secret?: string; oldKeyRevokesAtMs?: number } = {}) {
  const revokedMs = doc.revoked_at ?? (doc.revokes_at !== null && doc.revokes_at <= nowMs ? doc.revokes_at : null);
  const out: {
    id: string;
    object: "api_key";
    key_prefix: string;
    label: string | null;
    scopes: string[];
    mode: ApiKeyDoc["mode"];
    created_at: number;
    last_used_at: number | null;
    revoked_at: number | null;
    updated_at: number;
    key?: string;
    old_key_revokes_at?: string;
  } = {
    id: doc._id,
    object: "api_key",
    key_prefix: doc.key_prefix,
    label: doc.label,
    scopes: doc.scopes,
    mode: doc.mode,
    created_at: unixSeconds(doc.created_at),
    last_used_at: doc.last_used_at === null ? null : unixSeconds(doc.last_used_at),
    revoked_at: revokedMs === null ? null : unixSeconds(revokedMs),
    updated_at: unixSeconds(doc.updated_at),
  };
  if (extra.secret) out.key = extra.secret;
  if (extra.oldKeyRevokesAtMs !== undefined) out.old_key_revokes_at = new Date(extra.oldKeyRevokesAtMs).toISOString();
  return out;
}
