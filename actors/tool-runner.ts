/**
 * What every workspace tool stands on: the workspace's paths (nothing outside it), and
 * the runner that executes a tool's command or script in the run's sandbox with the
 * deployment's limits, and turns its outcome into what the model is told.
 */
import { lstat, realpath } from "node:fs/promises";
import path from "node:path";
import type { AgentToolResult } from "@mariozechner/pi-agent-core";
import type { EgressDenial } from "./egress-proxy.js";
import { liveTreeUsage, SandboxFailure, treeUsage, type Sandbox, type SandboxOutcome, type TreeUsage } from "./sandbox.js";
import { DEFAULT_LIMITS, describeLimit, type LimitHit, maxEntries, type SandboxLimits } from "./sandbox-limits.js";

export interface WorkspaceToolsOptions {
  /** The node's sandbox runner. */
  sandbox: Sandbox;
  /** The workspace the commands run for (SandboxCommand.tenant). */
  tenant?: string;
  /** Time limit of one command. Default 300 s. */
  commandTimeoutMs?: number;
  /** Environment values for commands, on top of the sandbox's minimal base (PATH, HOME, LANG…). */
  env?: Record<string, string>;
  /** The deployment's limits. Default {@link DEFAULT_LIMITS}. */
  limits?: SandboxLimits;
  /** Destinations commands may reach through the egress proxy (`config.network.allow`). */
  networkAllow?: readonly string[];
  /** A connection the egress proxy refused (for the run's event log). */
  onNetworkDenied?: (denial: EgressDenial) => void;
  /** The sandbox failed (capacity, start): the caller ends the turn with its code. */
  onSandboxFailure?: (failure: SandboxFailure) => void;
}

export const DEFAULT_COMMAND_TIMEOUT_MS = 300_000;
/** Captured command output is cut to its last 64 KiB by default (`config.limits.output_kb`). */
export const MAX_OUTPUT_BYTES = DEFAULT_LIMITS.outputBytes;

/** Maps tool paths to paths relative to the workspace root. */
export class Workspace {
  readonly root: string;

  /** `sandboxRoot`: where the workspace appears to commands (unset when unsandboxed). */
  constructor(
    dir: string,
    readonly sandboxRoot?: string,
  ) {
    this.root = path.resolve(dir);
  }

  /**
   * `p` as a path relative to the workspace root, starting with `./` (or `.` for the
   * root itself). Throws when it names something outside the workspace.
   */
  relative(p: string): string {
    if (p.includes("\0")) throw new Error(`Invalid path: ${JSON.stringify(p)}`);
    let rel: string;
    if (path.posix.isAbsolute(p)) {
      const base = [this.sandboxRoot, this.root].find((root) => root !== undefined && isInside(root, path.posix.normalize(p)));
      if (base === undefined) throw escapeError(p);
      rel = path.posix.relative(base, path.posix.normalize(p));
    } else {
      rel = path.posix.normalize(p);
    }
    if (rel === "" || rel === ".") return ".";
    if (rel === ".." || rel.startsWith("../")) throw escapeError(p);
    return `./${rel.replace(/\/+$/, "")}`;
  }

  /**
   * Unsandboxed only: the absolute host path `p` names, following links of its
   * existing part; throws when that leaves the workspace or goes through a dangling link.
   */
  async resolveOnHost(p: string): Promise<string> {
    const rel = this.relative(p);
    const realRoot = await realpath(this.root);
    const candidate = path.join(this.root, rel);
    const missing: string[] = [];
    let existing = candidate;
    for (;;) {
      let real: string | undefined;
      try {
        real = await realpath(existing);
      } catch (error) {
        if (!isNotFound(error)) throw error;
        if (await isSymlink(existing)) {
          throw new Error(`Path ${JSON.stringify(p)} goes through a symbolic link whose target does not exist`);
        }
      }
      if (real !== undefined) {
        if (!isInside(realRoot, real)) throw escapeError(p);
        return path.join(real, ...missing.reverse());
      }
      missing.push(path.basename(existing));
      existing = path.dirname(existing);
    }
  }
}

