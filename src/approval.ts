/**
 * Human approval of tool calls (issue 18): which calls a deployment's `config.approval`
 * gates, what a pending action is, and how a decision or a timeout settles it. Pure:
 * the run's actor applies these decisions (actors/turn-execution.ts).
 *
 * Decisions:
 * - A call is gated when any rule matches it: the rule's tool is the call's (or `*`),
 *   and, when given, the bash command starts with `command_prefix` (leading blanks
 *   ignored) or the file tool's path matches `path_glob`. A prefix or a glob is a
 *   convenience, not a security boundary: `true; rm -rf .` does not start with `rm`.
 *   To gate every command, name the tool without a prefix.
 * - An action expires `timeout_s` after it was requested (default 1 hour); expiry
 *   applies `on_timeout` (default `deny`). A decision arriving after expires_at finds
 *   the action decided by its timeout (409 action_already_decided), even if the timer
 *   has not fired yet: the outcome never depends on which came first on the node.
 * - A denial reaches the model as the tool's error result, with the reason.
 */
import { type ApprovalPolicy, type ApprovalRule, BUILTIN_TOOLS, type BuiltinTool, type Decision } from "./domain.js";

export type { ApprovalPolicy, ApprovalRule, Decision } from "./domain.js";
import { posix } from "node:path";
import { unixSeconds } from "./clock.js";

export const APPROVAL_TOOLS = ["*", ...BUILTIN_TOOLS] as const;

export const DEFAULT_APPROVAL_TIMEOUT_S = 3600;
export const MAX_APPROVAL_TIMEOUT_S = 12 * 3600;
export const PATH_TOOLS: readonly BuiltinTool[] = ["read", "write", "edit", "ls"];


/** Who decided: a person through the API, or the timeout. */
export type DecidedBy = "person" | "timeout";

/** A gated tool call, stored with its turn (TurnDoc.actions). Times in Unix ms. */
export interface ActionDoc {
  id: string;
  tool_call_id: string;
  tool: string;
  arguments: Record<string, unknown>;
  requested_at: number;
  expires_at: number;
  on_timeout: Decision;
  /** Index in the turn's transcript of the assistant message that asked (where the loop resumes). */
  assistant_index: number;
  decision: Decision | null;
  reason: string | null;
  decided_at: number | null;
  decided_by: DecidedBy | null;
  /** The request that decided it (a resent command carries the same). */
  decision_id?: string;
  /**
   * When the turn went on after the decision: null while decided and not yet resumed (a new
   * owner resumes it); set before the call can run (a new owner never runs it again).
   */
  resumed_at?: number | null;
}

/**
 * Whether `policy` gates the call of `tool` with `args`. `relative` maps a tool's path to
 * the workspace-relative path the tool itself will use (the tools' own mapping, so that no
 * spelling of a path reaches a file a glob guards); when it refuses a path, a path rule
 * gates the call (the tool will refuse it too).
 */
export function approvalRequired(policy: ApprovalPolicy | undefined, tool: string, args: unknown, relative: (path: string) => string = (path) => path): boolean {
  if (!policy) return false;
  const budget = { steps: MAX_GLOB_STEPS };
  return policy.rules.some((rule) => ruleMatches(rule, tool, args, relative, budget));
}

/**
 * The glob matching one call may do, in steps (a glob's tokens × the path's length + 1, summed
 * over its rules). 50 rules of 1,000-token globs against a 4,096-character path had taken
 * ~5 s per call (found by an audit); past this a path rule gates the call instead (fails
 * closed). Real rules and paths take a few thousand steps.
 */
export const MAX_GLOB_STEPS = 1_000_000;

