import test from "ava";
import { nextWaitMs, parseRetryAfter, retryDelayMs, waitIntervalMs, waitSchedule } from "../../client/schedule.js";

// runs-api.md, Waiting for a result: first read after 1000 ms, each next interval 1.5× longer
// up to 10 s, each wait lengthened at random by up to 20% and never shortened.
const EXPECTED: Record<string, number[]> = {
  // 1000, 1500, 2250, 3375, 5062.5, 7593.75, then the 10 s cap (whole ms, rounded up).
  "0": [1000, 1500, 2250, 3375, 5063, 7594, 10000, 10000, 10000, 10000, 10000, 10000, 10000, 10000, 10000],
  // +10%
  "0.5": [1100, 1650, 2475, 3713, 5569, 8354, 11000, 11000, 11000, 11000, 11000, 11000, 11000, 11000, 11000],
  // +19.98%
  "0.999": [1200, 1800, 2700, 4050, 6074, 9111, 11998, 11998, 11998, 11998, 11998, 11998, 11998, 11998, 11998],
};

for (const [random, waits] of Object.entries(EXPECTED)) {
  test(`client-schedule - waitSchedule for attempts 0..14 with random ${random} is the recommended sequence`, (t) => {
    t.deepEqual(
      waits.map((_, attempt) => waitSchedule(attempt, Number(random))),
      waits,
    );
  });
}

test("client-schedule - intervals grow by 1.5 up to 10 s and stay there", (t) => {
  t.deepEqual([0, 1, 2, 3, 4, 5, 6, 7, 100, 10_000].map(waitIntervalMs), [1000, 1500, 2250, 3375, 5062.5, 7593.75, 10000, 10000, 10000, 10000]);
  t.throws(() => waitIntervalMs(-1), { instanceOf: RangeError });
  t.throws(() => waitIntervalMs(1.5), { instanceOf: RangeError });
});

test("client-schedule - a wait is never shortened and lengthened by at most 20%", (t) => {
  for (let attempt = 0; attempt < 30; attempt++) {
    const base = waitIntervalMs(attempt);
    for (let i = 0; i < 100; i++) {
      const random = i / 100;
      const wait = waitSchedule(attempt, random);
      t.true(wait >= base, `attempt ${attempt} random ${random}: ${wait} < ${base}`);
      t.true(wait <= Math.ceil(base * 1.2), `attempt ${attempt} random ${random}: ${wait} > 120%`);
      t.true(Number.isInteger(wait));
    }
  }
  // Out-of-range randomness is clamped, never shortens.
  t.is(waitSchedule(0, -1), 1000);
  t.is(waitSchedule(0, 5), 1200);
});

test("client-schedule - a 429 waits Retry-After or the next interval, whichever is longer", (t) => {
  t.is(nextWaitMs(2, 0), 2250);
  t.is(nextWaitMs(2, 0, 1), 2250, "Retry-After shorter than the interval");
  t.is(nextWaitMs(2, 0, 5), 5000, "Retry-After longer than the interval");
  t.is(nextWaitMs(2, 0.5, 2.4), 2475);
  t.is(nextWaitMs(2, 0.5, 2.5), 2500);
  t.is(nextWaitMs(0, 0, 0), 1000);
  t.is(nextWaitMs(0, 0, Number.NaN), 1000);
});

test("client-schedule - retry delay is Retry-After when given, else a doubling backoff with jitter", (t) => {
  t.is(retryDelayMs(0, 0.9, 1), 1000);
  t.is(retryDelayMs(1, 0.9, 3), 3000);
  t.is(retryDelayMs(0, 0, 0), 0);
  t.deepEqual([0, 1, 2, 3, 4, 5, 40].map((r) => retryDelayMs(r, 0)), [500, 1000, 2000, 4000, 8000, 8000, 8000]);
  t.deepEqual([0, 1, 2].map((r) => retryDelayMs(r, 0.5)), [550, 1100, 2200]);
});

test("client-schedule - parseRetryAfter reads seconds and HTTP dates", (t) => {
  t.is(parseRetryAfter("3", 0), 3);
  t.is(parseRetryAfter(" 1.5 ", 0), 1.5);
  t.is(parseRetryAfter(null, 0), undefined);
  t.is(parseRetryAfter("soon", 0), undefined);
  t.is(parseRetryAfter("-1", 0), undefined);
  const now = Date.parse("2025-01-01T00:00:00Z");
  t.is(parseRetryAfter("Wed, 01 Jan 2025 00:00:07 GMT", now), 7);
  t.is(parseRetryAfter("Wed, 01 Jan 2024 00:00:07 GMT", now), 0);
});
