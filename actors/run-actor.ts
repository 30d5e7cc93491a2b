import { rm } from "node:fs/promises";
import type { Logger } from "pino";
import type { NatsConnection } from "@nats-io/transport-node";
import type { AgentMessage } from "@mariozechner/pi-agent-core";
import { type AbortReason, admissionOutcome, DeploymentStatus, nextVersionFor, settleDecision, cancelOutcome, cancelTarget, type Clock, type CommandReply, type Config, Disposition, editTags, type EnvValues, type EventAppender, type EventLog, FencedError, type FileStore, finalEventType, type IdSource, type InputPart, interruptedStatus, isFinalStatus, MAX_TAGS, type RunStore, type DeploymentLookup, renderRun, type RunCommand, type RunDoc, RunState, Subjects, type TurnDoc, type TurnError, turnError, TurnStatus } from "../src/index.js";
import { SteeringTargetEndedError, startTurn, type RunningTurn, type TurnRunRequest, type TurnRunResult } from "./agent-runner.js";
import { CheckpointError, type WorkspaceCheckpoints } from "./checkpoints.js";
import { inputText, resolveFiles, withRetries } from "./turn-input.js";
import { prepareRunWorkspace, workspaceDirOf } from "./run-workspace.js";
import type { ActiveTurns } from "./active-turns.js";
import type { Sandbox } from "./sandbox.js";
import { apiKeyResolver } from "./credentials.js";
import { fitTurnDocument } from "./transcript-bounds.js";

/**
 * What every actor of a node shares, as the contracts the actor needs (node/service.ts
 * hands in the real ones; test/unit/run-actor.test.ts, fakes).
 */
export interface ActorResources {
  config: Pick<Config, "activeTurnLimit" | "allowPrivateModelEndpoints" | "ambientProviders" | "dataDir" | "retention" | "turnLimitMs">;
  clock: Clock;
  ids: IdSource;
  store: RunStore;
  /** Live events and final notices go out on NATS subjects. */
  nc: Pick<NatsConnection, "publish">;
  events: EventLog;
  log: Logger;
  deployments: DeploymentLookup;
  checkpoints: Pick<WorkspaceCheckpoints, "save" | "restore" | "remove">;
  activeTurns: Pick<ActiveTurns, "count" | "started" | "ended">;
  files: Pick<FileStore, "getMany" | "read">;
  envValues: Pick<EnvValues, "resolveForTurn">;
  /** The node's tool sandbox. */
  sandbox: Sandbox;
  /** Node-wide state: while draining, queued turns are left for the next owner. */
  node: { draining: boolean };
  /** Runs a turn's agent loop; {@link startTurn} unless a test parks turns at will. */
  startTurn?: (request: TurnRunRequest) => RunningTurn;
}


interface ActiveExecution {
  turn: TurnDoc;
  running: RunningTurn;
  /** Why the agent was aborted, when it was. */
  abortReason?: AbortReason;
  limitTimer: NodeJS.Timeout;
}



type OkReply = Omit<Extract<CommandReply, { ok: true }>, "ok">;
const ok = (reply: OkReply): CommandReply => ({ ok: true, ...reply });
const fail = (code: Extract<CommandReply, { code: string }>["code"], message?: string, param?: string): CommandReply => ({
  ok: false,
  code,
  message,
  param: param ?? null,
});

/**
 * The single owner of one run on this node. Commands and internal events go through
 * one mailbox, so every change to the run and its turns is serialized here, and
 * every store write is fenced by the partition epoch.
 */
