/**
 * HMAC-SHA256 (RFC 2104, FIPS 180-4) under one fixed key, for short messages computed very
 * often: every event id carries a tag (src/event-ids.ts), and `createHmac` per id cost more
 * than the rest of encoding it (its context is built and the key imported each time). Here
 * the key's inner and outer pad blocks are compressed once, so a tag of a message under 56
 * bytes costs two SHA-256 compressions in JavaScript and no allocation but the result.
 * Same tags as node:crypto's `createHmac("sha256", key)` (a unit test compares them over
 * every message length across the block boundaries).
 */

const K = new Int32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);
const IV = new Int32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]);
const BLOCK = 64;
/** Cursors hash a few hundred bytes; the bit length must fit 32 bits. */
const MAX_MESSAGE_BYTES = 2 ** 24;

/** Scratch space: one tag is computed at a time (JavaScript is single-threaded). */
const w = new Int32Array(64);
const block = new Uint8Array(BLOCK * 2);
const inner = new Int32Array(8);
const outer = new Int32Array(8);
/** The inner hash's digest, hashed again by the outer one. */
const innerDigest = new Uint8Array(32);
const encoder = new TextEncoder();

/** One SHA-256 compression of `bytes[offset, offset + 64)` into `state`. */
function compress(state: Int32Array, bytes: Uint8Array, offset: number): void {
  for (let i = 0; i < 16; i++) {
    const j = offset + i * 4;
    w[i] = (bytes[j]! << 24) | (bytes[j + 1]! << 16) | (bytes[j + 2]! << 8) | bytes[j + 3]!;
  }
  for (let i = 16; i < 64; i++) {
    const a = w[i - 15]!;
    const b = w[i - 2]!;
    const s0 = ((a >>> 7) | (a << 25)) ^ ((a >>> 18) | (a << 14)) ^ (a >>> 3);
    const s1 = ((b >>> 17) | (b << 15)) ^ ((b >>> 19) | (b << 13)) ^ (b >>> 10);
    w[i] = (w[i - 16]! + s0 + w[i - 7]! + s1) | 0;
  }
  let a = state[0]!, b = state[1]!, c = state[2]!, d = state[3]!;
  let e = state[4]!, f = state[5]!, g = state[6]!, h = state[7]!;
  for (let i = 0; i < 64; i++) {
    const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
    const ch = (e & f) ^ (~e & g);
    const t1 = (h + S1 + ch + K[i]! + w[i]!) | 0;
    const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
    const maj = (a & b) ^ (a & c) ^ (b & c);
    const t2 = (S0 + maj) | 0;
    h = g;
    g = f;
    f = e;
    e = (d + t1) | 0;
    d = c;
    c = b;
    b = a;
    a = (t1 + t2) | 0;
  }
  state[0] = (state[0]! + a) | 0;
  state[1] = (state[1]! + b) | 0;
  state[2] = (state[2]! + c) | 0;
  state[3] = (state[3]! + d) | 0;
  state[4] = (state[4]! + e) | 0;
  state[5] = (state[5]! + f) | 0;
  state[6] = (state[6]! + g) | 0;
  state[7] = (state[7]! + h) | 0;
}

/**
 * Hashes `message` on from `state` (which has absorbed one 64-byte block already, the key's
 * pad): the message's full blocks, then the last one with SHA-256's padding and length.
 */
function finish(state: Int32Array, message: Uint8Array): void {
  const length = message.length;
  if (length > MAX_MESSAGE_BYTES) throw new RangeError("message too long for this HMAC");
  let at = 0;
  for (; at + BLOCK <= length; at += BLOCK) compress(state, message, at);
  const rest = length - at;
  const tail = rest < 56 ? BLOCK : BLOCK * 2;
  block.fill(0, 0, tail);
  block.set(message.subarray(at), 0);
  block[rest] = 0x80;
  // The bit length of pad block + message, big-endian in the last 8 bytes (under 2^32 here).
  const bits = (BLOCK + length) * 8;
  block[tail - 4] = bits >>> 24;
  block[tail - 3] = bits >>> 16;
  block[tail - 2] = bits >>> 8;
  block[tail - 1] = bits;
  compress(state, block, 0);
  if (tail > BLOCK) compress(state, block, BLOCK);
}

export class HmacSha256 {
  private readonly innerStart = new Int32Array(8);
  private readonly outerStart = new Int32Array(8);

  /** `key` of at most 64 bytes (every key here is 32). */
  constructor(key: Uint8Array) {
    if (key.length > BLOCK) throw new RangeError("HMAC keys longer than a block are not supported here");
    const pad = new Uint8Array(BLOCK);
    for (const [start, byte] of [[this.innerStart, 0x36], [this.outerStart, 0x5c]] as const) {
      pad.fill(byte);
      for (let i = 0; i < key.length; i++) pad[i] = key[i]! ^ byte;
      start.set(IV);
      compress(start, pad, 0);
    }
  }

  /** The HMAC of `message` (a string is hashed as its UTF-8 bytes). A new 32-byte array. */
  digest(message: string | Uint8Array): Uint8Array {
    const out = new Uint8Array(32);
    this.digestInto(typeof message === "string" ? asciiOrUtf8(message) : message, out);
    return out;
  }

  /** The HMAC of `message` written into `out[0, 32)` (no allocation: event ids use it). */
  digestInto(message: Uint8Array, out: Uint8Array): void {
    inner.set(this.innerStart);
    finish(inner, message);
    bigEndian(inner, innerDigest);
    outer.set(this.outerStart);
    finish(outer, innerDigest);
    bigEndian(outer, out);
  }
}

/** The eight state words as 32 big-endian bytes into `out`. */
function bigEndian(state: Int32Array, out: Uint8Array): void {
  for (let i = 0; i < 8; i++) {
    const v = state[i]!;
    out[i * 4] = v >>> 24;
    out[i * 4 + 1] = v >>> 16;
    out[i * 4 + 2] = v >>> 8;
    out[i * 4 + 3] = v;
  }
}

/** Scratch for ASCII strings (ids and numbers: what cursors hold), grown as needed. */
let ascii = new Uint8Array(256);

function asciiOrUtf8(text: string): Uint8Array {
  if (text.length > ascii.length) ascii = new Uint8Array(text.length * 2);
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i);
    if (code >= 0x80) return encoder.encode(text);
    ascii[i] = code;
  }
  return ascii.subarray(0, text.length);
}
