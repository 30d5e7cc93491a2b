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
import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { accessSync, constants as fsConstants, existsSync, lstatSync, openSync, closeSync, statSync } from "node:fs";
import { chmod, chown, lchown, lstat, mkdir, readdir, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { Logger } from "pino";
import type { EgressDenial, EgressProxy } from "./egress-proxy.js";
import { detectCgroups, type Cgroups, type CommandCgroup } from "./sandbox-cgroups.js";
import type { LimitHit, SandboxLimits } from "./sandbox-limits.js";
import type { SandboxStatus } from "../src/index.js";

/** Where the workspace appears inside the sandbox. */
export const SANDBOX_WORKSPACE = "/workspace";
/** The uid and gid a command has inside the sandbox (never 0). */
export const SANDBOX_INNER_ID = 1000;
/** Unprivileged uid/gid a root node runs sandboxes as (`RUNS_SANDBOX_UID`). */
export const DEFAULT_SANDBOX_UID = 65534;
/** The proxy address inside a sandbox whose deployment allows destinations. */
export const SANDBOX_PROXY = "127.0.0.1:3128";

/** Start attempts of one sandbox before the turn fails with sandbox_start_retries_exhausted. */
const START_ATTEMPTS = 3;
const START_BACKOFF_MS = [50, 250];
/** A command's output pipes after its sandbox ended: only bwrap could still hold them. */
const PIPE_DRAIN_MS = 200;

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
}

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
};


export interface SandboxOptions {
  mode: "bwrap" | "off";
  /** The bwrap binary (`RUNS_SANDBOX_BWRAP`); found on PATH by default. */
  bwrapPath?: string;
  /** Concurrent sandboxes on this node (`RUNS_SANDBOX_MAX`). */
  maxConcurrent: number;
  /** Host uid/gid for sandboxes when the node runs as root (`RUNS_SANDBOX_UID`). */
  uid?: number;
  /** Where per-command egress sockets are made (inside the service's data folder). */
  runtimeDir: string;
  nodeId: string;
  log: Logger;
  egress?: EgressProxy;
  /** A cgroup mount other than /sys/fs/cgroup, or false to use rlimits only. */
  cgroupRoot?: string | false;
}

/**
 * Runs commands in sandboxes. One per node: {@link Sandbox.start} checks the host
 * once (bwrap works, which limits apply) and says so in the log.
 */
export class Sandbox {
  private running = 0;

  private constructor(
    private readonly options: SandboxOptions,
    private readonly bwrap: string | undefined,
    private readonly cgroups: Cgroups | undefined,
    private readonly owner: { uid: number; gid: number } | undefined,
    private readonly socat: string | undefined,
    private readonly hostLayout: HostLayout,
    /** The launcher shell's `ulimit` flag for RLIMIT_NPROC: bash says -u, dash -p. */
    private readonly nprocFlag = "-u",
  ) {}

