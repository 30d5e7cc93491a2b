/**
 * The catalogue of turn error codes (spec "Turn failure codes"): for each code the
 * party at fault (`source`), whether running the turn again can succeed
 * (`retryable`) and the message used when the caller gives none. Pure: no I/O
 * apart from the randomness of {@link newReference}.
 *
 * A code is never renamed or reused. Four codes carry a fixed message that no
 * caller can override (the spec requires it): worker_execution_interrupted,
 * worker_action_interrupted, turn_context_protocol_incomplete, turn_duration_limit.
 *
 * Sources, where the table leaves them open: tools, commands and integrations are
 * the agent's extensions (`extension`); the agent loop and the worker running it are
 * the `runtime`; storage, sandboxes, scheduling and network policy are the `platform`.
 */
import type { TurnError, TurnErrorSource } from "./domain.js";
import { randomBase62 } from "./ids.js";

interface TurnErrorEntry {
  readonly source: TurnErrorSource;
  readonly retryable: boolean;
  /** Default message; the only message for entries with `fixed: true`. */
  readonly message: string;
  readonly fixed: boolean;
}

export const TURN_ERROR_CATALOGUE = {
  provider_authentication_failed: {
    source: "provider",
    retryable: false,
    message: "The model provider rejected the configured credentials.",
    fixed: false,
  },
  provider_quota_exhausted: {
    source: "provider",
    retryable: false,
    message: "The model provider account has no quota or credit left.",
    fixed: false,
  },
  provider_rate_limited: {
    source: "provider",
    retryable: true,
    message: "The model provider is rate limiting requests. Retry later.",
    fixed: false,
  },
  provider_transport_failed: {
    source: "provider",
    retryable: true,
    message: "The connection to the model provider was interrupted.",
    fixed: false,
  },
  provider_service_unavailable: {
    source: "provider",
    retryable: true,
    message: "The model provider is temporarily unavailable.",
    fixed: false,
  },
  provider_request_rejected: {
    source: "provider",
    retryable: false,
    message: "The model provider rejected the request.",
    fixed: false,
  },
  provider_failure: {
    source: "provider",
    retryable: true,
    message: "The model provider could not complete the request.",
    fixed: false,
  },
  agent_execution_failed: {
    source: "runtime",
    retryable: false,
    message: "The agent failed.",
    fixed: false,
  },
  agent_configuration_invalid: {
    source: "configuration",
    retryable: false,
    message: "The agent configuration is incomplete or invalid.",
    fixed: false,
  },
  extension_execution_failed: {
    source: "extension",
    retryable: false,
    message: "An agent extension failed.",
    fixed: false,
  },
  tool_execution_failed: {
    source: "extension",
    retryable: false,
    message: "An agent tool failed.",
    fixed: false,
  },
  command_failed: {
    source: "extension",
    retryable: false,
    message: "A tool command exited unsuccessfully.",
    fixed: false,
  },
  command_timed_out: {
    source: "extension",
    retryable: false,
    message: "A tool command exceeded its time limit.",
    fixed: false,
  },
  integration_credentials_rejected: {
    source: "extension",
    retryable: false,
    message: "An integration rejected its credentials.",
    fixed: false,
  },
  integration_api_rejected: {
    source: "extension",
    retryable: false,
    message: "An integration API rejected the request.",
    fixed: false,
  },
  network_policy_denied: {
    source: "platform",
    retryable: false,
    message: "The network policy denied the destination.",
    fixed: false,
  },
  workspace_checkpoint_failed: {
    source: "platform",
    retryable: true,
    message: "The workspace could not be saved durably.",
    fixed: false,
  },
  event_stream_write_failed: {
    source: "platform",
    retryable: true,
    message: "The result was kept, but the event stream was not fully saved.",
    fixed: false,
  },
  turn_context_protocol_incomplete: {
    source: "runtime",
    retryable: false,
    message:
      "The turn ended without a complete checkpoint, and an action may have completed. Check the workspace before sending the prompt again.",
    fixed: true,
  },
  worker_execution_interrupted: {
    source: "runtime",
    retryable: true,
    message: "The runtime stopped before the turn finished. Retry in a few minutes.",
    fixed: true,
  },
  worker_action_interrupted: {
    source: "runtime",
    retryable: false,
    message:
      "The runtime stopped during an action that may have completed. Check its result before retrying.",
    fixed: true,
  },
  worker_unavailable: {
    source: "runtime",
    retryable: true,
    message: "The runtime worker could not complete the run.",
    fixed: false,
  },
  runtime_timeout: {
    source: "runtime",
    retryable: true,
    message: "The run exceeded its allowed execution time.",
    fixed: false,
  },
  turn_duration_limit: {
    source: "runtime",
    retryable: false,
    message: "The turn reached its 12-hour limit. Send a new prompt to continue.",
    fixed: true,
  },
  sandbox_operation_failed: {
    source: "platform",
    retryable: true,
    message: "The sandbox could not be started or resumed.",
    fixed: false,
  },
  sandbox_capacity_exceeded: {
    source: "platform",
    retryable: true,
    message: "Sandbox capacity is temporarily unavailable.",
    fixed: false,
  },
  sandbox_not_found: {
    source: "platform",
    retryable: false,
    message: "The run's durable sandbox is no longer available.",
    fixed: false,
  },
  sandbox_start_retries_exhausted: {
    source: "platform",
    retryable: true,
    message: "The workspace did not start after several tries.",
    fixed: false,
  },
  sandbox_snapshot_activation_failed: {
    source: "platform",
    retryable: true,
    message: "The idle agent environment could not be reactivated.",
    fixed: false,
  },
  sandbox_snapshot_unavailable: {
    source: "platform",
    retryable: false,
    message: "The agent environment is gone. Redeploy the agent.",
    fixed: false,
  },
  agent_version_unavailable: {
    source: "configuration",
    retryable: false,
    message: "The agent version this message was sent to is gone. Nothing ran.",
    fixed: false,
  },
  runtime_dispatch_failed: {
    source: "platform",
    retryable: true,
    message: "The message could not be started. Send it again.",
    fixed: false,
  },
  concurrency_limit_reached: {
    source: "platform",
    retryable: true,
    message: "The workspace reached its limit of active turns.",
    fixed: false,
  },
  platform_failure: {
    source: "platform",
    retryable: true,
    message: "An unexpected platform failure occurred.",
    fixed: false,
  },
} as const satisfies Record<string, TurnErrorEntry>;

