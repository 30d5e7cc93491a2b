/**
 * `npm run chaos`: a bounded chaos run against the local cluster (scripts/cluster.ts: 3 NATS
 * servers, FerretDB, 3 runtime nodes with a 3 s lease). A few clients drive a steady mixed
 * load through the reference client (client/client.ts): starts (wait, background, stream),
 * continuations (queue, steer), cancels, tag edits, deletes, event streams that are cut and
 * resumed, and requests repeated on purpose with their Idempotency-Key. Meanwhile faults land
 * on a schedule: SIGKILL and restart of a node, SIGSTOP of a node past its lease then SIGCONT,
 * SIGKILL and restart of a NATS server, a store outage (FerretDB stopped, started again on its
 * port and data), and dropped client connections. Then the cluster is left to settle, every
 * run is read back through the API, and a ledger says what was sent, admitted and how every
 * turn ended, and counts what must never happen:
 *
 *   turns lost, turns executed twice, idempotency violations, event gaps or duplicates (and
 *   events listed out of sequence order), SSE resumes that skipped or repeated an event,
 *   5xx answers other than 503 with Retry-After.
 *
 * Exit status 1 when any of those is above zero (2 when the runner itself failed, 130 on
 * Ctrl-C). Results go to .chaos/<timestamp>/: ledger.json, summary.txt, problems.json,
 * faults.json, attempts.json, streams.json, runner.log and the cluster's logs (docs/cluster.md,
 * "Chaos run", says what each figure counts).
 *
 *   npm run chaos -- [--minutes 10] [--clients 4] [--fault-every 30] [--seed N] [--keep]
 *
 * Environment: CHAOS_MINUTES, CHAOS_CLIENTS, CHAOS_FAULT_EVERY_S, CHAOS_SEED (flags win).
 * Every loop is bounded in count and time, every request has a timeout, and only loopback
 * addresses are used.
 */
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { appendFileSync, mkdirSync } from "node:fs";
import { copyFile, readdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { jetstreamManager } from "@nats-io/jetstream";
import { RunsApiError, RunsClient, isFinalEventOf, type Run, type RunEvent } from "../client/index.js";
import { LEASES_BUCKET } from "../src/nats.js";
import { FAULT_LOAD_ENV, startCluster, type Cluster } from "./cluster.js";
import { seededRandom } from "./seeded-random.js";
import { FINAL_STATUSES, Recorder, buildLedger, summaryText, type CutReason, type RunReadback, type StreamLog } from "./chaos-ledger.js";

const PROJECT_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const LEASE_TTL_MS = 3_000;

// ---- options --------------------------------------------------------------------------

interface Options {
  minutes: number;
  clients: number;
  faultEveryS: number;
  seed: number;
  keep: boolean;
}

function flagValue(args: string[], name: string): string | undefined {
  const i = args.indexOf(`--${name}`);
  return i === -1 ? undefined : args[i + 1];
}

function parseOptions(args: string[], env: NodeJS.ProcessEnv): Options {
  const number = (flag: string, envName: string, fallback: number, min: number, max: number) => {
    const raw = flagValue(args, flag) ?? env[envName];
    const value = raw === undefined ? fallback : Number(raw);
    if (!Number.isFinite(value) || value < min || value > max) throw new Error(`--${flag} (${envName}) must be a number from ${min} to ${max}, got ${raw}`);
    return value;
  };
  return {
    minutes: number("minutes", "CHAOS_MINUTES", 10, 0.5, 120),
    clients: Math.round(number("clients", "CHAOS_CLIENTS", 4, 1, 32)),
    faultEveryS: number("fault-every", "CHAOS_FAULT_EVERY_S", 30, 10, 600),
    seed: Math.round(number("seed", "CHAOS_SEED", Date.now() % 1_000_000, 0, 2 ** 31)),
    keep: args.includes("--keep"),
  };
}

// ---- small utilities ------------------------------------------------------------------

/** Resolves after `ms`, or early when `signal` aborts (never rejects: loops check the signal). */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** `promise`, or `fallback` after `ms` (for calls that have no timeout of their own, such as KV reads). */
async function withTimeout<T>(promise: Promise<T>, ms: number, fallback: T): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<T>((resolve) => (timer = setTimeout(() => resolve(fallback), ms)));
  try {
    return await Promise.race([promise.catch(() => fallback), late]);
  } finally {
    clearTimeout(timer);
  }
}

const describe = (err: unknown) => (err instanceof RunsApiError ? `${err.status} ${err.code}` : err instanceof Error ? err.message : String(err));

// ---- output ---------------------------------------------------------------------------

/** The results folder and the runner's log (stderr and runner.log). */
class Output {
  readonly dir: string;
  private readonly began = Date.now();

  constructor(root: string) {
    const stamp = new Date().toISOString().replace(/[:.]/g, "-");
    this.dir = path.join(root, ".chaos", stamp);
    mkdirSync(this.dir, { recursive: true });
  }

  log(message: string): void {
    const line = `[chaos ${((Date.now() - this.began) / 1000).toFixed(0).padStart(4)}s] ${message}`;
    process.stderr.write(`${line}\n`);
    appendFileSync(path.join(this.dir, "runner.log"), `${new Date().toISOString()} ${line}\n`);
  }

  async json(name: string, value: unknown): Promise<void> {
    await writeFile(path.join(this.dir, name), `${JSON.stringify(value, null, 2)}\n`);
  }

  async text(name: string, value: string): Promise<void> {
    await writeFile(path.join(this.dir, name), value);
  }
}

// ---- transport: a load balancer in the client, and the record of every attempt ------------

/** Why a request is being made: the recorder files every attempt under it. */
interface OpContext {
  op: string;
  worker: number;
  /** Bound of one attempt (headers and body of a JSON answer; headers of a stream). */
  timeoutMs: number;
  /** Set for stream operations: every attempt of the context is a stream connection. */
  stream?: StreamLog;
  /** Cuts the stream connection being read, if one is open. */
  cut?: (reason: CutReason) => void;
  /** An attempt of this call met a fault (5xx, no answer, timeout or a dropped connection). */
  hitFault: boolean;
}

/** A stream that has not sent a byte (events or its 15 s ping) for this long is cut, as a stalled connection. */
const STREAM_IDLE_MS = 20_000;
/** Headers of a stream answer must arrive within this. */
const STREAM_HEADERS_MS = 20_000;
/** Share of keyed JSON requests whose connection the client drops mid-way, on purpose. */
const RANDOM_DROP_SHARE = 0.05;

/**
 * The chaos clients' `fetch`: picks a node per attempt (round robin over the nodes not known
 * to be down, as a load balancer with health checks would), bounds the attempt, records its
 * outcome, can drop it mid-way, and wraps stream bodies so a stalled or cut connection ends
 * as a read error, which the reference client answers by reconnecting with Last-Event-ID.
 */
class Transport {
  private next = 0;
  /** Nodes the balancer leaves out (killed, paused, restarting). */
  readonly down = new Set<number>();
  /** Attempts in flight (JSON) and stream connections being read, for the client-drop fault. */
  readonly inflight = new Set<{ ctx: OpContext; abort: (why: "dropped") => void }>();
  readonly openStreams = new Set<{ ctx: OpContext; cut: (reason: CutReason) => void }>();

  constructor(
    private readonly cluster: Cluster,
    private readonly rec: Recorder,
    private readonly random: () => number,
  ) {}

