/**
 * SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed pseudorandom function with a 128-bit
 * key and a 64-bit output, made to authenticate short messages. Event ids carry one as
 * their tag (src/event-ids.ts): every replayed event needs a tag, and this costs a small
 * fraction of an HMAC-SHA256 in JavaScript (docs/performance.md, "SSE delivery"). Checked
 * against the paper's vectors and libsodium's `crypto_shorthash` (test/unit/siphash.test.ts).
 *
 * 64-bit words are held as two 32-bit halves; byte order is little-endian throughout.
 */

/** The 64-bit tag of `message` under the 16-byte `key`, written into `out[0, 8)`. */
export function sipHash24Into(key: Uint8Array, message: Uint8Array, out: Uint8Array): void {
  if (key.length !== 16) throw new RangeError("a SipHash key is 16 bytes");
  const k0l = word(key, 0);
  const k0h = word(key, 4);
  const k1l = word(key, 8);
  const k1h = word(key, 12);
  // "somepseudorandomlygeneratedbytes"
  state[0] = k0l ^ 0x70736575;
  state[1] = k0h ^ 0x736f6d65;
  state[2] = k1l ^ 0x6e646f6d;
  state[3] = k1h ^ 0x646f7261;
  state[4] = k0l ^ 0x6e657261;
  state[5] = k0h ^ 0x6c796765;
  state[6] = k1l ^ 0x79746573;
  state[7] = k1h ^ 0x74656462;
  const length = message.length;
  const whole = length - (length % 8);
  for (let at = 0; at < whole; at += 8) absorb(word(message, at), word(message, at + 4));
  // The last block: the remaining bytes, and the length's low byte in the top byte.
  let lastLow = 0;
  let lastHigh = (length & 0xff) << 24;
  for (let i = whole; i < length; i++) {
    const shift = (i - whole) * 8;
    if (shift < 32) lastLow |= message[i]! << shift;
    else lastHigh |= message[i]! << (shift - 32);
  }
  absorb(lastLow >>> 0, lastHigh >>> 0);
  state[4] = (state[4]! ^ 0xff) >>> 0;
  for (let i = 0; i < 4; i++) round();
  const low = state[0]! ^ state[2]! ^ state[4]! ^ state[6]!;
  const high = state[1]! ^ state[3]! ^ state[5]! ^ state[7]!;
  out[0] = low;
  out[1] = low >>> 8;
  out[2] = low >>> 16;
  out[3] = low >>> 24;
  out[4] = high;
  out[5] = high >>> 8;
  out[6] = high >>> 16;
  out[7] = high >>> 24;
}

/** v0..v3 as (low, high) pairs. */
const state = new Uint32Array(8);

function word(bytes: Uint8Array, at: number): number {
  return (bytes[at]! | (bytes[at + 1]! << 8) | (bytes[at + 2]! << 16) | (bytes[at + 3]! << 24)) >>> 0;
}

function absorb(low: number, high: number): void {
  state[6] ^= low;
  state[7] ^= high;
  round();
  round();
  state[0] ^= low;
  state[1] ^= high;
}

/** One SipRound on {@link state}. */
function round(): void {
  let v0l = state[0]!, v0h = state[1]!, v1l = state[2]!, v1h = state[3]!;
  let v2l = state[4]!, v2h = state[5]!, v3l = state[6]!, v3h = state[7]!;
  let l: number, h: number;

  // v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32)
  l = (v0l + v1l) >>> 0;
  v0h = (v0h + v1h + (l < v0l ? 1 : 0)) >>> 0;
  v0l = l;
  l = ((v1l << 13) | (v1h >>> 19)) >>> 0;
  h = ((v1h << 13) | (v1l >>> 19)) >>> 0;
  v1l = (l ^ v0l) >>> 0;
  v1h = (h ^ v0h) >>> 0;
  l = v0l;
  v0l = v0h;
  v0h = l;

  // v2 += v3; v3 = rotl(v3, 16); v3 ^= v2
  l = (v2l + v3l) >>> 0;
  v2h = (v2h + v3h + (l < v2l ? 1 : 0)) >>> 0;
  v2l = l;
  l = ((v3l << 16) | (v3h >>> 16)) >>> 0;
  h = ((v3h << 16) | (v3l >>> 16)) >>> 0;
  v3l = (l ^ v2l) >>> 0;
  v3h = (h ^ v2h) >>> 0;

  // v0 += v3; v3 = rotl(v3, 21); v3 ^= v0
  l = (v0l + v3l) >>> 0;
  v0h = (v0h + v3h + (l < v0l ? 1 : 0)) >>> 0;
  v0l = l;
  l = ((v3l << 21) | (v3h >>> 11)) >>> 0;
  h = ((v3h << 21) | (v3l >>> 11)) >>> 0;
  v3l = (l ^ v0l) >>> 0;
  v3h = (h ^ v0h) >>> 0;

  // v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32)
  l = (v2l + v1l) >>> 0;
  v2h = (v2h + v1h + (l < v2l ? 1 : 0)) >>> 0;
  v2l = l;
  l = ((v1l << 17) | (v1h >>> 15)) >>> 0;
  h = ((v1h << 17) | (v1l >>> 15)) >>> 0;
  v1l = (l ^ v2l) >>> 0;
  v1h = (h ^ v2h) >>> 0;
  l = v2l;
  v2l = v2h;
  v2h = l;

  state[0] = v0l;
  state[1] = v0h;
  state[2] = v1l;
  state[3] = v1h;
  state[4] = v2l;
  state[5] = v2h;
  state[6] = v3l;
  state[7] = v3h;
}
