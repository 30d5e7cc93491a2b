/**
 * The bookkeeping of `npm run chaos` (scripts/chaos.ts): what the chaos clients sent and
 * were answered, the event streams they read, the checks run on the cluster's answers once
 * it is quiet, and the ledger made of them. Kept apart from the runner so the checks are
 * plain functions of recorded data: nothing here talks to the cluster.
 */

/** The final turn statuses (runs-api.md, Turn status). */
export const FINAL_STATUSES: ReadonlySet<string> = new Set(["completed", "failed", "cancelled", "incomplete"]);
/** The platform events that make a turn final, by the status they stand for. */
export const FINAL_EVENT_STATUS: Readonly<Record<string, string>> = {
  "turn.completed": "completed",
  "turn.failed": "failed",
  "turn.cancelled": "cancelled",
  "turn.incomplete": "incomplete",
};

/** How one HTTP attempt ended: its status, or why there was none. */
export type AttemptOutcome = number | "network" | "timeout" | "dropped";

/** One fetch of a chaos client (each retry of the reference client is one). */
export interface Attempt {
  at: number;
  ms: number;
  op: string;
  method: string;
  path: string;
  node: number;
  key?: string;
  outcome: AttemptOutcome;
  retryAfter?: string;
  code?: string;
}

/** A 4xx that says "not now" rather than answering the request: never the key's answer. */
const RETRYABLE_CODES: ReadonlySet<string> = new Set(["run_busy", "rate_limited", "event_boundary_pending"]);

/** What one Idempotency-Key was answered, settled answers only (2xx, or a 4xx that is final). */
export interface KeyedAnswer {
  at: number;
  op: string;
  status: number;
  /** For a 2xx: the run and turn (or deleted run) it named. */
  identity?: string;
  /** For a 4xx: its code. */
  code?: string;
  /** Sent on purpose again after an earlier call with the key had finished. */
  repeat: boolean;
}

export interface StreamEventSeen {
  seq: number;
  type: string;
  conn: number;
  at: number;
}

export type CutReason = "injected" | "fault" | "idle";

/** One logical event stream: the reference client's stream and every reconnect it made. */
export interface StreamLog {
  id: number;
  op: string;
  worker: number;
  runId?: string;
  turnId?: string;
  key?: string;
  startedAt: number;
  endedAt?: number;
  /** Each connection that was answered 2xx (200 with events, 204 nothing more). */
  connections: Array<{ at: number; node: number; status: number; resumedWith: "last-event-id" | "after" | "none" }>;
  events: StreamEventSeen[];
  /** Cuts made by the chaos transport (a connection reset by a dead node shows as a reconnect without a cut). */
  cuts: Array<{ at: number; reason: CutReason; conn: number }>;
  /** final: its final event arrived; closed: the client stopped without it; error / deadline: the client gave up. */
  end?: "final" | "closed" | "error" | "deadline";
  error?: string;
}

/** A fault the runner injected, with what it could observe of its effect. */
export interface FaultRecord {
  kind: "node-kill" | "node-pause" | "nats-kill" | "store-outage" | "client-drop";
  target: string;
  startedAt: number;
  /** When the fault was undone (restart, SIGCONT); equal to startedAt for instant faults. */
  endedAt: number;
  /** When every server and node answered again afterwards. */
  recoveredAt?: number;
  /** What the runner saw of its effect; `checked: false` when it could not tell. */
  effect: { checked: boolean; observed: string };
  /** Turns that ended incomplete from its start to 15 s after it was undone (filled in by the ledger). */
  turnsEndedIncompleteNear?: number;
}

export interface AdmittedTurn {
  runId: string;
  turnId: string;
  at: number;
  op: string;
  worker: number;
}

/** The turns and events of one run as read back (or as read just before its deletion). */
export interface RunReadback {
  runId: string;
  deleted: boolean;
  turns: Array<{ id: string; status: string; code?: string; created_at?: number; completed_at?: number; key?: string }>;
  events: Array<{ sequence: number; type: string; turn_id?: string | null; created_at: number }>;
  /** Why it could not be read, if it could not. */
  error?: string;
}

