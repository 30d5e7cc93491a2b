import type { Decision, Disposition, InputPart, Plan } from "./domain.js";
import type { ErrorCode } from "./errors.js";

/**
 * Commands the gateway sends to a run's owning actor on `runs.cmd.<partition>`,
 * and the actor's replies. Every command is idempotent on the ids it carries, so a
 * gateway may resend one after a timeout.
 */
export type RunCommand = RunCommandBody & {
  /**
   * Names this sending of the command: the router resends with the same id when an
   * attempt's reply does not come, and the owner answers a resend as the first.
   */
  command_id?: string;
};

type RunCommandBody =
  | {
      op: "start";
      workspace_id: string;
      run_id: string;
      turn_id: string;
      agent_id: string;
      version: number;
      input: InputPart[];
      tags: string[];
      plan: Plan;
      /**
       * The gateway allocated these ids for this request just now (a new idempotency
       * claim): no earlier attempt can have stored the run or its events, unless this very
       * command was resent, which the message ids and unique inserts absorb. The actor
       * then skips looking for the run and its last event.
       */
      fresh?: boolean;
    }
  | {
      op: "continue";
      workspace_id: string;
      run_id: string;
      /** Id of the new turn, or of the steer when the input goes to the active turn. */
      turn_id: string;
      input: InputPart[];
      on_busy: OnBusy;
      /**
       * The request's key was claimed before (a retry after a lost answer): a steer the
       * first attempt made may have gone to a turn that has ended since.
       */
      resent?: boolean;
    }
  | {
      op: "cancel";
      workspace_id: string;
      run_id: string;
      turn_id?: string;
      /** The request's id, recorded on the turn it cancels (kept with its Idempotency-Key). */
      cancel_id?: string;
      /**
       * The key was claimed before (a retry after a lost answer): the turn that took
       * `cancel_id` is answered; if none did, only a turn that existed then (index below
       * `before_index`) is selected, never one admitted since.
       */
      resent?: { before_index: number };
    }
  | { op: "delete"; workspace_id: string; run_id: string }
  | { op: "tags"; workspace_id: string; run_id: string; add: string[]; remove: string[] }
  | {
      op: "decide";
      workspace_id: string;
      run_id: string;
      action_id: string;
      decision: Decision;
      reason: string | null;
      /** Names this decision (kept with its Idempotency-Key): a resent command is answered as the first. */
      decision_id: string;
    };

export const OnBusy = { queue: "queue", steer: "steer", reject: "reject" } as const;
export type OnBusy = (typeof OnBusy)[keyof typeof OnBusy];

export type CommandReply =
  | {
      ok: true;
      run_id: string;
      /** The turn the answer is about. */
      turn_id?: string;
      disposition?: Disposition;
      /** HTTP status the gateway answers with when it is not a plain 200. */
      http_status?: number;
      tags?: string[];
      /** The Run object as the admission left it (saves the gateway two reads). */
      run?: Record<string, unknown>;
      /** The Action object a decision left. */
      action?: Record<string, unknown>;
    }
  | { ok: false; code: ErrorCode; message?: string; param?: string | null }
  /** This node does not own the run's partition (any more): route again. */
  | { ok: false; not_owner: true }
  /**
   * This node holds the partition but its lease is in doubt (renewals unconfirmed for a
   * TTL): the command did not run on it; asked again shortly it usually does (the next
   * renewal confirms the lease, or finds it taken and another node answers).
   */
  | { ok: false; in_doubt: true };
