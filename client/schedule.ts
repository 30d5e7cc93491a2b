/**
 * Pure timing decisions of the client (no timers, no randomness of their own): the polling
 * schedule of "Waiting for a result" (runs-api.md, POST /api/v1/runs) and the retry delays of
 * "Temporary failures" item 4. `random` is a value in [0, 1) supplied by the caller.
 */

/** First read of a waited turn after this long (runs-api.md: "first read after 1000 ms"). */
export const WAIT_FIRST_MS = 1_000;
/** Each next polling interval is this many times longer... */
export const WAIT_GROWTH = 1.5;
/** ...up to this interval. */
export const WAIT_MAX_INTERVAL_MS = 10_000;
/** Each wait is lengthened at random by up to this fraction, never shortened. */
export const WAIT_JITTER = 0.2;

/** Backoff of a retried request when the answer carries no Retry-After. */
export const RETRY_BASE_MS = 500;
export const RETRY_MAX_MS = 8_000;

/**
 * The interval before poll number `attempt` (0 = the first read) without jitter:
 * 1000, 1500, 2250, 3375, 5062.5, 7593.75, then 10000 ms for every later attempt.
 */
export function waitIntervalMs(attempt: number): number {
  if (!Number.isInteger(attempt) || attempt < 0) throw new RangeError(`attempt must be a whole number >= 0, got ${attempt}`);
  // Past the cap the power only grows; stop computing it (1.5^n overflows for huge n).
  if (attempt >= 6) return WAIT_MAX_INTERVAL_MS;
  return Math.min(WAIT_FIRST_MS * WAIT_GROWTH ** attempt, WAIT_MAX_INTERVAL_MS);
}

/**
 * Lengthens `ms` by `random * 20%`, rounded up to a whole millisecond, never below `ms`.
 * (`ms * r / 5` rather than `ms * 1.1`-style factors, and a 1e-9 ms tolerance before
 * rounding up, so binary floating point does not turn 1100 into 1101.)
 */
export function withJitter(ms: number, random: number): number {
  const r = Math.min(Math.max(random, 0), 1);
  const lengthened = ms + (ms * r) / (1 / WAIT_JITTER);
  return Math.max(Math.ceil(ms), Math.ceil(lengthened - 1e-9));
}

/**
 * The wait before poll number `attempt` of {@link RunsClient.waitForTurn}: the interval of
 * {@link waitIntervalMs}, lengthened at random by up to 20% (never shortened), whole ms.
 */
export function waitSchedule(attempt: number, random: number): number {
  return withJitter(waitIntervalMs(attempt), random);
}

/**
 * The wait before the next poll after an answer. A 429 does not end waiting: the wait is its
 * Retry-After or the next interval, whichever is longer. `retryAfterS` is undefined for an
 * ordinary (not yet final) answer.
 */
export function nextWaitMs(attempt: number, random: number, retryAfterS?: number): number {
  const scheduled = waitSchedule(attempt, random);
  if (retryAfterS === undefined || !Number.isFinite(retryAfterS) || retryAfterS < 0) return scheduled;
  return Math.max(scheduled, Math.ceil(retryAfterS * 1000));
}

/**
 * The delay before retry number `retry` (0 = the first retry) of a request answered 429,
 * 502, 503 or 504: the answer's Retry-After when it has one (the server already varies it
 * across clients), otherwise 500 ms doubling up to 8 s, lengthened at random by up to 20%.
 */
export function retryDelayMs(retry: number, random: number, retryAfterS?: number): number {
  if (retryAfterS !== undefined && Number.isFinite(retryAfterS) && retryAfterS >= 0) return Math.ceil(retryAfterS * 1000);
  const base = Math.min(RETRY_BASE_MS * 2 ** Math.min(retry, 16), RETRY_MAX_MS);
  return withJitter(base, random);
}

/**
 * Retry-After as seconds: a non-negative number of seconds, or an HTTP date relative to
 * `nowMs`. Anything else is undefined.
 */
export function parseRetryAfter(header: string | null | undefined, nowMs: number): number | undefined {
  if (header === null || header === undefined) return undefined;
  const value = header.trim();
  if (/^\d+(\.\d+)?$/.test(value)) return Number(value);
  // An HTTP date names a weekday and month; anything else (such as "-1") is not one.
  if (!/[a-z]/i.test(value)) return undefined;
  const date = Date.parse(value);
  if (Number.isNaN(date)) return undefined;
  return Math.max(0, (date - nowMs) / 1000);
}
