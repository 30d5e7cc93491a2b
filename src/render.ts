import { unixSeconds } from "./clock.js";
import { isFinalStatus, type Disposition } from "./domain.js";
import type { AgentDoc, DeploymentDoc, RunDoc, TurnDoc } from "./documents.js";
import { NO_USAGE } from "./usage.js";
import { pendingActionOf, renderPendingAction } from "./approval.js";

const secondsOrNull = (ms: number | null) => (ms === null ? null : unixSeconds(ms));

export function renderTurn(turn: TurnDoc) {
  return {
    id: turn._id,
    object: "turn" as const,
    status: turn.status,
    agent_version: turn.agent_version,
    input: turn.input,
    output: turn.output,
    error: turn.error,
    created_at: unixSeconds(turn.created_at),
    started_at: secondsOrNull(turn.started_at),
    completed_at: secondsOrNull(turn.completed_at),
    duration_ms: turn.duration_ms,
    // Final turns stored without usage (interrupted, cancelled while queued) used nothing here.
    usage: turn.usage ?? (isFinalStatus(turn.status) ? NO_USAGE : null),
    // The gated tool call the turn waits for a person to decide (null when none).
    pending_action: pendingActionView(turn),
  };
}

function pendingActionView(turn: TurnDoc) {
  const pending = isFinalStatus(turn.status) ? undefined : pendingActionOf(turn.actions);
  return pending ? renderPendingAction(pending) : null;
}

/** The Run object with its selected turn; agent_version is the turn's version. */
/**
 * A turn becomes final in one write and the run moves on in a second (DESIGN §4); a
 * reader between the two sees the turn final while the run still names it active.
 * The run is idle then, unless a queued turn is about to start.
 */
export function runState(run: RunDoc, turn: TurnDoc): RunDoc["state"] {
  if (run.state === "busy" && run.active_turn_id === turn._id && isFinalStatus(turn.status) && !run.queued_turn_id) return "idle";
  return run.state;
}

export function renderRun(run: RunDoc, turn: TurnDoc, disposition?: Disposition) {
  const out = {
    id: run._id,
    object: "run" as const,
    agent_id: run.agent_id,
    agent_version: turn.agent_version,
    state: runState(run, turn),
    tags: [...run.tags].sort(),
    created_at: unixSeconds(run.created_at),
    last_activity_at: unixSeconds(run.last_activity_at),
    usage: run.usage ?? NO_USAGE,
    pending_action: runPendingAction(run),
    turn: renderTurn(turn),
  };
  return disposition ? { ...out, disposition } : out;
}

export function renderRunSummary(run: RunDoc) {
  return {
    id: run._id,
    object: "run" as const,
    agent_id: run.agent_id,
    agent_version: run.agent_version,
    state: run.state,
    tags: [...run.tags].sort(),
    created_at: unixSeconds(run.created_at),
    last_activity_at: unixSeconds(run.last_activity_at),
    usage: run.usage ?? NO_USAGE,
    pending_action: runPendingAction(run),
  };
}

/** The tool call the run's active turn waits for a person to decide, as runs and run lists show it. */
function runPendingAction(run: RunDoc) {
  const p = run.pending_action;
  return p ? { id: p.id, turn_id: p.turn_id, tool: p.tool, expires_at: unixSeconds(p.expires_at) } : null;
}

export function renderAgent(agent: AgentDoc) {
  return {
    id: agent._id,
    object: "agent" as const,
    name: agent.name,
    description: agent.description,
    active_version: agent.active_version,
    created_at: unixSeconds(agent.created_at),
  };
}

export function renderDeployment(d: DeploymentDoc) {
  return {
    object: "deployment" as const,
    agent_id: d.agent_id,
    version: d.version,
    status: d.status,
    upgrade_policy: d.upgrade_policy,
    config: withoutEndpointCredentials(d.config),
    error: d.error && { ...d.error, message: withoutUrlCredentials(d.error.message) },
    created_at: unixSeconds(d.created_at),
    ready_at: secondsOrNull(d.ready_at),
  };
}

/** A run of text between spaces, quotes and angle brackets: where a URL's user name and password can stand. */
const URL_TOKEN = /[^\s"'<>]+/g;
const SCHEME_CHAR = /[a-z0-9+.-]/i;
const LETTER = /[a-z]/i;

/**
 * `text` with every URL's user name and password shown as `***`: in each run of text
 * between spaces, quotes and angle brackets, what follows its first `scheme:` (and the
 * slashes after it) up to the run's last `@`. That covers any form a URL parser would take
 * (`https:user:pw@h`, `https:\\user@h`, a password holding `/`). It may hide more (a path
 * holding `@`): it is for text no parser could read, and shows too little rather than a
 * secret. Since base_url refuses credentials none is stored, but a deployment made before
 * that may hold one, in its config or quoted in its error, readable with agents:read (such
 * a deployment's turns fail: fetch refuses a URL with credentials).
 *
 * Linear in the text's length: the text is a tenant's (a deployment's error quotes its
 * config), and a backtracking regex for the same rule took seconds on 50,000 letters.
 */
export function withoutUrlCredentials(text: string): string {
  return text.replace(URL_TOKEN, (token) => {
    const at = token.lastIndexOf("@");
    if (at < 0) return token;
    const colon = schemeEnd(token, at);
    if (colon < 0) return token;
    let credentials = colon + 1;
    while (token[credentials] === "/" || token[credentials] === "\\") credentials++;
    return `${token.slice(0, credentials)}***${token.slice(at)}`;
  });
}

/**
 * The index of the `:` ending the first scheme in `token` before `before` (a letter, then
 * letters, digits, `+`, `.` or `-`), or -1. Each `:` is looked back from once, over the
 * run of scheme characters before it, so the whole search reads the token about twice.
 */
function schemeEnd(token: string, before: number): number {
  for (let colon = token.indexOf(":"); colon >= 0 && colon < before; colon = token.indexOf(":", colon + 1)) {
    let start = colon;
    while (start > 0 && SCHEME_CHAR.test(token[start - 1]!)) start--;
    while (start < colon && !LETTER.test(token[start]!)) start++;
    if (start < colon) return colon;
  }
  return -1;
}

function withoutEndpointCredentials(config: DeploymentDoc["config"]): DeploymentDoc["config"] {
  const model = config.model;
  if (typeof model === "string") return config;
  let shown: string;
  try {
    // A URL: its own user name and password, as the parser found them, and nothing else.
    const url = new URL(model.base_url);
    if (!url.username && !url.password) return config;
    if (url.username) url.username = "***";
    if (url.password) url.password = "***";
    shown = url.href;
  } catch {
    shown = withoutUrlCredentials(model.base_url);
  }
  return shown === model.base_url ? config : { ...config, model: { ...model, base_url: shown } };
}

export function list<T>(data: T[], hasMore: boolean, nextCursor: string | null) {
  return { object: "list" as const, data, has_more: hasMore, next_cursor: hasMore ? nextCursor : null };
}
