/**
 * RateLimiter over a stand-in KV (the limiter's decisions; the shared counter against real
 * NATS is in test/integration/rate-limits.test.ts): a lost compare-and-set is another
 * node's write, read again; any other failure of the bucket is not a spent window.
 */
import test from "ava";
import type { KV } from "@nats-io/kv";
import { JetStreamApiError } from "@nats-io/jetstream";
import { COUNTER_AWAY_MS, RateLimiter } from "../../gateway/rate-limits.js";
import { systemClock } from "../../src/clock.js";
import { TestClock } from "../helpers/actor-fakes.js";

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

test("rate limiter - the bucket failing otherwise (NATS or JetStream away): this node counts the window alone, up to the limit, then 429; the next window asks the counter again", async (t) => {
  const timeout = Object.assign(new Error("TIMEOUT"), { name: "TimeoutError" });
  let away = true;
  const { kv, creates } = counterKv(() => (away ? timeout : undefined));
  const clock = new TestClock(60_000 * 1_000);
  const told: unknown[] = [];
  const limiter = new RateLimiter(kv, config, clock, (err) => told.push(err));

  const decisions = await Promise.all(Array.from({ length: 12 }, () => limiter.take("ws_1", "solo", "standard")));
  t.deepEqual(decisions.map((d) => d.allowed), [...Array(10).fill(true), false, false], "the limit (10), then refused");
  t.deepEqual(decisions.slice(0, 10).map((d) => d.remaining), [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
  t.true(decisions.slice(10).every((d) => d.retryAfterS >= 1 && d.retryAfterS <= 60), "a refusal says when the window ends (Retry-After)");
  t.is(creates(), 1, "the unreachable counter is asked once in the window, not per request");
  t.true((await limiter.take("ws_2", "solo", "standard")).allowed, "another workspace is counted alone too");
  t.is(creates(), 1, "the counter just found away is not asked again at once (COUNTER_AWAY_MS)");
  t.deepEqual(told, [timeout], "told once per window, not per workspace");

  // The next window: the counter is back and counts again.
  away = false;
  clock.advance(60_000);
  t.true((await limiter.take("ws_1", "solo", "standard")).allowed);
  t.is(creates(), 2);
  t.is((await limiter.take("ws_1", "solo", "standard")).remaining, 8, "shared again: one grant of one token at a time");
});

test("rate limiter - a window partly spent through the counter before it went away: this node spends only what was left of it", async (t) => {
  const timeout = Object.assign(new Error("TIMEOUT"), { name: "TimeoutError" });
  let away = false;
  const { kv } = counterKv(() => (away ? timeout : undefined));
  const clock = new TestClock(60_000 * 2_000);
  const limiter = new RateLimiter(kv, config, clock);
  // The stand-in counter takes one create; later grants update it (a grant is one token at a limit of 10).
  for (let i = 0; i < 4; i++) t.true((await limiter.take("ws_1", "solo", "standard")).allowed);
  away = true;
  const failing = kv as unknown as { update: (...args: unknown[]) => Promise<number> };
  failing.update = async () => {
    throw timeout;
  };
  const rest = [];
  for (let i = 0; i < 8; i++) rest.push((await limiter.take("ws_1", "solo", "standard")).allowed);
  t.deepEqual(rest, [true, true, true, true, true, true, false, false], "6 of the 10 were left");
});

test("rate limiter - for COUNTER_AWAY_MS after the counter failed, new windows are counted alone without asking it (an ask waits for its timeout)", async (t) => {
  const timeout = Object.assign(new Error("TIMEOUT"), { name: "TimeoutError" });
  const { kv, creates } = counterKv(() => timeout);
  const clock = new TestClock(1_000 * 5_000);
  const limiter = new RateLimiter(kv, { ...config, windowMs: 1_000 }, clock);
  t.true((await limiter.take("ws_1", "solo", "standard")).allowed);
  t.is(creates(), 1);
  for (let step = 1; step * 1_000 < COUNTER_AWAY_MS; step++) {
    clock.advance(1_000); // a new window each time
    t.true((await limiter.take("ws_1", "solo", "standard")).allowed);
  }
  t.is(creates(), 1, "not asked while it was just found away");
  clock.advance(1_000);
  t.true((await limiter.take("ws_1", "solo", "standard")).allowed);
  t.is(creates(), 2, "asked again after COUNTER_AWAY_MS");
});

test("rate limiter - concurrent requests far from the limit are all served: one grant sized for the waiting ones, not a few small grants raced for until some give up", async (t) => {
  const wide = { windowMs: 60_000, perWindow: { solo: { standard: 300, expensive: 20, exempt: 3000 }, business: { standard: 3000, expensive: 100, exempt: 30000 } } };
  const { kv, creates } = counterKv(() => undefined);
  const limiter = new RateLimiter(kv, wide, systemClock);
  // 40 at once at 300 a window (grants of 6), then 10 at once at 20 (grants of 1).
  const standard = await Promise.all(Array.from({ length: 40 }, () => limiter.take("ws_1", "solo", "standard")));
  t.deepEqual(standard.filter((d) => !d.allowed).length, 0, JSON.stringify(standard.filter((d) => !d.allowed)));
  t.is(creates(), 1);
  // The stand-in KV holds one counter: another limiter over another for the next class.
  const other = new RateLimiter(counterKv(() => undefined).kv, wide, systemClock);
  const expensive = await Promise.all(Array.from({ length: 10 }, () => other.take("ws_2", "solo", "expensive")));
  t.is(expensive.filter((d) => d.allowed).length, 10);
  // Past the limit all the same: 25 at once at 20, 10 of them spent above.
  const more = await Promise.all(Array.from({ length: 25 }, () => other.take("ws_2", "solo", "expensive")));
  t.is(more.filter((d) => d.allowed).length, 10);
});