/** Everything the runner records while it runs; the checks below read it afterwards. */
export class Recorder {
  readonly attempts: Attempt[] = [];
  readonly operations = new Map<string, { sent: number; ok: number; refused: Map<string, number>; failed: Map<string, number> }>();
  readonly keyed = new Map<string, KeyedAnswer[]>();
  readonly repeats = { onPurpose: 0, afterFault: 0 };
  readonly streams: StreamLog[] = [];
  readonly streamErrors: Array<{ at: number; stream: number; status: number; code: string }> = [];
  readonly admitted = new Map<string, AdmittedTurn>();
  readonly faults: FaultRecord[] = [];
  readonly drops: Array<{ at: number; op: string; key?: string; node: number }> = [];

  attempt(attempt: Attempt): void {
    this.attempts.push(attempt);
  }

  /** A logical call ended: `ok` (2xx), refused with a 4xx code, or failed (5xx or no answer after the client's retries). */
  operation(op: string, result: { ok: true } | { refused: string } | { failed: string }): void {
    let entry = this.operations.get(op);
    if (!entry) this.operations.set(op, (entry = { sent: 0, ok: 0, refused: new Map(), failed: new Map() }));
    entry.sent++;
    if ("ok" in result) entry.ok++;
    else if ("refused" in result) entry.refused.set(result.refused, (entry.refused.get(result.refused) ?? 0) + 1);
    else entry.failed.set(result.failed, (entry.failed.get(result.failed) ?? 0) + 1);
  }

  /** A keyed answer; 5xx, 429 and retryable 409s are not the key's answer and are left out. */
  keyedAnswer(key: string, answer: KeyedAnswer): void {
    if (answer.status >= 500 || answer.status === 429) return;
    if (answer.status >= 400 && answer.code && RETRYABLE_CODES.has(answer.code)) return;
    const list = this.keyed.get(key) ?? [];
    list.push(answer);
    this.keyed.set(key, list);
  }

  admit(turn: AdmittedTurn): void {
    if (!this.admitted.has(turn.turnId)) this.admitted.set(turn.turnId, turn);
  }

  stream(log: Omit<StreamLog, "id" | "connections" | "events" | "cuts">): StreamLog {
    const full: StreamLog = { ...log, id: this.streams.length + 1, connections: [], events: [], cuts: [] };
    this.streams.push(full);
    return full;
  }
}

// ---- checks ---------------------------------------------------------------------------

export interface IdempotencyViolation {
  key: string;
  kind: "two identities" | "idempotency_conflict" | "answer changed";
  answers: KeyedAnswer[];
}

/**
 * Keys answered inconsistently. We never reuse a key for another body, so every settled
 * answer of a key must be the same: one run and turn (or deleted run) for a 2xx, one code
 * for a 4xx; `idempotency_conflict` is itself a violation. 200 and 202 for the same turn
 * agree (the second found it final).
 */
export function idempotencyViolations(keyed: Map<string, KeyedAnswer[]>): IdempotencyViolation[] {
  const violations: IdempotencyViolation[] = [];
  for (const [key, answers] of keyed) {
    if (answers.some((a) => a.code === "idempotency_conflict")) {
      violations.push({ key, kind: "idempotency_conflict", answers });
      continue;
    }
    const identities = new Set(answers.filter((a) => a.status < 300).map((a) => a.identity));
    if (identities.size > 1) {
      violations.push({ key, kind: "two identities", answers });
      continue;
    }
    const shapes = new Set(answers.map((a) => (a.status < 300 ? "2xx" : `${a.status} ${a.code}`)));
    if (shapes.size > 1) violations.push({ key, kind: "answer changed", answers });
  }
  return violations;
}

export interface EventCheck {
  /** Numbers of 1..n missing from the history, and numbers it holds more than once. */
  gaps: number[];
  duplicates: number[];
  /**
   * Places where the history (in the order the API lists it, which is the order it was
   * stored in) goes back in sequence: `at` is listed right after `after`.
   */
  outOfOrder: Array<{ after: number; at: number; createdAt: number }>;
  /** Turn ids with more than one `turn.started`. */
  startedTwice: Array<{ turnId: string; count: number }>;
  /** Turns whose history holds no or several final events, or one for another status than the turn's. */
  finalMismatches: Array<{ turnId: string; finalEvents: string[]; status?: string }>;
}

