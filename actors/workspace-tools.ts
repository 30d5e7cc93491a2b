/**
 * The built-in workspace tools (`bash`, `read`, `write`, `edit`, `ls`) as
 * pi-agent-core tools, confined to one run's workspace directory.
 *
 * Confinement: every path argument is resolved against the workspace; a path that
 * leaves it lexically (`..`, an absolute path elsewhere) or through a symbolic link
 * (checked with realpath on the longest existing prefix) is refused. Dangling
 * symbolic links are refused too, since writing through one could land anywhere.
 * `bash` starts in the workspace but is not sandboxed: confinement of commands is
 * the platform's job (sandbox, network policy), not this module's.
 *
 * Failures throw, so the agent loop returns them to the model as error tool results;
 * they never fail the turn.
 */
import { spawn } from "node:child_process";
import { constants as fsConstants } from "node:fs";
import { access, lstat, mkdir, readdir, readFile, realpath, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import type { AgentTool, AgentToolResult } from "@mariozechner/pi-agent-core";
import { Type, type Static } from "@mariozechner/pi-ai";
import type { BuiltinTool } from "../src/domain.js";

export interface WorkspaceToolsOptions {
  /** Time limit of one `bash` command. Default 300 s. */
  commandTimeoutMs?: number;
  /** Environment values for commands, on top of the minimal base (PATH, HOME, LANG…). */
  env?: Record<string, string>;
}

export const DEFAULT_COMMAND_TIMEOUT_MS = 300_000;
/** Captured command output is cut to its last 64 KiB. */
export const MAX_OUTPUT_BYTES = 64 * 1024;
const DEFAULT_READ_LINES = 2000;
const MAX_LS_ENTRIES = 1000;
/** How long to wait for the output pipes after the command exited (background children may hold them). */
const PIPE_DRAIN_MS = 200;
/** After SIGTERM to the process group, SIGKILL follows this late. */
const KILL_GRACE_MS = 1000;

/**
 * Creates the named tools for `dir`, in the order given. `dir` must exist.
 * Commands receive a minimal environment, never the service's own (which holds
 * secrets such as RUNS_MASTER_KEY): PATH, HOME, LANG, LC_ALL, TZ, TMPDIR when set,
 * TERM=dumb, plus `options.env`.
 */
export function createWorkspaceTools(
  dir: string,
  names: readonly BuiltinTool[],
  options: WorkspaceToolsOptions = {},
): AgentTool<any>[] {
  const workspace = new Workspace(dir);
  const build: Record<BuiltinTool, () => AgentTool<any>> = {
    bash: () => bashTool(workspace, options),
    read: () => readTool(workspace),
    write: () => writeTool(workspace),
    edit: () => editTool(workspace),
    ls: () => lsTool(workspace),
  };
  return names.map((name) => build[name]());
}

/** Resolves tool paths inside one workspace directory. */
export class Workspace {
  readonly root: string;
  private realRoot?: Promise<string>;

  constructor(dir: string) {
    this.root = path.resolve(dir);
  }

  /**
   * The absolute path `p` names inside the workspace (following symbolic links of
   * existing parts). Throws when it would leave the workspace.
   */
  async resolve(p: string): Promise<string> {
    this.realRoot ??= realpath(this.root);
    const realRoot = await this.realRoot;
    if (p.includes("\0")) throw new Error(`Invalid path: ${JSON.stringify(p)}`);
    // An absolute path may name the workspace by its configured or its real location.
    let candidate = path.resolve(this.root, p);
    if (isInside(realRoot, candidate)) candidate = path.join(this.root, path.relative(realRoot, candidate));
    if (!isInside(this.root, candidate)) throw escapeError(p);

    // Follow links through the longest existing prefix; the rest does not exist yet.
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

// ---------------------------------------------------------------------------------
// bash

const bashParameters = Type.Object({
  command: Type.String({ description: "The command line to run with bash in the workspace directory." }),
});

export interface BashDetails {
  exitCode: number | null;
  truncated: boolean;
}

function bashTool(workspace: Workspace, options: WorkspaceToolsOptions): AgentTool<typeof bashParameters, BashDetails> {
  const timeoutMs = options.commandTimeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
  return {
    name: "bash",
    label: "Run command",
    description:
      `Run a shell command in the workspace directory. Stdout and stderr are returned together ` +
      `(the last ${MAX_OUTPUT_BYTES / 1024} KiB). Commands are stopped after ${Math.round(timeoutMs / 1000)} s.`,
    parameters: bashParameters,
    executionMode: "sequential",
    async execute(_toolCallId, params, signal) {
      const outcome = await runCommand(params.command, {
        cwd: workspace.root,
        timeoutMs,
        signal,
        env: commandEnvironment(workspace.root, options.env),
      });
      const output = outcome.output.length > 0 ? outcome.output : "(no output)";
      switch (outcome.kind) {
        case "exited":
          if (outcome.exitCode === 0) return textResult(output, { exitCode: 0, truncated: outcome.truncated });
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

function commandEnvironment(home: string, extra: Record<string, string> | undefined): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { TERM: "dumb", HOME: process.env.HOME ?? home };
  for (const name of ["PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER"]) {
    const value = process.env[name];
    if (value !== undefined) env[name] = value;
  }
  env.PATH ??= "/usr/local/bin:/usr/bin:/bin";
  return { ...env, ...extra };
}

export type CommandOutcome =
  | { kind: "exited"; exitCode: number; output: string; truncated: boolean }
  | { kind: "signalled"; signal: string; output: string; truncated: boolean }
  | { kind: "timed_out"; output: string; truncated: boolean }
  | { kind: "aborted"; output: string; truncated: boolean };

/** Runs the command (`$1`) in a new shell (`$0`) whose stderr is its stdout. */
const MERGED_STDERR = 'exec "$0" -c "$1" 2>&1';

let shellPromise: Promise<{ file: string; args: (command: string) => string[] }> | undefined;

/**
 * `bash -c` (no login profile: it costs ~240 ms a call) when bash is on PATH, else
 * `/bin/sh -c`. Looked up once. The shell re-executes itself with stderr on stdout
 * (`exec "$0" -c "$1" 2>&1`): the output is returned as one stream anyway, in the
 * order it was written, and a running command then holds one pipe in the node
 * instead of two (10,000 sleeping commands fit in a 20,000-descriptor limit).
 */
function shell(): Promise<{ file: string; args: (command: string) => string[] }> {
  shellPromise ??= (async () => {
    for (const dir of (process.env.PATH ?? "/usr/bin:/bin").split(path.delimiter)) {
      if (!dir) continue;
      const candidate = path.join(dir, "bash");
      try {
        await access(candidate, fsConstants.X_OK);
        return { file: candidate, args: (command: string) => ["-c", MERGED_STDERR, candidate, command] };
      } catch {
        // keep looking
      }
    }
    return { file: "/bin/sh", args: (command: string) => ["-c", MERGED_STDERR, "/bin/sh", command] };
  })();
  return shellPromise;
}

/**
 * Runs `command` in its own process group. On timeout or abort the whole group gets
 * SIGTERM, then SIGKILL after a grace period, so children (`sleep`, servers) die too.
 * Resolves once the shell exited and its output pipes drained (or stopped mattering).
 */
export async function runCommand(
  command: string,
  options: { cwd: string; timeoutMs: number; signal?: AbortSignal; env?: NodeJS.ProcessEnv },
): Promise<CommandOutcome> {
  const { file, args } = await shell();
  const output = new OutputTail(MAX_OUTPUT_BYTES);
  if (options.signal?.aborted) return { kind: "aborted", ...output.result() };

  return new Promise<CommandOutcome>((resolve) => {
    const child = spawn(file, args(command), {
      cwd: options.cwd,
      env: options.env,
      detached: true, // own process group, so the group can be killed as a whole
      stdio: ["ignore", "pipe", "ignore"], // stderr arrives on stdout (see shell())
    });
    let stoppedBy: "timed_out" | "aborted" | undefined;
    let settled = false;
    let killTimer: NodeJS.Timeout | undefined;
    let drainTimer: NodeJS.Timeout | undefined;

    const killGroup = (sig: NodeJS.Signals) => {
      if (child.pid === undefined) return;
      try {
        process.kill(-child.pid, sig);
      } catch {
        // the group is already gone
      }
    };
    let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
    const stop = (reason: "timed_out" | "aborted") => {
      if (stoppedBy || settled || exit) return;
      stoppedBy = reason;
      killGroup("SIGTERM");
      killTimer = setTimeout(() => killGroup("SIGKILL"), KILL_GRACE_MS);
      killTimer.unref();
    };
    const onAbort = () => stop("aborted");
    const timeout = setTimeout(() => stop("timed_out"), options.timeoutMs);
    options.signal?.addEventListener("abort", onAbort, { once: true });

    const settle = (outcome: CommandOutcome) => {
      if (settled) return;
      settled = true;
      clearTimeout(timeout);
      clearTimeout(drainTimer);
      options.signal?.removeEventListener("abort", onAbort);
      child.stdout?.destroy();
      resolve(outcome);
    };
    const finish = () => {
      if (!exit) return;
      const captured = output.result();
      if (stoppedBy === "timed_out") return settle({ kind: "timed_out", ...captured });
      if (stoppedBy === "aborted") return settle({ kind: "aborted", ...captured });
      if (exit.code !== null) return settle({ kind: "exited", exitCode: exit.code, ...captured });
      return settle({ kind: "signalled", signal: exit.signal ?? "unknown", ...captured });
    };

    child.stdout?.on("data", (chunk: Buffer) => output.push(chunk));
    child.on("error", (error) => {
      output.push(Buffer.from(`Could not start the command: ${error.message}\n`));
      exit ??= { code: 127, signal: null };
      finish();
    });
    child.on("exit", (code, signal) => {
      exit = { code, signal };
      // Background children may keep the pipes open: give them a moment, then stop waiting.
      if (stoppedBy) {
        // The group was signalled; a SIGKILL is still pending for stragglers.
        finish();
        return;
      }
      drainTimer = setTimeout(finish, PIPE_DRAIN_MS);
    });
    child.on("close", () => finish());
  });
}

/** Keeps the last `limit` bytes of a byte stream and counts the rest. */
class OutputTail {
  private chunks: Buffer[] = [];
  private kept = 0;
  private total = 0;

  constructor(private readonly limit: number) {}

  push(chunk: Buffer): void {
    this.total += chunk.length;
    this.chunks.push(chunk);
    this.kept += chunk.length;
    while (this.kept - this.chunks[0].length >= this.limit) {
      this.kept -= this.chunks[0].length;
      this.chunks.shift();
    }
  }

  result(): { output: string; truncated: boolean } {
    let buffer = Buffer.concat(this.chunks);
    if (buffer.length > this.limit) buffer = buffer.subarray(buffer.length - this.limit);
    const truncated = this.total > buffer.length;
    const text = buffer.toString("utf8");
    return {
      output: truncated ? `[output truncated: last ${buffer.length} of ${this.total} bytes]\n${text}` : text,
      truncated,
    };
  }
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

function readTool(workspace: Workspace): AgentTool<typeof readParameters> {
  return {
    name: "read",
    label: "Read file",
    description:
      `Read a text file from the workspace. Returns up to ${DEFAULT_READ_LINES} lines ` +
      `(${MAX_OUTPUT_BYTES / 1024} KiB) from \`offset\`; use offset and limit for the rest.`,
    parameters: readParameters,
    async execute(_id, params: Static<typeof readParameters>) {
      const file = await workspace.resolve(params.path);
      const info = await stat(file);
      if (info.isDirectory()) throw new Error(`${params.path} is a directory; use ls`);
      const bytes = await readFile(file);
      if (bytes.includes(0)) throw new Error(`${params.path} is a binary file (${bytes.length} bytes)`);
      const lines = bytes.toString("utf8").split("\n");
      const offset = params.offset ?? 1;
      const limit = params.limit ?? DEFAULT_READ_LINES;
      if (offset > lines.length && !(offset === 1 && lines.length === 1)) {
        throw new Error(`Offset ${offset} is past the end of ${params.path} (${lines.length} lines)`);
      }
      let selected = lines.slice(offset - 1, offset - 1 + limit);
      let text = selected.join("\n");
      let truncatedBytes = false;
      while (Buffer.byteLength(text) > MAX_OUTPUT_BYTES && selected.length > 1) {
        selected = selected.slice(0, Math.ceil(selected.length / 2));
        text = selected.join("\n");
        truncatedBytes = true;
      }
      const last = offset - 1 + selected.length;
      if (last < lines.length || truncatedBytes) {
        text += `\n[showing lines ${offset}-${last} of ${lines.length}; continue with offset ${last + 1}]`;
      }
      return textResult(text, { lines: lines.length });
    },
  };
}

// ---------------------------------------------------------------------------------
// write

const writeParameters = Type.Object({
  path: Type.String({ description: "File path, relative to the workspace. Parent directories are created." }),
  content: Type.String({ description: "The complete new content of the file." }),
});

function writeTool(workspace: Workspace): AgentTool<typeof writeParameters> {
  return {
    name: "write",
    label: "Write file",
    description: "Create or overwrite a file in the workspace with the given content.",
    parameters: writeParameters,
    async execute(_id, params: Static<typeof writeParameters>) {
      const file = await workspace.resolve(params.path);
      await mkdir(path.dirname(file), { recursive: true });
      // The parent may have been created through a link made since resolve: check again.
      await workspace.resolve(params.path);
      await writeFile(file, params.content, "utf8");
      const bytes = Buffer.byteLength(params.content);
      return textResult(`Wrote ${bytes} bytes to ${params.path}`, { bytes });
    },
  };
}

// ---------------------------------------------------------------------------------
// edit

const editParameters = Type.Object({
  path: Type.String({ description: "File path, relative to the workspace." }),
  old_text: Type.String({ description: "Exact text to replace; must occur exactly once in the file." }),
  new_text: Type.String({ description: "Replacement text." }),
});

function editTool(workspace: Workspace): AgentTool<typeof editParameters> {
  return {
    name: "edit",
    label: "Edit file",
    description:
      "Replace one exact occurrence of old_text with new_text in a workspace file. " +
      "old_text must match exactly once; include surrounding lines to make it unique.",
    parameters: editParameters,
    async execute(_id, params: Static<typeof editParameters>) {
      if (params.old_text.length === 0) throw new Error("old_text must not be empty");
      const file = await workspace.resolve(params.path);
      const content = await readFile(file, "utf8");
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
      await writeFile(file, updated, "utf8");
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

function lsTool(workspace: Workspace): AgentTool<typeof lsParameters> {
  return {
    name: "ls",
    label: "List directory",
    description: "List a workspace directory: one entry per line, directories end with /, links with @.",
    parameters: lsParameters,
    async execute(_id, params: Static<typeof lsParameters>) {
      const target = params.path ?? ".";
      const dir = await workspace.resolve(target);
      const entries = await readdir(dir, { withFileTypes: true });
      const names = entries
        .map((entry) => entry.name + (entry.isDirectory() ? "/" : entry.isSymbolicLink() ? "@" : ""))
        .sort((a, b) => a.localeCompare(b));
      const shown = names.slice(0, MAX_LS_ENTRIES);
      let text = shown.length > 0 ? shown.join("\n") : "(empty directory)";
      if (names.length > shown.length) text += `\n[${names.length - shown.length} more entries not shown]`;
      return textResult(text, { entries: names.length });
    },
  };
}
