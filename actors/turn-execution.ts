/**
 * A run's turn execution on its owning actor: starting the agent for an in_progress
 * turn, and storing how it ended (one fenced write of the turn, then the run moves to
 * its next turn or goes idle, then waiters are told). It runs inside the actor's
 * mailbox (every method is called from it or enqueues itself there), so it shares
 * the actor's single-writer guarantee; {@link ExecutionHost} is what it may see and
 * do of the actor.
 */
import { existsSync } from "node:fs";
import type { AgentMessage } from "@mariozechner/pi-agent-core";
import { type ActionDoc, encodeFinalNotice, FINAL_NOTICE_MAX_BYTES, type RunView, type AgentConfig, denialText, expire, newAction, onVersion, pendingActionOf, renderAction, unixSeconds, type AbortReason, DeploymentStatus, type EventAppender, FencedError, finalEventType, type InputPart, isFinalStatus, renderRun, type RunDoc, RunState, settleDecision, Subjects, type TurnDoc, type TurnError, turnError, TurnStatus, type Timer, addUsage, hasUsage, modelLabel, NO_USAGE, type TurnUsage, type WebhookEventType, isTransientFailure, BUILTIN_TOOLS } from "../src/index.js";
import { closeToolCalls, startTurn, type RunningTurn, type TurnResume, type TurnRunResult } from "./agent-runner.js";
import { CheckpointConflictError, CheckpointError, CheckpointUnrestorableError, isTransientCheckpointFailure } from "./checkpoints.js";
import { apiKeyResolver } from "./credentials.js";
import type { ActorResources } from "./actor-resources.js";
import { prepareRunWorkspace, workspaceDirOf } from "./run-workspace.js";
import { fitTurnDocument } from "./transcript-bounds.js";
import { resolveFiles, withRetries } from "./turn-input.js";

/**
 * How long a finished turn's write is retried while the store fails for a moment: past a
 * MongoDB election (10–30 s) and a FerretDB restart, each pause at most 5 s.
 */
export const SETTLE_RETRY_MS = 120_000;
const SETTLE_MAX_PAUSE_MS = 5_000;
const SETTLE_ATTEMPTS = 40;

export interface ActiveExecution {
  turn: TurnDoc;
  running: RunningTurn;
  /** Why the agent was aborted, when it was. */
  abortReason?: AbortReason;
  limitTimer: Timer;
  /** The deployment's model, as usage names it. */
  model: string;
  /** The deployment's approval policy (config.approval). */
  approval: AgentConfig["approval"];
}

/**
 * A turn waiting for a person's decision on a gated tool call: no agent, no process, no
 * sandbox; a timer for the action's expiry (or the turn's wall-clock limit, if sooner).
 */
export interface WaitingTurn {
  turn: TurnDoc;
  action: ActionDoc;
  timer: Timer;
  model: string;
  /** Decided, about to go on (scheduleResume); the action as decided. */
  decided?: ActionDoc;
}

/** The actor as its turn execution sees it. */
export interface ExecutionHost {
  readonly r: ActorResources;
  readonly runId: string;
  readonly epoch: number;
  /** The actor stopped (partition lost, fenced): nothing more is written. */
  readonly stopped: boolean;
  /** The run as the actor holds it (null once removed). */
  readonly run: RunDoc | null;
  emit(turnId: string | null, source: "runtime" | "platform", type: string, data: unknown): number;
  appender(): EventAppender;
  /** After a failed event write whose loss is accounted: later events are stored again. */
  resumeEvents(): void;
  enqueue<T>(work: () => Promise<T>): Promise<T>;
  stop(reason: string): void;
  /** A finished turn could not be stored: the host recovers the run. */
  markUnsettled(): void;
  /** Before a run moves on: a queued turn whose admission is in doubt is settled first (the run as stored names it, or it fails). */
  settleAdmission(run: RunDoc): Promise<void>;
}

/** A finished turn's result, kept to store it again after a failed write. */
interface FinishedTurn {
  status: TurnStatus;
  output: TurnDoc["output"];
  transcript: AgentMessage[];
  error: TurnError | null;
}

/**
 * How stale a busy run's retention clock may get before its turn's progress restarts it:
 * a hundredth of the retention, at least a second, at most 10 minutes (7 days: 10 minutes).
 */
export function retentionRefreshMs(retentionS: number): number {
  return Math.min(10 * 60_000, Math.max(1_000, retentionS * 10));
}

export class TurnExecution {
  /** The turn whose agent runs on this node now. */
  active: ActiveExecution | undefined;
  /** The turn that waits for a decision (no agent runs for it). */
  waiting: WaitingTurn | undefined;
  /** Agent session of the run: concatenated transcripts of its finished turns. */
  session: AgentMessage[] | undefined;
  /**
   * The last turn whose workspace needs no saving after it: saved already (a retried final
   * write skips it), or run without tools while the workspace here held nothing unsaved.
   */
  private checkpointedTurnId: string | undefined;
  /**
   * This actor prepared the workspace for a turn with tools (a directory kept from before
   * checked against the checkpoint). Until then nothing of the directory is saved: a kept
   * one may be older than the checkpoint another node saved.
   */
  private workspaceChecked = false;
  /**
   * The revision of the run's checkpoint this actor last read or saved (0: none stored),
   * what its next save expects to replace (see WorkspaceCheckpoints.save).
   */
  private checkpointRevision = 0;
  /**
   * The workspace on this node may hold what its checkpoint lacks: a turn with tools began
   * under this actor (which clears `checkpointedTurnId`) and no save succeeded since.
   */
  private get workspaceUnsaved(): boolean {
    return this.workspaceChecked && this.checkpointedTurnId === undefined;
  }
  /** The last turn whose final write succeeded, for a retry of what follows it. */
  private storedFinal: { turnId: string; turn: TurnDoc; now: number; finalEmitted?: boolean } | undefined;
  /** The turn this actor counts as executing in its workspace (see ActiveTurns). */
  private countedTurn: { workspaceId: string; turnId: string } | undefined;

