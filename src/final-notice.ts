/**
 * A turn's final notice (`Subjects.turnFinal`): published by the run's owner after the
 * turn's and the run's final writes, awaited by requests that wait for the turn. It
 * carries the run as those requests would read it then (`renderRun` of the run and the
 * final turn), so they answer without reading the store; a view too large to carry is
 * left out (an empty notice), and they read it.
 */
import { isFinalStatus, type TurnStatus } from "./domain.js";
import type { renderRun } from "./render.js";

export type RunView = ReturnType<typeof renderRun>;

/**
 * A view is carried up to this many bytes of JSON: the common turn fits, and every event
 * stream waiting for the turn's end receives the notice too, so a large one is read instead.
 */
export const FINAL_NOTICE_MAX_BYTES = 64 * 1024;

/** The notice's payload: the view as JSON, or empty when there is none or it is over `maxBytes`. */
export function encodeFinalNotice(view: RunView | undefined, maxBytes = FINAL_NOTICE_MAX_BYTES): string {
  const json = view ? JSON.stringify(view) : "";
  return Buffer.byteLength(json) <= maxBytes ? json : "";
}

const utf8 = new TextDecoder();

/** The view a notice carries, when it is one of run `runId`'s turn `turnId`, final; else undefined (read the store). */
export function decodeFinalNotice(data: Uint8Array, runId: string, turnId: string): RunView | undefined {
  if (data.length === 0) return undefined;
  try {
    const view = JSON.parse(utf8.decode(data)) as RunView | null;
    return view?.id === runId && view.turn?.id === turnId && isFinalStatus(view.turn.status as TurnStatus) ? view : undefined;
  } catch {
    return undefined;
  }
}
