/**
 * The per-run sandbox every tool command runs in: bubblewrap (`bwrap`) with new
 * user, mount, PID, IPC, UTS, network and cgroup namespaces, an unprivileged uid
 * inside and outside, the run's workspace as the only writable mount (`/workspace`),
 * a read-only minimal system, a private size-capped `/tmp`, a fresh `/proc`, a
 * cleared environment, and limits (memory, processes, CPU, disk, output) through
 * cgroups or, where the host offers none, rlimits.
 *
 * Each command is its own sandbox. bwrap's pid 1 ends with the command, and the
 * kernel then kills everything else in its PID namespace: a `setsid` or double-forked
 * child never outlives the command, let alone the turn; the command's cgroup is
 * swept as well. Cancelling kills the sandbox at once.
 *
 * Network: none (a network namespace with only loopback). A deployment with
 * `config.network.allow` gets an HTTP(S) proxy at 127.0.0.1:3128 inside the sandbox
 * (socat relays it to a Unix socket of the service's {@link EgressProxy}, which
 * checks every destination against the allow list and refuses private addresses).
 *
 * `RUNS_SANDBOX=off` runs commands as plain child processes in the workspace
 * directory (local development only: no confinement at all).
 */
import { spawnSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { constants as fsConstants, openSync, closeSync, existsSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { chown, mkdir, readFile, rm, statfs } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { Logger } from "pino";
import type { EgressDenial, EgressProxy } from "./egress-proxy.js";
import { cgroupPathsOf, detectCgroups, type Cgroups, type CommandCgroup } from "./sandbox-cgroups.js";
import { diskShort, type LimitHit, type SandboxLimits } from "./sandbox-limits.js";
import { DEFAULT_SANDBOX_PROCESSES, defaultSandboxMemoryBytes, MAX_COMMAND_PROCESSES, type SandboxStatus } from "../src/index.js";
import { bwrapArgs, clearSetIdBits, closeInheritedDescriptors, closedToOthers, SANDBOX_INNER_ID, SANDBOX_WORKSPACE, chownTree, findOnPath, hostLayout, isExecutable, LAUNCHER_PATH, launcherArgs, nprocFlagOf, rlimitArgs, rlimitOf, rlimitProcessesTotal, rlimitHits, shellReported, searchableDataDir, setupFailed, withEgressRelay, withProcessLimit, type HostLayout } from "./sandbox-host.js";
import { spawnAndWait, type RawOutcome } from "./sandbox-process.js";
import { refusedSyscalls, seccompArchOf, seccompProgram } from "./sandbox-seccomp.js";

export { SANDBOX_INNER_ID, SANDBOX_PROXY, SANDBOX_WORKSPACE, liveTreeUsage, setupFailed, treeUsage, type TreeUsage } from "./sandbox-host.js";
export { OutputTail } from "./sandbox-process.js";

/** Unprivileged uid/gid a root node runs sandboxes as (`RUNS_SANDBOX_UID`). */
export const DEFAULT_SANDBOX_UID = 65534;

/** Start attempts of one sandbox before the turn fails with sandbox_start_retries_exhausted. */
const START_ATTEMPTS = 3;
const START_BACKOFF_MS = [50, 250];

export type SandboxFailureCode = "sandbox_operation_failed" | "sandbox_capacity_exceeded" | "sandbox_start_retries_exhausted";

/** The sandbox itself failed (not the command in it): the turn cannot go on. */
export class SandboxFailure extends Error {
  constructor(
    readonly code: SandboxFailureCode,
    message: string,
  ) {
    super(message);
    this.name = "SandboxFailure";
  }
}

/** A node with the actor role cannot run sandboxes and was not told to run without. */
export class SandboxUnavailableError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "SandboxUnavailableError";
  }
}

export interface SandboxCommand {
  /** The run's workspace on the host; must exist. */
  workspaceDir: string;
  /**
   * What to execute inside, e.g. `["/bin/sh", "-c", script, "sh", arg]`; resolved in
   * the sandbox. It must send its stderr to stdout or /dev/null: the sandbox's stderr
   * carries bwrap's own failures.
   */
  argv: readonly string[];
  /** Bytes for the command's standard input (none: /dev/null). */
  stdin?: Buffer;
  /** The environment on top of the sandbox's base (PATH, HOME=/tmp, LANG, TERM, USER). */
  env?: Record<string, string>;
  timeoutMs: number;
  signal?: AbortSignal;
  limits: SandboxLimits;
  /** Destinations the command may reach through the egress proxy; none when empty. */
  networkAllow?: readonly string[];
  /** Called once per connection the egress proxy refused. */
  onNetworkDenied?: (denial: EgressDenial) => void;
  /**
   * A measurement of what the command has made so far (its workspace's size), taken while
   * it runs ({@link watchCommand}; `signal` is aborted when it ends): a limit it names stops
   * the command, reported as hit.
   */
  watch?: (signal: AbortSignal) => Promise<LimitHit | undefined>;
  /**
   * Read the command's output for the limits it met that no exit status shows: without
   * cgroups the memory and process limits a failed command reports ({@link rlimitHits}),
   * and in any mode the shell's report of a process killed by SIGXFSZ or SIGBUS
   * ({@link shellReported}). For a tenant's own command (`bash`), whose output is told to the
   * model; not for the file tools' scripts, whose output may echo a file or a path.
   */
  limitsFromOutput?: boolean;
  /**
   * The workspace (tenant) the command runs for: its commands running on this node hold
   * at most {@link tenantProcessShare} processes together (see {@link Sandbox.run}).
   */
  tenant?: string;
}

/**
 * The processes one workspace's running commands may hold together on a node: a quarter
 * of all sandboxes' (`RUNS_SANDBOX_PROCESSES`), so no tenant takes the node's whole pool
 * (found by a probe: four commands of 4,096 processes took all 16,384, and every other
 * tenant's commands then failed to start).
 */
