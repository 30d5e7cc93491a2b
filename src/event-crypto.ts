import { createHmac } from "node:crypto";
import nacl from "tweetnacl";

/**
 * Encryption of stored events (spec Events rule 10, DESIGN §5): tweetnacl secretbox
 * (XSalsa20-Poly1305) under a per-workspace key derived from the service master key.
 * Sealed form: `nonce (24 bytes) || box`. Pure apart from the random nonce.
 */

export const NONCE_BYTES = nacl.secretbox.nonceLength;
export const KEY_BYTES = nacl.secretbox.keyLength;

/** A sealed payload could not be opened: wrong key, truncated or tampered with. */
export class EventDecryptError extends Error {
  constructor(message = "The stored event could not be decrypted.") {
    super(message);
    this.name = "EventDecryptError";
  }
}

/**
 * Derives and caches workspace keys: HMAC-SHA256(masterKey, "runs-events:" + workspaceId).
 * The derivation is deterministic, so every node derives the same key from the same
 * `RUNS_MASTER_KEY`.
 */
export class EventKeyring {
  private readonly master: Buffer;
  private readonly cache = new Map<string, Uint8Array>();

  /** `masterKeyBase64` must decode to exactly 32 bytes. */
  constructor(masterKeyBase64: string) {
    const master = Buffer.from(masterKeyBase64, "base64");
    if (master.length !== KEY_BYTES || master.toString("base64").replace(/=+$/, "") !== masterKeyBase64.trim().replace(/=+$/, "")) {
      throw new Error(`The events master key must be ${KEY_BYTES} bytes of base64.`);
    }
    this.master = master;
  }

  keyFor(workspaceId: string): Uint8Array {
    let key = this.cache.get(workspaceId);
    if (!key) {
      key = deriveWorkspaceKey(this.master, workspaceId);
      this.cache.set(workspaceId, key);
    }
    return key;
  }
}

export function deriveWorkspaceKey(master: Uint8Array, workspaceId: string): Uint8Array {
  return new Uint8Array(createHmac("sha256", master).update(`runs-events:${workspaceId}`, "utf8").digest());
}

/** Encrypts `plaintext` under `key` with a fresh random nonce: `nonce || box`. */
export function seal(key: Uint8Array, plaintext: Uint8Array): Uint8Array {
  const nonce = nacl.randomBytes(NONCE_BYTES);
  const box = nacl.secretbox(plaintext, nonce, key);
  const out = new Uint8Array(NONCE_BYTES + box.length);
  out.set(nonce, 0);
  out.set(box, NONCE_BYTES);
  return out;
}

/** Decrypts a `seal` result; throws {@link EventDecryptError} on a wrong key or any change. */
export function open(key: Uint8Array, sealed: Uint8Array): Uint8Array {
  if (sealed.length < NONCE_BYTES + nacl.secretbox.overheadLength) throw new EventDecryptError("The stored event is too short.");
  const plain = nacl.secretbox.open(sealed.subarray(NONCE_BYTES), sealed.subarray(0, NONCE_BYTES), key);
  if (!plain) throw new EventDecryptError();
  return plain;
}
