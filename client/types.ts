/**
 * Wire types of the Runs API (runs-api.md with decisions.md), as the client sees them.
 * Every object may carry fields added later; unknown event types and data fields must be
 * tolerated (runs-api.md, Versioning 3).
 */

/** A turn's status (runs-api.md, Turn status). The client stands alone, so this repeats
 * the server's list (src/domain.ts); test/unit/client-types.test.ts keeps the two equal. */
export const TurnStatus = {
  queued: "queued",
  in_progress: "in_progress",
  cancelling: "cancelling",
  completed: "completed",
  failed: "failed",
  cancelled: "cancelled",
  incomplete: "incomplete",
} as const;
export type TurnStatus = (typeof TurnStatus)[keyof typeof TurnStatus];

/** Final statuses never change (runs-api.md, Turn status). */
export function isFinalTurnStatus(status: string): boolean {
  return status === "completed" || status === "failed" || status === "cancelled" || status === "incomplete";
}

export type RunState = "idle" | "busy";
export type Disposition = "created" | "continued" | "queued" | "steered";
export type OnBusy = "queue" | "steer" | "reject";

export interface InputTextPart {
  type: "input_text";
  text: string;
}
export interface InputFilePart {
  type: "input_file";
  /** From {@link RunsClient.uploadFile}. */
  file_id?: string;
  /** Inline small file (at most 4 MiB decoded): filename with base64 file_data. */
  filename?: string;
  file_data?: string;
}
export type InputPart = InputTextPart | InputFilePart;
export type RunInput = string | InputPart[];

export interface OutputTextPart {
  type: "output_text";
  text: string;
}
/** Output parts other than text keep the shape type plus content. */
export type OutputPart = OutputTextPart | { type: string; [field: string]: unknown };

export interface TurnError {
  code: string;
  source: "provider" | "extension" | "runtime" | "platform" | "configuration" | string;
  message: string;
  retryable: boolean;
  reference?: string;
}

export interface Turn {
  id: string;
  object: "turn";
  status: TurnStatus;
  agent_version: number;
  input: InputPart[];
  output: OutputPart[];
  error: TurnError | null;
  /** Unix seconds. */
  created_at: number;
  started_at: number | null;
  completed_at: number | null;
  duration_ms: number | null;
}

export interface Run {
  id: string;
  object: "run";
  agent_id: string;
  agent_version: number;
  state: RunState;
  /** Only on the answer to a start or continue. */
  disposition?: Disposition;
  tags: string[];
  created_at: number;
  last_activity_at: number;
  /** The selected turn: latest, or the one named by turn_id. */
  turn: Turn;
}

export interface RunSummary {
  id: string;
  object: "run";
  agent_id: string;
  agent_version: number;
  state: RunState;
  tags: string[];
  created_at: number;
  last_activity_at: number;
}

export interface RunTags {
  object: "run_tags";
  run_id: string;
  tags: string[];
}

export interface RunDeleted {
  id: string;
  object: "run.deleted";
  deleted: true;
}

export interface List<T> {
  object: "list";
  data: T[];
  has_more: boolean;
  next_cursor: string | null;
}

export type HistoryStatus = "complete" | "partial" | "expired" | "empty";

export interface EventList extends List<RunEvent> {
  history: { status: HistoryStatus | null; retention_days: number | null };
}

/**
 * One event. `source` and `type` are the discriminators; consumers must accept unknown
 * types. `text_delta` carries `data.delta`; the platform event that makes a turn final
 * (`turn.completed`, `turn.failed`, `turn.cancelled`, `turn.incomplete`) carries `data.run`.
 */
export interface RunEvent {
  id: string;
  sequence: number;
  source: "runtime" | "platform" | string;
  type: string;
  run_id: string;
  turn_id: string | null;
  created_at: number;
  data: any;
}
/** Alias of {@link RunEvent}. */
export type Event = RunEvent;

export interface Agent {
  id: string;
  object: "agent";
  name: string;
  description: string | null;
  active_version: number | null;
  created_at: number;
}

export type DeploymentStatus = "building" | "ready" | "failed";
export type UpgradePolicy = "automatic" | "new_run_only";

export interface AgentConfig {
  model: string | { provider: "openai-compatible"; base_url: string; model: string; api_key_env?: string };
  instructions?: string;
  tools?: string[];
  limits?: { command_timeout_s?: number };
  script?: unknown[];
  tokens_per_second?: number;
  [field: string]: unknown;
}

export interface Deployment {
  object: "deployment";
  agent_id: string;
  version: number;
  status: DeploymentStatus;
  upgrade_policy: UpgradePolicy;
  config: AgentConfig;
  error: unknown;
  created_at: number;
  ready_at: number | null;
}

export interface Model {
  object: "model";
  id?: string;
  provider?: string;
  [field: string]: unknown;
}

export type Scope =
  | "models:read"
  | "files:read"
  | "files:write"
  | "agents:read"
  | "agents:write"
  | "run:read"
  | "run:write"
  | "env_vars:read"
  | "env_vars:write"
  | "env_vars:reveal"
  | "api_keys:manage";

export interface ApiKey {
  id: string;
  object: "api_key";
  key_prefix: string;
  /** The secret: only when a key is created or rotated. */
  key?: string;
  label: string | null;
  scopes: string[];
  mode: "live" | "test";
  created_at: number;
  last_used_at: number | null;
  revoked_at: number | null;
  updated_at: number;
  /** Only on rotation (date-time). */
  old_key_revokes_at?: string;
}

export interface EnvironmentValue {
  object: "environment_value";
  name: string;
  /** Only with reveal (scope env_vars:reveal). */
  value?: unknown;
  created_at: number;
  updated_at: number;
}

export interface EnvironmentValueDeleted {
  name: string;
  object: "environment_value.deleted";
  deleted: true;
}

export interface FileObject {
  id: string;
  object: "file";
  filename: string;
  media_type: string;
  bytes: number;
  /** Lowercase hex. */
  sha256: string;
  created_at: number;
}

export interface ErrorBody {
  error: {
    message: string;
    type: string;
    param: string | null;
    code: string;
    retryable?: boolean;
    reference?: string;
  };
}

// ---- requests ----

export interface StartRunRequest {
  agent: string;
  version?: number;
  input: RunInput;
  tags?: string[];
}
export interface ContinueRunRequest {
  run_id: string;
  input: RunInput;
  on_busy?: OnBusy;
}
/** A start (with `agent`) or a continuation (with `run_id`); delivery flags are set by the method. */
export type CreateRunRequest = StartRunRequest | ContinueRunRequest;

export interface ListRunsQuery {
  agent_id?: string;
  version?: number;
  state?: RunState;
  /** Up to 5; runs must have all. */
  tag?: string[];
  created_after?: number;
  created_before?: number;
  limit?: number;
  after?: string;
}

export interface PageQuery {
  limit?: number;
  after?: string;
}

export interface ListEventsQuery extends PageQuery {
  turn_id?: string;
}

export interface TagsUpdate {
  add?: string[];
  remove?: string[];
}

export interface CreateAgentRequest {
  name: string;
  description?: string;
}

export interface CreateDeploymentRequest {
  config: AgentConfig;
  upgrade_policy?: UpgradePolicy;
  activate?: boolean;
}

export interface CreateApiKeyRequest {
  label?: string | null;
  scopes: string[];
}

export interface RotateApiKeyRequest {
  label?: string | null;
  scopes?: string[];
  mode?: "live";
  gracePeriodSeconds?: number;
}

export interface UploadFileRequest {
  file: Blob | Uint8Array | string;
  filename?: string;
  media_type?: string;
}