export function tenantProcessShare(processesTotal: number): number {
  return Math.max(MIN_TENANT_COMMAND_PROCESSES, Math.floor(processesTotal / 4));
}

/** A command whose workspace's other commands hold its whole share still gets this many (to run at all). */
export const MIN_TENANT_COMMAND_PROCESSES = 16;

export type SandboxOutcome = (
  | { kind: "exited"; exitCode: number }
  | { kind: "signalled"; signal: string }
  | { kind: "timed_out" }
  | { kind: "aborted" }
) & {
  /** The last `limits.outputBytes` of stdout and stderr together. */
  output: Buffer;
  /** Bytes written in all, more than `output` holds when cut. */
  totalBytes: number;
  /** Limits the command ran into, for the tool's message. */
  limits: LimitHit[];
  /** The process limit it ran with, where its workspace's share made it lower than its own. */
  processes?: number;
};


export interface SandboxOptions {
  mode: "bwrap" | "off";
  /** The bwrap binary (`RUNS_SANDBOX_BWRAP`); found on PATH by default. */
  bwrapPath?: string;
  /** Concurrent sandboxes on this node (`RUNS_SANDBOX_MAX`). */
  maxConcurrent: number;
  /**
   * Processes and threads all sandboxes run at once (`RUNS_SANDBOX_PROCESSES`): the
   * `runs-sandboxes` cgroup's `pids.max`, or without cgroups the sandbox uid's RLIMIT_NPROC
   * on the host, set before bwrap (each command's own limit is set inside its sandbox).
   */
  processesTotal?: number;
  /**
   * Bytes of memory all sandboxes use at once (`RUNS_SANDBOX_MEMORY_MB`): the
   * `runs-sandboxes` cgroup's memory limit; without cgroups none (each command's rlimit).
   */
  memoryTotalBytes?: number;
  /** Host uid/gid for sandboxes when the node runs as root (`RUNS_SANDBOX_UID`). */
  uid?: number;
  /** Where per-command egress sockets are made (inside the service's data folder). */
  runtimeDir: string;
  nodeId: string;
  log: Logger;
  egress?: EgressProxy;
  /** A cgroup mount other than /sys/fs/cgroup, or false to use rlimits only. */
  cgroupRoot?: string | false;
  /**
   * Bytes kept free on the filesystem of the workspaces (`RUNS_DISK_RESERVE_MB`): a command
   * running while less is left is stopped, and the file tools' writes refuse, whatever its
   * run's own limit. 0: none.
   */
  diskReserveBytes?: number;
}

/**
 * How often a running command is checked ({@link SandboxCommand.watch}, and apart from it
 * the node's free disk): this long after the last check ended. A command shorter than this
 * is measured only after it ends.
 */
const WATCH_INTERVAL_MS = 1_000;

/**
 * The least pause after one measure of a running command's workspace before the node
 * takes the next in the same turn ({@link Sandbox.measureInTurn}): measures are taken one at
 * a time, each followed by a pause four times as long as it took, so together they use at
 * most a fifth of one core however many commands run (each is then measured less often).
 */
const MEASURE_PAUSE_MS = 25;

/**
 * The quick turn's measures are stopped past this: the workspace (a very large tree) is
 * measured in a turn of its own from then on, each measure followed by a pause nine times
 * as long (a tenth of one core at most), so one tenant's large workspace holds the other
 * workspaces' checks back no longer than this (and its pause) at a time.
 */
const QUICK_MEASURE_MS = 250;
const QUICK_PAUSE_FACTOR = 4;
const SLOW_PAUSE_FACTOR = 9;
/** Workspaces remembered as slow to measure (past it the oldest is forgotten, and measured once more in the quick turn). */
const SLOW_WORKSPACES_KEPT = 10_000;

/**
 * Runs `check` while a command runs, one check at a time, until it names a limit (then
 * `stop`) or the returned function is called (which also aborts a check under way). A
 * check that fails names none: the measurement after the command decides.
 */
function watchCommand(check: (signal: AbortSignal) => Promise<LimitHit | undefined>, stop: (hit: LimitHit) => void): () => void {
  const ended = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const tick = async () => {
    const hit = await check(ended.signal).catch(() => undefined);
    if (ended.signal.aborted) return;
    if (hit) return stop(hit);
    timer = setTimeout(tick, WATCH_INTERVAL_MS);
  };
  timer = setTimeout(tick, WATCH_INTERVAL_MS);
  return () => {
    ended.abort();
    clearTimeout(timer);
  };
}

/**
 * Where no cgroup weighs their CPU (rlimits, as in containers; cgroups without the cpu
 * controller), sandboxed commands run at this nice value, below the service, its stores
 * and the rest of the host: a tenant's busy loops otherwise take the node's cores from
 * the service in proportion to their number. At nice 19 a busy thread weighs 15 against
 * a nice-0 thread's 1,024: it takes ~68 of them per core to halve the service's share.
 * Commands cannot lower it (that needs CAP_SYS_NICE, or an RLIMIT_NICE the node warns
 * about); autogroups undo it (warned about where plain). With a CPU cgroup, all commands
 * together weigh as much as the service.
 */
export const SANDBOX_NICENESS = 19;

/** What an unprivileged process may still write on the filesystem holding `dir` (one statfs); undefined when it cannot say. */
async function freeBytes(dir: string): Promise<number | undefined> {
  try {
    const fs = await statfs(dir);
    return fs.bavail * fs.bsize;
  } catch {
    return undefined;
  }
}

/**
 * Runs commands in sandboxes. One per node: {@link Sandbox.start} checks the host
 * once (bwrap works, which limits apply) and says so in the log.
 */