/** Checks a run's event history: sequences exactly 1..n, one start and one final event per turn. */
export function checkRunEvents(run: RunReadback): EventCheck {
  const sequences = run.events.map((e) => e.sequence);
  const seen = new Set<number>();
  const duplicates: number[] = [];
  for (const s of sequences) {
    if (seen.has(s)) duplicates.push(s);
    seen.add(s);
  }
  const max = sequences.length === 0 ? 0 : Math.max(...sequences);
  const gaps: number[] = [];
  for (let s = 1; s <= max && gaps.length < 100; s++) if (!seen.has(s)) gaps.push(s);
  const outOfOrder: EventCheck["outOfOrder"] = [];
  for (let i = 1; i < sequences.length && outOfOrder.length < 100; i++) {
    if (sequences[i] < sequences[i - 1]) outOfOrder.push({ after: sequences[i - 1], at: sequences[i], createdAt: run.events[i].created_at });
  }
  const started = new Map<string, number>();
  const finals = new Map<string, string[]>();
  for (const e of run.events) {
    if (!e.turn_id) continue;
    if (e.type === "turn.started") started.set(e.turn_id, (started.get(e.turn_id) ?? 0) + 1);
    if (e.type in FINAL_EVENT_STATUS) finals.set(e.turn_id, [...(finals.get(e.turn_id) ?? []), e.type]);
  }
  const startedTwice = [...started].filter(([, count]) => count > 1).map(([turnId, count]) => ({ turnId, count }));
  const finalMismatches: EventCheck["finalMismatches"] = [];
  for (const turn of run.turns) {
    const types = finals.get(turn.id) ?? [];
    // A turn cancelled while queued never started, and has its final event all the same.
    const ok = FINAL_STATUSES.has(turn.status) ? types.length === 1 && FINAL_EVENT_STATUS[types[0]] === turn.status : types.length === 0;
    if (!ok) finalMismatches.push({ turnId: turn.id, finalEvents: types, status: turn.status });
  }
  return { gaps, duplicates, outOfOrder, startedTwice, finalMismatches };
}

export interface StreamCheck {
  resumes: number;
  /** Resumes whose first event was not the one after the last received, or that ended the stream early. */
  badResumes: Array<{ conn: number; after?: number; expected?: number; got?: number; what: "skipped" | "repeated" | "ended early" }>;
  /** Events missing or repeated inside one connection (not at a resume). */
  gapsWithin: Array<{ conn: number; after: number; expected?: number; got: number }>;
  /** Whether the received events were checked against the history. */
  checked: boolean;
  note?: string;
}

/**
 * Checks one stream against the turn's retained events (`history`: that turn's sequences in
 * the order the event list gives them, i.e. stored order, up to its final event). A stream
 * and its resumes follow stored order (an event id is a position in the stored log), so that
 * is what is expected here; whether stored order is sequence order is {@link checkRunEvents}'
 * question. Every connection after the first is a resume (the reference client's reconnect
 * with Last-Event-ID, the runner's resume with `after`, or a POST repeated with the key
 * before any event): its first event must be the one after the last event received before
 * it. A stream the client ended without the final event, although the history has more,
 * skipped the rest at its last resume.
 */
export function checkStream(stream: StreamLog, history: number[] | undefined): StreamCheck {
  const resumes = Math.max(0, stream.connections.length - 1);
  if (!history) return { resumes, badResumes: [], gapsWithin: [], checked: false, note: "the turn's events could not be read back" };
  const next = (seq: number | undefined): number | undefined => {
    if (seq === undefined) return history[0];
    const i = history.indexOf(seq);
    return i === -1 ? undefined : history[i + 1];
  };
  const badResumes: StreamCheck["badResumes"] = [];
  const gapsWithin: StreamCheck["gapsWithin"] = [];
  let last: number | undefined;
  for (let conn = 0; conn < stream.connections.length; conn++) {
    const events = stream.events.filter((e) => e.conn === conn);
    for (let i = 0; i < events.length; i++) {
      const got = events[i].seq;
      // A connection's first event follows the last one received on any connection before it;
      // every later one follows the one before it on the same connection.
      const after = i === 0 ? last : events[i - 1].seq;
      const expected = next(after);
      if (got !== expected) {
        const before = stream.events.slice(0, stream.events.indexOf(events[i])).some((e) => e.seq === got);
        if (i === 0 && conn > 0) badResumes.push({ conn, after, expected, got, what: before ? "repeated" : "skipped" });
        else gapsWithin.push({ conn, after: after ?? 0, expected, got });
      }
      last = got;
    }
  }
  const final = history.at(-1);
  if (stream.end === "closed" && last !== final && history.length > 0) {
    badResumes.push({ conn: stream.connections.length - 1, after: last, expected: next(last), what: "ended early" });
  }
  return { resumes, badResumes, gapsWithin, checked: true };
}

