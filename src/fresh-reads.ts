interface KeyState<V> {
  /** When the read in flight began. */
  startedMs: number;
  /** Callers that asked while a read of the key was in flight: they share the next one. */
  next: { promise: Promise<V>; resolve: (value: V) => void; reject: (err: unknown) => void } | null;
}

/**
 * Concurrent reads of one key share a store read, and no caller is answered from a read
 * that began before it asked: a caller that finds a read of its key in flight waits for
 * it to end and then shares the one read begun after it (with every caller that arrived
 * meanwhile). So each caller sees at least every write acknowledged before it asked, as
 * a read of its own would, and a key read by many callers at once costs one read per
 * round trip instead of one per caller (64 concurrent starts of one agent: ~2 reads).
 *
 * Callers of one read share the value it returned: they must not change it.
 */
export class FreshReads<V> {
  private readonly keys = new Map<string, KeyState<V>>();

  constructor(
    private readonly read: (key: string) => Promise<V>,
    /**
     * A read in flight for longer is not waited for: a caller reads alone instead (a
     * command that never answers, on a connection gone half-open, holds back only the
     * callers that were already waiting for it).
     */
    private readonly patienceMs = 1_000,
    private readonly nowMs: () => number = () => performance.now(),
  ) {}

  get(key: string): Promise<V> {
    const state = this.keys.get(key);
    if (!state) {
      this.keys.set(key, { startedMs: this.nowMs(), next: null });
      return this.start(key);
    }
    if (this.nowMs() - state.startedMs > this.patienceMs) return this.readAlone(key);
    if (!state.next) {
      let resolve!: (value: V) => void;
      let reject!: (err: unknown) => void;
      const promise = new Promise<V>((res, rej) => ((resolve = res), (reject = rej)));
      state.next = { promise, resolve, reject };
    }
    return state.next.promise;
  }

  /** Reads the key; when the read ends, begins the read its waiting callers share, if any. */
  private start(key: string): Promise<V> {
    const reading = this.readAlone(key);
    const after = () => {
      const state = this.keys.get(key)!;
      const waiting = state.next;
      if (!waiting) {
        this.keys.delete(key);
        return;
      }
      state.next = null;
      state.startedMs = this.nowMs();
      this.start(key).then(waiting.resolve, waiting.reject);
    };
    reading.then(after, after);
    return reading;
  }

  private readAlone(key: string): Promise<V> {
    try {
      return this.read(key);
    } catch (err) {
      return Promise.reject(err);
    }
  }
}
