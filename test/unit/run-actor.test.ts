/**
 * RunActor on fakes (test/helpers/actor-fakes.ts): the actor's decisions and what it
 * stores, without NATS or a store. Turns are parked until the test finishes them, so
 * each test holds the actor at the step it needs: admission × on_busy, the cancel
 * table, recovery after a lost owner, fencing refusals, resent commands.
 */
import test, { type ExecutionContext } from "ava";
import { CheckpointError } from "../../actors/checkpoints.js";
import { RunActor } from "../../actors/run-actor.js";
import { PARTS_CHECK_AFTER_MS } from "../../actors/run-removal.js";
import type { CommandReply, RunCommand } from "../../src/commands.js";
import { StoreUnavailableError } from "../../src/mongo-guard.js";
import { unavailable } from "../../src/event-envelope.js";
import { busyGraceMs } from "../../src/domain.js";
import { retentionRefreshMs, SETTLE_RETRY_MS } from "../../actors/turn-execution.js";
import { errors as natsErrors } from "@nats-io/transport-node";
import { BoundedWork } from "../../src/bounded-work.js";
import { actorWorld, type ActorWorld } from "../helpers/actor-fakes.js";
import type { TurnRunRequest } from "../../actors/agent-runner.js";

const WS = "ws_test";
const AGENT = "agt_test";
const RUN = "run_unit000000000000001";

function startCmd(turnId = "turn_1", extra: Partial<Extract<RunCommand, { op: "start" }>> = {}): RunCommand {
  return { op: "start", workspace_id: WS, run_id: RUN, turn_id: turnId, agent_id: AGENT, version: 1, input: [{ type: "input_text", text: "hi" }], tags: ["b", "a"], plan: "business", fresh: true, ...extra };
}

function continueCmd(turnId: string, onBusy: "queue" | "steer" | "reject", text = "more"): RunCommand {
  return { op: "continue", workspace_id: WS, run_id: RUN, turn_id: turnId, input: [{ type: "input_text", text }], on_busy: onBusy };
}

async function world(): Promise<ActorWorld & { actor: (epoch?: number) => RunActor }> {
  const w = await actorWorld();
  w.store.addDeployment(AGENT, 1);
  w.store.activeVersions.set(AGENT, 1);
  return { ...w, actor: (epoch = 1) => new RunActor(RUN, 0, epoch, w.resources) };
}

/** Lets a finished turn's completion pass through the actor's mailbox. */
async function settled(actor: RunActor): Promise<void> {
  await new Promise((resolve) => setImmediate(resolve));
  await actor.command({ op: "tags", workspace_id: WS, run_id: RUN, add: [], remove: [] });
}

/** Starts the run on `actor` and lets its turn complete: the run is idle. */
async function startIdle(w: ActorWorld, actor: RunActor): Promise<void> {
  await actor.command(startCmd());
  w.turns.last.finish({ outcome: "completed" });
  await settled(actor);
}

/** Lets `n` turns of the event loop pass (work that did not wait begins meanwhile). */
async function ticks(n: number): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise((resolve) => setImmediate(resolve));
}

/**
 * Lets work the actor does after its answer (a deleted run's parts, whose workspace
 * directory is removed on the thread pool) go on until `done`, for at most 5 s.
 */
async function until(done: () => boolean): Promise<void> {
  const end = Date.now() + 5_000;
  for (let i = 0; i < 100_000 && !done() && Date.now() < end; i++) await new Promise((resolve) => setTimeout(resolve, i < 100 ? 0 : 5));
}

function okReply(reply: CommandReply): Extract<CommandReply, { ok: true }> {
  if (!reply.ok) throw new Error(`expected ok, got ${JSON.stringify(reply)}`);
  return reply;
}

test("run-actor - start stores the turn before the run, runs the agent, and settles completed with the agent's output", async (t) => {
  const w = await world();
  const actor = w.actor();
  const reply = okReply(await actor.command(startCmd()));
  t.is(reply.disposition, "created");
  t.is(reply.turn_id, "turn_1");
  t.deepEqual(w.store.writes.slice(0, 2), ["insert turn turn_1 in_progress", `insert run ${RUN}`], "a run never points at a turn not stored");
  t.is(w.store.runs.get(RUN)!.state, "busy");
  t.deepEqual(w.store.runs.get(RUN)!.tags, ["a", "b"]);
  t.deepEqual(w.events.types(RUN), ["run.created", "turn.started"]);
  t.deepEqual(w.turns.last.request.input, [{ type: "input_text", text: "hi" }]);

  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "hello" }] });
  await settled(actor);
  const turn = w.store.turns.get("turn_1")!;
  t.is(turn.status, "completed");
  t.deepEqual(turn.output, [{ type: "output_text", text: "hello" }]);
  t.is(turn.error, null);
  const run = w.store.runs.get(RUN)!;
  t.is(run.state, "idle");
  t.is(run.active_turn_id, null);
  t.deepEqual(w.events.types(RUN), ["run.created", "turn.started", "turn.completed"]);
  t.deepEqual(w.events.events(RUN).map((e) => e.sequence), [1, 2, 3]);
  t.true(w.published.includes("runs.turn.turn_1.final"), "the final notice went out");
  t.true(actor.isIdle);
});

test("run-actor - a resent start (same ids) answers as the first did and stores nothing twice", async (t) => {
  const w = await world();
  const actor = w.actor();
  const first = okReply(await actor.command(startCmd()));
  const again = okReply(await actor.command(startCmd("turn_1", { fresh: false })));
  t.is(again.run_id, first.run_id);
  t.is(again.turn_id, "turn_1");
  t.is(again.disposition, "created");
  t.is(w.turns.started.length, 1, "one agent loop");
  t.is(w.store.turns.size, 1);
  t.deepEqual(w.events.types(RUN), ["run.created", "turn.started"]);
});

test("run-actor - admission while busy: reject, queue once, then busy; steer reaches the running agent", async (t) => {
  const w = await world();
  const actor = w.actor();
  await actor.command(startCmd());

  const rejected = await actor.command(continueCmd("turn_r", "reject"));
  t.like(rejected, { ok: false, code: "run_busy" });

  const queued = okReply(await actor.command(continueCmd("turn_q", "queue", "later")));
  t.is(queued.disposition, "queued");
  t.is(w.store.turns.get("turn_q")!.status, "queued");
  t.is(w.store.runs.get(RUN)!.queued_turn_id, "turn_q");

  const second = await actor.command(continueCmd("turn_q2", "queue"));
  t.like(second, { ok: false, code: "run_busy", message: "The run already has a queued turn." });

  const steered = okReply(await actor.command(continueCmd("steer_1", "steer", "also this")));
  t.is(steered.disposition, "steered");
  t.is(steered.turn_id, "turn_1", "a steer answers with the active turn");
  t.deepEqual(w.turns.last.steers, ["also this"]);
  t.deepEqual(w.store.turns.get("turn_1")!.steer_ids, ["steer_1"]);
  const resent = okReply(await actor.command(continueCmd("steer_1", "steer", "also this")));
  t.is(resent.disposition, "steered", "a resent steer answers as before");
  t.deepEqual(w.turns.last.steers, ["also this"], "and is not delivered twice");

  // The active turn ends: the queued one starts at once, the run stays busy.
  w.turns.started[0]!.finish({ outcome: "completed" });
  await settled(actor);
  t.is(w.turns.started.length, 2);
  t.deepEqual(w.turns.last.request.input, [{ type: "input_text", text: "later" }]);
  const run = w.store.runs.get(RUN)!;
  t.is(run.state, "busy");
  t.is(run.active_turn_id, "turn_q");
  t.is(run.queued_turn_id, null);
  t.is(w.store.turns.get("turn_q")!.status, "in_progress");

  w.turns.last.finish({ outcome: "completed" });
  await settled(actor);
  t.is(w.store.runs.get(RUN)!.state, "idle");
  t.deepEqual(w.events.types(RUN), ["run.created", "turn.started", "turn.queued", "turn.steered", "turn.completed", "turn.started", "turn.completed"]);
});

test("run-actor - an idle run starts a continuation whatever on_busy says", async (t) => {
  for (const onBusy of ["queue", "steer", "reject"] as const) {
    const w = await world();
    const actor = w.actor();
    await startIdle(w, actor);
    const reply = okReply(await actor.command(continueCmd("turn_2", onBusy)));
    t.is(reply.disposition, "continued", onBusy);
    t.is(w.store.turns.get("turn_2")!.status, "in_progress", onBusy);
    t.is(w.store.turns.get("turn_2")!.index, 1, onBusy);
  }
});

test("run-actor - cancel: queued → cancelled (200), in_progress → cancelling (202) then cancelled, final → unchanged (200)", async (t) => {
  const w = await world();
  const actor = w.actor();
  await actor.command(startCmd());
  await actor.command(continueCmd("turn_q", "queue"));

  const queued = okReply(await actor.command({ op: "cancel", workspace_id: WS, run_id: RUN, turn_id: "turn_q" }));
  t.is(queued.http_status, 200);
  t.is(w.store.turns.get("turn_q")!.status, "cancelled");
  t.is(w.store.runs.get(RUN)!.queued_turn_id, null);
  t.true(w.published.includes("runs.turn.turn_q.final"));

  // No turn named: the active one. Its agent takes a moment to stop.
  w.turns.endOnAbort = false;
  const active = okReply(await actor.command({ op: "cancel", workspace_id: WS, run_id: RUN }));
  t.is(active.turn_id, "turn_1");
  t.is(active.http_status, 202);
  t.true(w.turns.last.aborted, "the agent was aborted");
  t.is(w.store.turns.get("turn_1")!.status, "cancelling");
  t.like(await actor.command(continueCmd("steer_x", "steer")), { ok: false, code: "steering_target_ended" }, "a cancelling turn takes no steering");
  t.like(okReply(await actor.command({ op: "cancel", workspace_id: WS, run_id: RUN, turn_id: "turn_1" })), { http_status: 202 }, "cancelling stays cancelling (202)");
  w.turns.last.finish({ outcome: "aborted" });
  await settled(actor);
  t.is(w.store.turns.get("turn_1")!.status, "cancelled");
  t.deepEqual(w.store.turns.get("turn_1")!.output, [], "a cancelled turn keeps no output");
  t.is(w.store.runs.get(RUN)!.state, "idle");

  const final = okReply(await actor.command({ op: "cancel", workspace_id: WS, run_id: RUN, turn_id: "turn_1" }));
  t.is(final.http_status, 200);
  t.is(w.store.turns.get("turn_1")!.status, "cancelled");

  t.like(await actor.command({ op: "cancel", workspace_id: WS, run_id: RUN, turn_id: "turn_nope" }), { ok: false, code: "turn_not_found", param: "turn_id" });
  t.deepEqual(w.events.types(RUN), ["run.created", "turn.started", "turn.queued", "turn.cancelled", "turn.cancelling", "turn.cancelled"]);
});