  /** A write restarting the run's retention clock is in the mailbox (madeProgress). */
  private refreshingRetention = false;

  constructor(private readonly host: ExecutionHost) {}

  private get r(): ActorResources {
    return this.host.r;
  }

  /**
   * Starts the agent for an in_progress turn; completion comes back through the
   * mailbox. Never throws: an admitted turn that cannot start ends failed instead of
   * staying in_progress with no agent behind it.
   */
  async execute(run: RunDoc, turn: TurnDoc, resume?: TurnResume): Promise<void> {
    // A stopped actor starts nothing: the partition's next owner recovers the turn.
    if (this.host.stopped) return;
    try {
      await this.startExecution(run, turn, resume);
    } catch (err) {
      if (err instanceof FencedError) throw err;
      const reference = this.r.ids.reference();
      this.r.log.error({ err, run_id: run._id, turn_id: turn._id, reference }, "the turn could not start");
      if (this.active?.turn._id === turn._id) return;
      const used = { usage: turn.waiting_usage, model: turn.waiting_model };
      // Stored final already (only the run's move-on failed): that is finished, not redone.
      if (this.storedFinal?.turnId === turn._id) return this.settleUnstored(turn, err, used);
      await this.finishTurn(turn, TurnStatus.failed, [], this.before(resume), turnError("runtime_dispatch_failed", { reference }), used);
    }
  }

  /** What a turn that ends before its agent runs keeps: nothing, or what it added before it waited. */
  private before(resume: TurnResume | undefined): AgentMessage[] {
    return resume ? closeToolCalls(resume.transcript, "The call did not run: the turn failed first.") : [];
  }

  private async startExecution(run: RunDoc, turn: TurnDoc, resume?: TurnResume): Promise<void> {
    const deployment = await this.r.deployments.get(run.agent_id, turn.agent_version);
    const before = this.before(resume);
    const used = { usage: turn.waiting_usage, model: deployment ? modelLabel(deployment.config.model) : undefined };
    // Refused before its agent runs: the turn changed nothing in the workspace, so nothing is saved.
    if (!deployment || deployment.status !== DeploymentStatus.ready) {
      await this.finishTurn(turn, TurnStatus.failed, [], before, turnError("agent_version_unavailable", { reference: this.r.ids.reference() }), { ...used, checkpoint: false });
      return;
    }
    const limit = this.r.config.activeTurnLimit[run.plan];
    // A resumed turn was admitted under the limit before it waited: it is not refused now.
    if (this.activeTurnCount(run.workspace_id, turn._id) > limit && !resume) {
      const error = turnError("concurrency_limit_reached", {
        reference: this.r.ids.reference(),
        message: `The workspace already runs ${limit} turns at once; send the input again when one finishes.`,
      });
      await this.finishTurn(turn, TurnStatus.failed, [], [], error, { checkpoint: false });
      return;
    }
    const session = await this.loadSession(run);
    const workspaceDir = workspaceDirOf(this.r.config.dataDir, run._id);
    // Every tool works in the workspace: a turn without tools is given none (no directory
    // made or restored; a later turn with tools prepares it then). It is saved after such a
    // turn only when an earlier turn of this actor left it with what the checkpoint lacks
    // (a save that failed). A directory a new actor finds here may be older than the
    // checkpoint: it is never saved unchecked (its first turn with tools checks it).
    const toolless = (deployment.config.tools ?? BUILTIN_TOOLS).length === 0;
    if (toolless && (!this.workspaceUnsaved || !existsSync(workspaceDir))) this.checkpointedTurnId = turn._id;
    const preparation = toolless ? null : await prepareRunWorkspace(this.r, run, workspaceDir, !this.workspaceChecked);
    if (preparation?.failure) {
      await this.finishTurn(turn, TurnStatus.failed, [], before, turnError(preparation.failure, { reference: this.r.ids.reference() }), { ...used, checkpoint: false });
      return;
    }
    if (preparation?.revision !== undefined) this.checkpointRevision = preparation.revision;
    if (!toolless) {
      this.workspaceChecked = true;
      this.checkpointedTurnId = undefined;
    }
    let input: InputPart[];
    let credentials: Record<string, string>;
    try {
      // A store or object-store hiccup is retried briefly before the turn fails.
      [input, credentials] = await withRetries(this.r.clock, () =>
        Promise.all([resolveFiles(this.r.files, run.workspace_id, turn.input), this.r.envValues.resolveForTurn(run.workspace_id)]),
      );
    } catch (err) {
      this.r.log.error({ err, run_id: run._id, turn_id: turn._id }, "could not prepare the turn's input or credentials");
      await this.finishTurn(turn, TurnStatus.failed, [], before, turnError("runtime_dispatch_failed", { reference: this.r.ids.reference() }), used);
      return;
    }
    const running = (this.r.startTurn ?? startTurn)({
      config: deployment.config,
      workspaceDir,
      sandbox: this.r.sandbox,
      tenant: run.workspace_id,
      allowPrivateModelEndpoints: this.r.config.allowPrivateModelEndpoints,
      history: session,
      input,
      getApiKey: apiKeyResolver(credentials, deployment.config.model),
      ambientProviders: this.r.config.ambientProviders,
      resume,
      onEvent: (event) => {
        if (this.host.stopped) return;
        this.host.emit(turn._id, "runtime", event.type, event.data);
        this.madeProgress(turn._id);
      },
      // A call's start is stored before it runs: a new owner then knows it may have run.
      // One whose start cannot be stored does not run (the model is told).
      beforeAction: () =>
        this.host.appender().flush().then(
          () => true,
          (err: unknown) => {
            this.r.log.warn({ err, run_id: run._id, turn_id: turn._id }, "event stream write failed before a tool call: the call is refused");
            return false;
          },
        ),
    });
    // The limit is wall-clock time since the turn started: a wait for a decision counts.
    const limitTimer = this.r.clock.after(
      Math.max(0, this.r.config.turnLimitMs - (this.r.clock.nowMs() - (turn.started_at ?? this.r.clock.nowMs()))),
      () => {
        if (this.active?.turn._id !== turn._id) return;
        this.active.abortReason = "duration_limit";
        running.abort();
      },
      { keepAlive: false },
    );
    const execution: ActiveExecution = { turn, running, limitTimer, model: modelLabel(deployment.config.model), approval: deployment.config.approval };
    this.active = execution;
    void running.result.then((result) => this.host.enqueue(() => this.finishingWhile(() => this.onFinished(execution, result))));
  }

