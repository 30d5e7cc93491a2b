import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { mkdir, open, readFile } from "node:fs/promises";
import net from "node:net";
import { availableParallelism, totalmem } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

/** The project root (where package.json, nats.conf and .tools live). */
export const PROJECT_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
/** Where scripts/ensure-tools.sh builds the servers: RUNS_TOOLS_DIR (from the working directory, as the script reads it) or .tools. */
export const TOOLS_BIN = path.join(process.env.RUNS_TOOLS_DIR ? path.resolve(process.env.RUNS_TOOLS_DIR) : path.join(PROJECT_ROOT, ".tools"), "bin");
export const NATS_CONF = path.join(PROJECT_ROOT, "nats.conf");

/** A tool binary is missing: the message says how to get it. */
export class MissingToolError extends Error {
  constructor(readonly tool: string) {
    super(
      `${tool} is not built yet (looked in ${TOOLS_BIN}). Run \`npm start\` or \`bash scripts/ensure-tools.sh\` ` +
        "(needs Go 1.22+), or point NATS_URL and MONGODB_URI at running servers (see deploy/compose.yaml).",
    );
    this.name = "MissingToolError";
  }
}

export function toolPath(name: string): string {
  const file = path.join(TOOLS_BIN, name);
  if (!existsSync(file)) throw new MissingToolError(name);
  return file;
}

/**
 * A loopback port nothing listens on now, and not one this process handed out in the last
 * minute: the kernel may give a port that was just probed and closed to the next probe
 * again, before the first taker binds it (a cluster's FerretDB was once given a NATS
 * server's port that way, and the server failed "address already in use").
 */
export function freePort(): Promise<number> {
  return unusedPort(anyFreePort);
}

/** Ports handed out lately, with when. */
const handedOut = new Map<number, number>();
const HANDED_OUT_MS = 60_000;

/** The first port `probe` finds that was not handed out lately (at most 50 probes). */
export async function unusedPort(probe: () => Promise<number>, nowMs = Date.now): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = await probe();
    const now = nowMs();
    for (const [p, at] of handedOut) if (now - at > HANDED_OUT_MS) handedOut.delete(p);
    if (!handedOut.has(port)) {
      handedOut.set(port, now);
      return port;
    }
  }
  throw new Error("no free loopback port that was not handed out in the last minute");
}

function anyFreePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => resolve(typeof address === "object" && address ? address.port : 0));
    });
  });
}

export function portIsFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.unref();
    server.on("error", () => resolve(false));
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)));
  });
}

/** Where a server listens: a loopback TCP port or a Unix socket path. */
type Endpoint = { port: number } | { path: string };

/**
 * Waits until the server answers on `endpoint`. With `banner`, the first bytes it sends
 * must match: a TCP port can be held by another program that took it first (then the
 * server exits, saying so in its log, instead of being mistaken for ready).
 */
async function waitForPort(endpoint: Endpoint, child: ChildProcess, name: string, timeoutMs: number, banner?: RegExp): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`${name} exited with code ${child.exitCode} while starting`);
    const open = await new Promise<boolean>((resolve) => {
      const socket = "path" in endpoint ? net.connect({ path: endpoint.path }) : net.connect({ port: endpoint.port, host: "127.0.0.1" });
      const done = (ok: boolean) => {
        clearTimeout(timer);
        socket.destroy();
        resolve(ok);
      };
      const timer = setTimeout(() => done(false), 2_000);
      socket.once("connect", () => {
        if (!banner) done(true);
      });
      socket.once("data", (data) => done(banner ? banner.test(data.toString("utf8")) : true));
      socket.once("error", () => done(false));
    });
    if (open) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const where = "path" in endpoint ? endpoint.path : `port ${endpoint.port}`;
  throw new Error(`${name} did not listen on ${where} within ${timeoutMs} ms`);
}

/** A server process this program started; `stop` ends it (SIGTERM, then SIGKILL). */
export interface ServerProcess {
  name: string;
  port: number;
  /** The watchdog shell (see WATCHDOG); the server is its child. */
  child: ChildProcess;
  /** The server's own pid (0 if it could not be found). */
  pid: number;
  stop(): Promise<void>;
  /** Ends the process at once, as a crash would. */
  kill(): void;
}

