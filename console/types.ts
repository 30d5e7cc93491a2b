/** The shapes the console reads (the API's answers; /docs has them all). */
export interface TurnError {
  code: string;
  source: string;
  message: string;
  retryable: boolean;
  reference: string;
}

export type InputPart = { type: "input_text"; text: string } | { type: "input_file"; file_id?: string; filename?: string };

export interface Usage {
  input_tokens: number;
  output_tokens: number;
  cache_read_tokens: number;
  cache_write_tokens: number;
  cost_usd: number | null;
}

export interface UsageBucket extends Usage {
  day?: string;
  agent_id?: string;
  agent_version?: number;
  model?: string;
  turns: number;
}

export interface Budget {
  monthly_cost_usd: number | null;
  monthly_tokens: number | null;
  period_end: number;
  spent: Usage;
  exhausted: "cost" | "tokens" | null;
}

export interface UsageSummary {
  from: number;
  to: number;
  group_by: string;
  total: Usage & { turns: number };
  data: UsageBucket[];
  budget: Budget | null;
}

/** A gated tool call the in_progress turn waits for a person to decide (the deployment's config.approval). */
export interface PendingAction {
  id: string;
  tool: string;
  tool_call_id: string;
  arguments: Record<string, unknown>;
  requested_at: number;
  expires_at: number;
}

/** The answer of POST /api/v1/runs/{runId}/actions/{actionId}. */
export interface Action extends PendingAction {
  run_id: string;
  turn_id: string;
  decision: "approve" | "deny" | null;
  reason: string | null;
  decided_by: "person" | "timeout" | null;
  decided_at: number | null;
}

export interface Turn {
  id: string;
  status: string;
  agent_version: number;
  input: InputPart[];
  output: Array<{ type: "output_text"; text: string }>;
  error: TurnError | null;
  created_at: number;
  started_at: number | null;
  completed_at: number | null;
  duration_ms: number | null;
  /** null until the turn is final. */
  usage: Usage | null;
  /** The tool call the turn waits for a person to decide; null otherwise. */
  pending_action: PendingAction | null;
}

export interface RunSummary {
  id: string;
  agent_id: string;
  agent_version: number;
  state: string;
  tags: string[];
  created_at: number;
  last_activity_at: number;
  usage: Usage;
  /** What the run's active turn waits for a person to decide; null when nothing. */
  pending_action: { id: string; turn_id: string; tool: string; expires_at: number } | null;
}

export interface Run extends RunSummary {
  disposition?: string;
  turn: Turn;
}

export interface List<T> {
  data: T[];
  has_more: boolean;
  next_cursor: string | null;
}

export interface EventList extends List<RunEvent> {
  history: { status: string | null; retention_days: number };
}

export interface RunEvent {
  id: string;
  sequence: number;
  source: "runtime" | "platform";
  type: string;
  turn_id: string | null;
  created_at: number;
  data: Record<string, unknown>;
}

export interface Agent {
  id: string;
  name: string;
  description: string | null;
  active_version: number | null;
}

export interface Deployment {
  version: number;
  status: string;
  upgrade_policy: string;
  error: { code: string; message: string } | null;
  created_at: number;
}

export const FINAL_STATUSES = ["completed", "failed", "cancelled", "incomplete"];
