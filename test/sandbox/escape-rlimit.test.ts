/**
 * Every escape attempt of escape.test.ts again, with the sandbox's limits by rlimits
 * (`RUNS_SANDBOX_LIMITS=rlimit`): what a node gets where the host gives it no cgroups,
 * as in containers by default (docs/deploy-sandbox.md).
 */
process.env.RUNS_TEST_SANDBOX_LIMITS = "rlimit";
await import("./escape.test.js");