test("run-actor - cancel repeats: a request that selected a turn already cancelling is recorded on it, so its repeat answers that turn after it ended, not the queued turn active since", async (t) => {
  const w = await world();
  const actor = w.actor();
  await actor.command(startCmd());
  await actor.command(continueCmd("turn_q", "queue"));
  w.turns.endOnAbort = false;
  okReply(await actor.command({ op: "cancel", workspace_id: WS, run_id: RUN, cancel_id: "cnl_first" }));
  // A second request selects the same turn while it is cancelling; its answer is lost.
  t.like(okReply(await actor.command({ op: "cancel", workspace_id: WS, run_id: RUN, cancel_id: "cnl_second" })), { turn_id: "turn_1", http_status: 202 });
  t.deepEqual(w.store.turns.get("turn_1")!.cancel_ids, ["cnl_first", "cnl_second"]);
  w.turns.last.finish({ outcome: "aborted" });
  await settled(actor);
  t.is(w.store.turns.get("turn_q")!.status, "in_progress", "the queued turn started");
  const repeat = okReply(await actor.command({ op: "cancel", workspace_id: WS, run_id: RUN, cancel_id: "cnl_second", resent: { before_index: 2 } }));
  t.like(repeat, { turn_id: "turn_1", http_status: 200 });
  t.is(w.store.turns.get("turn_q")!.status, "in_progress", "not cancelled by the repeat");
});

test("run-actor - cancel repeats: a flood of cancels of one turn keeps only the latest 16 of their ids on it (the turn's document does not grow with them)", async (t) => {
  const w = await world();
  const actor = w.actor();
  await actor.command(startCmd());
  w.turns.endOnAbort = false;
  for (let i = 0; i < 40; i++) okReply(await actor.command({ op: "cancel", workspace_id: WS, run_id: RUN, cancel_id: `cnl_${i}` }));
  t.deepEqual(w.store.turns.get("turn_1")!.cancel_ids, Array.from({ length: 16 }, (_, i) => `cnl_${24 + i}`));
  w.turns.last.finish({ outcome: "aborted" });
  await settled(actor);
});

test("run-actor - a cancel wins over an agent that completed before the abort reached it", async (t) => {
  const w = await world();
  const actor = w.actor();
  await actor.command(startCmd());
  const parked = w.turns.last;
  // The agent's last step finishes, but its completion is still on its way to the mailbox.
  const cancel = actor.command({ op: "cancel", workspace_id: WS, run_id: RUN });
  parked.finish({ outcome: "completed", output: [{ type: "output_text", text: "too late" }] });
  t.is(okReply(await cancel).http_status, 202);
  await settled(actor);
  t.is(w.store.turns.get("turn_1")!.status, "cancelled");
  t.deepEqual(w.store.turns.get("turn_1")!.output, []);
});

test("run-actor - a failed agent loop keeps its error and partial output", async (t) => {
  const w = await world();
  const actor = w.actor();
  await actor.command(startCmd());
  const error = { code: "provider_rate_limited", message: "slow down", source: "provider", retryable: true, reference: "ref_x" } as const;
  w.turns.last.finish({ outcome: "failed", output: [{ type: "output_text", text: "part" }], error: error as never });
  await settled(actor);
  const turn = w.store.turns.get("turn_1")!;
  t.is(turn.status, "failed");
  t.is(turn.error?.code, "provider_rate_limited");
  t.deepEqual(turn.output, [{ type: "output_text", text: "part" }]);
  t.deepEqual(w.events.types(RUN).at(-1), "turn.failed");
});

test("run-actor - the turn duration limit aborts the agent: incomplete with turn_duration_limit", async (t) => {
  const w = await world();
  (w.resources.config as { turnLimitMs: number }).turnLimitMs = 12 * 3600_000;
  const actor = w.actor();
  await actor.command(startCmd());
  // The limit is a timer on the injected clock: twelve hours pass in one step.
  w.clock.advance(12 * 3600_000 - 1);
  t.false(w.turns.last.aborted, "not a millisecond early");
  w.clock.advance(1);
  t.true(w.turns.last.aborted);
  await settled(actor);
  const turn = w.store.turns.get("turn_1")!;
  t.is(turn.status, "incomplete");
  t.is(turn.error?.code, "turn_duration_limit");
  t.is(w.clock.pending, 0, "the finished turn left no timer behind");
});

test("run-actor - a deployment that is not ready fails the turn agent_version_unavailable and starts no agent", async (t) => {
  const w = await world();
  w.store.deployments.get(`${AGENT}:1`)!.status = "building";
  const actor = w.actor();
  okReply(await actor.command(startCmd()));
  t.is(w.turns.started.length, 0);
  t.is(w.store.turns.get("turn_1")!.status, "failed");
  t.is(w.store.turns.get("turn_1")!.error?.code, "agent_version_unavailable");
  t.is(w.store.runs.get(RUN)!.state, "idle");
});

test("run-actor - recovery by a new owner: in_progress → incomplete (worker_execution_interrupted), then the queued turn starts", async (t) => {
  const w = await world();
  const first = w.actor(1);
  await first.command(startCmd());
  await first.command(continueCmd("turn_q", "queue", "next"));
  first.stop("partition lost"); // the owner is gone; the store still says busy

  const second = w.actor(2);
  await second.recover();
  const lost = w.store.turns.get("turn_1")!;
  t.is(lost.status, "incomplete");
  t.is(lost.error?.code, "worker_execution_interrupted");
  t.is(lost.epoch, 2);
  t.is(w.store.runs.get(RUN)!.active_turn_id, "turn_q");
  t.is(w.store.turns.get("turn_q")!.status, "in_progress");
  t.deepEqual(w.turns.last.request.input, [{ type: "input_text", text: "next" }], "the queued turn's agent started on the new owner");
  t.deepEqual(
    w.events.events(RUN).map((e) => e.sequence),
    w.events.events(RUN).map((_, i) => i + 1),
    "the new owner continues the numbering without gap or repeat",
  );
});

/** A tool call's start or end as the agent runner reports it. */
const toolEvent = (type: "tool_execution_start" | "tool_execution_end", toolCallId: string, toolName = "bash") => ({ type, data: type === "tool_execution_start" ? { toolCallId, toolName, args: { command: "curl -X POST …" } } : { toolCallId, toolName, result: { content: [] }, isError: false } });

/**
 * A turn started on one owner, whose agent reports `during` (its events), then lost with
 * that owner; `before` prepares what the next owner meets; `recover` has the next owner recover the run.
 */
async function lostTurn(during: (report: TurnRunRequest["onEvent"]) => void, before: (w: ActorWorld) => void = () => undefined) {
  const w = await world();
  const first = w.actor(1);
  okReply(await first.command(startCmd()));
  during(w.turns.last.request.onEvent);
  first.stop("partition lost");
  before(w);
  return { w, recover: () => w.actor(2).recover() };
}

for (const [name, calls, code] of [
  ["no tool call", [], "worker_execution_interrupted"],
  ["a call that started and ended", [["tool_execution_start", "c1"], ["tool_execution_end", "c1"]], "worker_execution_interrupted"],
  ["a call that started and never ended", [["tool_execution_start", "c1"], ["tool_execution_end", "c1"], ["tool_execution_start", "c2"]], "worker_action_interrupted"],
  ["a read-only tool's call that never ended", [["tool_execution_start", "c1", "read"]], "worker_execution_interrupted"],
] as const) {
  test(`run-actor - recovery: a turn lost with ${name} ends ${code}`, async (t) => {
    const { w, recover } = await lostTurn((report) => {
      for (const [type, id, tool] of calls as ReadonlyArray<readonly ["tool_execution_start" | "tool_execution_end", string, string?]>) report(toolEvent(type, id, tool));
    });
    await recover();
    const lost = w.store.turns.get("turn_1")!;
    t.is(lost.status, "incomplete");
    t.is(lost.error?.code, code);
    t.is(lost.error?.retryable, code === "worker_execution_interrupted");
  });
}

test("run-actor - recovery: a turn whose events cannot be read is taken as lost during an action (not retryable), never as a plain interruption", async (t) => {
  const { w, recover } = await lostTurn(() => undefined, (w) => (w.events.readFailure = new Error("stream unavailable")));
  await recover();
  t.is(w.store.turns.get("turn_1")!.error?.code, "worker_action_interrupted");
  t.false(w.store.turns.get("turn_1")!.error?.retryable);
});

test("run-actor - recovery: a transient failure to read the turn's events leaves the run for a later recovery instead of deciding blind; once readable, the turn ends as its events say", async (t) => {
  const { w, recover } = await lostTurn(() => undefined, (w) => (w.events.readFailure = unavailable(new natsErrors.TimeoutError())));
  await t.throwsAsync(recover());
  t.is(w.store.turns.get("turn_1")!.status, "in_progress", "not settled on a guess");
  w.events.readFailure = undefined;
  await w.actor(3).recover();
  t.is(w.store.turns.get("turn_1")!.error?.code, "worker_execution_interrupted");
});

test("run-actor - approvals: a denied call's id used again by a later call that never ended counts as an action (a model may reuse call ids)", async (t) => {
  const { w, actor, action } = await waitingWorld();
  okReply(await actor.command({ op: "decide", workspace_id: WS, run_id: RUN, action_id: action.id, decision: "deny", reason: "no", decision_id: "d" }));
  await settled(actor);
  // The resumed agent reports the denial's end, then a later message's call with the same id starts.
  w.turns.last.request.onEvent(toolEvent("tool_execution_end", "call_1"));
  w.turns.last.request.onEvent(toolEvent("tool_execution_start", "call_1"));
  actor.stop("partition lost");
  await w.actor(2).recover();
  t.is(w.store.turns.get("turn_1")!.error?.code, "worker_action_interrupted");
});

