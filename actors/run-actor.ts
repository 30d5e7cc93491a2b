import { runExpired, type ActionDoc, ApiError, decide, eventRunOf, isTransientFailure, READ_ONLY_TOOLS, hasUsage, renderAction, admissionOutcome, nextVersionFor, onVersion, cancelOutcome, cancelTarget, type CommandReply, Disposition, editTags, type EventAppender, FencedError, finalEventType, type InputPart, interruptedStatus, isFinalStatus, MAX_TAGS, renderRun, type RunCommand, type RunDoc, type RunEvent, RunState, Subjects, type TurnDoc, turnError, TurnStatus } from "../src/index.js";
import { SteeringTargetEndedError } from "./agent-runner.js";
import { inputText } from "./turn-input.js";
import { PARTS_CHECK_AFTER_MS, removeRunParts } from "./run-removal.js";
import { TurnExecution, waitingTranscript } from "./turn-execution.js";
import type { ActorResources } from "./actor-resources.js";

export type { ActorResources } from "./actor-resources.js";





type OkReply = Omit<Extract<CommandReply, { ok: true }>, "ok">;
const ok = (reply: OkReply): CommandReply => ({ ok: true, ...reply });
const fail = (code: Extract<CommandReply, { code: string }>["code"], message?: string, param?: string): CommandReply => ({
  ok: false,
  code,
  message,
  param: param ?? null,
});

/** How much of an interrupted turn's event log a new owner reads for a call left running (pages of 1,000; time). */
const ACTION_SCAN_PAGES = 500;
const ACTION_SCAN_MS = 15_000;
/** How far nodes' clocks may be apart (a turn's creation time against its events' stored times). */
const CLOCK_SKEW_MS = 5 * 60_000;
/** How many of a run's latest turns a resent steer or cancel is looked for in. */
const RETRY_LOOKBACK_TURNS = 64;
/** The cancel requests a turn keeps the ids of. */
const MAX_CANCEL_IDS = 16;

/**
 * The single owner of one run on this node. Commands and internal events go through
 * one mailbox, so every change to the run and its turns is serialized here, and
 * every store write is fenced by the partition epoch.
 */
export class RunActor {
  /** The node's resources; once the run is known, with a logger that names its workspace. */
  private r: ActorResources;
  private mailbox: Promise<unknown> = Promise.resolve();
  private run: RunDoc | null = null;
  /**
   * A queued turn's admission whose run write failed (the store away for a moment): the turn
   * may be stored without the run naming it. Settled before the next command (see
   * {@link settleUnadmitted}).
   */
  private queuedAdmissionInDoubt = false;
  private appender: EventAppender | undefined;
  private stopped = false;
  /** Stopped because a finished turn could not be stored: the host recovers the run. */
  private unsettled = false;
  /** Commands in the mailbox: a run being admitted is not idle even before its turn starts. */
  private pendingCommands = 0;
  /** The executing turn, the session, and how a finished turn is stored (actors/turn-execution.ts). */
  private readonly turns: TurnExecution;
  lastUsedMs: number;

  constructor(
    readonly runId: string,
    readonly partition: number,
    readonly epoch: number,
    private readonly resources: ActorResources,
  ) {
    this.r = resources;
    this.lastUsedMs = resources.clock.nowMs();
    // What the turn's execution may see and do of this actor (same mailbox, same state).
    const actor = this;
    this.turns = new TurnExecution({
      get r() {
        return actor.r;
      },
      runId,
      epoch,
      get stopped() {
        return actor.stopped;
      },
      get run() {
        return actor.run;
      },
      emit: (turnId, source, type, data) => this.emit(turnId, source, type, data),
      appender: () => this.appender!,
      resumeEvents: () => this.resumeEvents(),
      enqueue: (work) => this.enqueue(work),
      stop: (reason) => this.stop(reason),
      markUnsettled: () => {
        this.unsettled = true;
      },
      settleAdmission: async (run) => {
        if (this.queuedAdmissionInDoubt) await this.settleUnadmitted(run, { reread: true });
      },
    });
  }

  /** Holds the run's document; log lines about it carry its workspace from now on. */
  private hold(run: RunDoc): void {
    this.run = run;
    if (this.r === this.resources) this.r = { ...this.resources, log: this.resources.log.child({ workspace_id: run.workspace_id }) };
  }

  get isIdle(): boolean {
    return this.pendingCommands === 0 && this.turns.active === undefined && (this.run === null || this.run.state === RunState.idle);
  }

  /**
   * Whether the run's partition may move to another node now: nothing runs or is being
   * admitted here. A turn waiting for a decision moves (its next owner restores the wait).
   */
  get canMove(): boolean {
    return this.isIdle || (this.pendingCommands === 0 && this.turns.active === undefined && this.turns.waiting !== undefined && this.turns.settledForMove);
  }

  /** Whether this actor has loaded (and so claimed) its run. */
  get holdsRun(): boolean {
    return this.run !== null && !this.stopped;
  }

  /** Whether the run has a turn queued behind its active one. */
  get hasQueuedTurn(): boolean {
    return !this.stopped && this.run !== null && this.run.queued_turn_id !== null;
  }

  /** Whether a turn whose agent ended is being finished here (its checkpoint and final writes, or their retries). */
  get isFinishingTurn(): boolean {
    return this.turns.isFinishing && !this.stopped;
  }

  /** Whether an agent is executing a turn of this run on this node now. */
  get hasActiveTurn(): boolean {
    return this.turns.active !== undefined && !this.stopped;
  }

  get isStopped(): boolean {
    return this.stopped;
  }

  /** Stopped with a finished turn it could not store: the run needs recovering. */
  get isUnsettled(): boolean {
    return this.unsettled;
  }

