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
import type { AgentTool } from "@mariozechner/pi-agent-core";
import { Type } from "@mariozechner/pi-ai";
import { memberCount, type BuiltinTool } from "../src/index.js";
import { editTool, lsTool, readTool, writeTool } from "./file-tools.js";
import { formatBytes } from "./sandbox-limits.js";
import { formatSeconds, textResult, ToolRunner, Workspace, type WorkspaceToolsOptions } from "./tool-runner.js";

export { DEFAULT_COMMAND_TIMEOUT_MS, MAX_OUTPUT_BYTES, Workspace, type WorkspaceToolsOptions } from "./tool-runner.js";

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
  return names.map((name) => ({ ...build[name](), prepareArguments: boundedArguments }));
}

/** The most members and items one call's arguments may hold, at every depth; every tool takes at most four plain values. */
const MAX_ARGUMENT_MEMBERS = 1_000;

/**
 * A call's arguments, bounded before validation: one object holding at most
 * {@link MAX_ARGUMENT_MEMBERS} members and items. Anything else is refused here with a
 * short reason: the validator after this quotes refused arguments whole, pretty-printed,
 * and a model's 2 MB of deeply nested arrays became ~140 MB of error text, 24 s of the
 * node's event loop and 2 GB of memory (found by a probe). Within the bound the quote is at
 * most ~150 KB (64 levels of indentation per line); extra keys the tools ignore still pass,
 * and a gated call shows them.
 */
export function boundedArguments(args: unknown): Record<string, unknown> {
  if (args === null || typeof args !== "object" || Array.isArray(args)) throw new Error("The arguments must be a JSON object.");
  if (memberCount(args, MAX_ARGUMENT_MEMBERS) > MAX_ARGUMENT_MEMBERS) {
    throw new Error(`The arguments may hold at most ${MAX_ARGUMENT_MEMBERS} members and items; this tool takes a few strings and numbers.`);
  }
  return args as Record<string, unknown>;
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
      await runner.refuseWhenShort();
      const outcome = await runner.run(["/bin/bash", "-c", MERGED_STDERR, "/bin/bash", params.command], { signal, limitsFromOutput: true });
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
