/**
 * Spawning one sandboxed (or, with RUNS_SANDBOX=off, unconfined) command: its output
 * tail, its timeout and abort, and the moment it counts as over.
 */
import { spawn } from "node:child_process";

/** A command's output pipes after its sandbox ended: only bwrap could still hold them. */
const PIPE_DRAIN_MS = 200;

export type RawOutcome = (
  | { kind: "exited"; exitCode: number }
  /** `limited`: killed because `limitSignal` was aborted while it ran (not when it had ended already). */
  | { kind: "signalled"; signal: string; limited?: true }
  | { kind: "timed_out" }
  | { kind: "aborted" }
  | { kind: "error"; message: string }
) & { output: Buffer; totalBytes: number; stderr: Buffer };


export interface SpawnRequest {
  file: string;
  args: readonly string[];
  cwd: string;
  env: NodeJS.ProcessEnv;
  uid?: number;
  gid?: number;
  /** Descriptors passed as fd 3, 4, … */
  extraFds: readonly number[];
  stdin?: Buffer;
  timeoutMs: number;
  signal?: AbortSignal;
  /** Aborted when the command ran into a limit only a measurement shows: it is SIGKILLed, and settles as killed by that signal. */
  limitSignal?: AbortSignal;
  outputBytes: number;
  /** Keep stderr apart (bwrap's own messages); otherwise it is ignored (the shell merges it). */
  captureStderr: boolean;
  /** Unconfined mode: the command gets its own process group, killed as a whole. */
  processGroup?: boolean;
}

/**
 * Spawns, collects the output tail, and settles once the process exited and its
 * pipes closed (or stopped mattering). Timeout and abort SIGKILL the process — for
 * bwrap that ends its PID namespace, hence every process of the command.
 */
export function spawnAndWait(req: SpawnRequest): Promise<RawOutcome> {
  const output = new OutputTail(req.outputBytes);
  const stderr = new OutputTail(4096);
  return new Promise<RawOutcome>((resolve) => {
    const child = spawn(req.file, req.args, {
      cwd: req.cwd,
      env: req.env,
      uid: req.uid,
      gid: req.gid,
      detached: req.processGroup === true,
      stdio: [req.stdin ? "pipe" : "ignore", "pipe", req.captureStderr ? "pipe" : "ignore", ...req.extraFds],
    });
    let stoppedBy: "timed_out" | "aborted" | "limit" | undefined;
    let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
    let settled = false;
    let drainTimer: NodeJS.Timeout | undefined;
    let spawnError: Error | undefined;

    const kill = () => {
      if (child.pid === undefined) return;
      try {
        if (req.processGroup) process.kill(-child.pid, "SIGKILL");
        else child.kill("SIGKILL");
      } catch {
        // already gone
      }
    };
    const stop = (reason: "timed_out" | "aborted" | "limit") => {
      if (stoppedBy || settled || exit) return;
      stoppedBy = reason;
      kill();
    };
    const onAbort = () => stop("aborted");
    const onLimit = () => stop("limit");
    const timeout = setTimeout(() => stop("timed_out"), req.timeoutMs);
    req.signal?.addEventListener("abort", onAbort, { once: true });
    req.limitSignal?.addEventListener("abort", onLimit, { once: true });
    // Aborted while the sandbox was being set up: the listener above will not fire.
    if (req.signal?.aborted) stop("aborted");

    const settle = () => {
      if (settled || (!exit && !spawnError)) return;
      settled = true;
      clearTimeout(timeout);
      clearTimeout(drainTimer);
      req.signal?.removeEventListener("abort", onAbort);
      req.limitSignal?.removeEventListener("abort", onLimit);
      child.stdout?.destroy();
      child.stderr?.destroy();
      const base = { ...output.result(), stderr: stderr.result().output };
      if (spawnError) return resolve({ kind: "error", message: spawnError.message, ...base });
      if (stoppedBy === "limit") return resolve({ kind: "signalled", signal: "SIGKILL", limited: true, ...base });
      if (stoppedBy) return resolve({ kind: stoppedBy, ...base });
      if (exit!.code !== null) return resolve({ kind: "exited", exitCode: exit!.code, ...base });
      return resolve({ kind: "signalled", signal: exit!.signal ?? "unknown", ...base });
    };

    child.stdout?.on("data", (chunk: Buffer) => output.push(chunk));
    child.stderr?.on("data", (chunk: Buffer) => stderr.push(chunk));
    if (req.stdin && child.stdin) {
      child.stdin.on("error", () => undefined); // the command may not read it all
      child.stdin.end(req.stdin);
    }
    child.on("error", (error) => {
      spawnError = error;
      settle();
    });
    child.on("exit", (code, signal) => {
      exit = { code, signal };
      // Unconfined, background children may hold the pipe; give them a moment.
      drainTimer = setTimeout(settle, PIPE_DRAIN_MS);
    });
    child.on("close", () => settle());
  });
}

const MAX_TAIL_CHUNKS = 4096;
const EMPTY = Buffer.alloc(0);

/**
 * Keeps the last `limit` bytes of a byte stream and counts the rest. Chunks fall off the
 * front by an index, not by shifting the array: a command that writes a byte at a time and
 * then a burst had made one push shift out ~65,000 chunks, ~1 s per push (found by an audit).
 */
export class OutputTail {
  private chunks: Buffer[] = [];
  /** The first chunk still kept. */
  private first = 0;
  private kept = 0;
  private total = 0;

  constructor(private readonly limit: number) {}

  push(chunk: Buffer): void {
    this.total += chunk.length;
    this.chunks.push(chunk);
    this.kept += chunk.length;
    while (this.chunks.length - this.first > 1 && this.kept - this.chunks[this.first]!.length >= this.limit) {
      this.kept -= this.chunks[this.first]!.length;
      // Let go at once: a dropped 64 KiB read held until the next compaction had kept ~256 MiB (found by a review).
      this.chunks[this.first] = EMPTY;
      this.first++;
    }
    // At most MAX_TAIL_CHUNKS kept and as many dropped ones held: many small reads are
    // merged into one buffer (a copy of at most ~limit bytes per MAX_TAIL_CHUNKS pushes).
    if (this.chunks.length - this.first > MAX_TAIL_CHUNKS) {
      this.chunks = [Buffer.concat(this.chunks.slice(this.first))];
      this.first = 0;
    } else if (this.first > MAX_TAIL_CHUNKS) {
      this.chunks = this.chunks.slice(this.first);
      this.first = 0;
    }
  }

  result(): { output: Buffer; totalBytes: number } {
    let buffer = Buffer.concat(this.chunks.slice(this.first));
    if (buffer.length > this.limit) buffer = buffer.subarray(buffer.length - this.limit);
    return { output: buffer, totalBytes: this.total };
  }
}
