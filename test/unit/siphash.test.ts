import { createRequire } from "node:module";
import { randomBytes } from "node:crypto";
import test from "ava";
import { sipHash24Into } from "../../src/siphash.js";

const hex = (bytes: Uint8Array) => Buffer.from(bytes).toString("hex");
const KEY = Uint8Array.from({ length: 16 }, (_, i) => i);
const tagOf = (key: Uint8Array, message: Uint8Array) => {
  const out = new Uint8Array(8);
  sipHash24Into(key, message, out);
  return out;
};

test("siphash - the reference vectors (key 00..0f, messages 00.., as the paper's vectors.h lists them)", (t) => {
  t.is(hex(tagOf(KEY, new Uint8Array(0))), "310e0edd47db6f72");
  t.is(hex(tagOf(KEY, Uint8Array.from({ length: 15 }, (_, i) => i))), "e545be4961ca29a1");
});

test("siphash - equals libsodium's crypto_shorthash (SipHash-2-4) at every length to 64 bytes and on random keys", async (t) => {
  const sodium = createRequire(import.meta.url)("libsodium") as {
    ready: Promise<unknown>;
    HEAPU8: Uint8Array;
    _malloc(n: number): number;
    _free(p: number): void;
    _crypto_shorthash(out: number, input: number, lengthLow: number, lengthHigh: number, key: number): number;
  };
  await sodium.ready;
  const base = sodium._malloc(16 + 8 + 256);
  try {
    const reference = (key: Uint8Array, message: Uint8Array) => {
      sodium.HEAPU8.set(key, base);
      sodium.HEAPU8.set(message, base + 24);
      sodium._crypto_shorthash(base + 16, base + 24, message.length, 0, base);
      return hex(sodium.HEAPU8.subarray(base + 16, base + 24));
    };
    let compared = 0;
    for (let round = 0; round < 20; round++) {
      const key = round === 0 ? KEY : randomBytes(16);
      for (let length = 0; length <= 64; length++) {
        const message = round === 0 ? Uint8Array.from({ length }, (_, i) => i) : randomBytes(length);
        t.is(hex(tagOf(key, message)), reference(key, message), `round ${round}, length ${length}`);
        compared++;
      }
    }
    // Bytes with the top bit set in every position (sign handling of the 32-bit halves).
    const ones = new Uint8Array(40).fill(0xff);
    t.is(hex(tagOf(ones.subarray(0, 16), ones)), reference(ones.subarray(0, 16), ones));
    t.is(compared, 20 * 65);
  } finally {
    sodium._free(base);
  }
});

test("siphash - a key that is not 16 bytes is refused", (t) => {
  t.throws(() => tagOf(new Uint8Array(15), new Uint8Array(1)), { instanceOf: RangeError });
});