  client(ctx: OpContext): RunsClient {
    return new RunsClient({
      baseUrl: this.cluster.nodes[0].url,
      apiKey: this.cluster.key,
      // Patient, like a client that rides out a failover: Retry-After is 1–3 s, a lease moves in ~4 s.
      maxRetries: 6,
      maxStreamReconnects: 8,
      fetch: (input, init) => this.fetch(ctx, input, init),
    });
  }

  private pick(): number {
    const count = this.cluster.nodes.length;
    for (let i = 0; i < count; i++) {
      const node = this.next++ % count;
      if (!this.down.has(node)) return node;
    }
    return this.next++ % count;
  }

  private async fetch(ctx: OpContext, input: string, init: RequestInit): Promise<Response> {
    const node = this.pick();
    const url = new URL(input);
    url.host = new URL(this.cluster.nodes[node].url).host;
    const headers = new Headers(init.headers);
    const key = headers.get("idempotency-key") ?? undefined;
    const method = init.method ?? "GET";
    const attemptBase = { at: Date.now(), op: ctx.op, method, path: url.pathname, node, key };
    const controller = new AbortController();
    let why: "timeout" | "dropped" | undefined;
    const abort = (reason: "timeout" | "dropped") => {
      why ??= reason;
      controller.abort(new Error(`chaos: ${reason}`));
    };
    const onCaller = () => controller.abort(init.signal?.reason);
    init.signal?.addEventListener("abort", onCaller, { once: true });
    const timer = setTimeout(() => abort("timeout"), ctx.stream ? STREAM_HEADERS_MS : ctx.timeoutMs);
    const entry = { ctx, abort };
    this.inflight.add(entry);
    let dropTimer: NodeJS.Timeout | undefined;
    if (key && !ctx.stream && this.random() < RANDOM_DROP_SHARE) {
      // The answer may or may not have been written yet: the retry must get the same result either way.
      dropTimer = setTimeout(() => {
        this.rec.drops.push({ at: Date.now(), op: ctx.op, key, node });
        abort("dropped");
      }, 2 + Math.floor(this.random() * 80));
    }
    let streaming = false;
    try {
      const res = await fetch(url, { ...init, headers, signal: controller.signal });
      if (ctx.stream && res.ok) {
        clearTimeout(timer);
        const resumedWith = headers.has("last-event-id") ? "last-event-id" : url.searchParams.has("after") ? "after" : "none";
        ctx.stream.connections.push({ at: Date.now(), node, status: res.status, resumedWith });
        this.rec.attempt({ ...attemptBase, ms: Date.now() - attemptBase.at, outcome: res.status });
        if (res.status === 204 || !res.body) return res;
        streaming = true;
        return new Response(this.guard(ctx, res.body, controller), { status: res.status, headers: res.headers });
      }
      const text = await res.text();
      const retryAfter = res.headers.get("retry-after") ?? undefined;
      let body: any;
      try {
        body = text ? JSON.parse(text) : undefined;
      } catch {
        body = undefined;
      }
      const code = res.ok ? undefined : body?.error?.code;
      this.rec.attempt({ ...attemptBase, ms: Date.now() - attemptBase.at, outcome: res.status, retryAfter, code });
      if (res.status >= 500) ctx.hitFault = true;
      if (key) this.rec.keyedAnswer(key, { at: Date.now(), op: ctx.op, status: res.status, identity: res.ok ? identityOf(method, body) : undefined, code, repeat: ctx.op.startsWith("repeat.") });
      const nullBody = res.status === 204 || res.status === 304;
      return new Response(nullBody ? null : text, { status: res.status, statusText: res.statusText, headers: res.headers });
    } catch (err) {
      if (!init.signal?.aborted) {
        this.rec.attempt({ ...attemptBase, ms: Date.now() - attemptBase.at, outcome: why ?? "network" });
        ctx.hitFault = true;
      }
      throw err;
    } finally {
      clearTimeout(timer);
      clearTimeout(dropTimer);
      this.inflight.delete(entry);
      if (!streaming) init.signal?.removeEventListener("abort", onCaller);
    }
  }

  /**
   * The body of a stream answer, passed through until it ends, stalls for STREAM_IDLE_MS, or
   * is cut (ctx.cut): then it fails like a reset connection and the real connection is closed.
   */
  private guard(ctx: OpContext, source: ReadableStream<Uint8Array>, connection: AbortController): ReadableStream<Uint8Array> {
    const reader = source.getReader();
    const stream = ctx.stream!;
    let out!: ReadableStreamDefaultController<Uint8Array>;
    let finished = false;
    let idle: NodeJS.Timeout | undefined;
    const entry = { ctx, cut: (reason: CutReason) => cut(reason) };
    const finish = () => {
      finished = true;
      clearTimeout(idle);
      this.openStreams.delete(entry);
      if (ctx.cut === entry.cut) ctx.cut = undefined;
    };
    const cut = (reason: CutReason) => {
      if (finished) return;
      finish();
      stream.cuts.push({ at: Date.now(), reason, conn: stream.connections.length - 1 });
      ctx.hitFault = true;
      out.error(new Error(`chaos: connection cut (${reason})`));
      connection.abort(new Error(`chaos: cut (${reason})`));
      reader.cancel().catch(() => undefined);
    };
    const arm = () => {
      clearTimeout(idle);
      idle = setTimeout(() => cut("idle"), STREAM_IDLE_MS);
    };
    this.openStreams.add(entry);
    ctx.cut = entry.cut;
    return new ReadableStream<Uint8Array>({
      start(controller) {
        out = controller;
        arm();
      },
      async pull(controller) {
        try {
          const { done, value } = await reader.read();
          if (finished) return;
          if (done) {
            finish();
            controller.close();
            return;
          }
          arm();
          controller.enqueue(value);
        } catch (err) {
          if (finished) return;
          finish();
          controller.error(err);
        }
      },
      cancel(reason) {
        finish();
        return reader.cancel(reason).catch(() => undefined);
      },
    });
  }
}

/** What a keyed 2xx answer named: the run and turn (start, continue, cancel) or the deleted run. */
function identityOf(method: string, body: any): string | undefined {
  if (method === "DELETE") return body?.id ? `run ${body.id} deleted` : undefined;
  if (body?.object === "run" && body.turn?.id) return `run ${body.id} turn ${body.turn.id}`;
  return undefined;
}

// ---- the load -------------------------------------------------------------------------

/** The agents the load uses: each turn takes a few seconds, so faults land on turns in flight. */
interface Agents {
  /** A bash tool call `sleep 2`, then a text. */
  sleeper: string;
  /** A paced echo (20 tokens/s): ~3 s of text deltas for a 240-character input. */
  streamer: string;
}

const STREAMER_INPUT = "chaos ".repeat(40).trim();

/**
 * A turn's input names the Idempotency-Key it was sent with, so the readback can tell two
 * turns made for one key even when the client never saw the second answer.
 */
function inputFor(agent: keyof Agents, key: string): string {
  return agent === "streamer" ? `${key} ${STREAMER_INPUT}` : `${key} sleep`;
}

interface OwnedRun {
  id: string;
  agent: keyof Agents;
  turns: string[];
  lastTurnAt: number;
  tags: Set<string>;
  /** Keyed calls on this run still to be repeated: the run is not deleted meanwhile. */
  pendingRepeats: number;
}

interface Repeat {
  at: number;
  runId?: string;
  afterFault: boolean;
  run: () => Promise<void>;
}

