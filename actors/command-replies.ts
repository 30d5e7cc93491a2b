import type { CommandReply } from "../src/index.js";

/** How long an answered command is remembered for a resend of it. */
export const REPLY_MEMORY_MS = 60_000;
/** At most this many answers are remembered (the oldest go first). */
export const REPLY_MEMORY_MAX = 10_000;
/** An answer larger than this (serialized) is not remembered. */
const MAX_REMEMBERED_BYTES = 4_096;

/**
 * The answers this node gave to commands, by command id, so that a command resent
 * because its reply was lost (the router's attempt timed out) is answered as the first
 * time rather than run again: a resend that arrives while the first is still running
 * waits for the same answer; one that arrives later gets the remembered one.
 *
 * Only final answers are remembered: "not the owner", "in doubt" and a temporary failure
 * (`runtime_unavailable`) ask for the command to run again, so a resend does.
 * A node's memory dies with it; a command resent to the next owner relies on the
 * ids the command carries (turn, decision), as before.
 */
export class CommandReplies {
  private readonly running = new Map<string, Promise<CommandReply>>();
  private readonly answered = new Map<string, { reply: CommandReply; atMs: number }>();

  constructor(
    private readonly nowMs: () => number,
    private readonly memoryMs = REPLY_MEMORY_MS,
    private readonly max = REPLY_MEMORY_MAX,
  ) {}

  /**
   * The answer of the command with this id if it ran or runs here: a resend is answered
   * from it before anything else is asked (ownership, doubt), as the first was.
   */
  known(commandId: string | undefined): Promise<CommandReply> | undefined {
    if (commandId === undefined) return undefined;
    const remembered = this.answered.get(commandId);
    if (remembered && this.nowMs() - remembered.atMs < this.memoryMs) return Promise.resolve(remembered.reply);
    return this.running.get(commandId);
  }

  /** `work`'s answer, or the answer of the earlier run of the command with this id. */
  answer(commandId: string | undefined, work: () => Promise<CommandReply>): Promise<CommandReply> {
    if (commandId === undefined) return work();
    const earlier = this.known(commandId);
    if (earlier) return earlier;
    const reply = work().finally(() => this.running.delete(commandId));
    this.running.set(commandId, reply);
    reply.then(
      (answer) => {
        if (final(answer)) this.remember(commandId, answer);
      },
      () => undefined, // a failure is answered as temporary or internal; a resend runs again
    );
    return reply;
  }

  /** Remembered answers (tests). */
  get size(): number {
    return this.answered.size;
  }

  private remember(commandId: string, reply: CommandReply): void {
    // Without the rendered Run (the gateway reads it when absent), an answer is a few
    // hundred bytes; one still larger (an action's arguments) is not kept: its resend
    // relies on the ids the command carries. So the memory stays within ~40 MB.
    const kept: CommandReply = reply.ok && reply.run ? { ...reply, run: undefined } : reply;
    if (JSON.stringify(kept).length > MAX_REMEMBERED_BYTES) return;
    this.answered.delete(commandId);
    this.answered.set(commandId, { reply: kept, atMs: this.nowMs() });
    // Insertion order is age order: drop from the front while too many or too old.
    const cutoff = this.nowMs() - this.memoryMs;
    for (const [id, { atMs }] of this.answered) {
      if (this.answered.size <= this.max && atMs >= cutoff) break;
      this.answered.delete(id);
    }
  }
}

function final(reply: CommandReply): boolean {
  if (reply.ok) return true;
  if ("not_owner" in reply || "in_doubt" in reply) return false;
  return reply.code !== "runtime_unavailable";
}
