/**
 * The sandbox runner itself, with real bubblewrap and the host's cgroups: start-up
 * checks, the start retries, capacity, limits, teardown. The API-level escape
 * attempts are in escape.test.ts.
 */
import test from "ava";
import { setTimeout as sleep } from "node:timers/promises";
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import pino from "pino";
import { DEFAULT_SANDBOX_UID, MIN_TENANT_COMMAND_PROCESSES, SANDBOX_NICENESS, Sandbox, SandboxFailure, SandboxUnavailableError, tenantProcessShare, type SandboxCommand } from "../../actors/sandbox.js";
import { DEFAULT_LIMITS } from "../../actors/sandbox-limits.js";
import { ADDRESS_SPACE_RESERVE_BYTES } from "../../actors/sandbox-host.js";
import { EgressProxy, type EgressDenial } from "../../actors/egress-proxy.js";
import { holdingBomb, hostProcesses, settledCount } from "../helpers/sandbox.js";
import http from "node:http";
import { spawn, spawnSync } from "node:child_process";
import { closeSync, constants as fsConstants, existsSync, openSync } from "node:fs";
import { createWorkspaceTools } from "../../actors/workspace-tools.js";
import { BUILTIN_TOOLS } from "../../src/domain.js";
import { PROJECT_ROOT } from "../../node/servers.js";
import type { AddressInfo } from "node:net";

const log = pino({ level: process.env.RUNS_TEST_LOG_LEVEL ?? "silent" });
const MERGED = 'exec "$0" -c "$1" 2>&1';

interface Ctx {
  base: string;
  sandbox: Sandbox;
}

async function tempBase(): Promise<string> {
  const base = await mkdtemp(path.join(os.tmpdir(), "runs-sandbox-runner-"));
  await chmod(base, 0o711);
  return base;
}

async function workspace(sandbox: Sandbox, base: string): Promise<string> {
  const dir = path.join(base, `ws-${Math.random().toString(36).slice(2, 8)}`);
  await mkdir(dir);
  await sandbox.prepareWorkspace(dir);
  return dir;
}

function bash(dir: string, command: string, extra: Partial<SandboxCommand> = {}): SandboxCommand {
  return { workspaceDir: dir, argv: ["/bin/bash", "-c", MERGED, "/bin/bash", command], timeoutMs: 20_000, limits: DEFAULT_LIMITS, ...extra };
}


const test_ = test as import("ava").TestFn<Ctx>;

test_.before(async (t) => {
  const base = await tempBase();
  const sandbox = await Sandbox.start({ mode: "bwrap", maxConcurrent: 2, runtimeDir: path.join(base, "rt"), nodeId: "runner-test", log });
  t.context = { base, sandbox };
});

test_.after.always(async (t) => {
  await rm(t.context.base, { recursive: true, force: true });
});

test_("sandbox - descriptors the service inherited without close-on-exec (a secret file, the host's /) do not reach a command: the sandbox closes them as it starts, and logs them", async (t) => {
  t.timeout(60_000);
  const dir = await tempBase();
  const secretFile = path.join(dir, "secret");
  const secret = `INHERITED-${Math.random().toString(36).slice(2)}`;
  await writeFile(secretFile, secret, { mode: 0o600 });
  const secretFd = openSync(secretFile, "r");
  const rootFd = openSync("/", fsConstants.O_RDONLY | fsConstants.O_DIRECTORY);
  try {
    // The child's descriptors 200 and 201, without close-on-exec, as a shell leaves them.
    const stdio: Array<"ignore" | "pipe" | number> = Array.from({ length: 202 }, () => "ignore");
    stdio[1] = "pipe";
    stdio[2] = "pipe";
    stdio[200] = secretFd;
    stdio[201] = rootFd;
    const child = spawn(process.execPath, ["--import", "tsx", "test/helpers/inherited-fd-child.ts"], { cwd: PROJECT_ROOT, stdio });
    let out = "";
    let err = "";
    child.stdout!.on("data", (d) => (out += d));
    child.stderr!.on("data", (d) => (err += d));
    const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
    t.is(code, 0, err);
    const { output, logs } = JSON.parse(out) as { output: string; logs: Array<{ msg: string; descriptors?: string[] }> };
    const listed = output.split("\n")[0]!.trim().split(/\s+/);
    t.false(listed.includes("200") || listed.includes("201"), `the command's descriptors: ${listed.join(" ")}`);
    t.false(output.includes(secret), output);
    t.regex(output, /Bad file descriptor/);
    const closed = logs.find((line) => /closed descriptors the service inherited/.test(line.msg));
    t.truthy(closed, JSON.stringify(logs));
    t.true(closed!.descriptors!.includes(`200 -> ${secretFile}`), JSON.stringify(closed));
    t.true(closed!.descriptors!.includes("201 -> /"), JSON.stringify(closed));
  } finally {
    closeSync(secretFd);
    closeSync(rootFd);
    await rm(dir, { recursive: true, force: true });
  }
});

test_("sandbox - preparing a workspace changes nothing above it (only the run's workspaces' folder is closed, by closeWorkspacesFolder): a folder like /tmp keeps its mode", async (t) => {
  const { sandbox } = t.context;
  const parent = await tempBase();
  try {
    await chmod(parent, 0o1777);
    const dir = path.join(parent, "ws");
    await mkdir(dir);
    await sandbox.prepareWorkspace(dir);
    const info = await stat(parent);
    t.is(info.mode & 0o7777, 0o1777);
    t.is(info.gid, process.getgid!());
  } finally {
    await rm(parent, { recursive: true, force: true });
  }
});

test_("sandbox - start-up reports bwrap, the limits mechanism, an unprivileged uid and the seccomp filter (on x86-64 and arm64)", (t) => {
  const status = t.context.sandbox.status();
  t.is(status.mode, "bwrap");
  t.not(status.uid, 0);
  t.true(["cgroup-v2", "cgroup-v1", "rlimit"].includes(status.limits));
  t.is(status.seccomp, process.arch === "x64" || process.arch === "arm64");
});

