/** Time source, injected so that retention, leases and waits are testable without sleeping. */
export interface Clock {
  nowMs(): number;
}

export const systemClock: Clock = { nowMs: () => Date.now() };

export function unixSeconds(ms: number): number {
  return Math.floor(ms / 1000);
}