function isInside(root: string, candidate: string): boolean {
  const rel = path.relative(root, candidate);
  return rel === "" || (!rel.startsWith("..") && !path.isAbsolute(rel));
}

function escapeError(p: string): Error {
  return new Error(`Path ${JSON.stringify(p)} is outside the workspace`);
}

function isNotFound(error: unknown): boolean {
  return (error as NodeJS.ErrnoException)?.code === "ENOENT" || (error as NodeJS.ErrnoException)?.code === "ENOTDIR";
}

async function isSymlink(p: string): Promise<boolean> {
  try {
    return (await lstat(p)).isSymbolicLink();
  } catch {
    return false;
  }
}

export function textResult<T>(text: string, details: T): AgentToolResult<T> {
  return { content: [{ type: "text", text }], details };
}

/** Runs tool scripts in the sandbox with the deployment's limits. */
export class ToolRunner {
  readonly timeoutMs: number;
  readonly limits: SandboxLimits;
  /** Set once a command left the workspace over its disk or file limit; writes refuse until it is under again. */
  private overDisk: "disk" | "files" | undefined;
  /** Whether a command ran (and the workspace was measured after it). */
  private checked = false;

  constructor(
    readonly workspace: Workspace,
    private readonly options: WorkspaceToolsOptions,
  ) {
    this.timeoutMs = options.commandTimeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
    this.limits = options.limits ?? DEFAULT_LIMITS;
  }

  /** The relative path of a tool argument, checked on the host too when unsandboxed. */
  async path(p: string): Promise<string> {
    const rel = this.workspace.relative(p);
    if (this.workspace.sandboxRoot === undefined) await this.workspace.resolveOnHost(p);
    return rel;
  }

  /** Runs argv in the sandbox; a sandbox failure ends the turn (and is thrown to the agent loop). */
  async run(argv: string[], options: { signal?: AbortSignal; stdin?: Buffer; outputBytes?: number; limitsFromOutput?: boolean } = {}): Promise<SandboxOutcome> {
    try {
      const outcome = await this.options.sandbox.run({
        workspaceDir: this.workspace.root,
        argv,
        stdin: options.stdin,
        env: this.options.env,
        timeoutMs: this.timeoutMs,
        signal: options.signal,
        limits: options.outputBytes ? { ...this.limits, outputBytes: options.outputBytes } : this.limits,
        networkAllow: this.options.networkAllow,
        onNetworkDenied: this.options.onNetworkDenied,
        limitsFromOutput: options.limitsFromOutput,
        tenant: this.options.tenant,
        watch: this.workspace.sandboxRoot !== undefined ? this.watchGrowth() : undefined,
      });
      if (this.workspace.sandboxRoot !== undefined) await this.checkDisk(outcome);
      return outcome;
    } catch (err) {
      if (err instanceof SandboxFailure) this.options.onSandboxFailure?.(err);
      throw err;
    }
  }

  /**
   * After a command: a workspace over its disk or file limit is reported, and writes refuse
   * until it is under; so is a node short of disk (writes then refuse while it is).
   */
  private async checkDisk(outcome: SandboxOutcome): Promise<void> {
    await this.measure();
    for (const hit of [this.overDisk, await this.reserveHit()]) if (hit && !outcome.limits.includes(hit)) outcome.limits.push(hit);
  }

  /** The workspace against its disk and file limits (the measure stops counting just past them). */
  private async measure(): Promise<void> {
    const usage = await treeUsage(this.workspace.root, { bytes: this.limits.diskBytes, entries: maxEntries(this.limits) });
    this.overDisk = overLimit(usage, this.limits);
    this.checked = true;
  }

  /**
   * The measure of a running command: past a limit *and* grown since it started, so a
   * command that cleans up a workspace already over its limit (`rm -rf node_modules`,
   * `git gc`) is not stopped for it. Under its limits after the last command, anything past
   * them is growth; over them (the measure after a command stops counting there), or before
   * the turn's first command, growth is from the command's own first measure.
   */
  private watchGrowth(): (signal: AbortSignal) => Promise<LimitHit | undefined> {
    let from: TreeUsage | undefined = this.checked && !this.overDisk ? { bytes: 0, entries: 0 } : undefined;
    return async (signal) => {
      const usage = await liveTreeUsage(this.workspace.root, signal);
      const start = (from ??= usage);
      if (usage.bytes > this.limits.diskBytes && usage.bytes > start.bytes) return "disk";
      if (usage.entries > maxEntries(this.limits) && usage.entries > start.entries) return "files";
      return undefined;
    };
  }

