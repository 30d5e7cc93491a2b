/**
 * Resource limits of sandboxed commands through the host's cgroups: one cgroup per
 * command under the node's own, with memory, process and CPU bandwidth limits, and
 * every process in it killed when the command ends.
 *
 * Which mechanism is in force is decided once at start-up ({@link detectCgroups}):
 * - cgroup v2 where the node's cgroup is writable (delegated): the node moves itself
 *   into a `runs-service` leaf, enables memory/pids (and cpu, where its cgroup was
 *   given it) for its subtree and creates the command cgroups beside it;
 * - cgroup v1 where the memory and pids hierarchies are writable (a root service on
 *   a v1 or hybrid host);
 * - otherwise none: the sandbox falls back to rlimits (see sandbox.ts).
 *
 * A sandboxed command joins its cgroup itself before it becomes the sandbox (its
 * launcher writes its own pid into `cgroup.procs`, which the node hands to the
 * sandbox's uid), so no process of it ever runs outside the limits.
 */
import { chownSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { mkdir, readdir, readFile, rmdir, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "pino";
import type { SandboxLimits } from "./sandbox-limits.js";

export type CgroupMechanism = "cgroup-v2" | "cgroup-v1";

/** What one command's cgroup reports when it is removed. */
export interface CgroupReport {
  /** The kernel's OOM killer ended a process of the command. */
  oomKilled: boolean;
  /** ...at the memory limit of all sandboxes together, not at the command's own. */
  sharedMemoryHit: boolean;
  /** A fork failed because of the process limit. */
  processLimitHit: boolean;
}

export interface CommandCgroup {
  /** Files the launcher writes its pid into (one per hierarchy). */
  readonly procsFiles: readonly string[];
  /** Kills every process left in the cgroup, reads what happened and removes it. Never throws. */
  release(): Promise<CgroupReport>;
}

export interface Cgroups {
  readonly mechanism: CgroupMechanism;
  /** Whether commands get a CPU cgroup (bandwidth, and a weight beside the service's). */
  readonly weighsCpu: boolean;
  /** Creates the cgroup of one command with `limits`; `owner` may write its pid into it. */
  create(id: string, limits: SandboxLimits, owner: { uid: number; gid: number } | undefined): Promise<CommandCgroup>;
}

const CPU_PERIOD_US = 100_000;
/** One core per command: a busy loop in one run leaves the node's other core free. */
const CPU_QUOTA_US = 100_000;
/** How far below its own memory limit a command killed by the OOM killer was ended by the base's (charges come in batches of 64 pages). */
const OWN_LIMIT_SLACK_BYTES = 1024 * 1024;
/** Kill rounds before giving up on a cgroup that keeps gaining processes (it cannot: pids are capped). */
const KILL_ROUNDS = 50;

/**
 * Finds a writable cgroup hierarchy for sandboxed commands, or undefined.
 * `root` is the cgroup mount point (tests may point it elsewhere).
 */
export async function detectCgroups(options: {
  root?: string;
  processesTotal: number;
  /** Bytes of memory all sandboxes use at once, together (`RUNS_SANDBOX_MEMORY_MB`). */
  memoryTotalBytes: number;
  log?: Logger;
  /** This process's cgroups as /proc/self/cgroup lists them (read here when not given). */
  selfCgroup?: string;
}): Promise<Cgroups | undefined> {
  const root = options.root ?? "/sys/fs/cgroup";
  const self = cgroupPathsOf(options.selfCgroup ?? (await readFile("/proc/self/cgroup", "utf8").catch(() => "")));
  const found = (await tryV2(root, self)) ?? (await tryV1(root, self));
  if (!found) return undefined;
  for (const base of found.bases) await sweepLeftovers(base);
  // Every command of the node (v2) or of the host's nodes (v1: they share the base)
  // together; each command has its own limit below it. Without it the commands' own
  // limits still hold: the cgroups are used all the same.
  try {
    await writeFile(path.join(found.pidsBase, "pids.max"), String(options.processesTotal));
  } catch (err) {
    options.log?.warn({ err, base: found.pidsBase }, "sandbox: could not limit the processes of all sandboxes together (RUNS_SANDBOX_PROCESSES); each command's own limit holds");
  }
  // Each command's memory_mb is the tenant's (up to 64 GiB): without a bound on them all,
  // a few commands could push the host into its OOM killer, which may pick the service or
  // a store. Past this one, the kernel kills within the sandboxes (the largest first).
  try {
    found.limitMemory(options.memoryTotalBytes);
    if (!found.memoryHierarchical) {
      options.log?.warn({ base: found.memoryBase }, "sandbox: the memory hierarchy does not count commands against their parent (cgroup v1 memory.use_hierarchy 0): RUNS_SANDBOX_MEMORY_MB bounds nothing here; each command's own limit holds");
    }
  } catch (err) {
    options.log?.warn({ err, base: found.memoryBase }, "sandbox: could not limit the memory of all sandboxes together (RUNS_SANDBOX_MEMORY_MB); each command's own limit holds");
  }
  return found;
}

/** Nodes on one host share the base; each command's cgroup has a random name. */
const BASE = "runs-sandboxes";
/** A command cgroup this old and empty was left by a node that died. */
const LEFTOVER_AGE_MS = 60_000;

/** Removes empty command cgroups that crashed nodes left behind (a busy one refuses rmdir). */
async function sweepLeftovers(base: string): Promise<void> {
  const entries = await readdir(base, { withFileTypes: true }).catch(() => []);
  for (const entry of entries) {
    if (!entry.isDirectory() || !entry.name.startsWith("cmd-")) continue;
    const dir = path.join(base, entry.name);
    const info = await stat(dir).catch(() => undefined);
    if (info && Date.now() - info.mtimeMs > LEFTOVER_AGE_MS) await rmdir(dir).catch(() => undefined);
  }
}

/**
 * A /proc/self/cgroup text ("id:controllers:path" lines) as the path of each controller,
 * the v2 hierarchy's under "" (its line names none). A path may itself hold ':'.
 */
export function cgroupPathsOf(selfCgroup: string): Map<string, string> {
  const paths = new Map<string, string>();
  for (const line of selfCgroup.split("\n")) {
    const [id, controllers, ...rest] = line.split(":");
    if (controllers === undefined || rest.length === 0) continue;
    const p = rest.join(":");
    if (id === "0" && controllers === "") paths.set("", p);
    else for (const c of controllers.split(",")) paths.set(c, p);
  }
  return paths;
}

async function tryV2(root: string, self: Map<string, string>): Promise<CgroupsV2 | undefined> {
  const unified = self.get("");
  if (unified === undefined) return undefined;
  let controllers: string;
  try {
    controllers = await readFile(path.join(root, "cgroup.controllers"), "utf8");
  } catch {
    return undefined; // not a v2 mount at root (hybrid hosts mount it elsewhere, without controllers)
  }
  const own = path.join(root, unified.trim());
  // What the node's own cgroup was given (a delegation may leave cpu out), not all the host has;
  // a node whose cgroup is not found there is not told where it is: no cgroups.
  try {
    controllers = await readFile(path.join(own, "cgroup.controllers"), "utf8");
  } catch {
    return undefined;
  }
  const wanted = ["memory", "pids", "cpu"].filter((c) => controllers.split(/\s+/).includes(c));
  if (!wanted.includes("memory") || !wanted.includes("pids")) return undefined;
  try {
    // "No internal processes": the node leaves its cgroup for a leaf before the
    // cgroup can hand controllers to children.
    const service = path.join(own, "runs-service");
    await mkdir(service, { recursive: true });
    await writeFile(path.join(service, "cgroup.procs"), String(process.pid));
    const enable = wanted.map((c) => `+${c}`).join(" ");
    await writeFile(path.join(own, "cgroup.subtree_control"), enable);
    const base = path.join(own, BASE);
    await mkdir(base, { recursive: true });
    await writeFile(path.join(base, "cgroup.subtree_control"), enable);
    return new CgroupsV2(base, wanted.includes("cpu"));
  } catch {
    return undefined;
  }
}

class CgroupsV2 implements Cgroups {
  readonly mechanism = "cgroup-v2";
  constructor(
    private readonly base: string,
    private readonly cpu: boolean,
  ) {}

  get weighsCpu(): boolean {
    return this.cpu;
  }

  get bases(): string[] {
    return [this.base];
  }

  get pidsBase(): string {
    return this.base;
  }

  get memoryBase(): string {
    return this.base;
  }

  limitMemory(bytes: number): void {
    writeFileSync(path.join(this.base, "memory.max"), String(bytes));
  }

  /** cgroup v2 counts every cgroup against its parents. */
  readonly memoryHierarchical = true;

  async create(id: string, limits: SandboxLimits, owner: { uid: number; gid: number } | undefined): Promise<CommandCgroup> {
    const dir = path.join(this.base, id);
    mkdirSync(dir);
    try {
      writeFileSync(path.join(dir, "memory.max"), String(limits.memoryBytes));
      writeQuiet(path.join(dir, "memory.swap.max"), "0");
      writeFileSync(path.join(dir, "pids.max"), String(limits.processes));
      if (this.cpu) writeFileSync(path.join(dir, "cpu.max"), `${CPU_QUOTA_US} ${CPU_PERIOD_US}`);
      const procs = path.join(dir, "cgroup.procs");
      if (owner) chownSync(procs, owner.uid, owner.gid);
    } catch (err) {
      rmQuiet(dir);
      throw err;
    }
    return {
      procsFiles: [path.join(dir, "cgroup.procs")],
      release: async () => {
        writeQuiet(path.join(dir, "cgroup.kill"), "1");
        await killAll([dir]);
        const events = readQuiet(path.join(dir, "memory.events"));
        const pids = readQuiet(path.join(dir, "pids.events"));
        await removeDir(dir);
        // "oom" counts the allocations that failed at this cgroup's own limit (an ancestor's
        // are counted there and above, never below). Not "max", which also counts reclaims
        // at its limit that succeeded, nor the peak, which holds the page cache.
        const oomKilled = counter(events, "oom_kill") > 0;
        return { oomKilled, sharedMemoryHit: oomKilled && counter(events, "oom") === 0, processLimitHit: counter(pids, "max") > 0 };
      },
    };
  }
}

async function tryV1(root: string, paths: Map<string, string>): Promise<CgroupsV1 | undefined> {
  const dirs: Partial<Record<"memory" | "pids" | "cpu", string>> = {};
  for (const c of ["memory", "pids", "cpu"] as const) {
    const own = paths.get(c);
    if (own === undefined) continue;
    const mount = path.join(root, c);
    const base = path.join(mount, own, BASE);
    try {
      await mkdir(base, { recursive: true });
      dirs[c] = base;
    } catch {
      // not writable: without memory or pids the hierarchy is not used at all
    }
  }
  if (!dirs.memory || !dirs.pids) return undefined;
  return new CgroupsV1(dirs.memory, dirs.pids, dirs.cpu);
}

class CgroupsV1 implements Cgroups {
  readonly mechanism = "cgroup-v1";
  constructor(
    private readonly memory: string,
    private readonly pids: string,
    private readonly cpu: string | undefined,
  ) {}

  get bases(): string[] {
    return [this.memory, this.pids, ...(this.cpu ? [this.cpu] : [])];
  }

  get pidsBase(): string {
    return this.pids;
  }

  get memoryBase(): string {
    return this.memory;
  }

  /** Whether commands count against the base (kernels before 6.x could turn that off: `memory.use_hierarchy` 0). */
  get memoryHierarchical(): boolean {
    return readQuiet(path.join(this.memory, "memory.use_hierarchy")).trim() !== "0";
  }

  /** With swap accounting, memory and swap together too: written around the limit, which it may not be under. */
  limitMemory(bytes: number): void {
    // Counting commands against the base where the kernel lets that be turned off (before 6.x).
    writeQuiet(path.join(this.memory, "memory.use_hierarchy"), "1");
    writeQuiet(path.join(this.memory, "memory.memsw.limit_in_bytes"), String(bytes));
    writeFileSync(path.join(this.memory, "memory.limit_in_bytes"), String(bytes));
    writeQuiet(path.join(this.memory, "memory.memsw.limit_in_bytes"), String(bytes));
  }

  get weighsCpu(): boolean {
    return this.cpu !== undefined;
  }

  async create(id: string, limits: SandboxLimits, owner: { uid: number; gid: number } | undefined): Promise<CommandCgroup> {
    const dirs = [this.memory, this.pids, ...(this.cpu ? [this.cpu] : [])].map((base) => path.join(base, id));
    const made: string[] = [];
    try {
      for (const dir of dirs) {
        mkdirSync(dir);
        made.push(dir);
      }
      const [memory, pids, cpu] = dirs as [string, string, string | undefined];
      writeFileSync(path.join(memory, "memory.limit_in_bytes"), String(limits.memoryBytes));
      // Without swap accounting the file is absent; with it, swap counts against the limit too.
      writeQuiet(path.join(memory, "memory.memsw.limit_in_bytes"), String(limits.memoryBytes));
      writeFileSync(path.join(pids, "pids.max"), String(limits.processes));
      if (cpu) {
        writeFileSync(path.join(cpu, "cpu.cfs_period_us"), String(CPU_PERIOD_US));
        writeFileSync(path.join(cpu, "cpu.cfs_quota_us"), String(CPU_QUOTA_US));
      }
      if (owner) for (const dir of dirs) chownSync(path.join(dir, "cgroup.procs"), owner.uid, owner.gid);
    } catch (err) {
      for (const dir of made) rmQuiet(dir);
      throw err;
    }
    return {
      procsFiles: dirs.map((dir) => path.join(dir, "cgroup.procs")),
      release: async () => {
        await killAll(dirs);
        const oom = readQuiet(path.join(dirs[0]!, "memory.oom_control"));
        const failcnt = (readQuiet(path.join(dirs[0]!, "memory.failcnt")) || "0");
        // Its own limit was reached if it used all of it (failcnt is not counted where memory
        // and swap are limited together, and v1 has no count of failed allocations); the base's
        // limit ends it with room left below its own. A peak of page cache at its own limit
        // makes a later kill by the base's read as its own: the words differ, not the kill.
        const peak = Math.max(Number(readQuiet(path.join(dirs[0]!, "memory.max_usage_in_bytes"))) || 0, Number(readQuiet(path.join(dirs[0]!, "memory.memsw.max_usage_in_bytes"))) || 0);
        const pidEvents = readQuiet(path.join(dirs[1]!, "pids.events"));
        for (const dir of dirs) await removeDir(dir);
        // Older kernels have no oom_kill counter: a failed charge then stands for it.
        const oomKilled = oom.includes("oom_kill ") ? counter(oom, "oom_kill") > 0 : Number(failcnt) > 0;
        return { oomKilled, sharedMemoryHit: oomKilled && peak < limits.memoryBytes - OWN_LIMIT_SLACK_BYTES, processLimitHit: counter(pidEvents, "max") > 0 };
      },
    };
  }
}

/** SIGKILLs every process of the cgroups until they are empty (bounded). */
async function killAll(dirs: readonly string[]): Promise<void> {
  for (let round = 0; round < KILL_ROUNDS; round++) {
    let found = 0;
    for (const dir of dirs) {
      const procs = readQuiet(path.join(dir, "cgroup.procs"));
      for (const pid of procs.split("\n").filter(Boolean)) {
        found++;
        try {
          process.kill(Number(pid), "SIGKILL");
        } catch {
          // already gone
        }
      }
    }
    if (found === 0) return;
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** rmdir, retried briefly: a cgroup is busy until its last (killed) process is reaped. */
async function removeDir(dir: string): Promise<void> {
  for (let attempt = 0; attempt < 50; attempt++) {
    try {
      rmdirSync(dir);
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return;
      await new Promise((r) => setTimeout(r, 10));
    }
  }
}

// The per-command paths use synchronous calls: cgroupfs files are kernel memory, so a
// call takes microseconds, where the thread pool's round trips cost ~2 ms a command.

function readQuiet(file: string): string {
  try {
    return readFileSync(file, "utf8");
  } catch {
    return "";
  }
}

/** A write to a file only some kernels have (swap accounting, cgroup.kill). */
function writeQuiet(file: string, value: string): void {
  try {
    writeFileSync(file, value);
  } catch {
    // absent here
  }
}

function rmQuiet(dir: string): void {
  try {
    rmdirSync(dir);
  } catch {
    // gone already, or busy: the start-up sweep removes leftovers
  }
}

/** The value of `name N` in a cgroup key-value file, 0 when absent. */
export function counter(text: string, name: string): number {
  for (const line of text.split("\n")) {
    const [key, value] = line.trim().split(/\s+/);
    if (key === name) return Number(value) || 0;
  }
  return 0;
}