  /** Runs `work` after everything already in the mailbox. */
  private enqueue<T>(work: () => Promise<T>): Promise<T> {
    const next = this.mailbox.then(work);
    this.mailbox = next.catch(() => undefined);
    return next;
  }

  command(cmd: RunCommand): Promise<CommandReply> {
    this.lastUsedMs = this.r.clock.nowMs();
    this.pendingCommands++;
    return this.enqueue(async () => {
      if (this.stopped) return { ok: false, not_owner: true } as const;
      try {
        return await this.handle(cmd);
      } catch (err) {
        if (err instanceof FencedError) {
          this.stop("fenced");
          return { ok: false, not_owner: true } as const;
        }
        throw err;
      } finally {
        this.pendingCommands--;
      }
    });
  }

  /** Loads the run under this actor's epoch and finishes what a previous owner left. */
  recover(): Promise<void> {
    return this.guarded(async () => {
      await this.activate();
    });
  }

  /** Deletes the run's data once its retention ran out (sweeper); whether it did. */
  expire(): Promise<boolean> {
    let removed = false;
    return this.guarded(async () => {
      const now = this.r.clock.nowMs();
      const expired = (run: RunDoc) => runExpired(run, now, this.r.config.turnLimitMs);
      let run = this.run;
      if (!run) {
        // Read, not activated: activating a busy run past its grace would recover its lost
        // turn first (what may keep failing), only for the run to be removed.
        const stored = await this.r.store.getRun(this.runId);
        if (!stored || !expired(stored)) return;
        run = await this.r.store.claimRun(this.runId, this.epoch);
        if (!run) throw new FencedError(this.runId);
        // Moved on meanwhile (a stale owner's late write): not held, so the next command
        // or recovery activates it whole (its events opened, a lost turn recovered).
        if (!expired(run)) return;
        this.hold(run);
      }
      if (!expired(run)) return;
      // Busy past the turn limit too (runExpired): nothing of it is left to go on.
      if (this.turns.active) {
        this.turns.active.abortReason = "shutdown";
        this.turns.active.running.abort();
        this.turns.active = undefined;
      }
      this.turns.waiting?.timer.cancel();
      this.turns.waiting = undefined;
      // The sweeper expires runs one after another, each removed whole.
      await (await this.removeRun(run, "expired")).parts;
      removed = true;
    }).then(() => removed);
  }

  private guarded(work: () => Promise<void>): Promise<void> {
    return this.enqueue(async () => {
      if (this.stopped) return;
      try {
        await work();
      } catch (err) {
        if (err instanceof FencedError) this.stop("fenced");
        else throw err;
      }
    });
  }

  /**
   * Stops the actor without further writes (its partition is gone). A running agent
   * is aborted; the next owner marks the turn interrupted.
   */
  stop(reason: string): void {
    if (this.stopped) return;
    this.stopped = true;
    this.turns.turnEnded();
    this.turns.waiting?.timer.cancel();
    if (this.turns.active) {
      this.turns.active.abortReason = "shutdown";
      this.turns.active.limitTimer.cancel();
      this.turns.active.running.abort();
    }
    this.r.log.info({ run_id: this.runId, reason }, "run actor stopped");
  }

  /**
   * Graceful shutdown: ends the active turn as interrupted (incomplete,
   * worker_execution_interrupted, or worker_action_interrupted when stopped in a tool call
   * that acts) with its partial output, and resolves once stored.
   */
  async interrupt(): Promise<void> {
    const execution = this.turns.active;
    if (!execution || this.stopped) return;
    if (!execution.abortReason) execution.abortReason = "shutdown";
    execution.running.abort();
    await execution.running.result;
    await this.enqueue(async () => undefined);
  }

  private async handle(cmd: RunCommand): Promise<CommandReply> {
    if (cmd.op === "start") return this.start(cmd);
    const run = await this.activate();
    // The body names the run of a continuation; the path names it for the other commands.
    if (!run || run.workspace_id !== cmd.workspace_id) return fail("run_not_found", undefined, cmd.op === "continue" ? "run_id" : "runId");
    if (this.queuedAdmissionInDoubt) await this.settleUnadmitted(run, { reread: true });
    // An event write failed while nothing executed (a command's own event): nothing to
    // account it to, and the next command must not fail on it for as long as the actor lives.
    if (this.appender?.failure && !this.turns.active && !this.turns.waiting) {
      await this.appender.flush().catch(() => undefined);
      this.resumeEvents();
    }
    if (runExpired(run, this.r.clock.nowMs(), this.r.config.turnLimitMs)) return fail("run_expired");
    switch (cmd.op) {
      case "continue":
        return this.continueRun(run, cmd);
      case "cancel":
        return this.cancel(run, cmd);
      case "delete":
        return this.deleteRun(run);
      case "tags":
        return this.editTags(run, cmd.add, cmd.remove);
      case "decide":
        return this.decideAction(run, cmd);
    }
  }

  /** Loads the run (once) and claims it for this epoch; recovers interrupted work. */
  private async activate(): Promise<RunDoc | null> {
    if (this.run) return this.run;
    const run = await this.r.store.claimRun(this.runId, this.epoch);
    if (!run) {
      const existing = await this.r.store.getRun(this.runId);
      if (existing) throw new FencedError(this.runId);
      return null;
    }
    this.hold(run);
    try {
      await this.openEvents(run);
      // Before the active turn's recovery, which may start the queued turn.
      await this.settleUnadmitted(run, { reread: false });
      if (run.state === RunState.busy && !this.turns.active) await this.recoverActiveTurn(run, run.active_turn_id);
    } catch (err) {
      // Not held half-recovered: the next command (or the orphan check) activates it again.
      this.release();
      throw err;
    }
    return this.run;
  }