test_("sandbox - a node without bwrap refuses to start and says how to install it", async (t) => {
  const base = await tempBase();
  try {
    const error = await t.throwsAsync(
      Sandbox.start({ mode: "bwrap", bwrapPath: path.join(base, "no-such-bwrap"), maxConcurrent: 1, runtimeDir: path.join(base, "rt"), nodeId: "x", log }),
    );
    t.true(error instanceof SandboxUnavailableError);
    t.regex(error!.message, /apt-get install bubblewrap/);
    t.regex(error!.message, /RUNS_SANDBOX=off/);
  } finally {
    await rm(base, { recursive: true, force: true });
  }
});

test_("sandbox - a data folder below a folder the sandbox's uid cannot pass is refused at start with the reason", async (t) => {
  const base = await tempBase();
  const closed = path.join(base, "closed");
  await mkdir(closed, { mode: 0o700 });
  try {
    const error = await t.throwsAsync(
      Sandbox.start({ mode: "bwrap", maxConcurrent: 1, runtimeDir: path.join(closed, "data", "rt"), nodeId: "x", log }),
    );
    t.true(error instanceof SandboxUnavailableError);
    t.regex(error!.message, /must be able to reach/);
    // The data folder itself the node makes searchable; folders above it are the operator's.
    t.is((await stat(path.join(closed, "data"))).mode & 0o777, 0o711);
    t.is((await stat(closed)).mode & 0o777, 0o700);
  } finally {
    await rm(base, { recursive: true, force: true });
  }
});

test_("sandbox - a bwrap that fails to start is tried three times, then sandbox_start_retries_exhausted", async (t) => {
  const base = await tempBase();
  // The launcher runs as the sandbox's uid: the call log must be writable by it.
  await mkdir(path.join(base, "log"), { mode: 0o777 });
  await chmod(path.join(base, "log"), 0o777);
  const counter = path.join(base, "log", "calls");
  const fake = path.join(base, "bwrap");
  // Passes the start-up probe through to the real bwrap; fails for commands with the marker.
  await writeFile(
    fake,
    `#!/bin/sh\ncase "$*" in *FAIL_START*) echo x >> ${counter}; echo "bwrap: simulated failure" >&2; exit 1;; esac\nexec bwrap "$@"\n`,
    { mode: 0o755 },
  );
  try {
    const sandbox = await Sandbox.start({ mode: "bwrap", bwrapPath: fake, maxConcurrent: 1, runtimeDir: path.join(base, "rt"), nodeId: "x", log });
    const dir = await workspace(sandbox, base);
    const error = await t.throwsAsync(sandbox.run(bash(dir, "echo FAIL_START")));
    t.true(error instanceof SandboxFailure);
    t.is((error as SandboxFailure).code, "sandbox_start_retries_exhausted");
    t.regex(error!.message, /simulated failure/);
    t.is((await readFile(counter, "utf8")).trim().split("\n").length, 3);
    // A command that fails on its own is the command's outcome, not a sandbox failure.
    const own = await sandbox.run(bash(dir, "echo 'bwrap: forged' >&2; exit 1"));
    t.is(own.kind, "exited");
  } finally {
    await rm(base, { recursive: true, force: true });
  }
});

test_("sandbox - a kernel that refuses the seccomp filter stops the node at start and says so; a filter removed from the runtime folder is written again", async (t) => {
  const base = await tempBase();
  // bwrap's own words where the kernel has no seccomp filters (CONFIG_SECCOMP_FILTER unset).
  const fake = path.join(base, "bwrap");
  await writeFile(fake, `#!/bin/sh\ncase "$*" in *--seccomp*) echo "bwrap: prctl(PR_SET_SECCOMP): Invalid argument" >&2; exit 1;; esac\nexec bwrap "$@"\n`, { mode: 0o755 });
  try {
    if (process.arch === "x64" || process.arch === "arm64") {
      const error = await t.throwsAsync(Sandbox.start({ mode: "bwrap", bwrapPath: fake, maxConcurrent: 1, runtimeDir: path.join(base, "refused"), nodeId: "x", log }));
      t.true(error instanceof SandboxUnavailableError);
      t.regex(error!.message, /PR_SET_SECCOMP/);
      t.regex(error!.message, /CONFIG_SECCOMP_FILTER/);
      t.notRegex(error!.message, /user namespaces/);
    }
    const runtimeDir = path.join(base, "rt");
    const sandbox = await Sandbox.start({ mode: "bwrap", maxConcurrent: 1, runtimeDir, nodeId: "x", log });
    const filters = (await readdir(runtimeDir)).filter((name) => name.startsWith("seccomp-"));
    t.is(filters.length, sandbox.status().seccomp ? 1 : 0, filters.join());
    for (const name of filters) await rm(path.join(runtimeDir, name));
    const dir = await workspace(sandbox, base);
    const outcome = await sandbox.run(bash(dir, "grep Seccomp: /proc/self/status"));
    t.is(outcome.kind, "exited");
    t.is(outcome.output.toString("utf8").trim(), `Seccomp:\t${sandbox.status().seccomp ? 2 : 0}`);
    t.deepEqual((await readdir(runtimeDir)).filter((name) => name.startsWith("seccomp-")), filters);
  } finally {
    await rm(base, { recursive: true, force: true });
  }
});

test_("sandbox - without cgroups, a node starts while other sandboxes of the host's sandbox uid run more processes than its probe needs (before Linux 5.14 RLIMIT_NPROC counts them all)", async (t) => {
  const base = await tempBase();
  try {
    const running = await Sandbox.start({ mode: "bwrap", maxConcurrent: 2, runtimeDir: path.join(base, "rt-a"), nodeId: "nproc-a", log, cgroupRoot: false });
    const dir = await workspace(running, base);
    // 24 processes of the sandbox uid for ~8 s: more than the 16 the probe once allowed itself.
    const busy = running.run(bash(dir, "for i in $(seq 24); do sleep 8.137 & done; wait", { limits: { ...DEFAULT_LIMITS, processes: 64 }, timeoutMs: 20_000 }));
    let count = 0;
    for (let i = 0; i < 100 && count < 24; i++) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      count = (await hostProcesses("sleep 8.137")).length;
    }
    t.true(count >= 24, `${count} sleeping processes`);
    const second = await Sandbox.start({ mode: "bwrap", maxConcurrent: 2, runtimeDir: path.join(base, "rt-b"), nodeId: "nproc-b", log, cgroupRoot: false });
    t.is(second.status().limits, "rlimit");
    const outcome = await busy;
    t.is(outcome.kind, "exited");
  } finally {
    await rm(base, { recursive: true, force: true });
  }
});

