/**
 * What a sandbox is made of on this host: the launcher script (cgroups, rlimits), the
 * read-only system it sees, the egress relay's environment, and the host-side file
 * work (ownership of a workspace, its size, whether the sandbox's uid can reach it).
 */
import { execFile, spawn, spawnSync } from "node:child_process";
import { type Stats, accessSync, closeSync, constants as fsConstants, existsSync, lstatSync, readdirSync, readFileSync, readlinkSync, statSync } from "node:fs";
import { chmod, chown, lchown, lstat, opendir, readdir, rm } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import type { Logger } from "pino";
import type { LimitHit, SandboxLimits } from "./sandbox-limits.js";

const execFileAsync = promisify(execFile);

/** Where the workspace appears inside the sandbox. */
export const SANDBOX_WORKSPACE = "/workspace";
/** The uid and gid a command has inside the sandbox (never 0). */
export const SANDBOX_INNER_ID = 1000;
/** The proxy address inside a sandbox whose deployment allows destinations. */
export const SANDBOX_PROXY = "127.0.0.1:3128";

/**
 * Whether an exit is bwrap's or the launcher's own failure, before the command ran:
 * bwrap exits 1 after a "bwrap: …" line, the launcher (or, inside the sandbox, the
 * process limit's wrapper) 125 after "runs-sandbox: …", the shell's own words silenced.
 * Commands send their stderr to stdout (every tool does), so stderr is theirs alone;
 * a command that forges the line only fails its own turn.
 */
export function setupFailed(exitCode: number, stderr: Buffer): boolean {
  const text = stderr.toString("utf8");
  return (exitCode === 1 && text.startsWith("bwrap: ")) || (exitCode === 125 && text.startsWith("runs-sandbox: "));
}

export function proxyEnv(): Record<string, string> {
  const url = `http://${SANDBOX_PROXY}`;
  return { HTTP_PROXY: url, HTTPS_PROXY: url, http_proxy: url, https_proxy: url, ALL_PROXY: url, NO_PROXY: "", no_proxy: "" };
}

/**
 * Wraps argv so a socat inside the sandbox relays 127.0.0.1:3128 to the egress
 * socket, and the command starts once the relay listens (bounded wait).
 */
export function withEgressRelay(argv: readonly string[]): string[] {
  const script =
    'socat TCP-LISTEN:3128,bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:/run/runs/egress.sock 2>/dev/null & ' +
    'i=0; while [ $i -lt 200 ] && ! grep -q ":0C38 00000000:0000 0A" /proc/net/tcp 2>/dev/null; do i=$((i+1)); sleep 0.01; done; ' +
    'exec "$@"';
  return ["/bin/sh", "-c", script, "sh", ...argv];
}

/**
 * Which `ulimit` flag of `shell` sets RLIMIT_NPROC: `-u` in bash, busybox and zsh, `-p`
 * in dash (where bash's `-p` is the read-only pipe size); undefined when neither works.
 */
export function nprocFlagOf(shell: string): string | undefined {
  for (const flag of ["-u", "-p"]) {
    // Setting the soft limit to the hard one is allowed to any user.
    const probe = spawnSync(shell, ["-c", `v=$(ulimit -H ${flag}) && ulimit -S ${flag} "$v"`], { stdio: "ignore", timeout: 5_000 });
    if (probe.status === 0) return flag;
  }
  return undefined;
}

/** The highest OOM score adjustment: under memory pressure the host ends such processes first. */
export const OOM_SCORE_ADJ_MAX = 1000;

/** Sets the limit `ulimit $1 $2`, or fails as the launcher and the limit's wrapper do (exit 125, their own words). */
const SET_LIMIT = 'ulimit "$1" "$2" 2>/dev/null || { echo "runs-sandbox: cannot set limit $1 $2" >&2; exit 125; }';

/**
 * The launcher (run as the sandbox's uid): makes itself, and so the command, the first
 * the host's OOM killer ends (any process may raise its own score; a command may lower it
 * again, to the service's own, so this orders the killer's choice among commands that did
 * not, and bounds nothing: RUNS_SANDBOX_MEMORY_MB does), joins the command's cgroups,
 * sets the rlimits, then becomes bwrap. A failure here is reported on stderr with exit 125.
 */
