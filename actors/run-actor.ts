import { mkdir, rm } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "pino";
import type { NatsConnection } from "@nats-io/transport-node";
import type { JetStreamManager } from "@nats-io/jetstream";
import type { EventLog } from "../src/event-log.js";
import type { AgentMessage } from "@mariozechner/pi-agent-core";
import type { Config } from "../src/config.js";
import type { Clock } from "../src/clock.js";
import type { CommandReply, RunCommand } from "../src/commands.js";
import { Disposition, RunState, TurnStatus, isFinalStatus, type InputPart, type TurnError } from "../src/domain.js";
import type { DeploymentDoc, RunDoc, TurnDoc } from "../src/documents.js";
import { FencedError, type MongoStore } from "../src/mongo-store.js";
import { Subjects } from "../src/nats.js";
import { Ids } from "../src/ids.js";
import { turnError } from "../src/turn-errors.js";
import { SteeringTargetEndedError, startTurn, type RunningTurn } from "./agent-runner.js";
import { nextVersionFor } from "./versions.js";

/** What every actor of a node shares. */
export interface ActorResources {
  config: Config;
  clock: Clock;
  store: MongoStore;
  nc: NatsConnection;
  jsm: JetStreamManager;
  events: EventLog;
  log: Logger;
  deployments: DeploymentCache;
}

/** Deployments are immutable once ready, so a node caches them by id. */
export class DeploymentCache {
  private readonly cache = new Map<string, DeploymentDoc>();
  constructor(private readonly store: MongoStore) {}

  async get(agentId: string, version: number): Promise<DeploymentDoc | null> {
    const id = `${agentId}:${version}`;
    const hit = this.cache.get(id);
    if (hit) return hit;
    const doc = await this.store.getDeployment(agentId, version);
    if (doc && doc.status === "ready") this.cache.set(id, doc);
    return doc;
  }
}

interface ActiveExecution {
  turnId: string;
  running: RunningTurn;
  /** Why the agent was aborted, when it was. */
  abortReason?: "cancel" | "duration_limit" | "shutdown";
  limitTimer: NodeJS.Timeout;
}

