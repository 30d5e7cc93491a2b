import { createRequire } from "node:module";
import nacl from "tweetnacl";

/**
 * XSalsa20-Poly1305 `crypto_secretbox_open` through libsodium compiled to WebAssembly (the
 * `libsodium` package, pinned), for reading stored events: every replayed event is opened,
 * and tweetnacl's JavaScript took ~3.5 µs an event against ~1 µs here (docs/performance.md).
 * The format is tweetnacl's, unchanged: libsodium's `secretbox_easy` box is tweetnacl's box
 * (the 16-byte tag, then the ciphertext). Sealing stays with tweetnacl.
 *
 * The box is copied into a scratch area of the module's memory and opened there; the
 * plaintext is handed out as a view of that memory, valid until the next call (callers
 * decode it at once). Until the module is loaded ({@link secretboxReady}), or if it
 * cannot be, or fails the self-check below (a future build calling the function
 * differently), tweetnacl opens instead: {@link secretboxBackend} says which one is in use.
 */

interface Sodium {
  ready: Promise<unknown>;
  HEAPU8: Uint8Array;
  _malloc(bytes: number): number;
  _free(pointer: number): void;
  /** (m, c, clen as low and high 32 bits, n, k) → 0 when the box is authentic. */
  _crypto_secretbox_open_easy(m: number, c: number, clenLow: number, clenHigh: number, n: number, k: number): number;
}

const KEY_BYTES = 32;
const NONCE_BYTES = 24;
const TAG_BYTES = 16;
/** The scratch area starts at this size and doubles as boxes need (events are small). */
const INITIAL_CAPACITY = 64 * 1024;
/** How long loading libsodium may take before tweetnacl is kept for good. */
const LOAD_TIMEOUT_MS = 10_000;

let sodium: Sodium | undefined;
/** Key (32 bytes) and nonce (24) at `base`, the box behind them, `capacity` bytes on the plaintext. */
let base = 0;
let capacity = 0;

function reserve(boxBytes: number): void {
  if (boxBytes <= capacity) return;
  const s = sodium!;
  let next = Math.max(INITIAL_CAPACITY, capacity);
  while (next < boxBytes) next *= 2;
  const pointer = s._malloc(KEY_BYTES + NONCE_BYTES + next * 2);
  if (pointer === 0) throw new RangeError("no memory for the box");
  if (base !== 0) s._free(base);
  base = pointer;
  capacity = next;
}

/**
 * Opens `sealed` (nonce, then the box: the tag and the ciphertext) with `key`: the
 * plaintext, or null when the box is not authentic. With libsodium the result is a view
 * of its memory, overwritten by the next call.
 */
export function openSealed(key: Uint8Array, sealed: Uint8Array): Uint8Array | null {
  if (sealed.length < NONCE_BYTES + TAG_BYTES) return null;
  const s = sodium;
  if (!s) return naclOpen(key, sealed);
  const boxBytes = sealed.length - NONCE_BYTES;
  reserve(boxBytes);
  // HEAPU8 is read after reserve: a grown memory is a new buffer.
  const heap = s.HEAPU8;
  const n = base + KEY_BYTES;
  const c = n + NONCE_BYTES;
  const m = c + capacity;
  // A build whose memory view does not follow its growth (libsodium's JavaScript fallback,
  // used where WebAssembly is missing) would misplace the box: tweetnacl opens instead.
  if (heap.length < m + capacity) return naclOpen(key, sealed);
  heap.set(key, base);
  heap.set(sealed, n); // the nonce, and the box right behind it at c: one copy
  return s._crypto_secretbox_open_easy(m, c, boxBytes, 0, n, base) === 0 ? heap.subarray(m, m + boxBytes - TAG_BYTES) : null;
}

/**
 * tweetnacl's crypto_secretbox_open, without its byte-copying wrappers (they cost more than
 * the cipher on event-sized payloads): it reads the box from c[16..] and ignores c[0..16),
 * so the last 16 nonce bytes can stand there and the sealed bytes are used in place.
 */
export function naclOpen(key: Uint8Array, sealed: Uint8Array): Uint8Array | null {
  const c = sealed.subarray(NONCE_BYTES - TAG_BYTES);
  const m = new Uint8Array(c.length);
  if (lowlevel.crypto_secretbox_open(m, c, c.length, sealed.subarray(0, NONCE_BYTES), key) !== 0) return null;
  return m.subarray(2 * TAG_BYTES);
}

const lowlevel = (nacl as unknown as {
  lowlevel: { crypto_secretbox_open(m: Uint8Array, c: Uint8Array, d: number, n: Uint8Array, k: Uint8Array): number };
}).lowlevel;

export function secretboxBackend(): "libsodium" | "tweetnacl" {
  return sodium ? "libsodium" : "tweetnacl";
}

/** True when `candidate` opens what tweetnacl sealed, and refuses it once changed. */
async function selfCheck(candidate: Sodium): Promise<boolean> {
  // A module that never gets ready must not hold up the node's start (which awaits this).
  let timer: NodeJS.Timeout | undefined;
  const loaded = await Promise.race([
    candidate.ready.then(() => true),
    new Promise<false>((resolve) => {
      timer = setTimeout(() => resolve(false), LOAD_TIMEOUT_MS);
      timer.unref();
    }),
  ]).finally(() => clearTimeout(timer));
  if (!loaded) return false;
  const key = nacl.randomBytes(KEY_BYTES);
  const nonce = nacl.randomBytes(NONCE_BYTES);
  const message = nacl.randomBytes(300);
  const sealed = new Uint8Array([...nonce, ...nacl.secretbox(message, nonce, key)]);
  sodium = candidate;
  try {
    const opened = openSealed(key, sealed);
    const authentic = opened !== null && Buffer.compare(opened, message) === 0;
    sealed[NONCE_BYTES + TAG_BYTES + 7] = sealed[NONCE_BYTES + TAG_BYTES + 7]! ^ 1;
    return authentic && openSealed(key, sealed) === null;
  } finally {
    sodium = undefined;
  }
}

/**
 * Resolves once libsodium is in use (or known not to be usable). Loading is asynchronous
 * (WebAssembly); until then tweetnacl opens, with the same results. No top-level await:
 * this module is also loaded where that is not allowed (CommonJS transforms).
 */
export const secretboxReady: Promise<void> = (async () => {
  // Without WebAssembly (`node --jitless`) libsodium falls back to a JavaScript build that
  // leaves a rejected promise unhandled while loading, which would end the process.
  if (typeof WebAssembly === "undefined") return;
  try {
    const candidate = createRequire(import.meta.url)("libsodium") as Sodium;
    if (await selfCheck(candidate)) sodium = candidate;
  } catch {
    // Not installed or not loadable here: tweetnacl opens (slower, same format).
  }
})();
