/**
 * `RunsClient`: a typed client for every endpoint of the Runs API, with the reference
 * client behaviour of runs-api.md ("Temporary failures" item 4, "Waiting for a result"):
 *
 * - 429, 502, 503 and 504 are retried twice by default (`maxRetries`), after the answer's
 *   Retry-After or, without one, a backoff. A call that takes an Idempotency-Key sends the
 *   caller's key or one `crypto.randomUUID()` per logical call, and the same key on every
 *   retry, so a retried POST returns the first result. 409 and other 4xx are never retried,
 *   nor is a 429 whose body says `retryable: false` (quota_exceeded: a spent budget).
 * - Writes without a key whose repeat is not harmless (create agent, create or rotate an
 *   API key, delete an environment value) are retried only on 429, which refuses a request
 *   before it does anything: a 5xx may come after the work was done (item 2).
 * - Streams reconnect a cut connection from the last received event id
 *   (GET …/events?stream=true with Last-Event-ID), a bounded number of times; so does a
 *   retryable `event: error` (503: the server could not go on for now). Any other error
 *   frame is thrown.
 * - {@link RunsClient.waitForTurn} polls with the recommended schedule
 *   ({@link waitSchedule}); abandoning a wait never cancels the turn.
 *
 * Time and randomness are injected (`sleep`, `random`, `now`, `fetch`) so schedules are
 * tested without waiting.
 */
import { randomUUID } from "node:crypto";
import { nextWaitMs, parseRetryAfter, retryDelayMs } from "./schedule.js";
import { sseFrames } from "./sse.js";
import {
  isFinalTurnStatus,
  type Action,
  type Agent,
  type ApiKey,
  type ContinueRunRequest,
  type CreateAgentRequest,
  type CreateApiKeyRequest,
  type CreateDeploymentRequest,
  type CreateRunRequest,
  type DecideActionRequest,
  type Deployment,
  type EnvironmentValue,
  type EnvironmentValueDeleted,
  type Budget,
  type BudgetDeleted,
  type BudgetRequest,
  type UsageQuery,
  type UsageSummary,
  type CreateWebhookRequest,
  type UpdateWebhookRequest,
  type Webhook,
  type WebhookDeleted,
  type WebhookDelivery,
  type ErrorBody,
  type EventList,
  type FileObject,
  type List,
  type ListEventsQuery,
  type ListRunsQuery,
  type Model,
  type PageQuery,
  type RotateApiKeyRequest,
  type Run,
  type RunDeleted,
  type RunEvent,
  type RunSummary,
  type RunTags,
  type StartRunRequest,
  type TagsUpdate,
  type Turn,
  type UploadFileRequest,
} from "./types.js";

export const DEFAULT_BASE_URL = "http://127.0.0.1:8080";
export const DEFAULT_MAX_RETRIES = 2;
export const DEFAULT_MAX_STREAM_RECONNECTS = 5;

/** The statuses the reference client retries (runs-api.md, Temporary failures 4). */
const RETRIED_STATUSES: ReadonlySet<number> = new Set([429, 502, 503, 504]);

/** decisions §7: error type → HTTP status, for errors that arrive inside a stream. */
const STATUS_BY_TYPE: Readonly<Record<string, number>> = {
  invalid_request_error: 400,
  authentication_error: 401,
  permission_error: 403,
  not_found_error: 404,
  request_timeout_error: 408,
  conflict_error: 409,
  gone_error: 410,
  payload_too_large_error: 413,
  rate_limit_error: 429,
  api_error: 500,
  unavailable_error: 503,
};

const FINAL_TURN_EVENT_TYPES: ReadonlySet<string> = new Set(["turn.completed", "turn.failed", "turn.cancelled", "turn.incomplete"]);

/** True for the platform event that makes `turnId` final; its `data.run` is the final Run. */
export function isFinalEventOf(event: RunEvent, turnId: string | undefined): boolean {
  return event.source === "platform" && FINAL_TURN_EVENT_TYPES.has(event.type) && (turnId === undefined || event.turn_id === turnId);
}

/** An error answer of the API (or an `event: error` frame of a stream). Branch on `code`. */
export class RunsApiError extends Error {
  override readonly name = "RunsApiError";
  /** HTTP status; for an error sent inside a stream, the status of its `type`. */
  readonly status: number;
  readonly code: string;
  readonly type: string;
  readonly param: string | null;
  readonly retryable: boolean | undefined;
  readonly reference: string | undefined;
  /** Retry-After in seconds, when the answer carried one. */
  readonly retryAfterS: number | undefined;
  /** The Idempotency-Key the failed call sent, so a caller can repeat it later. */
  readonly idempotencyKey: string | undefined;