const ok = (reply: Omit<Extract<CommandReply, { ok: true }>, "ok">): CommandReply => ({ ok: true, ...reply });
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
  /** Agent session of the run: concatenated transcripts of its finished turns. */
  private session: AgentMessage[] | undefined;
  private stopped = false;
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
    return this.active === undefined && (this.run === null || this.run.state === RunState.idle);
  }

  get isStopped(): boolean {
    return this.stopped;
  }

  /** Runs `work` after everything already in the mailbox. */
  private enqueue<T>(work: () => Promise<T>): Promise<T> {
    const next = this.mailbox.then(work);
    this.mailbox = next.catch(() => undefined);
    return next;
  }

  command(cmd: RunCommand): Promise<CommandReply> {
    this.lastUsedMs = this.r.clock.nowMs();
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
      }
    });
  }

  /** Loads the run under this actor's epoch and finishes what a previous owner left. */
  recover(): Promise<void> {
    return this.enqueue(async () => {
      try {
        await this.activate();
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
    if (this.active) {
      this.active.abortReason = "shutdown";
      clearTimeout(this.active.limitTimer);
      this.active.running.abort();
    }
    this.r.log.info({ run_id: this.runId, reason }, "run actor stopped");
  }

  private async handle(cmd: RunCommand): Promise<CommandReply> {
    if (cmd.op === "start") return this.start(cmd);
    const run = await this.activate();
    if (!run || run.workspace_id !== cmd.workspace_id) return fail("run_not_found");
    switch (cmd.op) {
      case "continue":
        return this.continueRun(run, cmd);
      case "cancel":
        return this.cancel(run, cmd.turn_id);
      case "delete":
      case "tags":
        return fail("conflict", `operation ${cmd.op} is not available yet`);
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
    if (run.active_turn_id && !this.active) await this.recoverActiveTurn(run, run.active_turn_id);
    return this.run;
  }

  private async recoverActiveTurn(run: RunDoc, turnId: string): Promise<void> {
    const turn = await this.r.store.getTurn(turnId);
    const now = this.r.clock.nowMs();
    if (turn && !isFinalStatus(turn.status)) {
      const wasCancelling = turn.status === TurnStatus.cancelling;
      const status = wasCancelling ? TurnStatus.cancelled : TurnStatus.incomplete;
      const error = wasCancelling ? null : turnError("worker_execution_interrupted", { reference: Ids.reference() });
      await this.r.store.updateTurnFenced(turnId, this.epoch, {
        status,
        error,
        completed_at: now,
        duration_ms: turn.started_at ? now - turn.started_at : 0,
      });
      this.r.log.warn({ run_id: run._id, turn_id: turnId, status }, "turn interrupted by a lost owner");
      await this.afterTurn(run, now);
      this.publishFinal(turnId);
      return;
    }
    await this.afterTurn(run, now);
  }

  // ---- admission ----------------------------------------------------------------

  private async start(cmd: Extract<RunCommand, { op: "start" }>): Promise<CommandReply> {
    const existing = await this.activate();
    if (existing) {
      if (existing.workspace_id !== cmd.workspace_id) return fail("run_not_found");
      return ok({ run_id: existing._id, turn_id: cmd.turn_id, disposition: Disposition.created });
    }
    const now = this.r.clock.nowMs();
    const retentionS = this.r.config.retention.runS[cmd.plan];
    const turn: TurnDoc = {
      _id: cmd.turn_id,
      run_id: cmd.run_id,
      workspace_id: cmd.workspace_id,
      index: 0,
      status: TurnStatus.in_progress,
      agent_version: cmd.version,
      input: cmd.input,
      output: [],
      error: null,
      created_at: now,
      started_at: now,
      completed_at: null,
      duration_ms: null,
      transcript: [],
      epoch: this.epoch,
    };
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
    // The turn first: a run never points at a turn that is not stored.
    if (!(await this.r.store.getTurn(turn._id))) await this.r.store.insertTurn(turn);
    await this.r.store.insertRun(run);
    this.run = run;
    this.session = [];
    await this.execute(run, turn);
    return ok({ run_id: run._id, turn_id: turn._id, disposition: Disposition.created });
  }

  private async continueRun(run: RunDoc, cmd: Extract<RunCommand, { op: "continue" }>): Promise<CommandReply> {
    const known = await this.r.store.getTurn(cmd.turn_id);
    if (known && known.run_id === run._id) {
      const disposition = known.index === run.turn_count - 1 && known._id === run.queued_turn_id ? Disposition.queued : Disposition.continued;
      return ok({ run_id: run._id, turn_id: known._id, disposition });
    }
    const busy = run.state === RunState.busy;
    if (busy && cmd.on_busy === "reject") return fail("run_busy", "The run is busy and on_busy is reject.");
    if (busy && cmd.on_busy === "steer") return this.steer(run, cmd.input);
    if (busy && run.queued_turn_id) return fail("run_busy", "The run already has a queued turn.");

    const now = this.r.clock.nowMs();
    const version = await nextVersionFor(this.r.store, run);
    const turn: TurnDoc = {
      _id: cmd.turn_id,
      run_id: run._id,
      workspace_id: run.workspace_id,
      index: run.turn_count,
      status: busy ? TurnStatus.queued : TurnStatus.in_progress,
      agent_version: version,
      input: cmd.input,
      output: [],
      error: null,
      created_at: now,
      started_at: busy ? null : now,
      completed_at: null,
      duration_ms: null,
      transcript: [],
      epoch: this.epoch,
    };
    await this.r.store.insertTurn(turn);
    const set: Partial<RunDoc> = {
      turn_count: run.turn_count + 1,
      latest_turn_id: turn._id,
      last_activity_at: now,
      expires_at: now + run.retention_s * 1000,
      agent_version: version,
      versions: run.versions.includes(version) ? run.versions : [...run.versions, version],
    };
    if (busy) set.queued_turn_id = turn._id;
    else Object.assign(set, { state: RunState.busy, active_turn_id: turn._id });
    await this.r.store.updateRunFenced(run._id, this.epoch, { $set: set });
    Object.assign(run, set);
    if (!busy) await this.execute(run, turn);
    return ok({ run_id: run._id, turn_id: turn._id, disposition: busy ? Disposition.queued : Disposition.continued });
  }

  private async steer(run: RunDoc, input: InputPart[]): Promise<CommandReply> {
    const active = this.active;
    if (!active || active.abortReason) {
      return fail("steering_target_ended", undefined);
    }
    try {
      active.running.steer(inputText(input));
    } catch (err) {
      if (err instanceof SteeringTargetEndedError) return fail("steering_target_ended");
      throw err;
    }
    const now = this.r.clock.nowMs();
    await this.r.store.updateRunFenced(run._id, this.epoch, {
      $set: { last_activity_at: now, expires_at: now + run.retention_s * 1000 },
    });
    return ok({ run_id: run._id, turn_id: active.turnId, disposition: Disposition.steered });
  }

  // ---- cancellation ---------------------------------------------------------------

  private async cancel(run: RunDoc, turnId: string | undefined): Promise<CommandReply> {
    const targetId = turnId ?? run.active_turn_id ?? run.queued_turn_id ?? run.latest_turn_id;
    const turn = await this.r.store.getTurn(targetId);
    if (!turn || turn.run_id !== run._id) return fail("turn_not_found", undefined, "turn_id");
    if (isFinalStatus(turn.status)) return ok({ run_id: run._id, turn_id: turn._id });
    const now = this.r.clock.nowMs();
    if (turn.status === TurnStatus.queued) {
      await this.r.store.updateTurnFenced(turn._id, this.epoch, { status: TurnStatus.cancelled, completed_at: now, duration_ms: 0 });
      await this.r.store.updateRunFenced(run._id, this.epoch, { $set: { queued_turn_id: null } });
      run.queued_turn_id = null;
      this.publishFinal(turn._id);
      return ok({ run_id: run._id, turn_id: turn._id });
    }
    if (turn.status === TurnStatus.in_progress) {
      await this.r.store.updateTurnFenced(turn._id, this.epoch, { status: TurnStatus.cancelling });
      if (this.active?.turnId === turn._id) {
        this.active.abortReason = "cancel";
        this.active.running.abort();
      }
    }
    return ok({ run_id: run._id, turn_id: turn._id, http_status: 202 });
  }

  // ---- execution ------------------------------------------------------------------

  /** Starts the agent for an in_progress turn; completion comes back through the mailbox. */
  private async execute(run: RunDoc, turn: TurnDoc): Promise<void> {
    const deployment = await this.r.deployments.get(run.agent_id, turn.agent_version);
    if (!deployment || deployment.status !== "ready") {
      const error = turnError("agent_version_unavailable", { reference: Ids.reference() });
      await this.finishTurn(turn, TurnStatus.failed, [], [], error);
      return;
    }
    const session = await this.loadSession(run);
    const workspaceDir = path.join(this.r.config.dataDir, "workspaces", run._id);
    await mkdir(workspaceDir, { recursive: true });
    const running = startTurn({
      config: deployment.config,
      workspaceDir,
      history: session,
      input: turn.input,
      onEvent: () => undefined,
    });
    const limitTimer = setTimeout(() => {
      if (this.active?.turnId !== turn._id) return;
      this.active.abortReason = "duration_limit";
      running.abort();
    }, this.r.config.turnLimitMs);
    limitTimer.unref();
    const execution: ActiveExecution = { turnId: turn._id, running, limitTimer };
    this.active = execution;
    running.result.then(
      (result) => this.enqueue(() => this.onFinished(turn, execution, result)),
      (err) =>
        this.enqueue(() =>
          this.onFinished(turn, execution, {
            outcome: "failed",
            output: [],
            transcript: [],
            error: turnError("platform_failure", { reference: Ids.reference(), message: String(err) }),
          }),
        ),
    );
  }

  private async onFinished(
    turn: TurnDoc,
    execution: ActiveExecution,
    result: Awaited<RunningTurn["result"]>,
  ): Promise<void> {
    clearTimeout(execution.limitTimer);
    if (this.stopped || this.active !== execution) return;
    this.active = undefined;
    let status: TurnStatus;
    let error: TurnError | null = result.error ?? null;
    let output = result.output;
    if (result.outcome === "completed") {
      status = TurnStatus.completed;
      error = null;
    } else if (result.outcome === "failed") {
      status = TurnStatus.failed;
    } else if (execution.abortReason === "duration_limit") {
      status = TurnStatus.incomplete;
      error = turnError("turn_duration_limit", { reference: Ids.reference() });
    } else {
      status = TurnStatus.cancelled;
      error = null;
      output = [];
    }
    try {
      await this.finishTurn(turn, status, output, result.transcript as AgentMessage[], error);
    } catch (err) {
      if (err instanceof FencedError) this.stop("fenced");
      else this.r.log.error({ err, run_id: this.runId, turn_id: turn._id }, "could not store a finished turn");
    }
  }

  /** One fenced write makes the turn final, then the run moves on. */
  private async finishTurn(
    turn: TurnDoc,
    status: TurnStatus,
    output: TurnDoc["output"],
    transcript: AgentMessage[],
    error: TurnError | null,
  ): Promise<void> {
    const now = this.r.clock.nowMs();
    await this.r.store.updateTurnFenced(turn._id, this.epoch, {
      status,
      output,
      error,
      transcript,
      completed_at: now,
      duration_ms: now - (turn.started_at ?? now),
    });
    if (this.session) this.session.push(...transcript);
    if (error) this.r.log.warn({ run_id: this.runId, turn_id: turn._id, code: error.code, reference: error.reference }, "turn ended with an error");
    const run = this.run;
    if (run) await this.afterTurn(run, now);
    // Waiters read the run when notified: announce only once the run moved on too.
    this.publishFinal(turn._id);
  }

  /** After the active turn ended: start the queued turn, or go idle. */
  private async afterTurn(run: RunDoc, now: number): Promise<void> {
    const queuedId = run.queued_turn_id;
    const queued = queuedId ? await this.r.store.getTurn(queuedId) : null;
    if (queued && queued.status === TurnStatus.queued) {
      const set = { active_turn_id: queued._id, queued_turn_id: null, state: RunState.busy, last_activity_at: now, expires_at: now + run.retention_s * 1000 };
      await this.r.store.updateRunFenced(run._id, this.epoch, { $set: set });
      Object.assign(run, set);
      await this.r.store.updateTurnFenced(queued._id, this.epoch, { status: TurnStatus.in_progress, started_at: now });
      queued.status = TurnStatus.in_progress;
      queued.started_at = now;
      await this.execute(run, queued);
      return;
    }
    const set = { active_turn_id: null, queued_turn_id: null, state: RunState.idle, last_activity_at: now, expires_at: now + run.retention_s * 1000 };
    await this.r.store.updateRunFenced(run._id, this.epoch, { $set: set });
    Object.assign(run, set);
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

function inputText(input: InputPart[]): string {
  return input
    .map((part) => (part.type === "input_text" ? part.text : `[file ${part.filename ?? part.file_id ?? ""}]`))
    .join("\n");
}
