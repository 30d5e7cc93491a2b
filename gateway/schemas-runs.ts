/** Body schemas of errors, runs, turns and events (see gateway/schema-registry.ts). */
import { z } from "zod";
import { Disposition, ErrorType, hasLoneSurrogate, jsonBody, MAX_INLINE_FILE_BYTES, MAX_TAGS, refuse, RunRequestBodySchema, RunState, TagSchema as SourceTagSchema, TURN_ERROR_CATALOGUE, TurnStatus } from "../src/index.js";
import { named, unixSeconds } from "./schema-registry.js";

// ---------------------------------------------------------------------------------
// Errors

export const ErrorBodySchema = named(
  "Error",
  z.object({
    error: z.object({
      message: z.string().describe("Explanation for people."),
      type: z.enum(Object.values(ErrorType) as [string, ...string[]]),
      param: z.string().nullable().describe("The offending parameter (body field, query parameter, path parameter or header), or null."),
      code: z.string().describe("Stable machine-readable code; see x-error-codes at the document root for the catalogue."),
      retryable: z.boolean().describe("Whether sending the same request again can succeed."),
      reference: z.string().optional().describe("Identifier (`ref_…`) to give support; logged with the same value."),
    }),
  }),
  "The error body of every 4xx and 5xx JSON answer.",
);

// ---------------------------------------------------------------------------------
// Runs and turns

export const TagSchema = named("Tag", SourceTagSchema);

export const InputTextPartSchema = named("InputTextPart", z.object({ type: z.literal("input_text"), text: z.string() }));
export const InputFileRefPartSchema = named(
  "InputFileRefPart",
  z.object({ type: z.literal("input_file"), file_id: z.string().regex(/^file_/).describe("Id of an uploaded file (POST /api/v1/files).") }),
);
export const InputFileInlinePartSchema = named(
  "InputFileInlinePart",
  z.object({
    type: z.literal("input_file"),
    filename: z.string().min(1).max(255),
    file_data: z.string().describe(`Base64 file content, at most ${MAX_INLINE_FILE_BYTES} bytes decoded (larger: 413 payload_too_large).`),
    media_type: z.string().optional(),
  }),
);
export const InputPartSchema = named(
  "InputPart",
  z.union([InputTextPartSchema, InputFileRefPartSchema, InputFileInlinePartSchema]),
  "An input part as stored with a turn (a string input is stored as one input_text part).",
);

export const OutputPartSchema = named("OutputPart", z.object({ type: z.literal("output_text"), text: z.string() }));

const turnErrorCodes = Object.keys(TURN_ERROR_CATALOGUE).join(", ");
export const TurnErrorSchema = named(
  "TurnError",
  z.object({
    code: z.string().describe(`Stable reason; new codes may be added. Known: ${turnErrorCodes}.`),
    source: z.enum(["provider", "extension", "runtime", "platform", "configuration"]),
    message: z.string(),
    retryable: z.boolean(),
    reference: z.string(),
  }),
  "Why a turn failed or stopped; stored with the turn, independent of event retention.",
);

export const UsageSchema = named(
  "Usage",
  z.object({
    input_tokens: z.int().min(0),
    output_tokens: z.int().min(0),
    cache_read_tokens: z.int().min(0),
    cache_write_tokens: z.int().min(0),
    cost_usd: z.number().min(0).nullable().describe("US dollars from the model registry's prices; null for a model without prices (faux/scripted, openai-compatible endpoints)."),
  }),
  "What model calls used: a turn's calls summed, or a run's turns summed.",
);

const turnStatus = z.enum(Object.values(TurnStatus) as [string, ...string[]]);

export const PendingActionSchema = named(
  "PendingAction",
  z.object({
    id: z.string().regex(/^act_/).describe("Decide with POST /api/v1/runs/{runId}/actions/{actionId}."),
    tool: z.string().describe("The tool the agent asked to call."),
    tool_call_id: z.string().describe("The call's id in the model's message and in the tool_execution_* events."),
    arguments: z
      .record(z.string(), z.unknown())
      .describe(
        "The call's arguments as the tool would run with them: the model's, as parsed (text that is not JSON repaired or empty), then validated against the tool's parameters, which converts a value of another type where it can (1 to \"1\" and null to \"null\" for a string, 1.5 to 1 for an integer); other keys as given. Over 64 KiB: {truncated: true, bytes, preview}. The model's message in the event log holds the call before validation (stored under the event rules: images omitted, oversized strings truncated, non-finite numbers null).",
      ),
    requested_at: unixSeconds(),
    expires_at: unixSeconds().describe("Then the deployment's config.approval.on_timeout decides (default deny)."),
  }),
  "A tool call that waits for a person's decision (config.approval): nothing of it ran.",
);

export const ActionSchema = named(
  "Action",
  z.object({
    ...PendingActionSchema.shape,
    object: z.literal("action"),
    run_id: z.string(),
    turn_id: z.string(),
    decision: z.enum(["approve", "deny"]).nullable(),
    reason: z.string().nullable().describe("The person's reason, or what the timeout said."),
    decided_by: z.enum(["person", "timeout"]).nullable(),
    decided_at: unixSeconds().nullable(),
  }),
  "A gated tool call and its decision.",
);

/** A decision's reason: anything but controls other than tab, line feed and carriage return. */
// eslint-disable-next-line no-control-regex
const REASON_PATTERN = /^[^\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]*$/;