  constructor(
    status: number,
    body: Partial<ErrorBody["error"]>,
    extra: { retryAfterS?: number; idempotencyKey?: string } = {},
  ) {
    super(body.message ?? `HTTP ${status}`);
    this.status = status;
    this.code = body.code ?? `http_${status}`;
    this.type = body.type ?? (status >= 500 ? "api_error" : "invalid_request_error");
    this.param = body.param ?? null;
    this.retryable = body.retryable;
    this.reference = body.reference;
    this.retryAfterS = extra.retryAfterS;
    this.idempotencyKey = extra.idempotencyKey;
  }
}

/** {@link RunsClient.waitForTurn} reached its `deadlineMs`; the turn goes on. */
export class RunsWaitTimeoutError extends Error {
  override readonly name = "RunsWaitTimeoutError";
  constructor(
    readonly runId: string,
    readonly turnId: string,
    /** The last answer read, if any. */
    readonly lastRun: Run | undefined,
  ) {
    super(`turn ${turnId} of run ${runId} was not final before the deadline; it keeps running`);
  }
}

export type FetchLike = (input: string, init: RequestInit) => Promise<Response>;

export interface RunsClientOptions {
  /** Service address without /api/v1 (default http://127.0.0.1:8080). */
  baseUrl?: string;
  /** Sent as `Authorization: Bearer <apiKey>`. */
  apiKey?: string;
  /** Retries of a 429/502/503/504 answer per call (default 2). */
  maxRetries?: number;
  /** Reconnects of a stream without progress before giving up (default 5). */
  maxStreamReconnects?: number;
  fetch?: FetchLike;
  /** Resolves after `ms`, rejects with the signal's reason when it aborts. */
  sleep?: (ms: number, signal?: AbortSignal) => Promise<void>;
  /** A value in [0, 1) (default Math.random). */
  random?: () => number;
  /** Milliseconds since the epoch (default Date.now); used for deadlines and HTTP-date Retry-After. */
  now?: () => number;
  /** A new Idempotency-Key (default crypto.randomUUID). */
  newIdempotencyKey?: () => string;
}

export interface CallOptions {
  signal?: AbortSignal;
  /** Overrides the client's maxRetries for this call. */
  maxRetries?: number;
}

export interface IdempotentCallOptions extends CallOptions {
  /** Reuse only to repeat the same operation; default: a new UUID per call, kept across its retries. */
  idempotencyKey?: string;
}

export interface WaitOptions {
  /** Give up (throw {@link RunsWaitTimeoutError}) after this long; default: no deadline. */
  deadlineMs?: number;
  /** Abort the wait (rejects with the signal's reason); the turn is not cancelled. */
  signal?: AbortSignal;
  /** Called with each non-final answer. */
  onPoll?: (run: Run) => void;
}

export interface StreamOptions {
  signal?: AbortSignal;
  /** Reconnects without progress before giving up (default: the client's). */
  maxReconnects?: number;
}

export interface StreamEventsOptions extends StreamOptions {
  /** Start after this event id. */
  after?: string;
  /** Only this turn's events; the stream ends after the event that makes it final. */
  turnId?: string;
}

/** How a call may be repeated after a temporary failure. */
type RetryPolicy =
  /** 429, 502, 503, 504: reads, keyed writes and writes whose repeat is harmless. */
  | "safe"
  /** 429 only: writes that may have happened before a 5xx answer. */
  | "rate_limit_only"
  /** 502, 503, 504 but not 429: the polls of waitForTurn, which handle 429 in their schedule. */
  | "not_rate_limit";

interface RequestSpec {
  method: "GET" | "POST" | "PUT" | "PATCH" | "DELETE";
  path: string;
  query?: Record<string, string | number | boolean | string[] | undefined>;
  body?: unknown;
  form?: () => FormData;
  /** Sends an Idempotency-Key (the caller's or a new one). */
  idempotent?: boolean;
  policy: RetryPolicy;
  headers?: Record<string, string>;
  accept?: string;
}

const defaultSleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });

const enc = encodeURIComponent;

export class RunsClient {
  readonly baseUrl: string;
  readonly maxRetries: number;
  readonly maxStreamReconnects: number;
  private readonly apiKey: string | undefined;
  private readonly fetchFn: FetchLike;
  private readonly sleep: (ms: number, signal?: AbortSignal) => Promise<void>;
  private readonly random: () => number;
  private readonly now: () => number;
  private readonly newKey: () => string;