  /**
   * Prepares the node's sandboxes. With mode `bwrap`, throws
   * {@link SandboxUnavailableError} (saying how to install bubblewrap) when bwrap is
   * missing or cannot create namespaces here.
   */
  static async start(options: SandboxOptions): Promise<Sandbox> {
    const { log } = options;
    if (options.mode === "off") {
      log.warn(
        "RUNS_SANDBOX=off: tool commands run UNCONFINED as the service's own user, with its files, network and processes in reach. For local development only.",
      );
      return new Sandbox(options, undefined, undefined, undefined, findOnPath("socat"), hostLayout());
    }
    const bwrap = options.bwrapPath ? (isExecutable(options.bwrapPath) ? options.bwrapPath : undefined) : findOnPath("bwrap");
    if (!bwrap) {
      throw new SandboxUnavailableError(
        "bubblewrap (bwrap) is not installed: tool commands cannot be sandboxed. Install it (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap; Alpine: apk add bubblewrap), or set RUNS_SANDBOX=off for local development only.",
      );
    }
    const isRoot = process.getuid?.() === 0;
    const owner = isRoot ? { uid: options.uid ?? DEFAULT_SANDBOX_UID, gid: options.uid ?? DEFAULT_SANDBOX_UID } : undefined;
    const cgroups =
      options.cgroupRoot === false ? undefined : await detectCgroups({ root: options.cgroupRoot });
    await mkdir(options.runtimeDir, { recursive: true, mode: 0o711 });
    if (owner) await searchableDataDir(path.dirname(options.runtimeDir), log);
    const sandbox = new Sandbox(options, bwrap, cgroups, owner, findOnPath("socat"), hostLayout(), cgroups ? undefined : nprocFlagOf("/bin/sh"));
    // One real sandbox proves namespaces work here (a container without user
    // namespaces fails now, with bwrap's own words, not at a tenant's first command).
    const probeDir = await sandbox.mkProbeWorkspace();
    try {
      const outcome = await sandbox.runOnce(
        { workspaceDir: probeDir, argv: ["/bin/sh", "-c", "id -u 2>&1"], timeoutMs: 30_000, limits: probeLimits },
        `probe-${randomBytes(6).toString("hex")}`,
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
          : " It needs unprivileged user namespaces (see docs/deploy-sandbox.md).";
        throw new SandboxUnavailableError(
          `bubblewrap (${bwrap}) cannot create a sandbox on this host: ${err.message}.${traversal} RUNS_SANDBOX=off runs without (local development only).`,
        );
      }
      throw err;
    } finally {
      await rm(probeDir, { recursive: true, force: true });
    }
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
   * Makes the workspace usable by the sandbox's uid (files restored from a checkpoint
   * or written by the node belong to the node's user). Cheap when nothing changed.
   */
  async prepareWorkspace(dir: string): Promise<void> {
    if (this.options.mode === "off" || !this.owner) return;
    await chownTree(dir, this.owner.uid, this.owner.gid);
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
    try {
      for (let attempt = 1; ; attempt++) {
        try {
          return await this.runOnce(cmd, randomBytes(8).toString("hex"));
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
    }
  }

  private async runOnce(cmd: SandboxCommand, id: string): Promise<SandboxOutcome> {
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
    const fds: number[] = [];
    try {
      fds.push(openSync(cmd.workspaceDir, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY));
      if (wantsNetwork) {
        egressDir = path.join(this.options.runtimeDir, id);
        await mkdir(egressDir, { mode: 0o700 });
        if (this.owner) await chown(egressDir, this.owner.uid, this.owner.gid);
        egress = await this.options.egress!.open(path.join(egressDir, "egress.sock"), { allow: cmd.networkAllow! }, (denial: EgressDenial) =>
          cmd.onNetworkDenied?.(denial),
        );
        fds.push(openSync(egressDir, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY));
      }
      const argv = wantsNetwork ? withEgressRelay(cmd.argv) : cmd.argv;
      const bwrapArgs = this.bwrapArgs(cmd, argv, wantsNetwork);
      const launcher = launcherArgs(cgroup?.procsFiles ?? [], this.rlimits(cmd.limits), [this.bwrap!, ...bwrapArgs]);
      const startedMs = Date.now();
      const outcome = await spawnAndWait({
        file: "/bin/sh",
        args: launcher,
        cwd: "/",
        env: { PATH: "/usr/local/bin:/usr/bin:/bin", LANG: "C.UTF-8" },
        uid: this.owner?.uid,
        gid: this.owner?.gid,
        extraFds: fds,
        stdin: cmd.stdin,
        timeoutMs: cmd.timeoutMs,
        signal: cmd.signal,
        outputBytes: cmd.limits.outputBytes,
        captureStderr: true,
      });
      for (const fd of fds.splice(0)) closeSync(fd);
      const report = cgroup ? await cgroup.release() : undefined;
      cgroup = undefined;
      if (outcome.kind === "error") throw new SandboxStartError(outcome.message);
      if (outcome.kind === "exited" && setupFailed(outcome.exitCode, outcome.stderr)) {
        // bwrap (or the launcher) failed before the command ran and said why on stderr.
        throw new SandboxStartError(outcome.stderr.toString("utf8").trim().slice(0, 500));
      }
      const limits: LimitHit[] = [];
      if (report?.oomKilled) limits.push("memory");
      if (report?.processLimitHit) limits.push("processes");
      const code = outcome.kind === "exited" ? outcome.exitCode : undefined;
      const signal = outcome.kind === "signalled" ? outcome.signal : undefined;
      // The command is pid 1 of its namespace, which ignores SIGXCPU: the hard CPU limit's
      // SIGKILL follows a second later. A SIGKILL that was not ours (timeout, cancel) nor
      // the OOM killer's, after at least the CPU limit of wall time, is that limit (with one
      // core per command, CPU time cannot run ahead of wall time; without cgroups, two cores can).
      const wallS = (Date.now() - startedMs) / 1000;
      const cpuKill = (code === 128 + 9 || signal === "SIGKILL") && !report?.oomKilled && wallS >= cmd.limits.cpuSeconds / (this.cgroups ? 1 : os.availableParallelism());
      if (code === 128 + 24 || signal === "SIGXCPU" || cpuKill) limits.push("cpu");
      // A process of the command killed by SIGXFSZ while the command went on: bash says so.
      if (code === 128 + 25 || signal === "SIGXFSZ" || outcome.output.includes("File size limit exceeded")) limits.push("file_size");
      return { ...stripStderr(outcome), limits } as SandboxOutcome;
    } finally {
      for (const fd of fds) closeSync(fd);
      if (cgroup) await cgroup.release();
      if (egress) await egress.close().catch(() => undefined);
      if (egressDir) await rm(egressDir, { recursive: true, force: true }).catch(() => undefined);
    }
  }

  /** RLIMITs for the sandbox: always CPU seconds and file size; memory and processes when no cgroup does it. */
  private rlimits(limits: SandboxLimits): [string, number][] {
    const r: [string, number][] = [
      // Soft first, then a hard limit one second later: SIGXCPU (named in the tool
      // result), then SIGKILL for a process that ignores it.
      ["-St", limits.cpuSeconds],
      ["-Ht", limits.cpuSeconds + 1],
      // dash counts file sizes in 512-byte blocks.
      ["-f", Math.ceil(limits.diskBytes / 512)],
    ];
    if (!this.cgroups) {
      r.push(["-v", Math.ceil(limits.memoryBytes / 1024) + 64 * 1024]);
      // RLIMIT_NPROC counts every process of the sandboxes' host uid: in this fallback
      // it is one budget all of a node's sandboxes share, not one per command.
      r.push([this.nprocFlag, limits.processes]);
    }
    return r;
  }

  private bwrapArgs(cmd: SandboxCommand, argv: readonly string[], network: boolean): string[] {
    const env: Record<string, string> = {
      PATH: "/usr/local/bin:/usr/bin:/bin",
      HOME: "/tmp",
      TMPDIR: "/tmp",
      LANG: "C.UTF-8",
      TERM: "dumb",
      USER: "sandbox",
      ...(network ? proxyEnv() : {}),
      ...cmd.env,
    };
    const args = [
      "--unshare-all",
      "--unshare-user",
      "--disable-userns",
      "--die-with-parent",
      "--new-session",
      // The command is pid 1 of its namespace (no extra reaper process): when it ends,
      // the kernel ends everything else in the namespace.
      "--as-pid-1",
      "--uid",
      String(SANDBOX_INNER_ID),
      "--gid",
      String(SANDBOX_INNER_ID),
      "--hostname",
      "sandbox",
      ...this.hostLayout.system,
      "--proc",
      "/proc",
      "--dev",
      "/dev",
      "--size",
      String(cmd.limits.tmpBytes),
      "--tmpfs",
      "/tmp",
      "--bind-fd",
      "3",
      SANDBOX_WORKSPACE,
    ];
    if (network) args.push("--ro-bind-fd", "4", "/run/runs");
    args.push("--chdir", SANDBOX_WORKSPACE, "--remount-ro", "/", "--clearenv");
    for (const [name, value] of Object.entries(env)) args.push("--setenv", name, value);
    args.push("--", ...argv);
    return args;
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

/**
 * Whether an exit is bwrap's or the launcher's own failure, before the command ran:
 * bwrap exits 1 after a "bwrap: …" line, the launcher 125 after "runs-sandbox: …".
 * Commands send their stderr to stdout (every tool does), so stderr is theirs alone;
 * a command that forges the line only fails its own turn.
 */
export function setupFailed(exitCode: number, stderr: Buffer): boolean {
  const text = stderr.toString("utf8");
  return (exitCode === 1 && text.startsWith("bwrap: ")) || (exitCode === 125 && text.startsWith("runs-sandbox: "));
}

function proxyEnv(): Record<string, string> {
  const url = `http://${SANDBOX_PROXY}`;
  return { HTTP_PROXY: url, HTTPS_PROXY: url, http_proxy: url, https_proxy: url, ALL_PROXY: url, NO_PROXY: "", no_proxy: "" };
}

/**
 * Wraps argv so a socat inside the sandbox relays 127.0.0.1:3128 to the egress
 * socket, and the command starts once the relay listens (bounded wait).
 */
function withEgressRelay(argv: readonly string[]): string[] {
  const script =
    'socat TCP-LISTEN:3128,bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:/run/runs/egress.sock 2>/dev/null & ' +
    'i=0; while [ $i -lt 200 ] && ! grep -q ":0C38 00000000:0000 0A" /proc/net/tcp 2>/dev/null; do i=$((i+1)); sleep 0.01; done; ' +
    'exec "$@"';
  return ["/bin/sh", "-c", script, "sh", ...argv];
}

/**
 * The launcher (run as the sandbox's uid): joins the command's cgroups, sets the
 * rlimits, then becomes bwrap. A failure here is reported on stderr with exit 125.
 */
/**
 * Which `ulimit` flag of `shell` sets RLIMIT_NPROC: `-u` in bash, busybox and zsh, `-p`
 * in dash (where bash's `-p` is the read-only pipe size). Throws when neither works.
 */
export function nprocFlagOf(shell: string): string {
  for (const flag of ["-u", "-p"]) {
    // Setting the soft limit to the hard one is allowed to any user.
    const probe = spawnSync(shell, ["-c", `v=$(ulimit -H ${flag}) && ulimit -S ${flag} "$v"`], { stdio: "ignore", timeout: 5_000 });
    if (probe.status === 0) return flag;
  }
  throw new SandboxUnavailableError(`${shell} cannot set a process limit (ulimit -u / -p): without cgroups, sandboxes cannot be limited here.`);
}

function launcherArgs(procsFiles: readonly string[], rlimits: [string, number][], exec: string[]): string[] {
  const script =
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || { echo "runs-sandbox: cannot join cgroup $1" >&2; exit 125; }; shift; n=$((n-1)); done; ' +
    'n=$1; shift; while [ "$n" -gt 0 ]; do ulimit "$1" "$2" || { echo "runs-sandbox: cannot set limit $1" >&2; exit 125; }; shift 2; n=$((n-1)); done; ' +
    'exec "$@"';
  return [
    "-c",
    script,
    "runs-sandbox",
    String(procsFiles.length),
    ...procsFiles,
    String(rlimits.length),
    ...rlimits.flatMap(([flag, value]) => [flag, String(value)]),
    ...exec,
  ];
}

interface HostLayout {
  /** bwrap arguments for the read-only system: /usr, the /bin and /lib links or binds, a few /etc files. */
  system: string[];
}

/** Files under /etc that ordinary tools read; nothing with secrets (no shadow, no ssh keys). */
const ETC_FILES = [
  "/etc/alternatives",
  "/etc/ssl",
  "/etc/ca-certificates",
  "/etc/pki",
  "/etc/localtime",
  "/etc/ld.so.cache",
  "/etc/ld.so.conf",
  "/etc/ld.so.conf.d",
  "/etc/nsswitch.conf",
  "/etc/mime.types",
  "/etc/bash.bashrc",
  "/etc/inputrc",
];

function hostLayout(): HostLayout {
  const system = ["--ro-bind", "/usr", "/usr"];
  for (const dir of ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]) {
    let info;
    try {
      info = lstatSync(dir);
    } catch {
      continue;
    }
    if (info.isSymbolicLink()) system.push("--symlink", `usr${dir}`, dir);
    else system.push("--ro-bind", dir, dir);
  }
  for (const file of ETC_FILES) if (existsSync(file)) system.push("--ro-bind", file, file);
  return { system };
}

function findOnPath(name: string): string | undefined {
  for (const dir of (process.env.PATH ?? "/usr/local/bin:/usr/bin:/bin").split(path.delimiter)) {
    if (!dir) continue;
    const candidate = path.join(dir, name);
    if (isExecutable(candidate)) return candidate;
  }
  return undefined;
}

function isExecutable(file: string): boolean {
  try {
    accessSync(file, fsConstants.X_OK);
    return statSync(file).isFile();
  } catch {
    return false;
  }
}

/**
 * The service's data folder (the parent of the runtime folder and the workspaces)
 * becomes 0711 when the node owns it: the sandbox's uid must pass through it to a
 * workspace, and nobody may list it. Secrets inside stay 0600, the store's folder 0700.
 */
async function searchableDataDir(dir: string, log: Logger): Promise<void> {
  const info = await lstat(dir);
  if (info.uid !== process.getuid?.() || (info.mode & 0o777) === 0o711) return;
  await chmod(dir, 0o711);
  log.info({ dir, was: (info.mode & 0o777).toString(8) }, "data folder made searchable (0711) for the sandbox's uid");
}

/** chowns every entry of `dir` not yet owned by uid (lstat: links are not followed). Bounded by the tree. */
async function chownTree(dir: string, uid: number, gid: number): Promise<void> {
  const info = await lstat(dir);
  if (info.uid !== uid || info.gid !== gid) await chown(dir, uid, gid);
  if (!info.isDirectory()) return;
  const stack = [dir];
  while (stack.length > 0) {
    const current = stack.pop()!;
    for (const entry of await readdir(current, { withFileTypes: true })) {
      const p = path.join(current, entry.name);
      const st = await lstat(p);
      if (st.uid !== uid || st.gid !== gid) {
        // A symbolic link is chowned itself, never its target.
        await lchown(p, uid, gid);
      }
      if (st.isDirectory()) stack.push(p);
    }
  }
}

// ---------------------------------------------------------------------------------
// spawning

type RawOutcome = (
  | { kind: "exited"; exitCode: number }
  | { kind: "signalled"; signal: string }
  | { kind: "timed_out" }
  | { kind: "aborted" }
  | { kind: "error"; message: string }
) & { output: Buffer; totalBytes: number; stderr: Buffer };

function stripStderr(outcome: Exclude<RawOutcome, { kind: "error" }>): Omit<SandboxOutcome, "limits"> {
  const { stderr: _stderr, ...rest } = outcome;
  return rest;
}

interface SpawnRequest {
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
function spawnAndWait(req: SpawnRequest): Promise<RawOutcome> {
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
    let stoppedBy: "timed_out" | "aborted" | undefined;
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
    const stop = (reason: "timed_out" | "aborted") => {
      if (stoppedBy || settled || exit) return;
      stoppedBy = reason;
      kill();
    };
    const onAbort = () => stop("aborted");
    const timeout = setTimeout(() => stop("timed_out"), req.timeoutMs);
    req.signal?.addEventListener("abort", onAbort, { once: true });
    // Aborted while the sandbox was being set up: the listener above will not fire.
    if (req.signal?.aborted) stop("aborted");

    const settle = () => {
      if (settled || (!exit && !spawnError)) return;
      settled = true;
      clearTimeout(timeout);
      clearTimeout(drainTimer);
      req.signal?.removeEventListener("abort", onAbort);
      child.stdout?.destroy();
      child.stderr?.destroy();
      const base = { ...output.result(), stderr: stderr.result().output };
      if (spawnError) return resolve({ kind: "error", message: spawnError.message, ...base });
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

/** Keeps the last `limit` bytes of a byte stream and counts the rest. */
export class OutputTail {
  private chunks: Buffer[] = [];
  private kept = 0;
  private total = 0;

  constructor(private readonly limit: number) {}

  push(chunk: Buffer): void {
    this.total += chunk.length;
    this.chunks.push(chunk);
    this.kept += chunk.length;
    while (this.chunks.length > 1 && this.kept - this.chunks[0]!.length >= this.limit) {
      this.kept -= this.chunks[0]!.length;
      this.chunks.shift();
    }
  }

  result(): { output: Buffer; totalBytes: number } {
    let buffer = Buffer.concat(this.chunks);
    if (buffer.length > this.limit) buffer = buffer.subarray(buffer.length - this.limit);
    return { output: buffer, totalBytes: this.total };
  }
}

/** The size of a directory tree in bytes (lstat, links not followed); stops counting past `stopAt`. */
export async function treeBytes(dir: string, stopAt: number): Promise<number> {
  let total = 0;
  const stack = [dir];
  while (stack.length > 0 && total <= stopAt) {
    const current = stack.pop()!;
    let entries;
    try {
      entries = await readdir(current, { withFileTypes: true });
    } catch {
      continue;
    }
    for (const entry of entries) {
      const p = path.join(current, entry.name);
      try {
        const st = await lstat(p);
        total += st.isDirectory() ? 0 : st.blocks * 512;
        if (st.isDirectory()) stack.push(p);
      } catch {
        // gone meanwhile
      }
    }
  }
  return total;
}

