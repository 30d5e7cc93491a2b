/**
 * A node process that was started with descriptors its parent left open (the test passes
 * them): it starts a sandbox as the service does and prints, as JSON, what a command
 * inside sees of its descriptors and what it reads through the inherited ones.
 */
import { chmod, mkdir, mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import pino from "pino";
import { Sandbox } from "../../actors/sandbox.js";
import { DEFAULT_LIMITS } from "../../actors/sandbox-limits.js";

const lines: string[] = [];
const log = pino({ level: "warn" }, { write: (line: string) => void lines.push(line) });
const base = await mkdtemp(path.join(os.tmpdir(), "runs-inherited-fd-"));
try {
  await chmod(base, 0o711);
  const sandbox = await Sandbox.start({ mode: (process.env.CHILD_SANDBOX_MODE as "bwrap" | "off") ?? "bwrap", maxConcurrent: 2, runtimeDir: path.join(base, "rt"), nodeId: "inherited-fd", log });
  const dir = path.join(base, "ws");
  await mkdir(dir);
  await sandbox.prepareWorkspace(dir);
  const command = "ls /proc/self/fd | tr '\\n' ' '; echo; cat <&200 2>&1; ls /proc/self/fd/201/ 2>&1 | head -3";
  const outcome = await sandbox.run({ workspaceDir: dir, argv: ["/bin/bash", "-c", 'exec "$0" -c "$1" 2>&1', "/bin/bash", command], timeoutMs: 20_000, limits: DEFAULT_LIMITS });
  process.stdout.write(JSON.stringify({ output: outcome.output.toString("utf8"), logs: lines.map((line) => JSON.parse(line)) }));
} finally {
  await rm(base, { recursive: true, force: true }).catch(() => undefined);
}
