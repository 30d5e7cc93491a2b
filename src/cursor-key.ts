import { createHmac, randomBytes } from "node:crypto";

/**
 * The key that authenticates the cursors this service hands out (list cursors and event
 * ids): HMAC-SHA256 under a key derived from the master key, so every node of a service
 * accepts the others' cursors and a forged or edited cursor is always 400
 * `invalid_cursor`, whatever position it names (no answer tells a tenant anything about
 * other tenants' data or volume).
 *
 * One key per process: the composition root sets it from `RUNS_MASTER_KEY` at start
 * ({@link useCursorKey}); until then a random one is in force, so cursors still verify
 * within the process.
 */
let key: Buffer = randomBytes(32);

export function useCursorKey(masterKeyBase64: string): void {
  key = createHmac("sha256", Buffer.from(masterKeyBase64, "base64")).update("runs-cursors:v1").digest();
}

/** The first `bytes` bytes of the HMAC of `parts` (joined unambiguously). */
export function cursorTag(parts: readonly (string | number)[], bytes: number): Buffer {
  // One update of the joined parts (the same bytes as one update per part, so the same
  // tag): every event id costs one, and each update is a call into native code.
  let joined = "";
  for (const part of parts) {
    const text = String(part);
    joined += `${text.length}:${text};`;
  }
  return createHmac("sha256", key).update(joined).digest().subarray(0, bytes);
}