  constructor(options: RunsClientOptions = {}) {
    this.baseUrl = (options.baseUrl ?? DEFAULT_BASE_URL).replace(/\/+$/, "");
    this.apiKey = options.apiKey;
    this.maxRetries = options.maxRetries ?? DEFAULT_MAX_RETRIES;
    this.maxStreamReconnects = options.maxStreamReconnects ?? DEFAULT_MAX_STREAM_RECONNECTS;
    this.fetchFn = options.fetch ?? ((input, init) => fetch(input, init));
    this.sleep = options.sleep ?? defaultSleep;
    this.random = options.random ?? Math.random;
    this.now = options.now ?? Date.now;
    this.newKey = options.newIdempotencyKey ?? randomUUID;
  }

  // ---- runs -------------------------------------------------------------------------

  /**
   * POST /api/v1/runs without stream. Default delivery: the server waits up to 120 s and
   * answers the run; if `run.turn.status` is not final then (202), the turn keeps running —
   * read it with {@link waitForTurn}. With `background` the answer comes after admission.
   * Retries reuse the Idempotency-Key, so a retried call returns the same run and turn.
   */
  createRun(request: CreateRunRequest & { background?: boolean }, options: IdempotentCallOptions = {}): Promise<Run> {
    return this.json<Run>({ method: "POST", path: "/api/v1/runs", body: request, idempotent: true, policy: "safe" }, options);
  }

  /** Starts a run on an agent (its active deployment unless `version`). See {@link createRun}. */
  startRun(request: StartRunRequest & { background?: boolean }, options: IdempotentCallOptions = {}): Promise<Run> {
    return this.createRun(request, options);
  }

  /** Continues a run (on_busy default queue). See {@link createRun}. */
  continueRun(request: ContinueRunRequest & { background?: boolean }, options: IdempotentCallOptions = {}): Promise<Run> {
    return this.createRun(request, options);
  }

  /**
   * Starts or continues and returns the run once its turn is final: the server's wait
   * first, then {@link waitForTurn} if the server answered before the turn ended.
   */
  async createRunAndWait(request: CreateRunRequest, options: IdempotentCallOptions & Omit<WaitOptions, "signal"> = {}): Promise<Run> {
    const run = await this.createRun(request, options);
    if (isFinalTurnStatus(run.turn.status)) return run;
    return this.waitForTurn(run.id, run.turn.id, options);
  }

  /**
   * POST /api/v1/runs with stream: true: the turn's events, ending after the platform event
   * that makes the turn final (its `data.run` is the final Run). A cut stream is resumed
   * from the last received event with GET …/events?stream=true&turn_id= and Last-Event-ID
   * (before the first event, by repeating the POST with the same Idempotency-Key, which
   * returns the same turn). An `event: error` frame throws {@link RunsApiError}.
   */
  streamRun(request: CreateRunRequest, options: StreamOptions & { idempotencyKey?: string } = {}): AsyncGenerator<RunEvent> {
    const idempotencyKey = options.idempotencyKey ?? this.newKey();
    const state: StreamState = { endWithTurn: true };
    return this.followStream(state, options, (lastId) => {
      if (state.turnId === undefined) {
        return this.open({ method: "POST", path: "/api/v1/runs", body: { ...request, stream: true }, idempotent: true, policy: "safe" }, { ...options, idempotencyKey });
      }
      return this.openEventStream(state.runId!, state.turnId, lastId, undefined, options);
    });
  }

  /**
   * GET /api/v1/runs/{runId}/events?stream=true. With `turnId`, that turn's events, ending
   * after its final event; without, the run's events until the caller stops iterating (or
   * the signal aborts). Reconnects from the last received event when the connection is cut
   * or the server closes it.
   */
  streamEvents(runId: string, options: StreamEventsOptions = {}): AsyncGenerator<RunEvent> {
    const state: StreamState = { endWithTurn: options.turnId !== undefined, turnId: options.turnId, runId };
    // The caller's cursor goes as `after` until an event arrives; then Last-Event-ID names it.
    return this.followStream(
      state,
      options,
      (lastId) => this.openEventStream(runId, options.turnId, lastId, lastId === undefined ? options.after : undefined, options),
      options.after,
    );
  }

  /** GET /api/v1/runs/{runId}[?turn_id=]: the run with its latest (or the named) turn. */
  getRun(runId: string, options: CallOptions & { turnId?: string } = {}): Promise<Run> {
    return this.json<Run>({ method: "GET", path: `/api/v1/runs/${enc(runId)}`, query: { turn_id: options.turnId }, policy: "safe" }, options);
  }

  /** GET /api/v1/runs: run summaries, most recent activity first. */
  listRuns(query: ListRunsQuery = {}, options: CallOptions = {}): Promise<List<RunSummary>> {
    return this.json({ method: "GET", path: "/api/v1/runs", query: { ...query }, policy: "safe" }, options);
  }

