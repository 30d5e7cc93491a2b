import type { ActionDoc } from "./approval.js";
import type { AgentConfig, Disposition, InputPart, OutputPart, Plan, RunState, TurnError, TurnStatus, TurnUsage } from "./domain.js";

/**
 * Shapes of the durable documents. Times are Unix milliseconds inside the store and
 * become Unix seconds only when rendered.
 */

export interface WorkspaceDoc {
  _id: string;
  name: string;
  plan: Plan;
  created_at: number;
}

export interface ApiKeyDoc {
  _id: string;
  workspace_id: string;
  /** sha256 hex of the secret; the secret itself is never stored. */
  hash: string;
  key_prefix: string;
  label: string | null;
  scopes: string[];
  mode: "live" | "test";
  created_at: number;
  updated_at: number;
  last_used_at: number | null;
  revoked_at: number | null;
  /** When a rotated key stops working (end of its grace period). */
  revokes_at: number | null;
}

export interface AgentDoc {
  _id: string;
  workspace_id: string;
  name: string;
  description: string | null;
  active_version: number | null;
  created_at: number;
}

export const DeploymentStatus = { building: "building", ready: "ready", failed: "failed" } as const;
export type DeploymentStatus = (typeof DeploymentStatus)[keyof typeof DeploymentStatus];

export const UpgradePolicy = { automatic: "automatic", new_run_only: "new_run_only" } as const;
export type UpgradePolicy = (typeof UpgradePolicy)[keyof typeof UpgradePolicy];

export interface DeploymentDoc {
  /** `<agent_id>:<version>`: a unique insert allocates the version. */
  _id: string;
  workspace_id: string;
  agent_id: string;
  version: number;
  status: DeploymentStatus;
  upgrade_policy: UpgradePolicy;
  config: AgentConfig;
  /** Activate when the build finishes. */
  activate: boolean;
  error: { code: string; message: string } | null;
  created_at: number;
  ready_at: number | null;
}

export interface RunDoc {
  _id: string;
  workspace_id: string;
  agent_id: string;
  /** The version the run's workspace is on (its latest admitted turn's version). */
  agent_version: number;
  /** Every version a turn of this run ran on. */
  versions: number[];
  partition: number;
  state: RunState;
  tags: string[];
  plan: Plan;
  retention_s: number;
  event_retention_s: number;
  created_at: number;
  last_activity_at: number;
  expires_at: number;
  /** Fencing token: the partition epoch of the owner that last activated the run. */
  epoch: number;
  turn_count: number;
  latest_turn_id: string;
  active_turn_id: string | null;
  queued_turn_id: string | null;
  /** Whether the run's workspace has a checkpoint in the object store. */
  checkpointed?: boolean;
  /** Sequence of the run's last recorded event, 0 when none (events are numbered by the owner). */
  event_seq: number;
  /** The sum of its final turns' usage, and the last turn added to it (each is added once). */
  usage?: TurnUsage;
  usage_turn_id?: string;
  /** The gated tool call the run's active turn waits for a person to decide (lists filter on it). */
  pending_action?: { id: string; turn_id: string; tool: string; expires_at: number } | null;
}

export interface TurnDoc {
  _id: string;
  run_id: string;
  workspace_id: string;
  /** 0-based position in the run. */
  index: number;
  status: TurnStatus;
  agent_version: number;
  input: InputPart[];
  output: OutputPart[];
  error: TurnError | null;
  created_at: number;
  started_at: number | null;
  completed_at: number | null;
  duration_ms: number | null;
  /** Messages this turn added to the agent session (the session is their concatenation). */
  transcript: unknown[];
  /** What the turn's model calls used; set when the turn becomes final. */
  usage?: TurnUsage;
  /** How the turn was admitted (replayed when a gateway resends the command). */
  disposition: Disposition;
  /** Ids of the steer requests that added input to this turn. */
  steer_ids: string[];
  /** The cancel requests that selected this turn and changed it (the latest few; absent: none). */
  cancel_ids?: string[];
  /** Run sequence of the turn's first event. */
  first_event_seq: number;
  epoch: number;
  /**
   * Gated tool calls of the turn (src/approval.ts), in the order asked; at most one is
   * undecided, and while it is, `transcript` holds what the turn added up to it.
   */
  actions?: ActionDoc[];
  /** Steering input that arrived while the turn waited for a decision, delivered after it. */
  waiting_steers?: string[];
  /** What the turn's model calls used before it waited (its `usage` is set when final). */
  waiting_usage?: TurnUsage;
  /** The deployment's model as usage names it, for a turn ended while it waits. */
  waiting_model?: string;
}

export interface IdempotencyDoc {
  /** sha256 of workspace, operation and key. */
  _id: string;
  workspace_id: string;
  operation: string;
  fingerprint: string;
  state: "pending" | "done";
  /** Identity of the answer: enough to render it again. */
  result: Record<string, unknown>;
  created_at: number;
  expires_at: number;
}

export interface TombstoneDoc {
  _id: string;
  workspace_id: string;
  reason: "expired" | "deleted";
  at: number;
  expires_at: number;
  /**
   * The run's partition and plan: the partition's owner checks that the run's parts
   * (turns, events, checkpoint, workspace directory) are gone (absent on tombstones
   * written before they were kept).
   */
  partition?: number;
  plan?: Plan;
  /**
   * When the partition's owner checks that the run's parts are gone, unless the removal
   * that wrote the tombstone reported them all removed first (then absent): a node that
   * died during the removal, or a store that failed for longer than its retries, leaves
   * them to that check.
   */
  parts_due_at?: number;
}
