import { RunState, TurnStatus, isFinalStatus } from "./domain.js";
import type { OnBusy } from "./commands.js";
import { assertNever } from "./turn-errors.js";

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

/** How the agent loop of a turn ended (actors/agent-runner.ts). */
export type TurnOutcome = "completed" | "failed" | "aborted";

/** Why the actor aborted a turn's agent loop, when it did. */
export type AbortReason = "cancel" | "duration_limit" | "shutdown";

/** How a finished turn is stored: its status, and what becomes of the agent's error and output. */
export interface SettleDecision {
  status: TurnStatus;
  /** `agent`: the error the agent loop reported (failed only); `none`; or a platform code. */
  error: "agent" | "none" | "turn_duration_limit" | "worker_execution_interrupted" | "worker_action_interrupted";
  /** `agent`: the output (partial for a failure); `none`: empty. */
  output: "agent" | "none";
}

/**
 * The status a turn settles in once its agent loop ended (spec "Turn status", decisions
 * §4). A cancel wins over everything: the caller was answered `cancelling` (202), and
 * cancelling settles as cancelled even when the agent's last step finished before the
 * abort reached it. Otherwise the agent's own completion or failure stands; an aborted
 * loop takes the status of the abort's reason, and an abort nobody asked for (the
 * loop stopped by itself) counts as cancelled.
 */
export function settleDecision(reason: AbortReason | undefined, outcome: TurnOutcome, actionInterrupted = false): SettleDecision {
  if (reason === "cancel") return { status: TurnStatus.cancelled, error: "none", output: "none" };
  switch (outcome) {
    case "completed":
      return { status: TurnStatus.completed, error: "none", output: "agent" };
    case "failed":
      return { status: TurnStatus.failed, error: "agent", output: "agent" };
    case "aborted":
      switch (reason) {
        case "duration_limit":
          return { status: TurnStatus.incomplete, error: "turn_duration_limit", output: "agent" };
        case "shutdown":
          // Stopped during a tool call: it may have done what it does, so not retryable.
          return { status: TurnStatus.incomplete, error: actionInterrupted ? "worker_action_interrupted" : "worker_execution_interrupted", output: "agent" };
        case undefined:
          return { status: TurnStatus.cancelled, error: "none", output: "none" };
        default:
          return assertNever(reason);
      }
    default:
      return assertNever(outcome);
  }
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