export class Sandbox {
  private running = 0;
  /** The last {@link hostDiskLow} answer, for its log line when it changes. */
  private diskShort = false;
  /** The end of the last measure of each turn and its pause ({@link measureInTurn}). */
  private readonly measuring = { quick: Promise.resolve(), slow: Promise.resolve() };
  /** Workspaces whose last measure took over {@link QUICK_MEASURE_MS}, oldest first. */
  private readonly slowToMeasure = new Set<string>();
  /** The workspaces' folder was found open to others once (logged once). */
  private warnedOpenWorkspaces = false;
  /**
   * What the launcher execs bwrap through: without a CPU cgroup, `nice` by what brings
   * commands from the service's own value to {@link SANDBOX_NICENESS} (`nice -n` adds to
   * it); nothing with one, or where `nice` is not installed (warned at start).
   */
  private readonly niced: readonly string[];
  /** Processes each workspace's running commands hold (their limits), by workspace. */
  private readonly tenantProcesses = new Map<string, number>();

  private constructor(
    private readonly options: SandboxOptions,
    private readonly bwrap: string | undefined,
    private readonly cgroups: Cgroups | undefined,
    private readonly owner: { uid: number; gid: number } | undefined,
    private readonly socat: string | undefined,
    private readonly hostLayout: HostLayout,
    /** Processes all sandboxes run at once (rlimits: at most the node's own hard limit, which the launcher cannot raise). */
    private readonly processesTotal: number,
    /** Whether the launcher sets RLIMIT_RTPRIO to 0 (the node's own is not 0 already). */
    private readonly zeroRealtime: boolean,
    /** /bin/sh's `ulimit` flag for RLIMIT_NPROC (the launcher's and, inside the sandbox, the limit's wrapper's): bash says -u, dash -p. */
    private readonly nprocFlag = "-u",
    /** The seccomp filter bwrap loads for every command, and its file (none on an architecture without one). */
    private readonly seccomp?: { file: string; program: Buffer },
  ) {
    const nice = cgroups?.weighsCpu ? undefined : findOnPath("nice", LAUNCHER_PATH);
    this.niced = nice ? [nice, "-n", String(Math.max(0, SANDBOX_NICENESS - os.getPriority()))] : [];
  }

  /**
   * Prepares the node's sandboxes. With mode `bwrap`, throws
   * {@link SandboxUnavailableError} (saying how to install bubblewrap) when bwrap is
   * missing or cannot create namespaces here.
   */
  static async start(options: SandboxOptions): Promise<Sandbox> {
    const { log } = options;
    // Workspaces are checkpointed with tar and checked with find before (checkpoints.ts):
    // without them every turn with tools would fail at its end, so the node does not start.
    for (const [tool, pkg] of [["tar", "tar"], ["find", "findutils"]] as const) {
      if (!findOnPath(tool)) throw new SandboxUnavailableError(`${tool} is not installed: workspaces are checkpointed with GNU tar and checked with find. Install it (Debian/Ubuntu: apt-get install ${pkg}).`);
    }
    // Before any command: what this process inherited must not reach one.
    const closed = closeInheritedDescriptors();
    if (closed.length) log.warn({ descriptors: closed }, "sandbox: closed descriptors the service inherited (its parent left them open): a command would have inherited them");
    if (options.mode === "off") {
      log.warn(
        "RUNS_SANDBOX=off: tool commands run UNCONFINED as the service's own user, with its files, network and processes in reach. For local development only.",
      );
      return new Sandbox(options, undefined, undefined, undefined, findOnPath("socat"), hostLayout(), 0, false);
    }
    const bwrap = options.bwrapPath ? (isExecutable(options.bwrapPath) ? options.bwrapPath : undefined) : findOnPath("bwrap");
    if (!bwrap) {
      throw new SandboxUnavailableError(
        "bubblewrap (bwrap) is not installed: tool commands cannot be sandboxed. Install it (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap; Alpine: apk add bubblewrap), or set RUNS_SANDBOX=off for local development only.",
      );
    }
    const isRoot = process.getuid?.() === 0;
    const owner = isRoot ? { uid: options.uid ?? DEFAULT_SANDBOX_UID, gid: options.uid ?? DEFAULT_SANDBOX_UID } : undefined;
    const wanted = options.processesTotal ?? DEFAULT_SANDBOX_PROCESSES;
    const selfCgroup = await readFile("/proc/self/cgroup", "utf8").catch(() => "");
    const cgroups = options.cgroupRoot === false ? undefined : await detectCgroups({ root: options.cgroupRoot, processesTotal: wanted, memoryTotalBytes: options.memoryTotalBytes ?? defaultSandboxMemoryBytes(), log, selfCgroup });
    await mkdir(options.runtimeDir, { recursive: true, mode: 0o711 });
    if (owner) await searchableDataDir(path.dirname(options.runtimeDir), log);
    const nodeLimits = await readFile("/proc/self/limits", "utf8").catch(() => "");
    const processesTotal = cgroups ? wanted : rlimitTotalOrFail(wanted, nodeLimits, owner === undefined, log);
    if (processesTotal <= MAX_COMMAND_PROCESSES) {
      log.warn({ processes: processesTotal }, `sandbox: all sandboxes together get ${processesTotal} processes, no more than one command's largest limit (${MAX_COMMAND_PROCESSES}): one workspace's commands get a quarter of them (${tenantProcessShare(processesTotal)}), so a command may run with less than its own limit`);
    }
    const seccomp = writeSeccompFilter(options.runtimeDir, cgroups !== undefined, log);
    const sandbox = new Sandbox(
      options,
      bwrap,
      cgroups,
      owner,
      findOnPath("socat"),
      hostLayout(),
      processesTotal,
      realtimeToZero(nodeLimits, log),
      cgroups ? undefined : nprocFlagOrFail("/bin/sh"),
      seccomp,
    );
    // One real sandbox proves namespaces work here (a container without user
    // namespaces fails now, with bwrap's own words, not at a tenant's first command).
    const probeDir = await sandbox.mkProbeWorkspace();
    try {
      const outcome = await sandbox.runOnce(
        { workspaceDir: probeDir, argv: ["/bin/sh", "-c", "id -u 2>&1"], timeoutMs: 30_000, limits: probeLimits },
        `probe-${randomBytes(6).toString("hex")}`,
        true,
      );
      const text = outcome.output.toString("utf8").trim();
      if (outcome.kind !== "exited" || outcome.exitCode !== 0 || text !== String(SANDBOX_INNER_ID)) {
        // Not a bwrap failure (those are thrown), but not the expected answer either.
        throw new SandboxUnavailableError(
          `bubblewrap (${bwrap}) cannot create a sandbox on this host: ${text || JSON.stringify({ ...outcome, output: undefined })}. It needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0; in containers see docs/deploy-sandbox.md), or set RUNS_SANDBOX=off for local development only.`,
        );
      }
    } catch (err) {
      if (err instanceof SandboxStartError || err instanceof SandboxFailure) {
        const traversal = /Permission denied/.test(err.message) && owner
          ? ` The sandbox's user (uid ${owner.uid}) must be able to reach ${options.runtimeDir}: every folder above it needs the search bit for others (chmod o+x), or set RUNS_DATA_DIR elsewhere.`
          : /seccomp/i.test(err.message)
            ? " The kernel refused the sandbox's seccomp filter: it needs seccomp filters (CONFIG_SECCOMP_FILTER), which mainstream kernels have."
            : " It needs unprivileged user namespaces (see docs/deploy-sandbox.md).";
        throw new SandboxUnavailableError(
          `bubblewrap (${bwrap}) cannot create a sandbox on this host: ${err.message}.${traversal} RUNS_SANDBOX=off runs without (local development only).`,
        );
      }
      throw err;
    } finally {
      await rm(probeDir, { recursive: true, force: true });
    }
    if (!cgroups?.weighsCpu) await warnWhereNiceFallsShort(sandbox.niced.length > 0, nodeLimits, selfCgroup, log);
    const status = sandbox.status();
    log.info(
      { sandbox: status },
      `sandbox: bubblewrap, limits by ${status.limits}, running as uid ${status.uid}${status.egress ? "" : "; socat missing: deployments with network.allow will fail their commands"}`,
    );
    return sandbox;
  }

