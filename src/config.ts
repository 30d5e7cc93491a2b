import { z } from "zod";
import os from "node:os";
import path from "node:path";

const DAY_S = 86_400;
/** Processes and threads a node's sandboxes run at once, all together, by default (`RUNS_SANDBOX_PROCESSES`). */
export const DEFAULT_SANDBOX_PROCESSES = 16_384;
/**
 * MiB of memory a node's sandboxes use at once, all together, by default
 * (`RUNS_SANDBOX_MEMORY_MB`): half of what the service may use (the host's, or less where
 * its container or cgroup is limited), leaving the rest to the service, its stores and the host.
 */
export function defaultSandboxMemoryMb(totalBytes: number = memoryOfThisProcess()): number {
  return Math.max(256, Math.floor(totalBytes / 2 / 2 ** 20));
}

/** The host's memory, or the limit of this process's cgroup where lower (0 or huge: none). */
function memoryOfThisProcess(): number {
  const constrained = process.constrainedMemory?.() ?? 0;
  return constrained > 0 ? Math.min(os.totalmem(), constrained) : os.totalmem();
}

/** {@link defaultSandboxMemoryMb} in bytes. */
export function defaultSandboxMemoryBytes(): number {
  return defaultSandboxMemoryMb() * 2 ** 20;
}
const ROLES = ["gateway", "actors"] as const;
/** pino's levels. */
const LOG_LEVELS = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;

/**
 * How long the gateway's router waits for a command's answer in all (resends included)
 * before it answers 503; its retries of an absent or doubting owner (RUNS_ROUTE_RETRY_MS)
 * fit within it.
 */
export const COMMAND_ANSWER_WITHIN_MS = 15_000;

const intFromEnv = (fallback: number, min = 0, max = Number.MAX_SAFE_INTEGER) =>
  z.coerce.number().int().min(min).max(max).optional().transform((v) => v ?? fallback);

