import test from "ava";
import { DEFAULT_LIMITS, describeLimit, diskShort, formatBytes, limitsOf, type LimitHit, maxEntries } from "../../actors/sandbox-limits.js";
import { counter } from "../../actors/sandbox-cgroups.js";
import { inRootCpuCgroup, setupFailed } from "../../actors/sandbox.js";
import { shellReported, NODE_PROCESS_RESERVE, rlimitHits, rlimitOf, rlimitProcessesTotal, SCANNED_OUTPUT_BYTES } from "../../actors/sandbox-host.js";

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
  const limits = limitsOf({ limits: { memory_mb: 64, processes: 16, cpu_s: 3, disk_mb: 2, output_kb: 8, tmp_mb: 4 } });
  const expected: Record<LimitHit, RegExp> = {
    memory: /memory limit \(64 MiB\)/,
    processes: /process limit \(16\)/,
    cpu: /CPU time limit \(3 s per process\)/,
    file_size: /file size limit \(2 MiB\)/,
    tmp: /SIGBUS.*\/tmp and \/dev\/shm hold 4 MiB each/,
    disk: /disk limit \(2 MiB\)/,
    files: /more than 512 files and folders \(one per 4 KiB of its disk limit, at most 1000000\)/,
    host_disk: /the node's disk is almost full: running commands are stopped and writes refuse until there is room again/,
    host_memory: /the memory all commands on this node share was used up: the command was killed/,
    output: /last 8 KiB/,
  };
  for (const [hit, pattern] of Object.entries(expected)) t.regex(describeLimit(hit as LimitHit, limits), pattern, hit);
});