  /** Continues the run's event numbering after whatever is stored (also after a failover). */
  private async openEvents(run: RunDoc): Promise<void> {
    const stored = await this.r.events.lastSequence({ id: run._id, plan: run.plan });
    const turnFirstSeqs: Record<string, number> = {};
    for (const id of [run.active_turn_id, run.queued_turn_id]) {
      if (!id) continue;
      const turn = await this.r.store.getTurn(id);
      if (turn?.first_event_seq) turnFirstSeqs[id] = turn.first_event_seq;
    }
    this.appender = this.r.events.appender({ id: run._id, workspace_id: run.workspace_id, plan: run.plan }, Math.max(stored, run.event_seq) + 1, {
      turnFirstSeqs,
      onStored: (event) => this.r.nc.publish(Subjects.live(run.workspace_id, run._id), JSON.stringify(event)),
      gate: () => this.r.writeGate?.(this.partition),
    });
  }

  /** Lets the run's events be stored again after a failed write (see {@link EventAppender.resume}). */
  private resumeEvents(): void {
    const failure = this.appender?.failure;
    if (!failure) return;
    this.r.log.warn(
      { run_id: this.runId, lost_from: failure.sequence, next_sequence: this.appender!.nextSequence },
      "event stream resumed after a failed write: events numbered from lost_from to below next_sequence may be missing from the run's history",
    );
    this.appender!.resume();
  }

  /** Appends an event; returns its run sequence. */
  private emit(turnId: string | null, source: "runtime" | "platform", type: string, data: unknown): number {
    return this.appender!.append(turnId, source, type, data, this.r.clock.nowMs());
  }

  private async recoverActiveTurn(run: RunDoc, turnId: string | null): Promise<void> {
    const turn = turnId ? await this.r.store.getTurn(turnId) : null;
    // Waiting for a person: the wait goes on here, from the stored transcript.
    if (turn && (await this.turns.restoreWaiting(run, turn))) return;
    const now = this.r.clock.nowMs();
    const status = turn ? interruptedStatus(turn.status) : undefined;
    if (turn && isFinalStatus(turn.status)) {
      // Stored final, the run not moved on (its owner died between the writes): the move-on
      // is finished here, webhooks and usage included. Whether the final event went out
      // before the crash is not known: it is not emitted again (issue 17 counts such gaps).
      await this.turns.afterTurn(run, turn, now, { emitFinal: false });
      return;
    }
    if (turn && status) {
      const code = (await this.actionWasRunning(run, turn)) ? "worker_action_interrupted" : "worker_execution_interrupted";
      const error = status === TurnStatus.incomplete ? turnError(code, { reference: this.r.ids.reference() }) : null;
      const final: Partial<TurnDoc> = { status, error, completed_at: now, duration_ms: turn.started_at ? now - turn.started_at : 0 };
      // A turn that waited stored what it added then (and the input it held); a call it was
      // deciding never answered; its model calls before the wait were made.
      if (turn.actions?.length) {
        final.transcript = waitingTranscript(turn, "The turn was interrupted before this call's result was stored.", now);
        if (turn.waiting_usage) {
          final.usage = turn.waiting_usage;
          // The ledger too (keyed by the turn: a repeat is the same record).
          if (hasUsage(turn.waiting_usage)) {
            await this.r.usage.record({ _id: turn._id, workspace_id: run.workspace_id, run_id: run._id, agent_id: run.agent_id, agent_version: turn.agent_version, model: turn.waiting_model ?? "unknown", at: now, ...turn.waiting_usage });
          }
        }
      }
      await this.r.store.updateTurnFenced(turn._id, this.epoch, final);
      this.r.log.warn({ run_id: run._id, turn_id: turn._id, status }, "turn interrupted by a lost owner");
      await this.turns.afterTurn(run, { ...turn, ...final }, now);
      return;
    }
    await this.turns.afterTurn(run, null, now);
  }

  /**
   * An admission's insert or run write failed: the turn may be stored without the run
   * naming it (a write that timed out may have landed). Never left so: an idle run is let
   * go and activated again from the store ({@link settleUnadmitted} there); a busy one
   * (a queued turn's admission) checks before its next command.
   */
  private admissionInDoubt(err: unknown, queue: boolean): void {
    if (err instanceof FencedError) return;
    if (queue) this.queuedAdmissionInDoubt = true;
    else this.release();
  }

  /** Lets the run go unrecovered: the next command (or the orphan check) activates it again from the store. */
  private release(): void {
    this.run = null;
    this.appender = undefined;
    this.turns.waiting?.timer.cancel();
    this.turns.waiting = undefined;
  }