export type TurnErrorCode = keyof typeof TURN_ERROR_CATALOGUE;

/** Every code as a constant, so callers never repeat the string: `TurnErrorCode.provider_failure`. */
export const TurnErrorCode = Object.fromEntries(
  Object.keys(TURN_ERROR_CATALOGUE).map((code) => [code, code]),
) as { readonly [C in TurnErrorCode]: C };

export const TURN_ERROR_CODES: readonly TurnErrorCode[] = Object.keys(TURN_ERROR_CATALOGUE) as TurnErrorCode[];

export function isTurnErrorCode(code: string): code is TurnErrorCode {
  return Object.hasOwn(TURN_ERROR_CATALOGUE, code);
}

/**
 * Builds the error stored with a failed or incomplete turn. The message defaults to
 * the catalogue's; for the four fixed-message codes a given message is ignored.
 */
export function turnError(
  code: TurnErrorCode,
  options: { message?: string; reference: string; source?: TurnErrorSource },
): TurnError {
  const entry: TurnErrorEntry = TURN_ERROR_CATALOGUE[code];
  const message = entry.fixed || !options.message ? entry.message : options.message;
  // The party at fault can differ by case: a refused model endpoint is the configuration's.
  return { code, source: options.source ?? entry.source, message, retryable: entry.retryable, reference: options.reference };
}

/**
 * Maps a model provider's HTTP status to a turn error code: 401/403 authentication,
 * 402 quota, 429 rate limited, 5xx unavailable, 400/404/413/422 rejected request,
 * anything else (or no status) provider_failure.
 */
export function providerErrorCode(status: number | undefined): TurnErrorCode {
  if (status === undefined) return TurnErrorCode.provider_failure;
  if (status === 401 || status === 403) return TurnErrorCode.provider_authentication_failed;
  if (status === 402) return TurnErrorCode.provider_quota_exhausted;
  if (status === 429) return TurnErrorCode.provider_rate_limited;
  if (status >= 500 && status <= 599) return TurnErrorCode.provider_service_unavailable;
  if (status === 400 || status === 404 || status === 413 || status === 422) {
    return TurnErrorCode.provider_request_rejected;
  }
  return TurnErrorCode.provider_failure;
}

/**
 * The scripted model's `{error: {status}}` step, mapped as decisions §3 fixes it: 401/403
 * authentication, 402 quota, 429 rate limited, 5xx unavailable, anything else (a 400
 * too, which a real provider's answer maps to provider_request_rejected) provider_failure.
 */
export function scriptedErrorCode(status: number | undefined): TurnErrorCode {
  const code = providerErrorCode(status);
  return code === TurnErrorCode.provider_request_rejected ? TurnErrorCode.provider_failure : code;
}

/** A support reference: `ref_` and 20 random base62 characters (node:crypto, via ids.ts). */
export function newReference(): string {
  return `ref_${randomBase62(20)}`;
}

/** For exhaustive switches: a compile error when a case is missing, a throw if reached anyway. */
export function assertNever(value: never): never {
  throw new Error(`Unexpected value: ${JSON.stringify(value)}`);
}
