/** Body schemas of agents, deployments, models, API keys, files, environment values and the operations routes (see gateway/schema-registry.ts). */
import { z } from "zod";
import { AgentConfigSchema as SourceAgentConfigSchema, AgentCreateSchema, DeploymentRequestSchema as SourceDeploymentRequestSchema, destinationUrlProblem, jsonBody, refuse, SCOPES, scopeListProblem, WEBHOOK_EVENT_TYPES, WEBHOOK_WILDCARD } from "../src/index.js";
import { named, unixSeconds } from "./schema-registry.js";
import { UsageSchema } from "./schemas-runs.js";

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

/** Scopes a key is given: canonical, unique, a write or reveal scope with its read scope (src/scopes.ts). */
const scopeList = z
  .array(scope, { error: "must be an array of scopes." })
  .superRefine((scopes, ctx) => {
    const problem = scopeListProblem(scopes);
    if (problem) refuse(ctx, "scopes", problem);
  })
  .meta({ minItems: 1, maxItems: SCOPES.length });

export const ApiKeyCreateRequestSchema = named(
  "ApiKeyCreateRequest",
  jsonBody({
    label: label.optional(),
    scopes: scopeList.describe("Unique; a write or reveal scope requires its read scope."),
    mode: z.literal("live", { error: "Keys are live keys; mode may only be live." }).optional(),
  }),
);

/** The most a rotated key's predecessor keeps working (decisions §2). */
export const MAX_GRACE_PERIOD_S = 604_800;