  /**
   * A turn stored past the run's count was admitted half: its owner died, or the store
   * failed, between the turn's insert and the run's write. The run never named it, and a
   * new turn would take its index (409 "The turn id is taken" for good; a retry answered
   * with a turn in progress that nothing runs). Nothing of it ran: it fails
   * `runtime_dispatch_failed` (retryable: send it again), and the run counts it. With
   * `reread`, the run is read again first: a write that seemed to fail may have landed.
   */
  private async settleUnadmitted(run: RunDoc, options: { reread: boolean }): Promise<void> {
    if (options.reread) {
      const stored = await this.r.store.getRun(run._id);
      if (stored && stored.turn_count > run.turn_count) {
        // The queued turn's write landed: the run names it, as the active turn's end will.
        Object.assign(run, { turn_count: stored.turn_count, latest_turn_id: stored.latest_turn_id, queued_turn_id: stored.queued_turn_id, event_seq: Math.max(run.event_seq, stored.event_seq) });
      }
    }
    const unadmitted = await this.r.store.listTurns(run._id, { afterIndex: run.turn_count - 1 });
    if (unadmitted.length === 0) {
      this.queuedAdmissionInDoubt = false;
      return;
    }
    const now = this.r.clock.nowMs();
    const last = unadmitted[unadmitted.length - 1]!;
    const counted: Partial<RunDoc> = { turn_count: last.index + 1, latest_turn_id: last._id };
    const settledNow: Array<{ turnId: string; view: ReturnType<typeof renderRun> }> = [];
    for (const turn of unadmitted) {
      // One found final was settled by an attempt that stopped before the run's write (a
      // failed webhook record, a crash): its final event is not emitted again, as for any
      // turn a new owner finds final (recoverActiveTurn); its webhooks (once per turn) and
      // notice still go.
      let final = turn;
      if (!isFinalStatus(turn.status)) {
        const set: Partial<TurnDoc> = { status: TurnStatus.failed, output: [], error: turnError("runtime_dispatch_failed", { reference: this.r.ids.reference() }), completed_at: now, duration_ms: 0 };
        await this.r.store.updateTurnFenced(turn._id, this.epoch, set);
        final = { ...turn, ...set };
      }
      // As any final turn's: its final event, webhooks and notice carry the run as this
      // settlement leaves it (counting the turn), and the webhooks are recorded before it.
      const view = renderRun({ ...run, ...counted }, final);
      if (final !== turn) this.emit(turn._id, "platform", finalEventType(TurnStatus.failed), { run: view });
      await this.turns.recordWebhooks(run, final, view);
      settledNow.push({ turnId: turn._id, view });
      if (final !== turn) this.r.log.warn({ run_id: run._id, turn_id: turn._id }, "a turn admitted half (its run never named it) failed: nothing of it ran");
    }
    await this.appender!.flush().catch((err: unknown) => this.r.log.warn({ err, run_id: run._id }, "event stream write failed"));
    const set: Partial<RunDoc> = { ...counted, event_seq: this.appender!.nextSequence - 1 };
    await this.r.store.updateRunFenced(run._id, this.epoch, set);
    Object.assign(run, set);
    // Those waiting for it (a retry's long poll) hear it now, not at their timeout.
    for (const { turnId, view } of settledNow) this.turns.publishFinal(turnId, view);
    // Only now: a settlement that failed part way is tried again before the next command.
    this.queuedAdmissionInDoubt = false;
  }

  // ---- admission ----------------------------------------------------------------

  private async start(cmd: Extract<RunCommand, { op: "start" }>): Promise<CommandReply> {
    // A resent start (same ids) finds its run: in memory, or in the store (not looked
    // for on a fresh start: its insert below finds an earlier attempt's run instead).
    const existing = this.run ?? (cmd.fresh ? null : await this.r.store.getRun(this.runId));
    if (existing) {
      await this.activate();
      if (existing.workspace_id !== cmd.workspace_id) return fail("run_not_found");
      return ok({ run_id: existing._id, turn_id: cmd.turn_id, disposition: Disposition.created });
    }
    // A start re-driven with its key's ids (the record was left pending) after its run was
    // deleted or expired: the run is not made again. Its ids are answered without the run,
    // so the request reads it as any later one would (404, or 410 for an expired run), and
    // the key stays bound to that run (a refusal would free it to start another).
    if (!cmd.fresh && (await this.r.store.getTombstone(this.runId))) {
      this.r.log.info({ run_id: this.runId }, "a start re-driven after its run was removed: not made again");
      return ok({ run_id: cmd.run_id, turn_id: cmd.turn_id, disposition: Disposition.created });
    }
    const now = this.r.clock.nowMs();
    const retentionS = this.r.config.retention.runS[cmd.plan];
    const run: RunDoc = {
      _id: cmd.run_id,
      workspace_id: cmd.workspace_id,
      agent_id: cmd.agent_id,
      agent_version: cmd.version,
      versions: [cmd.version],
      partition: this.partition,
      state: RunState.busy,
      tags: [...cmd.tags].sort(),
      plan: cmd.plan,
      retention_s: retentionS,
      event_retention_s: this.r.config.retention.eventS[cmd.plan],
      created_at: now,
      last_activity_at: now,
      expires_at: now + retentionS * 1000,
      epoch: this.epoch,
      turn_count: 1,
      latest_turn_id: cmd.turn_id,
      active_turn_id: cmd.turn_id,
      queued_turn_id: null,
      event_seq: 0,
    };
    // A fresh start's events begin at 1. A resent one may follow an attempt that stored
    // its first events and died before the documents: those events are this start's,
    // kept and not repeated (no second run.created or turn.started).
    const stored = cmd.fresh ? 0 : await this.r.events.lastSequence({ id: run._id, plan: run.plan });
    const earlier = stored > 0 ? await this.earlierStartEvents(run, stored) : [];
    this.appender = this.r.events.appender({ id: run._id, workspace_id: run.workspace_id, plan: run.plan }, stored + 1, {
      onStored: (event) => this.r.nc.publish(Subjects.live(run.workspace_id, run._id), JSON.stringify(event)),
      gate: () => this.r.writeGate?.(this.partition),
    });
    if (!earlier.some((event) => event.type === "run.created")) {
      this.emit(null, "platform", "run.created", { agent_id: run.agent_id, agent_version: run.agent_version, tags: run.tags });
    }
    const firstSeq =
      earlier.find((event) => event.type === "turn.started" && event.turn_id === cmd.turn_id)?.sequence ??
      this.emit(cmd.turn_id, "platform", "turn.started", { agent_version: cmd.version });
    if (earlier.length) this.r.log.info({ run_id: run._id, events: earlier.length }, "start resent after an attempt that stored only its first events: kept them");
    const turn = this.newTurn(run, cmd.turn_id, 0, TurnStatus.in_progress, cmd.version, cmd.input, now, firstSeq, Disposition.created);
    // Events first: a turn is announced only once its first event is recorded (rule 9).
    await this.appender.flush();
    run.event_seq = this.appender.nextSequence - 1;
    // The turn next: a run never points at a turn that is not stored.
    await this.r.store.insertTurnOnce(turn);
    if (this.r.at) await this.r.at("start:turn_stored", { runId: run._id, turnId: turn._id });
    if (!(await this.r.store.insertRunOnce(run))) {
      // An earlier attempt of this start (its reply lost, the partition moved here since)
      // admitted the run meanwhile, on the node that owned the partition then. This node
      // owns it now: claim the run, which recovers a turn the stale owner left behind.
      this.r.log.info({ run_id: run._id }, "start already admitted by an earlier attempt");
      this.appender = undefined;
      await this.activate();
      return ok({ run_id: run._id, turn_id: cmd.turn_id, disposition: Disposition.created });
    }
    this.hold(run);
    this.turns.session = [];
    await this.turns.execute(run, turn);
    return ok({ run_id: run._id, turn_id: turn._id, disposition: Disposition.created, run: renderRun(run, turn, Disposition.created) });
  }