test("run-actor - recovery: an event log whose clock is far behind the node's (its events dated before the turn's creation less the skew allowed) is read from the run's start, so a call left running is still found", async (t) => {
  // The log stored every event of the turn 10 minutes before the node's time (5 are allowed).
  const { w, recover } = await lostTurn(
    (report) => report(toolEvent("tool_execution_start", "c1")),
    (w) => w.events.byRun.get(RUN)!.forEach((event) => (event.ms = (event.ms ?? 0) - 10 * 60_000)),
  );
  await recover();
  t.is(w.store.turns.get("turn_1")!.error?.code, "worker_action_interrupted");
});

test("run-actor - recovery: a turn's calls are told apart over several pages of its events, and another turn's open call does not count", async (t) => {
  const { w, recover } = await lostTurn(
    (report) => {
      // 2,500 text deltas between a call's start and its end: its end is on the third page.
      report(toolEvent("tool_execution_start", "c1"));
      for (let i = 0; i < 2_500; i++) report({ type: "text_delta", data: { delta: "x" } });
      report(toolEvent("tool_execution_end", "c1"));
    },
    // An event of another turn with an open call (as a stale log could hold) is not this turn's.
    (w) => w.events.byRun.get(RUN)!.push({ sequence: 1_000_000, turn_id: "turn_other", source: "runtime", type: "tool_execution_start", data: { toolCallId: "c9" } }),
  );
  await recover();
  t.is(w.store.turns.get("turn_1")!.error?.code, "worker_execution_interrupted");
});

test("run-actor - recovery: a turn stored final whose run never moved on (its owner died between the writes) gets its webhooks from the new owner", async (t) => {
  const w = await world();
  const first = w.actor(1);
  await first.command(startCmd());
  first.stop("partition lost");
  // The final write of the turn landed; the owner died before recording webhooks and moving the run on.
  Object.assign(w.store.turns.get("turn_1")!, { status: "completed", output: [{ type: "output_text", text: "done" }], completed_at: w.clock.nowMs() });
  t.deepEqual(w.webhookEvents, []);

  const second = w.actor(2);
  await second.recover();
  t.deepEqual(w.webhookEvents.map((e) => [e.type, e.eventKey]), [["turn.completed", "turn_1"]]);
  t.is((w.webhookEvents[0]!.data as { run: { turn: { output: Array<{ text: string }> } } }).run.turn.output[0]!.text, "done");
  t.is(w.store.runs.get(RUN)!.state, "idle", "and the run moved on");
  t.is((w.webhookEvents[0]!.data as { run: { state: string } }).run.state, "idle", "the webhook shows the run as it moved on, not as it was");
  t.false(w.events.types(RUN).includes("turn.completed"), "the final event is not emitted a second time (it may have gone out before the crash)");
  t.is(w.store.turns.get("turn_1")!.status, "completed", "the stored outcome stands");
});

test("run-actor - recovery settles a cancelling turn as cancelled", async (t) => {
  const w = await world();
  const first = w.actor(1);
  await first.command(startCmd());
  // Cancelling was stored, then the owner died before the agent stopped.
  await w.store.updateTurnFenced("turn_1", 1, { status: "cancelling" });
  first.stop("partition lost");
  const second = w.actor(2);
  await second.recover();
  t.is(w.store.turns.get("turn_1")!.status, "cancelled");
  t.is(w.store.runs.get(RUN)!.state, "idle");
});

test("run-actor - fencing: once a newer owner claimed the run, the old actor writes nothing and answers not_owner", async (t) => {
  const w = await world();
  const stale = w.actor(1);
  await stale.command(startCmd());
  t.truthy(await w.store.claimRun(RUN, 2), "another node took the partition over");
  const writes = w.store.writes.length;

  t.deepEqual(await stale.command({ op: "tags", workspace_id: WS, run_id: RUN, add: ["x"], remove: [] }), { ok: false, not_owner: true });
  t.true(stale.isStopped);
  // Its agent's end arrives later: nothing is stored by the stale owner.
  w.turns.last.finish({ outcome: "completed" });
  await new Promise((resolve) => setImmediate(resolve));
  t.deepEqual(await stale.command(continueCmd("turn_2", "queue")), { ok: false, not_owner: true });
  t.is(w.store.writes.length, writes, "no write after the takeover");
  t.is(w.store.turns.get("turn_1")!.status, "in_progress", "left for the new owner to recover");
  t.deepEqual(w.store.runs.get(RUN)!.tags, ["a", "b"]);
});

test("run-actor - an older epoch cannot even activate a run a newer owner claimed", async (t) => {
  const w = await world();
  const owner = w.actor(5);
  await owner.command(startCmd());
  const older = w.actor(3);
  t.deepEqual(await older.command({ op: "cancel", workspace_id: WS, run_id: RUN }), { ok: false, not_owner: true });
  t.is(w.store.turns.get("turn_1")!.status, "in_progress");
});

test("run-actor - other workspaces see no run; tags edit with set semantics and a limit; delete only when idle", async (t) => {
  const w = await world();
  const actor = w.actor();
  await actor.command(startCmd());
  t.like(await actor.command({ op: "tags", workspace_id: "ws_other", run_id: RUN, add: ["x"], remove: [] }), { ok: false, code: "run_not_found" });
  t.like(await actor.command({ op: "continue", workspace_id: "ws_other", run_id: RUN, turn_id: "turn_x", input: [], on_busy: "queue" }), { ok: false, code: "run_not_found", param: "run_id" });
  t.deepEqual(okReply(await actor.command({ op: "tags", workspace_id: WS, run_id: RUN, add: ["c"], remove: ["a"] })).tags, ["b", "c"]);
  const many = Array.from({ length: 60 }, (_, i) => `t${i}`);
  t.like(await actor.command({ op: "tags", workspace_id: WS, run_id: RUN, add: many, remove: [] }), { ok: false, code: "invalid_request", param: "add" });

  t.like(await actor.command({ op: "delete", workspace_id: WS, run_id: RUN }), { ok: false, code: "run_busy" });
  w.turns.last.finish({ outcome: "completed" });
  await settled(actor);
  okReply(await actor.command({ op: "delete", workspace_id: WS, run_id: RUN }));
  t.false(w.store.runs.has(RUN));
  // The answer waits for the run's document only; its other parts go after it.
  await until(() => w.checkpoints.removed.length > 0);
  t.is(w.store.turns.size, 0);
  t.like(w.store.tombstones.get(RUN), { reason: "deleted", partition: 0, plan: "business" });
  t.false("parts_due_at" in w.store.tombstones.get(RUN)!, "every part went: no check of them is due");
  t.deepEqual(w.events.types(RUN), [], "its events are purged");
  t.deepEqual(w.checkpoints.removed, [RUN]);
});

test("run-actor - a deleted run's parts are each removed whatever became of the others: its turns failing to go leaves its events, workspace and checkpoint to be removed, and the delete answers", async (t) => {
  const w = await world();
  const actor = w.actor();
  await startIdle(w, actor);
  let attempts = 0;
  w.store.deleteTurnsOf = async () => {
    attempts++;
    throw new Error("the store answered garbage");
  };
  okReply(await actor.command({ op: "delete", workspace_id: WS, run_id: RUN }));
  await until(() => w.checkpoints.removed.length > 0);
  t.is(attempts, 1, "not a moment's failure: not retried");
  t.false(w.store.runs.has(RUN), "the run is gone (fenced first)");
  t.is(w.store.tombstones.get(RUN)?.reason, "deleted");
  t.deepEqual(w.events.types(RUN), [], "its events are purged all the same");
  t.deepEqual(w.checkpoints.removed, [RUN], "and its checkpoint");
  t.is(w.store.tombstones.get(RUN)?.parts_due_at, w.clock.now + PARTS_CHECK_AFTER_MS, "the partition's owner checks its parts later");
});

test("run-actor - a deleted run's parts wait for the node's bounded removals; past its queue they are left to the tombstone's check, and the delete answers either way", async (t) => {
  for (const waiting of [1, 0]) {
    const w = await world();
    // One removal at a time, `waiting` behind it; the one slot is held by another run's removal.
    w.resources.partRemovals = new BoundedWork(1, waiting);
    let release!: () => void;
    const holding = w.resources.partRemovals.run(() => new Promise<void>((resolve) => (release = resolve)));
    const actor = w.actor();
    await startIdle(w, actor);
    okReply(await actor.command({ op: "delete", workspace_id: WS, run_id: RUN }));
    // Time for a removal that did not wait to have begun (the unbounded one did at once).
    await ticks(100);
    t.false(w.store.runs.has(RUN), `queue ${waiting}: the run is gone at the answer`);
    t.is(w.store.turns.size, 1, `queue ${waiting}: its turn waits (no slot)`);
    t.deepEqual(w.checkpoints.removed, []);
    t.is(w.store.tombstones.get(RUN)?.parts_due_at, w.clock.now + PARTS_CHECK_AFTER_MS, `queue ${waiting}: the check stays due meanwhile`);
    release();
    await holding;
    if (waiting) {
      await until(() => w.checkpoints.removed.length > 0 && !("parts_due_at" in w.store.tombstones.get(RUN)!));
      t.is(w.store.turns.size, 0, "queued: removed once the slot freed");
      t.deepEqual(w.checkpoints.removed, [RUN]);
      t.false("parts_due_at" in w.store.tombstones.get(RUN)!, "every part went: no check is due");
    } else {
      await ticks(100);
      t.is(w.store.turns.size, 1, "refused: nothing removed here");
      t.deepEqual(w.checkpoints.removed, []);
      t.is(w.store.tombstones.get(RUN)?.parts_due_at, w.clock.now + PARTS_CHECK_AFTER_MS, "refused: left to the partition owner's check");
    }
  }
});