export const ActionDecisionSchema = named(
  "ActionDecision",
  jsonBody({
    decision: z.enum(["approve", "deny"], { error: 'must be "approve" or "deny".' }),
    reason: z
      .string({ error: "must be a string." })
      .max(2_000, "must be at most 2000 characters.")
      // Free text, line breaks and tabs included; not NUL or other controls, nor a lone
      // surrogate, which the store keeps as U+FFFD while the event and the model had it raw.
      .regex(REASON_PATTERN, "must not hold control characters other than tab and line breaks.")
      .refine((text) => !hasLoneSurrogate(text), "must not hold a lone surrogate (UTF-16 half of a character).")
      .optional()
      .describe("Shown to the model with a denial; kept with the action."),
  }),
);

export const RunPendingActionSchema = named(
  "RunPendingAction",
  z.object({
    id: z.string().regex(/^act_/),
    turn_id: z.string(),
    tool: z.string(),
    expires_at: unixSeconds(),
  }),
  "What a run waits for: decide it with POST /api/v1/runs/{runId}/actions/{actionId}; the turn's pending_action has its arguments.",
);

export const TurnSchema = named(
  "Turn",
  z.object({
    id: z.string().regex(/^turn_/),
    object: z.literal("turn"),
    status: turnStatus.describe("Final statuses: completed, failed, cancelled, incomplete."),
    agent_version: z.int().min(1).describe("Deployment version that executes the turn; pinned at admission."),
    input: z.array(InputPartSchema),
    output: z.array(OutputPartSchema).describe("Empty until final, except failed and incomplete (partial output)."),
    error: TurnErrorSchema.nullable().describe("null unless status is failed or incomplete."),
    created_at: unixSeconds(),
    started_at: unixSeconds().nullable(),
    completed_at: unixSeconds().nullable(),
    duration_ms: z.int().min(0).nullable(),
    usage: UsageSchema.nullable().describe("null until the turn is final; then its model calls' usage summed."),
    pending_action: PendingActionSchema.nullable().describe("The gated tool call the in_progress turn waits for a person to decide; null otherwise."),
  }),
);

const runState = z.enum(Object.values(RunState) as [string, ...string[]]);
const runFields = {
  id: z.string().regex(/^run_/),
  object: z.literal("run"),
  agent_id: z.string().regex(/^agt_/),
  state: runState,
  tags: z.array(z.string()).describe("Sorted; empty when none."),
  created_at: unixSeconds(),
  last_activity_at: unixSeconds(),
  usage: UsageSchema.describe("The run's final turns' usage summed."),
  pending_action: RunPendingActionSchema.nullable().describe("The tool call the run's active turn waits for a person to decide (config.approval); null when none. List with pending_action=true."),
};

export const RunSchema = named(
  "Run",
  z.object({
    ...runFields,
    agent_version: z.int().min(1).describe("The selected turn's agent_version."),
    disposition: z
      .enum(Object.values(Disposition) as [string, ...string[]])
      .optional()
      .describe("Only on POST /api/v1/runs answers: created, continued, queued or steered."),
    turn: TurnSchema.describe("The selected turn (latest unless turn_id is given)."),
  }),
);

export const RunSummarySchema = named(
  "RunSummary",
  z.object({ ...runFields, agent_version: z.int().min(1).describe("The version the run's workspace is on.") }),
  "A run in a list: no turn.",
);

export const RunTagsSchema = named("RunTags", z.object({ object: z.literal("run_tags"), run_id: z.string(), tags: z.array(z.string()) }));

export const RunDeletedSchema = named("RunDeleted", z.object({ id: z.string(), object: z.literal("run.deleted"), deleted: z.literal(true) }));

export const RunRequestSchema = named("RunRequest", RunRequestBodySchema);

export const CancelRequestSchema = named(
  "CancelRequest",
  jsonBody({ turn_id: z.string({ error: "must be a turn id." }).min(1, "must be a turn id.").optional().describe("The turn to cancel; default the active turn, else the queued one.") }),
);

/** At most this many tags in one edit's list (the run's resulting list is limited to MAX_TAGS). */
const MAX_TAG_EDIT = 1000;
const tagEdit = z.array(TagSchema, { error: "must be an array of tags." }).max(MAX_TAG_EDIT, `may hold at most ${MAX_TAG_EDIT} tags.`).optional();

export const TagsRequestSchema = named(
  "TagsRequest",
  jsonBody({ add: tagEdit, remove: tagEdit })
    .superRefine((body, ctx) => {
      if (body.add === undefined && body.remove === undefined) return refuse(ctx, "add", "Give add, remove, or both.");
      const both = body.add?.find((tag) => body.remove?.includes(tag));
      if (both !== undefined) refuse(ctx, "tags", `The tag ${JSON.stringify(both)} is in both add and remove.`);
    })
    .describe(`At least one of add and remove; no tag in both. The run's resulting list holds at most ${MAX_TAGS} tags (over it: 400 param add).`),
);

// ---------------------------------------------------------------------------------
// Events

export const EventSchema = named(
  "Event",
  z.object({
    id: z.string().describe("Opaque event id (`evt_…`); also a cursor."),
    sequence: z.int().min(1).describe("Position in the run."),
    source: z.enum(["runtime", "platform"]),
    type: z.string().describe("Discriminator with source; unknown types must be accepted."),
    run_id: z.string(),
    turn_id: z.string().nullable(),
    created_at: unixSeconds(),
    data: z.unknown().describe("Type-specific; additive fields may appear. A turn's final platform event carries data.run, the final Run."),
  }),
);

export const EventHistorySchema = named(
  "EventHistory",
  z.object({
    status: z.enum(["complete", "partial", "expired", "empty"]).nullable().describe("null for a read with after."),
    retention_days: z.number().min(0).nullable().describe("How many days the run's events are kept: the retention it was created with, or its plan's where the operator lowered that since (RUNS_EVENT_RETENTION_*_S). null while the run has no event stream yet."),
  }),
);
