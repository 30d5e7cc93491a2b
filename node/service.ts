import type { FastifyInstance } from "fastify";
import pino, { type Logger } from "pino";
import { BlobKeyring, BoundedWork, objectChunkReader, CHECKPOINTS_BUCKET, type Clock, FILES_BUCKET, orphanGraceMs, Ids, type Config, ConfigurationError, connectNats, DeploymentCache, EnvValues, EventKeyring, FileStore, isTransient, JetStreamEventLog, MongoStore, provisionNats, secretboxBackend, secretboxReady, systemClock, UsageLedger, useCursorKey, useEventIdVersion, WebhookStore } from "../src/index.js";
import { ActiveTurns, ActorHost, CHECKPOINT_WRITE_GRACE_MS, WebhookDeliverer, DeploymentBuilder, EgressProxy, parseTestHosts, PART_REMOVALS_AT_ONCE, PART_REMOVALS_WAITING, Sandbox, scrubProviderEnvironment, WorkspaceCheckpoints } from "../actors/index.js";
import path from "node:path";
import { buildApp } from "../gateway/index.js";

export interface RunningService {
  /** Base URL of the API when the gateway role is on. */
  url: string | undefined;
  app: FastifyInstance | undefined;
  store: MongoStore;
  /** Graceful stop: stop admitting, release partitions, close connections. */
  close(): Promise<void>;
}

export interface ServiceOptions {
  log?: Logger;
  clock?: Clock;
}

/**
 * The composition root of one node: connects NATS and the store, provisions them,
 * and starts the roles the config asks for.
 */
export async function startService(config: Config, options: ServiceOptions = {}): Promise<RunningService> {
  const log = options.log ?? pino({ level: config.logLevel });
  const clock = options.clock ?? systemClock;
  if (!config.natsUrl || !config.mongoUri) throw new Error("startService needs natsUrl and mongoUri");
  // No provider client may fall back to the operator's own credentials.
  const scrubbed = scrubProviderEnvironment(process.env, config.ambientProviders);
  if (scrubbed.length) log.info({ variables: scrubbed }, "provider credential variables removed from the service's environment");
  if (config.ambientProviders.size) log.warn({ providers: [...config.ambientProviders] }, "ambient-credential providers enabled: every workspace uses the service's credentials for them");
  // First, before any connection: a node that cannot sandbox tools must not take runs.
  const sandbox = config.roles.actors ? await startSandbox(config, log) : undefined;

  // What the node has opened, closed in reverse by `close`, or by a start that fails part
  // way: its connections and timers would otherwise keep the process (a test's, an
  // embedding program's) alive, and its partitions claimed until their leases lapse.
  const opened: Array<() => Promise<unknown> | void> = [];
  let started = false;
  const closeOpened = async () => {
    for (const close of opened.splice(0).reverse()) {
      try {
        await close();
      } catch (err) {
        log.warn({ err }, "stopping: a part of the node did not close cleanly");
      }
    }
  };
  try {
    const store = await connectStore(config, log);
    opened.push(() => store.close());
    await store.provision();
    const nc = await connectNats({ url: config.natsUrl, user: config.natsUser, password: config.natsPassword, name: `runs-${config.nodeId}` });
    opened.push(() => nc.drain().catch(() => undefined));
    const nats = await provisionNats(nc, config.retention, config.natsReplicas, config.rateLimits.windowMs, config.turnLimitMs, config.storeBytes);
    if (!config.masterKey) throw new ConfigurationError("RUNS_MASTER_KEY: required (32 bytes, base64)");
    useCursorKey(config.masterKey);
    useEventIdVersion(config.eventIdVersion);
    const events = new JetStreamEventLog({ nc: nats.nc, js: nats.js, jsm: nats.jsm, keyring: new EventKeyring(config.masterKey), clock, streamRetentionS: config.retention.eventS });
    const blobKeys = new BlobKeyring(config.masterKey);
    const files = new FileStore(store.db, nats.files, clock, Ids, blobKeys);
    await files.provision();
    const envValues = new EnvValues(store.db, config.masterKey, clock);
    await envValues.provision();
    const usage = new UsageLedger(store.db, clock);
    await usage.provision();
    const webhooks = new WebhookStore(store.db, config.masterKey, clock, Ids);
    await webhooks.provision();

    const builder = new DeploymentBuilder(store, clock, log.child({ component: "builder" }));
    const deployments = new DeploymentCache(store);
    let host: ActorHost | undefined;
    const partRemovals = new BoundedWork(PART_REMOVALS_AT_ONCE, PART_REMOVALS_WAITING);
    if (config.roles.actors) {
      const activeTurns = new ActiveTurns(nats.activeTurns, config.nodeId, clock, log.child({ component: "active-turns" }), config.leaseTtlMs);
      activeTurns.start();
      opened.push(() => activeTurns.stop());
      const actors = new ActorHost(
        {
          config,
          clock,
          ids: Ids,
          store,
          nc,
          events,
          log: log.child({ component: "actors" }),
          deployments,
          checkpoints: new WorkspaceCheckpoints(nats.checkpoints, objectChunkReader(nats.nc, nats.jsm, clock, CHECKPOINTS_BUCKET, nats.checkpoints), blobKeys),
          activeTurns,
          files,
          envValues,
          usage,
          webhooks,
          sandbox: sandbox!,
          node: { draining: false },
          partRemovals,
          objectChunks: {
            js: nats.js,
            jsm: nats.jsm,
            buckets: [
              { name: FILES_BUCKET, graceMs: orphanGraceMs(config.files.timeLimitMs) },
              { name: CHECKPOINTS_BUCKET, graceMs: CHECKPOINT_WRITE_GRACE_MS },
            ],
          },
        },
        { leases: nats.leases, nodes: nats.nodes },
      );
      host = actors;
      // Stopped even when its start fails part way: what it claimed by then is released, and
      // a turn it resumed meanwhile is interrupted at once (the next owner takes it over).
      opened.push(() => actors.stop(started ? undefined : 0));
      opened.push(() => {
        const waiting = partRemovals.size.waiting;
        partRemovals.close();
        if (waiting) log.info({ runs: waiting }, "stopping: deleted runs' parts still waiting for removal are left to their partition owner's check");
      });
      await actors.start();
      await builder.resumePending();
      const deliverer = new WebhookDeliverer({ store: webhooks, clock, log: log.child({ component: "webhooks" }), held: () => actors.heldPartitions(), ...config.webhooks });
      deliverer.start();
      opened.push(() => deliverer.stop());
    }

    let app: FastifyInstance | undefined;
    let url: string | undefined;
    if (config.roles.gateway) {
      const built = await buildApp({
        config,
        clock,
        ids: Ids,
        store,
        nc,
        log,
        builder,
        deployments,
        events,
        rateLimits: nats.rateLimits,
        files,
        envValues,
        usage,
        webhooks,
        actorsReady: host ? () => host.heldCount > 0 : undefined,
        commandHere: host ? (runId, command) => host.commandHere(runId, command) : undefined,
        sandboxStatus: sandbox ? () => sandbox.status() : undefined,
        turnCounts: host ? () => host.turnCounts() : undefined,
      });
      const gateway = built.app;
      app = gateway;
      opened.push(() => gateway.close());
      await gateway.listen({ port: config.port, host: config.host });
      const address = gateway.server.address();
      const port = typeof address === "object" && address ? address.port : config.port;
      url = `http://${config.host.includes(":") ? `[${config.host}]` : config.host}:${port}`;
    }
    // Opening stored events is ~3× faster with libsodium (src/secretbox-open.ts); a node that
    // could not load it still works, and says so.
    await secretboxReady;
    if (secretboxBackend() === "tweetnacl") log.warn("libsodium could not be loaded: stored events are opened with tweetnacl (same format, slower)");
    log.info({ node: config.nodeId, url, roles: config.roles, secretbox: secretboxBackend() }, "runs node started");

    started = true;
    let closing: Promise<void> | undefined;
    return {
      url,
      app,
      store,
      close() {
        closing ??= closeOpened();
        return closing;
      },
    };
  } catch (err) {
    // The caller reports the error itself (main.ts says what to do about it).
    if (opened.length) log.info("the node could not start: closing what it had opened");
    await closeOpened();
    throw err;
  }
}

