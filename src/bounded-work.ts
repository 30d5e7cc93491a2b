/**
 * Background work of one kind on a node, at most `concurrency` tasks at a time; the rest
 * wait in the order they came, at most `maxWaiting` of them. A task offered while that
 * many wait is not taken: its caller leaves the work to its backstop (a removed run's
 * parts: the check its tombstone schedules). Without the bound a burst (thousands of runs
 * deleted in a minute against a slow store) would hold that many removals open at once.
 */
export class BoundedWork {
  private running = 0;
  /** Each waiting task's go-ahead: true to run, false when the work is closed first. */
  private readonly waiting: Array<(go: boolean) => void> = [];
  private closedNow = false;

  constructor(
    private readonly concurrency: number,
    private readonly maxWaiting: number,
  ) {
    if (!(Number.isInteger(concurrency) && concurrency >= 1 && Number.isInteger(maxWaiting) && maxWaiting >= 0)) {
      throw new RangeError("BoundedWork needs a whole concurrency >= 1 and maxWaiting >= 0");
    }
  }

  /** Whether {@link close} was called: tasks are refused from then on. */
  get closed(): boolean {
    return this.closedNow;
  }

  /**
   * Refuses the waiting tasks (their `run` answers false without running them) and every
   * later one; running tasks go on. The node calls it as it stops, before its connections
   * close, so that what waits is left to its backstop rather than failing against them.
   */
  close(): void {
    this.closedNow = true;
    for (const go of this.waiting.splice(0)) go(false);
  }

  /** Tasks running now and tasks waiting for a slot. */
  get size(): { running: number; waiting: number } {
    return { running: this.running, waiting: this.waiting.length };
  }

  /**
   * Runs `task` once a slot is free: true once it has run, false (not run) when the queue
   * is full or the work is closed, at once or while it waits. A task's rejection is passed
   * on; its slot is freed either way.
   */
  async run(task: () => Promise<void>): Promise<boolean> {
    if (this.closedNow) return false;
    if (this.running >= this.concurrency) {
      if (this.waiting.length >= this.maxWaiting) return false;
      if (!(await new Promise<boolean>((go) => this.waiting.push(go)))) return false;
    } else {
      this.running++;
    }
    try {
      await task();
      return true;
    } finally {
      // The slot passes to the next waiting task as it is (running stays counted), or is freed.
      const next = this.waiting.shift();
      if (next) next(true);
      else this.running--;
    }
  }
}