  status(): SandboxStatus {
    return {
      mode: this.options.mode,
      limits: this.options.mode === "off" ? "none" : (this.cgroups?.mechanism ?? "rlimit"),
      cpu: this.options.mode === "off" ? "none" : this.cgroups?.weighsCpu ? "cgroup" : this.niced.length > 0 ? "nice" : "none",
      seccomp: this.options.mode !== "off" && this.seccomp !== undefined,
      uid: this.options.mode === "off" ? null : (this.owner?.uid ?? process.getuid?.() ?? null),
      egress: this.socat !== undefined && this.options.egress !== undefined,
      running: this.running,
      max: this.options.maxConcurrent,
    };
  }

  /** The path a tool should use for the workspace root inside the sandbox. */
  get workspaceRoot(): string | undefined {
    return this.options.mode === "off" ? undefined : SANDBOX_WORKSPACE;
  }

    /**
   * Makes `dir` the sandbox uid's (a service running as root chowns it) and clears the
   * set-user-ID and set-group-ID bits a command or a restored checkpoint left in it (a
   * service sharing the sandboxes' uid too): run by another host user, such a file would
   * be that uid. Before each turn with tools.
   */
  async prepareWorkspace(dir: string): Promise<void> {
    if (this.options.mode === "off") return;
    if (this.owner) return chownTree(dir, this.owner.uid, this.owner.gid);
    // Sharing the sandboxes' uid: nothing to chown, and what cannot be cleared is logged.
    const failed = await clearSetIdBits(dir);
    if (failed) this.options.log.warn({ err: failed, dir }, "sandbox: could not clear set-user-ID bits in a workspace");
  }

  /**
   * Closes the folder that holds the workspaces (and nothing else) to other host users
   * (closedToOthers); logs once when its filesystem keeps their access whatever its mode.
   */
  async closeWorkspacesFolder(folder: string): Promise<void> {
    if (this.options.mode === "off") return;
    if (!(await closedToOthers(folder, this.sandboxIds())) && !this.warnedOpenWorkspaces) {
      this.warnedOpenWorkspaces = true;
      this.options.log.warn({ folder }, "sandbox: the workspaces' folder keeps other users' access whatever its mode (a filesystem that ignores modes): other host users may reach the workspaces");
    }
  }

  /** The uid and gid sandboxes run as: their own when the service is root, else the service's. */
  private sandboxIds(): { uid: number; gid: number } {
    return this.owner ?? { uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0 };
  }

  /**
   * Runs one command in a new sandbox. Throws {@link SandboxFailure} when the
   * sandbox cannot be had (capacity, start failures after retries, cgroup setup);
   * anything the command itself does is in the outcome.
   */
  async run(cmd: SandboxCommand): Promise<SandboxOutcome> {
    if (this.running >= this.options.maxConcurrent) {
      throw new SandboxFailure(
        "sandbox_capacity_exceeded",
        `This node runs its maximum of ${this.options.maxConcurrent} sandboxes; try again shortly.`,
      );
    }
    this.running++;
    const processes = this.takeProcesses(cmd);
    const limited = processes < cmd.limits.processes ? { ...cmd, limits: { ...cmd.limits, processes } } : cmd;
    try {
      for (let attempt = 1; ; attempt++) {
        try {
          const outcome = await this.runOnce(limited, randomBytes(8).toString("hex"));
          return limited === cmd ? outcome : { ...outcome, processes };
        } catch (err) {
          if (!(err instanceof SandboxStartError)) throw err;
          this.options.log.warn({ attempt, reason: err.message }, "sandbox did not start");
          if (attempt >= START_ATTEMPTS) {
            throw new SandboxFailure(
              "sandbox_start_retries_exhausted",
              `The sandbox did not start after ${START_ATTEMPTS} tries: ${err.message}`,
            );
          }
          if (cmd.signal?.aborted) return { kind: "aborted", output: Buffer.alloc(0), totalBytes: 0, limits: [] };
          await new Promise((r) => setTimeout(r, START_BACKOFF_MS[attempt - 1] ?? 250));
        }
      }
    } finally {
      this.running--;
      this.releaseProcesses(cmd.tenant, processes);
    }
  }