/** What a logical call ended with, for the recorder. */
function resultOf(err: unknown): { refused: string } | { failed: string } {
  if (err instanceof RunsApiError && err.status > 0 && err.status < 500 && err.status !== 429) return { refused: `${err.status} ${err.code}` };
  if (err instanceof RunsApiError) return { failed: `${err.status} ${err.code}` };
  return { failed: err instanceof Error && /timeout|abort/i.test(`${err.name} ${err.message}`) ? "no answer (timeout)" : "no answer" };
}

const TAGS = ["chaos", "red", "green", "blue", "slow", "fast"];
/** Bound of one logical call, retries included; the attempt bounds are below it. */
const CALL_DEADLINE_MS = 120_000;

/**
 * One client: a sequential loop of operations on its own runs (so a delete never races its
 * own continuation), with think time between them, and the repeats it owes.
 */
class Worker {
  private readonly runs: OwnedRun[] = [];
  private readonly repeats: Repeat[] = [];

  constructor(
    readonly index: number,
    private readonly h: Harness,
  ) {}

  async loop(stop: AbortSignal): Promise<void> {
    for (let i = 0; i < 100_000 && !stop.aborted; i++) {
      const due = this.repeats.findIndex((r) => r.at <= Date.now());
      if (due !== -1) {
        const [repeat] = this.repeats.splice(due, 1);
        await repeat.run().catch((err) => this.h.out.log(`client ${this.index}: repeat failed unexpectedly: ${describe(err)}`));
      } else {
        await this.step().catch((err) => this.h.out.log(`client ${this.index}: operation failed unexpectedly: ${describe(err)}`));
      }
      await sleep(300 + Math.floor(this.h.random() * 600), stop);
    }
  }

  /** Runs the repeats still owed (after the load stopped), so every key gets its second answer. */
  async drainRepeats(deadline: number): Promise<void> {
    for (let i = 0; i < 1_000 && this.repeats.length > 0 && Date.now() < deadline; i++) {
      const repeat = this.repeats.shift()!;
      await sleep(Math.max(0, Math.min(repeat.at - Date.now(), 5_000)));
      await repeat.run().catch(() => undefined);
    }
  }

  private async step(): Promise<void> {
    const r = this.h.random();
    const live = this.runs.length;
    if (live < 2 || r < 0.16) return this.start("background");
    if (r < 0.24) return this.start("wait");
    if (r < 0.34) return this.start("stream");
    if (r < 0.48) return this.continue("queue");
    if (r < 0.56) return this.continue("steer");
    if (r < 0.64) return this.cancel();
    if (r < 0.72) return this.tags();
    if (r < 0.78 || live > 15) return this.delete();
    return this.watch();
  }

  private ctx(op: string, timeoutMs: number, stream?: StreamLog): OpContext {
    return { op, worker: this.index, timeoutMs, stream, hitFault: false };
  }

  private pickRun(recentFirst: boolean): OwnedRun | undefined {
    if (this.runs.length === 0) return undefined;
    if (recentFirst && this.h.random() < 0.7) return [...this.runs].sort((a, b) => b.lastTurnAt - a.lastTurnAt)[0];
    return this.runs[Math.floor(this.h.random() * this.runs.length)];
  }

  private track(run: Run, agent: keyof Agents): void {
    let owned = this.runs.find((o) => o.id === run.id);
    if (!owned) this.runs.push((owned = { id: run.id, agent, turns: [], lastTurnAt: 0, tags: new Set(run.tags), pendingRepeats: 0 }));
    if (!owned.turns.includes(run.turn.id)) owned.turns.push(run.turn.id);
    owned.lastTurnAt = Date.now();
  }

  private admitted(run: Run, op: string): void {
    this.h.rec.admit({ runId: run.id, turnId: run.turn.id, at: Date.now(), op, worker: this.index });
  }

  /**
   * Owes a repeat of a keyed call, always when it met a fault (the case idempotency is for),
   * otherwise now and then; 2–8 s later, so it often lands after the fault is over.
   */
  private maybeRepeat(ctx: OpContext, failed: boolean, runId: string | undefined, again: () => Promise<void>): void {
    const afterFault = ctx.hitFault || failed;
    if (!afterFault && this.h.random() >= 0.12) return;
    const owned = runId ? this.runs.find((o) => o.id === runId) : undefined;
    if (owned) owned.pendingRepeats++;
    this.repeats.push({
      at: Date.now() + 2_000 + Math.floor(this.h.random() * 6_000),
      runId,
      afterFault,
      run: async () => {
        this.h.rec.repeats.onPurpose++;
        if (afterFault) this.h.rec.repeats.afterFault++;
        try {
          await again();
        } finally {
          if (owned) owned.pendingRepeats--;
        }
      },
    });
  }

  private async start(delivery: "background" | "wait" | "stream"): Promise<void> {
    const agent: keyof Agents = this.h.random() < 0.5 ? "sleeper" : "streamer";
    const tags = this.h.random() < 0.3 ? [TAGS[Math.floor(this.h.random() * TAGS.length)]] : undefined;
    const key = `chaos-${randomUUID()}`;
    const request = { agent: this.h.agents[agent], input: inputFor(agent, key), ...(tags ? { tags } : {}) };
    if (delivery === "stream") return this.stream(`start.stream`, key, request, agent);
    const body = delivery === "background" ? { ...request, background: true } : request;
    const op = `start.${delivery}`;
    const call = async (opName: string, ctx: OpContext) => {
      try {
        const run = await this.h.transport.client(ctx).createRun(body, { idempotencyKey: key, signal: AbortSignal.timeout(CALL_DEADLINE_MS) });
        this.h.rec.operation(opName, { ok: true });
        this.admitted(run, opName);
        this.track(run, agent);
        return run;
      } catch (err) {
        this.h.rec.operation(opName, resultOf(err));
        return undefined;
      }
    };
    const ctx = this.ctx(op, delivery === "wait" ? 40_000 : 25_000);
    const run = await call(op, ctx);
    this.maybeRepeat(ctx, !run, run?.id, async () => void (await call(`repeat.${op}`, this.ctx(`repeat.${op}`, 40_000))));
  }

  private async continue(onBusy: "queue" | "steer"): Promise<void> {
    const owned = this.pickRun(true);
    if (!owned) return this.start("background");
    const background = this.h.random() < 0.75;
    const key = `chaos-${randomUUID()}`;
    const body = { run_id: owned.id, input: inputFor(owned.agent, key), on_busy: onBusy, ...(background ? { background: true } : {}) };
    const op = `continue.${onBusy}`;
    const call = async (opName: string, ctx: OpContext) => {
      try {
        const run = await this.h.transport.client(ctx).createRun(body, { idempotencyKey: key, signal: AbortSignal.timeout(CALL_DEADLINE_MS) });
        this.h.rec.operation(opName, { ok: true });
        this.admitted(run, opName);
        this.track(run, owned.agent);
        return run;
      } catch (err) {
        this.h.rec.operation(opName, resultOf(err));
        return undefined;
      }
    };
    const ctx = this.ctx(op, background ? 25_000 : 40_000);
    const run = await call(op, ctx);
    this.maybeRepeat(ctx, !run, owned.id, async () => void (await call(`repeat.${op}`, this.ctx(`repeat.${op}`, 40_000))));
  }

