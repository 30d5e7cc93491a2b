/**
 * The built-in workspace tools (`bash`, `read`, `write`, `edit`, `ls`) as
 * pi-agent-core tools. Every one of them runs inside the run's sandbox
 * ({@link Sandbox}): the file tools are small shell scripts executed there too, so a
 * FIFO, a device, a huge file or a symbolic link swapped between check and open can
 * block or mislead only the sandboxed process (killed by the command time limit or a
 * cancel), never the node, and a link can only lead to what the sandbox itself sees.
 *
 * Paths are taken relative to the workspace; an absolute path must name the
 * workspace (as `/workspace/…` or, unsandboxed, its host path), and `..` may not
 * leave it. Unsandboxed (RUNS_SANDBOX=off), links are also checked on the host with
 * realpath before use, as a courtesy: that mode confines nothing.
 *
 * Failures of the tool throw, so the agent loop returns them to the model as error
 * tool results; they never fail the turn. A failure of the sandbox itself
 * ({@link SandboxFailure}) is passed to `onSandboxFailure`, which ends the turn.
 */
import { lstat, realpath } from "node:fs/promises";
import path from "node:path";
import type { AgentTool, AgentToolResult } from "@mariozechner/pi-agent-core";
import { Type, type Static } from "@mariozechner/pi-ai";
import type { BuiltinTool } from "../src/index.js";
import type { EgressDenial } from "./egress-proxy.js";
import { SandboxFailure, treeBytes, type Sandbox, type SandboxOutcome } from "./sandbox.js";
import { DEFAULT_LIMITS, describeLimit, formatBytes, type LimitHit, type SandboxLimits } from "./sandbox-limits.js";

export interface WorkspaceToolsOptions {
  /** The node's sandbox runner. */
  sandbox: Sandbox;
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
const DEFAULT_READ_LINES = 2000;
const MAX_LS_ENTRIES = 1000;
/** `edit` works on files up to this size (it reads the whole file). */
const MAX_EDIT_BYTES = 8 * 1024 * 1024;
/** `ls` reads at most this much of a directory listing. */
const MAX_LS_BYTES = 1024 * 1024;

/**
 * Creates the named tools for the workspace `dir`, in the order given. `dir` must
 * exist. Commands receive a minimal environment, never the service's own.
 */
export function createWorkspaceTools(dir: string, names: readonly BuiltinTool[], options: WorkspaceToolsOptions): AgentTool<any>[] {
  const runner = new ToolRunner(new Workspace(dir, options.sandbox.workspaceRoot), options);
  const build: Record<BuiltinTool, () => AgentTool<any>> = {
    bash: () => bashTool(runner),
    read: () => readTool(runner),
    write: () => writeTool(runner),
    edit: () => editTool(runner),
    ls: () => lsTool(runner),
  };
  return names.map((name) => build[name]());
}

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

function textResult<T>(text: string, details: T): AgentToolResult<T> {
  return { content: [{ type: "text", text }], details };
}

/** Runs tool scripts in the sandbox with the deployment's limits. */
class ToolRunner {
  readonly timeoutMs: number;
  readonly limits: SandboxLimits;
  /** Set once a command left the workspace over its disk limit; writes refuse until it is under again. */
  private overDisk = false;

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
  async run(argv: string[], options: { signal?: AbortSignal; stdin?: Buffer; outputBytes?: number } = {}): Promise<SandboxOutcome> {
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
      });
      if (this.workspace.sandboxRoot !== undefined) await this.checkDisk(outcome);
      return outcome;
    } catch (err) {
      if (err instanceof SandboxFailure) this.options.onSandboxFailure?.(err);
      throw err;
    }
  }

  /** After a command: a workspace over its disk limit is reported, and writes refuse until it is under. */
  private async checkDisk(outcome: SandboxOutcome): Promise<void> {
    const bytes = await treeBytes(this.workspace.root, this.limits.diskBytes);
    this.overDisk = bytes > this.limits.diskBytes;
    if (this.overDisk && !outcome.limits.includes("disk")) outcome.limits.push("disk");
  }

  refuseWhenOverDisk(): void {
    if (this.overDisk) throw new Error(`Not written: ${describeLimit("disk", this.limits)}.`);
  }

  /** The outcome's limit sentences, one per line, for the tool result (`bash` says a cut output its own way). */
  limitNotes(outcome: SandboxOutcome, options: { output: boolean } = { output: true }): string {
    const hits: LimitHit[] = [...outcome.limits];
    if (options.output && outcome.totalBytes > outcome.output.length) hits.push("output");
    return hits.map((hit) => `[sandbox: ${describeLimit(hit, this.limits)}]\n`).join("");
  }
}

