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
