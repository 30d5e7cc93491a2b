import { randomBytes, randomFillSync, randomUUID } from "node:crypto";

const BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/**
 * Random bytes for ids, drawn 4 KiB at a time from the CSPRNG, each used once (as Node's
 * own randomUUID caches its randomness): a request makes a few ids, and a call into the
 * CSPRNG with a fresh buffer per id cost more than the id. Not for secrets (the pool
 * holds the next ones in the heap): API key secrets draw their own bytes.
 */
const pool = Buffer.alloc(4096);
let poolAt = pool.length;

function randomByte(): number {
  if (poolAt === pool.length) {
    randomFillSync(pool);
    poolAt = 0;
  }
  return pool[poolAt++]!;
}

/** `n` random base62 characters (rejection sampling, so no modulo bias) from `next` bytes. */
export function randomBase62(n: number, next: () => number = randomByte): string {
  let out = "";
  // 8 of 256 bytes are rejected: 64 bytes per character cannot run out in practice.
  for (let tries = 0; out.length < n; tries++) {
    if (tries === n * 64) throw new Error("the random source keeps giving rejected bytes");
    const byte = next();
    if (byte < 248) out += BASE62[byte % 62];
  }
  return out;
}

/** `n` random base62 characters from bytes drawn for them alone, zeroed after use. */
function secretBase62(n: number): string {
  const bytes = randomBytes(n * 2);
  let at = 0;
  const next = () => {
    if (at === bytes.length) {
      randomFillSync(bytes);
      at = 0;
    }
    return bytes[at++]!;
  };
  try {
    return randomBase62(n, next);
  } finally {
    bytes.fill(0);
  }
}

/**
 * Time-ordered opaque id: 9 base62 chars of milliseconds then 14 random chars, so ids
 * sort by creation time (used as a tie-breaker in lists).
 */
export function newId(prefix: string, nowMs: number = Date.now()): string {
  let t = nowMs;
  let time = "";
  for (let i = 0; i < 9; i++) {
    time = BASE62[t % 62] + time;
    t = Math.floor(t / 62);
  }
  return `${prefix}_${time}${randomBase62(14)}`;
}

/** Where ids come from: {@link Ids} in the service, injected so that tests may choose them. */
export type IdSource = typeof Ids;

export const Ids = {
  workspace: () => newId("ws"),
  agent: () => newId("agt"),
  run: () => newId("run"),
  turn: () => newId("turn"),
  file: () => newId("file"),
  webhook: () => newId("wh"),
  action: () => newId("act"),
  /** A cancel request's (kept with its Idempotency-Key: a repeat finds the turn it cancelled). */
  cancel: () => newId("cnl"),
  /** A webhook message (Standard Webhooks' webhook-id; kept across retries and redeliveries). */
  webhookMessage: () => newId("msg"),
  webhookDelivery: () => newId("whd"),
  reference: () => `ref_${randomBase62(20)}`,
  apiKeyId: () => randomUUID(),
  apiKeySecret: () => `rk_live_${secretBase62(43)}`,
};
