import test from "ava";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { cgroupCpuQuota, ferretDbEnv, usableCores, usableMemory } from "../../node/servers.js";

const GiB = 1024 ** 3;

test("ferretdb env - GOGC 400, a soft memory limit of an eighth of the memory (64 MiB to 1 GiB) and the cores but one, unless the environment says otherwise", (t) => {
  t.like(ferretDbEnv({ PATH: "/usr/bin" }, 2, 24 * GiB), { PATH: "/usr/bin", GOGC: "400", GOMEMLIMIT: "1024MiB", GOMAXPROCS: "1" });
  t.is(ferretDbEnv({}, 2, 2 * GiB).GOMEMLIMIT, "256MiB", "a small machine or container");
  t.is(ferretDbEnv({}, 2, 256 * 1024 ** 2).GOMEMLIMIT, "64MiB", "never below 64 MiB");
  t.is(ferretDbEnv({}, 1, GiB).GOMAXPROCS, "1", "at least one core");
  t.is(ferretDbEnv({}, 8, GiB).GOMAXPROCS, "7");
  t.like(ferretDbEnv({ GOGC: "off", GOMEMLIMIT: "256MiB", GOMAXPROCS: "4" }, 2, GiB), { GOGC: "off", GOMEMLIMIT: "256MiB", GOMAXPROCS: "4" });
});

test("ferretdb env - the memory is the container's limit when it is below the machine's, else the machine's", (t) => {
  t.is(usableMemory(2 * GiB, 24 * GiB), 2 * GiB);
  t.is(usableMemory(undefined, 24 * GiB), 24 * GiB, "no answer");
  t.is(usableMemory(0, 24 * GiB), 24 * GiB, "limit unknown");
  t.is(usableMemory(2 ** 64, 24 * GiB), 24 * GiB, "no limit");
});

test("ferretdb env - the cores are the CPUs the process may run on, or fewer under a CPU quota, rounded up, at least one", (t) => {
  t.is(usableCores(2, undefined), 2, "no quota");
  t.is(usableCores(64, 2), 2, "a 2-CPU container on a 64-core host");
  t.is(usableCores(64, 1.5), 2, "rounded up");
  t.is(usableCores(4, 0.25), 1, "at least one");
  t.is(usableCores(2, 8), 2, "a quota above the CPUs changes nothing");
  t.is(ferretDbEnv({}, usableCores(64, 2), GiB).GOMAXPROCS, "1", "FerretDB leaves one of the container's two to the event loop");
});

test("ferretdb env - the CPU quota is read from cgroup v2 cpu.max along the process's path, and from cgroup v1 cfs files; none, unreadable or unlimited is undefined", (t) => {
  const base = mkdtempSync(path.join(os.tmpdir(), "runs-cgroup-"));
  t.teardown(() => rmSync(base, { recursive: true, force: true }));
  const root = path.join(base, "cgroup");
  const put = (rel: string, text: string) => {
    mkdirSync(path.dirname(path.join(root, rel)), { recursive: true });
    writeFileSync(path.join(root, rel), text);
  };
  // v2: the process's own cgroup, its parent and the root; the smallest limit wins.
  put("cpu.max", "max 100000\n");
  put("kubepods/pod1/cpu.max", "max 100000\n");
  put("kubepods/pod1/ctr/cpu.max", "150000 100000\n");
  t.is(cgroupCpuQuota(root, "0::/kubepods/pod1/ctr\n"), 1.5);
  put("kubepods/cpu.max", "100000 100000\n");
  t.is(cgroupCpuQuota(root, "0::/kubepods/pod1/ctr\n"), 1, "an ancestor's smaller limit");
  t.is(cgroupCpuQuota(root, "0::/\n"), undefined, "the root unlimited");
  // v1: the cpu controller's mount (a container's own view) and the process's path under it.
  put("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "200000\n");
  put("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  t.is(cgroupCpuQuota(root, "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n"), 2);
  put("cpu/cpu.cfs_quota_us", "-1\n");
  put("cpu/cpu.cfs_period_us", "100000\n");
  t.is(cgroupCpuQuota(root, "4:cpu:/\n"), undefined, "v1 without a quota (-1)");
  t.is(cgroupCpuQuota(root, undefined), undefined, "no /proc/self/cgroup");
  t.is(cgroupCpuQuota(root, "garbage\n\n0::\n"), undefined);
  t.is(cgroupCpuQuota(path.join(root, "missing"), "0::/a/b\n"), undefined, "nothing readable");
  // A cgroup outside the namespace's root shows as `..`: nothing outside `root` is read.
  put("../outside/cpu.max", "100000 100000\n");
  t.is(cgroupCpuQuota(root, "0::/../outside\n"), undefined, "never reads above root");
  put("bad/cpu.max", "lots 0\n");
  t.is(cgroupCpuQuota(root, "0::/bad\n"), undefined, "unparseable");
});