  /**
   * Whether the turn's stored events show a call of a tool that acts (not a read-only one)
   * started and never ended: its owner was lost during an action that may have completed (a
   * call's start is stored before it runs). A call the turn waited on and a person denied
   * never ran: its start, the one before the request for that decision, does not count.
   * Only the turn's own events are read (from its creation, less clock skew). When they
   * cannot be read to their end (past the bounds, or gone): yes, a client must not retry
   * blind what may have acted. A transient failure is thrown: recovery is tried again.
   */
  private async actionWasRunning(run: RunDoc, turn: TurnDoc): Promise<boolean> {
    if (turn.status !== TurnStatus.in_progress) return false;
    const denied = new Set((turn.actions ?? []).filter((action) => action.decision === "deny").map((action) => action.id));
    const open = new Set<string>();
    const ref = eventRunOf(run);
    const since = { ms: turn.created_at - CLOCK_SKEW_MS, fromSequence: turn.first_event_seq || 1 };
    const deadline = this.r.clock.nowMs() + ACTION_SCAN_MS;
    let afterId: string | undefined;
    try {
      for (let page = 0; page < ACTION_SCAN_PAGES; page++) {
        let read = await this.r.events.read(ref, { turnId: turn._id, afterId, since, releaseHeld: true, limit: 1000, nowMs: this.r.clock.nowMs() });
        if (page === 0 && turn.first_event_seq > 0 && (read.events[0]?.sequence ?? Infinity) > turn.first_event_seq) {
          // The read began past the turn's first event (this node's clock ahead of the event
          // log's by more than the skew allowed, or that event lost): read from the run's first.
          read = await this.r.events.read(ref, { turnId: turn._id, releaseHeld: true, limit: 1000, nowMs: this.r.clock.nowMs() });
        }
        for (const event of read.events) {
          const data = (event.data ?? {}) as { toolCallId?: unknown; toolName?: unknown; tool_call_id?: unknown; action_id?: unknown };
          if (event.type === "tool_execution_start" && typeof data.toolCallId === "string" && !READ_ONLY_TOOLS.has(String(data.toolName))) open.add(data.toolCallId);
          else if (event.type === "tool_execution_end" && typeof data.toolCallId === "string") open.delete(data.toolCallId);
          else if (event.type === "tool.approval_requested" && typeof data.tool_call_id === "string" && denied.has(String(data.action_id))) open.delete(data.tool_call_id);
        }
        if (!read.hasMore) return open.size > 0;
        if (read.events.length === 0 || this.r.clock.nowMs() > deadline) break;
        afterId = read.events.at(-1)!.id;
      }
      this.r.log.warn({ run_id: run._id, turn_id: turn._id }, "the interrupted turn's events could not be read to their end: taken as interrupted during an action");
    } catch (err) {
      // The event log's 503 wraps what failed; one without a cause is its own verdict (history lost).
      const cause = err instanceof ApiError ? (err as { cause?: unknown }).cause : err;
      if (cause !== undefined && isTransientFailure(cause)) throw err;
      this.r.log.warn({ err, run_id: run._id, turn_id: turn._id }, "the interrupted turn's events could not be read: taken as interrupted during an action");
    }
    return true;
  }

  /** The events an earlier attempt of this start stored (a start stores at most two before its documents). */
  private async earlierStartEvents(run: RunDoc, stored: number): Promise<RunEvent[]> {
    const ref = { ...eventRunOf(run), event_seq: stored };
    return (await this.r.events.read(ref, { limit: 10, nowMs: this.r.clock.nowMs() })).events;
  }

  private newTurn(
    run: RunDoc,
    id: string,
    index: number,
    status: TurnStatus,
    version: number,
    input: InputPart[],
    now: number,
    firstEventSeq: number,
    disposition: Disposition,
  ): TurnDoc {
    const started = status === TurnStatus.in_progress;
    return {
      _id: id,
      run_id: run._id,
      workspace_id: run.workspace_id,
      index,
      status,
      agent_version: version,
      input,
      output: [],
      error: null,
      created_at: now,
      started_at: started ? now : null,
      completed_at: null,
      duration_ms: null,
      transcript: [],
      disposition,
      steer_ids: [],
      first_event_seq: firstEventSeq,
      epoch: this.epoch,
    };
  }