  /**
   * The process limit `cmd` runs with: its own, within what its workspace's running
   * commands leave of their share (at least {@link MIN_TENANT_COMMAND_PROCESSES}); held
   * until it ends.
   */
  private takeProcesses(cmd: SandboxCommand): number {
    if (cmd.tenant === undefined) return cmd.limits.processes;
    const held = this.tenantProcesses.get(cmd.tenant) ?? 0;
    const left = tenantProcessShare(this.processesTotal) - held;
    const processes = Math.min(cmd.limits.processes, Math.max(MIN_TENANT_COMMAND_PROCESSES, left));
    this.tenantProcesses.set(cmd.tenant, held + processes);
    return processes;
  }

  private releaseProcesses(tenant: string | undefined, processes: number): void {
    if (tenant === undefined) return;
    const left = (this.tenantProcesses.get(tenant) ?? 0) - processes;
    if (left > 0) this.tenantProcesses.set(tenant, left);
    else this.tenantProcesses.delete(tenant);
  }

  /**
   * `probe` (the start's probe only): no RLIMIT_NPROC where no cgroup limits processes (on
   * kernels before 5.14 that limit counts every process of the sandboxes' uid on the host,
   * so a probe limited to a handful would fail while other sandboxes run, a node restarting
   * beside another one's commands, and the node would not start); and no watch (a node
   * short of disk still starts, and says so at its first command).
   */
  private async runOnce(cmd: SandboxCommand, id: string, probe = false): Promise<SandboxOutcome> {
    if (cmd.signal?.aborted) return { kind: "aborted", output: Buffer.alloc(0), totalBytes: 0, limits: [] };
    if (this.options.mode === "off") return this.runUnconfined(cmd);

    const wantsNetwork = (cmd.networkAllow?.length ?? 0) > 0;
    if (wantsNetwork && (!this.socat || !this.options.egress)) {
      throw new SandboxFailure(
        "sandbox_operation_failed",
        "This deployment allows network destinations, but the node cannot run the egress relay (socat is not installed).",
      );
    }
    let cgroup: CommandCgroup | undefined;
    if (this.cgroups) {
      try {
        cgroup = await this.cgroups.create(`cmd-${id}`, cmd.limits, this.owner);
      } catch (err) {
        throw new SandboxFailure("sandbox_operation_failed", `The sandbox's cgroup could not be created: ${(err as Error).message}`);
      }
    }
    let egress: { close(): Promise<void> } | undefined;
    let egressDir: string | undefined;
    // The child's descriptors from 3 on are `fds` in order: the nth pushed is 2 + n.
    const fds: number[] = [];
    const childFd = (pushed: number) => 2 + pushed;
    let networkFd: number | undefined;
    try {
      fds.push(openSync(cmd.workspaceDir, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY));
      if (wantsNetwork) {
        egressDir = path.join(this.options.runtimeDir, id);
        // The service's own, searchable by the sandbox's uid (a root service's sandboxes run as
        // another): a command reaches the socket by name, and no process of the sandbox's uid
        // can swap it for a link the proxy's chmod by path, as root, would follow.
        await mkdir(egressDir, { mode: this.owner ? 0o711 : 0o700 });
        egress = await this.options.egress!.open(path.join(egressDir, "egress.sock"), { allow: cmd.networkAllow! }, (denial: EgressDenial) =>
          cmd.onNetworkDenied?.(denial),
        );
        networkFd = childFd(fds.push(openSync(egressDir, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY)));
      }
      const seccompFd = this.seccomp ? childFd(fds.push(openSeccompFilter(this.seccomp))) : undefined;
      // Without cgroups, processes are limited by rlimits: the command's inside its sandbox, every sandbox's together by the launcher.
      const byRlimits = !this.cgroups && !probe;
      const relayed = wantsNetwork ? withEgressRelay(cmd.argv) : cmd.argv;
      const argv = byRlimits ? withProcessLimit(this.nprocFlag, Math.min(cmd.limits.processes, this.processesTotal), relayed) : relayed;
      const args = bwrapArgs(this.hostLayout, { env: cmd.env, tmpBytes: cmd.limits.tmpBytes }, argv, { network: networkFd, seccomp: seccompFd });
      const total = byRlimits ? { flag: this.nprocFlag, processes: this.processesTotal } : undefined;
      const launcher = launcherArgs(cgroup?.procsFiles ?? [], rlimitArgs(cmd.limits, !this.cgroups, total, this.zeroRealtime), [...this.niced, this.bwrap!, ...args]);
      const startedMs = Date.now();
      // While it runs: the node's free disk and the command's own measure.
      const limitStop = new AbortController();
      let watchHit: LimitHit | undefined;
      const stopFor = (hit: LimitHit) => {
        watchHit ??= hit;
        limitStop.abort();
      };
      const unwatch = probe ? () => undefined : this.watch(cmd, stopFor);
      const outcome = await spawnAndWait({
        file: "/bin/sh",
        args: launcher,
        cwd: "/",
        env: { PATH: LAUNCHER_PATH, LANG: "C.UTF-8" },
        uid: this.owner?.uid,
        gid: this.owner?.gid,
        extraFds: fds,
        stdin: cmd.stdin,
        timeoutMs: cmd.timeoutMs,
        signal: cmd.signal,
        limitSignal: limitStop.signal,
        outputBytes: cmd.limits.outputBytes,
        captureStderr: true,
      }).finally(unwatch);
      // The limit counts only where it stopped the command (not one that had ended already).
      const stoppedFor = outcome.kind === "signalled" && outcome.limited ? watchHit : undefined;
      if (stoppedFor) this.options.log.info({ hit: stoppedFor, workspace: path.basename(cmd.workspaceDir) }, "sandbox: a running command was stopped at a limit");
      for (const fd of fds.splice(0)) closeSync(fd);
      const report = cgroup ? await cgroup.release() : undefined;
      cgroup = undefined;
      if (outcome.kind === "error") throw new SandboxStartError(outcome.message);
      if (outcome.kind === "exited" && setupFailed(outcome.exitCode, outcome.stderr)) {
        // bwrap, the launcher or the limit's wrapper failed before the command ran and said why on stderr.
        throw new SandboxStartError(outcome.stderr.toString("utf8").trim().slice(0, 500));
      }
      const limits: LimitHit[] = stoppedFor ? [stoppedFor] : [];
      if (report?.oomKilled) limits.push(report.sharedMemoryHit ? "host_memory" : "memory");
      if (report?.processLimitHit) limits.push("processes");
      const failed = outcome.kind === "exited" ? outcome.exitCode !== 0 : outcome.kind === "signalled" || outcome.kind === "timed_out";
      if (!this.cgroups && cmd.limitsFromOutput) limits.push(...rlimitHits(outcome.output, failed));
      const code = outcome.kind === "exited" ? outcome.exitCode : undefined;
      const signal = outcome.kind === "signalled" ? outcome.signal : undefined;
      // The command is pid 1 of its namespace, which ignores SIGXCPU: the hard CPU limit's
      // SIGKILL follows a second later. A SIGKILL that was not ours (timeout, cancel) nor
      // the OOM killer's, after at least the CPU limit of wall time, is that limit (with one
      // core per command, CPU time cannot run ahead of wall time; without cgroups, two cores can).
      const wallS = (Date.now() - startedMs) / 1000;
      const cpuKill = (code === 128 + 9 || signal === "SIGKILL") && !report?.oomKilled && !stoppedFor && wallS >= cmd.limits.cpuSeconds / (this.cgroups ? 1 : os.availableParallelism());
      if (code === 128 + 24 || signal === "SIGXCPU" || cpuKill) limits.push("cpu");
      // A process of the command killed by SIGXFSZ while the command went on: bash says so.
      if (code === 128 + 25 || signal === "SIGXFSZ" || (cmd.limitsFromOutput && shellReported(outcome.output, "File size limit exceeded"))) limits.push("file_size");
      // SIGBUS: most often a write through a mapping (POSIX shared memory in /dev/shm, a
      // mapped file in /tmp) past what the tmpfs has left; bash says so for its children.
      if (code === 128 + 7 || signal === "SIGBUS" || (cmd.limitsFromOutput && shellReported(outcome.output, "Bus error"))) limits.push("tmp");
      return { ...stripStderr(outcome), limits } as SandboxOutcome;
    } finally {
      for (const fd of fds) closeSync(fd);
      if (cgroup) await cgroup.release();
      if (egress) await egress.close().catch(() => undefined);
      if (egressDir) await rm(egressDir, { recursive: true, force: true }).catch(() => undefined);
    }
  }