/** The turn's retained sequences, in listed (stored) order, up to and including its first final event. */
export function turnHistory(run: RunReadback, turnId: string): number[] {
  const out: number[] = [];
  for (const e of run.events) {
    if (e.turn_id !== turnId) continue;
    out.push(e.sequence);
    if (e.type in FINAL_EVENT_STATUS) break;
  }
  return out;
}

/** The injected fault closest in time to `at` (within `windowMs` of its start..recovery), if any. */
export function faultNear(faults: FaultRecord[], at: number, windowMs = 15_000): string | undefined {
  let best: { fault: FaultRecord; distance: number } | undefined;
  for (const fault of faults) {
    const end = fault.recoveredAt ?? fault.endedAt;
    const distance = at < fault.startedAt ? fault.startedAt - at : at > end ? at - end : 0;
    if (distance <= windowMs && (!best || distance < best.distance)) best = { fault, distance };
  }
  if (!best) return undefined;
  const { fault, distance } = best;
  const when = distance === 0 ? "during" : at < fault.startedAt ? `${(distance / 1000).toFixed(1)} s before` : `${(distance / 1000).toFixed(1)} s after`;
  return `${when} ${fault.kind} ${fault.target} (${new Date(fault.startedAt).toISOString()})`;
}

/** Increments `map[key]`. */
export function bump(map: Record<string, number>, key: string, by = 1): void {
  map[key] = (map[key] ?? 0) + by;
}

// ---- the ledger -----------------------------------------------------------------------

interface Problem {
  kind: string;
  /** Counted in a figure that fails the run; otherwise an observation worth reading. */
  counted: boolean;
  detail: Record<string, unknown>;
  nearFault?: string;
}

/** Operations of the runner itself (setup, settling, readback), kept out of the load's figures. */
const RUNNER_OPS: ReadonlySet<string> = new Set(["setup", "quiesce", "readback"]);

/** The listed events of a stream's turn (found through its key's answers when the stream never learnt it). */
function turnEventsOf(s: StreamLog | undefined, runs: Map<string, RunReadback>, rec: Recorder): string[] | undefined {
  let runId = s?.runId;
  let turnId = s?.turnId;
  if ((!runId || !turnId) && s?.key) {
    const identity = rec.keyed.get(s.key)?.find((a) => a.identity)?.identity;
    const m = identity && /^run (\S+) turn (\S+)$/.exec(identity);
    if (m) [runId, turnId] = [m[1], m[2]];
  }
  const run = runId ? runs.get(runId) : undefined;
  if (!run || !turnId) return undefined;
  return [`run ${runId} turn ${turnId}`, ...run.events.filter((x) => x.turn_id === turnId).map((x) => `${x.sequence}:${x.type}@${x.created_at}`)];
}

/**
 * The ledger of a run from what was recorded and read back, and every problem behind a
 * figure (with the injected fault nearest in time). `failing` names the figures above zero
 * that fail the run.
 */