  /** The turn steering input goes to: the executing one, or the one waiting for a decision. */
  private get current(): TurnDoc | undefined {
    return this.turns.active?.turn ?? this.turns.waiting?.turn;
  }

  private async continueRun(run: RunDoc, cmd: Extract<RunCommand, { op: "continue" }>): Promise<CommandReply> {
    const current = this.current;
    if (current?.steer_ids.includes(cmd.turn_id)) {
      return ok({ run_id: run._id, turn_id: current._id, disposition: Disposition.steered });
    }
    // A resent continuation names a turn this actor admitted already (the latest or queued
    // one; after a lost answer, any earlier one too): answer as before.
    if (cmd.resent || cmd.turn_id === run.latest_turn_id || cmd.turn_id === run.queued_turn_id) {
      const replay = await this.replayContinue(run, cmd.turn_id);
      if (replay) return replay;
    }
    // Or a steer a turn took that has ended since: answered as then, not run as a new turn.
    if (cmd.resent) {
      const steered = await this.steeredBefore(run, cmd.turn_id);
      if (steered) return ok({ run_id: run._id, turn_id: steered, disposition: Disposition.steered });
    }
    const outcome = admissionOutcome({
      state: run.state,
      hasQueued: run.queued_turn_id !== null,
      onBusy: cmd.on_busy,
      activeStatus: this.turns.active && !this.turns.active.abortReason ? this.turns.active.turn.status : this.turns.waiting?.turn.status,
    });
    switch (outcome) {
      case "busy":
        return fail("run_busy", run.queued_turn_id && cmd.on_busy === "queue" ? "The run already has a queued turn." : "The run is busy.");
      case "steer_target_ended":
        return fail("steering_target_ended");
      case "steer":
        return this.steer(run, cmd.turn_id, cmd.input);
      case "start":
      case "queue":
        return this.admitTurn(run, cmd.turn_id, cmd.input, outcome === "queue");
    }
  }

  /** The turn that took steer `steerId` (see {@link recentTurn}). */
  private async steeredBefore(run: RunDoc, steerId: string): Promise<string | undefined> {
    return (await this.recentTurn(run, (turn) => turn.steer_ids.includes(steerId)))?._id;
  }

  /**
   * The latest of the run's recent turns that `match`es, for a retry that comes seconds
   * after its first attempt (bounded to the latest turns, read without transcripts).
   */
  private async recentTurn(run: RunDoc, match: (turn: TurnDoc) => boolean): Promise<TurnDoc | undefined> {
    const recent = await this.r.store.listTurns(run._id, { afterIndex: Math.max(-1, run.turn_count - 1 - RETRY_LOOKBACK_TURNS) });
    return [...recent].reverse().find(match);
  }

  /** A resent continuation (same ids) answers as the first did. */
  private async replayContinue(run: RunDoc, id: string): Promise<CommandReply | undefined> {
    const known = await this.r.store.getTurn(id);
    if (known && known.run_id === run._id) {
      return ok({ run_id: run._id, turn_id: known._id, disposition: known.disposition });
    }
    const current = this.current;
    if (current?.steer_ids.includes(id)) return ok({ run_id: run._id, turn_id: current._id, disposition: Disposition.steered });
    return undefined;
  }

  private async admitTurn(run: RunDoc, turnId: string, input: InputPart[], queue: boolean): Promise<CommandReply> {
    const now = this.r.clock.nowMs();
    const version = await nextVersionFor(this.r.store, this.r.deployments, run);
    const status = queue ? TurnStatus.queued : TurnStatus.in_progress;
    const firstSeq = this.emit(turnId, "platform", queue ? "turn.queued" : "turn.started", { agent_version: version });
    const turn = this.newTurn(run, turnId, run.turn_count, status, version, input, now, firstSeq, queue ? Disposition.queued : Disposition.continued);
    await this.appender!.flush();
    let inserted: boolean;
    try {
      inserted = await this.r.store.insertTurnOnce(turn);
    } catch (err) {
      // An insert that timed out may have landed all the same.
      this.admissionInDoubt(err, queue);
      throw err;
    }
    if (!inserted) {
      // Admitted before (a resent command after a lost reply): answer as then.
      const replay = await this.replayContinue(run, turnId);
      if (replay) return replay;
      // Another turn holds the index (a stale owner's late insert): activated again from the
      // store, the next attempt finds and settles it.
      if (!this.turns.active && !this.turns.waiting) this.release();
      return fail("conflict", "The turn id is taken.");
    }
    const set: Partial<RunDoc> = {
      turn_count: run.turn_count + 1,
      latest_turn_id: turn._id,
      last_activity_at: now,
      expires_at: now + run.retention_s * 1000,
      event_seq: this.appender!.nextSequence - 1,
    };
    // The run is on a version once a turn starts on it (a queued turn's may never: the
    // summary and the version filter show the version the workspace is on).
    if (queue) set.queued_turn_id = turn._id;
    else Object.assign(set, { state: RunState.busy, active_turn_id: turn._id }, onVersion(run, version));
    try {
      await this.r.store.updateRunFenced(run._id, this.epoch, set);
    } catch (err) {
      this.admissionInDoubt(err, queue);
      throw err;
    }
    Object.assign(run, set);
    if (!queue) await this.turns.execute(run, turn);
    const disposition = queue ? Disposition.queued : Disposition.continued;
    return ok({ run_id: run._id, turn_id: turn._id, disposition, run: renderRun(run, turn, disposition) });
  }