  private async cancel(): Promise<void> {
    const owned = this.pickRun(true);
    if (!owned) return;
    const key = `chaos-${randomUUID()}`;
    const call = async (opName: string, ctx: OpContext) => {
      try {
        await this.h.transport.client(ctx).cancelRun(owned.id, { idempotencyKey: key, signal: AbortSignal.timeout(CALL_DEADLINE_MS) });
        this.h.rec.operation(opName, { ok: true });
        return true;
      } catch (err) {
        this.h.rec.operation(opName, resultOf(err));
        return false;
      }
    };
    const ctx = this.ctx("cancel", 25_000);
    const ok = await call("cancel", ctx);
    this.maybeRepeat(ctx, !ok, owned.id, async () => void (await call("repeat.cancel", this.ctx("repeat.cancel", 25_000))));
  }

  /** Set semantics: the answer must list what was added and not what was removed. */
  private async tags(): Promise<void> {
    const owned = this.pickRun(false);
    if (!owned) return;
    const add = TAGS[Math.floor(this.h.random() * TAGS.length)];
    const remove = TAGS.filter((t) => t !== add)[Math.floor(this.h.random() * (TAGS.length - 1))];
    const ctx = this.ctx("tags", 25_000);
    try {
      const answer = await this.h.transport.client(ctx).updateTags(owned.id, { add: [add], remove: [remove] }, { signal: AbortSignal.timeout(CALL_DEADLINE_MS) });
      this.h.rec.operation("tags", { ok: true });
      if (!answer.tags.includes(add) || answer.tags.includes(remove)) this.h.notes.push(`tags of ${owned.id}: added ${add}, removed ${remove}, answer ${JSON.stringify(answer.tags)}`);
      owned.tags = new Set(answer.tags);
    } catch (err) {
      this.h.rec.operation("tags", resultOf(err));
    }
  }

  /**
   * Deletes an idle run that owes no repeat. Its turns and events are read first (the run is
   * idle and only this client touches it): after the delete they are gone, and the ledger
   * checks the copy instead.
   */
  private async delete(): Promise<void> {
    const candidates = this.runs.filter((o) => o.pendingRepeats === 0 && Date.now() - o.lastTurnAt > 8_000);
    const owned = candidates[Math.floor(this.h.random() * candidates.length)];
    if (!owned) return this.watch();
    const snapshot = await this.h.readRun(owned.id, "delete.read", this.index);
    if (snapshot.error || snapshot.turns.some((t) => !FINAL_STATUSES.has(t.status))) return;
    const key = `chaos-${randomUUID()}`;
    const call = async (opName: string, ctx: OpContext) => {
      try {
        await this.h.transport.client(ctx).deleteRun(owned.id, { idempotencyKey: key, signal: AbortSignal.timeout(CALL_DEADLINE_MS) });
        this.h.rec.operation(opName, { ok: true });
        return true;
      } catch (err) {
        this.h.rec.operation(opName, resultOf(err));
        // Gone all the same (an earlier attempt deleted it): no further work on it.
        if (err instanceof RunsApiError && err.status === 404 && this.runs.includes(owned)) this.runs.splice(this.runs.indexOf(owned), 1);
        return false;
      }
    };
    const ctx = this.ctx("delete", 25_000);
    const ok = await call("delete", ctx);
    // Kept whatever the answer: if the delete landed although its answer was lost, the readback finds the run gone.
    this.h.deletedSnapshots.set(owned.id, { ...snapshot, deleted: true });
    if (ok) this.runs.splice(this.runs.indexOf(owned), 1);
    this.maybeRepeat(ctx, !ok, undefined, async () => {
      const again = await call("repeat.delete", this.ctx("repeat.delete", 25_000));
      if (again && this.runs.includes(owned)) this.runs.splice(this.runs.indexOf(owned), 1);
    });
  }

  /** Follows a recent turn's events to its end (GET …/events?stream=true&turn_id=). */
  private async watch(): Promise<void> {
    const owned = this.pickRun(true);
    if (!owned || owned.turns.length === 0) return this.start("background");
    const turnId = owned.turns[owned.turns.length - 1];
    const stream = this.h.rec.stream({ op: "watch", worker: this.index, runId: owned.id, turnId, startedAt: Date.now() });
    const ctx = this.ctx("watch", 25_000, stream);
    const deadline = AbortSignal.timeout(CALL_DEADLINE_MS);
    const events = this.h.transport.client(ctx).streamEvents(owned.id, { turnId, signal: deadline });
    await this.consume(ctx, events, deadline);
    this.h.rec.operation("watch", stream.end === "final" || stream.end === "closed" ? { ok: true } : { failed: stream.error ?? stream.end ?? "?" });
  }

  /** POST /api/v1/runs with stream: true, read to the turn's final event (some streams are cut on purpose). */
  private async stream(op: string, key: string, request: Record<string, unknown>, agent: keyof Agents): Promise<void> {
    const stream = this.h.rec.stream({ op, worker: this.index, key, startedAt: Date.now() });
    const ctx = this.ctx(op, 25_000, stream);
    const deadline = AbortSignal.timeout(CALL_DEADLINE_MS);
    const events = this.h.transport.client(ctx).streamRun(request as never, { idempotencyKey: key, signal: deadline });
    await this.consume(ctx, events, deadline);
    const admitted = stream.runId !== undefined && stream.turnId !== undefined;
    if (admitted) {
      const run = { id: stream.runId!, turn: { id: stream.turnId! }, tags: [] } as unknown as Run;
      this.h.rec.keyedAnswer(key, { at: Date.now(), op, status: 200, identity: `run ${run.id} turn ${run.turn.id}`, repeat: false });
      this.admitted(run, op);
      this.track(run, agent);
    }
    this.h.rec.operation(op, admitted ? { ok: true } : resultOf(stream.error ?? new Error(stream.end)));
    // A repeat of the same streamed POST: the same key must name the same turn (its first event says which).
    this.maybeRepeat(ctx, !admitted, stream.runId, async () => {
      const again = this.ctx(`repeat.${op}`, 25_000, this.h.rec.stream({ op: `repeat.${op}`, worker: this.index, key, startedAt: Date.now() }));
      const signal = AbortSignal.timeout(60_000);
      await this.consume(again, this.h.transport.client(again).streamRun(request as never, { idempotencyKey: key, signal }), signal);
      const s = again.stream!;
      if (s.runId && s.turnId) {
        this.h.rec.keyedAnswer(key, { at: Date.now(), op: `repeat.${op}`, status: 200, identity: `run ${s.runId} turn ${s.turnId}`, repeat: true });
        this.admitted({ id: s.runId, turn: { id: s.turnId } } as unknown as Run, `repeat.${op}`);
        if (!admitted) this.track({ id: s.runId, turn: { id: s.turnId }, tags: [] } as unknown as Run, agent);
        this.h.rec.operation(`repeat.${op}`, { ok: true });
      } else {
        this.h.rec.operation(`repeat.${op}`, resultOf(s.error ?? new Error(s.end)));
      }
    });
  }