export function buildLedger(rec: Recorder, notes: string[], runs: Map<string, RunReadback>, meta: Record<string, unknown>) {
  const problems: Problem[] = [];
  const near = (at: number | undefined) => (at === undefined ? undefined : faultNear(rec.faults, at));
  const problem = (kind: string, detail: Record<string, unknown>, at?: number, counted = true) => problems.push({ kind, counted, detail, nearFault: near(at) });

  // Requests: the load's, and apart from them the runner's own reads.
  const byOutcome: Record<string, number> = {};
  const runnerByOutcome: Record<string, number> = {};
  const loadAttempts = rec.attempts.filter((a) => !RUNNER_OPS.has(a.op));
  for (const a of rec.attempts) bump(RUNNER_OPS.has(a.op) ? runnerByOutcome : byOutcome, typeof a.outcome === "number" ? String(a.outcome) : a.outcome);
  const operations: Record<string, { sent: number; ok: number; refused: Record<string, number>; failed: Record<string, number> }> = {};
  for (const [op, o] of [...rec.operations].sort(([a], [b]) => a.localeCompare(b))) operations[op] = { sent: o.sent, ok: o.ok, refused: Object.fromEntries(o.refused), failed: Object.fromEntries(o.failed) };
  const opsSent = [...rec.operations.values()].reduce((n, o) => n + o.sent, 0);
  const opsOk = [...rec.operations.values()].reduce((n, o) => n + o.ok, 0);

  // 5xx: a 503 with Retry-After is the service saying "retry"; anything else is counted.
  const fivexx = rec.attempts.filter((a) => typeof a.outcome === "number" && a.outcome >= 500);
  const bad5xx = fivexx.filter((a) => !(a.outcome === 503 && a.retryAfter));
  for (const a of bad5xx) problem("5xx without Retry-After", { ...a, at: new Date(a.at).toISOString() }, a.at);
  // An error inside a stream has no headers: a 503 there is the stream's "retry" (resumed by the runner).
  const streamError5xx = rec.streamErrors.filter((e) => e.status >= 500 && e.status !== 503);
  for (const e of rec.streamErrors) {
    const s = rec.streams.find((x) => x.id === e.stream);
    const run = s?.runId ? runs.get(s.runId) : undefined;
    problem(
      `error frame in a stream (${e.status} ${e.code})`,
      {
        ...e,
        at: new Date(e.at).toISOString(),
        op: s?.op,
        run: s?.runId,
        turn: s?.turnId,
        received: s?.events.map((x) => `${x.conn}/${x.seq}:${x.type}`),
        connections: s?.connections.map((c) => ({ ...c, at: new Date(c.at).toISOString() })),
        cuts: s?.cuts.map((c) => ({ ...c, at: new Date(c.at).toISOString() })),
        end: s?.end,
        key_answers: s?.key ? rec.keyed.get(s.key)?.map((a) => ({ ...a, at: new Date(a.at).toISOString() })) : undefined,
        turn_events_listed: turnEventsOf(s, runs, rec),
        turn_status: run && s?.turnId ? run.turns.find((t) => t.id === s.turnId)?.status : undefined,
      },
      // The stall began when the connection that carried the error was opened, not when the error came.
      s?.connections.filter((c) => c.at <= e.at).at(-1)?.at ?? e.at,
      streamError5xx.includes(e),
    );
  }

  // The runner raises the rate limits to 1,000,000 per window: any 429 is a limiter's mistake.
  const tooMany = rec.attempts.filter((a) => a.outcome === 429);
  for (const a of tooMany) problem("429 although the limits are far away", { ...a, at: new Date(a.at).toISOString() }, a.at, false);

  // Turns: every turn the histories hold, and every admitted turn.
  const turnStatus = new Map<string, { runId: string; status: string; code?: string; key?: string; created_at?: number }>();
  for (const run of runs.values()) for (const t of run.turns) turnStatus.set(t.id, { runId: run.runId, status: t.status, code: t.code, key: t.key, created_at: t.created_at });
  const turns = { admitted: rec.admitted.size, in_histories: turnStatus.size, completed: 0, failed: {} as Record<string, number>, cancelled: 0, incomplete: {} as Record<string, number>, lost: 0, not_acknowledged: 0 };
  for (const [turnId, t] of turnStatus) {
    if (t.status === "completed") turns.completed++;
    else if (t.status === "cancelled") turns.cancelled++;
    else if (t.status === "failed") bump(turns.failed, t.code ?? "(no code)");
    else if (t.status === "incomplete") bump(turns.incomplete, t.code ?? "(no code)");
    if (!rec.admitted.has(turnId)) {
      turns.not_acknowledged++;
      const answers = t.key ? (rec.keyed.get(t.key) ?? []) : [];
      problem("turn whose answer never reached the client", { run: t.runId, turn: turnId, status: t.status, key: t.key, key_answers: answers.length }, t.created_at && t.created_at * 1000, false);
    }
    if (!FINAL_STATUSES.has(t.status)) {
      turns.lost++;
      const admitted = rec.admitted.get(turnId);
      const events = runs.get(t.runId)?.events.filter((e) => e.turn_id === turnId).map((e) => `${e.sequence}:${e.type}`);
      problem("turn lost (not final after quiescence)", { run: t.runId, turn: turnId, status: t.status, admitted_by: admitted?.op, admitted_at: admitted && new Date(admitted.at).toISOString(), events }, admitted?.at);
    }
  }
  for (const [turnId, admitted] of rec.admitted) {
    if (turnStatus.has(turnId)) continue;
    const run = runs.get(admitted.runId);
    turns.lost++;
    problem(
      "turn lost (admitted, missing from its run's history)",
      { run: admitted.runId, turn: turnId, admitted_by: admitted.op, admitted_at: new Date(admitted.at).toISOString(), run_read: run ? (run.error ?? `${run.turns.length} turns`) : "run not read" },
      admitted.at,
    );
  }

  // What each fault did to turns: those that ended incomplete from its start to 15 s after it was undone.
  for (const fault of rec.faults) {
    const from = fault.startedAt / 1000 - 1;
    const to = (fault.recoveredAt ?? fault.endedAt) / 1000 + 15;
    fault.turnsEndedIncompleteNear = [...runs.values()].flatMap((r) => r.turns).filter((t) => t.status === "incomplete" && t.completed_at !== undefined && t.completed_at >= from && t.completed_at <= to).length;
  }

  // Event histories.
  let runsWithGaps = 0;
  let runsOutOfOrder = 0;
  let executedTwice = 0;
  let finalMismatches = 0;
  for (const run of runs.values()) {
    if (run.error) continue;
    const check = checkRunEvents(run);
    if (check.gaps.length || check.duplicates.length) {
      runsWithGaps++;
      problem("event gap or duplicate", { run: run.runId, deleted: run.deleted, gaps: check.gaps, duplicates: check.duplicates, events: run.events.length }, run.events[0] && run.events[0].created_at * 1000);
    }
    if (check.outOfOrder.length) {
      runsOutOfOrder++;
      const first = check.outOfOrder[0];
      const from = Math.max(0, run.events.findIndex((e) => e.sequence === first.after) - 3);
      problem(
        "events listed out of sequence order",
        {
          run: run.runId,
          deleted: run.deleted,
          inversions: check.outOfOrder.map((o) => `${o.at} after ${o.after}`),
          listed_around_first: run.events.slice(from, from + 16).map((e) => `${e.sequence}:${e.type}@${e.created_at}`),
        },
        first.createdAt * 1000,
      );
    }
    for (const twice of check.startedTwice) {
      executedTwice++;
      const admitted = rec.admitted.get(twice.turnId);
      const events = run.events.filter((e) => e.turn_id === twice.turnId).map((e) => `${e.sequence}:${e.type}@${e.created_at}`);
      problem("turn executed twice", { run: run.runId, turn: twice.turnId, started: twice.count, events }, admitted?.at);
    }
    for (const m of check.finalMismatches) {
      finalMismatches++;
      problem("final event does not match the turn", { run: run.runId, ...m }, rec.admitted.get(m.turnId)?.at, false);
    }
  }

  // Keyed calls refused with a 4xx: with every attempt of the key, so a refusal that follows an
  // attempt lost to a fault (the work may have been done) can be told from an ordinary one.
  const refusedKeys = new Set<string>();
  for (const [key, answers] of rec.keyed) if (answers.some((a) => a.status >= 400)) refusedKeys.add(key);
  let refusedAfterFault = 0;
  for (const key of refusedKeys) {
    const attempts = rec.attempts.filter((a) => a.key === key);
    const firstRefusal = attempts.findIndex((a) => typeof a.outcome === "number" && a.outcome >= 400 && a.outcome < 500);
    const faultBefore = attempts.slice(0, Math.max(0, firstRefusal)).some((a) => typeof a.outcome !== "number" || a.outcome >= 500);
    if (faultBefore) refusedAfterFault++;
    problem(
      faultBefore ? "keyed call refused after an attempt lost to a fault" : "keyed call refused",
      { key, attempts: attempts.map((a) => ({ at: new Date(a.at).toISOString(), op: a.op, method: a.method, path: a.path, node: a.node, outcome: a.outcome, code: a.code })) },
      attempts[0]?.at,
      false,
    );
  }

  // Idempotency.
  const violations = idempotencyViolations(rec.keyed);
  for (const v of violations) {
    problem(`idempotency violation (${v.kind})`, { key: v.key, answers: v.answers.map((a) => ({ ...a, at: new Date(a.at).toISOString() })) }, v.answers[0]?.at);
  }
  // Two turns whose inputs carry one key: the key made two turns, whatever the client was answered.
  const turnsByKey = new Map<string, string[]>();
  for (const [turnId, t] of turnStatus) if (t.key) turnsByKey.set(t.key, [...(turnsByKey.get(t.key) ?? []), turnId]);
  let keyDuplicates = 0;
  for (const [key, ids] of turnsByKey) {
    if (ids.length < 2) continue;
    keyDuplicates++;
    const answers = (rec.keyed.get(key) ?? []).map((a) => ({ ...a, at: new Date(a.at).toISOString() }));
    problem("idempotency violation (two turns carry one key)", { key, turns: ids.map((id) => ({ id, ...turnStatus.get(id) })), answers }, rec.keyed.get(key)?.[0]?.at);
  }

  // Streams.
  const sse = { streams: rec.streams.length, connections: 0, resumes: 0, resumes_checked: 0, resumes_bad: 0, gaps_within_connection: 0, unchecked_streams: 0, cuts: {} as Record<string, number>, reconnects_by: {} as Record<string, number>, ended: {} as Record<string, number>, error_frames: {} as Record<string, number> };
  for (const s of rec.streams) {
    sse.connections += s.connections.length;
    for (const c of s.cuts) bump(sse.cuts, c.reason);
    for (const c of s.connections.slice(1)) bump(sse.reconnects_by, c.resumedWith);
    bump(sse.ended, s.end ?? "?");
    const run = s.runId ? runs.get(s.runId) : undefined;
    const history = run && !run.error && s.turnId ? turnHistory(run, s.turnId) : undefined;
    const check = checkStream(s, history);
    sse.resumes += check.resumes;
    if (!check.checked) {
      if (s.connections.length > 0) sse.unchecked_streams++;
      continue;
    }
    sse.resumes_checked += check.resumes;
    sse.resumes_bad += check.badResumes.length;
    sse.gaps_within_connection += check.gapsWithin.length;
    if (check.badResumes.length || check.gapsWithin.length) {
      problem(
        check.badResumes.length ? "SSE resume skipped or repeated an event" : "SSE gap inside a connection",
        {
          stream: s.id,
          op: s.op,
          run: s.runId,
          turn: s.turnId,
          bad_resumes: check.badResumes,
          gaps_within: check.gapsWithin,
          received: s.events.map((e) => `${e.conn}/${e.seq}:${e.type}`),
          history,
          connections: s.connections.map((c) => ({ ...c, at: new Date(c.at).toISOString() })),
          cuts: s.cuts.map((c) => ({ ...c, at: new Date(c.at).toISOString() })),
          end: s.end,
          error: s.error,
        },
        s.connections.at(-1)?.at,
      );
    }
  }
  for (const e of rec.streamErrors) bump(sse.error_frames, `${e.status} ${e.code}`);

  const faults: Record<string, number> = {};
  for (const f of rec.faults) bump(faults, f.kind);
  if (rec.drops.length) faults["client-drop (random, single request)"] = rec.drops.length;

  const ledger = {
    ...meta,
    requests: { http_attempts: loadAttempts.length, by_outcome: byOutcome, operations_sent: opsSent, operations_2xx: opsOk, operations },
    runner_reads: { http_attempts: rec.attempts.length - loadAttempts.length, by_outcome: runnerByOutcome },
    turns,
    turns_lost: turns.lost,
    turns_executed_twice: executedTwice,
    idempotency: {
      keys: rec.keyed.size,
      repeats_on_purpose: rec.repeats.onPurpose,
      repeats_after_fault: rec.repeats.afterFault,
      violations: violations.length + keyDuplicates,
      answered_inconsistently: violations.length,
      keys_with_two_turns: keyDuplicates,
      refused_after_an_attempt_lost_to_a_fault: refusedAfterFault,
    },
    events: {
      runs_checked: [...runs.values()].filter((r) => !r.error).length,
      runs_unreadable: [...runs.values()].filter((r) => r.error).length,
      runs_with_gaps_or_duplicates: runsWithGaps,
      runs_out_of_sequence_order: runsOutOfOrder,
      final_event_mismatches: finalMismatches,
    },
    sse,
    unexpected_429: tooMany.length,
    http_5xx: { total: fivexx.length, "503_with_retry_after": fivexx.length - bad5xx.length, other: bad5xx.length, error_frames_5xx_not_503: streamError5xx.length },
    faults_injected: faults,
    faults_unchecked: rec.faults.filter((f) => !f.effect.checked).map((f) => `${f.kind} ${f.target} at ${new Date(f.startedAt).toISOString()}: ${f.effect.observed}`),
    notes,
  };
  const failing: string[] = [];
  if (turns.lost) failing.push(`turns lost: ${turns.lost}`);
  if (executedTwice) failing.push(`turns executed twice: ${executedTwice}`);
  if (violations.length + keyDuplicates) failing.push(`idempotency violations: ${violations.length + keyDuplicates}`);
  if (runsWithGaps) failing.push(`runs with event gaps or duplicates: ${runsWithGaps}`);
  // Not a gap: every number is there once. But the list is to be in run sequence order (runs-api.md), and a
  // consumer that resumes or dedups by sequence would lose or reorder events.
  if (runsOutOfOrder) failing.push(`runs whose events are listed out of sequence order: ${runsOutOfOrder}`);
  if (sse.resumes_bad) failing.push(`SSE resumes that skipped or repeated an event: ${sse.resumes_bad}`);
  if (sse.gaps_within_connection) failing.push(`SSE gaps inside a connection: ${sse.gaps_within_connection}`);
  if (bad5xx.length + streamError5xx.length) failing.push(`5xx other than 503 with Retry-After: ${bad5xx.length + streamError5xx.length}`);
  return { ledger: { ...ledger, failing }, problems };
}

