import { z } from "zod";
import os from "node:os";
import path from "node:path";

const DAY_S = 86_400;

const intFromEnv = (fallback: number, min = 0) =>
  z.coerce.number().int().min(min).optional().transform((v) => v ?? fallback);

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
  RUNS_ROLES: z.string().default("gateway,actors"),
  RUNS_PARTITIONS: intFromEnv(64, 1),
  RUNS_WAIT_TIMEOUT_MS: intFromEnv(120_000, 0),
  RUNS_TURN_LIMIT_MS: intFromEnv(12 * 3600_000, 1),
  RUNS_LEASE_TTL_MS: intFromEnv(10_000, 1000),
  RUNS_ROUTE_RETRY_MS: intFromEnv(5_000, 0),
  RUNS_RETENTION_SOLO_S: intFromEnv(7 * DAY_S, 1),
  RUNS_RETENTION_BUSINESS_S: intFromEnv(30 * DAY_S, 1),
  RUNS_EVENT_RETENTION_SOLO_S: intFromEnv(7 * DAY_S, 1),
  RUNS_EVENT_RETENTION_BUSINESS_S: intFromEnv(28 * DAY_S, 1),
  RUNS_SWEEP_INTERVAL_MS: intFromEnv(60_000, 100),
  RUNS_AUTH_CACHE_MS: intFromEnv(2_000, 0),
  RUNS_ACTIVE_TURNS_SOLO: intFromEnv(10, 1),
  RUNS_ACTIVE_TURNS_BUSINESS: intFromEnv(200, 1),
  RUNS_TAG_SCAN_LIMIT: intFromEnv(50_000, 1),
  RUNS_DRAIN_MS: intFromEnv(30_000, 0),
  RUNS_NATS_REPLICAS: intFromEnv(1, 1),
  RUNS_MAX_FILE_BYTES: intFromEnv(512 * 1024 * 1024, 1),
  RUNS_UPLOAD_TAKEOVER_MS: intFromEnv(30_000, 1),
  RUNS_UPLOAD_TIME_LIMIT_MS: intFromEnv(20 * 60_000, 1),
  RUNS_UPLOADS_SOLO: intFromEnv(2, 1),
  RUNS_UPLOADS_BUSINESS: intFromEnv(10, 1),
  RUNS_RATE_WINDOW_MS: intFromEnv(60_000, 100),
  RUNS_RATE_SOLO: intFromEnv(300, 1),
  RUNS_RATE_BUSINESS: intFromEnv(3_000, 1),
  RUNS_RATE_EXPENSIVE_SOLO: intFromEnv(20, 1),
  RUNS_RATE_EXPENSIVE_BUSINESS: intFromEnv(100, 1),
  LOG_LEVEL: z.string().default("info"),
});

export interface RetentionConfig {
  /** Run and turn retention after last activity, per plan, in seconds. */
  runS: { solo: number; business: number };
  /** Event retention per plan, in seconds (the JetStream max_age of the class). */
  eventS: { solo: number; business: number };
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
  turnLimitMs: number;
  leaseTtlMs: number;
  routeRetryMs: number;
  retention: RetentionConfig;
  sweepIntervalMs: number;
  authCacheMs: number;
  /** Active turns a workspace may run at once, per plan. */
  activeTurnLimit: { solo: number; business: number };
  /** Runs a list with only common tags may scan to fill a page. */
  tagScanLimit: number;
  /** How long a stopping node lets active turns finish before interrupting them. */
  drainMs: number;
  /** Replicas of streams and buckets (3 on a NATS cluster). */
  natsReplicas: number;
  /** File upload limits (POST /api/v1/files). */
  files: { maxFileBytes: number; takeoverMs: number; timeLimitMs: number };
  /** Concurrent uploads a workspace may run, per plan. */
  uploadConcurrency: { solo: number; business: number };
  /** Per-workspace request limits per window, across keys and nodes (decisions §7). */
  rateLimits: { windowMs: number; perWindow: { solo: { standard: number; expensive: number }; business: { standard: number; expensive: number } } };
  logLevel: string;
}

/** Parses the environment into a typed config; throws a readable error naming the bad variable. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const parsed = EnvSchema.safeParse(env);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new Error(`configuration: ${issue?.path.join(".")}: ${issue?.message}`);
  }
  const e = parsed.data;
  const roles = new Set(e.RUNS_ROLES.split(",").map((r) => r.trim()));
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
    turnLimitMs: e.RUNS_TURN_LIMIT_MS,
    leaseTtlMs: e.RUNS_LEASE_TTL_MS,
    routeRetryMs: e.RUNS_ROUTE_RETRY_MS,
    retention: {
      runS: { solo: e.RUNS_RETENTION_SOLO_S, business: e.RUNS_RETENTION_BUSINESS_S },
      eventS: { solo: e.RUNS_EVENT_RETENTION_SOLO_S, business: e.RUNS_EVENT_RETENTION_BUSINESS_S },
    },
    sweepIntervalMs: e.RUNS_SWEEP_INTERVAL_MS,
    authCacheMs: e.RUNS_AUTH_CACHE_MS,
    activeTurnLimit: { solo: e.RUNS_ACTIVE_TURNS_SOLO, business: e.RUNS_ACTIVE_TURNS_BUSINESS },
    tagScanLimit: e.RUNS_TAG_SCAN_LIMIT,
    drainMs: e.RUNS_DRAIN_MS,
    natsReplicas: e.RUNS_NATS_REPLICAS,
    files: { maxFileBytes: e.RUNS_MAX_FILE_BYTES, takeoverMs: e.RUNS_UPLOAD_TAKEOVER_MS, timeLimitMs: e.RUNS_UPLOAD_TIME_LIMIT_MS },
    uploadConcurrency: { solo: e.RUNS_UPLOADS_SOLO, business: e.RUNS_UPLOADS_BUSINESS },
    rateLimits: {
      windowMs: e.RUNS_RATE_WINDOW_MS,
      perWindow: {
        solo: { standard: e.RUNS_RATE_SOLO, expensive: e.RUNS_RATE_EXPENSIVE_SOLO },
        business: { standard: e.RUNS_RATE_BUSINESS, expensive: e.RUNS_RATE_EXPENSIVE_BUSINESS },
      },
    },
    logLevel: e.LOG_LEVEL,
  };
}
