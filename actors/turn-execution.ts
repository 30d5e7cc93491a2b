/**
 * A run's turn execution on its owning actor: starting the agent for an in_progress
 * turn, and storing how it ended (one fenced write of the turn, then the run moves to
 * its next turn or goes idle, then waiters are told). It runs inside the actor's
 * mailbox (every method is called from it or enqueues itself there), so it shares
 * the actor's single-writer guarantee; {@link ExecutionHost} is what it may see and
 * do of the actor.
 */
import type { AgentMessage } from "@mariozechner/pi-agent-core";
import { type AbortReason, DeploymentStatus, type EventAppender, FencedError, finalEventType, type InputPart, isFinalStatus, renderRun, type RunDoc, RunState, settleDecision, Subjects, type TurnDoc, type TurnError, turnError, TurnStatus, type Timer, addUsage, hasUsage, modelLabel, NO_USAGE, type TurnUsage, type WebhookEventType, isTransientFailure } from "../src/index.js";
import { startTurn, type RunningTurn, type TurnRunResult } from "./agent-runner.js";
import { CheckpointError } from "./checkpoints.js";
import { apiKeyResolver } from "./credentials.js";
import type { ActorResources } from "./actor-resources.js";
import { prepareRunWorkspace, workspaceDirOf } from "./run-workspace.js";
import { fitTurnDocument } from "./transcript-bounds.js";
import { resolveFiles, withRetries } from "./turn-input.js";

export interface ActiveExecution {
  turn: TurnDoc;
  running: RunningTurn;
  /** Why the agent was aborted, when it was. */
  abortReason?: AbortReason;
  limitTimer: Timer;
  /** The deployment's model, as usage names it. */
  model: string;
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
  enqueue<T>(work: () => Promise<T>): Promise<T>;
  stop(reason: string): void;
  /** A finished turn could not be stored: the host recovers the run. */
  markUnsettled(): void;
}

export class TurnExecution {
  /** The turn whose agent runs on this node now. */
  active: ActiveExecution | undefined;
  /** Agent session of the run: concatenated transcripts of its finished turns. */
  session: AgentMessage[] | undefined;
  /** The last turn whose final write succeeded, for a retry of what follows it. */
  private storedFinal: { turnId: string; turn: TurnDoc; now: number; finalEmitted?: boolean } | undefined;
  /** The turn this actor counts as executing in its workspace (see ActiveTurns). */
  private countedTurn: { workspaceId: string; turnId: string } | undefined;

  constructor(private readonly host: ExecutionHost) {}

  private get r(): ActorResources {
    return this.host.r;
  }

