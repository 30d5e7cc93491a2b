import pino from "pino";
import pinoPretty from "pino-pretty";
import { type BannerFacts, startupBanner } from "./banner.js";
import { ConfigurationError, loadConfig, systemClock } from "../src/index.js";
import { startEmbedded, type Embedded } from "./embedded.js";
import { MissingToolError } from "./servers.js";
import { startService, type RunningService } from "./service.js";
import { createWorkspace } from "./workspaces.js";
import { SandboxUnavailableError } from "../actors/index.js";

/** `npm start`: the service, with an embedded nats-server and FerretDB unless NATS_URL / MONGODB_URI are set. */
async function main(): Promise<void> {
  const config = loadConfig();
  const log = logger(config.logLevel);
  let embedded: Embedded | undefined;
  let service: RunningService | undefined;

  // Signals are handled from the first moment: a Ctrl-C during start-up still stops
  // what has been started (the embedded servers run in their own process groups).
  let stopping = false;
  const shutdown = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, "shutting down");
    const force = setTimeout(() => process.exit(1), 30_000);
    force.unref();
    try {
      await service?.close();
      await embedded?.stop();
    } finally {
      process.exit(0);
    }
  };
  process.on("SIGINT", () => void shutdown("SIGINT"));
  process.on("SIGTERM", () => void shutdown("SIGTERM"));
  // Background work (a sweeper's store read, a lease renewal's NATS request) can fail
  // while the connections close; that must not turn a clean stop into exit 1. Outside a
  // stop, Node's default stands: the error is printed and the process ends with 1.
  const failedWhileStopping = (err: unknown) => {
    if (!stopping) {
      process.stderr.write(`runs: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
      process.exit(1);
    }
    log.warn({ err }, "background work failed while stopping");
  };
  process.on("unhandledRejection", failedWhileStopping);
  process.on("uncaughtException", failedWhileStopping);

  if (!config.natsUrl || !config.mongoUri) {
    embedded = await startEmbedded(config.dataDir, log);
    config.natsUrl ??= embedded.natsUrl;
    config.natsUser ??= embedded.natsUser;
    config.natsPassword ??= embedded.natsPassword;
    config.mongoUri ??= embedded.mongoUri;
    config.masterKey ??= embedded.masterKey;
  }
  if (stopping) return;
  try {
    service = await startService(config, { log });
  } catch (err) {
    await embedded?.stop();
    throw err;
  }
  if (stopping) return;

  let created: BannerFacts["created"];
  // `npm start` on an empty store, embedded or not (decisions §1); once, however many
  // nodes start. Not the image's entry point (RUNS_DEV_WORKSPACE unset): an all-scopes
  // key printed into a deployment's collected logs is a key anyone reading them holds.
  if ((embedded || config.devWorkspace) && (await service.store.countWorkspaces()) === 0) {
    if (await service.store.claimBootstrap(systemClock.nowMs())) {
      const made = await createWorkspace(service.store, { plan: "business", name: "development", nowMs: systemClock.nowMs() });
      created = { workspaceId: made.workspace.id, plan: made.workspace.plan, key: made.api_key.key as string };
    } else {
      log.info("another start is making the development workspace and prints its key (if none appears, make one with `npx runs admin create-workspace --plan business --create`)");
    }
  }
  const app = service.app;
  // One write: the lines stay together, apart from the log lines around them.
  process.stdout.write(
    startupBanner({
      url: service.url,
      console: app?.hasRoute({ method: "GET", url: "/" }) ?? false,
      docs: app?.hasRoute({ method: "GET", url: "/docs" }) ?? false,
      dataDir: config.dataDir,
      embeddedNatsUrl: embedded?.natsUrl,
      created,
    }),
  );
}

/** JSON lines for machines; on a terminal, pino-pretty's readable lines. */
function logger(level: string) {
  return process.stdout.isTTY ? pino({ level }, pinoPretty({ colorize: true, sync: true, translateTime: "SYS:HH:MM:ss.l" })) : pino({ level });
}

main().catch((err) => {
  if (err instanceof SandboxUnavailableError) {
    process.stderr.write(`runs: ${err.message}\n`);
    process.exit(5);
  }
  if (err instanceof MissingToolError || err instanceof ConfigurationError) {
    process.stderr.write(`runs: ${err.message}\n`);
    process.exit(3);
  }
  process.stderr.write(`runs: could not start: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
