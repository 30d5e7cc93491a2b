import test from "ava";
import { spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const SERVERS = fileURLToPath(new URL("../../node/servers.ts", import.meta.url));

function portOpen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1");
    socket.once("connect", () => (socket.destroy(), resolve(true)));
    socket.once("error", () => resolve(false));
  });
}

test("server processes - a process that started a server and has nothing else to do exits, and the server stops with it (a test worker whose set-up failed before its teardown knew the servers had waited for ever: seen in a full run)", async (t) => {
  t.timeout(60_000);
  const dir = await mkdtemp(path.join(os.tmpdir(), "runs-servers-"));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const script = `
    import { freePort, startNatsServer } from ${JSON.stringify(SERVERS)};
    const port = await freePort();
    await startNatsServer({ port, storeDir: ${JSON.stringify(path.join(dir, "nats"))}, logFile: ${JSON.stringify(path.join(dir, "nats.log"))}, servicePassword: "a", tapPassword: "b" });
    process.stdout.write(String(port));
  `;
  const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
  const code = await new Promise<number | "hung">((resolve) => {
    const timer = setTimeout(() => (child.kill("SIGKILL"), resolve("hung")), 30_000);
    child.once("exit", (exitCode) => (clearTimeout(timer), resolve(exitCode ?? -1)));
  });
  t.is(code, 0, "the process exits on its own");
  const port = Number(out);
  t.true(port > 0, out);
  // The watchdog stops the server once the pipe from its parent closes (SIGTERM, then SIGKILL at 5 s).
  let open = true;
  for (let i = 0; i < 100 && open; i++) {
    open = await portOpen(port);
    if (open) await new Promise((resolve) => setTimeout(resolve, 100));
  }
  t.false(open, "the server is gone");
});