  /**
   * A turn that makes progress restarts its run's retention clock (runs-api.md, "Retention
   * rules"), as a turn's start and end do. Written through the mailbox, at most once per
   * {@link retentionRefreshMs} and one at a time: a turn that streams for hours does not
   * write its run per event.
   */
  private madeProgress(turnId: string): void {
    const run = this.host.run;
    if (!run || this.refreshingRetention || this.r.clock.nowMs() - run.last_activity_at < retentionRefreshMs(run.retention_s)) return;
    this.refreshingRetention = true;
    this.host
      .enqueue(async () => {
        const current = this.host.run;
        if (this.host.stopped || current?.active_turn_id !== turnId || current.state !== RunState.busy) return;
        const now = this.r.clock.nowMs();
        const set = { last_activity_at: now, expires_at: now + current.retention_s * 1000 };
        await this.r.store.updateRunFenced(current._id, this.host.epoch, set);
        Object.assign(current, set);
      })
      .catch((err: unknown) => this.r.log.warn({ err, run_id: run._id, turn_id: turnId }, "could not restart the run's retention clock on its turn's progress; its turn's end restarts it"))
      .finally(() => {
        this.refreshingRetention = false;
      });
  }

  private async onFinished(execution: ActiveExecution, result: TurnRunResult): Promise<void> {
    execution.limitTimer.cancel();
    // The agent stopped: the turn no longer executes here, whatever is stored next.
    if (this.countedTurn?.turnId === execution.turn._id) this.turnEnded();
    if (this.host.stopped || this.active !== execution) return;
    this.active = undefined;
    // Model calls made before an earlier wait count when this part made none (it failed first).
    result = { ...result, usage: result.usage ?? execution.turn.waiting_usage };
    if (result.outcome === "paused") {
      // A drain that came as the turn paused leaves it waiting, for the next owner to restore.
      const parks = !execution.abortReason || execution.abortReason === "shutdown";
      if (parks && result.pause && execution.approval) return this.parkOrSettle(execution, result);
      // Cancelled (or stopped by its limit) as it came to wait: it ends aborted, the waiting call unrun.
      const transcript = endedWithoutCall(result.transcript, result.pause?.steers ?? [], "The call did not run: the turn was cancelled.", this.r.clock.nowMs());
      result = { ...result, outcome: "aborted", transcript };
    }
    const decision = settleDecision(execution.abortReason, result.outcome === "paused" ? "aborted" : result.outcome, result.actionInterrupted === true);
    const status = decision.status;
    const output = decision.output === "agent" ? result.output : [];
    const error: TurnError | null =
      decision.error === "agent" ? (result.error ?? null) : decision.error === "none" ? null : turnError(decision.error, { reference: this.r.ids.reference() });
    const used = { usage: result.usage, model: execution.model };
    const finished: FinishedTurn = { status, output, transcript: result.transcript as AgentMessage[], error };
    try {
      await this.finishTurn(execution.turn, status, output, finished.transcript, error, used);
    } catch (err) {
      if (err instanceof FencedError) this.host.stop("fenced");
      else await this.settleUnstored(execution.turn, err, used, finished);
    }
  }

  /**
   * The finished turn (or the run after it) could not be stored. No run may stay busy
   * because a write failed, and no turn may lose its result to a store outage shorter
   * than the retries: a temporary failure (the store or NATS away for a moment, a MongoDB
   * failover) retries the turn's own result; any other stores it `failed` without its
   * result. Retried for {@link SETTLE_RETRY_MS} (it was ~15 s, and a longer outage lost a
   * finished turn's output: the fault probe); if even that cannot be written, the actor
   * stops as unsettled and the node recovers the run once the store answers
   * (ActorHost.adoptOrphans), as interrupted.
   */
  private settleUnstored(turn: TurnDoc, cause: unknown, used: { usage?: TurnUsage; model?: string } = {}, finished?: FinishedTurn): Promise<void> {
    return this.finishingWhile(() => this.settleUnstoredNow(turn, cause, used, finished));
  }

  /**
   * Turns being finished here: their agent ended and their writes (the checkpoint, the final
   * writes, their retries) are under way. A draining node waits for them as for a running turn
   * (the agent's end clears `active` before any of it: review).
   */
  private finishing = 0;

  get isFinishing(): boolean {
    return this.finishing > 0;
  }

  private async finishingWhile<T>(work: () => Promise<T>): Promise<T> {
    this.finishing++;
    try {
      return await work();
    } finally {
      this.finishing--;
    }
  }

