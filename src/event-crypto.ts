import { createHmac, randomFillSync } from "node:crypto";
import nacl from "tweetnacl";
import { openSealed } from "./secretbox-open.js";

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
    this.master = masterKeyBytes(masterKeyBase64, "events");
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
  return deriveLabelledKey(master, "events", workspaceId);
}

/**
 * A workspace's key for one kind of stored data: HMAC-SHA256(master, "runs-<label>:" +
 * workspaceId). Each kind has its own label (events, env, files, checkpoints), so a key
 * of one kind never opens another's data.
 */
export function deriveLabelledKey(master: Uint8Array, label: string, workspaceId: string): Uint8Array {
  return new Uint8Array(createHmac("sha256", master).update(`runs-${label}:${workspaceId}`, "utf8").digest());
}

/** RUNS_MASTER_KEY as bytes; throws unless it is exactly 32 bytes of canonical base64. */
export function masterKeyBytes(masterKeyBase64: string, what: string): Buffer {
  const master = Buffer.from(masterKeyBase64, "base64");
  if (master.length !== KEY_BYTES || master.toString("base64").replace(/=+$/, "") !== masterKeyBase64.trim().replace(/=+$/, "")) {
    throw new Error(`The ${what} master key must be ${KEY_BYTES} bytes of base64.`);
  }
  return master;
}

/**
 * tweetnacl's own crypto_secretbox, without its byte-copying wrapper (it cost more than
 * the cipher on event-sized payloads; profile in docs/performance.md). The format is
 * unchanged (a unit test checks both ways against the wrappers).
 */
const lowlevel = (nacl as unknown as {
  lowlevel: { crypto_secretbox(c: Uint8Array, m: Uint8Array, d: number, n: Uint8Array, k: Uint8Array): number };
}).lowlevel;
/** crypto_secretbox works on the message after 32 zero bytes; the box starts after 16. */
const ZERO_BYTES = 32;
const BOX_ZERO_BYTES = 16;

/** Random nonces drawn from a pooled CSPRNG buffer (one fill per 170 nonces). */
const noncePool = new Uint8Array(NONCE_BYTES * 170);
let noncePoolAt = noncePool.length;

function freshNonce(): Uint8Array {
  if (noncePoolAt + NONCE_BYTES > noncePool.length) {
    randomFillSync(noncePool);
    noncePoolAt = 0;
  }
  const nonce = noncePool.slice(noncePoolAt, noncePoolAt + NONCE_BYTES);
  noncePoolAt += NONCE_BYTES;
  return nonce;
}

/** Encrypts `plaintext` under `key` with a fresh random nonce: `nonce || box`. */
export function seal(key: Uint8Array, plaintext: Uint8Array): Uint8Array {
  if (key.length !== KEY_BYTES) throw new RangeError("bad key size");
  const nonce = freshNonce();
  const m = new Uint8Array(ZERO_BYTES + plaintext.length);
  m.set(plaintext, ZERO_BYTES);
  // The box is written right behind the nonce: c[0..16) are zeros the nonce then covers.
  const out = new Uint8Array(NONCE_BYTES - BOX_ZERO_BYTES + m.length);
  const c = out.subarray(NONCE_BYTES - BOX_ZERO_BYTES);
  lowlevel.crypto_secretbox(c, m, m.length, nonce, key);
  out.set(nonce, 0);
  return out;
}

/** Decrypts a `seal` result; throws {@link EventDecryptError} on a wrong key or any change. */
export function open(key: Uint8Array, sealed: Uint8Array): Uint8Array {
  return openedPlaintext(key, sealed).slice();
}

const utf8 = new TextDecoder();

/** A `seal` result's plaintext as UTF-8 text, decoded where it was opened (no copy). */
export function openText(key: Uint8Array, sealed: Uint8Array): string {
  return utf8.decode(openedPlaintext(key, sealed));
}

/**
 * A `seal` result's plaintext as a view valid only until the next open (it may lie in
 * libsodium's scratch memory): read or copy it at once.
 */
export function openedPlaintext(key: Uint8Array, sealed: Uint8Array): Uint8Array {
  if (sealed.length < NONCE_BYTES + nacl.secretbox.overheadLength) throw new EventDecryptError("The stored event is too short.");
  if (key.length !== KEY_BYTES) throw new RangeError("bad key size");
  const plain = openSealed(key, sealed);
  if (!plain) throw new EventDecryptError();
  return plain;
}