/** A file script's failure exit codes, shared by the scripts and their callers. */
const Exit = { missing: 10, directory: 11, special: 12, unreadable: 13, binary: 14, notDirectory: 15, writeFailed: 21 } as const;

function fileError(code: number, p: string, outcome: SandboxOutcome): Error {
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
function requireExit(outcome: SandboxOutcome, runner: ToolRunner, what: string): number {
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

// ---------------------------------------------------------------------------------
// bash

const bashParameters = Type.Object({
  command: Type.String({ description: "The command line to run with bash in the workspace directory." }),
});

export interface BashDetails {
  exitCode: number | null;
  truncated: boolean;
}

/**
 * The command (`$1`) runs in a new bash (`$0`) whose stderr is its stdout: the output
 * is returned as one stream anyway, in the order it was written. No login profile.
 */
const MERGED_STDERR = 'exec "$0" -c "$1" 2>&1';

function bashTool(runner: ToolRunner): AgentTool<typeof bashParameters, BashDetails> {
  const { timeoutMs, limits } = runner;
  return {
    name: "bash",
    label: "Run command",
    description:
      `Run a shell command in the workspace directory (${runner.workspace.sandboxRoot ?? "the run's workspace"}), inside a sandbox. ` +
      `Stdout and stderr are returned together (the last ${formatBytes(limits.outputBytes)}). ` +
      `Commands are stopped after ${Math.round(timeoutMs / 1000)} s; processes they leave in the background end with them.`,
    parameters: bashParameters,
    executionMode: "sequential",
    async execute(_toolCallId, params, signal) {
      const outcome = await runner.run(["/bin/bash", "-c", MERGED_STDERR, "/bin/bash", params.command], { signal });
      const body = outcome.output.toString("utf8");
      const notes = runner.limitNotes(outcome, { output: false });
      const truncated = outcome.totalBytes > outcome.output.length;
      const shown = truncated ? `[output truncated: last ${outcome.output.length} of ${outcome.totalBytes} bytes]\n${body}` : body;
      const output = notes + (shown.length > 0 ? shown : "(no output)");
      switch (outcome.kind) {
        case "exited":
          if (outcome.exitCode === 0) return textResult(output, { exitCode: 0, truncated });
          throw new Error(`Command exited with code ${outcome.exitCode}\n${output}`);
        case "signalled":
          throw new Error(`Command was terminated by signal ${outcome.signal}\n${output}`);
        case "timed_out":
          throw new Error(`Command timed out after ${formatSeconds(timeoutMs)} and was killed\n${output}`);
        case "aborted":
          throw new Error(`Command was cancelled\n${output}`);
      }
    },
  };
}

function formatSeconds(ms: number): string {
  return `${Number((ms / 1000).toFixed(3))} s`;
}

// ---------------------------------------------------------------------------------
// read

const readParameters = Type.Object({
  path: Type.String({ description: "File path, relative to the workspace." }),
  offset: Type.Optional(Type.Integer({ minimum: 1, description: "First line to return (1-based). Default 1." })),
  limit: Type.Optional(
    Type.Integer({ minimum: 1, description: `Number of lines to return. Default ${DEFAULT_READ_LINES}.` }),
  ),
});

/**
 * Prints the file's newline count on the first line, then up to `$3` lines from
 * line `$2`, at most `$4` bytes. Refuses anything but a readable regular text file
 * (checked in the sandbox; a file swapped for a FIFO afterwards only blocks the
 * sandbox until the command time limit or a cancel).
 */
const READ_SCRIPT = `exec 2>/dev/null; f=$1
[ -e "$f" ] || exit ${10}
[ -d "$f" ] && exit ${11}
[ -f "$f" ] || exit ${12}
[ -r "$f" ] || exit ${13}
n=$(head -c 8192 -- "$f" | tr -dc '\\000' | wc -c)
[ "$n" -eq 0 ] || { stat -c %s -- "$f"; exit ${14}; }
wc -l < "$f" || exit 13
tail -n "+$2" -- "$f" | head -n "$3" | head -c "$4"`;

function readTool(runner: ToolRunner): AgentTool<typeof readParameters> {
  return {
    name: "read",
    label: "Read file",
    description:
      `Read a text file from the workspace. Returns up to ${DEFAULT_READ_LINES} lines ` +
      `(${formatBytes(runner.limits.outputBytes)}) from \`offset\`; use offset and limit for the rest.`,
    parameters: readParameters,
    async execute(_id, params: Static<typeof readParameters>, signal) {
      const rel = await runner.path(params.path);
      const offset = params.offset ?? 1;
      const limit = params.limit ?? DEFAULT_READ_LINES;
      const maxBytes = runner.limits.outputBytes;
      // One byte over the cap tells a cut from an exact fit.
      const outcome = await runner.run(["/bin/sh", "-c", READ_SCRIPT, "sh", rel, String(offset), String(limit), String(maxBytes + 1)], {
        signal,
        outputBytes: maxBytes + 64,
      });
      const code = requireExit(outcome, runner, `Reading ${params.path}`);
      const out = outcome.output.toString("utf8");
      if (code === Exit.binary) throw new Error(`${params.path} is a binary file (${out.trim()} bytes)`);
      if (code !== 0) throw fileError(code, params.path, outcome);
      const newline = out.indexOf("\n");
      const lines = Number(out.slice(0, newline)) + 1;
      let body = out.slice(newline + 1);
      if (offset > lines && !(offset === 1 && lines === 1)) {
        throw new Error(`Offset ${offset} is past the end of ${params.path} (${lines} lines)`);
      }
      let truncatedBytes = false;
      if (Buffer.byteLength(body) > maxBytes) {
        // Keep whole lines only.
        body = body.slice(0, Math.max(0, body.lastIndexOf("\n", maxBytes)));
        truncatedBytes = true;
      }
      // `tail | head -n` keeps a final newline that split() would count as an empty line.
      let selected = body.split("\n");
      if (!truncatedBytes && body.endsWith("\n") && offset - 1 + selected.length > lines) selected = selected.slice(0, -1);
      if (selected.length > limit) selected = selected.slice(0, limit);
      let text = selected.join("\n");
      const last = offset - 1 + selected.length;
      if (last < lines || truncatedBytes) {
        text += `\n[showing lines ${offset}-${last} of ${lines}; continue with offset ${last + 1}]`;
      }
      return textResult(text, { lines });
    },
  };
}

// ---------------------------------------------------------------------------------
// write

const writeParameters = Type.Object({
  path: Type.String({ description: "File path, relative to the workspace. Parent directories are created." }),
  content: Type.String({ description: "The complete new content of the file." }),
});

/** Writes standard input to `$1`, creating parent directories. */
const WRITE_SCRIPT = `exec 2>&1; f=$1
case "$f" in */*) mkdir -p -- "\${f%/*}" || exit ${21};; esac
[ -d "$f" ] && exit ${11}
cat > "$f" || exit ${21}`;

function writeTool(runner: ToolRunner): AgentTool<typeof writeParameters> {
  return {
    name: "write",
    label: "Write file",
    description: "Create or overwrite a file in the workspace with the given content.",
    parameters: writeParameters,
    async execute(_id, params: Static<typeof writeParameters>, signal) {
      runner.refuseWhenOverDisk();
      const rel = await runner.path(params.path);
      if (rel === ".") throw new Error(`${params.path} is the workspace directory`);
      const content = Buffer.from(params.content, "utf8");
      await writeFile(runner, rel, params.path, content, signal);
      return textResult(`Wrote ${content.length} bytes to ${params.path}`, { bytes: content.length });
    },
  };
}

async function writeFile(runner: ToolRunner, rel: string, shown: string, content: Buffer, signal: AbortSignal | undefined): Promise<void> {
  const outcome = await runner.run(["/bin/sh", "-c", WRITE_SCRIPT, "sh", rel], { signal, stdin: content });
  const code = requireExit(outcome, runner, `Writing ${shown}`);
  if (code !== 0) {
    const note = runner.limitNotes(outcome);
    const error = fileError(code, shown, outcome);
    throw note ? new Error(`${error.message}\n${note.trim()}`) : error;
  }
  if (outcome.limits.includes("disk")) throw new Error(`Wrote ${shown}, but ${describeLimit("disk", runner.limits)}`);
}

// ---------------------------------------------------------------------------------
// edit

const editParameters = Type.Object({
  path: Type.String({ description: "File path, relative to the workspace." }),
  old_text: Type.String({ description: "Exact text to replace; must occur exactly once in the file." }),
  new_text: Type.String({ description: "Replacement text." }),
});

/** Prints the whole of a readable regular file `$1`, refusing anything bigger than `$2` bytes. */
const CAT_SCRIPT = `exec 2>/dev/null; f=$1
[ -e "$f" ] || exit ${10}
[ -d "$f" ] && exit ${11}
[ -f "$f" ] || exit ${12}
[ -r "$f" ] || exit ${13}
[ "$(stat -c %s -- "$f")" -le "$2" ] || exit ${16}
cat -- "$f"`;

function editTool(runner: ToolRunner): AgentTool<typeof editParameters> {
  return {
    name: "edit",
    label: "Edit file",
    description:
      "Replace one exact occurrence of old_text with new_text in a workspace file. " +
      "old_text must match exactly once; include surrounding lines to make it unique.",
    parameters: editParameters,
    async execute(_id, params: Static<typeof editParameters>, signal) {
      if (params.old_text.length === 0) throw new Error("old_text must not be empty");
      runner.refuseWhenOverDisk();
      const rel = await runner.path(params.path);
      const read = await runner.run(["/bin/sh", "-c", CAT_SCRIPT, "sh", rel, String(MAX_EDIT_BYTES)], {
        signal,
        outputBytes: MAX_EDIT_BYTES + 1,
      });
      const code = requireExit(read, runner, `Reading ${params.path}`);
      if (code === 16) throw new Error(`${params.path} is larger than ${formatBytes(MAX_EDIT_BYTES)}; edit it with bash`);
      if (code !== 0) throw fileError(code, params.path, read);
      const content = read.output.toString("utf8");
      const first = content.indexOf(params.old_text);
      if (first < 0) throw new Error(`old_text was not found in ${params.path}`);
      const occurrences = countOccurrences(content, params.old_text);
      if (occurrences > 1) {
        throw new Error(
          `old_text occurs ${occurrences} times in ${params.path}; include more context to make it unique`,
        );
      }
      // Slicing, not String.replace, so `$` in new_text stays literal.
      const updated = content.slice(0, first) + params.new_text + content.slice(first + params.old_text.length);
      await writeFile(runner, rel, params.path, Buffer.from(updated, "utf8"), signal);
      return textResult(`Edited ${params.path}`, { path: params.path });
    },
  };
}

function countOccurrences(haystack: string, needle: string): number {
  let count = 0;
  for (let at = haystack.indexOf(needle); at >= 0; at = haystack.indexOf(needle, at + needle.length)) count++;
  return count;
}

// ---------------------------------------------------------------------------------
// ls

const lsParameters = Type.Object({
  path: Type.Optional(Type.String({ description: 'Directory, relative to the workspace. Default ".".' })),
});

/** NUL-separated entries of directory `$1`, each its type letter (find's %y) then its name. */
const LS_SCRIPT = `exec 2>/dev/null; d=$1
[ -e "$d" ] || exit ${10}
[ -d "$d" ] || exit ${15}
find "$d/" -mindepth 1 -maxdepth 1 -printf '%y%f\\0' | head -c "$2"`;

function lsTool(runner: ToolRunner): AgentTool<typeof lsParameters> {
  return {
    name: "ls",
    label: "List directory",
    description: "List a workspace directory: one entry per line, directories end with /, links with @.",
    parameters: lsParameters,
    async execute(_id, params: Static<typeof lsParameters>, signal) {
      const target = params.path ?? ".";
      const rel = await runner.path(target);
      const outcome = await runner.run(["/bin/sh", "-c", LS_SCRIPT, "sh", rel, String(MAX_LS_BYTES)], {
        signal,
        outputBytes: MAX_LS_BYTES,
      });
      const code = requireExit(outcome, runner, `Listing ${target}`);
      if (code !== 0) throw fileError(code, target, outcome);
      const raw = outcome.output.toString("utf8").split("\0");
      const complete = raw.pop() === "";
      const names = raw
        .filter((entry) => entry.length > 1)
        .map((entry) => entry.slice(1) + (entry[0] === "d" ? "/" : entry[0] === "l" ? "@" : ""))
        .sort((a, b) => a.localeCompare(b));
      const shown = names.slice(0, MAX_LS_ENTRIES);
      let text = shown.length > 0 ? shown.join("\n") : "(empty directory)";
      if (names.length > shown.length || !complete) {
        text += `\n[${complete ? names.length - shown.length : "more than " + (names.length - shown.length)} more entries not shown]`;
      }
      return textResult(text, { entries: names.length });
    },
  };
}
