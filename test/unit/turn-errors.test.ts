import test from "ava";
import {
  TURN_ERROR_CATALOGUE,
  TURN_ERROR_CODES,
  TurnErrorCode,
  isTurnErrorCode,
  newReference,
  providerErrorCode,
  scriptedErrorCode,
  turnError,
} from "../../src/turn-errors.js";

/** The spec's "Turn failure codes" table: code → retryable. */
const SPEC_TABLE: Record<string, boolean> = {
  provider_authentication_failed: false,
  provider_quota_exhausted: false,
  provider_rate_limited: true,
  provider_transport_failed: true,
  provider_service_unavailable: true,
  provider_request_rejected: false,
  provider_failure: true,
  agent_execution_failed: false,
  agent_configuration_invalid: false,
  extension_execution_failed: false,
  tool_execution_failed: false,
  command_failed: false,
  command_timed_out: false,
  integration_credentials_rejected: false,
  integration_api_rejected: false,
  network_policy_denied: false,
  workspace_checkpoint_failed: true,
  event_stream_write_failed: true,
  turn_context_protocol_incomplete: false,
  worker_execution_interrupted: true,
  worker_action_interrupted: false,
  worker_unavailable: true,
  runtime_timeout: true,
  turn_duration_limit: false,
  sandbox_operation_failed: true,
  sandbox_capacity_exceeded: true,
  sandbox_not_found: false,
  sandbox_start_retries_exhausted: true,
  sandbox_snapshot_activation_failed: true,
  sandbox_snapshot_unavailable: false,
  agent_version_unavailable: false,
  runtime_dispatch_failed: true,
  concurrency_limit_reached: true,
  platform_failure: true,
};

const FIXED = [
  "worker_execution_interrupted",
  "worker_action_interrupted",
  "turn_context_protocol_incomplete",
  "turn_duration_limit",
] as const;

const SOURCES = new Set(["provider", "extension", "runtime", "platform", "configuration"]);

test("turn-errors - the catalogue holds exactly the spec table's codes", (t) => {
  t.deepEqual([...TURN_ERROR_CODES].sort(), Object.keys(SPEC_TABLE).sort());
});

test("turn-errors - each code has a source, the spec's retryable and a message", (t) => {
  for (const code of TURN_ERROR_CODES) {
    const error = turnError(code, { reference: "ref_x" });
    t.true(SOURCES.has(error.source), code);
    t.is(error.retryable, SPEC_TABLE[code], code);
    t.true(error.message.length > 0, code);
    t.is(error.code, code);
    t.is(error.reference, "ref_x");
    t.is(TurnErrorCode[code], code);
  }
});

test("turn-errors - provider codes have source provider", (t) => {
  for (const code of TURN_ERROR_CODES.filter((c) => c.startsWith("provider_"))) {
    t.is(TURN_ERROR_CATALOGUE[code].source, "provider", code);
  }
  t.is(turnError("agent_execution_failed", { reference: "r" }).source, "runtime");
  t.is(turnError("agent_configuration_invalid", { reference: "r" }).source, "configuration");
});

test("turn-errors - the four fixed-message codes ignore a given message", (t) => {
  for (const code of FIXED) {
    const error = turnError(code, { message: "something else", reference: "r" });
    t.not(error.message, "something else", code);
    t.is(error.message, TURN_ERROR_CATALOGUE[code].message);
  }
  t.is(
    turnError("worker_execution_interrupted", { reference: "r" }).message,
    "The runtime stopped before the turn finished. Retry in a few minutes.",
  );
  t.regex(turnError("turn_duration_limit", { reference: "r" }).message, /12-hour limit/);
});

test("turn-errors - other codes take the given message, else the default", (t) => {
  t.is(turnError("provider_failure", { message: "boom", reference: "r" }).message, "boom");
  t.is(
    turnError("provider_failure", { reference: "r" }).message,
    TURN_ERROR_CATALOGUE.provider_failure.message,
  );
});

test("turn-errors - providerErrorCode maps statuses", (t) => {
  t.is(providerErrorCode(401), "provider_authentication_failed");
  t.is(providerErrorCode(403), "provider_authentication_failed");
  t.is(providerErrorCode(402), "provider_quota_exhausted");
  t.is(providerErrorCode(429), "provider_rate_limited");
  for (const status of [500, 502, 503, 504, 529]) t.is(providerErrorCode(status), "provider_service_unavailable");
  for (const status of [400, 404, 413, 422]) t.is(providerErrorCode(status), "provider_request_rejected");
  for (const status of [undefined, 408, 409, 418, 200]) t.is(providerErrorCode(status), "provider_failure");
});

test("turn-errors - the scripted model's error step maps as decisions §3 says: no provider_request_rejected, anything unnamed is provider_failure", (t) => {
  t.is(scriptedErrorCode(401), "provider_authentication_failed");
  t.is(scriptedErrorCode(403), "provider_authentication_failed");
  t.is(scriptedErrorCode(402), "provider_quota_exhausted");
  t.is(scriptedErrorCode(429), "provider_rate_limited");
  for (const status of [500, 503, 599]) t.is(scriptedErrorCode(status), "provider_service_unavailable");
  for (const status of [undefined, 400, 404, 408, 413, 422, 418]) t.is(scriptedErrorCode(status), "provider_failure");
});

test("turn-errors - newReference is ref_ and 20 base62 characters, unique", (t) => {
  const refs = new Set(Array.from({ length: 200 }, () => newReference()));
  t.is(refs.size, 200);
  for (const ref of refs) t.regex(ref, /^ref_[0-9A-Za-z]{20}$/);
});

test("turn-errors - isTurnErrorCode knows the catalogue only", (t) => {
  t.true(isTurnErrorCode("provider_rate_limited"));
  t.false(isTurnErrorCode("not_a_code"));
  t.false(isTurnErrorCode("toString"));
});