  /**
   * Starts the agent for an in_progress turn; completion comes back through the
   * mailbox. Never throws: an admitted turn that cannot start ends failed instead of
   * staying in_progress with no agent behind it.
   */
  async execute(run: RunDoc, turn: TurnDoc): Promise<void> {
    // A stopped actor starts nothing: the partition's next owner recovers the turn.
    if (this.host.stopped) return;
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
    const workspaceDir = workspaceDirOf(this.r.config.dataDir, run._id);
    const preparation = await prepareRunWorkspace(this.r, run, workspaceDir);
    if (preparation) {
      await this.finishTurn(turn, TurnStatus.failed, [], [], turnError(preparation, { reference: this.r.ids.reference() }));
      return;
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
        if (!this.host.stopped) this.host.emit(turn._id, "runtime", event.type, event.data);
      },
    });
    const limitTimer = this.r.clock.after(
      this.r.config.turnLimitMs,
      () => {
        if (this.active?.turn._id !== turn._id) return;
        this.active.abortReason = "duration_limit";
        running.abort();
      },
      { keepAlive: false },
    );
    const execution: ActiveExecution = { turn, running, limitTimer, model: modelLabel(deployment.config.model) };
    this.active = execution;
    void running.result.then((result) => this.host.enqueue(() => this.onFinished(execution, result)));
  }

  private async onFinished(execution: ActiveExecution, result: TurnRunResult): Promise<void> {
    execution.limitTimer.cancel();
    // The agent stopped: the turn no longer executes here, whatever is stored next.
    if (this.countedTurn?.turnId === execution.turn._id) this.turnEnded();
    if (this.host.stopped || this.active !== execution) return;
    this.active = undefined;
    const decision = settleDecision(execution.abortReason, result.outcome);
    const status = decision.status;
    const output = decision.output === "agent" ? result.output : [];
    const error: TurnError | null =
      decision.error === "agent" ? (result.error ?? null) : decision.error === "none" ? null : turnError(decision.error, { reference: this.r.ids.reference() });
    try {
      await this.finishTurn(execution.turn, status, output, result.transcript as AgentMessage[], error, { usage: result.usage, model: execution.model });
    } catch (err) {
      if (err instanceof FencedError) this.host.stop("fenced");
      else await this.settleUnstored(execution.turn, err, { usage: result.usage, model: execution.model });
    }
  }

  /**
   * The finished turn (or the run after it) could not be stored. No run may stay busy
   * because a write failed: the turn is stored `failed` without its result, retried for
   * a while; if even that cannot be written (the store is down), the actor stops as
   * unsettled and the node recovers the run once the store answers (ActorHost.adoptOrphans).
   */
  private async settleUnstored(turn: TurnDoc, cause: unknown, used: { usage?: TurnUsage; model?: string } = {}): Promise<void> {
    const reference = this.r.ids.reference();
    this.r.log.error({ err: cause, run_id: this.host.runId, turn_id: turn._id, reference }, "could not store a finished turn; storing it as failed without its result");
    const error = turnError("platform_failure", { reference, message: "The turn finished, but its result could not be stored." });
    for (let attempt = 0; attempt < 5 && !this.host.stopped; attempt++) {
      try {
        const stored = this.storedFinal?.turnId === turn._id ? this.storedFinal : undefined;
        // The turn itself was stored: only the run's move to its next state is left.
        if (stored && this.host.run) await this.afterTurn(this.host.run, stored.turn, stored.now);
        else await this.finishTurn(turn, TurnStatus.failed, [], [], error, { checkpoint: false, ...used });
        return;
      } catch (err) {
        if (err instanceof FencedError) return this.host.stop("fenced");
        this.r.log.warn({ err, run_id: this.host.runId, turn_id: turn._id, attempt }, "storing the failed turn failed; retrying");
        await this.r.clock.sleep(500 * 2 ** attempt);
      }
    }
    this.host.markUnsettled();
    this.host.stop("a finished turn could not be stored");
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
      if (status === TurnStatus.completed) {
        status = TurnStatus.failed;
        error = turnError("event_stream_write_failed", { reference: this.r.ids.reference() });
      }
    }
    if (turn.started_at !== null && !this.host.stopped && options.checkpoint !== false) {
      try {
        const run = this.host.run;
        if (run && (await this.r.checkpoints.save(run._id, workspaceDirOf(this.r.config.dataDir, run._id), run.checkpointed === true, run.workspace_id)) && !run.checkpointed) {
          await this.r.store.updateRunFenced(run._id, this.host.epoch, { checkpointed: true });
          run.checkpointed = true;
        }
      } catch (err) {
        if (!(err instanceof CheckpointError)) throw err;
        this.r.log.error({ err, run_id: this.host.runId, turn_id: turn._id }, "workspace checkpoint failed");
        if (status === TurnStatus.completed) {
          status = TurnStatus.failed;
          error = turnError("workspace_checkpoint_failed", { reference: this.r.ids.reference() });
        }
      }
    }
    // The turn document must stay under the store's limit: a transcript too large even
    // compacted is not stored, and the turn fails rather than leaving the run busy.
    const fitted = fitTurnDocument(turn.input, output, transcript);
    if (fitted.compacted) this.r.log.warn({ run_id: this.host.runId, turn_id: turn._id }, "turn transcript compacted to fit its document");
    ({ output, transcript } = fitted);
    if (fitted.failure) {
      status = TurnStatus.failed;
      error = turnError("platform_failure", { reference: this.r.ids.reference(), message: fitted.failure });
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

  /**
   * After the active turn ended: record its final event, start the queued turn or go
   * idle, and only then tell waiters (they read the run when notified).
   */
  async afterTurn(run: RunDoc, finished: TurnDoc | null, now: number, options: { emitFinal?: boolean } = {}): Promise<void> {
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
    // The run's usage takes each final turn's once (this runs again after a failed write of the run).
    if (finished?.usage && run.usage_turn_id !== finished._id) {
      set.usage = addUsage(run.usage ?? NO_USAGE, finished.usage);
      set.usage_turn_id = finished._id;
    }
    // Once per turn, also when a failed write of the run makes settleUnstored come back here.
    const emitted = this.storedFinal?.turnId === finished?._id && this.storedFinal?.finalEmitted === true;
    if (finished && !emitted && options.emitFinal !== false) {
      this.host.emit(finished._id, "platform", finalEventType(finished.status), { run: renderRun({ ...run, ...set }, finished) });
      if (this.storedFinal?.turnId === finished._id) this.storedFinal.finalEmitted = true;
    }
    if (next) this.host.emit(next._id, "platform", "turn.started", { agent_version: next.agent_version });
    await this.host.appender().flush().catch((err) => this.r.log.warn({ err, run_id: run._id }, "event stream write failed"));
    set.event_seq = this.host.appender().nextSequence - 1;
    // Before the run moves on: until then a new owner finds the turn active and records them.
    if (finished) await this.recordWebhooks(run, finished, renderRun({ ...run, ...set }, finished));
    if (this.r.at) await this.r.at("turn:run_moving_on", { runId: run._id, turnId: finished?._id });
    await this.r.store.updateRunFenced(run._id, this.host.epoch, set);
    Object.assign(run, set);
    if (finished) this.publishFinal(finished._id);
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
      await this.r.webhooks.enqueue({
        workspaceId: run.workspace_id,
        agentId: run.agent_id,
        runId: run._id,
        partition: run.partition,
        type: finalEventType(turn.status) as WebhookEventType,
        eventKey: turn._id,
        data: webhookData(view),
      });
    } catch (err) {
      // A store that is away is retried with the run's move-on; anything else must not
      // hold the run busy: the deliveries are lost, and said so.
      if (isTransientFailure(err)) throw err;
      this.r.log.error({ err, run_id: run._id, turn_id: turn._id, reference: this.r.ids.reference() }, "could not record the turn's webhook deliveries");
    }
  }

  publishFinal(turnId: string): void {
    this.r.nc.publish(Subjects.turnFinal(turnId), "");
  }
}

/** The largest Run a webhook body carries whole; a larger one is sent without its input and output. */
export const MAX_WEBHOOK_RUN_BYTES = 256 * 1024;

/** A final turn's webhook data: the Run, or, when too large, the Run without the turn's input and output (`truncated`). */
export function webhookData(view: ReturnType<typeof renderRun>): { run: unknown; truncated?: true } {
  if (Buffer.byteLength(JSON.stringify(view)) <= MAX_WEBHOOK_RUN_BYTES) return { run: view };
  return { run: { ...view, turn: { ...view.turn, input: [], output: [] } }, truncated: true };
}
