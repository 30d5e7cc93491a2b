import { z } from "zod";
import { BUILTIN_TOOLS, SCRIPTED_MODEL, type AgentConfig } from "./domain.js";
import { parseWith, refuse } from "./request-schemas.js";
import { destinationUrlProblem, validateAllowPattern } from "./address-guard.js";
import { ENV_NAME_PATTERN } from "./env-values.js";
import { memberCount, type Unstorable, unstorablePath } from "./json-depth.js";
import { APPROVAL_TOOLS, DEFAULT_APPROVAL_TIMEOUT_S, MAX_APPROVAL_TIMEOUT_S, PATH_TOOLS } from "./approval.js";

/** The most processes a deployment may give one command (`limits.processes`). */
export const MAX_COMMAND_PROCESSES = 4_096;

/** Bounds of `config.limits` (the sandbox's defaults are in actors/sandbox-limits.ts and the README). */
const limit = (min: number, max: number, what: string) => z.int().min(min).max(max).optional().describe(what);

const tokenCount = z.int().min(0).max(1_000_000_000);
/** What the step's model call reports as used (faux/scripted only: a way to test usage accounting). */
const ScriptUsageSchema = z.object({ input: tokenCount.optional(), output: tokenCount.optional(), cache_read: tokenCount.optional(), cache_write: tokenCount.optional() }).strict().optional();
const ScriptStepSchema = z.union([
  z.object({ text: z.string(), usage: ScriptUsageSchema }).strict(),
  z.object({ tool_call: z.object({ name: z.string().min(1), arguments: z.record(z.string(), z.unknown()) }).strict(), usage: ScriptUsageSchema }).strict(),
  z.object({ error: z.object({ message: z.string(), status: z.int().min(100).max(599).optional() }).strict(), usage: ScriptUsageSchema }).strict(),
]);

/** The members and items a scripted model's tool calls' arguments may hold, over the whole script. */
export const MAX_SCRIPT_ARGUMENT_MEMBERS = 10_000;

/** A deployment's agent configuration (decisions §3); also the OpenAPI schema. */
export const AgentConfigSchema = z
  .object({
    model: z.union([
      z
        .string()
        .regex(/^[^/\s]+\/\S+$/, "model must be <provider>/<model-id>")
        // A failed build's error quotes it, and every read of the deployment shows that.
        .max(256)
        .describe("<provider>/<model-id> from GET /api/v1/models, or faux/scripted; at most 256 characters."),
      z
        .object({
          provider: z.literal("openai-compatible"),
          base_url: z
            .url()
            .max(2_048)
            .superRefine((value, ctx) => {
              // Not a URL at all: z.url() has said so (zod runs every check).
              const problem = destinationUrlProblem(value);
              if (problem === "scheme") ctx.addIssue({ code: "custom", input: value, message: "must be an http or https URL." });
              // Deployments are readable with agents:read: a key belongs in an environment value.
              if (problem === "credentials") {
                ctx.addIssue({ code: "custom", input: value, message: "may not carry a user name or password: keep the endpoint's key in an environment value named by api_key_env." });
              }
              if (problem === "host") ctx.addIssue({ code: "custom", input: value, message: "must name a DNS name or an IP address, and a port other than 0." });
            })
            .describe("The endpoint's base address, http or https, without a user name or password, naming a DNS name or an IP address (not port 0). Private, loopback and link-local addresses are refused when a turn calls it (unless RUNS_ALLOW_PRIVATE_MODEL_ENDPOINTS)."),
          model: z.string().min(1).max(256),
          api_key_env: z
            .string()
            .regex(ENV_NAME_PATTERN, "api_key_env must be the name of an environment value")
            .optional()
            .describe("The workspace's environment value sent as the endpoint's API key. Without it no credential is sent."),
        })
        .strict(),
    ]),
    instructions: z.string().max(200_000).optional(),
    tools: z.array(z.enum(BUILTIN_TOOLS)).max(BUILTIN_TOOLS.length).optional().describe("Each at most once; all five when omitted."),
    limits: z
      .object({
        command_timeout_s: limit(1, 12 * 3600, "Wall time of one tool command. Default 300."),
        memory_mb: limit(16, 65_536, "Memory of one command's processes together. Default 512."),
        processes: limit(8, MAX_COMMAND_PROCESSES, "Processes and threads one command may run at once. Default 256."),
        cpu_s: limit(1, 12 * 3600, "CPU seconds per process. Default 600."),
        disk_mb: limit(1, 1_048_576, "Size of the run's workspace, and of any one file written. Default 1024."),
        output_kb: limit(1, 1_024, "Output a tool returns (its last KiB). Default 64."),
        tmp_mb: limit(1, 65_536, "Size of the sandbox's private /tmp, and of its /dev/shm. Default 256."),
      })
      .strict()
      .optional(),
    network: z
      .object({
        allow: z
          .array(z.string().max(253))
          .max(100)
          .describe('Hosts tool commands may reach through the egress proxy: "pypi.org", "*.githubusercontent.com". Private, loopback and link-local addresses are refused whatever a name resolves to.'),
      })
      .strict()
      .optional()
      .describe("Default: no network at all inside the sandbox."),
    script: z.array(ScriptStepSchema).max(10_000).optional().describe("Only with model faux/scripted."),
    tokens_per_second: z.number().positive().max(1_000_000).optional(),
    approval: z
      .object({
        rules: z
          .array(
            z
              .object({
                tool: z.enum(APPROVAL_TOOLS).describe('A built-in tool, or "*" for every tool.'),
                command_prefix: z.string().min(1).max(1_000).optional().describe("bash only: gate commands that start with this (leading blanks ignored). A convenience, not a security boundary."),
                path_glob: z.string().min(1).max(1_000).optional().describe("read, write, edit, ls only: gate paths (relative to the workspace) matching this glob: * within a directory, ** across directories, ? one character."),
              })
              .strict(),
          )
          .min(1)
          .max(50)
          .describe("A tool call needs a person's decision when any rule matches it."),
        timeout_s: z.int().min(1).max(MAX_APPROVAL_TIMEOUT_S).optional().describe(`Seconds a person has to decide. Default ${DEFAULT_APPROVAL_TIMEOUT_S}.`),
        on_timeout: z.enum(["approve", "deny"]).optional().describe("What expiry decides. Default deny."),
      })
      .strict()
      .optional()
      .describe("Tool calls a person approves or denies before they run. Without it no call waits."),
  })
  .strict();

