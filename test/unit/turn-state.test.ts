/**
 * The run lifecycle's pure decisions (src/turn-state.ts), each over its whole input
 * space, against tables written out from the spec ("States and transitions", "Turn
 * status", on_busy) rather than derived from the code.
 */
import test from "ava";
import {
  admissionOutcome,
  cancelOutcome,
  cancelTarget,
  editTags,
  finalEventType,
  interruptedStatus,
  settleDecision,
  type AbortReason,
  type AdmissionOutcome,
  type TurnOutcome,
} from "../../src/turn-state.js";
import { RunState, TurnStatus } from "../../src/domain.js";

const STATUSES = Object.values(TurnStatus);
const ON_BUSY = ["queue", "steer", "reject"] as const;

test("turn-state - admission: every state × queued × on_busy × active status", (t) => {
  let cases = 0;
  for (const state of Object.values(RunState)) {
    for (const hasQueued of [false, true]) {
      for (const onBusy of ON_BUSY) {
        for (const activeStatus of [undefined, ...STATUSES]) {
          let expected: AdmissionOutcome;
          if (state === "idle") expected = "start";
          else if (onBusy === "reject") expected = "busy";
          else if (onBusy === "queue") expected = hasQueued ? "busy" : "queue";
          else expected = activeStatus === "in_progress" ? "steer" : "steer_target_ended";
          t.is(admissionOutcome({ state, hasQueued, onBusy, activeStatus }), expected, JSON.stringify({ state, hasQueued, onBusy, activeStatus }));
          cases++;
        }
      }
    }
  }
  t.is(cases, 2 * 2 * 3 * 8);
});

test("turn-state - cancel: the Turn transitions table for every status", (t) => {
  const table: Record<TurnStatus, { to: TurnStatus | undefined; httpStatus: 200 | 202 }> = {
    queued: { to: "cancelled", httpStatus: 200 },
    in_progress: { to: "cancelling", httpStatus: 202 },
    cancelling: { to: undefined, httpStatus: 202 },
    completed: { to: undefined, httpStatus: 200 },
    failed: { to: undefined, httpStatus: 200 },
    cancelled: { to: undefined, httpStatus: 200 },
    incomplete: { to: undefined, httpStatus: 200 },
  };
  for (const status of STATUSES) t.deepEqual(cancelOutcome(status), table[status], status);
});

test("turn-state - cancel target: named, else active, else queued, else latest", (t) => {
  const run = { active_turn_id: "turn_a", queued_turn_id: "turn_q", latest_turn_id: "turn_l" };
  t.is(cancelTarget(run, "turn_x"), "turn_x");
  t.is(cancelTarget(run), "turn_a");
  t.is(cancelTarget({ ...run, active_turn_id: null }), "turn_q");
  t.is(cancelTarget({ ...run, active_turn_id: null, queued_turn_id: null }), "turn_l");
});

test("turn-state - recovery: only active statuses change, in_progress → incomplete, cancelling → cancelled", (t) => {
  const table: Record<TurnStatus, TurnStatus | undefined> = {
    queued: undefined,
    in_progress: "incomplete",
    cancelling: "cancelled",
    completed: undefined,
    failed: undefined,
    cancelled: undefined,
    incomplete: undefined,
  };
  for (const status of STATUSES) t.is(interruptedStatus(status), table[status], status);
});

test("turn-state - settle: every abort reason × agent outcome", (t) => {
  const reasons: Array<AbortReason | undefined> = [undefined, "cancel", "duration_limit", "shutdown"];
  const outcomes: TurnOutcome[] = ["completed", "failed", "aborted"];
  const cancelled = { status: "cancelled", error: "none", output: "none" };
  const table: Record<string, Record<TurnOutcome, object>> = {
    none: { completed: { status: "completed", error: "none", output: "agent" }, failed: { status: "failed", error: "agent", output: "agent" }, aborted: cancelled },
    // A cancel was answered `cancelling`: it settles cancelled whatever the agent did.
    cancel: { completed: cancelled, failed: cancelled, aborted: cancelled },
    // The agent finishing on its own beats a limit or a shutdown that came too late.
    duration_limit: {
      completed: { status: "completed", error: "none", output: "agent" },
      failed: { status: "failed", error: "agent", output: "agent" },
      aborted: { status: "incomplete", error: "turn_duration_limit", output: "agent" },
    },
    shutdown: {
      completed: { status: "completed", error: "none", output: "agent" },
      failed: { status: "failed", error: "agent", output: "agent" },
      aborted: { status: "incomplete", error: "worker_execution_interrupted", output: "agent" },
    },
  };
  for (const reason of reasons) {
    for (const outcome of outcomes) {
      for (const actionInterrupted of [false, true]) {
        const decision = settleDecision(reason, outcome, actionInterrupted);
        // Only a shutdown that stopped a running tool call changes: the call may have acted.
        const expected = reason === "shutdown" && outcome === "aborted" && actionInterrupted ? { status: "incomplete", error: "worker_action_interrupted", output: "agent" } : table[reason ?? "none"]![outcome];
        t.deepEqual(decision, expected, `${reason} × ${outcome} × ${actionInterrupted}`);
        t.true(["completed", "failed", "cancelled", "incomplete"].includes(decision.status), "always a final status");
      }
    }
  }
});

test("turn-state - final events are named after the status", (t) => {
  for (const status of ["completed", "failed", "cancelled", "incomplete"] as const) t.is(finalEventType(status), `turn.${status}`);
});

test("turn-state - tags: set semantics, removal before addition, sorted, refused past the maximum", (t) => {
  t.deepEqual(editTags(["b", "a"], ["c", "a"], [], 10), ["a", "b", "c"]);
  t.deepEqual(editTags(["a", "b"], [], ["a", "x"], 10), ["b"]);
  t.deepEqual(editTags(["a"], ["a"], ["a"], 10), ["a"], "added back after removal");
  t.deepEqual(editTags(["a", "b"], ["c"], [], 3), ["a", "b", "c"]);
  t.is(editTags(["a", "b", "c"], ["d"], [], 3), undefined);
  t.deepEqual(editTags(["a", "b", "c"], ["d"], ["a"], 3), ["b", "c", "d"], "the limit applies to the result");
});
