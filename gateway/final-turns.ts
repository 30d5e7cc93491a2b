import { isFinalStatus, type TurnDoc } from "../src/index.js";

/**
 * Final turns as the gateway renders them, kept in memory. A turn never changes once it
 * is final (completed, failed, cancelled, incomplete), so the latest turn of an idle run
 * is read from the store once, not on every GET: a GET run then costs one store read
 * (the run), as the run must still be read for its state, deletion and expiry. Turns are
 * kept without their transcript, newest use last, up to a byte budget estimated from
 * their JSON.
 *
 * Requests for a turn that is being read wait for that read, and take its answer when
 * it is a final turn (the same at any later time); otherwise they read it themselves, so
 * a turn that became final after the shared read began is seen as such. Many streams
 * opened at once on a final turn (a turn's document holds its whole output and transcript)
 * cost one read, also for a turn too large to keep.
 */
export class FinalTurnCache {
  private readonly turns = new Map<string, { turn: TurnDoc; bytes: number }>();
  private readonly reading = new Map<string, Promise<TurnDoc | null>>();
  private bytes = 0;

  constructor(private readonly maxBytes = 64 * 1024 * 1024) {}

  /** The turn `id`, from memory when it is known final, else from `load` (remembered if final). */
  async get(id: string, load: () => Promise<TurnDoc | null>): Promise<TurnDoc | null> {
    const hit = this.turns.get(id);
    if (hit) {
      this.turns.delete(id);
      this.turns.set(id, hit);
      return hit.turn;
    }
    const shared = this.reading.get(id);
    if (shared) {
      const turn = await shared.catch(() => null);
      if (turn && isFinalStatus(turn.status)) return turn;
      return load();
    }
    const read = load();
    this.reading.set(id, read);
    try {
      const turn = await read;
      if (turn && isFinalStatus(turn.status)) this.remember({ ...turn, transcript: [] });
      return turn;
    } finally {
      this.reading.delete(id);
    }
  }

  get size(): number {
    return this.turns.size;
  }

  private remember(turn: TurnDoc): void {
    const bytes = 512 + JSON.stringify(turn).length;
    if (bytes > this.maxBytes / 64) return; // a very large turn is read when asked for
    this.turns.set(turn._id, { turn, bytes });
    this.bytes += bytes;
    for (const [id, entry] of this.turns) {
      if (this.bytes <= this.maxBytes) break;
      this.turns.delete(id);
      this.bytes -= entry.bytes;
    }
  }
}