test("run-actor - a start re-driven with its ids after its run was deleted (its key's record left pending) does not make the run again", async (t) => {
  const w = await world();
  const owner = w.actor();
  await startIdle(w, owner);
  okReply(await owner.command({ op: "delete", workspace_id: WS, run_id: RUN }));
  await until(() => w.checkpoints.removed.length > 0);
  const started = w.turns.started.length;
  // The gateway's re-drive: the same ids, not a fresh claim (the host gives it a new actor: the
  // deleting one stopped); on this node or on the partition's next owner.
  for (const actor of [w.actor(), w.actor(2)]) {
    const reply = okReply(await actor.command(startCmd("turn_1", { fresh: false })));
    t.like(reply, { run_id: RUN, turn_id: "turn_1", disposition: "created" });
    t.is(reply.run, undefined, "no run to show: the request reads it (404)");
  }
  t.false(w.store.runs.has(RUN), "the run stays deleted");
  t.is(w.store.turns.size, 0);
  t.deepEqual(w.events.types(RUN), [], "no run.created again");
  t.is(w.turns.started.length, started, "no agent ran");
});

test("run-actor - an expired run answers run_expired and the sweeper removes it with a tombstone", async (t) => {
  const w = await world();
  const actor = w.actor();
  await startIdle(w, actor);
  w.clock.now += 86_400_000 + 1;
  t.like(await actor.command(continueCmd("turn_2", "queue")), { ok: false, code: "run_expired" });
  await actor.expire();
  t.false(w.store.runs.has(RUN));
  t.is(w.store.tombstones.get(RUN)?.reason, "expired");
});

test("run-actor - expiry of a busy run: not while its turn can be at work (the actor keeps the turn); past the turn limit too, removed without recovering its lost turn, even one whose recovery keeps failing", async (t) => {
  // A turn at work on this actor, past the run's retention but within the grace.
  const w = await world();
  const actor = w.actor();
  okReply(await actor.command(startCmd()));
  const run = w.store.runs.get(RUN)!;
  w.clock.now = run.expires_at + 1;
  t.false(await actor.expire());
  t.true(w.store.runs.has(RUN));
  t.is(w.store.runs.get(RUN)!.state, "busy");
  t.true(actor.hasActiveTurn, "its turn goes on");

  // A turn lost with its owner, whose events cannot be read for now: recovery throws.
  const lost = await lostTurn(() => undefined, (w) => (w.events.readFailure = unavailable(new natsErrors.TimeoutError())));
  const stuck = lost.w.store.runs.get(RUN)!;
  lost.w.clock.now = stuck.expires_at + 1;
  t.false(await lost.w.actor(2).expire(), "within the grace: left, and nothing thrown (it was not activated)");
  t.is(lost.w.store.turns.get("turn_1")!.status, "in_progress");
  lost.w.clock.now = stuck.expires_at + busyGraceMs(lost.w.resources.config.turnLimitMs);
  t.true(await lost.w.actor(3).expire());
  t.false(lost.w.store.runs.has(RUN));
  t.is(lost.w.store.tombstones.get(RUN)?.reason, "expired");
});

test("run-actor - abuse: a turn streaming an event a second for hours writes its run once per refresh interval (a hundredth of the retention, at most 10 min), not per event", async (t) => {
  const w = await world();
  const actor = w.actor();
  okReply(await actor.command(startCmd()));
  const before = w.store.runs.get(RUN)!.last_activity_at;
  const refreshes = () => w.store.writes.filter((write) => write === "update run expires_at,last_activity_at").length;
  // 5,000 events, one a second: a model told to stream as much as it can.
  for (let i = 0; i < 5_000; i++) {
    w.clock.now += 1_000;
    w.turns.last.request.onEvent({ type: "message_update", data: { delta: "x" } } as never);
    await new Promise((resolve) => setImmediate(resolve));
  }
  const interval = retentionRefreshMs(w.store.runs.get(RUN)!.retention_s);
  t.is(interval, 600_000);
  const written = refreshes();
  t.true(written >= 1 && written <= Math.ceil(5_000_000 / interval), `${written} writes of the run for 5,000 events over 5,000 s`);
  t.true(w.store.runs.get(RUN)!.last_activity_at > before, "the clock restarted");
  t.true(actor.hasActiveTurn);
});

test("run-actor - expiry race: a run that moved on between the sweeper's read and its claim is not held half-activated; the same actor's recovery then ends the lost turn", async (t) => {
  const { w } = await lostTurn(() => undefined);
  const stored = w.store.runs.get(RUN)!;
  // The read the sweep acts on is stale: it shows the run long past its retention and grace.
  const read = w.store.getRun.bind(w.store);
  w.store.getRun = async (id: string) => {
    const run = await read(id);
    return run && { ...run, expires_at: 0 };
  };
  w.clock.now = stored.expires_at - 1;
  const actor = w.actor(2);
  t.false(await actor.expire());
  w.store.getRun = read;
  t.true(w.store.runs.has(RUN));
  await actor.recover();
  t.is(w.store.turns.get("turn_1")!.status, "incomplete", "recovered whole by the actor that did not expire it");
  t.is(w.store.runs.get(RUN)!.state, "idle");
});

test("run-actor - race: a paused owner whose partition moved cannot store its finished turn: the new owner's claim fences the turn too, and the turn ends once", async (t) => {
  const w = await world();
  const stale = w.actor(1);
  await stale.command(startCmd());
  // The old owner's agent finishes while it does not know its partition moved.
  const spot = w.steps.park("turn:finishing");
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "late" }] });
  await spot.reached;
  const owner = w.actor(2);
  await owner.recover();
  t.is(w.store.turns.get("turn_1")!.status, "incomplete", "the new owner recovered the turn it found in progress");
  t.is(w.store.runs.get(RUN)!.state, "idle");

  spot.release();
  await new Promise((resolve) => setImmediate(resolve));
  t.deepEqual(await stale.command({ op: "tags", workspace_id: WS, run_id: RUN, add: [], remove: [] }), { ok: false, not_owner: true });
  t.true(stale.isStopped, "the refused write stopped the old owner");
  t.is(w.store.turns.get("turn_1")!.status, "incomplete", "the old owner's result did not overwrite it");
  t.deepEqual(w.store.turns.get("turn_1")!.output, []);
  const finals = w.events.events(RUN).filter((e) => e.turn_id === "turn_1" && /^turn\.(completed|failed|cancelled|incomplete)$/.test(e.type));
  t.deepEqual(finals.map((e) => e.type), ["turn.incomplete"], "one final event for the turn");
});

test("run-actor - race: a paused owner's late workspace save cannot replace the checkpoint the new owner saved; it stops fenced", async (t) => {
  const w = await world();
  const stale = w.actor(1);
  await stale.command(startCmd());
  const staleTurn = w.turns.last; // prepared its workspace with no checkpoint stored (revision 0)
  const owner = w.actor(2);
  await owner.recover();
  okReply(await owner.command(continueCmd("turn_2", "reject")));
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "new owner's work" }] });
  await settled(owner);
  t.is(w.store.turns.get("turn_2")!.status, "completed");
  t.is(w.checkpoints.revision, 1, "the new owner saved the workspace");

  // The old owner wakes up, its agent finishes, and it saves what it expects to replace: none.
  const finishing = w.steps.park("turn:finishing");
  let wrote = false;
  void finishing.reached.then(() => (wrote = true));
  staleTurn.finish({ outcome: "completed", output: [{ type: "output_text", text: "late" }] });
  await new Promise((resolve) => setImmediate(resolve));
  t.deepEqual(await stale.command({ op: "tags", workspace_id: WS, run_id: RUN, add: [], remove: [] }), { ok: false, not_owner: true });
  t.true(stale.isStopped);
  t.false(wrote, "the conflict's ownership check stopped the old owner before its turn's own write");
  finishing.release();
  t.is(w.checkpoints.revision, 1, "the new owner's checkpoint was not replaced");
  t.is(w.checkpoints.saved, 1);
  t.deepEqual(w.checkpoints.expected, [0, 0], "the late save expected the checkpoint it had read: refused, not retried");
  t.is(w.store.turns.get("turn_1")!.status, "incomplete");
  t.is(w.store.turns.get("turn_2")!.status, "completed");
});

test("run-actor - race: a paused owner's save that lands before the new owner's is saved over: the new owner's workspace is the run's", async (t) => {
  const w = await world();
  const stale = w.actor(1);
  await stale.command(startCmd());
  const staleTurn = w.turns.last;
  const owner = w.actor(2);
  await owner.recover();
  okReply(await owner.command(continueCmd("turn_2", "reject")));
  const ownerTurn = w.turns.last; // prepared with no checkpoint stored (revision 0)

  // The old owner's late save comes first and is stored (nothing newer to refuse it); its turn's write is fenced.
  staleTurn.finish({ outcome: "completed", output: [{ type: "output_text", text: "late" }] });
  await new Promise((resolve) => setImmediate(resolve));
  t.deepEqual(await stale.command({ op: "tags", workspace_id: WS, run_id: RUN, add: [], remove: [] }), { ok: false, not_owner: true });
  t.is(w.checkpoints.revision, 1);
  t.is(w.store.turns.get("turn_1")!.status, "incomplete", "the old owner's result did not overwrite the recovery");

  ownerTurn.finish({ outcome: "completed", output: [{ type: "output_text", text: "new owner's work" }] });
  await settled(owner);
  t.is(w.store.turns.get("turn_2")!.status, "completed", "the conflict did not fail the owner's turn");
  t.deepEqual(w.checkpoints.expected, [0, 0, 1], "the owner's save met the late one, checked it still owns the run, and saved over it");
  t.is(w.checkpoints.revision, 2);
  t.false(owner.isStopped);
  // Its next save expects its own revision: no conflict.
  okReply(await owner.command(continueCmd("turn_3", "reject")));
  w.turns.last.finish({ outcome: "completed" });
  await settled(owner);
  t.deepEqual(w.checkpoints.expected, [0, 0, 1, 2]);
  t.is(w.store.turns.get("turn_3")!.status, "completed");
});

