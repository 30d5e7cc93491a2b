import { createHmac, randomBytes } from "node:crypto";
import { HmacSha256 } from "./hmac-sha256.js";

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
let hmac = new HmacSha256(randomBytes(32));
let generation = 0;

export function useCursorKey(masterKeyBase64: string): void {
  hmac = new HmacSha256(createHmac("sha256", Buffer.from(masterKeyBase64, "base64")).update("runs-cursors:v1").digest());
  generation++;
}

/** Changes whenever the cursor key does: keys derived from it and kept must be derived again. */
export function cursorKeyGeneration(): number {
  return generation;
}

/**
 * The first `bytes` bytes of the HMAC of `parts` (joined unambiguously). The HMAC is computed
 * in JavaScript from the key's pads hashed once (src/hmac-sha256.ts), which is cheaper than
 * building a node:crypto Hmac per tag.
 */
export function cursorTag(parts: readonly (string | number)[], bytes: number): Buffer {
  if (!Number.isInteger(bytes) || bytes < 1 || bytes > 32) throw new RangeError("a cursor tag is 1 to 32 bytes of an HMAC-SHA256");
  let joined = "";
  for (const part of parts) {
    const text = String(part);
    joined += `${text.length}:${text};`;
  }
  const tag = hmac.digest(joined);
  return Buffer.from(tag.buffer, tag.byteOffset, bytes);
}

/**
 * The HMAC of parts already joined as bytes, `length:text;` each (what {@link cursorTag}
 * does with strings), written into `out[0, 32)`: every event id costs one, and its
 * encoder joins its fixed shape faster itself (src/event-ids.ts).
 */
export function joinedTagInto(joined: Uint8Array, out: Uint8Array): void {
  hmac.digestInto(joined, out);
}
