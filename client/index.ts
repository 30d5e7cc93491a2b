/**
 * The public surface of the `runs` package: the API client, its wire types and errors, and
 * the pure schedule helpers it follows. The service itself is started with `npm start` or
 * the `runs` command; its internals are not part of this surface.
 */
export {
  RunsClient,
  RunsApiError,
  RunsWaitTimeoutError,
  isFinalEventOf,
  DEFAULT_BASE_URL,
  DEFAULT_MAX_RETRIES,
  DEFAULT_MAX_STREAM_RECONNECTS,
  type RunsClientOptions,
  type CallOptions,
  type IdempotentCallOptions,
  type WaitOptions,
  type StreamOptions,
  type StreamEventsOptions,
  type FetchLike,
} from "./client.js";
export * from "./types.js";
export { waitSchedule, waitIntervalMs, nextWaitMs, retryDelayMs, parseRetryAfter } from "./schedule.js";
export { SseParser, sseFrames, type SseFrame } from "./sse.js";
// The `runs` command's API commands (node/cli.ts adds the admin ones).
export { CLIENT_USAGE, UsageError, clientVersion, describeClientError, endQuietlyWhenReaderCloses, runCli, runClientCommand, usageOf } from "./cli.js";
export { parseArgs, type FlagSpec, type Parsed } from "./cli-args.js";
