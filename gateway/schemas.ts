import { z } from "zod";
import { AgentConfigSchema as SourceAgentConfigSchema, AgentCreateSchema, DeploymentRequestSchema as SourceDeploymentRequestSchema, Disposition, ERROR_CATALOGUE, ErrorType, errorTypeForStatus, MAX_INLINE_FILE_BYTES, MAX_TAG_LENGTH, MAX_TAGS, RunState, SCOPES, TURN_ERROR_CATALOGUE, TurnStatus } from "../src/index.js";

/**
 * zod schemas of every request and response body the gateway serves, registered under
 * the names they take in the OpenAPI document's `components.schemas` (gateway/openapi.ts).
 *
 * Response schemas describe what `src/render.ts`, `src/api-keys.ts` and the route files
 * send today, field for field: they are emitted in zod's output mode, so objects carry
 * `additionalProperties: false`, and the integration test validates real answers against
 * them, which catches a renderer and this file drifting apart.
 *
 * Request schemas describe what the parsers accept. Where a parser's own zod schema is
 * exported it is reused (AgentCreateSchema, AgentConfigSchema, DeploymentRequestSchema); the
 * API key and environment value request schemas are private to their modules, so they
 * are mirrored here (test/unit/openapi-schemas.test.ts checks the mirrors against the
 * parsers).
 */
export const schemas = z.registry<{ id: string; description?: string }>();

function named<T extends z.ZodType>(id: string, schema: T, description?: string): T {
  schemas.add(schema, description === undefined ? { id } : { id, description });
  return schema;
}

const unixSeconds = () => z.int().min(0).describe("Unix seconds");

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

const TAG_PATTERN = "^(?=[\\s\\S]*\\S)[^\\u0000-\\u001F\\u007F-\\u009F\\u2028\\u2029]+$";

export const TagSchema = named(
  "Tag",
  z
    .string()
    .min(1)
    .max(MAX_TAG_LENGTH)
    .regex(new RegExp(TAG_PATTERN, "u"))
    .describe("1 to 64 characters, stored exactly as sent, case-sensitive; not whitespace-only, no control characters."),
);

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

const turnStatus = z.enum(Object.values(TurnStatus) as [string, ...string[]]);

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

export const RunRequestSchema = named(
  "RunRequest",
  z
    .object({
      agent: z.string().min(1).optional().describe("Starts a new run on this agent. Exactly one of agent and run_id (neither: 400 param agent; both: 400 param run_id)."),
      run_id: z.string().min(1).optional().describe("Continues this run."),
      version: z.int().min(1).optional().describe("Only with agent: start on exactly this deployment version without activating it."),
      input: z.union([z.string(), z.array(z.looseObject({ type: z.enum(["input_text", "input_file"]) })).min(1).max(32)]).describe(
        "A string (one input_text part) or an array of InputPart objects: input_text {text}, input_file {file_id} or inline input_file {filename, file_data, media_type?}. At most 32 parts, 4 MiB of text and 4 MiB of inline files (decoded) in all: 413 payload_too_large past those.",
      ),
      background: z.boolean().nullable().optional().describe("Answer 202 as soon as the turn is admitted."),
      stream: z.boolean().nullable().optional().describe("Answer with a Server-Sent Events stream. Not together with background (400 param stream)."),
      on_busy: z.enum(["queue", "steer", "reject"]).nullable().optional().describe("Only with run_id; default queue."),
      tags: z.array(TagSchema).optional().describe(`Only with agent; at most ${MAX_TAGS} distinct tags.`),
    })
    .strict(),
);

export const CancelRequestSchema = named(
  "CancelRequest",
  z.object({ turn_id: z.string().min(1).optional().describe("The turn to cancel; default the active turn, else the queued one.") }).strict(),
);

export const TagsRequestSchema = named(
  "TagsRequest",
  z
    .object({
      add: z.array(TagSchema).optional(),
      remove: z.array(TagSchema).optional(),
    })
    .strict()
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
    retention_days: z.number().min(0).nullable().describe("null while the run has no event stream yet."),
  }),
);