  /**
   * POST /api/v1/runs/{runId}/cancel: the active turn (or the queued one, or `turnId`).
   * An active turn answers `turn.status` cancelling; read the turn for its final status.
   */
  cancelRun(runId: string, options: IdempotentCallOptions & { turnId?: string } = {}): Promise<Run> {
    const body = options.turnId === undefined ? {} : { turn_id: options.turnId };
    return this.json({ method: "POST", path: `/api/v1/runs/${enc(runId)}/cancel`, body, idempotent: true, policy: "safe" }, options);
  }

  /**
   * POST /api/v1/runs/{runId}/actions/{actionId}: approves or denies the gated tool call an
   * in_progress turn waits for (`run.turn.pending_action`); answers the Action with its
   * decision, and the turn goes on. Retries reuse the Idempotency-Key, so a retried call
   * answers as the first time; a decision on an action decided before (by a person or by its
   * timeout) is 409 action_already_decided, never retried.
   */
  decideAction(runId: string, actionId: string, decision: DecideActionRequest, options: IdempotentCallOptions = {}): Promise<Action> {
    return this.json({ method: "POST", path: `/api/v1/runs/${enc(runId)}/actions/${enc(actionId)}`, body: decision, idempotent: true, policy: "safe" }, options);
  }

  /** DELETE /api/v1/runs/{runId}: an idle run; a busy one answers 409 run_busy. */
  deleteRun(runId: string, options: IdempotentCallOptions = {}): Promise<RunDeleted> {
    return this.json({ method: "DELETE", path: `/api/v1/runs/${enc(runId)}`, idempotent: true, policy: "safe" }, options);
  }

  /** POST /api/v1/runs/{runId}/tags: set semantics, so repeating it is harmless. */
  updateTags(runId: string, update: TagsUpdate, options: CallOptions = {}): Promise<RunTags> {
    return this.json({ method: "POST", path: `/api/v1/runs/${enc(runId)}/tags`, body: update, policy: "safe" }, options);
  }

  /** GET /api/v1/runs/{runId}/turns: turn history, oldest first. */
  listTurns(runId: string, query: PageQuery = {}, options: CallOptions = {}): Promise<List<Turn>> {
    return this.json({ method: "GET", path: `/api/v1/runs/${enc(runId)}/turns`, query: { ...query }, policy: "safe" }, options);
  }

  /** GET /api/v1/runs/{runId}/turns/{turnId}. */
  getTurn(runId: string, turnId: string, options: CallOptions = {}): Promise<Turn> {
    return this.json({ method: "GET", path: `/api/v1/runs/${enc(runId)}/turns/${enc(turnId)}`, policy: "safe" }, options);
  }

  /** GET /api/v1/runs/{runId}/events: one page of retained events with `history`. */
  listEvents(runId: string, query: ListEventsQuery = {}, options: CallOptions = {}): Promise<EventList> {
    return this.json({ method: "GET", path: `/api/v1/runs/${enc(runId)}/events`, query: { ...query }, policy: "safe" }, options);
  }

  /**
   * Reads GET /api/v1/runs/{runId}?turn_id= until the turn is final, on the recommended
   * schedule: first read after 1000 ms, each next interval 1.5× longer up to 10 s, each
   * wait lengthened at random by up to 20% and never shortened. A 429 does not end the
   * wait (the next wait is its Retry-After or the next interval, whichever is longer);
   * 502/503/504 are retried like any read; other errors end it (thrown). No deadline
   * unless `deadlineMs`. Abandoning the wait does not cancel the turn.
   */
  async waitForTurn(runId: string, turnId: string, options: WaitOptions = {}): Promise<Run> {
    const deadlineAt = options.deadlineMs === undefined ? undefined : this.now() + options.deadlineMs;
    let lastRun: Run | undefined;
    let wait = nextWaitMs(0, this.random());
    for (let attempt = 1; ; attempt++) {
      if (deadlineAt !== undefined) {
        const remaining = deadlineAt - this.now();
        if (remaining <= 0) throw new RunsWaitTimeoutError(runId, turnId, lastRun);
        wait = Math.min(wait, remaining);
      }
      await this.sleep(wait, options.signal);
      try {
        const run = await this.json<Run>(
          { method: "GET", path: `/api/v1/runs/${enc(runId)}`, query: { turn_id: turnId }, policy: "not_rate_limit" },
          { signal: options.signal },
        );
        if (isFinalTurnStatus(run.turn.status)) return run;
        lastRun = run;
        options.onPoll?.(run);
        wait = nextWaitMs(attempt, this.random());
      } catch (err) {
        if (!(err instanceof RunsApiError) || err.status !== 429) throw err;
        wait = nextWaitMs(attempt, this.random(), err.retryAfterS);
      }
    }
  }