  /**
   * Starts the watches of a running command ({@link watchCommand}): the node's free disk,
   * where it keeps a reserve, and the command's own measure, taken in the node's turn
   * ({@link measureInTurn}). Returns what ends them.
   */
  private watch(cmd: SandboxCommand, stop: (hit: LimitHit) => void): () => void {
    const ends = [this.watchDisk(cmd.workspaceDir, () => stop("host_disk"))];
    const measure = cmd.watch;
    if (measure) ends.push(watchCommand((signal) => this.measureInTurn(cmd.workspaceDir, measure, signal), stop));
    return () => ends.forEach((end) => end());
  }

  /**
   * Runs one measure of a running command's workspace when the node's turn comes: one at a
   * time, each followed by a pause four times as long as it took ({@link MEASURE_PAUSE_MS}
   * at least), and stopped past {@link QUICK_MEASURE_MS}. A workspace whose measure ran
   * longer waits for the slow turn instead (not stopped there, its pauses nine times as
   * long) until a measure of it finishes in time. Each command has at most one waiting; one
   * whose command ended meanwhile is skipped.
   */
  private measureInTurn<T>(workspaceDir: string, measure: (signal: AbortSignal) => Promise<T>, signal: AbortSignal): Promise<T> {
    const turn = this.slowToMeasure.has(workspaceDir) ? "slow" : "quick";
    let tookMs = 0;
    const result = this.measuring[turn].then(async () => {
      signal.throwIfAborted();
      const started = performance.now();
      let finished = false;
      try {
        const measured = await measure(turn === "quick" ? AbortSignal.any([signal, AbortSignal.timeout(QUICK_MEASURE_MS)]) : signal);
        finished = true;
        return measured;
      } finally {
        tookMs = performance.now() - started;
        // Past the line, finished or not (a stopped measure's time is a lower bound), it is
        // slow; in time and finished, quick. A measure stopped early tells nothing.
        if (tookMs >= QUICK_MEASURE_MS) {
          this.slowToMeasure.delete(workspaceDir);
          this.slowToMeasure.add(workspaceDir);
          if (this.slowToMeasure.size > SLOW_WORKSPACES_KEPT) this.slowToMeasure.delete(this.slowToMeasure.values().next().value!);
        } else if (finished) this.slowToMeasure.delete(workspaceDir);
      }
    });
    const factor = turn === "slow" ? SLOW_PAUSE_FACTOR : QUICK_PAUSE_FACTOR;
    const settled = () => new Promise<void>((resolve) => setTimeout(resolve, Math.max(MEASURE_PAUSE_MS, factor * tookMs)));
    this.measuring[turn] = result.then(settled, settled);
    return result;
  }

