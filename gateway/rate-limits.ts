import type { KV } from "@nats-io/kv";
import { type Clock, isCasConflict, type Plan } from "../src/index.js";

/** Request classes with their own limits (decisions §7). */
export const RateClass = { standard: "standard", expensive: "expensive", exempt: "exempt" } as const;
export type RateClass = (typeof RateClass)[keyof typeof RateClass];

export interface RateLimitConfig {
  windowMs: number;
  perWindow: Record<Plan, Record<RateClass, number>>;
}

export interface RateDecision {
  allowed: boolean;
  limit: number;
  remaining: number;
  /** Unix seconds when the window resets. */
  resetS: number;
  /** Seconds to wait before retrying, when refused. */
  retryAfterS: number;
}

interface LocalWindow {
  window: number;
  /** Tokens this node was granted and has not used yet. */
  tokens: number;
  /** The shared count after this node's last grant. */
  sharedCount: number;
  /** The shared counter is exhausted for this window. */
  exhausted: boolean;
  /** The shared counter could not be reached in this window: this node counts alone (see countAlone). */
  alone?: boolean;
  /** A grant in flight, so concurrent requests share one KV round trip. */
  pending?: Promise<void>;
  /** Requests waiting for tokens: a grant takes enough for all of them (within the limit). */
  waiting: number;
}

/** How long a node counts alone, without asking the shared counter, after finding it unreachable. */
export const COUNTER_AWAY_MS = 5_000;

/** Tokens a node takes from the shared counter at once: small limits are exact. */
export function grantSize(limit: number): number {
  return Math.max(1, Math.floor(limit / 50));
}

/**
 * Per-workspace rate limits shared by every key and every node: a counter per
 * (workspace, class, window) in a JetStream KV bucket, advanced by compare-and-set.
 * A node takes tokens from it in small grants and spends them locally, so the total
 * served in a window never exceeds the limit, however many nodes or keys there are —
 * while the counter can be reached (see countAlone).
 */
export class RateLimiter {
  private readonly local = new Map<string, LocalWindow>();
  /** The last window in which `onAlone` was told (once per window, not per workspace). */
  private aloneToldWindow = -1;
  /** Until then the counter is not asked (it was just found away): each ask waits for its timeout. */
  private counterAwayUntilMs = 0;

  constructor(
    private readonly kv: KV,
    private readonly config: RateLimitConfig,
    private readonly clock: Clock,
    /** Told when a window is counted alone: the error that made the counter unreachable. */
    private readonly onAlone: (err: unknown) => void = () => undefined,
  ) {}

  async take(workspaceId: string, plan: Plan, rateClass: RateClass): Promise<RateDecision> {
    const limit = this.config.perWindow[plan][rateClass];
    const now = this.clock.nowMs();
    const window = Math.floor(now / this.config.windowMs);
    const resetMs = (window + 1) * this.config.windowMs;
    const key = `${workspaceId}.${rateClass}`;
    let state = this.local.get(key);
    if (!state || state.window !== window) {
      state = { window, tokens: 0, sharedCount: 0, exhausted: false, waiting: 0 };
      this.local.set(key, state);
      if (this.local.size > 50_000) this.evictOld(window);
    }
    if (state.tokens === 0 && !state.exhausted && !state.alone && now < this.counterAwayUntilMs) this.countAlone(state, limit, undefined);
    // Concurrent requests wait on one grant sized for all of them; one that finds the tokens
    // taken by those ahead asks again (bounded: the counter's exhaustion ends it sooner).
    state.waiting++;
    try {
      for (let attempt = 0; attempt < 8 && state.tokens === 0 && !state.exhausted && !state.alone; attempt++) {
        const counted = state;
        counted.pending ??= this.grant(counted, `${key}.${window}`, limit)
          .catch((err: unknown) => this.countAlone(counted, limit, err))
          .finally(() => {
            counted.pending = undefined;
          });
        await counted.pending;
      }
    } finally {
      state.waiting--;
    }
    const decision = (allowed: boolean): RateDecision => ({
      allowed,
      limit,
      remaining: Math.max(0, limit - state!.sharedCount + state!.tokens),
      resetS: Math.ceil(resetMs / 1000),
      retryAfterS: Math.max(1, Math.ceil((resetMs - now) / 1000)),
    });
    if (state.tokens === 0) return decision(false);
    state.tokens--;
    return decision(true);
  }

  /** The current view without taking a token (for routes that are never limited). */
  peek(workspaceId: string, plan: Plan, rateClass: RateClass): RateDecision {
    const limit = this.config.perWindow[plan][rateClass];
    const now = this.clock.nowMs();
    const window = Math.floor(now / this.config.windowMs);
    const resetMs = (window + 1) * this.config.windowMs;
    const state = this.local.get(`${workspaceId}.${rateClass}`);
    const current = state && state.window === window ? state : undefined;
    return {
      allowed: true,
      limit,
      remaining: current ? Math.max(0, limit - current.sharedCount + current.tokens) : limit,
      resetS: Math.ceil(resetMs / 1000),
      retryAfterS: Math.max(1, Math.ceil((resetMs - now) / 1000)),
    };
  }

  private async grant(state: LocalWindow, kvKey: string, limit: number): Promise<void> {
    for (let attempt = 0; attempt < 10; attempt++) {
      const entry = await this.kv.get(kvKey);
      const count = entry && entry.operation === "PUT" ? Number(entry.string()) : 0;
      if (count >= limit) {
        state.exhausted = true;
        state.sharedCount = count;
        return;
      }
      const size = Math.min(Math.max(grantSize(limit), state.waiting), limit - count);
      try {
        if (entry) await this.kv.update(kvKey, String(count + size), entry.revision);
        else await this.kv.create(kvKey, String(count + size));
        state.tokens += size;
        state.sharedCount = count + size;
        return;
      } catch (err) {
        // Another node advanced the counter first: read again. Anything else (NATS or
        // JetStream away) is a 503 with a short Retry-After, not a spent window's 429.
        if (!isCasConflict(err)) throw err;
      }
    }
  }

  /**
   * The shared counter cannot be reached (NATS or JetStream away; a lost compare-and-set is
   * retried in `grant`, not this). Refusing every request until it is back would stop reads
   * too, which the store still answers; instead this node spends alone what was left of the
   * window when it last saw the counter (all of it in a window it had not asked for yet), and
   * asks the counter again in the next window, or {@link COUNTER_AWAY_MS} after it failed
   * (an ask waits for its timeout). Each node then stays within the limit; while the counter
   * is away, the nodes together may serve up to their number times it.
   */
  private countAlone(state: LocalWindow, limit: number, err: unknown): void {
    if (err !== undefined) this.counterAwayUntilMs = this.clock.nowMs() + COUNTER_AWAY_MS;
    state.alone = true;
    state.tokens += Math.max(0, limit - state.sharedCount);
    state.sharedCount = limit; // the headers' `remaining` is then what this node has left
    if (err !== undefined && state.window !== this.aloneToldWindow) {
      this.aloneToldWindow = state.window;
      this.onAlone(err);
    }
  }

  private evictOld(window: number): void {
    for (const [key, state] of this.local) if (state.window < window) this.local.delete(key);
  }
}
