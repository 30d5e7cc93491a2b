import test from "ava";
import os from "node:os";
import { COMMAND_ANSWER_WITHIN_MS, ConfigurationError, defaultSandboxMemoryMb, loadConfig } from "../../src/config.js";

function refusal(env: Record<string, string>): string {
  try {
    loadConfig(env);
  } catch (err) {
    if (err instanceof ConfigurationError) return err.message;
    throw err;
  }
  throw new Error(`accepted ${JSON.stringify(env)}`);
}

test("config - roles: each subset of gateway and actors, in any order and spacing", (t) => {
  t.deepEqual(loadConfig({}).roles, { gateway: true, actors: true });
  t.deepEqual(loadConfig({ RUNS_ROLES: "gateway" }).roles, { gateway: true, actors: false });
  t.deepEqual(loadConfig({ RUNS_ROLES: "actors" }).roles, { gateway: false, actors: true });
  t.deepEqual(loadConfig({ RUNS_ROLES: " actors , gateway " }).roles, { gateway: true, actors: true });
});

test("config - an unknown or empty role stops start-up naming the variable and the allowed values", (t) => {
  t.is(refusal({ RUNS_ROLES: "gatway" }), 'configuration: RUNS_ROLES: unknown role "gatway"; allowed: gateway, actors (comma-separated)');
  t.is(refusal({ RUNS_ROLES: "gateway,actor" }), 'configuration: RUNS_ROLES: unknown role "actor"; allowed: gateway, actors (comma-separated)');
  t.is(refusal({ RUNS_ROLES: "" }), "configuration: RUNS_ROLES: no role; allowed: gateway, actors (comma-separated)");
  t.is(refusal({ RUNS_ROLES: " , " }), "configuration: RUNS_ROLES: no role; allowed: gateway, actors (comma-separated)");
});

test("config - LOG_LEVEL takes pino's levels only", (t) => {
  for (const level of ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const) t.is(loadConfig({ LOG_LEVEL: level }).logLevel, level);
  t.is(loadConfig({}).logLevel, "info");
  t.is(refusal({ LOG_LEVEL: "verbose" }), 'configuration: LOG_LEVEL: "verbose" is not a log level; allowed: fatal, error, warn, info, debug, trace, silent');
  t.regex(refusal({ LOG_LEVEL: "INFO" }), /^configuration: LOG_LEVEL: "INFO" is not a log level/);
});

test("config - RUNS_EVENT_ID_VERSION: 3 by default, 2 while upgrading, anything else refused with the allowed values", (t) => {
  t.is(loadConfig({}).eventIdVersion, 3);
  t.is(loadConfig({ RUNS_EVENT_ID_VERSION: "3" }).eventIdVersion, 3);
  t.is(loadConfig({ RUNS_EVENT_ID_VERSION: "2" }).eventIdVersion, 2);
  const err = t.throws(() => loadConfig({ RUNS_EVENT_ID_VERSION: "1" }), { instanceOf: ConfigurationError });
  t.regex(err!.message, /RUNS_EVENT_ID_VERSION/);
  t.regex(err!.message, /allowed: 2, 3/);
});

test("config - RUNS_METRICS_TOKEN: unset or empty leaves /metrics public; a short token or an example file's placeholder stops start-up naming the variable", (t) => {
  t.is(loadConfig({}).metricsToken, undefined);
  t.is(loadConfig({ RUNS_METRICS_TOKEN: "" }).metricsToken, undefined);
  t.is(loadConfig({ RUNS_METRICS_TOKEN: "a".repeat(16) }).metricsToken, "a".repeat(16));
  t.regex(refusal({ RUNS_METRICS_TOKEN: "short" }), /RUNS_METRICS_TOKEN: at least 16 characters/);
  t.regex(refusal({ RUNS_METRICS_TOKEN: "change-me-change-me" }), /RUNS_METRICS_TOKEN: holds a placeholder/);
});

test("config - RUNS_USAGE_RETENTION_DAYS: 400 days by default, 0 for good, at least 32 otherwise (budgets sum the month so far)", (t) => {
  const DAY = 86_400_000;
  t.is(loadConfig({}).usageRetentionMs, 400 * DAY);
  t.is(loadConfig({ RUNS_USAGE_RETENTION_DAYS: "32" }).usageRetentionMs, 32 * DAY);
  t.is(loadConfig({ RUNS_USAGE_RETENTION_DAYS: "0" }).usageRetentionMs, 0);
  for (const value of ["31", "1", "-5", "2.5", "forever"]) {
    const err = t.throws(() => loadConfig({ RUNS_USAGE_RETENTION_DAYS: value }), { instanceOf: ConfigurationError }, value);
    t.regex(err!.message, /RUNS_USAGE_RETENTION_DAYS/, value);
  }
});

