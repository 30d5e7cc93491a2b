import { rmSync } from "node:fs";
import { chmod, mkdtemp, readdir, readFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import pino from "pino";
import { Sandbox } from "../../actors/sandbox.js";

let shared: Promise<Sandbox> | undefined;

/**
 * One real bubblewrap sandbox runner per test process (tests run with the sandbox
 * on, as CI does), without an egress proxy. Its runtime folder is a temp dir.
 */
export function testSandbox(): Promise<Sandbox> {
  shared ??= (async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), "runs-sandbox-test-"));
    await chmod(dir, 0o711);
    process.once("exit", () => rmSync(dir, { recursive: true, force: true }));
    const log = pino({ level: process.env.RUNS_TEST_LOG_LEVEL ?? "silent" });
    return Sandbox.start({
      mode: "bwrap",
      maxConcurrent: 64,
      runtimeDir: path.join(dir, "sandbox"),
      nodeId: `unit-${process.pid}`,
      log,
    });
  })();
  return shared;
}

/**
 * Live host pids whose command line (arguments joined by spaces) contains `marker`.
 * Sandboxed processes keep their host pids, so a test sees them from the host.
 */
export async function hostProcesses(marker: string): Promise<number[]> {
  const found: number[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const cmdline = (await readFile(`/proc/${entry}/cmdline`, "utf8").catch(() => "")).replaceAll("\0", " ");
    if (!cmdline.includes(marker)) continue;
    // A zombie (killed, not yet reaped) is gone for our purpose.
    const stat = await readFile(`/proc/${entry}/stat`, "utf8").catch(() => "");
    if (!/\)\s+Z\s/.test(stat)) found.push(Number(entry));
  }
  return found;
}

/** A fork bomb that holds what it got until `release` appears in its workspace (≤ 30 s), then says how many it had. */
export function holdingBomb(marker: string, tries: number): string {
  return `perl -e 'my $n = 0; for (1..${tries}) { my $p = fork; last unless defined $p; if (!$p) { for (1..300) { last if -e "release"; select(undef, undef, undef, 0.1) } exit 0 } $n++ } print "forked $n\\n"; 1 while wait != -1; print "held\\n"' ${marker}`;
}

/** Host processes whose command line has `marker`, once their count stops growing (≤ 10 s). */
export async function settledCount(marker: string, atLeast: number): Promise<number> {
  let held = 0;
  for (let i = 0, last = -1; i < 100; i++) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    held = (await hostProcesses(marker)).length;
    if (held >= atLeast && held === last) break;
    last = held;
  }
  return held;
}