  /**
   * Reads a stream to its end, noting each event with the connection it came on. About 40%
   * of streams are cut once on purpose after a few events (a dropped client connection);
   * the reference client reconnects with Last-Event-ID.
   */
  private async consume(ctx: OpContext, events: AsyncGenerator<RunEvent>, deadline: AbortSignal): Promise<void> {
    const stream = ctx.stream!;
    const cutAfter = this.h.random() < 0.4 ? 1 + Math.floor(this.h.random() * 8) : undefined;
    let count = 0;
    let lastId: string | undefined;
    try {
      for (let resume = 0; resume < 4; resume++) {
        try {
          for await (const event of events) {
            count++;
            lastId = event.id;
            stream.events.push({ seq: event.sequence, type: event.type, conn: stream.connections.length - 1, at: Date.now() });
            if (stream.turnId === undefined && event.turn_id) {
              stream.turnId = event.turn_id;
              stream.runId = event.run_id;
            }
            if (isFinalEventOf(event, stream.turnId)) stream.end = "final";
            if (count === cutAfter && stream.end !== "final") ctx.cut?.("injected");
            if (count > 10_000) break;
          }
          stream.end ??= "closed";
          return;
        } catch (err) {
          if (err instanceof RunsApiError) this.h.rec.streamErrors.push({ at: Date.now(), stream: stream.id, status: err.status, code: err.code });
          // The reference client resumes a retryable `event: error` (503) itself, a bounded
          // number of times; one that still ends the stream is resumed here after the last
          // event received (so the ledger's error-frame count sees only those).
          const retryable = err instanceof RunsApiError && err.status === 503;
          if (!retryable || deadline.aborted || resume === 3 || !stream.runId || !stream.turnId) throw err;
          await sleep(Math.min(3_000, 1_000 * Math.max(1, (err as RunsApiError).retryAfterS ?? 1)), deadline);
          events = this.h.transport.client(ctx).streamEvents(stream.runId, { turnId: stream.turnId, after: lastId, signal: deadline });
        }
      }
    } catch (err) {
      stream.end = deadline.aborted ? "deadline" : "error";
      stream.error = describe(err);
    } finally {
      stream.endedAt = Date.now();
    }
  }
}

// ---- faults ---------------------------------------------------------------------------

type HeavyFault = "node-kill" | "nats-kill" | "node-pause" | "store-outage";
const FAULT_CYCLE: HeavyFault[] = ["node-kill", "nats-kill", "node-pause", "store-outage"];

/** Injects the faults on a schedule: a heavy fault every `spacingMs`, a client drop halfway between. */
class Faults {
  private count: Record<string, number> = {};

  constructor(private readonly h: Harness) {}

  async loop(stop: AbortSignal, warmupMs: number, spacingMs: number, lastAt: number): Promise<void> {
    await sleep(warmupMs, stop);
    for (let i = 0; i < 1_000 && !stop.aborted && Date.now() < lastAt; i++) {
      const heavyAt = Date.now() + spacingMs;
      await this.inject(FAULT_CYCLE[i % FAULT_CYCLE.length]);
      const dropAt = Date.now() + Math.max(0, (heavyAt - Date.now()) / 2);
      await sleep(Math.max(0, dropAt - Date.now()), stop);
      if (stop.aborted || Date.now() >= lastAt) break;
      await this.clientDrop(stop);
      await sleep(Math.max(0, heavyAt - Date.now()), stop);
    }
  }

  private async inject(kind: HeavyFault): Promise<void> {
    const n = (this.count[kind] = (this.count[kind] ?? 0) + 1);
    try {
      if (kind === "node-kill") await this.nodeKill();
      else if (kind === "node-pause") await this.nodePause();
      else if (kind === "nats-kill") await this.natsKill(n);
      else await this.storeOutage(n);
    } catch (err) {
      this.h.out.log(`fault ${kind} failed: ${describe(err)}`);
      this.h.notes.push(`fault ${kind} #${n} failed: ${describe(err)}`);
    }
    await this.h.restoreAll();
    const last = this.h.rec.faults.at(-1);
    if (last && last.kind === kind) last.recoveredAt = Date.now();
  }

  /**
   * The owner of a turn admitted in the last few seconds (a turn in flight), else any node
   * with one of the known runs it owns, so the fault's effect on a partition can be checked.
   */
  private async victim(): Promise<{ node: number; runId?: string }> {
    const known = [...this.h.rec.admitted.values()];
    for (const turn of known.filter((t) => Date.now() - t.at < 4_000).slice(-6).reverse()) {
      const owner = await withTimeout(this.h.cluster.ownerOf(turn.runId), 2_000, undefined);
      if (owner !== undefined) return { node: owner, runId: turn.runId };
    }
    const node = Math.floor(this.h.random() * this.h.cluster.nodes.length);
    for (const turn of known.slice(-40).reverse().slice(0, 15)) {
      if (this.h.deletedSnapshots.has(turn.runId)) continue;
      if ((await withTimeout(this.h.cluster.ownerOf(turn.runId), 1_000, undefined)) === node) return { node, runId: turn.runId };
    }
    return { node };
  }

  /** Polls (bounded) until the run's partition lease is held by another node than `from`: that node, and when. */
  private async moved(runId: string, from: number, timeoutMs: number): Promise<{ owner: number; at: number } | undefined> {
    const deadline = Date.now() + timeoutMs;
    for (let i = 0; i < 200 && Date.now() < deadline; i++) {
      const owner = await withTimeout(this.h.cluster.ownerOf(runId), 2_000, undefined);
      if (owner !== undefined && owner !== from) return { owner, at: Date.now() };
      await sleep(250);
    }
    return undefined;
  }

  private async nodeKill(): Promise<void> {
    const { cluster, out, transport } = this.h;
    const { node, runId } = await this.victim();
    const name = cluster.nodes[node].id;
    out.log(`FAULT node-kill: SIGKILL ${name}${runId ? ` (owner of ${runId}, a turn in flight)` : ""}`);
    const startedAt = Date.now();
    transport.down.add(node);
    await cluster.killNode(node);
    const exited = cluster.nodes[node].child?.exitCode !== null || cluster.nodes[node].child?.signalCode !== null;
    const movedTo = runId ? await this.moved(runId, node, 4 * LEASE_TTL_MS) : undefined;
    await sleep(Math.max(0, 2 * LEASE_TTL_MS - (Date.now() - startedAt)));
    out.log(`  restarting ${name}`);
    await cluster.startNode(node);
    transport.down.delete(node);
    const endedAt = Date.now();
    out.log(`  ${name} ready again after ${((endedAt - startedAt) / 1000).toFixed(1)} s`);
    const observed = [
      `process ${exited ? "exited" : "had not exited"} after SIGKILL`,
      runId
        ? movedTo !== undefined
          ? `the partition of ${runId} moved to ${cluster.nodes[movedTo.owner].id} ${((movedTo.at - startedAt) / 1000).toFixed(1)} s after the kill`
          : `the partition of ${runId} did not move within ${(4 * LEASE_TTL_MS) / 1000} s`
        : "no run of the victim known to check a partition move",
      `restarted and ready ${((endedAt - startedAt) / 1000).toFixed(1)} s after the kill`,
    ];
    this.h.rec.faults.push({ kind: "node-kill", target: name, startedAt, endedAt, effect: { checked: exited && (!runId || movedTo !== undefined), observed: observed.join("; ") } });
  }