/**
 * Runs a server under a watchdog: `sh -c WATCHDOG sh <server> <args…>` starts the server,
 * forwards SIGTERM/SIGINT to it, and ends it when its stdin (a pipe only this process
 * holds) reaches end of file, which happens however this process dies, SIGKILL included.
 * The shell exits with the server's status once the server has exited.
 */
const WATCHDOG = [
  // An asynchronous list reads /dev/null, not our stdin: keep the pipe as fd 3.
  "exec 3<&0",
  '"$@" </dev/null 3<&- &',
  "pid=$!",
  "trap 'kill -TERM \"$pid\" 2>/dev/null' TERM INT",
  '( while read -r _ <&3; do :; done; kill -TERM "$pid" 2>/dev/null; sleep 5; kill -KILL "$pid" 2>/dev/null ) &',
  "watcher=$!",
  // wait returns the server's status, also when it has already exited (and was reaped,
  // which a `kill -0` first would take for "never ran": status 0); again after a signal.
  'while :; do wait "$pid"; code=$?; kill -0 "$pid" 2>/dev/null || break; done',
  'kill "$watcher" 2>/dev/null',
  'exit "$code"',
].join("\n");

/** The pid of `parent`'s child running `bin` (the watchdog's server), or 0. */
async function childRunning(parent: number, bin: string): Promise<number> {
  const children = await readFile(`/proc/${parent}/task/${parent}/children`, "utf8").catch(() => "");
  for (const pid of children.trim().split(/\s+/).filter(Boolean).map(Number)) {
    const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
    if (cmdline.startsWith(`${bin}\0`)) return pid;
  }
  return 0;
}

async function launch(
  name: string,
  bin: string,
  args: string[],
  env: NodeJS.ProcessEnv,
  endpoint: Endpoint,
  logFile: string,
  banner?: RegExp,
): Promise<ServerProcess> {
  await mkdir(path.dirname(logFile), { recursive: true });
  const log = await open(logFile, "a");
  const logStart = (await log.stat()).size;
  // Its own process group, so a terminal's Ctrl-C reaches only us and we stop the
  // servers after the service has let go of them; a kill reaches the whole group.
  const child = spawn("/bin/sh", ["-c", WATCHDOG, "sh", bin, ...args], { env, stdio: ["pipe", log.fd, log.fd], detached: true });
  child.stdin!.on("error", () => undefined);
  // Neither the pipe nor the child keeps this process alive: when nothing else does (a test
  // worker whose set-up failed before its teardown knew the servers), it exits, its end of
  // the pipe closes, and the watchdog stops the server. A worker had waited for ever on a
  // server left running. A stop holds the process until the server is gone.
  (child.stdin as unknown as { unref?: () => void }).unref?.();
  child.unref();
  child.once("exit", () => void log.close().catch(() => undefined));
  const killGroup = () => {
    try {
      process.kill(-child.pid!, "SIGKILL");
    } catch {
      // already gone
    }
  };
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.ref();
    child.kill("SIGTERM");
    const timer = setTimeout(killGroup, 5_000);
    await exited;
    clearTimeout(timer);
  };
  try {
    await waitForPort(endpoint, child, name, 30_000, banner);
  } catch (err) {
    await stop();
    const said = await lastLogLine(logFile, logStart);
    throw new Error(`${(err as Error).message}${said ? ` (its log: "${said}")` : ""}; see ${logFile}`);
  }
  return { name, port: "port" in endpoint ? endpoint.port : 0, child, pid: await childRunning(child.pid!, bin), stop, kill: killGroup };
}