test("sandbox-limits - a workspace's files and folders: one per 4 KiB of disk_mb, at least one, at most a million whatever disk_mb a deployment names", (t) => {
  t.is(maxEntries(limitsOf({})), 262_144);
  t.is(maxEntries(limitsOf({ limits: { disk_mb: 1 } })), 256);
  t.is(maxEntries({ diskBytes: 100 }), 1);
  t.is(maxEntries(limitsOf({ limits: { disk_mb: 1_048_576 } })), 1_000_000);
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

test("sandbox - the node's process limits are read from /proc/self/limits", (t) => {
  const limits = (soft: string, hard: string) =>
    `Limit                     Soft Limit           Hard Limit           Units     \nMax cpu time              unlimited            unlimited            seconds   \nMax processes             ${soft}  ${hard}  processes \nMax open files            1024                 524288               files     \n`;
  t.deepEqual(rlimitOf(limits("96364", "96364"), "Max processes"), { soft: 96364, hard: 96364 });
  t.deepEqual(rlimitOf(limits("4096", "8192"), "Max processes"), { soft: 4096, hard: 8192 });
  t.deepEqual(rlimitOf(limits("unlimited", "unlimited"), "Max processes"), { soft: Infinity, hard: Infinity });
  t.deepEqual(rlimitOf("", "Max processes"), { soft: Infinity, hard: Infinity });
  // The nice limit by its own name (the line the start-up warning reads), not the processes line.
  const withNice = `${limits("4096", "8192")}Max nice priority         0                    40                   \nMax realtime priority     0                    0                    \n`;
  t.deepEqual(rlimitOf(withNice, "Max nice priority"), { soft: 0, hard: 40 });
  t.deepEqual(rlimitOf(withNice, "Max processes"), { soft: 4096, hard: 8192 });
});

test("sandbox - without cgroups, the sandboxes' total is held to what the launcher can set and, sharing the node's uid, leaves the node its reserve", (t) => {
  const node = (soft: number, hard: number) => ({ soft, hard });
  // A root node's sandboxes run as another uid: only the hard limit (the launcher cannot raise it) holds it.
  t.is(rlimitProcessesTotal(16_384, node(96_364, 96_364), false), 16_384);
  t.is(rlimitProcessesTotal(16_384, node(1_024, 8_192), false), 8_192);
  t.is(rlimitProcessesTotal(16_384, node(Infinity, Infinity), false), 16_384);
  // Sharing the node's uid: its soft limit less a quarter, at least NODE_PROCESS_RESERVE.
  t.is(rlimitProcessesTotal(16_384, node(96_364, 96_364), true), 16_384);
  t.is(rlimitProcessesTotal(16_384, node(8_192, 96_364), true), 6_144);
  t.is(rlimitProcessesTotal(16_384, node(1_024, 96_364), true), 1_024 - NODE_PROCESS_RESERVE);
  t.is(rlimitProcessesTotal(16_384, node(400, 96_364), true), 0);
  t.is(rlimitProcessesTotal(16_384, node(Infinity, 2_000), true), 2_000);
  t.is(rlimitProcessesTotal(100, node(Infinity, Infinity), true), 100);
});

test("sandbox - without cgroups, a failed command's refused forks and allocations name the process and memory limits; a command that succeeded met none", (t) => {
  const hits = (text: string, failed = true) => rlimitHits(Buffer.from(text), failed);
  // What bash, dash, git, Go, Python, Java, glibc, coreutils, C++, Node and V8 print (most seen in sandboxes at their limits).
  t.deepEqual(hits("environment: fork: retry: Resource temporarily unavailable\n"), ["processes"]);
  t.deepEqual(hits("bash: fork: Resource temporarily unavailable\n"), ["processes"]);
  t.deepEqual(hits("sh: 0: Cannot fork\n"), ["processes"]);
  t.deepEqual(hits("fatal: cannot fork() for rev-list: Resource temporarily unavailable\n"), ["processes"]);
  t.deepEqual(hits("exec: fork/exec /usr/bin/ls: resource temporarily unavailable\n"), ["processes"]);
  t.deepEqual(hits('  File "/usr/lib/python3.11/subprocess.py", line 1901, in _execute_child\n    self.pid = _fork_exec(\nBlockingIOError: [Errno 11] Resource temporarily unavailable\n'), ["processes"]);
  t.deepEqual(hits("RuntimeError: can't start new thread\n"), ["processes"]);
  t.deepEqual(hits("/bin/bash: xrealloc: cannot allocate 94822400 bytes\n"), ["memory"]);
  t.deepEqual(hits("Traceback (most recent call last):\n  File \"<string>\", line 1, in <module>\nMemoryError\n"), ["memory"]);
  t.deepEqual(hits("sort: memory exhausted\n"), ["memory"]);
  t.deepEqual(hits("cat: write error: Cannot allocate memory\n"), ["memory"]);
  t.deepEqual(hits("terminate called after throwing an instance of 'std::bad_alloc'\n"), ["memory"]);
  t.deepEqual(hits("FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory\n"), ["memory"]);
  t.deepEqual(hits("# Fatal process OOM in Failed to reserve virtual memory for CodeRange\n"), ["memory"]);
  t.deepEqual(hits("fatal error: runtime: out of memory\nbash: fork: Resource temporarily unavailable\n"), ["memory", "processes"]);
  t.deepEqual(hits("java.lang.OutOfMemoryError: unable to create native thread: possibly out of memory or process/resource limits reached\n"), ["memory", "processes"]);
  // Nothing of the kind: other EAGAINs (a non-blocking read, a lock held), look-alike words; or a command that succeeded.
  t.deepEqual(hits("grep: x: No such file or directory\n"), []);
  t.deepEqual(hits("read: Resource temporarily unavailable\n"), []);
  t.deepEqual(hits('  File "lock.py", line 3, in <module>\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\nBlockingIOError: [Errno 11] Resource temporarily unavailable\n'), []);
  t.deepEqual(hits("MemoryErrors.txt\n"), []);
  t.deepEqual(hits("bash: fork: Resource temporarily unavailable\nCannot allocate memory\n", false), []);
});

test("sandbox - reading a failed command's output for refusals is bounded: its last 16 KiB, in time linear in them, whatever a hostile command prints", (t) => {
  const refusal = "bash: fork: Resource temporarily unavailable\n";
  const filler = (bytes: number) => "x".repeat(bytes);
  t.deepEqual(rlimitHits(Buffer.from(filler(1 << 20) + refusal), true), ["processes"]);
  t.deepEqual(rlimitHits(Buffer.from(refusal + filler(SCANNED_OUTPUT_BYTES)), true), []);
  // Output made to make the patterns backtrack (a 1 MiB line of "fork " took minutes before
  // the bounds: 7 s for 256 KiB, growing with the square of the length): each reading here
  // takes milliseconds; the bound below is a hundred times that, a guard, not a measurement.
  const hostile = ["fork ", "pthread_create ", "fork", "fork/exec ", `fork${filler(390)}`, "Cannot allocate ", "out of mem "];
  const started = performance.now();
  for (const unit of hostile) rlimitHits(Buffer.from(unit.repeat(Math.ceil((1 << 20) / unit.length))), true);
  const ms = performance.now() - started;
  t.true(ms < 2_000, `${ms.toFixed(0)} ms for ${hostile.length} hostile outputs of 1 MiB`);
});

test("sandbox - the root CPU task group (where autogroups apply) is told from /proc/self/cgroup: the v1 cpu path, or on v2 no cpu.weight from the node's cgroup up to the mount", (t) => {
  const none = () => false;
  const weighed = (...dirs: string[]) => (dir: string) => dirs.includes(dir);
  // v1 (and hybrid): the cpu hierarchy's path.
  t.true(inRootCpuCgroup("12:pids:/\n4:memory:/process_api/x\n1:cpu:/\n0::/\n", none));
  t.true(inRootCpuCgroup("3:cpu,cpuacct:/\n0::/system.slice/x.service\n", weighed("/system.slice")), "the v1 cpu line decides");
  t.false(inRootCpuCgroup("3:cpu,cpuacct:/docker/abc\n0::/\n", none));
  // v2: the real root has no cpu.weight; a container's namespaced root does.
  t.true(inRootCpuCgroup("0::/\n", none));
  t.false(inRootCpuCgroup("0::/\n", weighed("/")), "a container's own cgroup, shown as / in its namespace");
  t.false(inRootCpuCgroup("0::/system.slice/runs.service/runs-service\n", weighed("/system.slice")), "an ancestor with the cpu controller");
  t.true(inRootCpuCgroup("0::/system.slice/runs.service/runs-service\n", none), "no cgroup on the path has cpu: scheduled in the root group");
  t.false(inRootCpuCgroup("2:cpuset:/\n1:cpuacct:/\n0::/docker/abc\n", weighed("/docker/abc")), "cpuset and cpuacct are not cpu");
  t.false(inRootCpuCgroup("", none));
});

test("sandbox - a process killed by SIGBUS or SIGXFSZ is read from the shell's own report in the output's tail, never from the words a command printed", (t) => {
  const out = (text: string) => Buffer.from(text);
  t.true(shellReported(out("mapped\n/bin/bash: line 9:     2 Bus error               python3 - <<'EOF'\n"), "Bus error"));
  t.true(shellReported(out("bash: line 1: 4711 Bus error (core dumped) ./writer\n"), "Bus error"));
  t.true(shellReported(out("./build.sh: line 5: 77 File size limit exceeded (core dumped) head -c 1G /dev/zero > big\ndone\n"), "File size limit exceeded"));
  // As bash writes it for a command it went on after: the description padded into the command's name.
  t.true(shellReported(out("/bin/bash: line 1:     2 File size limit exceededhead -c 3000000 /dev/zero > big\nwrote\n"), "File size limit exceeded"));
  // The words in what a command showed: a log, a grep, a message of its own.
  t.false(shellReported(out("kernel: Bus error at 0x0\n"), "Bus error"));
  t.false(shellReported(out("grep: found 'File size limit exceeded' in notes.txt\n"), "File size limit exceeded"));
  t.false(shellReported(out("bash: line 1: 4711 Bus error\n"), "File size limit exceeded"), "another signal");
  // Only the tail is read: a report far before it is not the command's end.
  t.false(shellReported(Buffer.concat([out("bash: line 1: 1 Bus error x\n"), Buffer.alloc(64 * 1024, 0x61)]), "Bus error"));
});

test("sandbox-limits - a node is short of disk below its reserve, and once short until an eighth more is free (no back and forth at the line)", (t) => {
  const reserve = 800;
  t.false(diskShort(800, reserve, false));
  t.true(diskShort(799, reserve, false));
  t.true(diskShort(800, reserve, true));
  t.true(diskShort(899, reserve, true));
  t.false(diskShort(900, reserve, true));
  t.false(diskShort(900, reserve, false));
});
