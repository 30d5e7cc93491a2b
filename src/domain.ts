/**
 * The domain vocabulary every role shares: statuses, parts, turn errors and the
 * agent configuration. Pure types and constants, no I/O.
 */

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

export const FINAL_TURN_STATUSES: ReadonlySet<TurnStatus> = new Set([
  TurnStatus.completed,
  TurnStatus.failed,
  TurnStatus.cancelled,
  TurnStatus.incomplete,
]);

export function isFinalStatus(status: TurnStatus): boolean {
  return FINAL_TURN_STATUSES.has(status);
}

export const RunState = { idle: "idle", busy: "busy" } as const;
export type RunState = (typeof RunState)[keyof typeof RunState];

/**
 * Whether a run is past its retention (runs-api.md: then 410 run_expired, and swept). A
 * busy run is not while its turn can still be at work: its progress restarts the clock, a
 * silent one (a long command, a wait for a decision) is still working, and its end
 * restarts the clock. No turn outlasts the turn limit (`turnLimitMs`), so a run busy a
 * minute past its retention and that limit is one no turn will settle (its recovery
 * keeps failing): it expires then.
 */
export function runExpired(run: { state: RunState; expires_at: number }, nowMs: number, turnLimitMs: number): boolean {
  return run.expires_at + (run.state === RunState.busy ? busyGraceMs(turnLimitMs) : 0) <= nowMs;
}

/** How long past its retention a busy run stays (runExpired). */
export function busyGraceMs(turnLimitMs: number): number {
  return turnLimitMs + 60_000;
}

export const Disposition = {
  created: "created",
  continued: "continued",
  queued: "queued",
  steered: "steered",
} as const;
export type Disposition = (typeof Disposition)[keyof typeof Disposition];

export const Plan = { solo: "solo", business: "business" } as const;
export type Plan = (typeof Plan)[keyof typeof Plan];

/** A normalized input part as stored with a turn. */
export type InputPart =
  | { type: "input_text"; text: string }
  /** A file part: by upload id, or inline with filename and base64 file_data. */
  | { type: "input_file"; file_id: string; filename?: undefined; file_data?: undefined; media_type?: undefined }
  | { type: "input_file"; file_id?: undefined; filename: string; file_data: string; media_type?: string };

export type OutputPart = { type: "output_text"; text: string };

export type TurnErrorSource = "provider" | "extension" | "runtime" | "platform" | "configuration";

/** The error stored with a failed or incomplete turn (spec "Turn error"). */
export interface TurnError {
  code: string;
  source: TurnErrorSource;
  message: string;
  retryable: boolean;
  reference: string;
}

export const BUILTIN_TOOLS = ["bash", "read", "write", "edit", "ls"] as const;
export type BuiltinTool = (typeof BUILTIN_TOOLS)[number];
/**
 * Built-in tools that change nothing: a turn cut short in one of them was not in an action
 * (worker_execution_interrupted, not worker_action_interrupted).
 */
export const READ_ONLY_TOOLS: ReadonlySet<string> = new Set<BuiltinTool>(["read", "ls"]);

/** Tokens a scripted step reports as its model call's usage (tests of usage accounting). */
export interface ScriptUsage {
  input?: number;
  output?: number;
  cache_read?: number;
  cache_write?: number;
}

/** One step of the `faux/scripted` model: the Nth model call of a turn answers with step N. */
export type ScriptStep = (
  | { text: string }
  | { tool_call: { name: string; arguments: Record<string, unknown> } }
  | { error: { message: string; status?: number } }
) & { usage?: ScriptUsage };

/**
 * What a turn's model calls used, summed (a run's: summed over its turns). Cost in US
 * dollars from the model registry's prices; null when the model has none (faux/scripted,
 * openai-compatible endpoints) — for a run, null when none of its turns had a price.
 */
export interface TurnUsage {
  input_tokens: number;
  output_tokens: number;
  cache_read_tokens: number;
  cache_write_tokens: number;
  cost_usd: number | null;
}

export type ModelRef = string | { provider: "openai-compatible"; base_url: string; model: string; api_key_env?: string };

/** A person's decision on a gated tool call (src/approval.ts). */
export type Decision = "approve" | "deny";

/** One rule of `config.approval`: the tool, and optionally what its call must match. */
export interface ApprovalRule {
  tool: "*" | BuiltinTool;
  /** bash only: the command, leading blanks ignored, starts with this. */
  command_prefix?: string;
  /** read, write, edit, ls only: the path, relative to the workspace, matches this glob. */
  path_glob?: string;
}

/** `config.approval`: tool calls a person approves or denies before they run. */
export interface ApprovalPolicy {
  rules: ApprovalRule[];
  /** Seconds a person has to decide. Default 3600. */
  timeout_s?: number;
  /** What expiry decides. Default deny. */
  on_timeout?: Decision;
}

/** A deployment's agent configuration (decisions §3), already validated. */
export interface AgentConfig {
  model: ModelRef;
  instructions?: string;
  tools?: BuiltinTool[];
  limits?: {
    command_timeout_s?: number;
    memory_mb?: number;
    processes?: number;
    cpu_s?: number;
    disk_mb?: number;
    output_kb?: number;
    tmp_mb?: number;
  };
  /** Destinations tool commands may reach through the egress proxy; none when absent. */
  network?: { allow: string[] };
  script?: ScriptStep[];
  tokens_per_second?: number;
  /** Tool calls a person approves or denies before they run (src/approval.ts). */
  approval?: ApprovalPolicy;
}

/** A runtime event as the agent runner reports it, before numbering and storage. */
export interface RuntimeEvent {
  type: string;
  data: Record<string, unknown>;
}

export const SCRIPTED_MODEL = "faux/scripted";