test("run-actor - race: a cancel that arrives while a finished turn moves the run on waits for it, then answers 200 on the final turn", async (t) => {
  const w = await world();
  const actor = w.actor();
  await actor.command(startCmd());
  const spot = w.steps.park("turn:run_moving_on");
  w.turns.last.finish({ outcome: "completed" });
  await spot.reached;
  t.is(w.store.turns.get("turn_1")!.status, "completed", "the turn is final");
  t.is(w.store.runs.get(RUN)!.state, "busy", "the run has not moved on yet");
  let answered = false;
  const cancel = actor.command({ op: "cancel", workspace_id: WS, run_id: RUN, turn_id: "turn_1" }).then((reply) => ((answered = true), reply));
  await new Promise((resolve) => setTimeout(resolve, 20));
  t.false(answered, "the cancel waits in the mailbox behind the turn's settlement");
  spot.release();
  const reply = okReply(await cancel);
  t.is(reply.http_status, 200);
  t.is(w.store.turns.get("turn_1")!.status, "completed", "a cancel of a final turn changes nothing");
  t.is(w.store.runs.get(RUN)!.state, "idle");
});

test("run-actor - race: a start parked between its turn and its run is not visible as a run; a resend of it after the actor stopped is admitted once", async (t) => {
  const w = await world();
  const first = w.actor(1);
  const spot = w.steps.park("start:turn_stored");
  const pending = first.command(startCmd());
  await spot.reached;
  t.true(w.store.turns.has("turn_1"), "the turn is stored first");
  t.false(w.store.runs.has(RUN), "the run is not stored yet: no run points at a missing turn, ever");
  spot.release();
  okReply(await pending);
  // The gateway resends (its reply was lost); a new owner answers from the store.
  first.stop("partition lost");
  const owner = w.actor(2);
  const again = okReply(await owner.command(startCmd("turn_1", { fresh: false })));
  t.is(again.turn_id, "turn_1");
  t.is(w.store.turns.size, 1);
  t.deepEqual(w.events.types(RUN).filter((type) => type === "run.created"), ["run.created"]);
});

test("run-actor - a start resent after an attempt that stored its first events and died before its run: those events are kept, no second run.created or turn.started", async (t) => {
  const w = await world();
  const first = w.actor(1);
  const spot = w.steps.park("start:turn_stored");
  void first.command(startCmd());
  await spot.reached;
  t.deepEqual(w.events.types(RUN), ["run.created", "turn.started"]);
  // The owner dies here: its events and its turn are stored, its run is not.
  first.stop("node died");
  const owner = w.actor(2);
  const again = okReply(await owner.command(startCmd("turn_1", { fresh: false })));
  t.is(again.turn_id, "turn_1");
  t.true(w.store.runs.has(RUN));
  t.is(w.store.turns.get("turn_1")!.first_event_seq, 2, "the turn points at its one turn.started");
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "once" }] });
  await settled(owner);
  t.deepEqual(w.events.types(RUN), ["run.created", "turn.started", "turn.completed"]);
  t.deepEqual(w.events.events(RUN).map((e) => e.sequence), [1, 2, 3]);
});

test("run-actor - a start resent after an attempt that stored only run.created: turn.started follows it, once", async (t) => {
  const w = await world();
  w.events.appender({ id: RUN, workspace_id: WS, plan: "business" }, 1).append(null, "platform", "run.created", { agent_id: AGENT, agent_version: 1, tags: ["a", "b"] }, 0);
  const owner = w.actor(2);
  okReply(await owner.command(startCmd("turn_1", { fresh: false })));
  t.deepEqual(w.events.types(RUN), ["run.created", "turn.started"]);
  t.is(w.store.turns.get("turn_1")!.first_event_seq, 2);
});

test("run-actor - usage: a turn's is stored with it and added to the run once, also when the move-on after it is retried", async (t) => {
  const w = await world();
  const actor = w.actor();
  await actor.command(startCmd());
  await actor.command(continueCmd("turn_q", "queue", "next"));
  // Starting the queued turn fails once after the run was moved on: the move-on runs again.
  w.store.failTurnWriteOnce = (id, set) => id === "turn_q" && set.status === "in_progress";
  const used = { input_tokens: 10, output_tokens: 2, cache_read_tokens: 1, cache_write_tokens: 0, cost_usd: 0.5 };
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "one" }], usage: used });
  await settled(actor);
  await settled(actor);
  t.deepEqual(w.store.turns.get("turn_1")!.usage, used);
  t.deepEqual(w.store.runs.get(RUN)!.usage, used, "added once, not once per attempt");
  t.is(w.store.runs.get(RUN)!.usage_turn_id, "turn_1");
  t.is(w.store.turns.get("turn_q")!.status, "in_progress", "the retried move-on started the queued turn");

  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "two" }], usage: { ...used, cost_usd: null } });
  await settled(actor);
  t.deepEqual(w.store.runs.get(RUN)!.usage, { input_tokens: 20, output_tokens: 4, cache_read_tokens: 2, cache_write_tokens: 0, cost_usd: 0.5 });
  // The ledger holds one record per turn, keyed by it, with the deployment's model.
  t.deepEqual(w.usage.map((r) => [r._id, r.run_id, r.agent_version, r.model, r.input_tokens, r.cost_usd]), [
    ["turn_1", RUN, 1, "faux/scripted", 10, 0.5],
    ["turn_q", RUN, 1, "faux/scripted", 10, null],
  ]);
});

test("run-actor - webhooks: a final turn's event is recorded once, also when the move-on is retried; a deleted run's too", async (t) => {
  const w = await world();
  const actor = w.actor();
  await actor.command(startCmd());
  await actor.command(continueCmd("turn_q", "queue", "next"));
  w.store.failTurnWriteOnce = (id, set) => id === "turn_q" && set.status === "in_progress";
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "one" }] });
  await settled(actor);
  await settled(actor);
  t.deepEqual(w.webhookEvents.map((e) => [e.type, e.eventKey, e.runId]), [["turn.completed", "turn_1", RUN]]);
  const view = w.webhookEvents[0]!.data as { run: { turn: { id: string; status: string }; state: string } };
  t.is(view.run.turn.id, "turn_1");
  t.is(view.run.state, "busy", "the run as the final event shows it: the queued turn started");
  w.turns.last.finish({ outcome: "failed", output: [], error: { code: "provider_request_rejected", source: "provider", message: "no", retryable: false, reference: "ref_x" } as never });
  await settled(actor);
  t.deepEqual(w.webhookEvents.map((e) => e.type), ["turn.completed", "turn.failed"]);
  t.true(okReply(await actor.command({ op: "delete", workspace_id: WS, run_id: RUN })).run_id === RUN);
  t.deepEqual(w.webhookEvents.map((e) => [e.type, e.eventKey]).at(-1), ["run.deleted", `${RUN}_deleted`]);
});

test("run-actor - a finished turn whose write meets a store outage keeps its own result: the write is retried, the turn completes with its output", async (t) => {
  const w = await world();
  const actor = w.actor();
  await actor.command(startCmd());
  w.store.failTurnWriteOnce = (id, set) => id === "turn_1" && set.status === "completed";
  w.store.failTurnWriteError = new StoreUnavailableError(new Error("connection refused"));
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "kept" }] });
  await settled(actor);
  t.true(w.store.failTurnWriteOnce === undefined, "the first write failed");
  const turn = w.store.turns.get("turn_1")!;
  t.is(turn.status, "completed");
  t.deepEqual(turn.output, [{ type: "output_text", text: "kept" }]);
  t.is(turn.error, null);
  t.is(w.store.runs.get(RUN)!.state, "idle");
  t.deepEqual(w.events.types(RUN).filter((type) => type.startsWith("turn.")), ["turn.started", "turn.completed"]);
  t.is(w.checkpoints.saved, 1, "the retried write does not save the workspace again");
});

/** Starts the run; one of its turn's events is lost (NATS away past the publisher's retries), then NATS answers again. */
async function startLosingAnEvent(w: ActorWorld, actor: RunActor): Promise<void> {
  await actor.command(startCmd());
  w.events.failWrites = true;
  w.turns.last.request.onEvent({ type: "text_delta", data: { delta: "lost" } } as never);
  w.events.failWrites = false;
}

test("run-actor - a turn whose events could not all be stored fails event_stream_write_failed with its result kept; its final event and the run's next turns are stored again without a new actor (the run had answered every later command with the first failure for as long as the actor lived: found by a fault probe)", async (t) => {
  const w = await world();
  const actor = w.actor();
  await startLosingAnEvent(w, actor);
  w.turns.last.request.onEvent({ type: "text_delta", data: { delta: "dropped too: the turn's stream already has a hole" } } as never);
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "kept" }] });
  await settled(actor);
  const turn = w.store.turns.get("turn_1")!;
  t.is(turn.status, "failed");
  t.is(turn.error?.code, "event_stream_write_failed");
  t.true(turn.error?.retryable);
  t.deepEqual(turn.output, [{ type: "output_text", text: "kept" }], "the result is kept");
  t.is(w.store.runs.get(RUN)!.state, "idle");
  t.deepEqual(w.events.types(RUN).filter((type) => type.startsWith("turn.")), ["turn.started", "turn.failed"], "the final event is stored once writes work again");
  const next = okReply(await actor.command(continueCmd("turn_2", "reject")));
  t.is(next.disposition, "continued");
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "again" }] });
  await settled(actor);
  t.is(w.store.turns.get("turn_2")!.status, "completed");
  t.deepEqual(w.events.events(RUN).filter((e) => e.turn_id === "turn_2").map((e) => e.type), ["turn.started", "turn.completed"]);
});

test("run-actor - a turn whose events were lost and whose first final write meets a store outage is still stored event_stream_write_failed when the write is retried (the appender resumed meanwhile: review)", async (t) => {
  const w = await world();
  const actor = w.actor();
  await startLosingAnEvent(w, actor);
  w.store.failTurnWriteOnce = (id, set) => id === "turn_1" && set.status !== undefined;
  w.store.failTurnWriteError = new StoreUnavailableError(new Error("connection refused"));
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "kept" }] });
  for (let i = 0; i < 20 && w.store.turns.get("turn_1")!.status === "in_progress"; i++) {
    await ticks(3);
    w.clock.advance(1_000);
  }
  await settled(actor);
  t.true(w.store.failTurnWriteOnce === undefined, "the first final write failed");
  const turn = w.store.turns.get("turn_1")!;
  t.is(turn.status, "failed");
  t.is(turn.error?.code, "event_stream_write_failed");
  t.deepEqual(turn.output, [{ type: "output_text", text: "kept" }]);
});

