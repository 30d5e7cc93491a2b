/**
 * Background work of one kind on a node, at most `concurrency` tasks at a time; the rest
 * wait in the order they came, at most `maxWaiting` of them. A task offered while that
 * many wait is not taken: its caller leaves the work to its backstop (a removed run's
 * parts: the check its tombstone schedules). Without the bound a burst (thousands of runs
 * deleted in a minute against a slow store) would hold that many removals open at once.
 */
export class BoundedWork {
  private running = 0;
  private readonly waiting: Array<() => void> = [];

  constructor(
    private readonly concurrency: number,
    private readonly maxWaiting: number,
  ) {
    if (!(concurrency >= 1 && maxWaiting >= 0)) throw new RangeError("BoundedWork needs concurrency >= 1 and maxWaiting >= 0");
  }

  /** Tasks running now and tasks waiting for a slot. */
  get size(): { running: number; waiting: number } {
    return { running: this.running, waiting: this.waiting.length };
  }

  /**
   * Runs `task` once a slot is free: true once it has run, false at once (not run) when
   * the queue is full. A task's rejection is passed on; its slot is freed either way.
   */
  async run(task: () => Promise<void>): Promise<boolean> {
    if (this.running >= this.concurrency) {
      if (this.waiting.length >= this.maxWaiting) return false;
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    } else {
      this.running++;
    }
    try {
      await task();
      return true;
    } finally {
      // The slot passes to the next waiting task as it is (running stays counted), or is freed.
      const next = this.waiting.shift();
      if (next) next();
      else this.running--;
    }
  }
}