export function launcherArgs(procsFiles: readonly string[], rlimits: [string, number][], exec: string[]): string[] {
  const script =
    `{ echo ${OOM_SCORE_ADJ_MAX} > /proc/self/oom_score_adj; } 2>/dev/null; ` +
    'n=$1; shift; while [ "$n" -gt 0 ]; do { echo $$ > "$1"; } 2>/dev/null || { echo "runs-sandbox: cannot join cgroup $1" >&2; exit 125; }; shift; n=$((n-1)); done; ' +
    `n=$1; shift; while [ "$n" -gt 0 ]; do ${SET_LIMIT}; shift 2; n=$((n-1)); done; ` +
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

export interface HostLayout {
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

export function hostLayout(): HostLayout {
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

/** The PATH the launcher runs with (and what it execs is found on). */
export const LAUNCHER_PATH = "/usr/local/bin:/usr/bin:/bin";

export function findOnPath(name: string, searchPath = process.env.PATH ?? LAUNCHER_PATH): string | undefined {
  for (const dir of searchPath.split(path.delimiter)) {
    if (!dir) continue;
    const candidate = path.join(dir, name);
    if (isExecutable(candidate)) return candidate;
  }
  return undefined;
}

export function isExecutable(file: string): boolean {
  try {
    accessSync(file, fsConstants.X_OK);
    return statSync(file).isFile();
  } catch {
    return false;
  }
}

/**
 * The folder that holds the workspaces, closed to every host user but the sandboxes' (and
 * the service's): the service's, 0710 with the sandboxes' group (bwrap, as the
 * sandbox's uid, resolves the path of the workspace it binds, through the group's bit), or
 * 0700 where it belongs to the sandboxes' uid itself (a service sharing that uid, or a
 * filesystem that gives root's files to nobody). So no other user reaches a workspace,
 * whatever modes a command gave it (`chmod 755 /workspace`) or a file it left there. False
 * when the filesystem kept others' access all the same (it ignores modes).
 */
export async function closedToOthers(dir: string, sandbox: { uid: number; gid: number }): Promise<boolean> {
  const info = await lstat(dir);
  const service = process.getuid?.() ?? info.uid;
  const byOwner = info.uid === sandbox.uid;
  const wanted = byOwner ? 0o700 : 0o710;
  // The service's (an operator's uid would keep its access), with the sandboxes' group.
  const owned = byOwner || (info.uid === service && info.gid === sandbox.gid);
  if ((info.mode & 0o777) === wanted && owned) return true;
  if (!owned) await chown(dir, service, sandbox.gid);
  await chmod(dir, wanted);
  return ((await lstat(dir)).mode & 0o007) === 0;
}

/** O_CLOEXEC in the flags /proc/self/fdinfo shows (octal; the same on x86_64 and arm64). */
const O_CLOEXEC = 0o2000000;

/**
 * Closes the descriptors this process inherited without close-on-exec (a shell's or a
 * supervisor's: an open file, a directory, a pipe), which every child would otherwise
 * inherit in turn: bwrap passes whatever it is given on to the command, so one such
 * descriptor is the host's file or root directory in a tenant's hands. Node and libuv
 * open everything of their own close-on-exec, so what lacks the flag came from the
 * parent; the IPC channel of a forked Node is kept. Returns what was
 * closed, for the log.
 */
export function closeInheritedDescriptors(): string[] {
  const keep = new Set([0, 1, 2]);
  // Node marks it close-on-exec itself (and removes the variable); kept all the same.
  const channel = (process as { channel?: { fd?: number } }).channel?.fd ?? Number(process.env.NODE_CHANNEL_FD);
  if (Number.isInteger(channel)) keep.add(channel);
  const closed: string[] = [];
  let entries: string[];
  try {
    entries = readdirSync("/proc/self/fdinfo");
  } catch {
    return closed; // no /proc: nothing to read (not Linux)
  }
  for (const entry of entries) {
    const fd = Number(entry);
    if (!Number.isInteger(fd) || keep.has(fd)) continue;
    let flags: number;
    try {
      flags = parseInt(/^flags:\s*([0-7]+)/m.exec(readFileSync(`/proc/self/fdinfo/${fd}`, "utf8"))?.[1] ?? "", 8);
    } catch {
      continue; // gone meanwhile (the directory listing's own descriptor)
    }
    if (Number.isNaN(flags) || flags & O_CLOEXEC) continue;
    let target = "?";
    try {
      target = readlinkSync(`/proc/self/fd/${fd}`);
    } catch {
      // shown as "?"
    }
    try {
      closeSync(fd);
      closed.push(`${fd} -> ${target}`);
    } catch {
      // closed meanwhile
    }
  }
  return closed;
}

/**
 * The service's data folder (the parent of the runtime folder and the workspaces)
 * becomes 0711 when the node owns it: the sandbox's uid must pass through it to a
 * workspace, and nobody may list it. Secrets inside stay 0600, the store's folder 0700.
 */
export async function searchableDataDir(dir: string, log: Logger): Promise<void> {
  const info = await lstat(dir);
  if (info.uid !== process.getuid?.() || (info.mode & 0o777) === 0o711) return;
  await chmod(dir, 0o711);
  log.info({ dir, was: (info.mode & 0o777).toString(8) }, "data folder made searchable (0711) for the sandbox's uid");
}

/**
 * chowns every entry of `dir` not yet owned by uid (lstat: links are not followed) and
 * clears set-user-ID and set-group-ID bits. Bounded by the tree. One deeper than a path
 * can name (PATH_MAX) is done by chown(1) and chmod(1), which walk by descriptors (links
 * not followed either).
 */
export async function chownTree(dir: string, uid: number, gid: number): Promise<void> {
  try {
    await chownWalk(dir, uid, gid);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENAMETOOLONG") throw err;
    await treeCommand("chown", ["-R", "-P", "-h", `${uid}:${gid}`, "--", dir]);
    await treeCommand("chmod", ["-R", "ug-s", "--", dir]);
  }
}

/**
 * Clears the set-user-ID and set-group-ID bits in `dir` (links left alone), where a
 * service sharing the sandboxes' uid may: a file it cannot change (another uid's) stays as
 * it is, and a folder a command closed (`chmod 000`) is opened first. Best effort: what
 * fails is returned for the log, never thrown (the workspace is the tenant's to use).
 */
export async function clearSetIdBits(dir: string): Promise<Error | undefined> {
  const clear = () => walkTree(dir, (p, st) => dropSetIdBits(p, st).catch(() => undefined));
  try {
    await clear();
    return undefined;
  } catch {
    if (!existsSync(dir)) return undefined;
    await reopenTree(dir);
    return treeCommand("chmod", ["-R", "ug-s", "--", dir]).then(
      () => undefined,
      (err: Error) => err,
    );
  }
}

/**
 * No set-user-ID or set-group-ID file of a tenant's stays on the host (a checkpoint
 * restored as root keeps the modes it was saved with): run by another host user, it would
 * be the sandboxes' uid. (Inside, /workspace is mounted nosuid.) A link is left alone.
 */
async function dropSetIdBits(p: Buffer | string, st: Stats): Promise<void> {
  if (!st.isSymbolicLink() && st.mode & 0o6000) await chmod(p, st.mode & 0o1777);
}

async function chownWalk(dir: string, uid: number, gid: number): Promise<void> {
  const own = async (p: Buffer | string, st: Stats) => {
    // A symbolic link is chowned itself, never its target.
    if (st.uid !== uid || st.gid !== gid) await lchown(p, uid, gid);
    await dropSetIdBits(p, st);
  };
  const info = await lstat(dir);
  await own(dir, info);
  if (info.isDirectory()) await walkTree(dir, own);
}

/**
 * Visits every entry below `dir` with its lstat (links not followed), folders before what
 * they hold, until `visit` answers false. Each folder is read as a stream (a folder of
 * millions of names is never held whole) and entries are named by their bytes: a name
 * that is not UTF-8 (a command may make one) is reached as it is, not as its U+FFFD
 * replacement, which names nothing. A path past PATH_MAX throws ENAMETOOLONG.
 */
async function walkTree(dir: string, visit: (p: Buffer, st: Stats) => Promise<boolean | void>): Promise<void> {
  const stack: Buffer[] = [Buffer.from(dir)];
  const slash = Buffer.from("/");
  while (stack.length > 0) {
    const current = stack.pop()!;
    for await (const entry of await opendir(current, { encoding: "buffer" } as unknown as Parameters<typeof opendir>[1])) {
      const p = Buffer.concat([current, slash, entry.name as unknown as Buffer]);
      const st = await lstat(p);
      if ((await visit(p, st)) === false) return;
      if (st.isDirectory()) stack.push(p);
    }
  }
}

/** What a directory tree holds: bytes on disk, and entries (files, folders, links) below it. */
export interface TreeUsage {
  bytes: number;
  entries: number;
}

/**
 * The disk a directory tree takes, in bytes (blocks of files and folders alike, the tree's
 * own folder included, a file of several links once; lstat, links not followed), and its
 * entries, each link of a file counted (each takes a name and, but for the first, no
 * inode; an empty file takes an inode and no block, so only the count bounds those); stops
 * counting once either is past its `stopAt`. A tree a command made deeper than a path can
 * name (PATH_MAX), or with an entry this process cannot read, is measured by du(1), which
 * walks by descriptors, after {@link reopenTree} if it must; one that cannot be measured
 * at all counts as past both (its writes refuse), never as empty. Folders take no blocks
 * on some filesystems (tmpfs, btrfs): there only files count in bytes.
 */
export async function treeUsage(dir: string, stopAt: TreeUsage): Promise<TreeUsage> {
  const linked = new Set<string>();
  const usage = { bytes: 0, entries: 0 };
  try {
    usage.bytes = (await lstat(dir)).blocks * 512;
    await walkTree(dir, async (_p, st) => {
      usage.entries++;
      // A further name of a file counted already adds no blocks.
      const counted = !st.isDirectory() && st.nlink > 1 && linked.size < MAX_LINKED_TRACKED && !trackOnce(linked, `${st.dev}:${st.ino}`);
      if (!counted) usage.bytes += st.blocks * 512;
      return usage.bytes <= stopAt.bytes && usage.entries <= stopAt.entries;
    });
    return usage;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT" && !existsSync(dir)) return { bytes: 0, entries: 0 };
    const unmeasurable = { bytes: Infinity, entries: Infinity };
    return duUsage(dir, stopAt).catch(async () => {
      await reopenTree(dir);
      return duUsage(dir, stopAt).catch(() => unmeasurable);
    });
  }
}

/**
 * What a tree a command is changing holds, for the checks while it runs: du(1), in two
 * passes (bytes, then entries by name, as {@link duUsage} counts them). du walks by
 * descriptors, so a folder swapped for a link mid-walk is not followed, and a path past
 * PATH_MAX is no obstacle; its total is read even when entries vanished under it (it then
 * exits 1). What it cannot read (a folder made unreadable where the service shares the
 * sandboxes' uid), or a folder renamed from where it has not been to where it has, is left
 * out: the measurement after the command is the exact one. `signal` stops both passes;
 * a measurement that fails or is stopped rejects.
 */
export async function liveTreeUsage(dir: string, signal?: AbortSignal): Promise<TreeUsage> {
  // One pass after the other: a measurement then takes one core at a time.
  const bytes = await duTotal(dir, ["-B1"], { partial: true, signal });
  signal?.throwIfAborted();
  return { bytes, entries: Math.max(0, (await duTotal(dir, ENTRIES_BY_NAME, { partial: true, signal })) - 1) };
}

/** Linked files whose inodes a measurement remembers (past it, each name's blocks count: more, never less). */
const MAX_LINKED_TRACKED = 1_000_000;

/** Adds `key` to `seen`; false when it was there already. */
function trackOnce(seen: Set<string>, key: string): boolean {
  if (seen.has(key)) return false;
  seen.add(key);
  return true;
}

/** How long du(1), chmod(1) or rm(1) may take over a tree (a workspace of millions of files). */
const TREE_COMMAND_TIMEOUT_MS = 600_000;
const treeCommand = (file: string, args: string[]) => execFileAsync(file, args, { timeout: TREE_COMMAND_TIMEOUT_MS, killSignal: "SIGKILL", maxBuffer: 64 * 1024 });

/**
 * du(1)'s count of a tree's entries as treeUsage counts them: by name, each link of a
 * file (`-l`: else a flood of hard links, a name each and no inode, would count as one).
 */
const ENTRIES_BY_NAME = ["--inodes", "-l"];

/**
 * du(1)'s measure of a tree, as treeUsage counts it (bytes of a file of several links
 * once, entries by name, the tree's own folder not); its entries only when its bytes are
 * within `stopAt` (each pass walks the whole tree).
 */
async function duUsage(dir: string, stopAt: TreeUsage): Promise<TreeUsage> {
  const bytes = await duTotal(dir, ["-B1"]);
  if (bytes > stopAt.bytes) return { bytes, entries: 0 };
  return { bytes, entries: Math.max(0, (await duTotal(dir, ENTRIES_BY_NAME)) - 1) };
}

/**
 * `du -s -x <args> -- dir`'s total. Its complaints are not kept (a tree can make it say
 * millions of them); `partial`: a total is taken from a du that met entries it could not
 * read (exit 1: they vanished, or are closed to the service), otherwise that rejects.
 */
function duTotal(dir: string, args: string[], options: { partial?: boolean; signal?: AbortSignal } = {}): Promise<number> {
  return new Promise((resolve, reject) => {
    const du = spawn("du", ["-s", "-x", ...args, "--", dir], { stdio: ["ignore", "pipe", "ignore"], timeout: TREE_COMMAND_TIMEOUT_MS, killSignal: "SIGKILL", signal: options.signal });
    // First: a spawn that failed for want of descriptors (EMFILE) has no stdout, and says so only here.
    du.on("error", reject);
    if (!du.stdout) return;
    let stdout = "";
    du.stdout.setEncoding("utf8");
    du.stdout.on("data", (chunk: string) => {
      if (stdout.length < 4096) stdout += chunk;
    });
    du.on("close", (code, signal) => {
      const n = Number(/^(\d+)\s/.exec(stdout)?.[1]);
      if ((code === 0 || (code === 1 && options.partial)) && Number.isSafeInteger(n)) resolve(n);
      else reject(new Error(`du ended with ${code ?? signal} and answered ${JSON.stringify(stdout.slice(0, 200))}`));
    });
  });
}

/**
 * Gives the owner back its access to every file and folder of a tree (`chmod -R u+rwX`;
 * links met on the way are not followed): a service that does not run as root shares the
 * sandboxes' uid, and a folder a command made unreadable (`chmod 000`) would keep it from
 * measuring, saving and removing the workspace for good. Best effort.
 */
export async function reopenTree(dir: string): Promise<void> {
  await treeCommand("chmod", ["-R", "u+rwX", "--", dir]).catch(() => undefined);
}

/**
 * Removes a tree a sandboxed command may have made as it liked (gone already: done). Node's
 * recursive rm walks by whole paths and fails past PATH_MAX (ENAMETOOLONG): rm(1) walks by
 * descriptors; a tree neither can remove for want of access is reopened ({@link reopenTree}) first.
 */
export async function removeTree(dir: string): Promise<void> {
  const rmTree = () => treeCommand("rm", ["-rf", "--one-file-system", "--", dir]);
  try {
    await rm(dir, { recursive: true, force: true });
  } catch (err) {
    await rmTree().catch(async () => {
      await reopenTree(dir);
      await rmTree().catch((rmErr: unknown) => {
        throw new Error(`could not remove ${dir.slice(0, 300)}: ${(err as Error).message.slice(0, 300)}; rm(1): ${(rmErr as Error).message.slice(0, 500)}`, { cause: err });
      });
    });
  }
}

/**
 * Address space a process may hold beyond its memory limit without cgroups: runtimes
 * reserve far more than they write (the JVM its heap and a 1 GiB class space, V8 its
 * cages), and RLIMIT_DATA bounds what they write. Measured: the JVM 17 starts within
 * 4 GiB, not 2; Node.js 20 within 768 MiB, not 512.
 */
export const ADDRESS_SPACE_RESERVE_BYTES = 4 * 1024 ** 3;

/**
 * RLIMITs the launcher sets before bwrap: always CPU seconds and file size; when no
 * cgroup limits memory (`withoutCgroups`), what a process allocates (RLIMIT_DATA: its
 * heap and private writable mappings) at `memoryBytes` and its address space at that
 * plus {@link ADDRESS_SPACE_RESERVE_BYTES} (which alone bounds what DATA does not count:
 * shared and stack-like mappings), each per process — a guard against runaway
 * allocations, not a bound on a hostile command; and, without cgroups, the node's `total` of
 * processes, every sandbox's together. A command's own process limit is set inside its
 * sandbox: see {@link withProcessLimit}.
 */
export function rlimitArgs(limits: SandboxLimits, withoutCgroups: boolean, total?: { flag: string; processes: number }, zeroRealtime = false): [string, number][] {
  const r: [string, number][] = [
    // Soft first, then a hard limit one second later: SIGXCPU (named in the tool
    // result), then SIGKILL for a process that ignores it.
    ["-St", limits.cpuSeconds],
    ["-Ht", limits.cpuSeconds + 1],
    // dash counts file sizes in 512-byte blocks.
    ["-f", Math.ceil(limits.diskBytes / 512)],
  ];
  // No real-time scheduling where the service's own limit would allow it: a SCHED_FIFO
  // busy loop would hold a core from everything on the host, the service first.
  if (zeroRealtime) r.push(["-r", 0]);
  if (withoutCgroups) {
    // In KiB, as ulimit counts them.
    const memoryKiB = Math.ceil(limits.memoryBytes / 1024);
    r.push(["-d", memoryKiB], ["-v", memoryKiB + ADDRESS_SPACE_RESERVE_BYTES / 1024]);
  }
  // The node's total: the kernel checks the host uid's processes, every sandbox's
  // together, against the limit bwrap had when it made the namespace.
  if (total) r.push([total.flag, total.processes]);
  return r;
}

/** One limit, soft and hard, in a /proc/<pid>/limits text by its name there; Infinity when unlimited or unreadable. */
export function rlimitOf(limits: string, name: "Max processes" | "Max nice priority" | "Max realtime priority"): { soft: number; hard: number } {
  const found = new RegExp(`^${name}\\s+(\\S+)\\s+(\\S+)`, "m").exec(limits);
  const value = (text: string | undefined) => {
    const n = Number(text);
    return text !== undefined && Number.isSafeInteger(n) && n >= 0 ? n : Infinity;
  };
  return { soft: value(found?.[1]), hard: value(found?.[2]) };
}

/** What a node whose sandboxes run as its own uid keeps of its soft process limit for itself (its threads, its servers'). */
export const NODE_PROCESS_RESERVE = 512;

/**
 * The processes all sandboxes may run at once without cgroups: what was asked, held to
 * what the launcher can set (the node's hard limit) and, when the sandboxes run as the
 * node's own uid, to its soft limit less a reserve (a quarter, at least
 * {@link NODE_PROCESS_RESERVE}): the kernel counts the node's processes and threads with
 * theirs, and the node's own forks are checked against its soft limit.
 */
export function rlimitProcessesTotal(wanted: number, node: { soft: number; hard: number }, sharesNodeUid: boolean): number {
  const total = Math.min(wanted, node.hard);
  if (!sharesNodeUid || node.soft === Infinity) return total;
  return Math.max(0, Math.min(total, node.soft - Math.max(NODE_PROCESS_RESERVE, Math.ceil(node.soft / 4))));
}

/**
 * Wraps argv so RLIMIT_NPROC is set inside the sandbox, where no cgroup limits its
 * processes. Since Linux 5.14 the kernel counts a uid's processes per user namespace,
 * and checks each namespace above against the limit its creator had: set inside the
 * sandbox's own namespace, the limit counts that sandbox's processes alone. Set by the
 * launcher, before bwrap made the namespace, it counted every process of the sandboxes'
 * host uid, so one command at its limit kept every other sandbox of the node from
 * starting (bwrap: "Creating new namespace failed: Resource temporarily unavailable").
 * The command cannot raise it (the hard limit is set too; raising one needs
 * CAP_SYS_RESOURCE outside the sandbox). `flag` is the shell's (`ulimit -u`, dash `-p`).
 * The wrapper runs with the command's environment: that must stay the fixed one of
 * {@link bwrapArgs} (no tenant's `LD_PRELOAD` may run code in the shell before its limit).
 */
export function withProcessLimit(flag: string, processes: number, argv: readonly string[]): string[] {
  const script = `${SET_LIMIT}; shift 2; exec "$@"`;
  return ["/bin/sh", "-c", script, "sh", flag, String(processes), ...argv];
}

/**
 * What shells, coreutils, git, Go, Python, Java and glibc print when a fork or a thread is
 * refused (Python's EAGAIN only next to a fork: a non-blocking lock says the same).
 */
const REFUSED_FORK =
  /fork(?:\/exec)?\b[^\n]{0,200}: (?:retry: )?resource temporarily unavailable|cannot fork|fork[\s\S]{0,400}BlockingIOError: \[Errno 11\]|can't start new thread|unable to create native thread|pthread_create[^\n]{0,200}(?:resource temporarily unavailable|EAGAIN)/i;
/** What they, C++, Node and V8 print when memory is refused. */
const REFUSED_MEMORY = /cannot allocate \d+ bytes|cannot allocate memory|memory exhausted|\bMemoryError\b|std::bad_alloc|out of memory|Fatal process OOM|failed to reserve virtual memory/i;

/**
 * How much of a command's output's end is read for those words: a refusal is what a failed
 * command says last, and the output is the tenant's (up to `output_kb`, 1 MiB): each pattern
 * repeats a bounded number of times, so the reading is linear in what is read, and bounded.
 */
export const SCANNED_OUTPUT_BYTES = 16 * 1024;

/** The part of a command's output read for what it reports: its last {@link SCANNED_OUTPUT_BYTES}. */
function scannedTail(output: Buffer): string {
  return output.subarray(Math.max(0, output.length - SCANNED_OUTPUT_BYTES)).toString("utf8");
}

/**
 * The memory and process limits a failed command met without cgroups, from its output:
 * the kernel then reports neither (a refused fork or allocation is the command's own
 * error, not a kill), so a command that failed saying so is taken to have met the limit.
 * A command that succeeded met none, whatever it printed.
 */
export function rlimitHits(output: Buffer, failed: boolean): LimitHit[] {
  if (!failed) return [];
  const text = scannedTail(output);
  const hits: LimitHit[] = [];
  if (REFUSED_MEMORY.test(text)) hits.push("memory");
  if (REFUSED_FORK.test(text)) hits.push("processes");
  return hits;
}

/**
 * Whether the command's shell reported a process of it killed by a signal, by the signal's
 * description (`Bus error`, `File size limit exceeded`), as bash does: `line 3: 42 Bus
 * error  cmd` (or `./script.sh: line 3: …` for a script it ran), in the output's tail. The
 * command may have gone on and succeeded; words merely printed (a log it showed, a grep)
 * are no such report.
 */
export function shellReported(output: Buffer, description: string): boolean {
  const text = scannedTail(output);
  // bash pads the description to a column and writes the command right after it: no space
  // when the description is long ("File size limit exceededhead -c …").
  return new RegExp(`^(?:\\S+: )?line \\d+: +\\d+ ${description}`, "m").test(text);
}

/** bwrap's arguments for one command (README "Sandbox" says what each part is for). */
export function bwrapArgs(
  layout: HostLayout,
  cmd: { env?: Record<string, string>; tmpBytes: number },
  argv: readonly string[],
  fds: { network?: number; seccomp?: number },
): string[] {
  const network = fds.network !== undefined;
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
    ...layout.system,
    "--proc",
    "/proc",
    // bwrap's /dev is a tmpfs of half the host's memory: read-only here, with a /dev/shm
    // of the same size as /tmp (POSIX semaphores and shared memory live there).
    "--dev",
    "/dev",
    "--size",
    String(cmd.tmpBytes),
    "--tmpfs",
    "/dev/shm",
    "--remount-ro",
    "/dev",
    "--size",
    String(cmd.tmpBytes),
    "--tmpfs",
    "/tmp",
    "--bind-fd",
    "3",
    SANDBOX_WORKSPACE,
  ];
  if (network) args.push("--ro-bind-fd", String(fds.network), "/run/runs");
  // The filter (actors/sandbox-seccomp.ts), loaded by bwrap right before it execs the command.
  if (fds.seccomp !== undefined) args.push("--seccomp", String(fds.seccomp));
  args.push("--chdir", SANDBOX_WORKSPACE, "--remount-ro", "/", "--clearenv");
  for (const [name, value] of Object.entries(env)) args.push("--setenv", name, value);
  args.push("--", ...argv);
  return args;
}