test("run-actor - an idle run's command whose event could not be stored fails; once events are stored again the next command is admitted by the same actor, not failed with the old error", async (t) => {
  const w = await world();
  const actor = w.actor();
  await startIdle(w, actor);
  w.events.failWrites = true;
  await t.throwsAsync(actor.command(continueCmd("turn_2", "reject")), { message: /could not be stored/ });
  t.is(w.store.turns.get("turn_2"), undefined, "a turn is announced only once its first event is stored");
  w.events.failWrites = false;
  const reply = okReply(await actor.command(continueCmd("turn_3", "reject")));
  t.is(reply.disposition, "continued");
  t.is(w.store.turns.get("turn_3")!.index, 1);
  t.deepEqual(w.events.events(RUN).filter((e) => e.turn_id === "turn_3").map((e) => e.type), ["turn.started"]);
});

test("run-actor - a finished turn whose write meets a store outage of a minute keeps its own result (it was stored interrupted without its output past ~15 s: fault probe); past the retries the actor stops unsettled, for the node to recover the run", async (t) => {
  for (const outageMs of [60_000, SETTLE_RETRY_MS + 30_000]) {
    const w = await world();
    const actor = w.actor();
    await actor.command(startCmd());
    w.store.failTurnWrites = (id, set) => id === "turn_1" && set.status !== undefined;
    w.store.failTurnWriteError = new StoreUnavailableError(new Error("connection refused"));
    w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "kept" }] });
    // The store answers again after `outageMs` of the actor's clock.
    let settlingSeen = false;
    for (let elapsed = 0; elapsed < outageMs + 10_000; elapsed += 250) {
      await ticks(3);
      if (elapsed === 5_000) settlingSeen = actor.isFinishingTurn;
      if (elapsed >= outageMs) w.store.failTurnWrites = undefined;
      w.clock.advance(250);
    }
    t.true(settlingSeen, "a draining node waits for it as for a running turn");
    t.false(actor.isFinishingTurn);
    await ticks(10);
    const turn = w.store.turns.get("turn_1")!;
    if (outageMs === 60_000) {
      t.is(turn.status, "completed", `${outageMs} ms`);
      t.deepEqual(turn.output, [{ type: "output_text", text: "kept" }]);
      t.is(w.store.runs.get(RUN)!.state, "idle");
    } else {
      t.is(turn.status, "in_progress", "left for the node's recovery");
      t.true(actor.isUnsettled, "stopped as unsettled");
      t.false(actor.holdsRun);
    }
  }
});

test("run-actor - a workspace save the object store did not answer in time is tried again: one stored though its answer was lost is saved over once ownership is confirmed, and the turn completes", async (t) => {
  const w = await world();
  const save = w.resources.checkpoints.save;
  let calls = 0;
  w.resources.checkpoints.save = async (...args) => {
    // The first is stored, but its answer does not come back (JetStream's timeout).
    if (calls++ === 0) {
      await save(...args);
      throw new CheckpointError("could not save the workspace", { cause: new natsErrors.TimeoutError() });
    }
    return save(...args);
  };
  const actor = w.actor();
  await actor.command(startCmd());
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "wrote" }] });
  await until(() => calls === 1 && w.clock.pending > 0);
  w.clock.advance(200); // the pause before the retry
  await until(() => w.store.turns.get("turn_1")!.status !== "in_progress");
  await settled(actor);
  t.is(w.store.turns.get("turn_1")!.status, "completed", JSON.stringify(w.store.turns.get("turn_1")!.error));
  t.deepEqual(w.checkpoints.expected, [0, 0, 1], "stored; tried again, it conflicted with itself; saved over it");
  t.is(w.checkpoints.revision, 2);
  t.false(actor.isStopped);

  // A failure that is not of the moment is not asked again: the turn fails at once.
  w.resources.checkpoints.save = async () => {
    calls++;
    throw new CheckpointError("tar exited 2: Cannot open: Permission denied");
  };
  calls = 0;
  okReply(await actor.command(continueCmd("turn_2", "reject")));
  w.turns.last.finish({ outcome: "completed" });
  await until(() => w.store.turns.get("turn_2")!.status !== "in_progress");
  t.is(w.store.turns.get("turn_2")!.error?.code, "workspace_checkpoint_failed");
  t.is(calls, 1);
});

test("run-actor - a turn without tools saves the workspace only when an earlier turn left it unsaved (here a failed save), and a turn with tools always does", async (t) => {
  const w = await world();
  const save = w.resources.checkpoints.save;
  let failures = 1;
  w.resources.checkpoints.save = async (...args) => {
    if (failures-- > 0) throw new CheckpointError("the object store is full");
    return save(...args);
  };
  const actor = w.actor();
  const finishTurn = async (text: string) => {
    w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text }] });
    await settled(actor);
  };
  await actor.command(startCmd());
  await finishTurn("wrote");
  t.is(w.store.turns.get("turn_1")!.error?.code, "workspace_checkpoint_failed");
  t.is(w.checkpoints.saved, 0);

  w.store.addDeployment(AGENT, 2, { config: { model: "faux/scripted", tools: [] } as never });
  w.store.activeVersions.set(AGENT, 2);
  okReply(await actor.command(continueCmd("turn_2", "reject")));
  await finishTurn("talked");
  t.is(w.store.turns.get("turn_2")!.agent_version, 2);
  t.is(w.store.turns.get("turn_2")!.status, "completed");
  t.is(w.checkpoints.saved, 1, "the turn without tools saved what the failed save left unsaved");

  okReply(await actor.command(continueCmd("turn_3", "reject")));
  await finishTurn("talked again");
  t.is(w.store.turns.get("turn_3")!.status, "completed");
  t.is(w.checkpoints.saved, 1, "nothing was left unsaved: the next turn without tools saves nothing");

  w.store.activeVersions.set(AGENT, 1);
  okReply(await actor.command(continueCmd("turn_4", "reject")));
  await finishTurn("tools again");
  t.is(w.store.turns.get("turn_4")!.agent_version, 1);
  t.is(w.checkpoints.saved, 2, "a turn with tools is saved after it");
});

test("run-actor - a new actor never saves a workspace it has not prepared: not after a turn without tools, not after a turn that failed before its workspace was prepared", async (t) => {
  const w = await world();
  const first = w.actor(1);
  await first.command(startCmd());
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "wrote" }] });
  await settled(first);
  t.is(w.checkpoints.saved, 1);
  first.stop("partition lost"); // this node keeps the directory; another may save newer ones

  const second = w.actor(2);
  w.store.addDeployment(AGENT, 2, { config: { model: "faux/scripted", tools: [] } as never });
  w.store.activeVersions.set(AGENT, 2);
  okReply(await second.command(continueCmd("turn_2", "reject")));
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "talked" }] });
  await settled(second);
  t.is(w.store.turns.get("turn_2")!.status, "completed");
  t.is(w.checkpoints.saved, 1, "the kept directory was not saved by a turn without tools");
  second.stop("partition lost");

  const third = w.actor(3);
  w.store.activeVersions.set(AGENT, 1);
  const listTurns = w.store.listTurns.bind(w.store);
  let failures = 1;
  // The session's load (the transcripts), not the activation's look for a turn admitted half.
  w.store.listTurns = async (...args) => {
    if (args[1]?.withTranscript && failures-- > 0) throw new Error("the store answered garbage");
    return listTurns(...args);
  };
  okReply(await third.command(continueCmd("turn_3", "reject")));
  await settled(third);
  t.is(w.store.turns.get("turn_3")!.error?.code, "runtime_dispatch_failed");
  t.is(w.checkpoints.saved, 1, "a turn that failed before its workspace was prepared saved nothing");
});

test("run-actor - a finished turn whose write fails otherwise (not a temporary failure) is stored failed without its result, never left busy", async (t) => {
  const w = await world();
  const actor = w.actor();
  await actor.command(startCmd());
  w.store.failTurnWriteOnce = (id, set) => id === "turn_1" && set.status === "completed";
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "lost" }] });
  await settled(actor);
  t.true(w.store.failTurnWriteOnce === undefined, "the first write failed");
  const turn = w.store.turns.get("turn_1")!;
  t.is(turn.status, "failed");
  t.is(turn.error?.code, "platform_failure");
  t.deepEqual(turn.output, []);
  t.is(w.store.runs.get(RUN)!.state, "idle");
});

test("run-actor - a finished turn whose transcript cannot fit its document is failed, not retryable (the same work makes the same transcript), with the run idle", async (t) => {
  const w = await world();
  const actor = w.actor();
  await actor.command(startCmd());
  // An assistant's text is kept whole (only user messages and tool results compact): 16 MiB of it cannot fit.
  const huge = [{ role: "assistant", content: [{ type: "text", text: "x".repeat(16 * 1024 * 1024) }], stopReason: "stop", timestamp: 2 }];
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "done" }], transcript: huge as never });
  await settled(actor);
  const turn = w.store.turns.get("turn_1")!;
  t.is(turn.status, "failed");
  t.is(turn.error?.code, "agent_execution_failed");
  t.false(turn.error?.retryable);
  t.regex(turn.error?.message ?? "", /does not fit the 15 MiB a turn may store/);
  t.deepEqual(turn.transcript, []);
  t.is(w.store.runs.get(RUN)!.state, "idle");
});

