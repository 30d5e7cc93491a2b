/**
 * The spec's idempotency rules for POST /api/v1/files, as pure decisions over the upload
 * record of a (workspace, Idempotency-Key): start, replay, restart, take over, wait, or
 * refuse. src/file-store.ts keeps the records; the files route applies the decisions.
 */
import { createHash } from "node:crypto";
import { ApiError } from "./errors.js";

export const UploadState = {
  uploading: "uploading",
  done: "done",
  /** Failed or interrupted: a repeat with the same key starts again, with any file. */
  failed: "failed",
  /** Ran past the time limit (408): the key is spent, a repeat is 409 conflict. */
  expired: "expired",
} as const;
export type UploadState = (typeof UploadState)[keyof typeof UploadState];

export interface FileUploadDoc {
  /** sha256 hex of workspace, operation and Idempotency-Key. */
  _id: string;
  workspace_id: string;
  /**
   * sha256 hex of the file's identity as known when its part begins: filename and
   * media_type. A repeat naming another file under the same key is 409 conflict, unless
   * the attempt failed.
   */
  fingerprint: string;
  state: UploadState;
  /**
   * The file id of the current attempt; a new attempt (restart or takeover) gets a new
   * one, so it is also the fencing token: an older attempt's writes match nothing.
   */
  file_id: string;
  /** Refreshed while bytes arrive; silence past the takeover window lets a repeat take over. */
  heartbeat_at: number;
  started_at: number;
  created_at: number;
  expires_at: number;
}

/** What a request under a key is told to do. Pure; see {@link decideUpload}. */
export type UploadDecision =
  | { kind: "start" }
  | { kind: "restart"; previous: FileUploadDoc }
  | { kind: "takeover"; previous: FileUploadDoc }
  | { kind: "replay"; fileId: string }
  | { kind: "in_progress"; retryAfterS: number }
  | { kind: "conflict"; reason: "other_file" | "expired" };

/**
 * The spec's idempotency rule for POST /api/v1/files, given the key's record and the
 * repeat's fingerprint (undefined when the body has not been read that far yet, which
 * decides only what needs no fingerprint):
 * none → start; expired → conflict; failed → restart (whatever the file); another
 * file → conflict; done → replay; uploading and heard from within `takeoverMs` → in_progress
 * (Retry-After: the seconds until it could be taken over, 1 to 30); silent longer → takeover.
 */
export function decideUpload(
  record: FileUploadDoc | null,
  fingerprint: string | undefined,
  nowMs: number,
  takeoverMs: number,
): UploadDecision | { kind: "need_fingerprint" } {
  if (!record) return { kind: "start" };
  if (record.state === UploadState.uploading && nowMs - record.heartbeat_at < takeoverMs) {
    const retryAfterS = Math.min(30, Math.max(1, Math.ceil((record.heartbeat_at + takeoverMs - nowMs) / 1000)));
    return { kind: "in_progress", retryAfterS };
  }
  if (record.state === UploadState.expired) return { kind: "conflict", reason: "expired" };
  if (fingerprint === undefined) return { kind: "need_fingerprint" };
  // A failed attempt left no file: the key is free for any form, a corrected one too
  // (a form refused after its file part began, say), as a refused request's key is.
  if (record.state === UploadState.failed) return { kind: "restart", previous: record };
  if (record.fingerprint !== fingerprint) return { kind: "conflict", reason: "other_file" };
  return record.state === UploadState.done ? { kind: "replay", fileId: record.file_id } : { kind: "takeover", previous: record };
}

/** The fingerprint of a file's identity for the idempotency check: filename and media type. */
export function uploadFingerprint(meta: { filename: string; media_type: string }): string {
  return createHash("sha256").update(`${meta.filename}\u0000${meta.media_type}`).digest("hex");
}

/** The error a decision answers with, for the kinds that refuse. */
export function decisionError(decision: UploadDecision): ApiError | undefined {
  if (decision.kind === "in_progress") return new ApiError("upload_in_progress", { param: "Idempotency-Key", retryAfterS: decision.retryAfterS });
  if (decision.kind === "conflict") {
    return new ApiError("conflict", {
      param: "Idempotency-Key",
      message:
        decision.reason === "expired"
          ? "The upload under this Idempotency-Key expired; upload again with a new key."
          : "This Idempotency-Key was used for a different file; upload again with a new key.",
    });
  }
  return undefined;
}
