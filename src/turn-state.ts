import { RunState, TurnStatus, isFinalStatus } from "./domain.js";
import type { OnBusy } from "./commands.js";

/**
 * Pure decisions of the run lifecycle (spec "States and transitions", decisions §4).
 * The actor applies their results; nothing here does I/O.
 */

export type AdmissionOutcome =
  /** Start a new turn now (the run is idle). */
  | "start"
  /** Queue the turn behind the active one. */
  | "queue"
  /** Add the input to the active turn. */
  | "steer"
  /** 409 run_busy. */
  | "busy"
  /** 409 steering_target_ended. */
  | "steer_target_ended";

/** What a continuation does, given the run's state (on_busy applies only while busy). */
export function admissionOutcome(input: {
  state: RunState;
  hasQueued: boolean;
  onBusy: OnBusy;
  /** Status of the active turn, when there is one. */
  activeStatus: TurnStatus | undefined;
}): AdmissionOutcome {
  if (input.state === RunState.idle) return "start";
  switch (input.onBusy) {
    case "reject":
      return "busy";
    case "queue":
      return input.hasQueued ? "busy" : "queue";
    case "steer":
      return input.activeStatus === TurnStatus.in_progress ? "steer" : "steer_target_ended";
  }
}

/** The turn a cancel call selects: the named one, else the active, else the queued, else the latest. */
export function cancelTarget(run: { active_turn_id: string | null; queued_turn_id: string | null; latest_turn_id: string }, turnId?: string): string {
  return turnId ?? run.active_turn_id ?? run.queued_turn_id ?? run.latest_turn_id;
}

export interface CancelOutcome {
  /** The status to write, or undefined when the turn stays as it is. */
  to: TurnStatus | undefined;
  httpStatus: 200 | 202;
}

/** The Turn transitions table for a cancel call. */
export function cancelOutcome(status: TurnStatus): CancelOutcome {
  if (isFinalStatus(status)) return { to: undefined, httpStatus: 200 };
  switch (status) {
    case TurnStatus.queued:
      return { to: TurnStatus.cancelled, httpStatus: 200 };
    case TurnStatus.in_progress:
      return { to: TurnStatus.cancelling, httpStatus: 202 };
    case TurnStatus.cancelling:
      return { to: undefined, httpStatus: 202 };
    default:
      return { to: undefined, httpStatus: 200 };
  }
}

/** What recovery makes of a turn a lost owner left active (DESIGN §3). */
export function interruptedStatus(status: TurnStatus): TurnStatus | undefined {
  if (status === TurnStatus.in_progress) return TurnStatus.incomplete;
  if (status === TurnStatus.cancelling) return TurnStatus.cancelled;
  return undefined;
}

/** The platform event that announces a final status. */
export function finalEventType(status: TurnStatus): string {
  return `turn.${status}`;
}

/** Applies a tag edit with set semantics; `undefined` when the result holds more than `max` tags. */
export function editTags(current: readonly string[], add: readonly string[], remove: readonly string[], max: number): string[] | undefined {
  const next = new Set(current);
  for (const tag of remove) next.delete(tag);
  for (const tag of add) next.add(tag);
  if (next.size > max) return undefined;
  return [...next].sort();
}