  /**
   * Throws, naming the limit, while the workspace is over one or the node is short of disk.
   * Before the turn's first command the workspace is measured first: an earlier turn may
   * have left it over its limit.
   */
  async refuseWhenOverDisk(): Promise<void> {
    if (!this.checked && this.workspace.sandboxRoot !== undefined) await this.measure();
    const over = this.overDisk ?? (await this.reserveHit());
    if (over) throw new Error(`Not written: ${describeLimit(over, this.limits)}.`);
  }

  /**
   * Throws while the node is short of disk: a command started then would run until the
   * next check (a second) with nothing left to write into.
   */
  async refuseWhenShort(): Promise<void> {
    const hit = await this.reserveHit();
    if (hit) throw new Error(`Not run: ${describeLimit(hit, this.limits)}.`);
  }

  /** `host_disk` while the node is short of disk (its reserve). */
  private async reserveHit(): Promise<"host_disk" | undefined> {
    return (await this.options.sandbox.hostDiskLow(this.workspace.root)) ? "host_disk" : undefined;
  }

  /** The outcome's limit sentences, one per line, for the tool result (`bash` says a cut output its own way). */
  limitNotes(outcome: SandboxOutcome, options: { output: boolean } = { output: true }): string {
    const hits: LimitHit[] = [...outcome.limits];
    if (options.output && outcome.totalBytes > outcome.output.length) hits.push("output");
    // The process limit the command ran with, where its workspace's share lowered it.
    const limits = outcome.processes === undefined ? this.limits : { ...this.limits, processes: outcome.processes };
    return hits.map((hit) => `[sandbox: ${describeLimit(hit, limits)}]\n`).join("");
  }
}

/** The limit `usage` is past, bytes first. */
function overLimit(usage: TreeUsage, limits: SandboxLimits): "disk" | "files" | undefined {
  return usage.bytes > limits.diskBytes ? "disk" : usage.entries > maxEntries(limits) ? "files" : undefined;
}

/** A file script's failure exit codes, shared by the scripts and their callers. */
export const Exit = { missing: 10, directory: 11, special: 12, unreadable: 13, binary: 14, notDirectory: 15, tooLarge: 16, writeFailed: 21 } as const;

export function fileError(code: number, p: string, outcome: SandboxOutcome): Error {
  const shown = JSON.stringify(p);
  switch (code) {
    case Exit.missing:
      return new Error(`${shown} does not exist`);
    case Exit.directory:
      return new Error(`${shown} is a directory; use ls`);
    case Exit.special:
      return new Error(`${shown} is not a regular file (a pipe, device or socket cannot be read)`);
    case Exit.unreadable:
      return new Error(`${shown} cannot be read (permission denied)`);
    case Exit.notDirectory:
      return new Error(`${shown} is not a directory`);
    default: {
      const detail = outcome.output.toString("utf8").trim();
      return new Error(`${shown}: the operation failed (exit ${code})${detail ? `: ${detail}` : ""}`);
    }
  }
}

/** Throws for an outcome that is not a normal exit: timed out, cancelled, killed. */
export function requireExit(outcome: SandboxOutcome, runner: ToolRunner, what: string): number {
  switch (outcome.kind) {
    case "exited":
      if (outcome.limits.includes("memory")) throw new Error(`${what} failed: ${describeLimit("memory", runner.limits)}`);
      return outcome.exitCode;
    case "signalled":
      throw new Error(`${what} was terminated by signal ${outcome.signal}\n${runner.limitNotes(outcome)}`.trim());
    case "timed_out":
      throw new Error(`${what} timed out after ${formatSeconds(runner.timeoutMs)} and was stopped`);
    case "aborted":
      throw new Error(`${what} was cancelled`);
  }
}

export function formatSeconds(ms: number): string {
  return `${Number((ms / 1000).toFixed(3))} s`;
}