test("run-actor - a turn admitted half (stored, its run write failed) fails runtime_dispatch_failed before the next command, and the run takes new turns: it had stayed in progress for good, and every new turn was 409 'The turn id is taken' (found by a fault probe)", async (t) => {
  const w = await world();
  const actor = w.actor();
  okReply(await actor.command(startCmd()));
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "one" }] });
  await settled(actor);
  // The store fails the run's write after the turn's insert (a timeout, say).
  const update = w.store.updateRunFenced.bind(w.store);
  let failures = 1;
  w.store.updateRunFenced = async (id, epoch, set) => {
    if (set.turn_count !== undefined && failures-- > 0) throw new Error("store unavailable (injected)");
    return update(id, epoch, set);
  };
  await t.throwsAsync(actor.command(continueCmd("turn_2", "queue")), { message: /injected/ });
  t.is(w.store.turns.get("turn_2")?.status, "in_progress", "stored, the run not naming it");
  // A retry of it answers the turn, now final and retryable; a new turn is admitted after it.
  const retried = await actor.command({ ...continueCmd("turn_2", "queue"), resent: true } as RunCommand);
  okReply(retried);
  t.is(w.store.turns.get("turn_2")!.status, "failed");
  t.is(w.store.turns.get("turn_2")!.error?.code, "runtime_dispatch_failed");
  t.true(w.store.turns.get("turn_2")!.error?.retryable);
  t.true(w.events.types(RUN).includes("turn.failed"), "its stream ends");
  const finalEvent = w.events.events(RUN).find((e) => e.type === "turn.failed" && e.turn_id === "turn_2")!;
  t.is((finalEvent.data as { run: { turn: { status: string } } }).run.turn.status, "failed");
  t.true(w.webhookEvents.some((e) => e.eventKey.includes("turn_2")), "its turn.failed webhook is recorded, as any final turn's");
  t.true(w.published.includes("runs.turn.turn_2.final"), "waiters hear it at once, not at their timeout");
  okReply(await actor.command(continueCmd("turn_3", "queue")));
  t.is(w.store.turns.get("turn_3")!.index, 2);
  t.is(w.store.runs.get(RUN)!.turn_count, 3);
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "three" }] });
  await settled(actor);
  t.is(w.store.turns.get("turn_3")!.status, "completed");
  t.is(w.store.runs.get(RUN)!.state, "idle");
});

/**
 * A run whose turn_1 is active and whose queued turn_2's admission failed at the run's write
 * (which landed first, when `landed`): the turn is stored, the run may not name it.
 */
async function queuedAdmissionInDoubt(t: ExecutionContext, landed: boolean) {
  const w = await world();
  const actor = w.actor();
  okReply(await actor.command(startCmd()));
  const update = w.store.updateRunFenced.bind(w.store);
  let failures = 1;
  w.store.updateRunFenced = async (id, epoch, set) => {
    if (set.queued_turn_id !== undefined && set.queued_turn_id !== null && failures-- > 0) {
      if (landed) await update(id, epoch, set);
      throw new Error("store unavailable (injected)");
    }
    return update(id, epoch, set);
  };
  await t.throwsAsync(actor.command(continueCmd("turn_2", "queue")), { message: /injected/ });
  return { w, actor };
}

test("run-actor - a queued turn admitted half is settled before the next command: failed when the run's write did not land, kept queued when it did", async (t) => {
  for (const landed of [false, true]) {
    const { w, actor } = await queuedAdmissionInDoubt(t, landed);
    // The next command (a tag edit) settles it first.
    okReply(await actor.command({ op: "tags", workspace_id: WS, run_id: RUN, add: ["x"], remove: [] } as RunCommand));
    t.is(w.store.turns.get("turn_2")!.status, landed ? "queued" : "failed", `landed: ${landed}`);
    t.is(w.store.runs.get(RUN)!.turn_count, 2);
    // The active turn's end starts the queued one when it is the run's.
    w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "one" }] });
    await settled(actor);
    if (landed) {
      t.is(w.store.turns.get("turn_2")!.status, "in_progress");
      w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "two" }] });
      await settled(actor);
    }
    t.is(w.store.runs.get(RUN)!.state, "idle");
    okReply(await actor.command(continueCmd("turn_3", "queue")));
    t.is(w.store.turns.get("turn_3")!.index, 2);
  }
});

test("run-actor - a queued turn admitted half is settled when the active turn ends first, before the run moves on: started when the run's write landed, failed when it did not (found by a review: it stayed queued for good)", async (t) => {
  for (const landed of [true, false]) {
    const { w, actor } = await queuedAdmissionInDoubt(t, landed);
    w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "one" }] });
    await settled(actor);
    t.is(w.store.turns.get("turn_2")!.status, landed ? "in_progress" : "failed", `landed: ${landed}`);
    if (landed) {
      w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "two" }] });
      await settled(actor);
      t.is(w.store.turns.get("turn_2")!.status, "completed");
    }
    t.is(w.store.runs.get(RUN)!.state, "idle");
    t.is(w.store.runs.get(RUN)!.turn_count, 2);
  }
});

test("run-actor - a settlement of a half-admitted turn that fails part way is tried again before the next command (found by a review)", async (t) => {
  const w = await world();
  const actor = w.actor();
  okReply(await actor.command(startCmd()));
  const update = w.store.updateRunFenced.bind(w.store);
  let failures = 2; // the admission's write, then the settlement's
  w.store.updateRunFenced = async (id, epoch, set) => {
    if ((set.queued_turn_id || set.turn_count !== undefined) && failures-- > 0) throw new Error("store unavailable (injected)");
    return update(id, epoch, set);
  };
  await t.throwsAsync(actor.command(continueCmd("turn_2", "queue")), { message: /injected/ });
  await t.throwsAsync(actor.command({ op: "tags", workspace_id: WS, run_id: RUN, add: ["x"], remove: [] } as RunCommand), { message: /injected/ });
  okReply(await actor.command({ op: "tags", workspace_id: WS, run_id: RUN, add: ["y"], remove: [] } as RunCommand));
  t.is(w.store.turns.get("turn_2")!.status, "failed");
  t.is(w.store.runs.get(RUN)!.turn_count, 2);
  // The retry found it final: its webhook (once) and its notice still go (review).
  t.is(w.webhookEvents.filter((e) => e.eventKey.includes("turn_2")).length, 1);
  t.true(w.published.includes("runs.turn.turn_2.final"));
  okReply(await actor.command(continueCmd("turn_3", "queue")));
  t.is(w.store.turns.get("turn_3")!.index, 2);
});

test("run-actor - usage: a turn that used nothing writes no ledger record", async (t) => {
  const w = await world();
  const actor = w.actor();
  await actor.command(startCmd());
  w.turns.last.finish({ outcome: "completed", output: [{ type: "output_text", text: "one" }], usage: { input_tokens: 0, output_tokens: 0, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: null } });
  await settled(actor);
  t.is(w.store.turns.get("turn_1")!.status, "completed");
  t.deepEqual(w.usage, []);
});

// ---- approvals: a turn that waits for a person ---------------------------------------

/** Expires after 30 s; the fakes' turn limit is 60 s. */
const GATED = { model: "faux/scripted", tools: ["bash"], approval: { rules: [{ tool: "bash" }], timeout_s: 30 } } as const;

/** An asking message: one bash call, as the agent runner pauses at it. */
function asked(callId = "call_1") {
  return [
    { role: "user", content: [{ type: "text", text: "hi" }], timestamp: 1 },
    { role: "assistant", content: [{ type: "toolCall", id: callId, name: "bash", arguments: { command: "rm x" } }], stopReason: "toolUse", usage: { input: 5, output: 1, cacheRead: 0, cacheWrite: 0, totalTokens: 6, cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } }, timestamp: 2 },
  ];
}

/** Starts turn_1 on a gated deployment and lets its agent pause at a bash call. */
async function waitingWorld() {
  const w = await world();
  w.store.addDeployment(AGENT, 1, { config: GATED as never });
  const actor = w.actor();
  okReply(await actor.command(startCmd()));
  const usage = { input_tokens: 5, output_tokens: 1, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: null };
  // The gated call's start was reported before the turn came to wait (its end comes once decided).
  w.turns.last.request.onEvent(toolEvent("tool_execution_start", "call_1"));
  w.turns.last.finish({ outcome: "paused", transcript: asked() as never, usage, pause: { toolCallId: "call_1", tool: "bash", arguments: { command: "rm x" }, assistantIndex: 1, steers: [] } });
  await settled(actor);
  const action = w.store.turns.get("turn_1")!.actions![0]!;
  return { w, actor, action };
}

test("run-actor - approvals: a paused agent leaves the turn waiting (no agent, no active-turn count) with its action, transcript and usage stored", async (t) => {
  const { w, actor, action } = await waitingWorld();
  const turn = w.store.turns.get("turn_1")!;
  t.is(turn.status, "in_progress");
  t.like(action, { tool: "bash", tool_call_id: "call_1", decision: null, assistant_index: 1, expires_at: action.requested_at + 30_000 });
  t.is(turn.transcript.length, 2);
  t.is(turn.waiting_usage?.input_tokens, 5);
  t.is(w.store.runs.get(RUN)!.state, "busy");
  t.false(actor.hasActiveTurn, "no agent runs while the turn waits");
  t.true(actor.canMove, "its partition may move: the next owner restores the wait");
  t.is(w.turns.started.length, 1);
  t.deepEqual(w.events.types(RUN).filter((type) => type.startsWith("tool.")), ["tool.approval_requested"]);
  t.deepEqual(w.webhookEvents.map((e) => [e.type, e.eventKey]), [["turn.action_required", action.id]]);
});

test("run-actor - approvals: a store outage as the turn comes to wait retries the wait's writes: it waits with one request, not failed", async (t) => {
  const w = await world();
  w.store.addDeployment(AGENT, 1, { config: GATED as never });
  const actor = w.actor();
  okReply(await actor.command(startCmd()));
  w.store.failTurnWriteOnce = (id, set) => id === "turn_1" && set.actions !== undefined;
  w.store.failTurnWriteError = new StoreUnavailableError(new Error("connection refused"));
  const usage = { input_tokens: 5, output_tokens: 1, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: null };
  w.turns.last.finish({ outcome: "paused", transcript: asked() as never, usage, pause: { toolCallId: "call_1", tool: "bash", arguments: { command: "rm x" }, assistantIndex: 1, steers: [] } });
  for (let i = 0; i < 20 && w.store.failTurnWriteOnce !== undefined; i++) await new Promise((resolve) => setImmediate(resolve));
  t.true(w.store.failTurnWriteOnce === undefined, "the first write failed");
  await new Promise((resolve) => setImmediate(resolve));
  w.clock.advance(500); // the pause before the retry
  await settled(actor);
  const turn = w.store.turns.get("turn_1")!;
  t.is(turn.status, "in_progress");
  t.is(turn.actions?.length, 1);
  t.is(w.store.runs.get(RUN)!.pending_action?.id, turn.actions![0]!.id);
  t.deepEqual(w.events.types(RUN).filter((type) => type.startsWith("tool.") || type.startsWith("turn.")), ["turn.started", "tool.approval_requested"], "announced once, and not failed");
  t.deepEqual(w.webhookEvents.map((e) => e.type), ["turn.action_required"]);
});