test("config - RUNS_SANDBOX_PROCESSES: 16384 by default, 64 to the kernel's largest pids.max (4194304), anything else refused naming the variable", (t) => {
  t.is(loadConfig({}).sandbox.processesTotal, 16_384);
  t.is(loadConfig({ RUNS_SANDBOX_PROCESSES: "64" }).sandbox.processesTotal, 64);
  t.is(loadConfig({ RUNS_SANDBOX_PROCESSES: "4194304" }).sandbox.processesTotal, 4_194_304);
  for (const value of ["63", "4194305", "1e21", "x", "1.5"]) {
    const err = t.throws(() => loadConfig({ RUNS_SANDBOX_PROCESSES: value }), { instanceOf: ConfigurationError });
    t.regex(err!.message, /RUNS_SANDBOX_PROCESSES/);
  }
});

test("config - RUNS_SANDBOX_MEMORY_MB: half the memory the service may use by default (the host's, or its cgroup's limit where lower; at least 256), 64 MiB to 64 TiB, anything else refused naming the variable", (t) => {
  const MiB = 2 ** 20;
  const constrained = process.constrainedMemory?.() ?? 0;
  const usable = constrained > 0 ? Math.min(os.totalmem(), constrained) : os.totalmem();
  t.is(loadConfig({}).sandbox.memoryTotalBytes, Math.max(256, Math.floor(usable / 2 / MiB)) * MiB);
  t.is(defaultSandboxMemoryMb(24 * 1024 * MiB), 12 * 1024);
  t.is(defaultSandboxMemoryMb(300 * MiB), 256);
  t.is(loadConfig({ RUNS_SANDBOX_MEMORY_MB: "64" }).sandbox.memoryTotalBytes, 64 * MiB);
  t.is(loadConfig({ RUNS_SANDBOX_MEMORY_MB: "67108864" }).sandbox.memoryTotalBytes, 2 ** 46);
  for (const value of ["63", "67108865", "x", "1.5", "-1"]) {
    const err = t.throws(() => loadConfig({ RUNS_SANDBOX_MEMORY_MB: value }), { instanceOf: ConfigurationError });
    t.regex(err!.message, /RUNS_SANDBOX_MEMORY_MB/);
  }
});

test("config - RUNS_REQUEST_BODY_TIMEOUT_MS: 60 s by default, 1 s to 1 h, anything else refused naming the variable", (t) => {
  t.is(loadConfig({}).requestBodyTimeoutMs, 60_000);
  t.is(loadConfig({ RUNS_REQUEST_BODY_TIMEOUT_MS: "1000" }).requestBodyTimeoutMs, 1_000);
  t.is(loadConfig({ RUNS_REQUEST_BODY_TIMEOUT_MS: "3600000" }).requestBodyTimeoutMs, 3_600_000);
  for (const value of ["999", "3600001", "x", "1.5"]) {
    const err = t.throws(() => loadConfig({ RUNS_REQUEST_BODY_TIMEOUT_MS: value }), { instanceOf: ConfigurationError });
    t.regex(err!.message, /RUNS_REQUEST_BODY_TIMEOUT_MS/);
  }
});

test("config - RUNS_ROUTE_RETRY_MS: 5000 by default, at most the router's whole answer bound (15000: past it the retries would be cut short), anything else refused naming the variable", (t) => {
  t.is(loadConfig({}).routeRetryMs, 5_000);
  t.is(loadConfig({ RUNS_ROUTE_RETRY_MS: "0" }).routeRetryMs, 0);
  t.is(loadConfig({ RUNS_ROUTE_RETRY_MS: String(COMMAND_ANSWER_WITHIN_MS) }).routeRetryMs, 15_000);
  for (const value of ["15001", "60000", "-1", "x"]) {
    const err = t.throws(() => loadConfig({ RUNS_ROUTE_RETRY_MS: value }), { instanceOf: ConfigurationError });
    t.regex(err!.message, /RUNS_ROUTE_RETRY_MS/);
  }
});

test("config - RUNS_SANDBOX_LIMITS: auto by default, rlimit to use rlimits where cgroups could be had, anything else refused", (t) => {
  t.is(loadConfig({}).sandbox.limits, "auto");
  t.is(loadConfig({ RUNS_SANDBOX_LIMITS: "rlimit" }).sandbox.limits, "rlimit");
  const err = t.throws(() => loadConfig({ RUNS_SANDBOX_LIMITS: "cgroup" }), { instanceOf: ConfigurationError });
  t.regex(err!.message, /RUNS_SANDBOX_LIMITS/);
});

test("config - RUNS_WAIT_STORE_CHECK_MS: 3000 by default, at least 100, anything else refused naming the variable", (t) => {
  t.is(loadConfig({}).waitStoreCheckMs, 3_000);
  t.is(loadConfig({ RUNS_WAIT_STORE_CHECK_MS: "100" }).waitStoreCheckMs, 100);
  t.is(loadConfig({ RUNS_WAIT_STORE_CHECK_MS: "60000" }).waitStoreCheckMs, 60_000);
  for (const value of ["99", "0", "-1", "1.5", "x"]) t.regex(refusal({ RUNS_WAIT_STORE_CHECK_MS: value }), /RUNS_WAIT_STORE_CHECK_MS/, value);
});
