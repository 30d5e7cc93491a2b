import { isFinalStatus, type TurnDoc } from "../src/index.js";

/**
 * Final turns as the gateway renders them, kept in memory. A turn never changes once it
 * is final (completed, failed, cancelled, incomplete), so the latest turn of an idle run
 * is read from the store once, not on every GET: a GET run then costs one store read
 * (the run), as the run must still be read for its state, deletion and expiry. Turns are
 * kept without their transcript, newest use last, up to a byte budget estimated from
 * their input and output.
 */
export class FinalTurnCache {
  private readonly turns = new Map<string, { turn: TurnDoc; bytes: number }>();
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
    const turn = await load();
    if (turn && isFinalStatus(turn.status)) this.remember({ ...turn, transcript: [] });
    return turn;
  }

  get size(): number {
    return this.turns.size;
  }

  private remember(turn: TurnDoc): void {
    const bytes = 512 + JSON.stringify(turn.input).length + JSON.stringify(turn.output).length + JSON.stringify(turn.error).length;
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