/**
 * How long a starting node waits for its store to answer: a store starting beside it (a
 * compose file, a pod restarted with its database) or a busy machine (FerretDB's first
 * answer took over the driver's 3 s in a full test run) is waited for, not a failed start.
 */
export const STORE_START_WAIT_MS = 30_000;

/** The store, connected within {@link STORE_START_WAIT_MS} while it cannot be reached; any other failure at once. */
async function connectStore(config: Config, log: Logger): Promise<MongoStore> {
  const giveUpAt = Date.now() + STORE_START_WAIT_MS;
  for (let attempt = 1; ; attempt++) {
    try {
      return await MongoStore.connect(config.mongoUri!, config.mongoDb);
    } catch (err) {
      if (!isTransient(err) || Date.now() + 1_000 >= giveUpAt) throw err;
      log.warn({ err: (err as Error).message, attempt }, "the store does not answer yet; waiting for it");
      await new Promise((resolve) => setTimeout(resolve, 1_000));
    }
  }
}

/** The node's sandbox runner and its egress proxy (README "Sandbox"). */
async function startSandbox(config: Config, log: Logger): Promise<Sandbox> {
  const sandboxLog = log.child({ component: "sandbox" });
  return Sandbox.start({
    mode: config.sandbox.mode,
    bwrapPath: config.sandbox.bwrapPath,
    maxConcurrent: config.sandbox.maxConcurrent,
    processesTotal: config.sandbox.processesTotal,
    memoryTotalBytes: config.sandbox.memoryTotalBytes,
    ...(config.sandbox.limits === "rlimit" ? { cgroupRoot: false as const } : {}),
    uid: config.sandbox.uid,
    diskReserveBytes: config.sandbox.diskReserveBytes,
    runtimeDir: path.join(config.dataDir, "sandbox"),
    nodeId: config.nodeId,
    log: sandboxLog,
    egress: new EgressProxy({ log: sandboxLog, testHosts: parseTestHosts(config.sandbox.egressTestHosts) }),
  });
}
