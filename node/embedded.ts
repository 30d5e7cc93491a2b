import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { chmod, mkdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { Logger } from "pino";
import { TOOLS_BIN, freePort, portIsFree, startFerretDb, startNatsServer, type ServerProcess } from "./servers.js";

/** Secrets the embedded default keeps in its data dir (created once, mode 0600). */
interface EmbeddedSecrets {
  nats_password: string;
  nats_tap_password: string;
  master_key: string;
}

/** Where a running embedded default can be reached (for `runs admin` while `npm start` runs). */
export interface EmbeddedInfo {
  pid: number;
  /** The server processes, so a start after a crash can end servers left behind. */
  server_pids?: number[];
  nats_url: string;
  nats_tap_url: string;
  mongo_uri: string;
}

export interface Embedded {
  natsUrl: string;
  natsUser: string;
  natsPassword: string;
  tapPassword: string;
  mongoUri: string;
  masterKey: string;
  stop(): Promise<void>;
}

export const DEFAULT_EMBEDDED_NATS_PORT = 4322;

/**
 * A NATS password nats.conf can take from the environment: nats-server parses a variable's
 * value as a config value, so one starting with "-" fails to start it ("Expected a digit")
 * and one like "2MB" becomes a number. A letter first, then base64url, is always a string.
 */
export function natsPassword(): string {
  return `p${randomBytes(24).toString("base64url")}`;
}

/** Whether nats-server reads `value` from the environment as a string (see {@link natsPassword}). */
export function natsReadsAsString(value: string): boolean {
  return /^[A-Za-z][A-Za-z0-9_-]*$/.test(value);
}

export async function loadOrCreateSecrets(dataDir: string): Promise<EmbeddedSecrets> {
  const file = path.join(dataDir, "secrets.json");
  if (existsSync(file)) {
    // Tightened if an earlier version or a person loosened it.
    if (((await stat(file)).mode & 0o077) !== 0) await chmod(file, 0o600);
    const secrets = JSON.parse(await readFile(file, "utf8")) as EmbeddedSecrets;
    // An earlier version could write a password nats-server cannot read (about 1 in 32
    // data folders): replaced; only our own processes and the tap (shown at start) use them.
    if (natsReadsAsString(secrets.nats_password) && natsReadsAsString(secrets.nats_tap_password)) return secrets;
    const repaired = { ...secrets, nats_password: natsPassword(), nats_tap_password: natsPassword() };
    await writeFile(file, JSON.stringify(repaired, null, 2), { mode: 0o600 });
    return repaired;
  }
  await mkdir(dataDir, { recursive: true, mode: 0o711 });
  const secrets: EmbeddedSecrets = {
    nats_password: natsPassword(),
    nats_tap_password: natsPassword(),
    master_key: randomBytes(32).toString("base64"),
  };
  await writeFile(file, JSON.stringify(secrets, null, 2), { mode: 0o600 });
  return secrets;
}

async function pickPort(preferred: number): Promise<number> {
  return (await portIsFree(preferred)) ? preferred : freePort();
}

/** Ends servers a crashed earlier start left running on this data dir. */
async function endLeftovers(dataDir: string, log: Logger): Promise<void> {
  const file = embeddedInfoFile(dataDir);
  if (!existsSync(file)) return;
  const info = JSON.parse(await readFile(file, "utf8")) as EmbeddedInfo;
  if (alive(info.pid) && info.pid !== process.pid) {
    throw new Error(`another runs process (pid ${info.pid}) is using ${dataDir}; stop it or choose another RUNS_DATA_DIR`);
  }
  for (const pid of info.server_pids ?? []) {
    // Only our own server binaries: the pid may since belong to something else.
    if (!alive(pid) || !(await commandLine(pid)).includes(TOOLS_BIN)) continue;
    log.warn({ pid }, "ending a server left behind by an earlier start");
    process.kill(pid, "SIGTERM");
    for (let i = 0; i < 50 && alive(pid); i++) await new Promise((resolve) => setTimeout(resolve, 100));
  }
  await rm(file, { force: true });
}

async function commandLine(pid: number): Promise<string> {
  try {
    return (await readFile(`/proc/${pid}/cmdline`, "utf8")).replace(/\0/g, " ");
  } catch {
    return "";
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** A socket path must fit sun_path (107 bytes); a long data folder gets a private one in the temp folder. */
const MAX_SOCKET_PATH = 100;

async function storeSocketPath(storeDir: string, log: Logger): Promise<string> {
  const inside = path.join(storeDir, "ferretdb.sock");
  if (Buffer.byteLength(inside) <= MAX_SOCKET_PATH) {
    await rm(inside, { force: true });
    return inside;
  }
  const dir = path.join(os.tmpdir(), `runs-store-${process.getuid?.() ?? "u"}-${randomBytes(4).toString("hex")}`);
  await mkdir(dir, { mode: 0o700 });
  log.info({ socket: path.join(dir, "ferretdb.sock") }, "the data folder's path is too long for a Unix socket: the store's socket is in a private temp folder");
  return path.join(dir, "ferretdb.sock");
}

export function embeddedInfoFile(dataDir: string): string {
  return path.join(dataDir, "embedded.json");
}

/** The running embedded default of this data dir, if its process is alive. */
export async function runningEmbedded(dataDir: string): Promise<EmbeddedInfo | undefined> {
  const file = embeddedInfoFile(dataDir);
  if (!existsSync(file)) return undefined;
  const info = JSON.parse(await readFile(file, "utf8")) as EmbeddedInfo;
  try {
    process.kill(info.pid, 0);
    return info;
  } catch {
    return undefined;
  }
}

/**
 * Starts a local nats-server (with nats.conf) and FerretDB (SQLite) under `dataDir`
 * on loopback, for `npm start` without NATS_URL / MONGODB_URI.
 */
export async function startEmbedded(dataDir: string, log: Logger): Promise<Embedded> {
  const secrets = await loadOrCreateSecrets(dataDir);
  await endLeftovers(dataDir, log);
  let natsPort = await pickPort(Number(process.env.RUNS_EMBEDDED_NATS_PORT ?? DEFAULT_EMBEDDED_NATS_PORT));
  // The store has no authentication: it listens on a Unix socket in a folder only the
  // service's user can enter, never on a TCP port anything on the host could reach.
  const storeDir = path.join(dataDir, "ferretdb");
  await mkdir(storeDir, { recursive: true, mode: 0o700 });
  await chmod(storeDir, 0o700);
  const mongoSocket = await storeSocketPath(storeDir, log);
  const started: ServerProcess[] = [];
  // If this process exits without stopping them (even mid-start), the servers go too.
  process.once("exit", () => {
    for (const s of started) if (s.child.exitCode === null) s.child.kill("SIGTERM");
  });
  const stop = async () => {
    await Promise.all(started.map((s) => s.stop()));
    await rm(embeddedInfoFile(dataDir), { force: true });
  };
  try {
    // The port was free when picked; another program may take it before nats-server
    // binds it. Then another free port is tried (the port is a preference, as above).
    for (let attempt = 1; ; attempt++) {
      try {
        started.push(
          await startNatsServer({
            port: natsPort,
            storeDir: path.join(dataDir, "nats"),
            logFile: path.join(dataDir, "logs", "nats-server.log"),
            servicePassword: secrets.nats_password,
            tapPassword: secrets.nats_tap_password,
            serverName: "runs-embedded",
          }),
        );
        break;
      } catch (err) {
        if (attempt >= 3 || !/address already in use/i.test((err as Error).message)) throw err;
        log.warn({ port: natsPort }, "the NATS port was taken before nats-server could bind it; trying another");
        natsPort = await freePort();
      }
    }
    started.push(
      await startFerretDb({
        port: 0,
        unixSocket: mongoSocket,
        dataDir: storeDir,
        logFile: path.join(dataDir, "logs", "ferretdb.log"),
      }),
    );
  } catch (err) {
    await stop();
    throw err;
  }
  const natsUrl = `nats://127.0.0.1:${natsPort}`;
  const mongoUri = `mongodb://${encodeURIComponent(mongoSocket)}/`;
  const info: EmbeddedInfo = {
    pid: process.pid,
    server_pids: started.map((s) => s.pid || s.child.pid!).filter(Boolean),
    nats_url: natsUrl,
    nats_tap_url: natsUrl,
    mongo_uri: mongoUri,
  };

  await writeFile(embeddedInfoFile(dataDir), JSON.stringify(info, null, 2));
  log.info({ nats: natsUrl, mongo: mongoUri, dataDir }, "embedded nats-server and FerretDB started");
  return {
    natsUrl,
    natsUser: "runs",
    natsPassword: secrets.nats_password,
    tapPassword: secrets.nats_tap_password,
    mongoUri,
    masterKey: secrets.master_key,
    stop,
  };
}
