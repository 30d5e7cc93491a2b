/**
 * RateLimiter over a stand-in KV (the limiter's decisions; the shared counter against real
 * NATS is in test/integration/rate-limits.test.ts): a lost compare-and-set is another
 * node's write, read again; any other failure of the bucket is not a spent window.
 */
import test from "ava";
import type { KV } from "@nats-io/kv";
import { JetStreamApiError } from "@nats-io/jetstream";
import { RateLimiter } from "../../gateway/rate-limits.js";
import { systemClock } from "../../src/clock.js";

const config = { windowMs: 60_000, perWindow: { solo: { standard: 10, expensive: 2, exempt: 100 }, business: { standard: 10, expensive: 2, exempt: 100 } } };

/** A KV holding one counter; `createFails` decides what each create throws (undefined: stores). */
function counterKv(createFails: (attempt: number) => Error | undefined) {
  let value: string | undefined;
  let revision = 0;
  let creates = 0;
  const kv = {
    async get() {
      return value === undefined ? null : { operation: "PUT", revision, string: () => value! };
    },
    async create(_key: string, data: string) {
      const err = createFails(++creates);
      if (err) throw err;
      if (value !== undefined) throw new JetStreamApiError({ code: 400, err_code: 10071, description: "wrong last sequence: 1" });
      value = data;
      return ++revision;
    },
    async update(_key: string, data: string, expected: number) {
      if (expected !== revision) throw new JetStreamApiError({ code: 400, err_code: 10071, description: `wrong last sequence: ${revision}` });
      value = data;
      return ++revision;
    },
  };
  return { kv: kv as unknown as KV, creates: () => creates };
}

test("rate limiter - a lost compare-and-set is contention: read again and take the token", async (t) => {
  const { kv, creates } = counterKv((n) => (n === 1 ? new JetStreamApiError({ code: 400, err_code: 10071, description: "wrong last sequence: 3" }) : undefined));
  const decision = await new RateLimiter(kv, config, systemClock).take("ws_1", "solo", "standard");
  t.true(decision.allowed);
  t.is(creates(), 2);
});

test("rate limiter - the bucket failing otherwise (NATS or JetStream away) throws, for a 503 with a short Retry-After: never a 429 until the window ends", async (t) => {
  const timeout = Object.assign(new Error("TIMEOUT"), { name: "TimeoutError" });
  const { kv } = counterKv(() => timeout);
  const err = await new RateLimiter(kv, config, systemClock).take("ws_1", "solo", "standard").catch((e: unknown) => e);
  t.is(err, timeout);
});