  // ---- agents, deployments, models ----------------------------------------------------

  createAgent(request: CreateAgentRequest, options: CallOptions = {}): Promise<Agent> {
    return this.json({ method: "POST", path: "/api/v1/agents", body: request, policy: "rate_limit_only" }, options);
  }

  listAgents(query: PageQuery = {}, options: CallOptions = {}): Promise<List<Agent>> {
    return this.json({ method: "GET", path: "/api/v1/agents", query: { ...query }, policy: "safe" }, options);
  }

  getAgent(agentId: string, options: CallOptions = {}): Promise<Agent> {
    return this.json({ method: "GET", path: `/api/v1/agents/${enc(agentId)}`, policy: "safe" }, options);
  }

  /** POST /api/v1/agents/{agentId}/deployments (Idempotency-Key): `status` starts building. */
  createDeployment(agentId: string, request: CreateDeploymentRequest, options: IdempotentCallOptions = {}): Promise<Deployment> {
    return this.json({ method: "POST", path: `/api/v1/agents/${enc(agentId)}/deployments`, body: request, idempotent: true, policy: "safe" }, options);
  }

  /** An agent's deployments by version, a page at a time (`limit`, `after` = the previous page's `next_cursor`). */
  listDeployments(agentId: string, query: PageQuery = {}, options: CallOptions = {}): Promise<List<Deployment>> {
    return this.json({ method: "GET", path: `/api/v1/agents/${enc(agentId)}/deployments`, query: { ...query }, policy: "safe" }, options);
  }

  getDeployment(agentId: string, version: number, options: CallOptions = {}): Promise<Deployment> {
    return this.json({ method: "GET", path: `/api/v1/agents/${enc(agentId)}/deployments/${version}`, policy: "safe" }, options);
  }

  /** Makes `version` the agent's active deployment (when it is ready); answers the agent. */
  activateDeployment(agentId: string, version: number, options: CallOptions = {}): Promise<Agent> {
    return this.json({ method: "POST", path: `/api/v1/agents/${enc(agentId)}/deployments/${version}/activate`, policy: "safe" }, options);
  }

  /** Polls a deployment (on the waitForTurn schedule) until it is no longer building. */
  async waitForDeployment(agentId: string, version: number, options: WaitOptions & { firstWaitMs?: number } = {}): Promise<Deployment> {
    for (let attempt = 0; ; attempt++) {
      const deployment = await this.getDeployment(agentId, version, { signal: options.signal });
      if (deployment.status !== "building") return deployment;
      await this.sleep(attempt === 0 ? (options.firstWaitMs ?? 100) : nextWaitMs(attempt - 1, this.random()), options.signal);
    }
  }

  listModels(options: CallOptions = {}): Promise<List<Model>> {
    return this.json({ method: "GET", path: "/api/v1/models", policy: "safe" }, options);
  }

  // ---- API keys ----------------------------------------------------------------------

  /** POST /api/v1/api-keys (201): the answer holds the secret `key`, shown only now. */
  createApiKey(request: CreateApiKeyRequest, options: CallOptions = {}): Promise<ApiKey> {
    return this.json({ method: "POST", path: "/api/v1/api-keys", body: request, policy: "rate_limit_only" }, options);
  }

  listApiKeys(query: PageQuery = {}, options: CallOptions = {}): Promise<List<ApiKey>> {
    return this.json({ method: "GET", path: "/api/v1/api-keys", query: { ...query }, policy: "safe" }, options);
  }

  getApiKey(keyId: string, options: CallOptions = {}): Promise<ApiKey> {
    return this.json({ method: "GET", path: `/api/v1/api-keys/${enc(keyId)}`, policy: "safe" }, options);
  }

  /** Revoking twice is harmless, so it is retried like a read. */
  revokeApiKey(keyId: string, options: CallOptions = {}): Promise<ApiKey> {
    return this.json({ method: "POST", path: `/api/v1/api-keys/${enc(keyId)}/revoke`, policy: "safe" }, options);
  }

  /** A replacement key (with `key` and `old_key_revokes_at`); the old key works for the grace period (default 86400 s). */
  rotateApiKey(keyId: string, request: RotateApiKeyRequest = {}, options: CallOptions = {}): Promise<ApiKey> {
    return this.json({ method: "POST", path: `/api/v1/api-keys/${enc(keyId)}/rotate`, body: request, policy: "rate_limit_only" }, options);
  }