export class RunActor {
  private mailbox: Promise<unknown> = Promise.resolve();
  private run: RunDoc | null = null;
  private active: ActiveExecution | undefined;
  private appender: EventAppender | undefined;
  /** Agent session of the run: concatenated transcripts of its finished turns. */
  private session: AgentMessage[] | undefined;
  private stopped = false;
  /** Stopped because a finished turn could not be stored: the host recovers the run. */
  private unsettled = false;
  /** The last turn whose final write succeeded, for a retry of what follows it. */
  private storedFinal: { turnId: string; turn: TurnDoc; now: number; finalEmitted?: boolean } | undefined;
  /** The turn this actor counts as executing in its workspace (see ActiveTurns). */
  private countedTurn: { workspaceId: string; turnId: string } | undefined;
  /** Commands in the mailbox: a run being admitted is not idle even before its turn starts. */
  private pendingCommands = 0;
  lastUsedMs: number;

  constructor(
    readonly runId: string,
    readonly partition: number,
    readonly epoch: number,
    private readonly r: ActorResources,
  ) {
    this.lastUsedMs = r.clock.nowMs();
  }

  get isIdle(): boolean {
    return this.pendingCommands === 0 && this.active === undefined && (this.run === null || this.run.state === RunState.idle);
  }

  /** Whether this actor has loaded (and so claimed) its run. */
  get holdsRun(): boolean {
    return this.run !== null && !this.stopped;
  }

  /** Whether an agent is executing a turn of this run on this node now. */
  get hasActiveTurn(): boolean {
    return this.active !== undefined && !this.stopped;
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

  /** Deletes the run's data once its retention ran out (sweeper). */
  expire(): Promise<void> {
    return this.guarded(async () => {
      const run = await this.activate();
      if (!run || run.expires_at > this.r.clock.nowMs()) return;
      if (this.active) {
        this.active.abortReason = "shutdown";
        this.active.running.abort();
        this.active = undefined;
      }
      await this.removeRun(run, "expired");
    });
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
    this.turnEnded();
    if (this.active) {
      this.active.abortReason = "shutdown";
      clearTimeout(this.active.limitTimer);
      this.active.running.abort();
    }
    this.r.log.info({ run_id: this.runId, reason }, "run actor stopped");
  }

  /**
   * Graceful shutdown: ends the active turn as interrupted (incomplete,
   * worker_execution_interrupted) with its partial output, and resolves once stored.
   */
  async interrupt(): Promise<void> {
    const execution = this.active;
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
    if (run.expires_at <= this.r.clock.nowMs()) return fail("run_expired");
    switch (cmd.op) {
      case "continue":
        return this.continueRun(run, cmd);
      case "cancel":
        return this.cancel(run, cmd.turn_id);
      case "delete":
        return this.deleteRun(run);
      case "tags":
        return this.editTags(run, cmd.add, cmd.remove);
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
    this.run = run;
    await this.openEvents(run);
    if (run.state === RunState.busy && !this.active) await this.recoverActiveTurn(run, run.active_turn_id);
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
    });
  }

  /** Appends an event; returns its run sequence. */
  private emit(turnId: string | null, source: "runtime" | "platform", type: string, data: unknown): number {
    return this.appender!.append(turnId, source, type, data, this.r.clock.nowMs());
  }

