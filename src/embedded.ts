import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "pino";
import { freePort, portIsFree, startFerretDb, startNatsServer, type ServerProcess } from "./servers.js";

/** Secrets the embedded default keeps in its data dir (created once, mode 0600). */
interface EmbeddedSecrets {
  nats_password: string;
  nats_tap_password: string;
  master_key: string;
}

/** Where a running embedded default can be reached (for `runs admin` while `npm start` runs). */
export interface EmbeddedInfo {
  pid: number;
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
export const DEFAULT_EMBEDDED_MONGO_PORT = 27117;

export async function loadOrCreateSecrets(dataDir: string): Promise<EmbeddedSecrets> {
  const file = path.join(dataDir, "secrets.json");
  if (existsSync(file)) return JSON.parse(await readFile(file, "utf8")) as EmbeddedSecrets;
  await mkdir(dataDir, { recursive: true });
  const secrets: EmbeddedSecrets = {
    nats_password: randomBytes(24).toString("base64url"),
    nats_tap_password: randomBytes(24).toString("base64url"),
    master_key: randomBytes(32).toString("base64"),
  };
  await writeFile(file, JSON.stringify(secrets, null, 2), { mode: 0o600 });
  return secrets;
}

async function pickPort(preferred: number): Promise<number> {
  return (await portIsFree(preferred)) ? preferred : freePort();
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
  const natsPort = await pickPort(Number(process.env.RUNS_EMBEDDED_NATS_PORT ?? DEFAULT_EMBEDDED_NATS_PORT));
  const mongoPort = await pickPort(Number(process.env.RUNS_EMBEDDED_MONGO_PORT ?? DEFAULT_EMBEDDED_MONGO_PORT));
  const started: ServerProcess[] = [];
  const stop = async () => {
    await Promise.all(started.map((s) => s.stop()));
    await rm(embeddedInfoFile(dataDir), { force: true });
  };
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
    started.push(
      await startFerretDb({ port: mongoPort, dataDir: path.join(dataDir, "ferretdb"), logFile: path.join(dataDir, "logs", "ferretdb.log") }),
    );
  } catch (err) {
    await stop();
    throw err;
  }
  const natsUrl = `nats://127.0.0.1:${natsPort}`;
  const mongoUri = `mongodb://127.0.0.1:${mongoPort}/`;
  const info: EmbeddedInfo = { pid: process.pid, nats_url: natsUrl, nats_tap_url: natsUrl, mongo_uri: mongoUri };
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