  private async nodePause(): Promise<void> {
    const { cluster, out, transport } = this.h;
    const { node, runId } = await this.victim();
    const name = cluster.nodes[node].id;
    const pauseMs = 2 * LEASE_TTL_MS + 1_000;
    out.log(`FAULT node-pause: SIGSTOP ${name} for ${pauseMs / 1000} s (lease ${LEASE_TTL_MS / 1000} s)${runId ? `, owner of ${runId}` : ""}`);
    const startedAt = Date.now();
    transport.down.add(node);
    cluster.pauseNode(node);
    const movedTo = runId ? await this.moved(runId, node, pauseMs) : undefined;
    await sleep(Math.max(0, pauseMs - (Date.now() - startedAt)));
    cluster.resumeNode(node);
    const endedAt = Date.now();
    out.log(`  SIGCONT ${name}`);
    await cluster.waitReady(node, 60_000);
    transport.down.delete(node);
    const observed = runId
      ? movedTo !== undefined
        ? `the partition of ${runId} moved to ${cluster.nodes[movedTo.owner].id} ${((movedTo.at - startedAt) / 1000).toFixed(1)} s after SIGSTOP, while ${name} was stopped`
        : `the partition of ${runId} did not move during the ${pauseMs / 1000} s pause`
      : "no run of the victim known: whether its partitions moved was not checked";
    this.h.rec.faults.push({ kind: "node-pause", target: name, startedAt, endedAt, effect: { checked: movedTo !== undefined, observed: `${observed}; ready again ${((Date.now() - endedAt) / 1000).toFixed(1)} s after SIGCONT` } });
  }

  /** Every other time the server leading the leases bucket (the harder case), else the next one in turn. */
  private async natsKill(n: number): Promise<void> {
    const { cluster, out } = this.h;
    const jsm = await withTimeout(jetstreamManager(cluster.nc, { timeout: 3_000 }), 4_000, undefined);
    const leader = n % 2 === 0 && jsm ? (await withTimeout(jsm.streams.info(`KV_${LEASES_BUCKET}`), 3_000, undefined))?.cluster?.leader : undefined;
    let index = cluster.nats.findIndex((s) => s.name === leader);
    if (index === -1) index = (n - 1) % cluster.nats.length;
    const name = cluster.nats[index].name;
    out.log(`FAULT nats-kill: SIGKILL ${name}${leader === name ? " (leader of the leases bucket)" : ""}`);
    const startedAt = Date.now();
    cluster.killNats(index);
    // JetStream with one server of three down should answer (R3 keeps a quorum) once a leader is elected.
    let during: { leader?: string; afterMs: number } | undefined;
    for (let i = 0; i < 20 && !during && Date.now() - startedAt < 7_000; i++) {
      await sleep(500);
      const info = await withTimeout(
        (async () => (await (await jetstreamManager(cluster.nc, { timeout: 2_000 })).streams.info(`KV_${LEASES_BUCKET}`)).cluster)(),
        3_000,
        undefined,
      );
      if (info?.leader && info.leader !== name) during = { leader: info.leader, afterMs: Date.now() - startedAt };
    }
    await sleep(Math.max(0, 8_000 - (Date.now() - startedAt)));
    out.log(`  restarting ${name}`);
    await cluster.startNats(index);
    const endedAt = Date.now();
    const rejoined = await this.natsCurrent(name, 30_000);
    out.log(`  ${name} ${rejoined ? "is a current replica of the leases bucket again" : "did not become current within 30 s"}`);
    const observed = [
      during
        ? `with ${name} down the leases bucket answered with leader ${during.leader} ${(during.afterMs / 1000).toFixed(1)} s after the kill`
        : `the leases bucket did not answer with a leader other than ${name} within 7 s of the kill`,
      rejoined ? `${name} current again after restart` : `${name} not current within 30 s of its restart`,
    ];
    this.h.rec.faults.push({ kind: "nats-kill", target: name, startedAt, endedAt, effect: { checked: rejoined, observed: observed.join("; ") } });
  }

  private async natsCurrent(name: string, timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    for (let i = 0; i < 100 && Date.now() < deadline; i++) {
      const info = await withTimeout(
        (async () => (await (await jetstreamManager(this.h.cluster.nc, { timeout: 3_000 })).streams.info(`KV_${LEASES_BUCKET}`)).cluster)(),
        4_000,
        undefined,
      );
      const me = info?.leader === name ? true : info?.replicas?.find((p) => p.name === name)?.current;
      if (me) return true;
      await sleep(500);
    }
    return false;
  }

  /** FerretDB stopped for 5 s (every other time SIGKILL, as a crash), started again on its port and data. */
  private async storeOutage(n: number): Promise<void> {
    const { cluster, out } = this.h;
    const crash = n % 2 === 0;
    out.log(`FAULT store-outage: ${crash ? "SIGKILL" : "SIGTERM"} FerretDB for 5 s`);
    const probeRun = [...this.h.rec.admitted.values()].at(-1)?.runId;
    const startedAt = Date.now();
    await cluster.stopStore({ crash });
    const down = !cluster.storeUp();
    await sleep(1_000);
    const during = probeRun ? await this.probe(probeRun) : undefined;
    await sleep(Math.max(0, 5_000 - (Date.now() - startedAt)));
    out.log("  starting FerretDB again");
    await cluster.startStore();
    const endedAt = Date.now();
    let after: string | undefined;
    for (let i = 0; i < 60 && probeRun; i++) {
      after = await this.probe(probeRun);
      if (after.startsWith("200")) break;
      await sleep(500);
    }
    const observed = [
      down ? "FerretDB process ended" : "FerretDB still running after stop",
      during ? `a read of ${probeRun} during the outage answered ${during}` : "no run to probe during the outage",
      after ? `after the restart: ${after} ${((Date.now() - endedAt) / 1000).toFixed(1)} s after it` : "",
    ].filter(Boolean);
    const checked = down && during !== undefined && !during.startsWith("200");
    this.h.rec.faults.push({ kind: "store-outage", target: crash ? "ferretdb (SIGKILL)" : "ferretdb (SIGTERM)", startedAt, endedAt, effect: { checked, observed: observed.join("; ") } });
  }

  /** One GET of a run (no retries, 5 s), as "<status> <code> [Retry-After n]". */
  private async probe(runId: string): Promise<string> {
    const up = this.h.cluster.nodes.findIndex((_, i) => !this.h.transport.down.has(i));
    try {
      const res = await fetch(`${this.h.cluster.nodes[Math.max(0, up)].url}/api/v1/runs/${runId}`, {
        headers: { authorization: `Bearer ${this.h.cluster.key}` },
        signal: AbortSignal.timeout(5_000),
      });
      const body = (await res.json().catch(() => undefined)) as { error?: { code?: string } } | undefined;
      const retryAfter = res.headers.get("retry-after");
      return `${res.status}${body?.error?.code ? ` ${body.error.code}` : ""}${retryAfter ? ` Retry-After ${retryAfter}` : ""}`;
    } catch (err) {
      return `no answer (${describe(err)})`;
    }
  }

  /**
   * Drops client connections: about half the requests in flight, and every open event stream.
   * Waits (up to 8 s) for something to be in flight, so the drop usually lands on a call.
   */
  private async clientDrop(stop: AbortSignal): Promise<void> {
    const { transport, out } = this.h;
    for (let i = 0; i < 80 && !stop.aborted && transport.openStreams.size === 0 && [...transport.inflight].every((e) => e.ctx.stream); i++) await sleep(100, stop);
    // Half of them (at least one), in a random order.
    const candidates = [...transport.inflight].filter((e) => !e.ctx.stream).sort(() => this.h.random() - 0.5);
    const requests = candidates.slice(0, Math.ceil(candidates.length / 2));
    const streams = [...transport.openStreams];
    const at = Date.now();
    for (const r of requests) r.abort("dropped");
    for (const s of streams) s.cut("fault");
    const ops = [...requests.map((r) => r.ctx.op), ...streams.map((s) => `${s.ctx.op} stream`)];
    out.log(`FAULT client-drop: ${requests.length} request(s) aborted, ${streams.length} stream(s) cut${ops.length ? ` (${ops.join(", ")})` : ""}`);
    this.h.rec.faults.push({
      kind: "client-drop",
      target: `${requests.length} requests, ${streams.length} streams`,
      startedAt: at,
      endedAt: at,
      recoveredAt: at,
      effect: ops.length
        ? { checked: true, observed: `cut ${ops.join(", ")}; their retries and resumes are checked by the idempotency and SSE figures` }
        : { checked: false, observed: "nothing was in flight at that moment" },
    });
  }
}

