import { errors as natsErrors } from "@nats-io/transport-node";
import { JetStreamApiError, JetStreamError } from "@nats-io/jetstream";
import { ApiError } from "./errors.js";
import { EventWriteError } from "./event-types.js";
import { StoreUnavailableError } from "./mongo-guard.js";
import { ObjectReadUnavailableError } from "./object-read.js";

/**
 * Failures that pass once NATS, JetStream or the store are back. Callers answer them
 * 503 runtime_unavailable with Retry-After (the client retries with its
 * Idempotency-Key), never 500.
 */
export function isTransientFailure(error: unknown): boolean {
  if (error instanceof ApiError) return error.retryable;
  return (
    error instanceof StoreUnavailableError ||
    error instanceof ObjectReadUnavailableError ||
    error instanceof EventWriteError ||
    error instanceof natsErrors.TimeoutError ||
    error instanceof natsErrors.NoRespondersError ||
    error instanceof natsErrors.RequestError ||
    error instanceof natsErrors.ConnectionError ||
    error instanceof natsErrors.ClosedConnectionError ||
    error instanceof natsErrors.DrainingConnectionError ||
    error instanceof JetStreamError ||
    // JetStream's "not enabled" while a server restarts is not exported as a class.
    (error instanceof Error && error.name === "JetStreamNotEnabled") ||
    (error instanceof JetStreamApiError && error.status >= 500)
  );
}
