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

export function unixSeconds(ms: number): number {
  return Math.floor(ms / 1000);
}
