/**
 * The one catalogue of API error codes: each code's HTTP status, error type and
 * whether retrying can succeed. A code is never renamed or reused.
 */

export const ErrorType = {
  invalid_request: "invalid_request_error",
  authentication: "authentication_error",
  permission: "permission_error",
  not_found: "not_found_error",
  request_timeout: "request_timeout_error",
  conflict: "conflict_error",
  gone: "gone_error",
  payload_too_large: "payload_too_large_error",
  rate_limit: "rate_limit_error",
  api: "api_error",
  unavailable: "unavailable_error",
} as const;
export type ErrorType = (typeof ErrorType)[keyof typeof ErrorType];

const TYPE_BY_STATUS: Record<number, ErrorType> = {
  400: ErrorType.invalid_request,
  401: ErrorType.authentication,
  403: ErrorType.permission,
  404: ErrorType.not_found,
  408: ErrorType.request_timeout,
  409: ErrorType.conflict,
  410: ErrorType.gone,
  413: ErrorType.payload_too_large,
  429: ErrorType.rate_limit,
  500: ErrorType.api,
  502: ErrorType.unavailable,
  503: ErrorType.unavailable,
};

interface CatalogueEntry {
  status: number;
  retryable: boolean;
  /** Message used when the caller gives none (fixed for run_failed_internal). */
  message: string;
}

export const ERROR_CATALOGUE = {
  invalid_request: { status: 400, retryable: false, message: "The request is invalid." },
  invalid_cursor: { status: 400, retryable: false, message: "The cursor was not issued for this resource." },
  unauthorized: { status: 401, retryable: false, message: "Missing, invalid or revoked API key." },
  permission_denied: { status: 403, retryable: false, message: "The API key lacks a required scope." },
  not_found: { status: 404, retryable: false, message: "Not found." },
  agent_not_found: { status: 404, retryable: false, message: "No such agent." },
  agent_version_not_found: { status: 404, retryable: false, message: "The agent never had this version." },
  run_not_found: { status: 404, retryable: false, message: "No such run." },
  turn_not_found: { status: 404, retryable: false, message: "No such turn in this run." },
  action_not_found: { status: 404, retryable: false, message: "No such pending or decided action in this run." },
  request_timeout: { status: 408, retryable: true, message: "The upload ran longer than allowed." },
  // Retryable while the version builds; a version that failed to build answers retryable false.
  agent_version_not_ready: { status: 409, retryable: true, message: "This agent version is not ready." },
  idempotency_conflict: {
    status: 409,
    retryable: false,
    message: "This Idempotency-Key was used for a different request.",
  },
  steering_target_ended: {
    status: 409,
    retryable: false,
    message: "The turn to steer ended before the input was stored; the input was not taken.",
  },
  run_busy: { status: 409, retryable: true, message: "The run is busy." },
  action_already_decided: { status: 409, retryable: false, message: "The action was already decided; the earlier decision stands." },
  conflict: { status: 409, retryable: false, message: "The request conflicts with the current state." },
  run_expired: { status: 410, retryable: false, message: "The run has expired and its data was deleted." },
  event_cursor_expired: {
    status: 410,
    retryable: false,
    message: "The event this cursor names is no longer retained. Read again without a cursor.",
  },
  deployment_expired: { status: 410, retryable: false, message: "The deployment expired; create a new deployment." },
  stream_cursor_expired: { status: 410, retryable: false, message: "The stream cursor is no longer retained." },
  payload_too_large: { status: 413, retryable: false, message: "The payload exceeds a supported limit." },
  rate_limited: { status: 429, retryable: true, message: "Rate limit exceeded. Retry after the delay." },
  quota_exceeded: { status: 429, retryable: false, message: "Quota exceeded." },
  run_failed_internal: {
    status: 500,
    retryable: false,
    message: "The platform reported a failure of this run. Give the reference to support.",
  },
  internal_error: { status: 500, retryable: false, message: "An internal error occurred. Give the reference to support." },
  upstream_unavailable: { status: 502, retryable: true, message: "An upstream service is unavailable." },
  runtime_unavailable: {
    status: 503,
    retryable: true,
    message: "The service is temporarily unavailable. Retry after the delay.",
  },
  upload_in_progress: { status: 503, retryable: true, message: "An upload with this Idempotency-Key is still running." },
  event_boundary_pending: {
    status: 503,
    retryable: true,
    message: "The turn's first event is not recorded yet. Retry shortly.",
  },
  event_history_unavailable: {
    status: 503,
    retryable: true,
    message: "Event history cannot be read right now. Retry shortly.",
  },
} as const satisfies Record<string, CatalogueEntry>;

export type ErrorCode = keyof typeof ERROR_CATALOGUE;

/** Codes whose message is fixed whatever the caller passes. */
const FIXED_MESSAGE: ReadonlySet<ErrorCode> = new Set(["run_failed_internal", "runtime_unavailable"]);

export interface ApiErrorOptions {
  message?: string;
  param?: string | null;
  /** Seconds for the Retry-After header. */
  retryAfterS?: number;
  reference?: string;
  /** Overrides the code's usual `retryable` where this case differs (a version that failed to build never becomes ready). */
  retryable?: boolean;
}

/** A typed API error: the only error class routes throw. */
export class ApiError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly type: ErrorType;
  readonly retryable: boolean;
  readonly param: string | null;
  readonly retryAfterS: number | undefined;
  reference: string | undefined;

  constructor(code: ErrorCode, options: ApiErrorOptions = {}) {
    const entry: CatalogueEntry = ERROR_CATALOGUE[code];
    super(FIXED_MESSAGE.has(code) ? entry.message : (options.message ?? entry.message));
    this.name = "ApiError";
    this.code = code;
    this.status = entry.status;
    this.type = errorTypeForStatus(entry.status);
    this.retryable = options.retryable ?? entry.retryable;
    this.param = options.param ?? null;
    this.retryAfterS = options.retryAfterS;
    this.reference = options.reference;
  }

  /** The spec's error body. */
  toBody(): { error: Record<string, unknown> } {
    const error: Record<string, unknown> = {
      message: this.message,
      type: this.type,
      param: this.param,
      code: this.code,
      retryable: this.retryable,
    };
    if (this.reference) error.reference = this.reference;
    return { error };
  }
}

export function errorTypeForStatus(status: number): ErrorType {
  return TYPE_BY_STATUS[status] ?? (status >= 500 ? ErrorType.api : ErrorType.invalid_request);
}

export function invalid(param: string | null, message: string): ApiError {
  return new ApiError("invalid_request", { param, message });
}

