/**
 * The sandbox's host-side pieces with the real shell and the cgroup file layout: the
 * launcher's and the process limit's wrapper's own failures, and the limits written when
 * a node finds its cgroups (against a cgroup tree laid out in a temporary folder, since
 * the host's base is shared by every test and node here).
 */
import test from "ava";
import { spawnSync } from "node:child_process";
import { spawn } from "node:child_process";
import { existsSync, readFileSync, rmdirSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import pino from "pino";
import { detectCgroups } from "../../actors/sandbox-cgroups.js";
import { launcherArgs, nprocFlagOf, OOM_SCORE_ADJ_MAX, setupFailed, withProcessLimit } from "../../actors/sandbox-host.js";
import { DEFAULT_LIMITS } from "../../actors/sandbox-limits.js";
import { collectedLogs } from "../helpers/servers.js";

test("sandbox - the launcher's and the process limit's wrapper's own failures are told from the command's (the shell's words silenced, theirs first)", (t) => {
  const flag = nprocFlagOf("/bin/sh");
  if (!flag) return t.fail("/bin/sh sets no process limit here");
  const run = (args: string[]) => spawnSync("/bin/sh", args, { encoding: "buffer", timeout: 10_000 });
  // A cgroup file the launcher cannot write.
  const cgroup = run(launcherArgs(["/nonexistent/cgroup.procs"], [], ["/bin/true"]));
  t.is(cgroup.status, 125);
  t.is(cgroup.stderr.toString(), "runs-sandbox: cannot join cgroup /nonexistent/cgroup.procs\n");
  t.true(setupFailed(cgroup.status!, cgroup.stderr));
  // The command it becomes is the host OOM killer's first choice (found by a probe: none was).
  const scored = run(launcherArgs([], [], ["/bin/cat", "/proc/self/oom_score_adj"]));
  t.is(scored.status, 0);
  t.is(scored.stdout.toString(), `${OOM_SCORE_ADJ_MAX}\n`);
  t.is(scored.stderr.toString(), "");
  // A limit the launcher cannot set.
  const limit = run(launcherArgs([], [[flag, -5]], ["/bin/true"]));
  t.is(limit.status, 125);
  t.true(setupFailed(limit.status!, limit.stderr), limit.stderr.toString());
  // The wrapper inside the sandbox, the same way.
  const [, ...wrapped] = withProcessLimit(flag, -5, ["/bin/true"]);
  const inside = run(wrapped);
  t.is(inside.status, 125);
  t.is(inside.stderr.toString(), `runs-sandbox: cannot set limit ${flag} -5\n`);
  t.true(setupFailed(inside.status!, inside.stderr));
  // Set, the limit holds for the command it becomes (soft and hard), whose exit code passes through.
  const [, ...ok] = withProcessLimit(flag, 77, ["/bin/sh", "-c", `ulimit -S ${flag}; ulimit -H ${flag}; exit 3`]);
  const held = run(ok);
  t.is(held.status, 3);
  t.is(held.stdout.toString(), "77\n77\n");
  t.is(held.stderr.toString(), "");
});

test("sandbox-cgroups - cgroup v2: the base of the node's command cgroups gets pids.max = RUNS_SANDBOX_PROCESSES", async (t) => {
  const root = await mkdtemp(path.join(os.tmpdir(), "runs-cgroup-v2-"));
  try {
    await mkdir(path.join(root, "system.slice", "runs.service"), { recursive: true });
    await writeFile(path.join(root, "cgroup.controllers"), "cpuset cpu io memory pids\n");
    await writeFile(path.join(root, "system.slice", "runs.service", "cgroup.controllers"), "cpu memory pids\n");
    const cgroups = await detectCgroups({ root, processesTotal: 777, memoryTotalBytes: 2 ** 30, selfCgroup: "0::/system.slice/runs.service\n" });
    t.is(cgroups?.mechanism, "cgroup-v2");
    t.true(cgroups?.weighsCpu, "the cpu controller weighs the commands: they are not niced");
    t.is(await readFile(path.join(root, "system.slice", "runs.service", "runs-sandboxes", "pids.max"), "utf8"), "777");
    t.is(await readFile(path.join(root, "system.slice", "runs.service", "runs-sandboxes", "memory.max"), "utf8"), String(2 ** 30));
    // The node left its cgroup for a leaf beside its commands' base.
    t.is(await readFile(path.join(root, "system.slice", "runs.service", "runs-service", "cgroup.procs"), "utf8"), String(process.pid));
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test("sandbox-cgroups - cgroup v2: a command the OOM killer ended is told apart: at its own limit (an allocation failed there: its \"oom\" count), or at all sandboxes' (counted at the base)", async (t) => {
  const root = await mkdtemp(path.join(os.tmpdir(), "runs-cgroup-v2-"));
  try {
    const own = path.join(root, "system.slice", "runs.service");
    await mkdir(own, { recursive: true });
    await writeFile(path.join(root, "cgroup.controllers"), "cpuset cpu io memory pids\n");
    await writeFile(path.join(own, "cgroup.controllers"), "cpu memory pids\n");
    const cgroups = (await detectCgroups({ root, processesTotal: 777, memoryTotalBytes: 2 ** 30, selfCgroup: "0::/system.slice/runs.service\n" }))!;
    const limits = { ...DEFAULT_LIMITS, memoryBytes: 64 * 2 ** 20 };
    // What the kernel would have written in the command's cgroup by the time it is released.
    const reported = async (name: string, events: string) => {
      const command = await cgroups.create(name, limits, undefined);
      await writeFile(path.join(own, "runs-sandboxes", name, "memory.events"), events);
      await writeFile(path.join(own, "runs-sandboxes", name, "memory.peak"), String(limits.memoryBytes));
      return command.release();
    };
    // Its page cache filled its own limit earlier ("max" counted, peak at the limit): the base's kill is still the base's (found by a second review).
    t.like(await reported("cmd-a", "low 0\nhigh 0\nmax 12\noom 0\noom_kill 1\n"), { oomKilled: true, sharedMemoryHit: true });
    t.like(await reported("cmd-b", "max 40\noom 1\noom_kill 1\n"), { oomKilled: true, sharedMemoryHit: false });
    t.like(await reported("cmd-c", "max 0\noom 0\noom_kill 1\n"), { oomKilled: true, sharedMemoryHit: true });
    t.like(await reported("cmd-d", "max 3\noom 2\noom_kill 0\n"), { oomKilled: false, sharedMemoryHit: false });
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test("sandbox-cgroups - cgroup v2 delegated without cpu: the cgroups are used for memory and processes, and the commands are niced instead", async (t) => {
  const root = await mkdtemp(path.join(os.tmpdir(), "runs-cgroup-v2-"));
  try {
    const own = path.join(root, "system.slice", "runs.service");
    await mkdir(own, { recursive: true });
    await writeFile(path.join(root, "cgroup.controllers"), "cpuset cpu io memory pids\n");
    // systemd Delegate=memory pids: the node's own cgroup was given no cpu.
    await writeFile(path.join(own, "cgroup.controllers"), "memory pids\n");
    const cgroups = await detectCgroups({ root, processesTotal: 777, memoryTotalBytes: 2 ** 30, selfCgroup: "0::/system.slice/runs.service\n" });
    t.is(cgroups?.mechanism, "cgroup-v2");
    t.false(cgroups?.weighsCpu);
    t.is(await readFile(path.join(own, "cgroup.subtree_control"), "utf8"), "+memory +pids", "cpu is not asked of a cgroup that was not given it");
    // A node whose cgroup is not where /proc/self/cgroup says (no cgroup.controllers there) does not make one.
    t.is(await detectCgroups({ root, processesTotal: 777, memoryTotalBytes: 2 ** 30, selfCgroup: "0::/elsewhere/runs.service\n" }), undefined);
    t.false(existsSync(path.join(root, "elsewhere")));
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test("sandbox-cgroups - cgroup v1: the pids base gets pids.max = RUNS_SANDBOX_PROCESSES; a base that refuses it is said in a warning, and the cgroups are used all the same", async (t) => {
  const root = await mkdtemp(path.join(os.tmpdir(), "runs-cgroup-v1-"));
  const { logs, log } = collectedLogs();
  const own = "/runs.service";
  const selfCgroup = `5:pids:${own}\n4:memory:${own}\n1:cpu,cpuacct:${own}\n0::${own}\n`;
  try {
    for (const c of ["pids", "memory", "cpu"]) await mkdir(path.join(root, c), { recursive: true });
    const v1 = await detectCgroups({ root, processesTotal: 5_000, memoryTotalBytes: 2 ** 30, log, selfCgroup });
    t.is(v1?.mechanism, "cgroup-v1");
    t.true(v1?.weighsCpu, "a writable cpu hierarchy weighs the commands");
    // A path holding ':' is the node's whole path, not cut at it.
    const colon = "/runs:blue.service";
    await detectCgroups({ root, processesTotal: 4_000, memoryTotalBytes: 2 ** 30, log, selfCgroup: `5:pids:${colon}\n4:memory:${colon}\n0::${colon}\n` });
    t.is(await readFile(path.join(root, "pids", colon, "runs-sandboxes", "pids.max"), "utf8"), "4000");
    t.is(await readFile(path.join(root, "pids", own, "runs-sandboxes", "pids.max"), "utf8"), "5000");
    t.is(await readFile(path.join(root, "memory", own, "runs-sandboxes", "memory.limit_in_bytes"), "utf8"), String(2 ** 30));
    t.deepEqual(logs.filter((entry) => Number(entry.level) >= 40), []);
    // A hierarchy that did not count children against their parent is made to (older kernels could be told not to).
    await writeFile(path.join(root, "memory", own, "runs-sandboxes", "memory.use_hierarchy"), "0\n");
    await detectCgroups({ root, processesTotal: 5_000, memoryTotalBytes: 2 ** 30, log, selfCgroup });
    t.is(await readFile(path.join(root, "memory", own, "runs-sandboxes", "memory.use_hierarchy"), "utf8"), "1");
    t.deepEqual(logs.filter((entry) => Number(entry.level) >= 40), []);
    // A pids.max that cannot be written (a folder here; a kernel refusing the value there).
    await rm(path.join(root, "pids", own, "runs-sandboxes", "pids.max"));
    await mkdir(path.join(root, "pids", own, "runs-sandboxes", "pids.max"));
    const refused = await detectCgroups({ root, processesTotal: 5_000, memoryTotalBytes: 2 ** 30, log, selfCgroup });
    t.is(refused?.mechanism, "cgroup-v1");
    t.true(logs.some((entry) => entry.level === 40 && /could not limit the processes of all sandboxes together/.test(String(entry.msg))), JSON.stringify(logs));
    // The same for the memory limit of them all.
    await rm(path.join(root, "memory", own, "runs-sandboxes", "memory.limit_in_bytes"));
    await mkdir(path.join(root, "memory", own, "runs-sandboxes", "memory.limit_in_bytes"));
    t.is((await detectCgroups({ root, processesTotal: 5_000, memoryTotalBytes: 2 ** 30, log, selfCgroup }))?.mechanism, "cgroup-v1");
    t.true(logs.some((entry) => entry.level === 40 && /could not limit the memory of all sandboxes together \(RUNS_SANDBOX_MEMORY_MB\)/.test(String(entry.msg))), JSON.stringify(logs));
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test("sandbox-cgroups - on this host's kernel: past RUNS_SANDBOX_MEMORY_MB the kernel ends a command within the sandboxes, whatever its own memory_mb (found by a probe: no total bound)", async (t) => {
  // Under a base of this test's own (the host's is shared by every test and node here):
  // the node's cgroup as /proc/self/cgroup says, one folder further down.
  const suffix = `runs-test-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
  const self = readFileSync("/proc/self/cgroup", "utf8").replace(/^(\d+:[^:\n]*:)(.*)$/gm, (_, head: string, p: string) => `${head}${path.posix.join(p, suffix)}`);
  const cgroups = process.getuid?.() === 0 ? await detectCgroups({ processesTotal: 1_000, memoryTotalBytes: 64 * 2 ** 20, selfCgroup: self }) : undefined;
  if (!cgroups || cgroups.mechanism !== "cgroup-v1") {
    // v2 would move this process into a leaf of its own: only the temporary-tree tests above there.
    return t.pass(`no writable cgroup v1 hierarchies here (${cgroups?.mechanism ?? "none"}): the written limits are tested above`);
  }
  const made = ["memory", "pids", "cpu,cpuacct", "cpu"].flatMap((c) => {
    const own = self.match(new RegExp(`^\\d+:(?:[^:\\n]*,)?${c.split(",")[0]}(?:,[^:\\n]*)?:(.*)$`, "m"))?.[1];
    return own && existsSync(path.join("/sys/fs/cgroup", c, own)) ? [path.join("/sys/fs/cgroup", c, own)] : [];
  });
  try {
    const base = made.find((dir) => dir.includes("/memory/"))!;
    t.is(readFileSync(path.join(base, "runs-sandboxes", "memory.limit_in_bytes"), "utf8").trim(), String(64 * 2 ** 20));
    const command = await cgroups.create(`cmd-test-${suffix}`, { ...DEFAULT_LIMITS, memoryBytes: 512 * 2 ** 20 }, undefined);
    // 200 MiB touched, under the command's 512 MiB, over all sandboxes' 64 MiB.
    const child = spawn("/bin/sh", ["-c", 'for f in "$@"; do echo $$ > "$f"; done; exec python3 -c "b = bytes([1]) * (200 << 20); print(\'held\', len(b))"', "sh", ...command.procsFiles], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    const ended = await new Promise<{ code: number | null; signal: string | null }>((resolve) => {
      const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
      child.once("exit", (code, signal) => {
        clearTimeout(timer);
        resolve({ code, signal });
      });
    });
    const report = await command.release();
    t.is(ended.signal, "SIGKILL", JSON.stringify({ ended, out }));
    t.false(out.includes("held"), out);
    t.true(report.oomKilled, JSON.stringify(report));
    t.true(report.sharedMemoryHit, "told apart from the command's own limit");
    // At its own limit, under the base's, a command's kill is its own.
    const small = await cgroups.create(`cmd-test-own-${suffix}`, { ...DEFAULT_LIMITS, memoryBytes: 16 * 2 ** 20 }, undefined);
    const own = spawnSync("/bin/sh", ["-c", 'for f in "$@"; do echo $$ > "$f"; done; exec python3 -c "b = bytes([1]) * (48 << 20); print(\'held\')"', "sh", ...small.procsFiles], { encoding: "utf8", timeout: 30_000 });
    const ownReport = await small.release();
    t.is(own.signal, "SIGKILL", JSON.stringify(own));
    t.true(ownReport.oomKilled, JSON.stringify(ownReport));
    t.false(ownReport.sharedMemoryHit, JSON.stringify(ownReport));
  } finally {
    for (const dir of made) {
      for (const leaf of [path.join(dir, "runs-sandboxes"), dir]) {
        try {
          rmdirSync(leaf);
        } catch {
          // gone already
        }
      }
    }
  }
});