function ruleMatches(rule: ApprovalRule, tool: string, args: unknown, relative: (path: string) => string, budget: { steps: number }): boolean {
  if (rule.tool !== "*" && rule.tool !== tool) return false;
  const fields = (args && typeof args === "object" ? args : {}) as Record<string, unknown>;
  if (rule.command_prefix !== undefined) {
    // A rule about commands gates only calls that carry one.
    if (typeof fields.command !== "string") return false;
    if (!fields.command.trimStart().startsWith(rule.command_prefix)) return false;
  }
  if (rule.path_glob !== undefined) {
    // ls without a path lists the workspace; any other non-string path gates (fails closed).
    if (fields.path === undefined && tool === "ls") return globMatches(rule.path_glob, ".");
    if (typeof fields.path !== "string") return true;
    const path = fields.path;
    if (path.length > MAX_GLOB_PATH) return true;
    let normalized: string;
    try {
      normalized = workspacePath(relative(path));
    } catch {
      return true;
    }
    const tokens = globTokens(rule.path_glob);
    const steps = tokens.length * (normalized.length + 1);
    if (steps > budget.steps) return true;
    budget.steps -= steps;
    if (!tokensMatch(tokens, normalized)) return false;
  }
  return true;
}

/**
 * A tool's path as a path relative to the workspace, without `./`: `/workspace/a/b`,
 * `./a//b/` and `a/b` are all `a/b`; the workspace itself is `.`. `..` segments are
 * resolved (a path leaving the workspace is refused by the tool itself; here it keeps
 * its `..` and matches only a glob that says so).
 */
export function workspacePath(p: string): string {
  let rest = p.startsWith("/") ? posix.normalize(p) : p;
  rest = rest.replace(/^\/workspace(?=\/|$)/, "");
  rest = rest.replace(/^\/+/, "");
  const out: string[] = [];
  for (const segment of rest.split("/")) {
    if (segment === "" || segment === ".") continue;
    if (segment === ".." && out.length > 0 && out[out.length - 1] !== "..") out.pop();
    else out.push(segment);
  }
  return out.length === 0 ? "." : out.join("/");
}

/**
 * Glob match of a relative path: `*` is any run of characters but `/`, `**` any run
 * including `/` (`**\/` also matches no directory at all), `?` one character but `/`;
 * everything else is literal. The whole path must match.
 *
 * A tenant writes the glob and a model the path: matching walks the path once per glob
 * token (O(glob × path)), never backtracks, so no pattern can stall the node; paths longer
 * than {@link MAX_GLOB_PATH} are not matched at all (path rules gate them: fail closed).
 */
export function globMatches(glob: string, path: string): boolean {
  return tokensMatch(globTokens(glob), path);
}

/** {@link globMatches} of a glob already split into its tokens. */
function tokensMatch(tokens: readonly string[], path: string): boolean {
  const n = path.length;
  let reach = new Uint8Array(n + 1);
  let next = new Uint8Array(n + 1);
  reach[0] = 1;
  for (const token of tokens) {
    let seen = 0;
    for (let i = 0; i <= n; i++) {
      const prev = i > 0 ? path[i - 1] : undefined;
      switch (token) {
        case "**":
          next[i] = reach[i] || (i > 0 ? next[i - 1] : 0);
          break;
        case "**/":
          // Nothing, or anything that ends with a slash.
          next[i] = reach[i] || (prev === "/" && seen ? 1 : 0);
          break;
        case "*":
          next[i] = reach[i] || (i > 0 && prev !== "/" ? next[i - 1] : 0);
          break;
        case "?":
          next[i] = i > 0 && prev !== "/" ? reach[i - 1] : 0;
          break;
        default:
          next[i] = i > 0 && prev === token ? reach[i - 1] : 0;
      }
      seen |= reach[i];
    }
    [reach, next] = [next, reach];
  }
  return reach[n] === 1;
}

/** The longest path a glob is matched against. */
export const MAX_GLOB_PATH = 4096;

/** `**\/`, `**`, `*`, `?` or one literal character. */
function globTokens(glob: string): string[] {
  const tokens: string[] = [];
  for (let i = 0; i < glob.length; i++) {
    if (glob[i] === "*" && glob[i + 1] === "*") {
      i++;
      if (glob[i + 1] === "/") {
        i++;
        tokens.push("**/");
      } else tokens.push("**");
    } else tokens.push(glob[i]!);
  }
  return tokens;
}