  // ---- environment values --------------------------------------------------------------

  putEnvironmentValue(name: string, value: unknown, options: CallOptions = {}): Promise<EnvironmentValue> {
    return this.json({ method: "PUT", path: `/api/v1/environment-values/${enc(name)}`, body: { value }, policy: "safe" }, options);
  }

  listEnvironmentValues(query: PageQuery = {}, options: CallOptions = {}): Promise<List<EnvironmentValue>> {
    return this.json({ method: "GET", path: "/api/v1/environment-values", query: { ...query }, policy: "safe" }, options);
  }

  /** `value` only with `reveal` (scope env_vars:reveal). */
  getEnvironmentValue(name: string, options: CallOptions & { reveal?: boolean } = {}): Promise<EnvironmentValue> {
    return this.json({ method: "GET", path: `/api/v1/environment-values/${enc(name)}`, query: { reveal: options.reveal || undefined }, policy: "safe" }, options);
  }

  deleteEnvironmentValue(name: string, options: CallOptions = {}): Promise<EnvironmentValueDeleted> {
    return this.json({ method: "DELETE", path: `/api/v1/environment-values/${enc(name)}`, policy: "rate_limit_only" }, options);
  }

  // ---- usage and budgets ------------------------------------------------------------

  /** Totals of the workspace's final turns in [from, to), bucketed by day (default), agent, version or model; with the budget's state. */
  getUsage(query: UsageQuery = {}, options: CallOptions = {}): Promise<UsageSummary> {
    return this.json({ method: "GET", path: "/api/v1/usage", query: { ...query }, policy: "safe" }, options);
  }

  /** The workspace's monthly budget and this month's spend; 404 not_found without one. */
  getBudget(options: CallOptions = {}): Promise<Budget> {
    return this.json({ method: "GET", path: "/api/v1/usage/budget", policy: "safe" }, options);
  }

  /** Replaces the monthly budget (scope api_keys:manage). Once spent, new turns answer 429 quota_exceeded. */
  setBudget(budget: BudgetRequest, options: CallOptions = {}): Promise<Budget> {
    return this.json({ method: "PUT", path: "/api/v1/usage/budget", body: budget, policy: "safe" }, options);
  }

  /** Removes the monthly budget (scope api_keys:manage). */
  deleteBudget(options: CallOptions = {}): Promise<BudgetDeleted> {
    return this.json({ method: "DELETE", path: "/api/v1/usage/budget", policy: "safe" }, options);
  }

  // ---- webhooks ----------------------------------------------------------------------

  /** The answer holds the signing secret (`whsec_…`), shown only now and on rotation. */
  createWebhook(request: CreateWebhookRequest, options: CallOptions = {}): Promise<Webhook> {
    return this.json({ method: "POST", path: "/api/v1/webhooks", body: request, policy: "rate_limit_only" }, options);
  }

  listWebhooks(query: PageQuery = {}, options: CallOptions = {}): Promise<List<Webhook>> {
    return this.json({ method: "GET", path: "/api/v1/webhooks", query: { ...query }, policy: "safe" }, options);
  }

  getWebhook(webhookId: string, options: CallOptions = {}): Promise<Webhook> {
    return this.json({ method: "GET", path: `/api/v1/webhooks/${enc(webhookId)}`, policy: "safe" }, options);
  }

  updateWebhook(webhookId: string, request: UpdateWebhookRequest, options: CallOptions = {}): Promise<Webhook> {
    return this.json({ method: "PATCH", path: `/api/v1/webhooks/${enc(webhookId)}`, body: request, policy: "safe" }, options);
  }

  deleteWebhook(webhookId: string, options: CallOptions = {}): Promise<WebhookDeleted> {
    return this.json({ method: "DELETE", path: `/api/v1/webhooks/${enc(webhookId)}`, policy: "rate_limit_only" }, options);
  }

  /** A new secret; the previous one still signs for 24 hours. */
  rotateWebhookSecret(webhookId: string, options: CallOptions = {}): Promise<Webhook> {
    return this.json({ method: "POST", path: `/api/v1/webhooks/${enc(webhookId)}/rotate-secret`, policy: "rate_limit_only" }, options);
  }

  /** Sends a `webhook.test` event; follow it with {@link getWebhookDelivery}. */
  testWebhook(webhookId: string, options: CallOptions = {}): Promise<WebhookDelivery> {
    return this.json({ method: "POST", path: `/api/v1/webhooks/${enc(webhookId)}/test`, policy: "rate_limit_only" }, options);
  }

