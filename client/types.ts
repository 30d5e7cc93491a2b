/**
 * Wire types of the Runs API (runs-api.md with decisions.md), as the client sees them.
 * Every object may carry fields added later; unknown event types and data fields must be
 * tolerated (runs-api.md, Versioning 3).
 */

import type { components, operations } from "./wire.js";

/** The document's schemas, generated into wire.ts (`npm run gen:client`): the one source of these types. */
type Schemas = components["schemas"];

/** A turn's status (runs-api.md, Turn status). */
export type TurnStatus = Schemas["Turn"]["status"];
/** The statuses as values; the compiler holds them to the document's list, no more and no fewer. */
export const TurnStatus = {
  queued: "queued",
  in_progress: "in_progress",
  cancelling: "cancelling",
  completed: "completed",
  failed: "failed",
  cancelled: "cancelled",
  incomplete: "incomplete",
} as const satisfies { [S in TurnStatus]: S };

/** Final statuses never change (runs-api.md, Turn status). */
export function isFinalTurnStatus(status: string): boolean {
  return status === "completed" || status === "failed" || status === "cancelled" || status === "incomplete";
}

export type RunState = Schemas["Run"]["state"];
export type Disposition = NonNullable<Schemas["Run"]["disposition"]>;
export type OnBusy = NonNullable<Schemas["RunRequest"]["on_busy"]>;

export type InputTextPart = Schemas["InputTextPart"];
export type InputFilePart = Schemas["InputFileRefPart"] | Schemas["InputFileInlinePart"];
export type InputPart = Schemas["InputPart"];
export type RunInput = Schemas["RunRequest"]["input"];
export type OutputPart = Schemas["OutputPart"];
export type OutputTextPart = OutputPart;
export type TurnError = Schemas["TurnError"];
export type Turn = Schemas["Turn"];
export type Run = Schemas["Run"];
export type RunSummary = Schemas["RunSummary"];
export type RunTags = Schemas["RunTags"];
export type RunDeleted = Schemas["RunDeleted"];
/** The gated tool call an in_progress turn waits for a person to decide (`turn.pending_action`). */
export type PendingAction = Schemas["PendingAction"];
/** A gated tool call with its decision: the answer of {@link RunsClient.decideAction}. */
export type Action = Schemas["Action"];
/** What a person decides: "approve" runs the call, "deny" gives the model the tool's error with the reason. */
export type ActionDecision = Schemas["ActionDecision"]["decision"];
/** The body of {@link RunsClient.decideAction}: `reason` (at most 2000 characters) is kept with the action and shown to the model with a denial. */
export type DecideActionRequest = Schemas["ActionDecision"];

/** A page of a list: the shape every list answer has (here the runs list's), with its items. */
export type List<T> = Omit<operations["listRuns"]["responses"][200]["content"]["application/json"], "data"> & { data: T[] };

export type HistoryStatus = NonNullable<Schemas["EventHistory"]["status"]>;

/**
 * One event. `source` and `type` are the discriminators; consumers must accept unknown
 * types. `text_delta` carries `data.delta`; the platform event that makes a turn final
 * (`turn.completed`, `turn.failed`, `turn.cancelled`, `turn.incomplete`) carries `data.run`.
 * The document types `data` as unknown (it is type-specific); here it may be read by field.
 */
export type RunEvent = Omit<Schemas["Event"], "data"> & { data: any };
/** Alias of {@link RunEvent}. */
export type Event = RunEvent;

export type EventList = List<RunEvent> & { history: Schemas["EventHistory"] };

export type Agent = Schemas["Agent"];
export type DeploymentStatus = Schemas["Deployment"]["status"];
export type UpgradePolicy = Schemas["Deployment"]["upgrade_policy"];
export type AgentConfig = Schemas["AgentConfig"];
export type Deployment = Schemas["Deployment"];
export type Model = Schemas["Model"];
export type Scope = Schemas["ApiKey"]["scopes"][number];
export type ApiKey = Schemas["ApiKey"];
export type EnvironmentValue = Schemas["EnvironmentValue"];
export type EnvironmentValueDeleted = Schemas["EnvironmentValueDeleted"];
export type FileObject = Schemas["File"];
export type Usage = Schemas["Usage"];
export type UsageSummary = Schemas["UsageSummary"];
export type UsageBucket = Schemas["UsageBucket"];
export type UsageGroup = Schemas["UsageSummary"]["group_by"];
export type Budget = Schemas["Budget"];
export type BudgetDeleted = Schemas["BudgetDeleted"];
export type Webhook = Schemas["Webhook"];
export type WebhookDeleted = Schemas["WebhookDeleted"];
export type WebhookDelivery = Schemas["WebhookDelivery"];
export type WebhookEventType = Schemas["WebhookCreateRequest"]["event_types"][number];
export type ErrorBody = Schemas["Error"];

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
  /** true: runs whose active turn waits for a person's decision; false: the others. */
  pending_action?: boolean;
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

export interface UsageQuery {
  /** Unix seconds, inclusive; default the start of the current UTC month. */
  from?: number;
  /** Unix seconds, exclusive; default now. */
  to?: number;
  group_by?: UsageGroup;
}

export interface BudgetRequest {
  monthly_cost_usd?: number | null;
  monthly_tokens?: number | null;
}

export interface CreateWebhookRequest {
  url: string;
  /** Event types, or "*" for every one. */
  event_types: WebhookEventType[];
  /** Only runs of this agent. */
  agent_id?: string | null;
  description?: string | null;
  enabled?: boolean;
}

export type UpdateWebhookRequest = Partial<CreateWebhookRequest>;

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