/** The last line a server wrote to its log since `from`, cut to 300 characters ("" if none). */
async function lastLogLine(logFile: string, from: number): Promise<string> {
  // Only what this start wrote (`from` is a byte offset), and at most its last 64 KiB: a
  // log kept across many starts is never read whole.
  let text = "";
  try {
    const file = await open(logFile, "r");
    try {
      const size = (await file.stat()).size;
      const start = Math.max(from, size - 64 * 1024);
      const { buffer, bytesRead } = await file.read({ buffer: Buffer.alloc(Math.max(0, size - start)), position: start });
      text = buffer.subarray(0, bytesRead).toString("utf8");
    } finally {
      await file.close();
    }
  } catch {
    return "";
  }
  const lines = text.split("\n").map((line) => line.trim()).filter(Boolean);
  return (lines.at(-1) ?? "").slice(0, 300);
}

export interface NatsServerOptions {
  port: number;
  storeDir: string;
  logFile: string;
  servicePassword: string;
  tapPassword: string;
  serverName?: string;
  /** Extra command-line arguments (cluster routes and the like). */
  args?: string[];
}

/** Starts nats-server with the project's nats.conf on loopback. */
export function startNatsServer(options: NatsServerOptions): Promise<ServerProcess> {
  const args = ["-c", NATS_CONF, "-a", "127.0.0.1", "-p", String(options.port), "-sd", options.storeDir, "-n", options.serverName ?? `runs-${options.port}`, ...(options.args ?? [])];
  const env = { ...process.env, RUNS_NATS_PASSWORD: options.servicePassword, RUNS_NATS_TAP_PASSWORD: options.tapPassword };
  const serverName = options.serverName ?? `runs-${options.port}`;
  // A NATS server greets with INFO, naming itself: ours, not another on the port.
  const banner = new RegExp(`^INFO .*"server_name":${JSON.stringify(serverName).replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}`);
  return launch("nats-server", toolPath("nats-server"), args, env, { port: options.port }, options.logFile, banner);
}

export interface FerretDbOptions {
  /** Loopback TCP port; ignored with `unixSocket`. */
  port: number;
  /** Listen on this Unix socket only (no TCP): only users who can reach the path can connect. */
  unixSocket?: string;
  dataDir: string;
  logFile: string;
}

/** Starts FerretDB with its SQLite backend on loopback. */
export async function startFerretDb(options: FerretDbOptions): Promise<ServerProcess> {
  await mkdir(options.dataDir, { recursive: true, mode: 0o700 });
  const listen = options.unixSocket ? ["--listen-addr=", `--listen-unix=${options.unixSocket}`] : [`--listen-addr=127.0.0.1:${options.port}`];
  const args = [
    "--handler=sqlite",
    `--sqlite-url=file:${options.dataDir}/?_txlock=immediate`,
    ...listen,
    `--state-dir=${options.dataDir}`,
    "--telemetry=disable",
    "--debug-addr=-",
    "--log-level=error",
  ];
  const endpoint = options.unixSocket ? { path: options.unixSocket } : { port: options.port };
  return launch("ferretdb", toolPath("ferretdb"), args, ferretDbEnv(process.env), endpoint, options.logFile);
}

/**
 * FerretDB's Go runtime settings, unless the environment sets them. Its heap is small,
 * and collecting it at every doubling cost FerretDB much of its CPU under 64-client
 * background starts (perf: the Go collector's functions at the top of its profile): it
 * collects at 5× (GOGC=400), and more often as it nears a soft limit (GOMEMLIMIT: an
 * eighth of the memory this process may use, at most 1 GiB, so a small machine or
 * container is not filled by the larger heap). And it leaves one core to the service's
 * event loop (GOMAXPROCS: the cores but one, at least one, counting a container's CPU
 * quota as Go's own default would, which an explicit GOMAXPROCS overrides): on two cores its
 * scheduler's idle threads woke and spun beside it. Measured (bench/trace-admission.ts,
 * 2,048 background starts at 64 clients, two alternating pairs): 2.97 / 4.27 → 2.25 /
 * 2.59 ms of FerretDB CPU per start (docs/performance.md).
 */