/**
 * `POST /api/v1/agents/{agentId}/deployments` body; also the OpenAPI schema. Its faults
 * name their whole dotted path (`config.network.allow.0`); `script` belongs to the
 * scripted model only.
 */
export const DeploymentRequestSchema = z
  .object({
    config: AgentConfigSchema,
    upgrade_policy: z.enum(["automatic", "new_run_only"]).optional().describe("Default automatic."),
    activate: z.boolean().optional().describe("Default true: becomes active when ready."),
  })
  .strict()
  .superRefine(({ config }, ctx) => {
    if (config.model !== SCRIPTED_MODEL && config.script !== undefined) {
      return refuse(ctx, "config.script", `script is only for the ${SCRIPTED_MODEL} model.`);
    }
    // The only members of a config with names of the tenant's choosing (the store holds the config).
    let members = 0;
    for (const [i, step] of (config.script ?? []).entries()) {
      if (!("tool_call" in step)) continue;
      // Bounded in all: the request's fingerprint sorts and writes every member, and a
      // million of them (12 MB) took 8.6 s of the gateway's event loop (found by an audit).
      members += memberCount(step.tool_call.arguments, MAX_SCRIPT_ARGUMENT_MEMBERS - members);
      if (members > MAX_SCRIPT_ARGUMENT_MEMBERS) {
        return refuse(ctx, `config.script.${i}.tool_call.arguments`, `config.script: its tool calls' arguments may hold at most ${MAX_SCRIPT_ARGUMENT_MEMBERS} members and items in all.`);
      }
      const bad = unstorablePath(step.tool_call.arguments);
      if (bad) {
        const field = `config.script.${i}.tool_call.arguments`;
        const at = JSON.stringify(bad.path.join("."));
        const why: Record<Unstorable, string> = {
          key: `the key ${JSON.stringify(bad.path[bad.path.length - 1])} cannot be stored (keys may not start with "$" or hold "." or a NUL character)`,
          "nested array": `the array at ${at} is inside another array, which cannot be stored`,
          "non-finite number": `the number at ${at} is not finite, which cannot be stored`,
          depth: `the value at ${at} is nested too deep to be stored`, // not asked for: request bodies are bounded first
        };
        return refuse(ctx, field, `${field}: ${why[bad.why]}.`);
      }
    }
    for (const [i, pattern] of (config.network?.allow ?? []).entries()) {
      const problem = validateAllowPattern(pattern);
      if (problem) return refuse(ctx, `config.network.allow.${i}`, `config.network.allow.${i}: ${problem}`);
    }
    const tools = config.tools ?? [];
    if (new Set(tools).size !== tools.length) refuse(ctx, "config.tools", "Each tool may appear once.");
    for (const [i, rule] of (config.approval?.rules ?? []).entries()) {
      if (rule.command_prefix !== undefined && rule.tool !== "bash") {
        return refuse(ctx, `config.approval.rules.${i}.command_prefix`, `config.approval.rules.${i}.command_prefix: only for the bash tool.`);
      }
      if (rule.path_glob !== undefined && !(PATH_TOOLS as readonly string[]).includes(rule.tool)) {
        return refuse(ctx, `config.approval.rules.${i}.path_glob`, `config.approval.rules.${i}.path_glob: only for the ${PATH_TOOLS.join(", ")} tools.`);
      }
    }
  });

export type DeploymentRequest = { config: AgentConfig; upgrade_policy: "automatic" | "new_run_only"; activate: boolean };

/** A validated deployment request with its defaults applied. */
export function toDeploymentRequest(parsed: z.output<typeof DeploymentRequestSchema>): DeploymentRequest {
  return { config: parsed.config as AgentConfig, upgrade_policy: parsed.upgrade_policy ?? "automatic", activate: parsed.activate ?? true };
}

/** Validates a deployment request (for callers outside a route). */
export function parseDeploymentRequest(body: unknown): DeploymentRequest {
  return toDeploymentRequest(parseWith(DeploymentRequestSchema, body, "path"));
}

export const AgentCreateSchema = z
  .object({ name: z.string().min(1).max(200), description: z.string().max(2000).nullable().optional() })
  .strict();
