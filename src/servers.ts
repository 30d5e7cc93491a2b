import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, open } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";

/** The project root (where package.json, nats.conf and .tools live). */
export const PROJECT_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
export const TOOLS_BIN = path.join(PROJECT_ROOT, ".tools", "bin");
export const NATS_CONF = path.join(PROJECT_ROOT, "nats.conf");

/** A tool binary is missing: the message says how to get it. */
export class MissingToolError extends Error {
  constructor(readonly tool: string) {
    super(
      `${tool} is not built yet (looked in ${TOOLS_BIN}). Run \`npm start\` or \`bash scripts/ensure-tools.sh\` ` +
        "(needs Go 1.22+), or point NATS_URL and MONGODB_URI at running servers (see deploy/compose.yaml).",
    );
    this.name = "MissingToolError";
  }
}

export function toolPath(name: string): string {
  const file = path.join(TOOLS_BIN, name);
  if (!existsSync(file)) throw new MissingToolError(name);
  return file;
}

/** A free TCP port on the loopback interface. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => resolve(typeof address === "object" && address ? address.port : 0));
    });
  });
}

export function portIsFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.unref();
    server.on("error", () => resolve(false));
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)));
  });
}

async function waitForPort(port: number, child: ChildProcess, name: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`${name} exited with code ${child.exitCode} while starting`);
    const open = await new Promise<boolean>((resolve) => {
      const socket = net.connect({ port, host: "127.0.0.1" });
      socket.once("connect", () => {
        socket.destroy();
        resolve(true);
      });
      socket.once("error", () => resolve(false));
    });
    if (open) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`${name} did not listen on port ${port} within ${timeoutMs} ms`);
}

/** A server process this program started; `stop` ends it (SIGTERM, then SIGKILL). */
export interface ServerProcess {
  name: string;
  port: number;
  child: ChildProcess;
  stop(): Promise<void>;
  /** Ends the process at once, as a crash would. */
  kill(): void;
}

async function launch(
  name: string,
  bin: string,
  args: string[],
  env: NodeJS.ProcessEnv,
  port: number,
  logFile: string,
  detached = false,
): Promise<ServerProcess> {
  await mkdir(path.dirname(logFile), { recursive: true });
  const log = await open(logFile, "a");
  // Detached: its own process group, so a terminal's Ctrl-C reaches only us and we stop
  // the servers after the service has let go of them.
  const child = spawn(bin, args, { env, stdio: ["ignore", log.fd, log.fd], detached });
  child.once("exit", () => void log.close().catch(() => undefined));
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), 5_000);
    await exited;
    clearTimeout(timer);
  };
  try {
    await waitForPort(port, child, name, 30_000);
  } catch (err) {
    await stop();
    throw new Error(`${(err as Error).message}; see ${logFile}`);
  }
  return { name, port, child, stop, kill: () => void child.kill("SIGKILL") };
}

export interface NatsServerOptions {
  port: number;
  storeDir: string;
  logFile: string;
  servicePassword: string;
  tapPassword: string;
  serverName?: string;
  /** Extra command-line arguments (cluster routes and the like). */
  args?: string[];
  /** Run in its own process group (the embedded default). */
  detached?: boolean;
}

/** Starts nats-server with the project's nats.conf on loopback. */
export function startNatsServer(options: NatsServerOptions): Promise<ServerProcess> {
  const args = ["-c", NATS_CONF, "-a", "127.0.0.1", "-p", String(options.port), "-sd", options.storeDir, "-n", options.serverName ?? `runs-${options.port}`, ...(options.args ?? [])];
  const env = { ...process.env, RUNS_NATS_PASSWORD: options.servicePassword, RUNS_NATS_TAP_PASSWORD: options.tapPassword };
  return launch("nats-server", toolPath("nats-server"), args, env, options.port, options.logFile, options.detached);
}

export interface FerretDbOptions {
  port: number;
  dataDir: string;
  logFile: string;
  detached?: boolean;
}

/** Starts FerretDB with its SQLite backend on loopback. */
export async function startFerretDb(options: FerretDbOptions): Promise<ServerProcess> {
  await mkdir(options.dataDir, { recursive: true });
  const args = [
    "--handler=sqlite",
    `--sqlite-url=file:${options.dataDir}/?_txlock=immediate`,
    `--listen-addr=127.0.0.1:${options.port}`,
    `--state-dir=${options.dataDir}`,
    "--telemetry=disable",
    "--debug-addr=-",
    "--log-level=error",
  ];
  return launch("ferretdb", toolPath("ferretdb"), args, { ...process.env }, options.port, options.logFile, options.detached);
}