  private async recoverActiveTurn(run: RunDoc, turnId: string | null): Promise<void> {
    const turn = turnId ? await this.r.store.getTurn(turnId) : null;
    const now = this.r.clock.nowMs();
    const status = turn ? interruptedStatus(turn.status) : undefined;
    if (turn && status) {
      const error = status === TurnStatus.incomplete ? turnError("worker_execution_interrupted", { reference: this.r.ids.reference() }) : null;
      const final: Partial<TurnDoc> = { status, error, completed_at: now, duration_ms: turn.started_at ? now - turn.started_at : 0 };
      await this.r.store.updateTurnFenced(turn._id, this.epoch, final);
      this.r.log.warn({ run_id: run._id, turn_id: turn._id, status }, "turn interrupted by a lost owner");
      await this.afterTurn(run, { ...turn, ...final }, now);
      return;
    }
    await this.afterTurn(run, null, now);
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
    // A fresh start's events begin at 1; a resent one's message ids repeat an earlier
    // attempt's, which JetStream de-duplicates.
    const stored = cmd.fresh ? 0 : await this.r.events.lastSequence({ id: run._id, plan: run.plan });
    this.appender = this.r.events.appender({ id: run._id, workspace_id: run.workspace_id, plan: run.plan }, stored + 1, {
      onStored: (event) => this.r.nc.publish(Subjects.live(run.workspace_id, run._id), JSON.stringify(event)),
    });
    this.emit(null, "platform", "run.created", { agent_id: run.agent_id, agent_version: run.agent_version, tags: run.tags });
    const firstSeq = this.emit(cmd.turn_id, "platform", "turn.started", { agent_version: cmd.version });
    const turn = this.newTurn(run, cmd.turn_id, 0, TurnStatus.in_progress, cmd.version, cmd.input, now, firstSeq, Disposition.created);
    // Events first: a turn is announced only once its first event is recorded (rule 9).
    await this.appender.flush();
    run.event_seq = this.appender.nextSequence - 1;
    // The turn next: a run never points at a turn that is not stored.
    await this.r.store.insertTurnOnce(turn);
    if (!(await this.r.store.insertRunOnce(run))) {
      // An earlier attempt of this start (its reply lost, the partition moved here since)
      // admitted the run meanwhile, on the node that owned the partition then. This node
      // owns it now: claim the run, which recovers a turn the stale owner left behind.
      this.r.log.info({ run_id: run._id }, "start already admitted by an earlier attempt");
      this.appender = undefined;
      await this.activate();
      return ok({ run_id: run._id, turn_id: cmd.turn_id, disposition: Disposition.created });
    }
    this.run = run;
    this.session = [];
    await this.execute(run, turn);
    return ok({ run_id: run._id, turn_id: turn._id, disposition: Disposition.created, run: renderRun(run, turn, Disposition.created) });
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

  private async continueRun(run: RunDoc, cmd: Extract<RunCommand, { op: "continue" }>): Promise<CommandReply> {
    if (this.active?.turn.steer_ids.includes(cmd.turn_id)) {
      return ok({ run_id: run._id, turn_id: this.active.turn._id, disposition: Disposition.steered });
    }
    // A resent continuation names a turn this actor admitted already: answer as before.
    if (cmd.turn_id === run.latest_turn_id || cmd.turn_id === run.queued_turn_id) {
      const replay = await this.replayContinue(run, cmd.turn_id);
      if (replay) return replay;
    }
    const outcome = admissionOutcome({
      state: run.state,
      hasQueued: run.queued_turn_id !== null,
      onBusy: cmd.on_busy,
      activeStatus: this.active && !this.active.abortReason ? this.active.turn.status : undefined,
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

  /** A resent continuation (same ids) answers as the first did. */
  private async replayContinue(run: RunDoc, id: string): Promise<CommandReply | undefined> {
    const known = await this.r.store.getTurn(id);
    if (known && known.run_id === run._id) {
      return ok({ run_id: run._id, turn_id: known._id, disposition: known.disposition });
    }
    if (this.active?.turn.steer_ids.includes(id)) return ok({ run_id: run._id, turn_id: this.active.turn._id, disposition: Disposition.steered });
    return undefined;
  }

  private async admitTurn(run: RunDoc, turnId: string, input: InputPart[], queue: boolean): Promise<CommandReply> {
    const now = this.r.clock.nowMs();
    const version = await nextVersionFor(this.r.store, this.r.deployments, run);
    const status = queue ? TurnStatus.queued : TurnStatus.in_progress;
    const firstSeq = this.emit(turnId, "platform", queue ? "turn.queued" : "turn.started", { agent_version: version });
    const turn = this.newTurn(run, turnId, run.turn_count, status, version, input, now, firstSeq, queue ? Disposition.queued : Disposition.continued);
    await this.appender!.flush();
    if (!(await this.r.store.insertTurnOnce(turn))) {
      // Admitted before (a resent command after a lost reply): answer as then.
      return (await this.replayContinue(run, turnId)) ?? fail("conflict", "The turn id is taken.");
    }
    const set: Partial<RunDoc> = {
      turn_count: run.turn_count + 1,
      latest_turn_id: turn._id,
      last_activity_at: now,
      expires_at: now + run.retention_s * 1000,
      agent_version: version,
      versions: run.versions.includes(version) ? run.versions : [...run.versions, version],
      event_seq: this.appender!.nextSequence - 1,
    };
    if (queue) set.queued_turn_id = turn._id;
    else Object.assign(set, { state: RunState.busy, active_turn_id: turn._id });
    await this.r.store.updateRunFenced(run._id, this.epoch, set);
    Object.assign(run, set);
    if (!queue) await this.execute(run, turn);
    const disposition = queue ? Disposition.queued : Disposition.continued;
    return ok({ run_id: run._id, turn_id: turn._id, disposition, run: renderRun(run, turn, disposition) });
  }

  private async steer(run: RunDoc, steerId: string, input: InputPart[]): Promise<CommandReply> {
    const active = this.active!;
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

  private async cancel(run: RunDoc, turnId: string | undefined): Promise<CommandReply> {
    const turn = await this.r.store.getTurn(cancelTarget(run, turnId));
    if (!turn || turn.run_id !== run._id) return fail("turn_not_found", undefined, "turn_id");
    const outcome = cancelOutcome(turn.status);
    const now = this.r.clock.nowMs();
    if (outcome.to === TurnStatus.cancelled) {
      // A queued turn: cancelled at once.
      await this.r.store.updateTurnFenced(turn._id, this.epoch, { status: TurnStatus.cancelled, completed_at: now, duration_ms: 0 });
      await this.r.store.updateRunFenced(run._id, this.epoch, { queued_turn_id: null });
      run.queued_turn_id = null;
      this.emit(turn._id, "platform", finalEventType(TurnStatus.cancelled), { run: renderRun(run, { ...turn, status: TurnStatus.cancelled, completed_at: now, duration_ms: 0 }) });
      this.publishFinal(turn._id);
    } else if (outcome.to === TurnStatus.cancelling) {
      await this.r.store.updateTurnFenced(turn._id, this.epoch, { status: TurnStatus.cancelling });
      this.emit(turn._id, "platform", "turn.cancelling", {});
      if (this.active?.turn._id === turn._id) {
        this.active.turn.status = TurnStatus.cancelling;
        this.active.abortReason = "cancel";
        this.active.running.abort();
      }
    }
    return ok({ run_id: run._id, turn_id: turn._id, http_status: outcome.httpStatus });
  }

  private async deleteRun(run: RunDoc): Promise<CommandReply> {
    if (run.state !== RunState.idle || this.active) return fail("run_busy", "A busy run must be cancelled and settle before it is deleted.");
    await this.removeRun(run, "deleted");
    return ok({ run_id: run._id });
  }

  /** Fences the run off, keeps a tombstone, then removes its documents, events and workspace. */
  private async removeRun(run: RunDoc, reason: "deleted" | "expired"): Promise<void> {
    const now = this.r.clock.nowMs();
    await this.r.store.insertTombstone({ _id: run._id, workspace_id: run.workspace_id, reason, at: now, expires_at: now + 90 * 86_400_000 });
    await this.r.store.deleteRunFenced(run._id, this.epoch);
    this.run = null;
    this.stopped = true;
    await this.appender?.flush().catch(() => undefined);
    await this.r.store.deleteTurnsOf(run._id);
    await this.r.events.purge({ id: run._id, workspace_id: run.workspace_id, plan: run.plan }).catch((err) =>
      this.r.log.warn({ err, run_id: run._id }, "could not purge the run's events; their retention removes them"),
    );
    await rm(this.workspaceDir(run), { recursive: true, force: true });
    await this.r.checkpoints.remove(run._id);
    this.r.log.info({ run_id: run._id, reason }, "run removed");
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

  // ---- execution ------------------------------------------------------------------

  private workspaceDir(run: RunDoc): string {
    return workspaceDirOf(this.r.config.dataDir, run._id);
  }

  /**
   * Starts the agent for an in_progress turn; completion comes back through the
   * mailbox. Never throws: an admitted turn that cannot start ends failed instead of
   * staying in_progress with no agent behind it.
   */
  private async execute(run: RunDoc, turn: TurnDoc): Promise<void> {
    // A stopped actor starts nothing: the partition's next owner recovers the turn.
    if (this.stopped) return;
    try {
      await this.startExecution(run, turn);
    } catch (err) {
      if (err instanceof FencedError) throw err;
      const reference = this.r.ids.reference();
      this.r.log.error({ err, run_id: run._id, turn_id: turn._id, reference }, "the turn could not start");
      if (this.active?.turn._id === turn._id) return;
      await this.finishTurn(turn, TurnStatus.failed, [], [], turnError("runtime_dispatch_failed", { reference }));
    }
  }

  private async startExecution(run: RunDoc, turn: TurnDoc): Promise<void> {
    const deployment = await this.r.deployments.get(run.agent_id, turn.agent_version);
    if (!deployment || deployment.status !== DeploymentStatus.ready) {
      await this.finishTurn(turn, TurnStatus.failed, [], [], turnError("agent_version_unavailable", { reference: this.r.ids.reference() }));
      return;
    }
    const limit = this.r.config.activeTurnLimit[run.plan];
    if (this.activeTurnCount(run.workspace_id, turn._id) > limit) {
      const error = turnError("concurrency_limit_reached", {
        reference: this.r.ids.reference(),
        message: `The workspace already runs ${limit} turns at once; send the input again when one finishes.`,
      });
      await this.finishTurn(turn, TurnStatus.failed, [], [], error);
      return;
    }
    const session = await this.loadSession(run);
    const workspaceDir = this.workspaceDir(run);
    const preparation = await prepareRunWorkspace(this.r, run, workspaceDir);
    if (preparation) {
      await this.finishTurn(turn, TurnStatus.failed, [], [], turnError(preparation, { reference: this.r.ids.reference() }));
      return;
    }
    let input: InputPart[];
    let credentials: Record<string, string>;
    try {
      // A store or object-store hiccup is retried briefly before the turn fails.
      [input, credentials] = await withRetries(() =>
        Promise.all([resolveFiles(this.r.files, run.workspace_id, turn.input), this.r.envValues.resolveForTurn(run.workspace_id)]),
      );
    } catch (err) {
      this.r.log.error({ err, run_id: run._id, turn_id: turn._id }, "could not prepare the turn's input or credentials");
      await this.finishTurn(turn, TurnStatus.failed, [], [], turnError("runtime_dispatch_failed", { reference: this.r.ids.reference() }));
      return;
    }
    const running = (this.r.startTurn ?? startTurn)({
      config: deployment.config,
      workspaceDir,
      sandbox: this.r.sandbox,
      allowPrivateModelEndpoints: this.r.config.allowPrivateModelEndpoints,
      history: session,
      input,
      getApiKey: apiKeyResolver(credentials, deployment.config.model),
      ambientProviders: this.r.config.ambientProviders,
      onEvent: (event) => {
        if (!this.stopped) this.emit(turn._id, "runtime", event.type, event.data);
      },
    });
    const limitTimer = setTimeout(() => {
      if (this.active?.turn._id !== turn._id) return;
      this.active.abortReason = "duration_limit";
      running.abort();
    }, this.r.config.turnLimitMs);
    limitTimer.unref();
    const execution: ActiveExecution = { turn, running, limitTimer };
    this.active = execution;
    void running.result.then((result) => this.enqueue(() => this.onFinished(execution, result)));
  }

  private async onFinished(execution: ActiveExecution, result: TurnRunResult): Promise<void> {
    clearTimeout(execution.limitTimer);
    // The agent stopped: the turn no longer executes here, whatever is stored next.
    if (this.countedTurn?.turnId === execution.turn._id) this.turnEnded();
    if (this.stopped || this.active !== execution) return;
    this.active = undefined;
    const decision = settleDecision(execution.abortReason, result.outcome);
    const status = decision.status;
    const output = decision.output === "agent" ? result.output : [];
    const error: TurnError | null =
      decision.error === "agent" ? (result.error ?? null) : decision.error === "none" ? null : turnError(decision.error, { reference: this.r.ids.reference() });
    try {
      await this.finishTurn(execution.turn, status, output, result.transcript as AgentMessage[], error);
    } catch (err) {
      if (err instanceof FencedError) this.stop("fenced");
      else await this.settleUnstored(execution.turn, err);
    }
  }

  /**
   * The finished turn (or the run after it) could not be stored. No run may stay busy
   * because a write failed: the turn is stored `failed` without its result, retried for
   * a while; if even that cannot be written (the store is down), the actor stops as
   * unsettled and the node recovers the run once the store answers (ActorHost.adoptOrphans).
   */
  private async settleUnstored(turn: TurnDoc, cause: unknown): Promise<void> {
    const reference = this.r.ids.reference();
    this.r.log.error({ err: cause, run_id: this.runId, turn_id: turn._id, reference }, "could not store a finished turn; storing it as failed without its result");
    const error = turnError("platform_failure", { reference, message: "The turn finished, but its result could not be stored." });
    for (let attempt = 0; attempt < 5 && !this.stopped; attempt++) {
      try {
        const stored = this.storedFinal?.turnId === turn._id ? this.storedFinal : undefined;
        // The turn itself was stored: only the run's move to its next state is left.
        if (stored && this.run) await this.afterTurn(this.run, stored.turn, stored.now);
        else await this.finishTurn(turn, TurnStatus.failed, [], [], error, { checkpoint: false });
        return;
      } catch (err) {
        if (err instanceof FencedError) return this.stop("fenced");
        this.r.log.warn({ err, run_id: this.runId, turn_id: turn._id, attempt }, "storing the failed turn failed; retrying");
        await new Promise((resolve) => setTimeout(resolve, 500 * 2 ** attempt));
      }
    }
    this.unsettled = true;
    this.stop("a finished turn could not be stored");
  }

  /** One fenced write makes the turn final, then the run moves on. */
  private async finishTurn(
    turn: TurnDoc,
    status: TurnStatus,
    output: TurnDoc["output"],
    transcript: AgentMessage[],
    error: TurnError | null,
    options: { checkpoint?: boolean } = {},
  ): Promise<void> {
    // The turn's runtime events are stored before it is final.
    try {
      await this.appender!.flush();
    } catch (err) {
      this.r.log.warn({ err, run_id: this.runId, turn_id: turn._id }, "event stream write failed");
      if (status === TurnStatus.completed) {
        status = TurnStatus.failed;
        error = turnError("event_stream_write_failed", { reference: this.r.ids.reference() });
      }
    }
    if (turn.started_at !== null && !this.stopped && options.checkpoint !== false) {
      try {
        const run = this.run;
        if (run && (await this.r.checkpoints.save(run._id, this.workspaceDir(run), run.checkpointed === true, run.workspace_id)) && !run.checkpointed) {
          await this.r.store.updateRunFenced(run._id, this.epoch, { checkpointed: true });
          run.checkpointed = true;
        }
      } catch (err) {
        if (!(err instanceof CheckpointError)) throw err;
        this.r.log.error({ err, run_id: this.runId, turn_id: turn._id }, "workspace checkpoint failed");
        if (status === TurnStatus.completed) {
          status = TurnStatus.failed;
          error = turnError("workspace_checkpoint_failed", { reference: this.r.ids.reference() });
        }
      }
    }
    // The turn document must stay under the store's limit: a transcript too large even
    // compacted is not stored, and the turn fails rather than leaving the run busy.
    const fitted = fitTurnDocument(turn.input, output, transcript);
    if (fitted.compacted) this.r.log.warn({ run_id: this.runId, turn_id: turn._id }, "turn transcript compacted to fit its document");
    ({ output, transcript } = fitted);
    if (fitted.failure) {
      status = TurnStatus.failed;
      error = turnError("platform_failure", { reference: this.r.ids.reference(), message: fitted.failure });
    }
    const now = this.r.clock.nowMs();
    const final: Partial<TurnDoc> = { status, output, error, transcript, completed_at: now, duration_ms: now - (turn.started_at ?? now) };
    await this.r.store.updateTurnFenced(turn._id, this.epoch, final);
    this.storedFinal = { turnId: turn._id, turn: { ...turn, ...final }, now };
    this.turnEnded();
    if (this.session) this.session.push(...transcript);
    if (error) this.r.log.warn({ run_id: this.runId, turn_id: turn._id, code: error.code, reference: error.reference }, "turn ended with an error");
    const run = this.run;
    if (run) await this.afterTurn(run, { ...turn, ...final }, now);
  }

  /**
   * After the active turn ended: record its final event, start the queued turn or go
   * idle, and only then tell waiters (they read the run when notified).
   */
  private async afterTurn(run: RunDoc, finished: TurnDoc | null, now: number): Promise<void> {
    const queued = run.queued_turn_id ? await this.r.store.getTurn(run.queued_turn_id) : null;
    const waiting = queued && queued.status === TurnStatus.queued ? queued : null;
    // While the node drains, a queued turn stays queued for the next owner to start.
    const next = this.r.node.draining ? null : waiting;
    const set: Partial<RunDoc> = {
      active_turn_id: next?._id ?? null,
      queued_turn_id: next ? null : (waiting?._id ?? null),
      state: next || waiting ? RunState.busy : RunState.idle,
      last_activity_at: now,
      expires_at: now + run.retention_s * 1000,
    };
    // Once per turn, also when a failed write of the run makes settleUnstored come back here.
    const emitted = this.storedFinal?.turnId === finished?._id && this.storedFinal?.finalEmitted === true;
    if (finished && !emitted) {
      this.emit(finished._id, "platform", finalEventType(finished.status), { run: renderRun({ ...run, ...set }, finished) });
      if (this.storedFinal?.turnId === finished._id) this.storedFinal.finalEmitted = true;
    }
    if (next) this.emit(next._id, "platform", "turn.started", { agent_version: next.agent_version });
    await this.appender!.flush().catch((err) => this.r.log.warn({ err, run_id: run._id }, "event stream write failed"));
    set.event_seq = this.appender!.nextSequence - 1;
    await this.r.store.updateRunFenced(run._id, this.epoch, set);
    Object.assign(run, set);
    if (finished) this.publishFinal(finished._id);
    if (next) {
      await this.r.store.updateTurnFenced(next._id, this.epoch, { status: TurnStatus.in_progress, started_at: now });
      next.status = TurnStatus.in_progress;
      next.started_at = now;
      await this.execute(run, next);
    }
  }


  /** Registers the turn as executing on this node and counts the workspace's executing turns. */
  private activeTurnCount(workspaceId: string, turnId: string): number {
    this.countedTurn = { workspaceId, turnId };
    this.r.activeTurns.started(workspaceId, turnId);
    return this.r.activeTurns.count(workspaceId);
  }

  /** The executing turn no longer counts against the workspace's active-turn limit. */
  private turnEnded(): void {
    const counted = this.countedTurn;
    if (!counted) return;
    this.countedTurn = undefined;
    this.r.activeTurns.ended(counted.workspaceId, counted.turnId);
  }

  private async loadSession(run: RunDoc): Promise<AgentMessage[]> {
    if (!this.session) {
      const turns = await this.r.store.listTurns(run._id, { withTranscript: true });
      this.session = turns.filter((t) => isFinalStatus(t.status)).flatMap((t) => t.transcript as AgentMessage[]);
    }
    return this.session;
  }

  private publishFinal(turnId: string): void {
    this.r.nc.publish(Subjects.turnFinal(turnId), "");
  }
}

