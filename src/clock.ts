/**
 * Time, injected so that retention, leases, waits and limits are testable without
 * sleeping: the service uses {@link systemClock}; tests may drive their own.
 */
export interface Clock {
  nowMs(): number;
  /** Calls `fn` once, `ms` from now. */
  after(ms: number, fn: () => void, options?: TimerOptions): Timer;
  /** Calls `fn` every `ms` until cancelled. */
  every(ms: number, fn: () => void, options?: TimerOptions): Timer;
  /** Resolves `ms` from now. */
  sleep(ms: number, options?: TimerOptions): Promise<void>;
}

export interface TimerOptions {
  /** false: the timer never holds the process open (background upkeep). Default true. */
  keepAlive?: boolean;
}

/** A scheduled call; cancelling it after it ran (or twice) does nothing. */
export interface Timer {
  cancel(): void;
}

function nodeTimer(handle: NodeJS.Timeout, options: TimerOptions | undefined, clear: (h: NodeJS.Timeout) => void): Timer {
  if (options?.keepAlive === false) handle.unref();
  return { cancel: () => clear(handle) };
}

export const systemClock: Clock = {
  nowMs: () => Date.now(),
  after: (ms, fn, options) => nodeTimer(setTimeout(fn, ms), options, clearTimeout),
  every: (ms, fn, options) => nodeTimer(setInterval(fn, ms), options, clearInterval),
  sleep: (ms, options) =>
    new Promise((resolve) => {
      const handle = setTimeout(resolve, ms);
      if (options?.keepAlive === false) handle.unref();
    }),
};

/**
 * `work`'s outcome, or, should `ms` pass first, `late()`'s (its value, or what it throws);
 * the work itself is not cancelled. The timer is cancelled when either comes.
 */
export function within<T, L>(work: Promise<T>, ms: number, clock: Clock, late: () => L, options?: TimerOptions): Promise<T | L> {
  let timer: Timer | undefined;
  const timeout = new Promise<L>((resolve, reject) => {
    timer = clock.after(
      ms,
      () => {
        try {
          resolve(late());
        } catch (err) {
          reject(err);
        }
      },
      options,
    );
  });
  return Promise.race([work, timeout]).finally(() => timer?.cancel());
}

export function unixSeconds(ms: number): number {
  return Math.floor(ms / 1000);
}