export const ApiKeyRotateRequestSchema = named(
  "ApiKeyRotateRequest",
  jsonBody({
    label: label.optional(),
    scopes: scopeList.optional().describe("Omit to keep the current key's scopes."),
    mode: z.literal("live", { error: "Rotation always issues a live key; mode may only be live." }).optional(),
    gracePeriodSeconds: z.int().min(0).max(MAX_GRACE_PERIOD_S).optional().describe("Default 86400."),
  }),
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

/** Its size (at most 64 KiB) is checked where it is stored (src/env-values.ts). */
export const EnvValuePutRequestSchema = named(
  "EnvironmentValuePutRequest",
  jsonBody({ value: z.string({ error: (issue) => (issue.input === undefined ? "is required." : "must be a string.") }).describe("At most 64 KiB (UTF-8), without control characters (a tab is allowed): a value is sent as a provider credential in an HTTP header.") }),
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
        cpu: z
          .enum(["cgroup", "nice", "none"])
          .describe("How the sandboxes' CPU is kept from the service's: their CPU cgroups (one core each, all together weighing as the service), nice 19 (no CPU cgroup), or not at all (neither; or off)."),
        seccomp: z
          .boolean()
          .describe("Whether a seccomp filter refuses commands the system calls no tool needs (key rings, BPF, userfaultfd, perf events, io_uring; without a memory cgroup also System V IPC and memfd). false: off, or an architecture other than x86-64 and arm64."),
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
// Usage and budgets

const usageFields = {
  input_tokens: z.int().min(0),
  output_tokens: z.int().min(0),
  cache_read_tokens: z.int().min(0),
  cache_write_tokens: z.int().min(0),
  cost_usd: z.number().min(0).nullable().describe("US dollars; null when no turn in the bucket ran on a priced model."),
  turns: z.int().min(0).describe("Final turns that used a model."),
};

export const UsageBucketSchema = named(
  "UsageBucket",
  z.object({
    day: z.string().optional().describe("group_by=day: the UTC day, YYYY-MM-DD."),
    agent_id: z.string().optional().describe("group_by=agent or version."),
    agent_version: z.int().min(1).optional().describe("group_by=version."),
    model: z.string().optional().describe("group_by=model: the deployment's model (openai-compatible/<model> for an endpoint)."),
    ...usageFields,
  }),
  "One bucket of a usage summary: its key, and the usage of the turns in it.",
);

export const BudgetSchema = named(
  "Budget",
  z.object({
    object: z.literal("usage.budget"),
    monthly_cost_usd: z.number().positive().nullable(),
    monthly_tokens: z.int().positive().nullable().describe("Counts input, output, cache read and cache write tokens."),
    period_start: unixSeconds().describe("Start of the current UTC calendar month."),
    period_end: unixSeconds(),
    spent: UsageSchema.describe("This month's usage so far."),
    exhausted: z.enum(["cost", "tokens"]).nullable().describe("The limit that is spent: new turns are refused with 429 quota_exceeded until the next month or a higher budget. null while within budget."),
    updated_at: unixSeconds(),
  }),
  "A workspace's monthly budget and this month's spend (UTC months). Another node learns of a spend within 5 s, of a changed budget within 2 s.",
);

export const UsageSummarySchema = named(
  "UsageSummary",
  z.object({
    object: z.literal("usage"),
    from: unixSeconds(),
    to: unixSeconds(),
    group_by: z.enum(["day", "agent", "version", "model"]),
    total: z.object(usageFields),
    data: z.array(UsageBucketSchema).describe("group_by=day: by day ascending; otherwise the largest cost first, then tokens."),
    budget: BudgetSchema.nullable().describe("null when the workspace has no budget."),
  }),
  "A workspace's usage in [from, to), from a ledger written as turns become final (deleted and expired runs still count; records are kept for RUNS_USAGE_RETENTION_DAYS, 400 days by default, so a range further back counts less).",
);

export const BudgetRequestSchema = named(
  "BudgetRequest",
  jsonBody({
    monthly_cost_usd: z.number({ error: "must be a number of US dollars, or null." }).positive("must be above 0.").max(1e9, "must be at most 1e9.").nullable().optional().describe("US dollars per UTC month; null or absent: no cost limit."),
    monthly_tokens: z.int({ error: "must be a whole number of tokens, or null." }).positive("must be above 0.").max(Number.MAX_SAFE_INTEGER).nullable().optional().describe("Tokens per UTC month (input, output, cache read and cache write); null or absent: no token limit."),
  }).superRefine((body, ctx) => {
    if (body.monthly_cost_usd == null && body.monthly_tokens == null) refuse(ctx, null, "Give monthly_cost_usd, monthly_tokens or both; to remove the budget, DELETE it.");
  }),
  "Replaces the workspace's monthly budget.",
);

export const BudgetDeletedSchema = named(
  "BudgetDeleted",
  z.object({ object: z.literal("usage.budget.deleted"), deleted: z.literal(true) }),
);

// ---------------------------------------------------------------------------------
// Webhooks

const webhookEventType = z.enum([...WEBHOOK_EVENT_TYPES, WEBHOOK_WILDCARD] as [string, ...string[]], { error: `must be one of ${[...WEBHOOK_EVENT_TYPES, WEBHOOK_WILDCARD].join(", ")}.` });
const webhookUrl = z
  .string({ error: "must be an http or https URL." })
  .max(2048, "must be at most 2048 characters.")
  .superRefine((value, ctx) => {
    const problem = destinationUrlProblem(value);
    if (problem === "credentials") refuse(ctx, "url", "url must not hold credentials; verify deliveries with the webhook's secret.");
    else if (problem === "host") refuse(ctx, "url", "url must name a DNS name or an IP address, and a port other than 0.");
    else if (problem === "scheme") refuse(ctx, "url", "url must be an http or https URL.");
    else if (problem) refuse(ctx, "url", "url must be a valid absolute URL (its host or port could not be read).");
  })
  .describe("Where deliveries are POSTed: http or https, without credentials, naming a DNS name or an IP address (not port 0). Private, loopback, link-local and metadata addresses are refused unless the operator allows them (RUNS_WEBHOOK_ALLOW_PRIVATE).");
const eventTypes = z.array(webhookEventType, { error: "must be an array of event types." }).min(1, "must name at least one event type.").max(WEBHOOK_EVENT_TYPES.length + 1);
const description = z.string().max(500, "must be at most 500 characters.").nullable();

export const WebhookSchema = named(
  "Webhook",
  z.object({
    id: z.string().regex(/^wh_/),
    object: z.literal("webhook"),
    url: z.string(),
    description,
    event_types: z.array(z.string()).describe(`Event types delivered; "*" for all of ${WEBHOOK_EVENT_TYPES.join(", ")}.`),
    agent_id: z.string().nullable().describe("Only runs of this agent; null for all."),
    enabled: z.boolean(),
    disabled_reason: z.string().nullable().describe("Why delivery stopped on its own (the endpoint answered 410 Gone); enabling clears it."),
    secret: z.string().optional().describe("whsec_…: only when the webhook is created or its secret rotated. Verify deliveries with any Standard Webhooks library."),
    created_at: unixSeconds(),
    updated_at: unixSeconds(),
  }),
  "An endpoint that receives signed deliveries (Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature).",
);

export const WebhookCreateRequestSchema = named(
  "WebhookCreateRequest",
  jsonBody({
    url: webhookUrl,
    event_types: eventTypes,
    agent_id: z.string().min(1).max(100).nullable().optional(),
    description: description.optional(),
    enabled: z.boolean({ error: "must be true or false." }).optional(),
  }),
);

export const WebhookUpdateRequestSchema = named(
  "WebhookUpdateRequest",
  jsonBody({
    url: webhookUrl.optional(),
    event_types: eventTypes.optional(),
    agent_id: z.string().min(1).max(100).nullable().optional(),
    description: description.optional(),
    enabled: z.boolean({ error: "must be true or false." }).optional(),
  }),
);

export const WebhookDeletedSchema = named("WebhookDeleted", z.object({ id: z.string(), object: z.literal("webhook.deleted"), deleted: z.literal(true) }));

const attempt = z.object({
  n: z.int().min(1),
  at: unixSeconds(),
  status_code: z.int().nullable().describe("The endpoint's HTTP status; null when none came (refused address, connection failure, timeout)."),
  latency_ms: z.int().min(0).nullable(),
  error: z.string().nullable(),
});

export const WebhookDeliverySchema = named(
  "WebhookDelivery",
  z.object({
    id: z.string(),
    object: z.literal("webhook.delivery"),
    webhook_id: z.string(),
    message_id: z.string().describe("The webhook-id header: the same on every attempt and redelivery (deduplicate with it)."),
    event_type: z.string(),
    run_id: z.string().nullable(),
    status: z.enum(["pending", "delivered", "failed"]),
    attempts: z.int().min(0),
    next_attempt_at: unixSeconds().nullable().describe("While pending."),
    last_attempt: attempt.nullable(),
    attempt_log: z.array(attempt).optional().describe("Every attempt, when one delivery is retrieved."),
    created_at: unixSeconds(),
    completed_at: unixSeconds().nullable(),
  }),
  "One event's delivery to one endpoint: retried with exponential backoff and jitter until delivered (2xx), the endpoint answers 410 Gone, or the horizon (default 24 h) passes.",
);