  /**
   * Whether `bytes` more would leave the filesystem holding `dir` at least the node's
   * reserve free (always where it keeps none, or where the filesystem cannot say).
   */
  async roomFor(dir: string, bytes: number): Promise<boolean> {
    const reserve = this.options.diskReserveBytes ?? 0;
    if (reserve <= 0) return true;
    const free = await freeBytes(dir);
    return free === undefined || free - bytes >= reserve;
  }

  /**
   * Calls `short` once the filesystem holding `dir` has less free than the node keeps
   * ({@link hostDiskLow}, a second after the start and after each check), until the
   * returned function is called. Nothing is checked where the node keeps no reserve.
   */
  watchDisk(dir: string, short: () => void): () => void {
    if ((this.options.diskReserveBytes ?? 0) <= 0) return () => undefined;
    return watchCommand(async () => ((await this.hostDiskLow(dir)) ? "host_disk" : undefined), short);
  }

  /**
   * Whether the filesystem holding `dir` has less free than the node keeps
   * (`diskReserveBytes`); once short, until it has an eighth more than that again (so it
   * does not go back and forth at the line). One statfs; when the filesystem cannot say,
   * the last answer stands. The log says when the node becomes short, and when it has room again.
   */
  async hostDiskLow(dir: string): Promise<boolean> {
    const reserve = this.options.diskReserveBytes ?? 0;
    if (reserve <= 0) return false;
    const free = await freeBytes(dir);
    if (free === undefined) return this.diskShort;
    const short = diskShort(free, reserve, this.diskShort);
    if (short !== this.diskShort) {
      this.diskShort = short;
      if (short) this.options.log.warn({ freeBytes: free, reserveBytes: reserve }, "sandbox: the workspaces' filesystem has less free than RUNS_DISK_RESERVE_MB keeps: running commands are stopped and writes refuse until there is room");
      else this.options.log.info({ freeBytes: free, reserveBytes: reserve }, "sandbox: the workspaces' filesystem has room again");
    }
    return short;
  }

  private async runUnconfined(cmd: SandboxCommand): Promise<SandboxOutcome> {
    const [file, ...args] = cmd.argv;
    const outcome = await spawnAndWait({
      file: file!,
      args,
      cwd: cmd.workspaceDir,
      env: {
        PATH: process.env.PATH ?? "/usr/local/bin:/usr/bin:/bin",
        HOME: cmd.workspaceDir,
        LANG: process.env.LANG ?? "C.UTF-8",
        TERM: "dumb",
        ...cmd.env,
      },
      extraFds: [],
      stdin: cmd.stdin,
      timeoutMs: cmd.timeoutMs,
      signal: cmd.signal,
      outputBytes: cmd.limits.outputBytes,
      captureStderr: false,
      processGroup: true,
    });
    if (outcome.kind === "error") {
      return { kind: "exited", exitCode: 127, output: Buffer.from(`Could not start the command: ${outcome.message}\n`), totalBytes: 0, limits: [] };
    }
    return { ...stripStderr(outcome), limits: [] } as SandboxOutcome;
  }

  private async mkProbeWorkspace(): Promise<string> {
    const dir = path.join(this.options.runtimeDir, `probe-${randomBytes(6).toString("hex")}`);
    await mkdir(dir, { mode: 0o700 });
    if (this.owner) await chown(dir, this.owner.uid, this.owner.gid);
    return dir;
  }
}

const probeLimits: SandboxLimits = {
  memoryBytes: 64 * 1024 * 1024,
  processes: 16,
  cpuSeconds: 10,
  diskBytes: 1024 * 1024,
  outputBytes: 4096,
  tmpBytes: 1024 * 1024,
};

/** bwrap failed before the command ran; worth another try. */
class SandboxStartError extends Error {}

function stripStderr(outcome: Exclude<RawOutcome, { kind: "error" }>): Omit<SandboxOutcome, "limits"> {
  const { stderr: _stderr, ...rest } = outcome;
  if (rest.kind === "signalled") delete rest.limited;
  return rest;
}

/**
 * The total of processes without cgroups ({@link rlimitProcessesTotal}), with a warning
 * where it falls short of what was asked or of one command's largest limit, or where the
 * kernel counts processes per uid only (before 5.14: every command's limit is then the
 * host uid's); refused when too small to run a sandbox.
 */
function rlimitTotalOrFail(wanted: number, nodeLimits: string, sharesNodeUid: boolean, log: Logger): number {
  const node = rlimitOf(nodeLimits, "Max processes");
  const total = rlimitProcessesTotal(wanted, node, sharesNodeUid);
  if (total < 64) {
    throw new SandboxUnavailableError(
      `the service's process limit (soft ${node.soft}, hard ${node.hard}) leaves its sandboxes ${total} processes: raise it (ulimit -u, systemd LimitNPROC=, the container's nproc ulimit), or run the service as root (sandboxes then run as RUNS_SANDBOX_UID).`,
    );
  }
  if (total < wanted) log.warn({ wanted, processes: total, node }, `sandbox: all sandboxes together get ${total} processes, short of RUNS_SANDBOX_PROCESSES (${wanted}): the service's own process limit${sharesNodeUid ? ", less what it keeps for itself," : ""} is lower`);
  const [major = 0, minor = 0] = os.release().split(".").map((part) => Number.parseInt(part, 10));
  if (major < 5 || (major === 5 && minor < 14)) log.warn({ kernel: os.release() }, "sandbox: before Linux 5.14 a command's process limit counts every process of the sandbox uid on the host: one tenant's command at its limit can keep others from forking");
  return total;
}