// ---------------------------------------------------------------------------------
// Agents, deployments, models

export const AgentConfigSchema = named("AgentConfig", SourceAgentConfigSchema);
export const DeploymentRequestSchema = named("DeploymentRequest", SourceDeploymentRequestSchema);

export const AgentCreateRequestSchema = named("AgentCreateRequest", AgentCreateSchema);

export const AgentSchema = named(
  "Agent",
  z.object({
    id: z.string().regex(/^agt_/),
    object: z.literal("agent"),
    name: z.string(),
    description: z.string().nullable(),
    active_version: z.int().min(1).nullable(),
    created_at: unixSeconds(),
  }),
);

export const DeploymentSchema = named(
  "Deployment",
  z.object({
    object: z.literal("deployment"),
    agent_id: z.string(),
    version: z.int().min(1),
    status: z.enum(["building", "ready", "failed"]),
    upgrade_policy: z.enum(["automatic", "new_run_only"]),
    config: AgentConfigSchema,
    error: z.object({ code: z.string(), message: z.string() }).nullable(),
    created_at: unixSeconds(),
    ready_at: unixSeconds().nullable(),
  }),
);

export const ModelSchema = named(
  "Model",
  z.object({
    object: z.literal("model"),
    id: z.string().describe("Use as config.model."),
    provider: z.string(),
    name: z.string(),
    input: z.array(z.string()),
  }),
);

// ---------------------------------------------------------------------------------
// API keys

const scope = z.enum(SCOPES);
const label = z.string().max(80).nullable();

export const ApiKeySchema = named(
  "ApiKey",
  z.object({
    id: z.uuid(),
    object: z.literal("api_key"),
    key_prefix: z.string(),
    key: z.string().optional().describe("The secret: only when the key is created or rotated."),
    label,
    scopes: z.array(z.string()).describe("Active keys hold only canonical scopes; revoked keys keep the scopes they were issued with."),
    mode: z.enum(["live", "test"]),
    created_at: unixSeconds(),
    last_used_at: unixSeconds().nullable(),
    revoked_at: unixSeconds().nullable(),
    updated_at: unixSeconds(),
    old_key_revokes_at: z.iso.datetime().optional().describe("Only on rotation: when the old key stops working."),
  }),
);

/** Mirror of gateway/routes/api-keys.ts's private CreateSchema, with the scope rules of src/scopes.ts. */
export const ApiKeyCreateRequestSchema = named(
  "ApiKeyCreateRequest",
  z
    .object({
      label: label.optional(),
      scopes: z.array(scope).min(1).max(SCOPES.length).describe("Unique; a write or reveal scope requires its read scope."),
    })
    .strict(),
);

/** Mirror of gateway/routes/api-keys.ts's private RotateSchema. */
export const ApiKeyRotateRequestSchema = named(
  "ApiKeyRotateRequest",
  z
    .object({
      label: label.optional(),
      scopes: z.array(scope).min(1).max(SCOPES.length).optional().describe("Omit to keep the current key's scopes."),
      mode: z.literal("live").optional(),
      gracePeriodSeconds: z.int().min(0).max(604_800).optional().describe("Default 86400."),
    })
    .strict(),
);

// ---------------------------------------------------------------------------------
// Files and environment values

export const FileSchema = named(
  "File",
  z.object({
    id: z.string().regex(/^file_/),
    object: z.literal("file"),
    filename: z.string(),
    media_type: z.string(),
    bytes: z.int().min(0),
    sha256: z.string().regex(/^[0-9a-f]{64}$/),
    created_at: unixSeconds(),
  }),
);

export const FileUploadRequestSchema = named(
  "FileUploadRequest",
  z
    .object({
      filename: z.string().min(1).max(255).optional().describe("Default: the file part's filename. Must come before the file part."),
      media_type: z.string().max(255).optional().describe("Default: the file part's Content-Type. Must come before the file part."),
      file: z.string().describe("The file (binary part); at most 512 MiB."),
    })
    .strict(),
  "multipart/form-data: optional fields filename and media_type, then one part named file.",
);

