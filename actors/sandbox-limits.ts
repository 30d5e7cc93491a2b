/**
 * Resource limits of one sandboxed tool command (decisions: `config.limits`), their
 * defaults, and the words a tool result uses when a command ran into one. Pure.
 */
import type { AgentConfig } from "../src/index.js";

export interface SandboxLimits {
  /** Memory of all the command's processes together (cgroup), or what each process writes (rlimit: RLIMIT_DATA, see rlimitArgs). */
  memoryBytes: number;
  /** Processes and threads the command may run at once. */
  processes: number;
  /** CPU seconds per process (RLIMIT_CPU); the command's wall time is `command_timeout_s`. */
  cpuSeconds: number;
  /** Bytes the workspace may hold; also the largest single file a command may write. */
  diskBytes: number;
  /** Output a tool returns: the last this many bytes. */
  outputBytes: number;
  /** Size of the private `/tmp`. */
  tmpBytes: number;
}

const MiB = 1024 * 1024;

/** Defaults when a deployment names no limit. */
export const DEFAULT_LIMITS: SandboxLimits = {
  memoryBytes: 512 * MiB,
  processes: 256,
  cpuSeconds: 600,
  diskBytes: 1024 * MiB,
  outputBytes: 64 * 1024,
  tmpBytes: 256 * MiB,
};

/** A deployment's `config.limits` with defaults filled in. */
export function limitsOf(config: Pick<AgentConfig, "limits">): SandboxLimits {
  const l = config.limits ?? {};
  return {
    memoryBytes: l.memory_mb !== undefined ? l.memory_mb * MiB : DEFAULT_LIMITS.memoryBytes,
    processes: l.processes ?? DEFAULT_LIMITS.processes,
    cpuSeconds: l.cpu_s ?? DEFAULT_LIMITS.cpuSeconds,
    diskBytes: l.disk_mb !== undefined ? l.disk_mb * MiB : DEFAULT_LIMITS.diskBytes,
    outputBytes: l.output_kb !== undefined ? l.output_kb * 1024 : DEFAULT_LIMITS.outputBytes,
    tmpBytes: l.tmp_mb !== undefined ? l.tmp_mb * MiB : DEFAULT_LIMITS.tmpBytes,
  };
}

/** The most files and folders any workspace may hold, whatever its disk limit. */
export const MAX_WORKSPACE_ENTRIES = 1_000_000;

/**
 * Files and folders a workspace may hold: one per 4 KiB of its disk limit (262,144 at the
 * default 1 GiB), at most {@link MAX_WORKSPACE_ENTRIES} (a deployment names its disk
 * limit). An empty file takes an inode and no block, so bytes alone do not bound what a
 * command can make the host's filesystem hold.
 */
export function maxEntries(limits: Pick<SandboxLimits, "diskBytes">): number {
  return Math.max(1, Math.min(MAX_WORKSPACE_ENTRIES, Math.floor(limits.diskBytes / 4096)));
}

/**
 * Whether a node with `free` bytes on its workspaces' filesystem is short of its `reserve`:
 * below it; once short (`wasShort`), until an eighth more than it is free.
 */
export function diskShort(free: number, reserve: number, wasShort: boolean): boolean {
  return free < (wasShort ? reserve + reserve / 8 : reserve);
}

/** A limit a command ran into. */
export type LimitHit = "memory" | "processes" | "cpu" | "file_size" | "tmp" | "disk" | "files" | "host_disk" | "host_memory" | "output";

/** One sentence for the agent, naming the limit and its value. */
export function describeLimit(hit: LimitHit, limits: SandboxLimits): string {
  switch (hit) {
    case "memory":
      // Killed with cgroups; refused memory with rlimits (sandbox-host.ts, rlimitHits).
      return `the sandbox's memory limit (${formatBytes(limits.memoryBytes)}) was reached: the command was killed or refused memory`;
    case "processes":
      return `the sandbox's process limit (${limits.processes}) was reached: some processes could not be started`;
    case "cpu":
      return `the sandbox's CPU time limit (${limits.cpuSeconds} s per process) was reached and the command was killed`;
    case "file_size":
      return `a file reached the sandbox's file size limit (${formatBytes(limits.diskBytes)})`;
    case "tmp":
      // The kernel's answer to a write through a mapping whose tmpfs is full: no error to return, so a signal.
      return `a process was killed by SIGBUS, as a write through a memory mapping is when its filesystem is full: /tmp and /dev/shm hold ${formatBytes(limits.tmpBytes)} each`;
    case "disk":
      return `the workspace is over its disk limit (${formatBytes(limits.diskBytes)}): delete files before writing more`;
    case "files":
      return `the workspace holds more than ${maxEntries(limits)} files and folders (one per 4 KiB of its disk limit, at most ${MAX_WORKSPACE_ENTRIES}): delete some before writing more`;
    case "host_disk":
      // The node's reserve (RUNS_DISK_RESERVE_MB), not the run's: its figure is the operator's, not the agent's.
      return "the node's disk is almost full: running commands are stopped and writes refuse until there is room again";
    case "host_memory":
      // RUNS_SANDBOX_MEMORY_MB, the operator's figure, not the agent's.
      return "the memory all commands on this node share was used up: the command was killed (it may run when the node is less busy)";
    case "output":
      return `the output was cut to its last ${formatBytes(limits.outputBytes)}`;
  }
}

export function formatBytes(bytes: number): string {
  if (bytes >= MiB && bytes % MiB === 0) return `${bytes / MiB} MiB`;
  if (bytes >= 1024 && bytes % 1024 === 0) return `${bytes / 1024} KiB`;
  return `${bytes} bytes`;
}