  private async settleUnstoredNow(turn: TurnDoc, cause: unknown, used: { usage?: TurnUsage; model?: string }, finished?: FinishedTurn): Promise<void> {
    const reference = this.r.ids.reference();
    // The turn's own result while the failures are temporary; undefined once one is not.
    let own = isTransientFailure(cause) ? finished : undefined;
    if (own) this.r.log.warn({ err: cause, run_id: this.host.runId, turn_id: turn._id }, "could not store a finished turn for now; retrying it");
    else this.r.log.error({ err: cause, run_id: this.host.runId, turn_id: turn._id, reference }, "could not store a finished turn; storing it as failed without its result");
    const error = turnError("platform_failure", { reference, message: "The turn finished, but its result could not be stored." });
    const giveUpAt = this.r.clock.nowMs() + SETTLE_RETRY_MS;
    for (let attempt = 0; attempt < SETTLE_ATTEMPTS && !this.host.stopped; attempt++) {
      try {
        const stored = this.storedFinal?.turnId === turn._id ? this.storedFinal : undefined;
        // The turn itself was stored: only the run's move to its next state is left.
        if (stored && this.host.run) await this.afterTurn(this.host.run, stored.turn, stored.now);
        else if (own) await this.finishTurn(turn, own.status, own.output, own.transcript, own.error, used);
        else await this.finishTurn(turn, TurnStatus.failed, [], [], error, { checkpoint: false, ...used });
        return;
      } catch (err) {
        if (err instanceof FencedError) return this.host.stop("fenced");
        if (own && !isTransientFailure(err)) {
          own = undefined;
          this.r.log.error({ err, run_id: this.host.runId, turn_id: turn._id, reference }, "could not store a finished turn; storing it as failed without its result");
        }
        const pause = Math.min(500 * 2 ** attempt, SETTLE_MAX_PAUSE_MS);
        if (this.r.clock.nowMs() + pause > giveUpAt) break;
        this.r.log.warn({ err, run_id: this.host.runId, turn_id: turn._id, attempt }, own ? "storing the finished turn failed; retrying" : "storing the failed turn failed; retrying");
        await this.r.clock.sleep(pause);
      }
    }
    if (!this.host.stopped) this.r.log.error({ run_id: this.host.runId, turn_id: turn._id }, "a finished turn could not be stored within its retries: the run is recovered once the store answers, the turn as interrupted");
    this.host.markUnsettled();
    this.host.stop("a finished turn could not be stored");
  }