  private async steer(run: RunDoc, steerId: string, input: InputPart[]): Promise<CommandReply> {
    if (!this.turns.active && this.turns.waiting) {
      // Kept with the waiting turn (durably) and delivered once the decision lets it go on.
      const turn = await this.turns.steerWaiting(steerId, inputText(input));
      if (!turn) return fail("run_busy", "The turn waits for a decision and holds as much steering input as it takes; send it after the decision.");
      this.emit(turn._id, "platform", "turn.steered", { input });
      const now = this.r.clock.nowMs();
      const set = { last_activity_at: now, expires_at: now + run.retention_s * 1000 };
      await this.r.store.updateRunFenced(run._id, this.epoch, set);
      Object.assign(run, set);
      return ok({ run_id: run._id, turn_id: turn._id, disposition: Disposition.steered, run: renderRun(run, turn, Disposition.steered) });
    }
    const active = this.turns.active!;
    try {
      active.running.steer(inputText(input));
    } catch (err) {
      if (err instanceof SteeringTargetEndedError) return fail("steering_target_ended");
      throw err;
    }
    const now = this.r.clock.nowMs();
    active.turn.steer_ids.push(steerId);
    this.emit(active.turn._id, "platform", "turn.steered", { input });
    await this.r.store.updateTurnFenced(active.turn._id, this.epoch, { steer_ids: active.turn.steer_ids });
    const set = { last_activity_at: now, expires_at: now + run.retention_s * 1000 };
    await this.r.store.updateRunFenced(run._id, this.epoch, set);
    Object.assign(run, set);
    return ok({ run_id: run._id, turn_id: active.turn._id, disposition: Disposition.steered, run: renderRun(run, active.turn, Disposition.steered) });
  }

  // ---- cancellation, deletion, tags ------------------------------------------------

  private async cancel(run: RunDoc, cmd: Extract<RunCommand, { op: "cancel" }>): Promise<CommandReply> {
    const cancelId = cmd.cancel_id;
    // A retry after a lost answer: the turn the first attempt changed, as it is now.
    if (cmd.resent && cancelId) {
      const earlier = await this.recentTurn(run, (turn) => turn.cancel_ids?.includes(cancelId) === true);
      if (earlier) return ok({ run_id: run._id, turn_id: earlier._id, http_status: isFinalStatus(earlier.status) ? 200 : 202 });
    }
    const turn = await this.cancelTargetOf(run, cmd.turn_id, cmd.resent?.before_index);
    if (!turn || turn.run_id !== run._id) return fail("turn_not_found", undefined, "turn_id");
    const outcome = cancelOutcome(turn.status);
    const now = this.r.clock.nowMs();
    // Kept with the turn it selects while that turn is not final (a repeat finds it there); a
    // final one is found again by its place among the run's turns (see cancelTargetOf).
    const cancelIds = cancelId ? { cancel_ids: [...(turn.cancel_ids ?? []), cancelId].slice(-MAX_CANCEL_IDS) } : {};
    if (outcome.to === TurnStatus.cancelled) {
      // A queued turn: cancelled at once.
      await this.r.store.updateTurnFenced(turn._id, this.epoch, { status: TurnStatus.cancelled, completed_at: now, duration_ms: 0, ...cancelIds });
      await this.r.store.updateRunFenced(run._id, this.epoch, { queued_turn_id: null });
      run.queued_turn_id = null;
      const view = renderRun(run, { ...turn, status: TurnStatus.cancelled, completed_at: now, duration_ms: 0 });
      this.emit(turn._id, "platform", finalEventType(TurnStatus.cancelled), { run: view });
      this.turns.publishFinal(turn._id, view);
    } else if (outcome.to === TurnStatus.cancelling && this.turns.waiting?.turn._id === turn._id) {
      // Nothing runs for a turn waiting for a decision: it is cancelled at once.
      if (cancelId) await this.r.store.updateTurnFenced(turn._id, this.epoch, cancelIds);
      await this.turns.endWaiting(TurnStatus.cancelled, null, "The call did not run: the turn was cancelled.");
      return ok({ run_id: run._id, turn_id: turn._id, http_status: 200 });
    } else if (outcome.to === TurnStatus.cancelling) {
      await this.r.store.updateTurnFenced(turn._id, this.epoch, { status: TurnStatus.cancelling, ...cancelIds });
      this.emit(turn._id, "platform", "turn.cancelling", {});
      if (this.turns.active?.turn._id === turn._id) {
        this.turns.active.turn.status = TurnStatus.cancelling;
        this.turns.active.abortReason = "cancel";
        this.turns.active.running.abort();
      }
    } else if (cancelId && !isFinalStatus(turn.status)) {
      // Already cancelling: nothing changes but the record of this request.
      await this.r.store.updateTurnFenced(turn._id, this.epoch, cancelIds);
    }
    return ok({ run_id: run._id, turn_id: turn._id, http_status: outcome.httpStatus });
  }

  /**
   * The turn a cancel selects: the named one, else the active, else the queued, else the
   * latest. A retry whose first attempt changed nothing selects only among the turns the run
   * had then (`beforeIndex`): one admitted since is not the first attempt's to cancel, and the
   * latest of the earlier ones is selected instead.
   */
  private async cancelTargetOf(run: RunDoc, turnId: string | undefined, beforeIndex: number | undefined): Promise<TurnDoc | null> {
    const turn = await this.r.store.getTurn(cancelTarget(run, turnId));
    if (turnId !== undefined || beforeIndex === undefined || !turn || turn.index < beforeIndex) return turn;
    return (await this.r.store.listTurns(run._id, { afterIndex: beforeIndex - 2, limit: 1 }))[0] ?? null;
  }

  // ---- decisions on gated tool calls ----------------------------------------------