  listWebhookDeliveries(webhookId: string, query: PageQuery = {}, options: CallOptions = {}): Promise<List<WebhookDelivery>> {
    return this.json({ method: "GET", path: `/api/v1/webhooks/${enc(webhookId)}/deliveries`, query: { ...query }, policy: "safe" }, options);
  }

  /** One delivery with every attempt (`attempt_log`). */
  getWebhookDelivery(webhookId: string, deliveryId: string, options: CallOptions = {}): Promise<WebhookDelivery> {
    return this.json({ method: "GET", path: `/api/v1/webhooks/${enc(webhookId)}/deliveries/${enc(deliveryId)}`, policy: "safe" }, options);
  }

  /** The same message (webhook-id and body) delivered again. */
  redeliverWebhook(webhookId: string, deliveryId: string, options: CallOptions = {}): Promise<WebhookDelivery> {
    return this.json({ method: "POST", path: `/api/v1/webhooks/${enc(webhookId)}/deliveries/${enc(deliveryId)}/redeliver`, policy: "rate_limit_only" }, options);
  }

  // ---- files -------------------------------------------------------------------------

  /**
   * POST /api/v1/files (multipart, Idempotency-Key). A repeat with the same key after a
   * finished upload returns the file; 503 upload_in_progress is retried like any 503.
   */
  uploadFile(request: UploadFileRequest, options: IdempotentCallOptions = {}): Promise<FileObject> {
    const form = () => {
      const data = new FormData();
      // The service reads the fields before the file part.
      if (request.filename !== undefined) data.append("filename", request.filename);
      if (request.media_type !== undefined) data.append("media_type", request.media_type);
      const file = request.file;
      const blob = file instanceof Blob ? file : new Blob([typeof file === "string" ? file : new Uint8Array(file)]);
      data.append("file", blob, request.filename ?? "file");
      return data;
    };
    return this.json({ method: "POST", path: "/api/v1/files", form, idempotent: true, policy: "safe" }, options);
  }

  getFile(fileId: string, options: CallOptions = {}): Promise<FileObject> {
    return this.json({ method: "GET", path: `/api/v1/files/${enc(fileId)}`, policy: "safe" }, options);
  }

  // ---- pagination --------------------------------------------------------------------

  /** Every item of a cursor-paged list: `page(after)` fetches one page. */
  async *paginate<T>(page: (after: string | undefined) => Promise<List<T>>): AsyncGenerator<T> {
    let after: string | undefined;
    for (;;) {
      const list = await page(after);
      yield* list.data;
      if (!list.has_more || !list.next_cursor) return;
      after = list.next_cursor;
    }
  }

  // ---- transport ---------------------------------------------------------------------

  private async json<T>(spec: RequestSpec, options: IdempotentCallOptions): Promise<T> {
    const res = await this.open(spec, options);
    const text = await res.text();
    return (text ? JSON.parse(text) : undefined) as T;
  }

  /** Sends a request with the retry policy; resolves with a 2xx response, else throws. */
  private async open(spec: RequestSpec, options: IdempotentCallOptions): Promise<Response> {
    const idempotencyKey = spec.idempotent ? (options.idempotencyKey ?? this.newKey()) : undefined;
    const maxRetries = options.maxRetries ?? this.maxRetries;
    const url = this.url(spec.path, spec.query);
    for (let retry = 0; ; retry++) {
      const headers: Record<string, string> = { accept: spec.accept ?? "application/json", ...spec.headers };
      if (this.apiKey) headers.authorization = `Bearer ${this.apiKey}`;
      if (idempotencyKey !== undefined) headers["idempotency-key"] = idempotencyKey;
      let body: BodyInit | undefined;
      if (spec.form) body = spec.form();
      else if (spec.body !== undefined) {
        body = JSON.stringify(spec.body);
        headers["content-type"] = "application/json";
      }
      let res: Response;
      try {
        res = await this.fetchFn(url, { method: spec.method, headers, body, signal: options.signal });
      } catch (err) {
        // No answer at all (connection refused or reset): like a 502 for the retry policy.
        if (options.signal?.aborted || retry >= maxRetries || spec.policy === "rate_limit_only") throw err;
        await this.sleep(retryDelayMs(retry, this.random()), options.signal);
        continue;
      }
      if (res.ok) return res;
      const error = await this.errorOf(res, idempotencyKey);
      // A 429 that says it is not retryable (quota_exceeded: a spent budget, whose
      // Retry-After is the month's end) is the caller's to handle, not to sleep through.
      const refused = res.status === 429 && error.retryable === false;
      if (retry < maxRetries && !refused && retries(spec.policy, res.status)) {
        await this.sleep(retryDelayMs(retry, this.random(), error.retryAfterS), options.signal);
        continue;
      }
      throw error;
    }
  }