/**
 * Writes the seccomp filter commands run under (actors/sandbox-seccomp.ts) into the
 * runtime folder, named by its content: nodes sharing the folder, of other versions or
 * modes, each find their own. None where no filter is built for the architecture (warned).
 */
function writeSeccompFilter(runtimeDir: string, memoryCgroup: boolean, log: Logger): { file: string; program: Buffer } | undefined {
  const arch = seccompArchOf();
  if (!arch) {
    log.warn({ arch: process.arch }, "sandbox: no seccomp filter is built for this architecture: commands may use key rings, BPF, userfaultfd, perf events and io_uring (and, without a memory cgroup, System V IPC and memfd)");
    return undefined;
  }
  const program = seccompProgram(arch, refusedSyscalls(memoryCgroup));
  const file = path.join(runtimeDir, `seccomp-${createHash("sha256").update(program).digest("hex").slice(0, 16)}.bpf`);
  writeWhole(file, program);
  return { file, program };
}

/** Writes `data` to `file` whole or not at all (a reader never sees part of it). */
function writeWhole(file: string, data: Buffer): void {
  const partial = `${file}.${randomBytes(6).toString("hex")}`;
  try {
    writeFileSync(partial, data, { mode: 0o600 });
    renameSync(partial, file);
  } finally {
    rmSync(partial, { force: true });
  }
}

/** A fresh descriptor of the filter for one command (bwrap reads it to its end); written again if someone removed it. */
function openSeccompFilter(seccomp: { file: string; program: Buffer }): number {
  try {
    return openSync(seccomp.file, fsConstants.O_RDONLY);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
    writeWhole(seccomp.file, seccomp.program);
    return openSync(seccomp.file, fsConstants.O_RDONLY);
  }
}

/**
 * Whether the launcher must set RLIMIT_RTPRIO to 0: commands inherit the node's, and a
 * SCHED_FIFO busy loop would hold a core from everything on the host. Not when it is 0
 * already; where /bin/sh cannot set it (a shell without `ulimit -r`, a kernel that
 * refuses), said in a warning rather than failing every command.
 */
function realtimeToZero(nodeLimits: string, log: Logger): boolean {
  if (rlimitOf(nodeLimits, "Max realtime priority").hard === 0) return false;
  const probe = spawnSync("/bin/sh", ["-c", "ulimit -r 0"], { stdio: "ignore", timeout: 5_000 });
  if (probe.status === 0) return true;
  log.warn("sandbox: /bin/sh cannot set RLIMIT_RTPRIO (ulimit -r): sandboxed commands keep the service's and may use real-time scheduling within it");
  return false;
}

/**
 * Warns where commands without a CPU cgroup do not run below the service after all:
 * `nice` missing; an RLIMIT_NICE that lets them raise their priority back (n allows nice
 * 20 - n); autogroups, which weigh each session (bwrap makes one per command, and a
 * command may make more) as one group beside the service's whatever its nice value —
 * they apply to tasks in the root CPU cgroup, which is plain when the node is in it.
 */
async function warnWhereNiceFallsShort(niced: boolean, nodeLimits: string, selfCgroup: string, log: Logger): Promise<void> {
  if (!niced) {
    log.warn("sandbox: nice is not installed (coreutils): without a CPU cgroup, sandboxed commands run at the service's own priority");
    return;
  }
  const niceLimit = rlimitOf(nodeLimits, "Max nice priority");
  if (/^Max nice priority/m.test(nodeLimits) && niceLimit.hard > 20 - SANDBOX_NICENESS) {
    log.warn({ rlimit_nice: niceLimit }, `sandbox: the service's RLIMIT_NICE lets sandboxed commands raise their priority from nice ${SANDBOX_NICENESS} to ${20 - Math.min(niceLimit.hard, 40)}: lower it (systemd LimitNICE=, the container's nice ulimit)`);
  }
  const autogroups = (await readFile("/proc/sys/kernel/sched_autogroup_enabled", "utf8").catch(() => "0")).trim() === "1";
  if (autogroups && inRootCpuCgroup(selfCgroup, (dir) => existsSync(path.join("/sys/fs/cgroup", dir, "cpu.weight")))) {
    log.warn("sandbox: the scheduler's autogroups weigh each sandboxed command's session as much as the service, whatever its nice value: set kernel.sched_autogroup_enabled=0, or give the node cgroups");
  }
}

/**
 * Whether this process is in the root CPU task group (where autogroups apply), from
 * /proc/self/cgroup: with a v1 `cpu` hierarchy, when its path there is `/`; on v2, when
 * no cgroup from its own up to the mount (`/` is the mount: a container's cgroup
 * namespace shows its own cgroup so) has a `cpu.weight` (`hasCpuWeight`, by path below
 * the mount): a cgroup without the cpu controller is scheduled as its nearest ancestor
 * with it, and the root has none.
 */
export function inRootCpuCgroup(selfCgroup: string, hasCpuWeight: (dir: string) => boolean): boolean {
  const paths = cgroupPathsOf(selfCgroup);
  const v1 = paths.get("cpu");
  if (v1 !== undefined) return v1 === "/";
  const v2 = paths.get("");
  if (v2 === undefined) return false;
  for (let dir = path.posix.normalize(v2 || "/"), depth = 0; depth < 64; depth++) {
    if (hasCpuWeight(dir)) return false;
    if (dir === "/") return true;
    dir = path.posix.dirname(dir);
  }
  return false;
}

/** /bin/sh's RLIMIT_NPROC flag; a node that can neither use cgroups nor set it cannot limit sandboxes. */
function nprocFlagOrFail(shell: string): string {
  const flag = nprocFlagOf(shell);
  if (!flag) throw new SandboxUnavailableError(`${shell} cannot set a process limit (ulimit -u / -p): without cgroups, sandboxes cannot be limited here.`);
  return flag;
}