const EnvSchema = z.object({
  PORT: intFromEnv(8080, 0),
  HOST: z.string().default("127.0.0.1"),
  RUNS_DATA_DIR: z.string().default(".runs"),
  NATS_URL: z.string().optional(),
  NATS_USER: z.string().optional(),
  NATS_PASSWORD: z.string().optional(),
  MONGODB_URI: z.string().optional(),
  MONGODB_DB: z.string().default("runs"),
  RUNS_MASTER_KEY: z.string().optional(),
  RUNS_NODE_ID: z.string().optional(),
  RUNS_ROLES: z
    .string()
    .default("gateway,actors")
    .transform((value, ctx) => {
      const roles = value.split(",").map((r) => r.trim()).filter(Boolean);
      const unknown = roles.filter((r) => !(ROLES as readonly string[]).includes(r));
      if (unknown.length > 0 || roles.length === 0) {
        ctx.addIssue({ code: "custom", message: `${unknown.length > 0 ? `unknown role ${JSON.stringify(unknown[0])}` : "no role"}; allowed: ${ROLES.join(", ")} (comma-separated)` });
        return z.NEVER;
      }
      return new Set(roles);
    }),
  RUNS_PARTITIONS: intFromEnv(64, 1),
  RUNS_WAIT_TIMEOUT_MS: intFromEnv(120_000, 0),
  RUNS_WAIT_STORE_CHECK_MS: intFromEnv(3_000, 100),
  RUNS_REQUEST_BODY_TIMEOUT_MS: intFromEnv(60_000, 1_000, 3_600_000),
  RUNS_TURN_LIMIT_MS: intFromEnv(12 * 3600_000, 1),
  RUNS_LEASE_TTL_MS: intFromEnv(10_000, 1000),
  RUNS_ROUTE_RETRY_MS: intFromEnv(5_000, 0, COMMAND_ANSWER_WITHIN_MS),
  RUNS_RETENTION_SOLO_S: intFromEnv(7 * DAY_S, 1),
  RUNS_RETENTION_BUSINESS_S: intFromEnv(30 * DAY_S, 1),
  RUNS_EVENT_RETENTION_SOLO_S: intFromEnv(7 * DAY_S, 1),
  RUNS_EVENT_RETENTION_BUSINESS_S: intFromEnv(28 * DAY_S, 1),
  RUNS_FILE_RETENTION_SOLO_S: intFromEnv(7 * DAY_S, 1),
  RUNS_FILE_RETENTION_BUSINESS_S: intFromEnv(30 * DAY_S, 1),
  RUNS_SWEEP_INTERVAL_MS: intFromEnv(60_000, 100),
  // 0 keeps them for good; otherwise at least a month and a day: budgets sum the month so far.
  RUNS_USAGE_RETENTION_DAYS: z.coerce
    .number()
    .int()
    .refine((days) => days === 0 || days >= 32, "0 (keep usage records for good) or at least 32 days (budgets sum the month so far)")
    .optional()
    .transform((days) => days ?? 400),
  RUNS_AUTH_CACHE_MS: intFromEnv(2_000, 0),
  RUNS_ACTIVE_TURNS_SOLO: intFromEnv(10, 1),
  RUNS_ACTIVE_TURNS_BUSINESS: intFromEnv(200, 1),
  RUNS_TAG_SCAN_LIMIT: intFromEnv(50_000, 1),
  RUNS_DRAIN_MS: intFromEnv(30_000, 0),
  RUNS_NATS_REPLICAS: intFromEnv(1, 1),
  RUNS_EVENT_STREAM_MAX_BYTES: intFromEnv(0, 0),
  RUNS_OBJECT_STORE_MAX_BYTES: intFromEnv(0, 0),
  RUNS_MAX_FILE_BYTES: intFromEnv(512 * 1024 * 1024, 1),
  RUNS_UPLOAD_TAKEOVER_MS: intFromEnv(30_000, 1),
  RUNS_UPLOAD_TIME_LIMIT_MS: intFromEnv(20 * 60_000, 1),
  RUNS_UPLOADS_SOLO: intFromEnv(2, 1),
  RUNS_SSE_STREAMS_SOLO: intFromEnv(50, 1),
  RUNS_SSE_STREAMS_BUSINESS: intFromEnv(500, 1),
  RUNS_UPLOADS_BUSINESS: intFromEnv(10, 1),
  RUNS_RATE_WINDOW_MS: intFromEnv(60_000, 100),
  RUNS_RATE_SOLO: intFromEnv(300, 1),
  RUNS_RATE_BUSINESS: intFromEnv(3_000, 1),
  RUNS_RATE_EXPENSIVE_SOLO: intFromEnv(20, 1),
  RUNS_RATE_EXPENSIVE_BUSINESS: intFromEnv(100, 1),
  // Cancel and key revocation: not held back by the standard limit; their own, larger one.
  RUNS_RATE_EXEMPT_SOLO: intFromEnv(3_000, 1),
  RUNS_RATE_EXEMPT_BUSINESS: intFromEnv(30_000, 1),
  RUNS_EVENT_ID_VERSION: z.enum(["2", "3"], { error: (issue) => `${JSON.stringify(issue.input)} is not an event id version; allowed: 2, 3` }).default("3"),
  RUNS_SANDBOX: z.enum(["bwrap", "on", "off"]).default("bwrap"),
  RUNS_SANDBOX_BWRAP: z.string().optional(),
  RUNS_SANDBOX_LIMITS: z.enum(["auto", "rlimit"]).default("auto"),
  RUNS_SANDBOX_MAX: intFromEnv(1024, 1),
  // The kernel's largest pid_max (and pids.max).
  RUNS_SANDBOX_PROCESSES: intFromEnv(DEFAULT_SANDBOX_PROCESSES, 64, 4_194_304),
  // 64 MiB up to 64 TiB.
  RUNS_SANDBOX_MEMORY_MB: intFromEnv(defaultSandboxMemoryMb(), 64, 67_108_864),
  RUNS_SANDBOX_UID: intFromEnv(65534, 1),
  RUNS_DISK_RESERVE_MB: intFromEnv(256, 0),
  RUNS_EGRESS_TEST_HOSTS: z.string().optional(),
  RUNS_ALLOW_PRIVATE_MODEL_ENDPOINTS: z.enum(["0", "1", "true", "false"]).default("0"),
  RUNS_AMBIENT_PROVIDERS: z.string().default(""),
  RUNS_WEBHOOK_ALLOW_PRIVATE: z.enum(["0", "1", "true", "false"]).default("0"),
  RUNS_WEBHOOK_TIMEOUT_MS: intFromEnv(10_000, 100),
  RUNS_WEBHOOK_HORIZON_S: intFromEnv(86_400, 1),
  /** Multiplies the retry waits (5 s, 30 s, 2 min, …); tests shrink them. */
  RUNS_WEBHOOK_RETRY_SCALE: z.coerce.number().positive().max(100).default(1),
  RUNS_WEBHOOK_MAX_IN_FLIGHT: intFromEnv(4, 1),
  RUNS_DEV_WORKSPACE: z.enum(["", "0", "1", "true", "false"]).default(""),
  // A bearer token for /metrics; long enough that guessing it is not a way in.
  RUNS_METRICS_TOKEN: z
    .string()
    .optional()
    .refine((token) => !token || token.length >= 16, "at least 16 characters (a random secret), or empty for a public /metrics without per-workspace series")
    .transform((token) => token || undefined),
  LOG_LEVEL: z.enum(LOG_LEVELS, { error: (issue) => `${JSON.stringify(issue.input)} is not a log level; allowed: ${LOG_LEVELS.join(", ")}` }).default("info"),
});