export const EnvValueSchema = named(
  "EnvironmentValue",
  z.object({
    object: z.literal("environment_value"),
    name: z.string(),
    value: z.string().optional().describe("Only with ?reveal=true (scope env_vars:reveal)."),
    created_at: unixSeconds(),
    updated_at: unixSeconds(),
  }),
);

/** Mirror of gateway/routes/env-values.ts's PutBodySchema with the rules of src/env-values.ts. */
export const EnvValuePutRequestSchema = named(
  "EnvironmentValuePutRequest",
  z.object({ value: z.string().describe("At most 64 KiB (UTF-8).") }).strict(),
);

export const EnvValueDeletedSchema = named(
  "EnvironmentValueDeleted",
  z.object({ name: z.string(), object: z.literal("environment_value.deleted"), deleted: z.literal(true) }),
);

// ---------------------------------------------------------------------------------
// Operations

export const HealthSchema = named("Health", z.object({ status: z.literal("ok") }));
export const ReadinessSchema = named(
  "Readiness",
  z.object({
    status: z.enum(["ready", "unavailable"]),
    nats: z.boolean(),
    store: z.boolean(),
    actors: z.boolean(),
    sandbox: z
      .object({
        mode: z.enum(["bwrap", "off"]).describe("off: RUNS_SANDBOX=off, tool commands run unconfined (local development only)."),
        limits: z.enum(["cgroup-v2", "cgroup-v1", "rlimit", "none"]).describe("How the sandboxes' resource limits are enforced."),
        uid: z.int().nullable().describe("Host uid the sandboxes run as."),
        egress: z.boolean().describe("Whether deployments with network.allow can run (socat present)."),
        running: z.int().min(0),
        max: z.int().min(1),
      })
      .optional()
      .describe("Nodes with the actor role: the tool sandbox."),
  }),
);

// ---------------------------------------------------------------------------------
// Lists

function listOf(id: string, item: z.ZodType, description: string) {
  return named(
    id,
    z.object({
      object: z.literal("list"),
      data: z.array(item),
      has_more: z.boolean(),
      next_cursor: z.string().nullable().describe("Opaque; pass as after for the next page. null when has_more is false."),
    }),
    description,
  );
}

export const RunListSchema = listOf("RunList", RunSummarySchema, "Run summaries, most recent activity first.");
export const TurnListSchema = listOf("TurnList", TurnSchema, "Turns, oldest first.");
export const AgentListSchema = listOf("AgentList", AgentSchema, "Agents.");
export const DeploymentListSchema = listOf("DeploymentList", DeploymentSchema, "Deployments of one agent.");
export const ModelListSchema = listOf("ModelList", ModelSchema, "Models of the registry plus faux/scripted.");
export const ApiKeyListSchema = listOf("ApiKeyList", ApiKeySchema, "API keys of the workspace (no secrets).");
export const EnvValueListSchema = listOf("EnvironmentValueList", EnvValueSchema, "Names and timestamps; never values.");
export const EventListSchema = named(
  "EventList",
  z.object({
    object: z.literal("list"),
    data: z.array(EventSchema),
    has_more: z.boolean(),
    next_cursor: z.string().nullable().describe("The last event's id when has_more, else null."),
    history: EventHistorySchema,
  }),
  "Retained events in run sequence order, with their history.",
);

/** Every catalogued API error code with its status, for the document's x-error-codes. */
export function errorCatalogue(): { code: string; status: number; type: string; retryable: boolean; message: string }[] {
  return Object.entries(ERROR_CATALOGUE).map(([code, entry]) => ({
    code,
    status: entry.status,
    type: errorTypeForStatus(entry.status),
    retryable: entry.retryable,
    message: entry.message,
  }));
}