test_("sandbox - without cgroups, rlimits bound a command's processes and CPU time (/bin/sh may be dash)", async (t) => {
  const base = await tempBase();
  try {
    // The suite's default sandbox uid, whose other sandboxes (a fork bomb among them) run
    // at the same time: the limit counts this sandbox's processes alone.
    // A total above the node's own hard limit (which the launcher could not raise) is held to it.
    const sandbox = await Sandbox.start({ mode: "bwrap", maxConcurrent: 2, runtimeDir: path.join(base, "rt"), nodeId: "rlimit", log, cgroupRoot: false, processesTotal: 2 ** 30 });
    t.is(sandbox.status().limits, "rlimit");
    const dir = await workspace(sandbox, base);
    const limits = { ...DEFAULT_LIMITS, processes: 40, cpuSeconds: 30 };
    const shown = await sandbox.run(bash(dir, "ulimit -u; ulimit -St; ulimit -Ht", { limits }));
    t.is(shown.kind, "exited");
    t.deepEqual(shown.output.toString().trim().split("\n"), ["40", "30", "31"]);
    // Fewer than 40 start, never 80 (dash says so at once; bash would retry for seconds).
    const forks = await sandbox.run(bash(dir, "sh -c 'for i in $(seq 80); do sleep 30 >/dev/null & done; echo done' 2>&1", { limits, timeoutMs: 10_000 }));
    t.regex(forks.output.toString(), /Cannot fork|Resource temporarily unavailable/);
  } finally {
    await rm(base, { recursive: true, force: true });
  }
});

