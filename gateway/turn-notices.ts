import type { Subscription } from "@nats-io/transport-node";
import { decodeFinalNotice, type RunView, Subjects, type Timer } from "../src/index.js";
import type { GatewayContext } from "./context.js";

/** What a wait for a turn heard: its final notice, a waiting notice, or nothing in time. */
export type Heard = "final" | "waiting" | "timeout";

export interface TurnNotices {
  sub: Subscription;
  turnId: string;
  /**
   * "final" once the final notice has arrived; else the next waiting notice since the last
   * call ("waiting": re-read the turn), or "timeout" when `timeoutMs` passed first.
   */
  next: (timeoutMs: number) => Promise<Heard>;
  /** The run the final notice carried, once it arrived with one for this turn. */
  view: () => RunView | undefined;
  /** Wakes a pending {@link next} as a waiting notice would ("waiting": re-read). */
  poke: () => void;
}

/**
 * Subscribes to a turn's notices: final (published after the turn's and the run's final
 * writes, with the run's view) and waiting (for a person's decision, after its pending
 * action is stored). The final one ends the subscription; a waiting one only prompts a
 * re-read (a decision may already have let the turn go on).
 */
export function turnNotices(ctx: Pick<GatewayContext, "nc" | "clock">, runId: string, turnId: string): TurnNotices {
  const sub = ctx.nc.subscribe(Subjects.turnNotices(turnId));
  const finalSubject = Subjects.turnFinal(turnId);
  let final = false;
  let waiting = false;
  let view: RunView | undefined;
  let wake: (() => void) | undefined;
  void (async () => {
    for await (const msg of sub) {
      if (msg.subject === finalSubject) {
        final = true;
        view = decodeFinalNotice(msg.data, runId, turnId);
      } else {
        waiting = true;
      }
      wake?.();
      if (final) break; // ends the subscription
    }
  })().catch(() => undefined); // a closed connection: the waits time out and read the store
  return {
    sub,
    turnId,
    view: () => view,
    poke: () => {
      waiting = true;
      wake?.();
    },
    next: async (timeoutMs) => {
      if (!final && !waiting) {
        let timer: Timer | undefined;
        await new Promise<void>((resolve) => {
          wake = resolve;
          timer = ctx.clock.after(timeoutMs, resolve);
        });
        wake = undefined;
        timer?.cancel();
      }
      const heard: Heard = final ? "final" : waiting ? "waiting" : "timeout";
      waiting = false;
      return heard;
    },
  };
}