export interface RetentionConfig {
  /** Run and turn retention after last activity, per plan, in seconds. */
  runS: { solo: number; business: number };
  /** Event retention per plan, in seconds (the JetStream max_age of the class). */
  eventS: { solo: number; business: number };
  /** Uploaded files, from their upload, per plan, in seconds (then swept with their objects). */
  fileS: { solo: number; business: number };
}

export interface Config {
  port: number;
  host: string;
  dataDir: string;
  natsUrl?: string;
  natsUser?: string;
  natsPassword?: string;
  mongoUri?: string;
  mongoDb: string;
  masterKey?: string;
  nodeId: string;
  roles: { gateway: boolean; actors: boolean };
  partitions: number;
  waitTimeoutMs: number;
  /** How long a default-wait request waits for a notice of its turn before it reads the store, and how often it reads it after that (a notice lost while NATS reconnected). */
  waitStoreCheckMs: number;
  /** How long a request's body (not an upload's) may take to arrive whole: then 408 and the connection closed. */
  requestBodyTimeoutMs: number;
  turnLimitMs: number;
  leaseTtlMs: number;
  routeRetryMs: number;
  retention: RetentionConfig;
  sweepIntervalMs: number;
  /** How long usage records are kept after their turn, in ms; 0: for good. */
  usageRetentionMs: number;
  authCacheMs: number;
  /** Active turns a workspace may run at once, per plan. */
  activeTurnLimit: { solo: number; business: number };
  /** Runs a list with only common tags may scan to fill a page. */
  tagScanLimit: number;
  /** How long a stopping node lets active turns finish before interrupting them. */
  drainMs: number;
  /** Replicas of streams and buckets (3 on a NATS cluster). */
  natsReplicas: number;
  /**
   * Byte bounds of each event stream and each object store (0: none). JetStream reserves
   * a bounded stream's bytes on the server at creation, so they are set per deployment.
   */
  storeBytes: { events: number; objects: number };
  /** File upload limits (POST /api/v1/files). */
  files: { maxFileBytes: number; takeoverMs: number; timeLimitMs: number };
  /** Concurrent uploads a workspace may run, per plan. */
  uploadConcurrency: { solo: number; business: number };
  /** Event streams (SSE) a workspace may hold open at once on one gateway node. */
  sseStreams: { solo: number; business: number };
  /** The version new event ids are written in (both are read): 2 only while upgrading from a release that reads only 2 (docs/cluster.md, "Upgrading"). */
  eventIdVersion: 2 | 3;
  /** Per-workspace request limits per window, across keys and nodes (decisions §7). */
  rateLimits: { windowMs: number; perWindow: { solo: { standard: number; expensive: number; exempt: number }; business: { standard: number; expensive: number; exempt: number } } };
  /** Tool sandboxes (README "Sandbox"). */
  sandbox: {
    /** `off` (RUNS_SANDBOX=off): commands run unconfined, for local development only. */
    mode: "bwrap" | "off";
    bwrapPath?: string;
    /** `rlimit`: limits by rlimits even where the host gives the service cgroups (`auto`: cgroups where it can). */
    limits: "auto" | "rlimit";
    /** Concurrent sandboxes per node; past it a turn fails sandbox_capacity_exceeded. */
    maxConcurrent: number;
    /** Processes and threads all sandboxes run at once (README "Configuration", docs/deploy-sandbox.md). */
    processesTotal: number;
    /** Bytes of memory all sandboxes use at once (README "Configuration", docs/deploy-sandbox.md). */
    memoryTotalBytes: number;
    /** Host uid sandboxes run as when the node runs as root (never 0). */
    uid: number;
    /** Bytes kept free on the workspaces' filesystem: commands are stopped and writes refuse below it (0: none). */
    diskReserveBytes: number;
    /** TEST ONLY: host names the egress proxy maps to loopback servers (RUNS_EGRESS_TEST_HOSTS). */
    egressTestHosts?: string;
  };
  /** Model endpoints (openai-compatible base_url) may be private or loopback addresses. */
  allowPrivateModelEndpoints: boolean;
  webhooks: {
    /** Endpoints may be private or loopback addresses (RUNS_WEBHOOK_ALLOW_PRIVATE; tests, private networks). */
    allowPrivate: boolean;
    timeoutMs: number;
    /** How long after its event a delivery is retried before it fails for good. */
    horizonMs: number;
    retryScale: number;
    /** Attempts in flight per endpoint on one node. */
    maxInFlight: number;
  };
  /**
   * Providers that authenticate with the service's own ambient credentials (AWS chain,
   * Google ADC, the operator's Azure or Cloudflare settings), enabled by the operator
   * (RUNS_AMBIENT_PROVIDERS); every tenant then uses those credentials.
   */
  ambientProviders: ReadonlySet<string>;
  /**
   * When set, /metrics answers only `Authorization: Bearer <token>`, and only then does it
   * show the per-workspace usage series (RUNS_METRICS_TOKEN); unset, /metrics is public
   * and names no workspace.
   */
  metricsToken?: string;
  /**
   * Against external servers too, an empty store gets a development workspace whose key
   * is printed (RUNS_DEV_WORKSPACE; `npm start` sets it, the image does not).
   */
  devWorkspace: boolean;
  logLevel: (typeof LOG_LEVELS)[number];
}