/** The largest arguments an action keeps whole (the transcript keeps them all). */
export const MAX_ACTION_ARGUMENTS_BYTES = 64 * 1024;

/** The call's arguments as the action keeps them: whole, or a preview when over {@link MAX_ACTION_ARGUMENTS_BYTES}. */
export function actionArguments(args: Record<string, unknown>): Record<string, unknown> {
  const json = JSON.stringify(args);
  const bytes = Buffer.byteLength(json);
  if (bytes <= MAX_ACTION_ARGUMENTS_BYTES) return args;
  return { truncated: true, bytes, preview: Buffer.from(json).subarray(0, MAX_ACTION_ARGUMENTS_BYTES).toString("utf8") };
}

/** A new pending action for the call, requested now. */
export function newAction(
  policy: ApprovalPolicy,
  call: { id: string; toolCallId: string; tool: string; arguments: Record<string, unknown>; assistantIndex: number },
  nowMs: number,
): ActionDoc {
  return {
    id: call.id,
    tool_call_id: call.toolCallId,
    tool: call.tool,
    arguments: actionArguments(call.arguments),
    requested_at: nowMs,
    expires_at: nowMs + (policy.timeout_s ?? DEFAULT_APPROVAL_TIMEOUT_S) * 1000,
    on_timeout: policy.on_timeout ?? "deny",
    assistant_index: call.assistantIndex,
    decision: null,
    reason: null,
    decided_at: null,
    decided_by: null,
  };
}

export type DecideOutcome =
  | { kind: "decided"; action: ActionDoc }
  /** Already decided (by a person, or by its timeout): the earlier decision stands. */
  | { kind: "already_decided"; action: ActionDoc; expiredNow: boolean };

/**
 * Applies a person's decision at `nowMs`. Past expires_at the timeout decides first,
 * whatever the person asked.
 */
export function decide(action: ActionDoc, decision: Decision, reason: string | null, nowMs: number, decisionId?: string): DecideOutcome {
  if (action.decision !== null) return { kind: "already_decided", action, expiredNow: false };
  if (nowMs >= action.expires_at) return { kind: "already_decided", action: expire(action, nowMs), expiredNow: true };
  return { kind: "decided", action: { ...action, decision, reason, decided_at: nowMs, decided_by: "person", ...(decisionId ? { decision_id: decisionId } : {}) } };
}

/** The action decided by its timeout. */
export function expire(action: ActionDoc, nowMs: number): ActionDoc {
  if (action.decision !== null) return action;
  const reason = `No decision within ${Math.round((action.expires_at - action.requested_at) / 1000)} s: the request expired.`;
  return { ...action, decision: action.on_timeout, reason, decided_at: Math.max(nowMs, action.expires_at), decided_by: "timeout" };
}

/** What the model is told when the call is denied. */
export function denialText(action: ActionDoc): string {
  if (action.decided_by === "timeout") return `The call was not approved: ${action.reason ?? "the approval request expired."}`;
  return action.reason ? `The call was denied by a person: ${action.reason}` : "The call was denied by a person.";
}

/** The undecided action of a turn, if it waits for one. */
export function pendingActionOf(actions: readonly ActionDoc[] | undefined): ActionDoc | undefined {
  return actions?.find((a) => a.decision === null);
}

/** The pending action as a Turn shows it (`pending_action`). */
export function renderPendingAction(action: ActionDoc) {
  return {
    id: action.id,
    tool: action.tool,
    tool_call_id: action.tool_call_id,
    arguments: action.arguments,
    requested_at: unixSeconds(action.requested_at),
    expires_at: unixSeconds(action.expires_at),
  };
}

/** The Action object the decision endpoint answers with. */
export function renderAction(action: ActionDoc, runId: string, turnId: string) {
  return {
    ...renderPendingAction(action),
    object: "action" as const,
    run_id: runId,
    turn_id: turnId,
    decision: action.decision,
    reason: action.reason,
    decided_by: action.decided_by,
    decided_at: action.decided_at === null ? null : unixSeconds(action.decided_at),
  };
}
