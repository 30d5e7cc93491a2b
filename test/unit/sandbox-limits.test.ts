import test from "ava";
import { DEFAULT_LIMITS, describeLimit, formatBytes, limitsOf, type LimitHit } from "../../actors/sandbox-limits.js";
import { counter } from "../../actors/sandbox-cgroups.js";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { setupFailed } from "../../actors/sandbox.js";
import { hardProcessLimit, launcherArgs, nprocFlagOf, withProcessLimit } from "../../actors/sandbox-host.js";

test("sandbox-limits - defaults apply to every limit a deployment leaves out", (t) => {
  t.deepEqual(limitsOf({}), DEFAULT_LIMITS);
  t.deepEqual(limitsOf({ limits: { command_timeout_s: 5 } }), DEFAULT_LIMITS);
  const custom = limitsOf({ limits: { memory_mb: 64, processes: 16, cpu_s: 3, disk_mb: 2, output_kb: 8, tmp_mb: 1 } });
  t.deepEqual(custom, {
    memoryBytes: 64 * 1024 * 1024,
    processes: 16,
    cpuSeconds: 3,
    diskBytes: 2 * 1024 * 1024,
    outputBytes: 8 * 1024,
    tmpBytes: 1024 * 1024,
  });
});

test("sandbox-limits - every limit hit names the limit and its value", (t) => {
  const limits = limitsOf({ limits: { memory_mb: 64, processes: 16, cpu_s: 3, disk_mb: 2, output_kb: 8 } });
  const expected: Record<LimitHit, RegExp> = {
    memory: /memory limit \(64 MiB\)/,
    processes: /process limit \(16\)/,
    cpu: /CPU time limit \(3 s per process\)/,
    file_size: /file size limit \(2 MiB\)/,
    disk: /disk limit \(2 MiB\)/,
    output: /last 8 KiB/,
  };
  for (const [hit, pattern] of Object.entries(expected)) t.regex(describeLimit(hit as LimitHit, limits), pattern, hit);
});

test("sandbox-limits - formatBytes picks the largest exact unit", (t) => {
  t.is(formatBytes(512 * 1024 * 1024), "512 MiB");
  t.is(formatBytes(64 * 1024), "64 KiB");
  t.is(formatBytes(1500), "1500 bytes");
  t.is(formatBytes(1024 * 1024 + 1024), "1025 KiB");
});

test("sandbox-cgroups - counter reads a key of a cgroup key-value file", (t) => {
  const oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
  t.is(counter(oom, "oom_kill"), 2);
  t.is(counter(oom, "under_oom"), 0);
  t.is(counter("max 7\n", "max"), 7);
  t.is(counter("", "max"), 0);
  t.is(counter("low 1\nhigh 0\nmax 3\noom 1\noom_kill 1\n", "oom_kill"), 1);
});

test("sandbox - only bwrap's, the launcher's and the limit wrapper's own failures count as a failed start", (t) => {
  const err = (text: string) => Buffer.from(text);
  t.true(setupFailed(1, err("bwrap: Can't mount proc on /newroot/proc: Operation not permitted\n")));
  t.true(setupFailed(125, err("runs-sandbox: cannot join cgroup /x\n")));
  // A command's own failures: other exit codes, or stderr that is not bwrap's.
  t.false(setupFailed(1, err("")));
  t.false(setupFailed(2, err("bwrap: looks like bwrap\n")));
  t.false(setupFailed(125, err("bwrap: wrong code\n")));
  t.false(setupFailed(1, err("cat: bwrap: No such file\n")));
  t.false(setupFailed(0, err("bwrap: exit 0 is a success\n")));
});

test("sandbox - the launcher's and the process limit's wrapper's own failures are told from the command's (the shell's words silenced, theirs first)", (t) => {
  const flag = nprocFlagOf("/bin/sh");
  if (!flag) return t.fail("/bin/sh sets no process limit here");
  const run = (args: string[]) => spawnSync("/bin/sh", args, { encoding: "buffer", timeout: 10_000 });
  // A cgroup file the launcher cannot write.
  const cgroup = run(launcherArgs(["/nonexistent/cgroup.procs"], [], ["/bin/true"]));
  t.is(cgroup.status, 125);
  t.is(cgroup.stderr.toString(), "runs-sandbox: cannot join cgroup /nonexistent/cgroup.procs\n");
  t.true(setupFailed(cgroup.status!, cgroup.stderr));
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

test("sandbox - the node's hard process limit is read from /proc/self/limits", (t) => {
  const limits = (soft: string, hard: string) =>
    `Limit                     Soft Limit           Hard Limit           Units     \nMax cpu time              unlimited            unlimited            seconds   \nMax processes             ${soft}  ${hard}  processes \nMax open files            1024                 524288               files     \n`;
  t.is(hardProcessLimit(limits("96364", "96364")), 96364);
  t.is(hardProcessLimit(limits("4096", "8192")), 8192);
  t.is(hardProcessLimit(limits("unlimited", "unlimited")), Infinity);
  t.is(hardProcessLimit(""), Infinity);
  t.true(Number.isFinite(hardProcessLimit(readFileSync("/proc/self/limits", "utf8"))) || /Max processes\s+\S+\s+unlimited/.test(readFileSync("/proc/self/limits", "utf8")));
});