/** A setting is missing or wrong: `npm start` says so in one line and exits 3. */
export class ConfigurationError extends Error {
  constructor(problem: string) {
    super(`configuration: ${problem}`);
    this.name = "ConfigurationError";
  }
}

/** Values of the example files (deploy/): a service must never run with them. */
const PLACEHOLDER_SECRET = /change-me|REPLACE/i;

/** Parses the environment into a typed config; throws a readable error naming the bad variable. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const parsed = EnvSchema.safeParse(env);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new ConfigurationError(`${issue?.path.join(".")}: ${issue?.message}`);
  }
  const e = parsed.data;
  for (const name of ["NATS_PASSWORD", "RUNS_MASTER_KEY", "MONGODB_URI", "RUNS_METRICS_TOKEN"] as const) {
    if (PLACEHOLDER_SECRET.test(e[name] ?? "")) {
      throw new ConfigurationError(`${name}: holds a placeholder from an example file (change-me, REPLACE…); set a random secret`);
    }
  }
  const roles = e.RUNS_ROLES;
  return {
    port: e.PORT,
    host: e.HOST,
    dataDir: path.resolve(e.RUNS_DATA_DIR),
    natsUrl: e.NATS_URL,
    natsUser: e.NATS_USER,
    natsPassword: e.NATS_PASSWORD,
    mongoUri: e.MONGODB_URI,
    mongoDb: e.MONGODB_DB,
    masterKey: e.RUNS_MASTER_KEY,
    nodeId: e.RUNS_NODE_ID ?? `${os.hostname()}-${process.pid}`,
    roles: { gateway: roles.has("gateway"), actors: roles.has("actors") },
    partitions: e.RUNS_PARTITIONS,
    waitTimeoutMs: e.RUNS_WAIT_TIMEOUT_MS,
    waitStoreCheckMs: e.RUNS_WAIT_STORE_CHECK_MS,
    requestBodyTimeoutMs: e.RUNS_REQUEST_BODY_TIMEOUT_MS,
    turnLimitMs: e.RUNS_TURN_LIMIT_MS,
    leaseTtlMs: e.RUNS_LEASE_TTL_MS,
    routeRetryMs: e.RUNS_ROUTE_RETRY_MS,
    retention: {
      runS: { solo: e.RUNS_RETENTION_SOLO_S, business: e.RUNS_RETENTION_BUSINESS_S },
      eventS: { solo: e.RUNS_EVENT_RETENTION_SOLO_S, business: e.RUNS_EVENT_RETENTION_BUSINESS_S },
      fileS: { solo: e.RUNS_FILE_RETENTION_SOLO_S, business: e.RUNS_FILE_RETENTION_BUSINESS_S },
    },
    sweepIntervalMs: e.RUNS_SWEEP_INTERVAL_MS,
    usageRetentionMs: e.RUNS_USAGE_RETENTION_DAYS * DAY_S * 1000,
    authCacheMs: e.RUNS_AUTH_CACHE_MS,
    activeTurnLimit: { solo: e.RUNS_ACTIVE_TURNS_SOLO, business: e.RUNS_ACTIVE_TURNS_BUSINESS },
    tagScanLimit: e.RUNS_TAG_SCAN_LIMIT,
    drainMs: e.RUNS_DRAIN_MS,
    natsReplicas: e.RUNS_NATS_REPLICAS,
    storeBytes: { events: e.RUNS_EVENT_STREAM_MAX_BYTES, objects: e.RUNS_OBJECT_STORE_MAX_BYTES },
    files: { maxFileBytes: e.RUNS_MAX_FILE_BYTES, takeoverMs: e.RUNS_UPLOAD_TAKEOVER_MS, timeLimitMs: e.RUNS_UPLOAD_TIME_LIMIT_MS },
    uploadConcurrency: { solo: e.RUNS_UPLOADS_SOLO, business: e.RUNS_UPLOADS_BUSINESS },
    sseStreams: { solo: e.RUNS_SSE_STREAMS_SOLO, business: e.RUNS_SSE_STREAMS_BUSINESS },
    eventIdVersion: e.RUNS_EVENT_ID_VERSION === "2" ? 2 : 3,
    rateLimits: {
      windowMs: e.RUNS_RATE_WINDOW_MS,
      perWindow: {
        solo: { standard: e.RUNS_RATE_SOLO, expensive: e.RUNS_RATE_EXPENSIVE_SOLO, exempt: e.RUNS_RATE_EXEMPT_SOLO },
        business: { standard: e.RUNS_RATE_BUSINESS, expensive: e.RUNS_RATE_EXPENSIVE_BUSINESS, exempt: e.RUNS_RATE_EXEMPT_BUSINESS },
      },
    },
    sandbox: {
      mode: e.RUNS_SANDBOX === "off" ? "off" : "bwrap",
      bwrapPath: e.RUNS_SANDBOX_BWRAP,
      limits: e.RUNS_SANDBOX_LIMITS,
      maxConcurrent: e.RUNS_SANDBOX_MAX,
      processesTotal: e.RUNS_SANDBOX_PROCESSES,
      memoryTotalBytes: e.RUNS_SANDBOX_MEMORY_MB * 1024 * 1024,
      uid: e.RUNS_SANDBOX_UID,
      diskReserveBytes: e.RUNS_DISK_RESERVE_MB * 1024 * 1024,
      egressTestHosts: e.RUNS_EGRESS_TEST_HOSTS,
    },
    allowPrivateModelEndpoints: e.RUNS_ALLOW_PRIVATE_MODEL_ENDPOINTS === "1" || e.RUNS_ALLOW_PRIVATE_MODEL_ENDPOINTS === "true",
    webhooks: {
      allowPrivate: e.RUNS_WEBHOOK_ALLOW_PRIVATE === "1" || e.RUNS_WEBHOOK_ALLOW_PRIVATE === "true",
      timeoutMs: e.RUNS_WEBHOOK_TIMEOUT_MS,
      horizonMs: e.RUNS_WEBHOOK_HORIZON_S * 1000,
      retryScale: e.RUNS_WEBHOOK_RETRY_SCALE,
      maxInFlight: e.RUNS_WEBHOOK_MAX_IN_FLIGHT,
    },
    ambientProviders: new Set(e.RUNS_AMBIENT_PROVIDERS.split(",").map((p) => p.trim()).filter(Boolean)),
    metricsToken: e.RUNS_METRICS_TOKEN,
    devWorkspace: e.RUNS_DEV_WORKSPACE === "1" || e.RUNS_DEV_WORKSPACE === "true",
    logLevel: e.LOG_LEVEL,
  };
}