test("run-actor - approvals: a turn whose transcript would have to be compacted to wait ends failed, not retryable, never left busy", async (t) => {
  const w = await world();
  w.store.addDeployment(AGENT, 1, { config: GATED as never });
  const actor = w.actor();
  okReply(await actor.command(startCmd()));
  const [user, assistant] = asked();
  const big = [{ ...user, content: [{ type: "text", text: "y".repeat(16 * 1024 * 1024) }] }, assistant];
  w.turns.last.finish({ outcome: "paused", transcript: big as never, pause: { toolCallId: "call_1", tool: "bash", arguments: { command: "rm x" }, assistantIndex: 1, steers: [] } });
  await settled(actor);
  const turn = w.store.turns.get("turn_1")!;
  t.is(turn.status, "failed");
  t.is(turn.error?.code, "agent_execution_failed");
  t.false(turn.error?.retryable);
  t.is(turn.actions, undefined);
  t.is(w.store.runs.get(RUN)!.state, "idle");
});

test("run-actor - approvals: a wait whose write fails otherwise (not a temporary failure) ends the turn failed, never left busy", async (t) => {
  const w = await world();
  w.store.addDeployment(AGENT, 1, { config: GATED as never });
  const actor = w.actor();
  okReply(await actor.command(startCmd()));
  w.store.failTurnWriteOnce = (id, set) => id === "turn_1" && set.actions !== undefined;
  w.turns.last.finish({ outcome: "paused", transcript: asked() as never, pause: { toolCallId: "call_1", tool: "bash", arguments: {}, assistantIndex: 1, steers: [] } });
  await settled(actor);
  const turn = w.store.turns.get("turn_1")!;
  t.is(turn.status, "failed");
  t.is(turn.error?.code, "platform_failure");
  t.is(w.store.runs.get(RUN)!.state, "idle");
});

test("run-actor - approvals: expiry by the clock applies on_timeout (deny) and resumes the agent from the call that asked, the denial for the model", async (t) => {
  const { w, actor, action } = await waitingWorld();
  w.clock.advance(29_000);
  await settled(actor);
  t.is(w.turns.started.length, 1, "not before expires_at");
  w.clock.advance(1_000);
  await settled(actor);
  await settled(actor);
  t.is(w.turns.started.length, 2, "the agent resumed");
  const resume = w.turns.last.request.resume!;
  t.like(resume, { assistantIndex: 1, toolCallId: "call_1", decision: "deny" });
  t.regex(resume.denial, /No decision within 30 s/);
  t.like(w.store.turns.get("turn_1")!.actions![0], { id: action.id, decision: "deny", decided_by: "timeout" });
});

test("run-actor - approvals: the turn's wall-clock limit ends a wait that outlasts it: incomplete turn_duration_limit, the call answered, the model calls before it counted", async (t) => {
  const w = await world();
  w.store.addDeployment(AGENT, 1, { config: { ...GATED, approval: { rules: [{ tool: "bash" }], timeout_s: 3600 } } as never });
  const actor = w.actor();
  okReply(await actor.command(startCmd()));
  const usage = { input_tokens: 5, output_tokens: 1, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: null };
  w.turns.last.finish({ outcome: "paused", transcript: asked() as never, usage, pause: { toolCallId: "call_1", tool: "bash", arguments: {}, assistantIndex: 1, steers: [] } });
  await settled(actor);
  w.clock.advance(60_000); // the fakes' turn limit
  await settled(actor);
  const turn = w.store.turns.get("turn_1")!;
  t.is(turn.status, "incomplete");
  t.is(turn.error?.code, "turn_duration_limit");
  t.is(turn.usage?.input_tokens, 5);
  const last = turn.transcript.at(-1) as { role: string; toolCallId: string; isError: boolean };
  t.like(last, { role: "toolResult", toolCallId: "call_1", isError: true });
  t.is(w.store.runs.get(RUN)!.state, "idle");
  t.is(w.turns.started.length, 1, "no agent ran for it again");
});

test("run-actor - approvals: a new owner restores the wait (nothing re-run) and a decision through it resumes the turn once; a resent decision is answered as the first", async (t) => {
  const { w, actor, action } = await waitingWorld();
  actor.stop("partition lost");
  // As if the owner died between storing the turn and marking the run.
  w.store.runs.get(RUN)!.pending_action = null;
  const second = w.actor(2);
  await second.recover();
  t.is(w.turns.started.length, 1, "restoring runs no agent");
  t.is(w.store.runs.get(RUN)!.pending_action?.id, action.id, "the new owner marks the run as waiting");
  t.is(w.store.turns.get("turn_1")!.status, "in_progress");
  const decide = { op: "decide", workspace_id: WS, run_id: RUN, action_id: action.id, decision: "approve", reason: null, decision_id: "dec-1" } as const;
  const reply = okReply(await second.command(decide));
  t.like(reply.action, { id: action.id, decision: "approve", decided_by: "person" });
  await settled(second);
  t.is(w.turns.started.length, 2);
  t.like(w.turns.last.request.resume, { decision: "approve", toolCallId: "call_1", assistantIndex: 1 });
  // The same request resent (its answer lost): answered as before, nothing resumed twice.
  t.like(okReply(await second.command(decide)).action, { id: action.id, decision: "approve" });
  t.is(w.turns.started.length, 2);
  // Another request: the decision stands.
  const other = await second.command({ ...decide, decision: "deny", decision_id: "dec-2" });
  t.like(other, { ok: false, code: "action_already_decided" });
});

test("run-actor - approvals: an owner lost while the approved call ran: the turn ends incomplete (worker_action_interrupted: the call may have acted), the call answered, the held steer and the usage before the wait kept", async (t) => {
  const { w, actor, action } = await waitingWorld();
  okReply(await actor.command({ op: "continue", workspace_id: WS, run_id: RUN, turn_id: "steer_1", input: [{ type: "input_text", text: "also" }], on_busy: "steer" }));
  okReply(await actor.command({ op: "decide", workspace_id: WS, run_id: RUN, action_id: action.id, decision: "approve", reason: null, decision_id: "d" }));
  await settled(actor);
  t.deepEqual(w.turns.last.request.resume?.steers, ["also"], "the held steer goes to the resumed agent");
  actor.stop("partition lost"); // the approved call was running
  const second = w.actor(2);
  await second.recover();
  const turn = w.store.turns.get("turn_1")!;
  t.is(turn.status, "incomplete");
  t.is(turn.error?.code, "worker_action_interrupted");
  t.false(turn.error?.retryable);
  t.is(turn.usage?.input_tokens, 5);
  const roles = (turn.transcript as Array<{ role: string }>).map((m) => m.role);
  t.deepEqual(roles, ["user", "assistant", "toolResult", "user"]);
  t.is(w.turns.started.length, 2, "the approved call is not run again");
});

test("run-actor - approvals: an owner lost after a denial resumed the turn, before the denied call's end was reported: the call never ran, so the turn ends worker_execution_interrupted", async (t) => {
  const { w, actor, action } = await waitingWorld();
  okReply(await actor.command({ op: "decide", workspace_id: WS, run_id: RUN, action_id: action.id, decision: "deny", reason: "no", decision_id: "d" }));
  await settled(actor);
  t.is(w.turns.started.length, 2, "resumed with the denial");
  actor.stop("partition lost");
  const second = w.actor(2);
  await second.recover();
  t.is(w.store.turns.get("turn_1")!.error?.code, "worker_execution_interrupted");
});

test("run-actor - approvals: a cancel that arrives between a decision and its resumption ends the turn cancelled; the approved call never runs", async (t) => {
  const { w, actor, action } = await waitingWorld();
  // Both in the mailbox before the decision's resumption is queued behind them.
  const [decided, cancelled] = await Promise.all([
    actor.command({ op: "decide", workspace_id: WS, run_id: RUN, action_id: action.id, decision: "approve", reason: null, decision_id: "d" }),
    actor.command({ op: "cancel", workspace_id: WS, run_id: RUN }),
  ]);
  t.true(decided.ok);
  t.like(cancelled, { ok: true, http_status: 200 });
  await settled(actor);
  t.is(w.store.turns.get("turn_1")!.status, "cancelled");
  t.is(w.turns.started.length, 1, "no agent resumed");
  const types = w.events.types(RUN);
  t.deepEqual(types.slice(types.indexOf("tool.approval_requested")), ["tool.approval_requested", "tool.approval_decided", "tool_execution_end", "turn.cancelled"]);
  t.is(w.store.runs.get(RUN)!.state, "idle");
});

test("run-actor - approvals: a decision its owner could not resume (drained, or died first) is resumed by the next owner, not interrupted", async (t) => {
  const { w, actor, action } = await waitingWorld();
  w.resources.node.draining = true;
  okReply(await actor.command({ op: "decide", workspace_id: WS, run_id: RUN, action_id: action.id, decision: "deny", reason: "no", decision_id: "d" }));
  await settled(actor);
  t.is(w.turns.started.length, 1, "a draining node leaves it for the next owner");
  t.like(w.store.turns.get("turn_1")!.actions![0], { decision: "deny", resumed_at: null });
  actor.stop("node stopped");
  w.resources.node.draining = false;
  const second = w.actor(2);
  await second.recover();
  await settled(second);
  t.is(w.turns.started.length, 2);
  t.like(w.turns.last.request.resume, { decision: "deny", toolCallId: "call_1", denial: "The call was denied by a person: no" });
  t.is(typeof w.store.turns.get("turn_1")!.actions![0]!.resumed_at, "number");
  t.is(w.store.turns.get("turn_1")!.status, "in_progress");
});