/** The ledger as text for people (summary.txt and the end of the runner's output). */
export function summaryText(ledger: ReturnType<typeof buildLedger>["ledger"], outDir: string): string {
  const l = ledger as any;
  const fmt = (o: Record<string, number>) => (Object.keys(o).length ? Object.entries(o).map(([k, v]) => `${k} ${v}`).join(", ") : "none");
  const lines = [
    `chaos run: ${l.load_minutes} min of load, ${l.clients} clients, seed ${l.seed}; ${l.started_at} → ${l.ended_at}`,
    `cluster: ${l.nodes} nodes, ${l.nats_servers} NATS servers, FerretDB; lease ${l.lease_ttl_ms} ms; git ${l.git}`,
    `faults injected: ${fmt(l.faults_injected)}`,
    ...(l.faults_unchecked.length ? ["faults whose effect was not confirmed:", ...l.faults_unchecked.map((f: string) => `  - ${f}`)] : []),
    "",
    `requests sent: ${l.requests.operations_sent} calls, ${l.requests.http_attempts} HTTP attempts (${fmt(l.requests.by_outcome)})`,
    `calls answered 2xx: ${l.requests.operations_2xx}   (the runner's own reads, apart: ${l.runner_reads.http_attempts} attempts, ${fmt(l.runner_reads.by_outcome)})`,
    ...Object.entries(l.requests.operations).map(([op, o]: [string, any]) => `  ${op.padEnd(24)} sent ${String(o.sent).padStart(5)}  2xx ${String(o.ok).padStart(5)}  refused ${fmt(o.refused)}  failed ${fmt(o.failed)}`),
    `turns: ${l.turns.admitted} acknowledged, ${l.turns.in_histories} in run histories (${l.turns.not_acknowledged} whose answer never reached the client)`,
    `  completed ${l.turns.completed}; failed ${fmt(l.turns.failed)}; cancelled ${l.turns.cancelled}; incomplete ${fmt(l.turns.incomplete)}`,
    `turns lost:                     ${l.turns_lost}`,
    `turns executed twice:           ${l.turns_executed_twice}`,
    `idempotency violations:         ${l.idempotency.violations}   (${l.idempotency.keys} keys; ${l.idempotency.repeats_on_purpose} repeats on purpose, ${l.idempotency.repeats_after_fault} after a fault; answered inconsistently ${l.idempotency.answered_inconsistently}, keys with two turns ${l.idempotency.keys_with_two_turns}; refused with a 4xx after an attempt lost to a fault ${l.idempotency.refused_after_an_attempt_lost_to_a_fault})`,
    `runs with event gaps/duplicates: ${l.events.runs_with_gaps_or_duplicates}   (${l.events.runs_checked} runs checked, ${l.events.runs_unreadable} unreadable; final-event mismatches ${l.events.final_event_mismatches})`,
    `runs with events out of order:  ${l.events.runs_out_of_sequence_order}   (all numbers 1..n present once, but listed and streamed in another order)`,
    `SSE resumes skipped/repeated:   ${l.sse.resumes_bad}   (${l.sse.streams} streams, ${l.sse.resumes} resumes, ${l.sse.resumes_checked} checked; cuts ${fmt(l.sse.cuts)}; reconnects ${fmt(l.sse.reconnects_by)}; ended ${fmt(l.sse.ended)}; error frames ${fmt(l.sse.error_frames)}; gaps inside a connection ${l.sse.gaps_within_connection})`,
    `5xx other than 503+Retry-After: ${l.http_5xx.other + l.http_5xx.error_frames_5xx_not_503}   (${l.http_5xx["503_with_retry_after"]} answers 503 with Retry-After)`,
    `429 answers (limits set out of reach): ${l.unexpected_429}`,
    "",
    l.failing.length ? `FAILED: ${l.failing.join("; ")} (details in problems.json, "counted": true)` : "PASSED: nothing lost, doubled, conflicting, skipped or unexplained",
    `results: ${outDir}`,
  ];
  return `${lines.join("\n")}\n`;
}