test_("sandbox - without cgroups, memory_mb bounds what a process writes (RLIMIT_DATA), not what it reserves: Node.js, Python and the JVM start at the default 512 MiB; a larger private allocation and a shared mapping past the address-space reserve are refused", async (t) => {
  const base = await tempBase();
  try {
    const sandbox = await Sandbox.start({ mode: "bwrap", maxConcurrent: 2, runtimeDir: path.join(base, "rt"), nodeId: "rlimit-memory", log, cgroupRoot: false });
    t.is(sandbox.status().limits, "rlimit");
    const dir = await workspace(sandbox, base);
    t.is(DEFAULT_LIMITS.memoryBytes, 512 * 1024 * 1024);
    const shown = await sandbox.run(bash(dir, "ulimit -d; ulimit -v"));
    t.deepEqual(shown.output.toString().trim().split("\n"), [String(512 * 1024), String(512 * 1024 + ADDRESS_SPACE_RESERVE_BYTES / 1024)]);
    // Each runtime the host has (the sandbox sees the host's /usr); node and python3 are on every machine of ours.
    const runtimes = await sandbox.run(
      bash(
        dir,
        "node -e 'console.log(\"node\", process.version)'; python3 -c 'print(\"python\")'; " +
          'j=$(ls /usr/lib/jvm/*/bin/java 2>/dev/null | head -n 1); if [ -n "$j" ]; then "$j" -version 2>&1 | head -n 1; else echo "no jvm"; fi',
        { timeoutMs: 60_000 },
      ),
    );
    const said = runtimes.output.toString();
    t.is(runtimes.kind, "exited", said);
    t.regex(said, /^node v\d+/m, said);
    t.regex(said, /^python$/m, said);
    t.regex(said, /^(no jvm|.* version ".*)$/m, said);
    t.log(said.trim().split("\n").join(" | "));
    // What a process writes is held at the limit…
    const hog = await sandbox.run(bash(dir, "python3 -c 'b = bytearray(600 * 1024 * 1024); print(\"allocated\")'", { limitsFromOutput: true }));
    t.regex(hog.output.toString(), /MemoryError/, hog.output.toString());
    t.true(hog.limits.includes("memory"), JSON.stringify(hog.limits));
    // …and a shared mapping (which RLIMIT_DATA does not count) within the address-space bound only. Mapped, never touched.
    const mapping = (mib: number) =>
      `python3 -c 'import mmap; m = mmap.mmap(-1, ${mib} * 1024 * 1024, flags=mmap.MAP_SHARED); print("mapped ${mib}")'`;
    const within = await sandbox.run(bash(dir, mapping(1024)));
    t.regex(within.output.toString(), /mapped 1024/, within.output.toString());
    const past = await sandbox.run(bash(dir, mapping(512 + ADDRESS_SPACE_RESERVE_BYTES / 1024 / 1024 + 64)));
    t.notRegex(past.output.toString(), /mapped/, past.output.toString());
    t.regex(past.output.toString(), /Cannot allocate memory|MemoryError/, past.output.toString());
  } finally {
    await rm(base, { recursive: true, force: true });
  }
});

test_.serial("sandbox - without a CPU cgroup commands run at nice 19; with or without, they can neither raise their priority nor use real-time scheduling, even where the node's own RLIMIT_RTPRIO would let them", async (t) => {
  const base = await tempBase();
  const limitsOfTest = await readFile("/proc/self/limits", "utf8");
  const realtime = /^Max realtime priority\s+(\S+)\s+(\S+)/m.exec(limitsOfTest)!;
  // The node's own real-time limit raised (root with CAP_SYS_RESOURCE may): a command would inherit it through the launcher.
  const raised = spawnSync("prlimit", ["--pid", String(process.pid), "--rtprio=50:50"]).status === 0;
  // Where this process's RLIMIT_NICE is above 1 (which the node only warns about), a command could renice itself up.
  const niceHard = /^Max nice priority\s+\S+\s+(\S+)/m.exec(limitsOfTest)?.[1];
  const reniceRefused = niceHard === "0" || niceHard === "1";
  try {
    for (const cgroupRoot of [undefined, false] as const) {
      const sandbox = await Sandbox.start({ mode: "bwrap", maxConcurrent: 2, runtimeDir: path.join(base, `rt-${cgroupRoot}`), nodeId: "nice", log, ...(cgroupRoot === false ? { cgroupRoot } : {}) });
      const dir = await workspace(sandbox, base);
      const outcome = await sandbox.run(bash(dir, "echo nice=$(nice); ulimit -r; renice -n -1 -p $$ >/dev/null 2>&1 && echo reniced; chrt -f 1 true 2>/dev/null && echo realtime; echo end"));
      const lines = outcome.output.toString().trim().split("\n");
      // Without a CPU cgroup (rlimits, here always) they run at nice 19, whatever this process runs at; with one the cgroup weighs them.
      const { limits, cpu } = sandbox.status();
      t.true(limits === "rlimit" ? cpu === "nice" : cpu === "cgroup" || cpu === "nice", `${limits}, cpu ${cpu}`);
      const expected = cpu === "nice" ? SANDBOX_NICENESS : os.getPriority();
      t.is(lines[0], `nice=${expected}`, `${limits}, cpu ${cpu}: ${outcome.output.toString()}`);
      t.is(lines[1], "0", "RLIMIT_RTPRIO");
      t.is(lines.includes("realtime"), false, "SCHED_FIFO refused");
      if (reniceRefused) t.is(lines.includes("reniced"), false, "renice -1 refused");
      t.is(lines.at(-1), "end");
    }
    if (!raised) t.log(`this process could not raise its RLIMIT_RTPRIO (no CAP_SYS_RESOURCE, or no prlimit): the inherited limit was its own (${realtime[1]}/${realtime[2]})`);
    if (!reniceRefused) t.log(`this process's RLIMIT_NICE (${niceHard}) lets commands renice: not asserted`);
  } finally {
    if (raised) spawnSync("prlimit", ["--pid", String(process.pid), `--rtprio=${realtime[1]}:${realtime[2]}`]);
    await rm(base, { recursive: true, force: true });
  }
});

test_("sandbox - without cgroups, a command at its process limit does not keep another sandbox of the same uid from starting or forking (the limit is the sandbox's own)", async (t) => {
  const base = await tempBase();
  try {
    const sandbox = await Sandbox.start({ mode: "bwrap", maxConcurrent: 2, runtimeDir: path.join(base, "rt"), nodeId: "nproc-own", log, cgroupRoot: false });
    const limits = { ...DEFAULT_LIMITS, processes: 20 };
    // A name no other test's processes have.
    const marker = `nproc-${Date.now()}-${Math.floor(Math.random() * 1e6)}`;
    // A: a tenant's fork bomb holding all its limit allows (perl goes on after a refused
    // fork; dash ends its script, bash retries for seconds).
    const dirA = await workspace(sandbox, base);
    const greedy = sandbox.run(bash(dirA, holdingBomb(marker, 60), { limits, timeoutMs: 40_000 }));
    // Its 20 (perl, which bash became as pid 1, and 19 children) and bwrap's own outside the namespace.
    const held = await settledCount(marker, limits.processes + 1);
    t.is(held, limits.processes + 1, "A holds its limit");
    // B: the same host uid, the same limit, while A holds all of its own.
    const other = await sandbox.run(bash(await workspace(sandbox, base), "sh -c 'for i in $(seq 8); do sleep 0.2 & done; wait; echo forked' 2>&1", { limits }));
    t.is(other.kind, "exited");
    t.is(other.output.toString(), "forked\n");
    t.is((await hostProcesses(marker)).length, held, "A held its processes while B ran");
    await writeFile(path.join(dirA, "release"), "");
    const outcome = await greedy;
    // Exactly its limit: no process of another sandbox of the uid was counted against it.
    t.is(outcome.output.toString(), `forked ${limits.processes - 1}\nheld\n`);
  } finally {
    await rm(base, { recursive: true, force: true });
  }
});

test_("sandbox - without cgroups, the node's sandboxes together stay within RUNS_SANDBOX_PROCESSES", async (t) => {
  const base = await tempBase();
  try {
    // A uid of its own (the suite runs as root): the total counts every process of the uid on the host.
    const total = 64;
    const sandbox = await Sandbox.start({ mode: "bwrap", maxConcurrent: 2, runtimeDir: path.join(base, "rt"), nodeId: "nproc-total", log, cgroupRoot: false, uid: DEFAULT_SANDBOX_UID - 3, processesTotal: total });
    const limits = { ...DEFAULT_LIMITS, processes: 48 };
    const marker = `nproc-total-${Date.now()}-${Math.floor(Math.random() * 1e6)}`;
    const dirs = [await workspace(sandbox, base), await workspace(sandbox, base)];
    const first = sandbox.run(bash(dirs[0]!, holdingBomb(marker, 30), { limits, timeoutMs: 40_000 }));
    const firstHeld = await settledCount(marker, 31);
    t.is(firstHeld, 32, "perl, its 30 children and bwrap's own");
    // The second may fork only what the total leaves, well short of its own 48.
    const second = sandbox.run(bash(dirs[1]!, holdingBomb(marker, 40), { limits, timeoutMs: 40_000 }));
    const both = await settledCount(marker, firstHeld + 3);
    t.true(both <= total, `${both} processes of the uid, the total ${total}`);
    for (const dir of dirs) await writeFile(path.join(dir, "release"), "");
    t.is((await first).output.toString(), "forked 30\nheld\n");
    const forked = Number(/forked (\d+)/.exec((await second).output.toString())?.[1]);
    t.true(forked > 0 && forked < 40 && firstHeld + forked + 2 <= total, `the second forked ${forked}`);
  } finally {
    await rm(base, { recursive: true, force: true });
  }
});

test_("sandbox - one workspace's running commands hold at most a quarter of RUNS_SANDBOX_PROCESSES together; another workspace's get their own limits (found by a probe: four commands of one tenant took the node's whole pool)", async (t) => {
  const base = await tempBase();
  try {
    // Without cgroups (the host's base is shared by every test here) and with a uid of its own.
    const total = 1024;
    const sandbox = await Sandbox.start({ mode: "bwrap", maxConcurrent: 4, runtimeDir: path.join(base, "rt"), nodeId: "tenant-share", log, cgroupRoot: false, uid: DEFAULT_SANDBOX_UID - 4, processesTotal: total });
    t.is(tenantProcessShare(total), 256);
    const limits = { ...DEFAULT_LIMITS, processes: 200 };
    const marker = `tenant-share-${Date.now()}-${Math.floor(Math.random() * 1e6)}`;
    const dirs = [await workspace(sandbox, base), await workspace(sandbox, base), await workspace(sandbox, base)];
    const first = sandbox.run(bash(dirs[0]!, holdingBomb(marker, 100), { limits, timeoutMs: 40_000, tenant: "ws_a" }));
    await settledCount(marker, 101);
    // Its workspace's first command holds 200 of the 256: the second runs with 56.
    const second = sandbox.run(bash(dirs[1]!, holdingBomb(marker, 100), { limits, timeoutMs: 40_000, tenant: "ws_a" }));
    // Another workspace's command keeps its own 200.
    const other = sandbox.run(bash(dirs[2]!, holdingBomb(`${marker}-b`, 150), { limits, timeoutMs: 40_000, tenant: "ws_b" }));
    await settledCount(`${marker}-b`, 151);
    for (const dir of dirs) await writeFile(path.join(dir, "release"), "");
    const [a1, a2, b] = [await first, await second, await other];
    t.is(a1.output.toString(), "forked 100\nheld\n");
    t.is(a1.processes, undefined, "the first ran with its own limit");
    t.is(a2.processes, 56);
    const forked = Number(/forked (\d+)/.exec(a2.output.toString())?.[1]);
    t.true(forked > 0 && forked < 56, `the second forked ${forked}`);
    t.is(b.output.toString(), "forked 150\nheld\n");
    t.is(b.processes, undefined);
    // Once they end, the workspace's share is whole again.
    const again = await sandbox.run(bash(dirs[0]!, "echo again", { limits, tenant: "ws_a" }));
    t.is(again.processes, undefined);
    // Past the share, a command still gets a few to run at all.
    const holder = sandbox.run(bash(dirs[0]!, "sleep 1", { limits: { ...DEFAULT_LIMITS, processes: 256 }, tenant: "ws_c" }));
    const squeezed = await sandbox.run(bash(dirs[1]!, "echo ran", { limits, tenant: "ws_c" }));
    t.is(squeezed.output.toString(), "ran\n");
    t.is(squeezed.processes, MIN_TENANT_COMMAND_PROCESSES);
    await holder;
  } finally {
    await rm(base, { recursive: true, force: true });
  }
});

test_.serial("sandbox - past its maximum a node answers sandbox_capacity_exceeded", async (t) => {
  const { sandbox, base } = t.context;
  const dir = await workspace(sandbox, base);
  const running = [sandbox.run(bash(dir, "sleep 2")), sandbox.run(bash(dir, "sleep 2"))];
  const error = await t.throwsAsync(sandbox.run(bash(dir, "echo three")));
  t.is((error as SandboxFailure).code, "sandbox_capacity_exceeded");
  await Promise.all(running);
  t.is((await sandbox.run(bash(dir, "echo again"))).output.toString(), "again\n");
});

test_.serial("sandbox - setsid and double-forked children are gone once the command ends", async (t) => {
  const { sandbox, base } = t.context;
  const dir = await workspace(sandbox, base);
  const marker = `${4000 + Math.floor(Math.random() * 1000)}.${Date.now() % 100000}`;
  const outcome = await sandbox.run(bash(dir, `setsid sleep ${marker} & (sleep ${marker} &) ; nohup sleep ${marker} >/dev/null & echo started`));
  t.is(outcome.output.toString(), "started\n");
  let left: number[] = [];
  for (let i = 0; i < 20; i++) {
    left = await hostProcesses(`sleep ${marker}`);
    if (left.length === 0) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  t.deepEqual(left, []);
});

test_.serial("sandbox - a cancelled command is killed with everything it started", async (t) => {
  const { sandbox, base } = t.context;
  const dir = await workspace(sandbox, base);
  const marker = `${5000 + Math.floor(Math.random() * 1000)}.${Date.now() % 100000}`;
  const controller = new AbortController();
  const started = Date.now();
  const run = sandbox.run(bash(dir, `setsid sleep ${marker} & sleep ${marker}`, { signal: controller.signal }));
  for (let i = 0; i < 100 && (await hostProcesses(`sleep ${marker}`)).length < 2; i++) await new Promise((r) => setTimeout(r, 50));
  // Both sleeps, and bwrap and bash, whose arguments name them too.
  t.true((await hostProcesses(`sleep ${marker}`)).length >= 2, "the command runs on the host before the cancel");
  controller.abort();
  const outcome = await run;
  t.is(outcome.kind, "aborted");
  t.true(Date.now() - started < 5_000);
  t.deepEqual(await hostProcesses(`sleep ${marker}`), []);
});

test_.serial("sandbox - files a command writes belong to the sandbox's unprivileged host uid", async (t) => {
  const { sandbox, base } = t.context;
  const dir = await workspace(sandbox, base);
  const outcome = await sandbox.run(bash(dir, "id -u; echo x > made.txt"));
  t.is(outcome.output.toString(), "1000\n");
  const owner = (await stat(path.join(dir, "made.txt"))).uid;
  t.not(owner, 0);
  t.is(owner, sandbox.status().uid ?? -1);
});

test_.serial("sandbox - memory, process, CPU and file-size limits are reported by name", async (t) => {
  const { sandbox, base } = t.context;
  const dir = await workspace(sandbox, base);
  const small = { ...DEFAULT_LIMITS, memoryBytes: 64 * 1024 * 1024, processes: 24, cpuSeconds: 1, diskBytes: 1024 * 1024 };
  const memory = await sandbox.run(bash(dir, "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}", { limits: small }));
  t.true(memory.limits.includes("memory"), JSON.stringify(memory.limits));
  const forks = await sandbox.run(bash(dir, "for i in $(seq 60); do sleep 2 & done; wait; echo done", { limits: small }));
  t.true(forks.limits.includes("processes"), JSON.stringify(forks.limits));
  const cpu = await sandbox.run(bash(dir, "while :; do :; done", { limits: small }));
  t.true(cpu.limits.includes("cpu"), JSON.stringify(cpu));
  // As the bash tool runs it (its output is the command's own, read for the shell's reports).
  const file = await sandbox.run(bash(dir, "head -c 3000000 /dev/zero > big; echo wrote", { limits: small, limitsFromOutput: true }));
  t.true(file.limits.includes("file_size"), JSON.stringify(file));
  t.true((await stat(path.join(dir, "big"))).size <= 1024 * 1024);
});

test_.serial("sandbox - a running command is measured about once a second: a limit its watch names stops it (SIGKILL, that limit reported, not the CPU limit's kill); a command that ends first is not measured", async (t) => {
  const { sandbox, base } = t.context;
  const dir = await workspace(sandbox, base);
  let measured = 0;
  const watch = async (_signal: AbortSignal) => {
    measured++;
    return (await readdir(dir)).includes("over") ? ("disk" as const) : undefined;
  };
  const started = Date.now();
  const stopped = await sandbox.run(bash(dir, "sleep 1.5; touch over; sleep 30; echo never", { watch, limits: { ...DEFAULT_LIMITS, cpuSeconds: 1 } }));
  t.is(stopped.kind, "signalled", JSON.stringify(stopped));
  t.deepEqual(stopped.limits, ["disk"]);
  t.true(Date.now() - started < 10_000, `${Date.now() - started} ms`);
  t.true(measured >= 2, `${measured}`);
  measured = 0;
  const quick = await sandbox.run(bash(dir, "echo quick", { watch }));
  t.is(quick.kind, "exited");
  t.is(quick.output.toString(), "quick\n");
  t.deepEqual(quick.limits, []);
  const atEnd = measured;
  t.true(atEnd <= 1, `${atEnd}: a command of a few ms is measured only if its start took a second`);
  await new Promise((resolve) => setTimeout(resolve, 1_500));
  t.is(measured, atEnd, "not after it ended");
});

test_.serial("sandbox - a node measures its running commands one at a time, each measure followed by a pause four times as long: 30 commands at once never overlap, take at most a fifth of the time, and each is measured", async (t) => {
  const base = await tempBase();
  const many = await Sandbox.start({ mode: "bwrap", maxConcurrent: 32, runtimeDir: path.join(base, "rt"), nodeId: "measures-test", log });
  try {
    const dirs = await Promise.all(Array.from({ length: 30 }, () => workspace(many, base)));
    const spans: { dir: string; from: number; to: number }[] = [];
    let inside = 0;
    let most = 0;
    // A measure that takes 40 ms, as du of a mid-sized workspace does.
    const watchOf = (dir: string) => async (_signal: AbortSignal) => {
      const from = performance.now();
      most = Math.max(most, ++inside);
      await new Promise((resolve) => setTimeout(resolve, 40));
      inside--;
      spans.push({ dir, from, to: performance.now() });
      return undefined;
    };
    const started = performance.now();
    const outcomes = await Promise.all(dirs.map((dir) => many.run(bash(dir, "sleep 5; echo done", { watch: watchOf(dir) }))));
    const elapsed = performance.now() - started;
    t.true(outcomes.every((o) => o.kind === "exited" && o.exitCode === 0), JSON.stringify(outcomes.find((o) => o.kind !== "exited")));
    t.is(most, 1, "one measure at a time");
    const busy = spans.reduce((sum, s) => sum + (s.to - s.from), 0);
    t.true(busy <= elapsed / 5 + 250, `measuring took ${Math.round(busy)} of ${Math.round(elapsed)} ms`);
    // Every second each, they would be ~120 measures; a fifth of 5 s at 40 ms each is ~25.
    t.true(spans.length <= 30, `${spans.length} measures`);
    const measuredDirs = new Set(spans.map((s) => s.dir));
    t.true(measuredDirs.size >= 15, `${measuredDirs.size} of 30 commands measured in 5 s: in turn, not the same few`);
  } finally {
    await rm(base, { recursive: true, force: true });
  }
});

test_.serial("sandbox - a workspace slow to measure (a very large tree) is stopped in the quick turn and measured in a turn of its own, with longer pauses: the other commands' measures go on at their pace meanwhile", async (t) => {
  const base = await tempBase();
  const node = await Sandbox.start({ mode: "bwrap", maxConcurrent: 8, runtimeDir: path.join(base, "rt"), nodeId: "slow-measure-test", log });
  try {
    const slowDir = await workspace(node, base);
    const quickDirs = await Promise.all(Array.from({ length: 5 }, () => workspace(node, base)));
    const spans: { dir: string; from: number; to: number; stopped: boolean }[] = [];
    let quickInside = 0;
    let quickMost = 0;
    // du of a very large tree takes 600 ms here, of the others 20 ms; stopped as du is.
    const watchOf = (dir: string) => async (signal: AbortSignal) => {
      const from = performance.now();
      if (dir !== slowDir) quickMost = Math.max(quickMost, ++quickInside);
      const stopped = await sleep(dir === slowDir ? 600 : 20, false, { signal }).catch(() => true);
      if (dir !== slowDir) quickInside--;
      spans.push({ dir, from, to: performance.now(), stopped });
      return undefined;
    };
    // A first command finds the large workspace slow to measure: its measure in the quick
    // turn is stopped at the line, the turn held no longer.
    t.is((await node.run(bash(slowDir, "sleep 1.8", { watch: watchOf(slowDir) }))).kind, "exited");
    t.is(spans.length, 1);
    t.true(spans[0]!.stopped && spans[0]!.to - spans[0]!.from < 500, JSON.stringify(spans[0]));
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    spans.length = 0;
    const outcomes = await Promise.all([slowDir, ...quickDirs].map((dir) => node.run(bash(dir, "sleep 7; echo done", { watch: watchOf(dir) }))));
    t.true(outcomes.every((o) => o.kind === "exited" && o.exitCode === 0), JSON.stringify(outcomes.find((o) => o.kind !== "exited")));
    const counts = quickDirs.map((dir) => spans.filter((s) => s.dir === dir).length);
    t.true(counts.every((n) => n >= 4), `each of the others measured about once a second: ${counts.join(", ")} times in 7 s`);
    t.is(quickMost, 1, "the quick turn measures one at a time");
    // The slow one: measured whole in its own turn (not stopped at the quick turn's line),
    // then a pause of nine times its 600 ms (a later measure may be stopped by its command's end).
    const slow = spans.filter((s) => s.dir === slowDir);
    t.true(slow.length >= 1 && !slow[0]!.stopped && slow[0]!.to - slow[0]!.from >= 590, JSON.stringify(slow));
    if (slow[1]) t.true(slow[1].from - slow[0]!.to >= 5_000, `its next measure ${Math.round(slow[1].from - slow[0]!.to)} ms after`);
    t.true(slow.length <= 2, JSON.stringify(slow));
  } finally {
    await rm(base, { recursive: true, force: true });
  }
});

test_.serial("sandbox - the node's free disk is checked while a command runs only where it keeps a reserve", async (t) => {
  const base = await tempBase();
  const kept = await Sandbox.start({ mode: "bwrap", maxConcurrent: 2, runtimeDir: path.join(base, "rt"), nodeId: "reserve-kept", log, diskReserveBytes: 1 });
  try {
    for (const [sandbox, checks] of [[t.context.sandbox, false], [kept, true]] as const) {
      const dir = await workspace(sandbox, base);
      let calls = 0;
      const real = sandbox.hostDiskLow.bind(sandbox);
      sandbox.hostDiskLow = async (d: string) => {
        calls++;
        return real(d);
      };
      try {
        const outcome = await sandbox.run(bash(dir, "sleep 2.5; echo done"));
        t.is(outcome.kind, "exited");
        if (checks) t.true(calls >= 1, `${calls}`);
        else t.is(calls, 0);
      } finally {
        sandbox.hostDiskLow = real;
      }
      // What a restore may take: within what is free above the reserve (no reserve: anything).
      t.true(await sandbox.roomFor(dir, 1024 * 1024));
      t.is(await sandbox.roomFor(dir, 2 ** 60), !checks, "more than any disk has free");
    }
  } finally {
    await rm(base, { recursive: true, force: true });
  }
});

test_.serial("sandbox - through the tools, a running command is stopped for disk_mb only while it makes the workspace grow: one that cleans up a workspace over its limit runs to its end", async (t) => {
  const { sandbox, base } = t.context;
  const dir = await workspace(sandbox, base);
  const limits = { ...DEFAULT_LIMITS, diskBytes: 2 * 1024 * 1024 };
  const tools = Object.fromEntries(createWorkspaceTools(dir, BUILTIN_TOOLS, { sandbox, limits }).map((tool) => [tool.name, tool]));
  const text = (result: { content: { type: string; text?: string }[] }) => result.content.map((c) => c.text ?? "").join("");
  // 6 MB in six files, each under the 2 MiB file size limit: over, told after the command.
  const over = await tools.bash!.execute("a", { command: "for i in 1 2 3 4 5 6; do head -c 1000000 /dev/zero > f$i; done; echo wrote" });
  t.regex(text(over), /^\[sandbox: the workspace is over its disk limit \(2 MiB\)[^\n]*\]\nwrote\n$/);
  // Measured several times while still over its limit (and over what the measure after the
  // last command counted, which stops just past the limit), never stopped: it only shrinks it.
  const cleaned = await tools.bash!.execute("b", { command: "for i in 1 2 3 4 5 6; do rm f$i; sleep 0.6; done; echo cleaned" });
  t.is(text(cleaned), "cleaned\n");
  const grown = await t.throwsAsync(tools.bash!.execute("c", { command: "for i in 1 2 3; do head -c 1000000 /dev/zero > g$i; done; sleep 20; echo never" }));
  t.regex(grown?.message ?? "", /^Command was terminated by signal SIGKILL\n\[sandbox: the workspace is over its disk limit \(2 MiB\)/);
});

test_.serial("sandbox - through the tools, a workspace an earlier turn left over its disk limit refuses the next turn's first write, before any command has run", async (t) => {
  const { sandbox, base } = t.context;
  const dir = await workspace(sandbox, base);
  const limits = { ...DEFAULT_LIMITS, diskBytes: 2 * 1024 * 1024 };
  // A turn's tools: each turn makes its own.
  const turnTools = () => Object.fromEntries(createWorkspaceTools(dir, BUILTIN_TOOLS, { sandbox, limits }).map((tool) => [tool.name, tool]));
  const text = (result: { content: { type: string; text?: string }[] }) => result.content.map((c) => c.text ?? "").join("");
  const over = await turnTools().bash!.execute("a", { command: "for i in 1 2 3; do head -c 1000000 /dev/zero > f$i; done; echo wrote" });
  t.regex(text(over), /^\[sandbox: the workspace is over its disk limit \(2 MiB\)/);

  for (const tool of ["write", "edit"] as const) {
    const next = turnTools();
    const args = tool === "write" ? { path: "more.txt", content: "more" } : { path: "f1", old_text: "x", new_text: "y" };
    const refused = await t.throwsAsync(next[tool]!.execute("w", args));
    t.regex(refused?.message ?? "", /^Not written: the workspace is over its disk limit \(2 MiB\)/, tool);
  }
  t.false(existsSync(path.join(dir, "more.txt")));

  // Under its limits again: the next turn's first write is written.
  await Promise.all(["f1", "f2", "f3"].map((name) => rm(path.join(dir, name))));
  await turnTools().write!.execute("w", { path: "more.txt", content: "more" });
  t.is(await readFile(path.join(dir, "more.txt"), "utf8"), "more");
});

test_.serial("sandbox - below RUNS_DISK_RESERVE_MB free on the workspaces' filesystem a running command is stopped (host_disk) and the node says so in its log; with no reserve nothing is", async (t) => {
  const base = await tempBase();
  const lines: string[] = [];
  const logged = pino({ level: "info" }, { write: (line: string) => void lines.push(line) });
  // More than any disk has free: the node is always short.
  const short = await Sandbox.start({ mode: "bwrap", maxConcurrent: 2, runtimeDir: path.join(base, "rt"), nodeId: "reserve-test", log: logged, diskReserveBytes: 2 ** 52 });
  try {
    const dir = await workspace(short, base);
    t.true(await short.hostDiskLow(dir));
    const started = Date.now();
    const outcome = await short.run(bash(dir, "sleep 30; echo never"));
    t.is(outcome.kind, "signalled", JSON.stringify(outcome));
    t.deepEqual(outcome.limits, ["host_disk"]);
    t.true(Date.now() - started < 10_000, `${Date.now() - started} ms`);
    t.is(lines.filter((line) => line.includes("less free than RUNS_DISK_RESERVE_MB keeps")).length, 1, "said once, when it became short");
    t.false(lines.some((line) => line.includes("has room again")), lines.join(""));
    t.true(lines.some((line) => line.includes("a running command was stopped at a limit") && line.includes('"hit":"host_disk"')), lines.join(""));
    // Through the tools: no command starts while the node is short, and writes refuse.
    const tools = Object.fromEntries(createWorkspaceTools(dir, BUILTIN_TOOLS, { sandbox: short }).map((tool) => [tool.name, tool]));
    const notRun = await t.throwsAsync(tools.bash!.execute("a", { command: "echo ran > ran.txt" }));
    t.is(notRun?.message, "Not run: the node's disk is almost full: running commands are stopped and writes refuse until there is room again.");
    t.false(existsSync(path.join(dir, "ran.txt")));
    // A command that began with room and ended before the next check is told after it.
    const real = short.hostDiskLow.bind(short);
    let asked = 0;
    short.hostDiskLow = async (d: string) => (asked++ === 0 ? false : real(d));
    try {
      const said = await tools.bash!.execute("b", { command: "echo hi" });
      t.is(said.content.map((c: any) => c.text).join(""), "[sandbox: the node's disk is almost full: running commands are stopped and writes refuse until there is room again]\nhi\n");
    } finally {
      short.hostDiskLow = real;
    }
    const refused = await t.throwsAsync(tools.write!.execute("w", { path: "more.txt", content: "more" }));
    t.is(refused?.message, "Not written: the node's disk is almost full: running commands are stopped and writes refuse until there is room again.");
    t.false(existsSync(path.join(dir, "more.txt")));
    t.false(await t.context.sandbox.hostDiskLow(dir), "no reserve: never short");
  } finally {
    await rm(base, { recursive: true, force: true });
  }
});

test_.serial("sandbox - with an allow list, commands reach an allowed host through the egress proxy and nothing else", async (t) => {
  const base = await tempBase();
  let hits = 0;
  const server = http.createServer((req, res) => {
    hits++;
    res.end(`served ${req.url}`);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  try {
    const sandbox = await Sandbox.start({
      mode: "bwrap",
      maxConcurrent: 4,
      runtimeDir: path.join(base, "rt"),
      nodeId: "egress",
      log,
      egress: new EgressProxy({ log, testHosts: new Map([["allowed.test", { host: "127.0.0.1", port }]]) }),
    });
    t.true(sandbox.status().egress, "socat is installed here (bootstrap installs it)");
    const dir = await workspace(sandbox, base);
    const denials: EgressDenial[] = [];
    const allowed = await sandbox.run(
      bash(dir, `curl -sS --max-time 10 http://allowed.test:${port}/through`, { networkAllow: ["allowed.test"], onNetworkDenied: (d) => denials.push(d) }),
    );
    t.is(allowed.output.toString(), "served /through");
    // The socket's folder is the service's (host root shows as the overflow uid inside, the sandbox's own uid as 1000): no sandbox-uid process can replace the socket.
    if (process.getuid?.() === 0) {
      const folder = await sandbox.run(bash(dir, "stat -c '%u %a' /run/runs", { networkAllow: ["allowed.test"] }));
      t.is(folder.output.toString().trim(), "65534 711");
    }
    const refused = await sandbox.run(
      bash(dir, `curl -sS --max-time 10 http://other.test/x; echo " exit=$?"`, { networkAllow: ["allowed.test"], onNetworkDenied: (d) => denials.push(d) }),
    );
    t.regex(refused.output.toString(), /network policy denied other\.test:80 \(not in the deployment's allow list\)/);
    t.deepEqual(denials, [{ host: "other.test", port: 80, reason: "not in the deployment's allow list" }]);
    // Around the proxy there is no way out: the host's loopback is not the sandbox's.
    const direct = await sandbox.run(bash(dir, `curl -sS --noproxy '*' --max-time 5 http://127.0.0.1:${port}/direct; echo " exit=$?"`, { networkAllow: ["allowed.test"] }));
    t.regex(direct.output.toString(), /exit=7/);
    // Without an allow list there is no proxy either.
    const none = await sandbox.run(bash(dir, `curl -sS --max-time 5 http://127.0.0.1:${port}/none; echo " exit=$?"`));
    t.regex(none.output.toString(), /exit=7/);
    t.is(hits, 1);
  } finally {
    server.close();
    await rm(base, { recursive: true, force: true });
  }
});