// ---- the harness ----------------------------------------------------------------------

class Harness {
  readonly rec = new Recorder();
  readonly transport: Transport;
  readonly notes: string[] = [];
  readonly deletedSnapshots = new Map<string, RunReadback>();
  agents!: Agents;

  constructor(
    readonly cluster: Cluster,
    readonly out: Output,
    readonly random: () => number,
  ) {
    this.transport = new Transport(cluster, this.rec, random);
  }

  /** A client for the runner's own reads (readback, setup): recorded under `op`. */
  reader(op: string): RunsClient {
    return this.transport.client({ op, worker: -1, timeoutMs: 20_000, hitFault: false });
  }

  async createAgents(): Promise<void> {
    const api = this.reader("setup");
    const signal = AbortSignal.timeout(60_000);
    const create = async (name: string, config: Record<string, unknown>) => {
      const agent = await api.createAgent({ name }, { signal });
      const deployment = await api.createDeployment(agent.id, { config: config as never }, { signal });
      const ready = await api.waitForDeployment(agent.id, deployment.version, { signal });
      if (ready.status !== "ready") throw new Error(`deployment of ${name} is ${ready.status}`);
      return agent.id;
    };
    this.agents = {
      sleeper: await create("chaos-sleeper", {
        model: "faux/scripted",
        tools: ["bash"],
        script: [{ tool_call: { name: "bash", arguments: { command: "sleep 2" } } }, { text: "slept" }],
      }),
      streamer: await create("chaos-streamer", { model: "faux/scripted", tokens_per_second: 20 }),
    };
  }

  /** Brings every NATS server, the store and every node back (bounded), and the balancer with them. */
  async restoreAll(): Promise<void> {
    const { cluster } = this;
    for (let i = 0; i < cluster.nats.length; i++) await cluster.startNats(i);
    await cluster.startStore();
    for (const node of cluster.nodes) {
      if (node.paused) cluster.resumeNode(node.index);
      if (!node.child || node.child.exitCode !== null || node.child.signalCode !== null) await cluster.startNode(node.index);
    }
    for (const node of cluster.nodes) {
      await cluster.waitReady(node.index, 60_000);
      this.transport.down.delete(node.index);
    }
  }

  /** A run's turn history and event log through the API (all pages, bounded). */
  async readRun(runId: string, op = "readback", worker = -1): Promise<RunReadback> {
    const api = this.transport.client({ op, worker, timeoutMs: 20_000, hitFault: false });
    const signal = AbortSignal.timeout(60_000);
    const back: RunReadback = { runId, deleted: false, turns: [], events: [] };
    try {
      let after: string | undefined;
      for (let page = 0; page < 100; page++) {
        const list = await api.listTurns(runId, { limit: 100, after }, { signal });
        for (const t of list.data) {
          const text = t.input.map((part) => ("text" in part ? part.text : "")).join(" ");
          back.turns.push({ id: t.id, status: t.status, code: t.error?.code, created_at: t.created_at, completed_at: t.completed_at ?? undefined, key: /chaos-[0-9a-f-]{36}/.exec(text)?.[0] });
        }
        if (!list.has_more || !list.next_cursor) break;
        after = list.next_cursor;
      }
      after = undefined;
      for (let page = 0; page < 100; page++) {
        const list = await api.listEvents(runId, { limit: 1000, after }, { signal });
        for (const e of list.data) back.events.push({ sequence: e.sequence, type: e.type, turn_id: e.turn_id, created_at: e.created_at });
        if (!list.has_more || !list.next_cursor) break;
        after = list.next_cursor;
      }
    } catch (err) {
      back.error = describe(err);
    }
    return back;
  }

  /** Every run id of the workspace (the list endpoint, bounded pages). */
  async listRunIds(): Promise<string[]> {
    const api = this.reader("readback");
    const ids: string[] = [];
    let after: string | undefined;
    for (let page = 0; page < 500; page++) {
      const list = await api.listRuns({ limit: 100, after }, { signal: AbortSignal.timeout(30_000) });
      ids.push(...list.data.map((r) => r.id));
      if (!list.has_more || !list.next_cursor) break;
      after = list.next_cursor;
    }
    return ids;
  }

  /** Waits (bounded) until no run is busy: every admitted turn has had the chance to end. */
  async quiesce(timeoutMs: number): Promise<{ quiet: boolean; busy: number; ms: number }> {
    const began = Date.now();
    let busy = -1;
    for (let i = 0; i < 1_000 && Date.now() - began < timeoutMs; i++) {
      try {
        const list = await this.reader("quiesce").listRuns({ state: "busy", limit: 100 }, { signal: AbortSignal.timeout(20_000) });
        busy = list.data.length;
        if (busy === 0) return { quiet: true, busy, ms: Date.now() - began };
      } catch (err) {
        this.out.log(`quiescence check failed: ${describe(err)}`);
      }
      await sleep(2_000);
    }
    return { quiet: false, busy, ms: Date.now() - began };
  }
}

// ---- main -----------------------------------------------------------------------------

function gitState(): string {
  try {
    const head = execFileSync("git", ["rev-parse", "--short", "HEAD"], { cwd: PROJECT_ROOT, encoding: "utf8" }).trim();
    const dirty = execFileSync("git", ["status", "--porcelain"], { cwd: PROJECT_ROOT, encoding: "utf8" }).trim().split("\n").filter(Boolean).length;
    return dirty ? `${head} + ${dirty} changed files` : head;
  } catch {
    return "unknown";
  }
}

/** Copies the cluster's logs (nodes, NATS servers, FerretDB) into the results. */
async function copyLogs(cluster: Cluster, dir: string): Promise<string[]> {
  const target = path.join(dir, "logs");
  mkdirSync(target, { recursive: true });
  const copied: string[] = [];
  for (const name of await readdir(cluster.dir).catch(() => [] as string[])) {
    if (!name.endsWith(".log")) continue;
    await copyFile(path.join(cluster.dir, name), path.join(target, name)).then(() => copied.push(name), () => undefined);
  }
  return copied;
}

