import { randomBytes, randomUUID } from "node:crypto";

const BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/** `n` random base62 characters (rejection sampling, so no modulo bias). */
export function randomBase62(n: number): string {
  let out = "";
  while (out.length < n) {
    for (const byte of randomBytes(n * 2)) {
      if (byte < 248) out += BASE62[byte % 62];
      if (out.length === n) break;
    }
  }
  return out;
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
  /** A webhook message (Standard Webhooks' webhook-id; kept across retries and redeliveries). */
  webhookMessage: () => newId("msg"),
  webhookDelivery: () => newId("whd"),
  reference: () => `ref_${randomBase62(20)}`,
  apiKeyId: () => randomUUID(),
  apiKeySecret: () => `rk_live_${randomBase62(43)}`,
};