  /**
   * Runs `write`, again while it fails for a moment (the store or NATS away: ~15 s in all);
   * any other failure, or the last, is thrown.
   */
  private async whileTransient<T>(turn: TurnDoc, write: () => Promise<T>): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await write();
      } catch (err) {
        if (attempt >= 4 || this.host.stopped || !isTransientFailure(err)) throw err;
        this.r.log.warn({ err, run_id: this.host.runId, turn_id: turn._id, attempt }, "storing the waiting turn failed for now; retrying");
        await this.r.clock.sleep(500 * 2 ** attempt);
      }
    }
  }

  /** One fenced write makes the turn final, then the run moves on. */
  async finishTurn(
    turn: TurnDoc,
    status: TurnStatus,
    output: TurnDoc["output"],
    transcript: AgentMessage[],
    error: TurnError | null,
    options: { checkpoint?: boolean; usage?: TurnUsage; model?: string } = {},
  ): Promise<void> {
    // The turn's runtime events are stored before it is final.
    try {
      await this.host.appender().flush();
    } catch (err) {
      this.r.log.warn({ err, run_id: this.host.runId, turn_id: turn._id }, "event stream write failed");
      // Kept with the turn: a retried final write (the store away for a moment) finds the
      // appender resumed below, and must still say so.
      this.eventsLostBy = turn._id;
      // Its final event and the run's later turns are stored again (once NATS answers), not
      // dropped for as long as the actor lives.
      if (!this.host.stopped) this.host.resumeEvents();
    }
    // A completed turn says its events were not all stored; a turn that ended otherwise
    // keeps its own error (one per turn), and the gap in its history is logged above.
    if (this.eventsLostBy === turn._id && status === TurnStatus.completed) {
      status = TurnStatus.failed;
      error = turnError("event_stream_write_failed", { reference: this.r.ids.reference() });
    }
    // Once per turn: a retried final write (store away for a moment) does not save it again.
    if (turn.started_at !== null && !this.host.stopped && options.checkpoint !== false && this.checkpointedTurnId !== turn._id) {
      const failure = await this.saveCheckpoint(turn);
      if (failure && status === TurnStatus.completed) {
        status = TurnStatus.failed;
        error = this.checkpointFailed(failure);
      }
    }
    // The turn document must stay under the store's limit: a transcript too large even
    // compacted is not stored, and the turn fails rather than leaving the run busy.
    const fitted = fitTurnDocument(turn.input, output, transcript);
    if (fitted.compacted) this.r.log.warn({ run_id: this.host.runId, turn_id: turn._id }, "turn transcript compacted to fit its document");
    ({ output, transcript } = fitted);
    if (fitted.failure) {
      status = TurnStatus.failed;
      // Not retryable: the same work makes the same transcript.
      error = turnError("agent_execution_failed", { reference: this.r.ids.reference(), message: fitted.failure });
    }
    const now = this.r.clock.nowMs();
    const final: Partial<TurnDoc> = { status, output, error, transcript, completed_at: now, duration_ms: now - (turn.started_at ?? now), usage: options.usage ?? NO_USAGE };
    if (this.r.at) await this.r.at("turn:finishing", { runId: this.host.runId, turnId: turn._id });
    // The ledger first: the model calls were made whatever becomes of this write (a fenced
    // or failed one included), and the record is keyed by the turn, so a retry is the same.
    const run = this.host.run;
    if (run && options.usage && options.model && hasUsage(options.usage)) {
      await this.r.usage.record({ _id: turn._id, workspace_id: run.workspace_id, run_id: run._id, agent_id: run.agent_id, agent_version: turn.agent_version, model: options.model, at: now, ...options.usage });
    }
    await this.r.store.updateTurnFenced(turn._id, this.host.epoch, final);
    this.storedFinal = { turnId: turn._id, turn: { ...turn, ...final }, now };
    this.turnEnded();
    if (this.session) this.session.push(...transcript);
    if (error) this.r.log.warn({ run_id: this.host.runId, turn_id: turn._id, code: error.code, reference: error.reference }, "turn ended with an error");
    if (run) await this.afterTurn(run, { ...turn, ...final }, now);
  }

  /** The turn's error for a save that failed: the default words, or what the tenant can mend. */
  private checkpointFailed(failure: CheckpointError): TurnError {
    // A tree the turn's tool commands made (the extension's), not the platform's failure.
    if (failure instanceof CheckpointUnrestorableError) return turnError("workspace_checkpoint_failed", { reference: this.r.ids.reference(), message: failure.message, source: "extension" });
    return turnError("workspace_checkpoint_failed", { reference: this.r.ids.reference() });
  }

  /** Saves the run's workspace; the failure when that failed (logged), else null. */
  private async saveCheckpoint(turn: TurnDoc): Promise<CheckpointError | null> {
    // Not prepared by this actor (the turn ended before, or had no tools): not its to save.
    if (!this.workspaceChecked) return null;
    try {
      const run = this.host.run;
      if (run) {
        // A save the object store did not answer in time (a JetStream timeout under load) is
        // tried again. One that was stored though its answer was lost then conflicts, and is
        // saved over below once this actor's ownership is confirmed.
        const save = (expected: number) =>
          withRetries(this.r.clock, () => this.r.checkpoints.save(run._id, workspaceDirOf(this.r.config.dataDir, run._id), run.checkpointed === true, run.workspace_id, expected), {
            attempts: 4,
            transient: isTransientCheckpointFailure,
          });
        let revision: number | undefined;
        try {
          revision = await save(this.checkpointRevision);
        } catch (err) {
          if (!(err instanceof CheckpointConflictError)) throw err;
          // The checkpoint changed since this actor read it. A newer owner claims the run
          // before it saves, so the write below fails if one did (FencedError: nothing of
          // this actor's replaces its checkpoint). Otherwise an older owner, paused while
          // the run moved here, saved late (or this actor's own last save was stored but
          // its answer lost); this actor's workspace is the run's, and it is saved over
          // that, once (a second conflict is a newer owner between the two: it fails).
          this.r.log.warn({ run_id: run._id, turn_id: turn._id, revision: err.current }, "the run's checkpoint changed since this owner read it: saving over it once ownership is confirmed");
          await this.r.store.updateRunFenced(run._id, this.host.epoch, { checkpointed: true });
          run.checkpointed = true;
          revision = await save(err.current);
        }
        if (revision !== undefined) {
          this.checkpointRevision = revision;
          if (!run.checkpointed) {
            await this.r.store.updateRunFenced(run._id, this.host.epoch, { checkpointed: true });
            run.checkpointed = true;
          }
        }
      }
      this.checkpointedTurnId = turn._id;
      return null;
    } catch (err) {
      if (!(err instanceof CheckpointError)) throw err;
      // A tree the tenant made unsavable is its to mend, not the service's failure.
      const level = err instanceof CheckpointUnrestorableError ? "warn" : "error";
      this.r.log[level]({ err, run_id: this.host.runId, turn_id: turn._id }, "workspace checkpoint failed");
      return err;
    }
  }

  // ---- waiting for a decision ----------------------------------------------------

  /**
   * The agent stopped at a gated call: the turn waits, holding nothing but a timer. What
   * it added so far, the workspace and the pending action are stored first (a new owner
   * restores the wait from them), then the request is announced.
   */
  private async parkOrSettle(execution: ActiveExecution, result: TurnRunResult): Promise<void> {
    const pause = result.pause!;
    const turn = execution.turn;
    const used = { usage: result.usage, model: execution.model };
    try {
      const failure = await this.whileTransient(turn, () => this.saveCheckpoint(turn));
      if (failure) {
        const error = this.checkpointFailed(failure);
        return await this.finishTurn(turn, TurnStatus.failed, [], closeToolCalls(result.transcript, "The call did not run: the turn failed first."), error, { ...used, checkpoint: false });
      }
      const now = this.r.clock.nowMs();
      const action = newAction(execution.approval!, { id: this.r.ids.action(), toolCallId: pause.toolCallId, tool: pause.tool, arguments: pause.arguments, assistantIndex: pause.assistantIndex }, now);
      const fitted = fitTurnDocument(turn.input, [], result.transcript);
      if (fitted.failure || fitted.compacted) {
        // A compacted transcript could not be resumed exactly: the turn fails instead of waiting.
        const error = turnError("agent_execution_failed", { reference: this.r.ids.reference(), message: fitted.failure ?? "The turn's transcript is too large to wait for a decision." });
        return await this.finishTurn(turn, TurnStatus.failed, [], closeToolCalls(result.transcript, "The call did not run: the turn failed first."), error, { ...used, checkpoint: false });
      }
      // Announced first, like a turn's start: an owner dying before the store below leaves an
      // in_progress turn without the action, which its successor interrupts (never a silent wait).
      this.host.emit(turn._id, "runtime", "tool.approval_requested", {
        action_id: action.id,
        tool_call_id: action.tool_call_id,
        tool: action.tool,
        arguments: action.arguments,
        expires_at: unixSeconds(action.expires_at),
      });
      await this.host.appender().flush();
      const set: Partial<TurnDoc> = { transcript: result.transcript, actions: [...(turn.actions ?? []), action], waiting_steers: pause.steers, waiting_usage: result.usage, waiting_model: execution.model };
      // Both writes are the same when repeated: a store away for a moment does not fail a
      // turn whose request was announced (failing it then would announce it twice).
      await this.whileTransient(turn, async () => {
        await this.r.store.updateTurnFenced(turn._id, this.host.epoch, set);
        const run = this.host.run;
        // The run says it waits too: lists find the runs waiting for a person (a new owner
        // marks it if this owner dies first: restoreWaiting).
        if (run) await this.markRunWaiting(run, turn, action);
      });
      Object.assign(turn, set);
      this.wait(turn, action, execution.model);
      this.r.log.info({ run_id: this.host.runId, turn_id: turn._id, action_id: action.id, tool: action.tool }, "turn waits for a decision");
      await this.recordActionWebhook(turn, action);
    } catch (err) {
      if (err instanceof FencedError) return this.host.stop("fenced");
      this.waiting?.timer.cancel();
      this.waiting = undefined;
      await this.settleUnstored(turn, err, used);
    }
  }

  /**
   * Holds the waiting turn and arms its deadline: the action's expiry or the turn's
   * wall-clock limit, whichever comes first. A deadline that cannot be applied (the store
   * away) is tried again.
   */
  private wait(turn: TurnDoc, action: ActionDoc, model: string, retryInMs?: number): void {
    this.waiting?.timer.cancel();
    const limitAt = (turn.started_at ?? this.r.clock.nowMs()) + this.r.config.turnLimitMs;
    const kind: "limit" | "expiry" = limitAt <= action.expires_at ? "limit" : "expiry";
    const at = retryInMs !== undefined ? this.r.clock.nowMs() + retryInMs : Math.min(action.expires_at, limitAt);
    const timer = this.r.clock.after(
      Math.max(0, at - this.r.clock.nowMs()),
      () => {
        // Counted until applied: the partition does not move in the middle of it.
        this.inFlight++;
        void this.host
          .enqueue(() => this.waitDeadline(action.id, kind))
          .catch((err) => {
            if (err instanceof FencedError) return this.host.stop("fenced");
            this.r.log.error({ err, run_id: this.host.runId, action_id: action.id }, "could not apply a waiting turn's deadline; trying again");
            if (this.waiting?.action.id === action.id && !this.host.stopped) this.wait(turn, action, model, 5_000);
          })
          .finally(() => this.inFlight--);
      },
      { keepAlive: false },
    );
    this.waiting = { turn, action, timer, model };
  }

  /**
   * A new owner finds a turn waiting for a decision: it waits here, nothing is re-run. One
   * decided but never resumed (its owner died or drained in between) goes on here.
   */
  async restoreWaiting(run: RunDoc, turn: TurnDoc): Promise<boolean> {
    if (turn.status !== TurnStatus.in_progress) return false;
    const unresumed = turn.actions?.find((a) => a.decision !== null && a.resumed_at === null);
    if (unresumed) {
      const waiting: WaitingTurn = { turn, action: unresumed, timer: { cancel: () => undefined }, model: turn.waiting_model ?? "unknown", decided: unresumed };
      this.waiting = waiting;
      this.r.log.info({ run_id: run._id, turn_id: turn._id, action_id: unresumed.id }, "resuming a turn decided before its owner changed");
      this.scheduleResume(run, waiting);
      return true;
    }
    const action = pendingActionOf(turn.actions);
    if (!action) return false;
    this.wait(turn, action, turn.waiting_model ?? "unknown");
    if (run.pending_action?.id !== action.id) {
      // Its owner died between storing the turn and marking the run: lists find it from now on.
      await this.markRunWaiting(run, turn, action);
    }
    this.r.log.info({ run_id: run._id, turn_id: turn._id, action_id: action.id }, "restored a turn waiting for a decision");
    // The owner may have died before recording the delivery (keyed: never twice).
    await this.recordActionWebhook(turn, action);
    return true;
  }

  /**
   * Marks the run as waiting for `action` (RunDoc.pending_action: what lists filter on),
   * then tells requests waiting for the turn, which answer 202 (it is not about to end).
   */
  private async markRunWaiting(run: RunDoc, turn: TurnDoc, action: ActionDoc): Promise<void> {
    const set = { pending_action: { id: action.id, turn_id: turn._id, tool: action.tool, expires_at: action.expires_at } };
    await this.r.store.updateRunFenced(run._id, this.host.epoch, set);
    Object.assign(run, set);
    this.notify(Subjects.turnWaiting(turn._id), "");
  }

  private async waitDeadline(actionId: string, kind: "limit" | "expiry"): Promise<void> {
    const waiting = this.waiting;
    const run = this.host.run;
    if (this.host.stopped || !waiting || waiting.action.id !== actionId || waiting.decided || !run) return;
    if (kind === "limit") {
      const decision = settleDecision("duration_limit", "aborted");
      return this.endWaiting(decision.status, turnError("turn_duration_limit", { reference: this.r.ids.reference() }), "The call did not run: the turn reached its time limit.");
    }
    await this.decided(run, expire(waiting.action, this.r.clock.nowMs()));
  }

  /**
   * A person decided (or the timeout did): the decision is stored and announced; the turn
   * goes on from the call that asked as the next work of the mailbox (the decision's answer
   * does not wait for the workspace to be restored). Until that work starts the agent, the
   * run counts as in flight (it does not move to another node half-way).
   */
  async decided(run: RunDoc, action: ActionDoc): Promise<void> {
    const waiting = this.waiting!;
    const turn = waiting.turn;
    // Stored decided and not yet resumed: a new owner resumes it (restoreWaiting).
    const decided: ActionDoc = { ...action, resumed_at: null };
    const actions = (turn.actions ?? []).map((a) => (a.id === action.id ? decided : a));
    await this.r.store.updateTurnFenced(turn._id, this.host.epoch, { actions });
    turn.actions = actions;
    waiting.timer.cancel();
    waiting.decided = decided;
    if (run.pending_action) {
      await this.r.store.updateRunFenced(run._id, this.host.epoch, { pending_action: null });
      run.pending_action = null;
    }
    this.host.emit(turn._id, "runtime", "tool.approval_decided", { action_id: action.id, tool_call_id: action.tool_call_id, decision: action.decision, reason: action.reason, decided_by: action.decided_by });
    this.r.log.info({ run_id: run._id, turn_id: turn._id, action_id: action.id, decision: action.decision, decided_by: action.decided_by }, "action decided");
    this.scheduleResume(run, waiting);
  }

  /**
   * The decided turn goes on as the next work of the mailbox. Until then it is still the
   * waiting turn (a cancel ends it, a steer joins its held input) and in flight (its
   * partition does not move).
   */
  private scheduleResume(run: RunDoc, waiting: WaitingTurn): void {
    this.inFlight++;
    void this.host
      .enqueue(() => this.resume(run, waiting))
      .catch((err) => this.r.log.error({ err, run_id: run._id, turn_id: waiting.turn._id }, "could not resume a decided turn"))
      .finally(() => this.inFlight--);
  }

  private async resume(run: RunDoc, waiting: WaitingTurn): Promise<void> {
    // Cancelled, stopped or removed meanwhile: nothing goes on.
    if (this.waiting !== waiting || this.host.stopped) return;
    // A draining node leaves it decided and not resumed: the next owner resumes it.
    if (this.r.node.draining) return;
    const turn = waiting.turn;
    const action = waiting.decided!;
    try {
      // Marked before the call can run: a new owner finding it marked does not run it again.
      const actions = (turn.actions ?? []).map((a) => (a.id === action.id ? { ...a, resumed_at: this.r.clock.nowMs() } : a));
      await this.r.store.updateTurnFenced(turn._id, this.host.epoch, { actions });
      turn.actions = actions;
      this.waiting = undefined;
      await this.execute(run, turn, {
        transcript: turn.transcript as AgentMessage[],
        assistantIndex: action.assistant_index,
        toolCallId: action.tool_call_id,
        decision: action.decision!,
        denial: denialText(action),
        // Kept on the turn until it stores more (a crash before then keeps them in its transcript).
        steers: turn.waiting_steers ?? [],
      });
    } catch (err) {
      if (err instanceof FencedError) return this.host.stop("fenced");
      this.waiting = undefined;
      await this.settleUnstored(turn, err, { usage: turn.waiting_usage, model: waiting.model });
    }
  }

  /** The turn whose events could not all be stored (its final write says so, retried or not). */
  private eventsLostBy: string | undefined;

  /** Work of the waiting turn not yet done (a deadline being applied, a decision being resumed). */
  private inFlight = 0;

  /** Whether nothing of a waiting turn is in flight on this node (its partition may move). */
  get settledForMove(): boolean {
    return this.inFlight === 0;
  }

  /**
   * Steering input a waiting turn keeps at most (inputs, and bytes of text together: they are
   * stored on the turn's document beside its transcript); past that a steer is refused (run_busy).
   */
  static readonly MAX_WAITING_STEERS = 100;
  static readonly MAX_WAITING_STEER_BYTES = 1024 * 1024;

  /** Steering input for the waiting turn: stored with it, delivered after the decision. Undefined when it holds too much. */
  async steerWaiting(steerId: string, text: string): Promise<TurnDoc | undefined> {
    const turn = this.waiting!.turn;
    const held = turn.waiting_steers ?? [];
    const bytes = held.reduce((sum, s) => sum + Buffer.byteLength(s), Buffer.byteLength(text));
    if (held.length >= TurnExecution.MAX_WAITING_STEERS || bytes > TurnExecution.MAX_WAITING_STEER_BYTES) return undefined;
    const set = { steer_ids: [...turn.steer_ids, steerId], waiting_steers: [...(turn.waiting_steers ?? []), text] };
    await this.r.store.updateTurnFenced(turn._id, this.host.epoch, set);
    Object.assign(turn, set);
    return turn;
  }

  /**
   * Ends the waiting turn without its call running (cancel, time limit). A write that
   * fails is settled like any finished turn's (settleUnstored): no run stays busy.
   */
  async endWaiting(status: TurnStatus, error: TurnError | null, unanswered: string): Promise<void> {
    const waiting = this.waiting!;
    waiting.timer.cancel();
    this.waiting = undefined;
    const turn = waiting.turn;
    const transcript = waitingTranscript(turn, unanswered, this.r.clock.nowMs());
    const used = { usage: turn.waiting_usage, model: waiting.model };
    // Its start was reported when the call asked: its end is reported too, never run.
    const call = waiting.decided ?? waiting.action;
    this.host.emit(turn._id, "runtime", "tool_execution_end", { toolCallId: call.tool_call_id, toolName: call.tool, result: { content: [{ type: "text", text: unanswered }], details: {} }, isError: true });
    try {
      // Nothing ran since the wait began, which saved the workspace.
      await this.finishTurn(turn, status, [], transcript, error, { checkpoint: false, ...used });
    } catch (err) {
      if (err instanceof FencedError) throw err;
      await this.settleUnstored(turn, err, used);
    }
  }

  /** The `turn.action_required` webhook delivery of a pending action (keyed by the action). */
  private async recordActionWebhook(turn: TurnDoc, action: ActionDoc): Promise<void> {
    const run = this.host.run;
    if (!run) return;
    try {
      await this.r.webhooks.enqueue(webhookEvent(run, "turn.action_required", action.id, { ...webhookData(renderRun(run, turn)), action: renderAction(action, run._id, turn._id) }));
    } catch (err) {
      this.r.log.error({ err, run_id: run._id, turn_id: turn._id, action_id: action.id }, "could not record the action's webhook deliveries");
    }
  }

  /**
   * After the active turn ended: record its final event, start the queued turn or go
   * idle, and only then tell waiters (they read the run when notified).
   */
  async afterTurn(run: RunDoc, finished: TurnDoc | null, now: number, options: { emitFinal?: boolean } = {}): Promise<void> {
    await this.host.settleAdmission(run);
    // The turn to start next: the queued one, or, when an earlier move-on wrote the run but
    // could not start that turn (a failed turn write; settleUnstored comes back here), the
    // one the run already names active.
    const nextId = run.queued_turn_id ?? (run.active_turn_id !== null && run.active_turn_id !== finished?._id ? run.active_turn_id : null);
    const queued = nextId ? await this.r.store.getTurn(nextId) : null;
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
    if (next) Object.assign(set, onVersion(run, next.agent_version));
    // Whatever it waited for ended with the turn.
    if (run.pending_action) set.pending_action = null;
    // The run's usage takes each final turn's once (this runs again after a failed write of the run).
    if (finished?.usage && run.usage_turn_id !== finished._id) {
      set.usage = addUsage(run.usage ?? NO_USAGE, finished.usage);
      set.usage_turn_id = finished._id;
    }
    // Once per turn, also when a failed write of the run makes settleUnstored come back here.
    const emitted = this.storedFinal?.turnId === finished?._id && this.storedFinal?.finalEmitted === true;
    // The run as this move-on leaves it (its event sequence is not shown): the final event,
    // the webhooks and the final notice all carry it.
    const view = finished ? renderRun({ ...run, ...set }, finished) : undefined;
    if (finished && !emitted && options.emitFinal !== false) {
      this.host.emit(finished._id, "platform", finalEventType(finished.status), { run: view });
      if (this.storedFinal?.turnId === finished._id) this.storedFinal.finalEmitted = true;
    }
    if (next) this.host.emit(next._id, "platform", "turn.started", { agent_version: next.agent_version });
    await this.host.appender().flush().catch((err) => this.r.log.warn({ err, run_id: run._id }, "event stream write failed"));
    set.event_seq = this.host.appender().nextSequence - 1;
    // Before the run moves on: until then a new owner finds the turn active and records them.
    if (finished) await this.recordWebhooks(run, finished, view!);
    if (this.r.at) await this.r.at("turn:run_moving_on", { runId: run._id, turnId: finished?._id });
    await this.r.store.updateRunFenced(run._id, this.host.epoch, set);
    Object.assign(run, set);
    if (finished) this.publishFinal(finished._id, view);
    if (next) {
      await this.r.store.updateTurnFenced(next._id, this.host.epoch, { status: TurnStatus.in_progress, started_at: now });
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
  turnEnded(): void {
    const counted = this.countedTurn;
    if (!counted) return;
    this.countedTurn = undefined;
    this.r.activeTurns.ended(counted.workspaceId, counted.turnId);
  }

  async loadSession(run: RunDoc): Promise<AgentMessage[]> {
    if (!this.session) {
      const turns = await this.r.store.listTurns(run._id, { withTranscript: true });
      this.session = turns.filter((t) => isFinalStatus(t.status)).flatMap((t) => t.transcript as AgentMessage[]);
    }
    return this.session;
  }

  /** The final turn's webhook deliveries (keyed by the turn: a repeat records nothing new). */
  async recordWebhooks(run: RunDoc, turn: TurnDoc, view: ReturnType<typeof renderRun>): Promise<void> {
    if (!isFinalStatus(turn.status)) return;
    try {
      await this.r.webhooks.enqueue(webhookEvent(run, finalEventType(turn.status) as WebhookEventType, turn._id, webhookData(view)));
    } catch (err) {
      // A store that is away is retried with the run's move-on; anything else must not
      // hold the run busy: the deliveries are lost, and said so.
      if (isTransientFailure(err)) throw err;
      this.r.log.error({ err, run_id: run._id, turn_id: turn._id, reference: this.r.ids.reference() }, "could not record the turn's webhook deliveries");
    }
  }

  /** Tells those waiting for the turn that it is final and the run moved on (src/final-notice.ts). */
  publishFinal(turnId: string, view?: RunView): void {
    // Within what the server takes, whatever it was configured with (nats.conf says 8 MB).
    const room = (this.r.nc.info?.max_payload ?? 1024 * 1024) - 1024;
    this.notify(Subjects.turnFinal(turnId), encodeFinalNotice(view, Math.min(FINAL_NOTICE_MAX_BYTES, room)));
  }

  /**
   * Publishes a notice of a turn. Its writes are stored by then: a notice that cannot be
   * sent (the connection closed) is logged, and whoever waits for it reads the store.
   */
  private notify(subject: string, payload: string): void {
    try {
      this.r.nc.publish(subject, payload);
    } catch (err) {
      this.r.log.warn({ err, subject }, "a turn notice could not be published; waiters read the store");
    }
  }
}

/**
 * What a turn that waited for a decision keeps when it ends without going on: what it
 * added, the call it waited for answered with `unanswered`, and the steering input it held.
 */
export function waitingTranscript(turn: TurnDoc, unanswered: string, nowMs: number): AgentMessage[] {
  return endedWithoutCall(turn.transcript as AgentMessage[], turn.waiting_steers ?? [], unanswered, nowMs);
}

/** `transcript` with its unanswered calls answered `unanswered`, then the steering input it held. */
function endedWithoutCall(transcript: AgentMessage[], steers: readonly string[], unanswered: string, nowMs: number): AgentMessage[] {
  const held = steers.map((text) => ({ role: "user" as const, content: [{ type: "text" as const, text }], timestamp: nowMs }));
  return [...closeToolCalls(transcript, unanswered), ...held];
}

/** A webhook event of the run, keyed by `eventKey` (a repeat records nothing new). */
function webhookEvent(run: RunDoc, type: WebhookEventType, eventKey: string, data: unknown) {
  return { workspaceId: run.workspace_id, agentId: run.agent_id, runId: run._id, partition: run.partition, type, eventKey, data };
}

/** The largest Run a webhook body carries whole; a larger one is sent without its input and output. */
export const MAX_WEBHOOK_RUN_BYTES = 256 * 1024;

/** A final turn's webhook data: the Run, or, when too large, the Run without the turn's input and output (`truncated`). */
export function webhookData(view: ReturnType<typeof renderRun>): { run: unknown; truncated?: true } {
  if (Buffer.byteLength(JSON.stringify(view)) <= MAX_WEBHOOK_RUN_BYTES) return { run: view };
  return { run: { ...view, turn: { ...view.turn, input: [], output: [] } }, truncated: true };
}