export function ferretDbEnv(
  env: NodeJS.ProcessEnv,
  cores = usableCores(availableParallelism(), cgroupCpuQuota()),
  memoryBytes = usableMemory((process as { constrainedMemory?: () => number | undefined }).constrainedMemory?.(), totalmem()),
): NodeJS.ProcessEnv {
  const limitMiB = Math.max(64, Math.min(1024, Math.floor(memoryBytes / 8 / 1_048_576)));
  return {
    ...env,
    GOGC: env.GOGC ?? "400",
    GOMEMLIMIT: env.GOMEMLIMIT ?? `${limitMiB}MiB`,
    GOMAXPROCS: env.GOMAXPROCS ?? String(Math.max(1, cores - 1)),
  };
}

/**
 * The cores this process may use: `availableParallelism()` (the CPUs it may run on), or
 * fewer when a cgroup CPU quota allows fewer (a container's `--cpus`, a Kubernetes CPU
 * limit), rounded up; at least one. Node 20 does not read the quota itself.
 */
export function usableCores(parallelism: number, quotaCores: number | undefined): number {
  return quotaCores !== undefined && quotaCores > 0 ? Math.max(1, Math.min(parallelism, Math.ceil(quotaCores))) : parallelism;
}

/**
 * The CPU quota of this process's cgroup, in cores (the smallest along its path to the
 * root), or undefined when none is set or none can be read. cgroup v2: `cpu.max`
 * ("<quota|max> <period>") from the process's own cgroup up; v1: `cpu.cfs_quota_us` /
 * `cpu.cfs_period_us` of the cpu controller's mount (a container's own) and of the
 * process's path under it.
 */
export function cgroupCpuQuota(root = "/sys/fs/cgroup", selfCgroup = readText("/proc/self/cgroup")): number | undefined {
  const quotas: number[] = [];
  const quotaOf = (text: string | undefined, period?: string): number | undefined => {
    if (text === undefined) return undefined;
    const [q, p] = period === undefined ? text.trim().split(/\s+/) : [text.trim(), period.trim()];
    const quota = Number(q);
    const per = Number(p);
    return Number.isFinite(quota) && quota > 0 && Number.isFinite(per) && per > 0 ? quota / per : undefined;
  };
  /**
   * `top/rel` and its ancestors up to `top`. Only `top` for a path that leaves it (`..`: a
   * cgroup outside this namespace's root) or is implausibly deep (over 64 levels).
   */
  const upFrom = (top: string, rel: string): string[] => {
    const parts = rel.split("/").filter(Boolean);
    if (parts.length > 64 || parts.some((p) => p === ".." || p === ".")) return [top];
    return parts.map((_, i) => path.join(top, ...parts.slice(0, parts.length - i))).concat(top);
  };
  for (const line of (selfCgroup ?? "").split("\n")) {
    const [, controllers, rel] = line.match(/^\d+:([^:]*):(.*)$/) ?? [];
    if (rel === undefined) continue;
    if (controllers === "") {
      for (const dir of upFrom(root, rel)) {
        const q = quotaOf(readText(path.join(dir, "cpu.max")));
        if (q !== undefined) quotas.push(q);
      }
    } else if (controllers!.split(",").includes("cpu")) {
      const mount = path.join(root, controllers!);
      const dirs = [...upFrom(mount, rel), path.join(root, "cpu")];
      for (const dir of dirs) {
        const period = readText(path.join(dir, "cpu.cfs_period_us"));
        const q = period === undefined ? undefined : quotaOf(readText(path.join(dir, "cpu.cfs_quota_us")), period);
        if (q !== undefined) quotas.push(q);
      }
    }
  }
  return quotas.length > 0 ? Math.min(...quotas) : undefined;
}

function readText(file: string): string | undefined {
  try {
    return readFileSync(file, "utf8");
  } catch {
    return undefined;
  }
}

/**
 * The machine's memory, or the container's limit when it is smaller. Node's
 * `process.constrainedMemory()` answers undefined (older Node 20), 0 (limit unknown) or,
 * without a limit, a number past any memory (2^64 on Node 20.20 here).
 */
export function usableMemory(constrained: number | undefined, total: number): number {
  return constrained !== undefined && constrained > 0 && constrained < total ? constrained : total;
}