  private async decideAction(run: RunDoc, cmd: Extract<RunCommand, { op: "decide" }>): Promise<CommandReply> {
    const waiting = this.turns.waiting;
    if (waiting && !waiting.decided && waiting.action.id === cmd.action_id) {
      const outcome = decide(waiting.action, cmd.decision, cmd.reason, this.r.clock.nowMs(), cmd.decision_id);
      // Past its expiry the timeout decides, whatever the timer's progress.
      await this.turns.decided(run, outcome.action);
      if (outcome.kind === "decided") return ok({ run_id: run._id, turn_id: waiting.turn._id, action: renderAction(outcome.action, run._id, waiting.turn._id) });
      return fail("action_already_decided", "The action expired before this decision; its timeout decided it.", "actionId");
    }
    // Asked before: decided then, or its turn ended without a decision (cancelled, time limit).
    const found = await this.askedBefore(run, cmd.action_id);
    if (!found) return fail("action_not_found", undefined, "actionId");
    const { action: earlier, turnId } = found;
    // This very decision, resent (its answer was lost): answered as the first time.
    if (earlier.decided_by === "person" && earlier.decision_id === cmd.decision_id) {
      return ok({ run_id: run._id, turn_id: turnId, action: renderAction(earlier, run._id, turnId) });
    }
    const message = earlier.decision === null ? "The action's turn ended before a decision (cancelled or stopped by its time limit); nothing of the call ran." : undefined;
    return fail("action_already_decided", message, "actionId");
  }

  /** The action, if a turn of the run asked for it (the latest turn is read alone first). */
  private async askedBefore(run: RunDoc, actionId: string): Promise<{ action: ActionDoc; turnId: string } | undefined> {
    const find = (turn: TurnDoc | null) => {
      const action = turn?.actions?.find((a) => a.id === actionId);
      return action && turn ? { action, turnId: turn._id } : undefined;
    };
    const latest = find(await this.r.store.getTurn(run.active_turn_id ?? run.latest_turn_id));
    if (latest) return latest;
    for (const turn of await this.r.store.listTurns(run._id)) {
      const found = find(turn);
      if (found) return found;
    }
    return undefined;
  }

  private async deleteRun(run: RunDoc): Promise<CommandReply> {
    if (run.state !== RunState.idle || this.turns.active) return fail("run_busy", "A busy run must be cancelled and settle before it is deleted.");
    // The answer waits for the run's document only: its parts are removed asynchronously
    // (runs-api.md), so a run with a long history is deleted as quickly as any other.
    await this.removeRun(run, "deleted");
    return ok({ run_id: run._id });
  }

  /**
   * Fences the run off and keeps a tombstone, then removes its document; `parts` is the
   * removal of its other parts (turns, events, workspace, checkpoint), which never fails:
   * what it cannot remove is left to the check its tombstone schedules.
   */
  private async removeRun(run: RunDoc, reason: "deleted" | "expired"): Promise<{ parts: Promise<void> }> {
    const now = this.r.clock.nowMs();
    // Webhooks first: a crash after this repeats the removal (keyed: nothing twice).
    await this.r.webhooks.enqueue({
      workspaceId: run.workspace_id,
      agentId: run.agent_id,
      runId: run._id,
      partition: run.partition,
      type: reason === "deleted" ? "run.deleted" : "run.expired",
      eventKey: `${run._id}_${reason}`,
      data: { run_id: run._id, agent_id: run.agent_id, tags: run.tags, reason, at: Math.floor(now / 1000) },
    });
    // The tombstone also says when the partition's owner checks that the parts below are
    // gone: a crash from here on, or a store away for longer than the retries, leaves them to it.
    await this.r.store.insertTombstone({
      _id: run._id,
      workspace_id: run.workspace_id,
      reason,
      at: now,
      expires_at: now + 90 * 86_400_000,
      partition: run.partition,
      plan: run.plan,
      parts_due_at: now + PARTS_CHECK_AFTER_MS,
    });
    await this.r.store.deleteRunFenced(run._id, this.epoch);
    this.run = null;
    this.stopped = true;
    this.r.log.info({ run_id: run._id, reason }, "run removed");
    const appender = this.appender;
    const removeParts = async () => {
      await appender?.flush().catch(() => undefined);
      if (await removeRunParts(this.r, { id: run._id, workspace_id: run.workspace_id, plan: run.plan })) {
        // Nothing left to check; if this write fails, the check finds nothing to remove.
        await this.r.store.setPartsDue(run._id, null).catch((err: unknown) => this.r.log.debug({ err, run_id: run._id }, "could not mark the removed run's parts gone"));
      }
    };
    const failed = (err: unknown) => this.r.log.error({ err, run_id: run._id }, "removing the removed run's parts failed; its partition's owner tries again later");
    // The sweeper expires runs one at a time and waits for each; deletes, answered before
    // their parts go, take the node's bounded removals, so a burst of them cannot hold
    // thousands open at once.
    if (reason === "expired") return { parts: removeParts().catch(failed) };
    const parts = this.r.partRemovals.run(removeParts).then((ran) => {
      if (ran) return;
      // Refused: the queue is full, or the node is stopping (then said once, by the node).
      if (!this.r.partRemovals.closed) this.r.log.warn({ run_id: run._id }, "too many removals waiting on this node: the deleted run's parts are left to its partition's owner's check");
    }, failed);
    return { parts };
  }

  private async editTags(run: RunDoc, add: string[], remove: string[]): Promise<CommandReply> {
    const next = editTags(run.tags, add, remove, MAX_TAGS);
    if (!next) return fail("invalid_request", `A run holds at most ${MAX_TAGS} tags.`, "add");
    if (next.join("\u0000") !== [...run.tags].sort().join("\u0000")) {
      // Tags never touch retention or turns.
      await this.r.store.updateRunFenced(run._id, this.epoch, { tags: next });
      run.tags = next;
    }
    return ok({ run_id: run._id, tags: next });
  }
}