  private async errorOf(res: Response, idempotencyKey: string | undefined): Promise<RunsApiError> {
    const retryAfterS = parseRetryAfter(res.headers.get("retry-after"), this.now());
    let body: Partial<ErrorBody["error"]> = {};
    const text = await res.text().catch(() => "");
    try {
      const parsed = JSON.parse(text) as Partial<ErrorBody>;
      if (parsed && typeof parsed.error === "object" && parsed.error) body = parsed.error;
    } catch {
      // Not our error body (a proxy's page): keep the status.
      if (text) body = { message: `HTTP ${res.status}: ${text.slice(0, 200)}` };
    }
    return new RunsApiError(res.status, body, { retryAfterS, idempotencyKey });
  }

  private openEventStream(runId: string, turnId: string | undefined, lastId: string | undefined, after: string | undefined, options: CallOptions): Promise<Response> {
    return this.open(
      {
        method: "GET",
        path: `/api/v1/runs/${enc(runId)}/events`,
        query: { stream: true, turn_id: turnId, after },
        headers: lastId === undefined ? undefined : { "last-event-id": lastId },
        accept: "text/event-stream",
        policy: "safe",
      },
      options,
    );
  }

  /**
   * Yields the events of `connect(lastId)` and reconnects after a cut (body read failed),
   * a retryable `event: error`, or a close without the awaited final event. A reconnect of a turn stream that closes
   * at once without any event means the server has nothing left of the turn (it ended
   * before the last received event). Gives up after `maxReconnects` reconnects in a row
   * that brought no event: a cut is rethrown, a close ends the iteration.
   */
  private async *followStream(
    state: StreamState,
    options: StreamOptions,
    connect: (lastId: string | undefined) => Promise<Response>,
    initialLastId?: string,
  ): AsyncGenerator<RunEvent> {
    const maxReconnects = options.maxReconnects ?? this.maxStreamReconnects;
    let lastId: string | undefined;
    let failures = 0;
    for (let connection = 0; ; connection++) {
      const res = await connect(lastId);
      // 204: a resumed turn stream whose turn ended with the last event received; nothing more comes.
      if (res.status === 204) return;
      let received = 0;
      let cut: unknown;
      try {
        if (!res.body) throw new Error("the stream answer has no body");
        for await (const frame of sseFrames(res.body as unknown as AsyncIterable<Uint8Array>)) {
          if (frame.event === "error") throw streamError(frame.data);
          if (frame.data === "") continue;
          const event = JSON.parse(frame.data) as RunEvent;
          lastId = frame.id ?? event.id;
          received++;
          if (state.turnId === undefined && event.turn_id) {
            state.turnId = event.turn_id;
            state.runId = event.run_id;
          }
          yield event;
          if (state.endWithTurn && isFinalEventOf(event, state.turnId)) return;
        }
      } catch (err) {
        if ((err instanceof RunsApiError && err.retryable !== true) || options.signal?.aborted) throw err;
        cut = err;
      }
      if (state.endWithTurn && cut === undefined && received === 0 && (connection > 0 || initialLastId !== undefined)) return;
      failures = received > 0 ? 1 : failures + 1;
      if (failures > maxReconnects) {
        if (cut !== undefined) throw cut;
        return;
      }
      await this.sleep(retryDelayMs(failures - 1, this.random()), options.signal);
    }
  }

  private url(path: string, query: RequestSpec["query"]): string {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(query ?? {})) {
      if (value === undefined) continue;
      if (Array.isArray(value)) for (const item of value) params.append(name, item);
      else params.append(name, String(value));
    }
    const search = params.toString();
    return `${this.baseUrl}${path}${search ? `?${search}` : ""}`;
  }
}

interface StreamState {
  /** Stop after the final event of `turnId` (learned from the first event for streamRun). */
  endWithTurn: boolean;
  turnId?: string;
  runId?: string;
}

function retries(policy: RetryPolicy, status: number): boolean {
  if (!RETRIED_STATUSES.has(status)) return false;
  if (policy === "rate_limit_only") return status === 429;
  if (policy === "not_rate_limit") return status !== 429;
  return true;
}

function streamError(data: string): RunsApiError {
  let body: Partial<ErrorBody["error"]> = { message: data };
  try {
    const parsed = JSON.parse(data) as Partial<ErrorBody>;
    if (parsed?.error) body = parsed.error;
  } catch {
    // keep the raw text as the message
  }
  return new RunsApiError(STATUS_BY_TYPE[body.type ?? ""] ?? 0, body);
}