async function main(args: string[]): Promise<number> {
  const options = parseOptions(args, process.env);
  const out = new Output(PROJECT_ROOT);
  // The run's choices are reproducible from its seed, its timing is not.
  const random = seededRandom(options.seed);
  const loadMs = options.minutes * 60_000;
  // Load, then at most 2.5 min to settle and a few to read back: past this the runner stops.
  const hardStopMs = loadMs + 8 * 60_000;
  const stop = new AbortController();
  let interrupted = false;
  let cluster: Cluster | undefined;

  const onSignal = (signal: string) => {
    if (interrupted) return;
    interrupted = true;
    out.log(`${signal}: stopping the load and the cluster…`);
    stop.abort();
    const force = setTimeout(() => {
      void cluster?.stop().finally(() => process.exit(130));
    }, 30_000);
    force.unref();
  };
  process.on("SIGINT", () => onSignal("SIGINT"));
  process.on("SIGTERM", () => onSignal("SIGTERM"));
  const hardStop = setTimeout(() => {
    out.log(`the run passed its bound of ${hardStopMs / 60_000} min: stopping`);
    interrupted = true;
    stop.abort();
  }, hardStopMs);
  hardStop.unref();

  out.log(`results in ${out.dir}`);
  out.log(`options: ${options.minutes} min of load, ${options.clients} clients, a heavy fault every ${options.faultEveryS} s, seed ${options.seed}`);
  const startedAt = new Date();
  try {
    out.log("starting the cluster: 3 NATS servers, FerretDB, 3 nodes (lease 3 s)…");
    cluster = await startCluster({
      nodes: 3,
      natsServers: 3,
      keepDir: options.keep,
      env: {
        // A waiting call's server-side wait (20 s there) stays well within the client's bound.
        ...FAULT_LOAD_ENV,
        RUNS_LEASE_TTL_MS: String(LEASE_TTL_MS),
        LOG_LEVEL: process.env.LOG_LEVEL ?? "info",
      },
    });
    out.log(`cluster up: ${cluster.nodes.map((n) => `${n.id} ${n.url}`).join(", ")}; files in ${cluster.dir}`);
    if (stop.signal.aborted) return 130;

    const h = new Harness(cluster, out, random);
    await h.createAgents();
    out.log(`agents: sleeper ${h.agents.sleeper} (bash sleep 2), streamer ${h.agents.streamer} (paced echo, ~3 s)`);

    // Load and faults, for `loadMs`.
    const loadStop = new AbortController();
    stop.signal.addEventListener("abort", () => loadStop.abort(), { once: true });
    const loadEnd = setTimeout(() => loadStop.abort(), loadMs);
    const workers = Array.from({ length: options.clients }, (_, i) => new Worker(i, h));
    out.log(`load: ${options.clients} clients for ${options.minutes} min`);
    const spacingMs = Math.min(options.faultEveryS * 1_000, Math.max(10_000, (loadMs - 35_000) / FAULT_CYCLE.length));
    const faults = new Faults(h);
    const faultsDone = faults.loop(loadStop.signal, Math.min(15_000, loadMs / 8), spacingMs, Date.now() + loadMs - 20_000);
    const progress = setInterval(() => {
      const ok = [...h.rec.operations.values()].reduce((n, o) => n + o.ok, 0);
      out.log(`progress: ${h.rec.attempts.length} HTTP attempts, ${ok} calls answered 2xx, ${h.rec.admitted.size} turns acknowledged, ${h.rec.streams.length} streams`);
    }, 30_000);
    await Promise.all(workers.map((w) => w.loop(loadStop.signal)));
    clearTimeout(loadEnd);
    clearInterval(progress);
    out.log("load stopped; waiting for the fault in progress to be undone");
    await faultsDone;
    if (!interrupted) {
      await h.restoreAll();
      out.log("every server and node is up; sending the repeats still owed");
      await Promise.all(workers.map((w) => w.drainRepeats(Date.now() + 90_000)));
    }

    let quiet = { quiet: false, busy: -1, ms: 0 };
    const runs = new Map<string, RunReadback>();
    if (!interrupted) {
      out.log("waiting for quiescence (no busy run; at most 150 s)…");
      quiet = await h.quiesce(150_000);
      out.log(quiet.quiet ? `quiet after ${(quiet.ms / 1000).toFixed(1)} s` : `still ${quiet.busy} busy run(s) after ${(quiet.ms / 1000).toFixed(0)} s`);
      out.log("reading every run back (turns and events)…");
      const ids = new Set(await h.listRunIds().catch((err) => (h.notes.push(`listing runs failed: ${describe(err)}`), [] as string[])));
      for (const t of h.rec.admitted.values()) ids.add(t.runId);
      const queue = [...ids];
      await Promise.all(
        Array.from({ length: 3 }, async () => {
          for (let i = 0; i < 100_000 && queue.length > 0 && !stop.signal.aborted; i++) {
            const id = queue.shift()!;
            const back = await h.readRun(id);
            const snapshot = h.deletedSnapshots.get(id);
            if (snapshot && back.error && /404|410/.test(back.error)) runs.set(id, snapshot);
            else {
              if (snapshot && !back.error) h.notes.push(`run ${id} is still readable after a delete call (${back.turns.length} turns)`);
              runs.set(id, back);
            }
          }
        }),
      );
      out.log(`read ${runs.size} runs (${h.deletedSnapshots.size} deleted ones from their copy taken before the delete)`);
    }

    const copied = await copyLogs(cluster, out.dir);
    await out.json(
      "faults.json",
      h.rec.faults.map((f) => ({ ...f, startedAt: new Date(f.startedAt).toISOString(), endedAt: new Date(f.endedAt).toISOString(), recoveredAt: f.recoveredAt && new Date(f.recoveredAt).toISOString() })),
    );
    if (interrupted) {
      // Without the settling and the full readback every figure would be a guess: none is given.
      const text = `chaos run interrupted after ${((Date.now() - startedAt.getTime()) / 60_000).toFixed(1)} min: no ledger (the runs were not all read back). Faults so far in faults.json, logs in logs/.\nresults: ${out.dir}\n`;
      await out.text("summary.txt", text);
      process.stdout.write(`\n${text}`);
      return 130;
    }
    const meta = {
      started_at: startedAt.toISOString(),
      ended_at: new Date().toISOString(),
      interrupted,
      load_minutes: options.minutes,
      clients: options.clients,
      fault_every_s: spacingMs / 1000,
      seed: options.seed,
      nodes: cluster.nodes.length,
      nats_servers: cluster.nats.length,
      lease_ttl_ms: LEASE_TTL_MS,
      git: gitState(),
      quiescence: quiet,
      cluster_dir: options.keep ? cluster.dir : `${cluster.dir} (removed; logs copied to logs/)`,
      logs: copied.map((name) => `logs/${name}`),
    };
    const { ledger, problems } = buildLedger(h.rec, h.notes, runs, meta);
    await out.json("ledger.json", ledger);
    await out.json("problems.json", [...problems].sort((a, b) => Number(b.counted) - Number(a.counted)));
    // Again: the ledger added to each fault the turns that ended incomplete near it.
    await out.json(
      "faults.json",
      h.rec.faults.map((f) => ({ ...f, startedAt: new Date(f.startedAt).toISOString(), endedAt: new Date(f.endedAt).toISOString(), recoveredAt: f.recoveredAt && new Date(f.recoveredAt).toISOString() })),
    );
    await out.json("random-drops.json", h.rec.drops.map((d) => ({ ...d, at: new Date(d.at).toISOString() })));
    // Everything recorded, for reading a problem in detail.
    await out.json("attempts.json", h.rec.attempts.map((a) => ({ ...a, at: new Date(a.at).toISOString() })));
    await out.json("streams.json", h.rec.streams.map((st) => ({ ...st, events: st.events.map((e) => `${e.conn}/${e.seq}:${e.type}`) })));
    const text = summaryText(ledger, out.dir);
    await out.text("summary.txt", text);
    process.stdout.write(`\n${text}`);
    return ledger.failing.length ? 1 : 0;
  } finally {
    out.log("stopping the cluster");
    await cluster?.stop().catch((err) => out.log(`cluster stop failed: ${describe(err)}`));
  }
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (err) => {
      process.stderr.write(`chaos: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
      process.exit(2);
    },
  );
}
