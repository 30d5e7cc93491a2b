/** The runs list (filters, cursor paging, live refresh) and one run's view. */
import { useEffect, useState } from "preact/hooks";
import { ApiFailure, call, type Report, when, withQuery } from "./api.js";
import { Events } from "./events.js";
import { usageText } from "./usage.js";
import { FINAL_STATUSES, type Action, type List, type PendingAction, type Run, type RunEvent, type RunSummary, type Turn } from "./types.js";

const REFRESH_MS = 3_000;

interface Filters {
  agent_id: string;
  version: string;
  state: string;
  tags: string;
  created_after: string;
  created_before: string;
  /** "true": only runs waiting for a person's decision. */
  pending_action: string;
}

const NO_FILTERS: Filters = { agent_id: "", version: "", state: "", tags: "", created_after: "", created_before: "", pending_action: "" };

const seconds = (local: string) => (local ? String(Math.floor(new Date(local).getTime() / 1000)) : undefined);

function listPath(filters: Filters, after: string | undefined): string {
  const tags = filters.tags.split(",").map((t) => t.trim()).filter(Boolean);
  return withQuery("/api/v1/runs", {
    agent_id: filters.agent_id.trim() || undefined,
    version: filters.version.trim() || undefined,
    state: filters.state || undefined,
    tag: tags.length ? tags : undefined,
    created_after: seconds(filters.created_after),
    created_before: seconds(filters.created_before),
    pending_action: filters.pending_action || undefined,
    limit: 20,
    after,
  });
}

export function RunsList({ report }: { report: Report }) {
  const [draft, setDraft] = useState<Filters>(NO_FILTERS);
  const [filters, setFilters] = useState<Filters>(NO_FILTERS);
  // Cursors of the pages before this one: "previous" pops, "next" pushes.
  const [cursors, setCursors] = useState<Array<string | undefined>>([undefined]);
  // The page shown and the query it answers: after a new filter the old page stays in
  // view, marked busy, until the new one arrives.
  const [shown, setShown] = useState<{ path: string; page: List<RunSummary> } | null>(null);
  const page = shown?.page ?? null;
  const after = cursors.at(-1);
  const path = listPath(filters, after);

  useEffect(() => {
    let stopped = false;
    const load = () =>
      call<List<RunSummary>>("GET", path)
        .then(({ body }) => !stopped && setShown({ path, page: body }))
        .catch((err) => !stopped && report(err));
    void load();
    const timer = setInterval(load, REFRESH_MS);
    return () => {
      stopped = true;
      clearInterval(timer);
    };
  }, [filters, after]);

  const field = (name: keyof Filters, label: string, type = "text") => (
    <label>
      {label}
      <input name={name} type={type} value={draft[name]} onInput={(e) => setDraft({ ...draft, [name]: (e.target as HTMLInputElement).value })} />
    </label>
  );

  return (
    <section>
      <h2>Runs</h2>
      <form
        class="filters"
        onSubmit={(e) => {
          e.preventDefault();
          setCursors([undefined]);
          setFilters(draft);
        }}
      >
        {field("agent_id", "agent")}
        {field("version", "version")}
        <label>
          state
          <select name="state" value={draft.state} onChange={(e) => setDraft({ ...draft, state: (e.target as HTMLSelectElement).value })}>
            <option value="">any</option>
            <option value="idle">idle</option>
            <option value="busy">busy</option>
          </select>
        </label>
        {field("tags", "tags (comma-separated, all must match)")}
        {field("created_after", "created after", "datetime-local")}
        {field("created_before", "created before", "datetime-local")}
        <label>
          <input
            name="pending_action"
            type="checkbox"
            checked={draft.pending_action === "true"}
            onChange={(e) => setDraft({ ...draft, pending_action: (e.target as HTMLInputElement).checked ? "true" : "" })}
          />
          waiting for approval
        </label>
        <button type="submit">Filter</button>
      </form>
      <table class="runs" data-testid="runs-table" data-query={shown?.path} aria-busy={shown?.path !== path ? "true" : "false"}>
        <thead>
          <tr><th>run</th><th>agent</th><th>version</th><th>state</th><th>tags</th><th>created</th><th>last activity</th></tr>
        </thead>
        <tbody>
          {page?.data.map((run) => (
            <tr key={run.id} data-run-id={run.id}>
              <td><a href={`#/runs/${run.id}`}>{run.id}</a></td>
              <td>{run.agent_id}</td>
              <td>{run.agent_version}</td>
              <td class={`state ${run.state}`}>
                {run.state}
                {run.pending_action && <span class="waiting" data-testid="run-waiting"> waiting for approval of {run.pending_action.tool}</span>}
              </td>
              <td>{run.tags.join(", ")}</td>
              <td>{when(run.created_at)}</td>
              <td>{when(run.last_activity_at)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {page && page.data.length === 0 && <p class="muted">No runs match.</p>}
      <p class="paging">
        <button type="button" disabled={cursors.length < 2} onClick={() => setCursors(cursors.slice(0, -1))}>Previous</button>
        <button type="button" disabled={!page?.has_more} onClick={() => page?.next_cursor && setCursors([...cursors, page.next_cursor])}>Next</button>
        <span class="muted"> live: refreshed every {REFRESH_MS / 1000} s</span>
      </p>
    </section>
  );
}

function TurnCard({ turn }: { turn: Turn }) {
  return (
    <li class={`turn ${turn.status}`} data-turn-id={turn.id}>
      <p>
        <strong class="status" data-testid="turn-status">{turn.status}</strong> <span class="muted">{turn.id} · version {turn.agent_version}</span>
        {turn.pending_action && <span class="waiting" data-testid="turn-waiting"> waiting for approval of {turn.pending_action.tool}</span>}
      </p>
      <p class="muted">
        created {when(turn.created_at)} · started {when(turn.started_at)} · ended {when(turn.completed_at)}
        {turn.duration_ms !== null && ` · ${turn.duration_ms} ms`}
        {turn.usage && <span data-testid="turn-usage"> · {usageText(turn.usage)}</span>}
      </p>
      <div class="io">
        <div>
          <h4>input</h4>
          {turn.input.map((part, i) => <pre key={i}>{part.type === "input_text" ? part.text : `file ${part.file_id ?? part.filename ?? ""}`}</pre>)}
        </div>
        <div>
          <h4>output</h4>
          {turn.output.map((part, i) => <pre key={i} data-testid="turn-output">{part.text}</pre>)}
        </div>
      </div>
      {turn.error && (
        <p class="error" data-testid="turn-error">
          {turn.error.code} ({turn.error.source}{turn.error.retryable ? ", retryable" : ""}): {turn.error.message} <span class="muted">reference {turn.error.reference}</span>
        </p>
      )}
    </li>
  );
}

type Decision = "approve" | "deny";

/** The tool call a turn waits for, shown whole (a person decides on what it shows), with Approve and Deny. */
function PendingActionPanel({ turn, action, decide }: { turn: Turn; action: PendingAction; decide: (decision: Decision, reason: string) => Promise<void> }) {
  const [reason, setReason] = useState("");
  const [sending, setSending] = useState<Decision | null>(null);
  const send = async (decision: Decision) => {
    setSending(decision);
    try {
      await decide(decision, reason);
    } finally {
      setSending(null);
    }
  };
  return (
    <section class="pending-action" data-testid="pending-action" data-action-id={action.id} aria-label="tool call waiting for approval">
      <h3>Waiting for approval</h3>
      <p>
        Turn <span class="muted">{turn.id}</span> asks to run the tool <strong data-testid="pending-tool">{action.tool}</strong> with these arguments; nothing of it has run yet.
      </p>
      <pre data-testid="pending-arguments">{JSON.stringify(action.arguments, null, 2)}</pre>
      <p class="muted">
        action {action.id} · call {action.tool_call_id} · requested {when(action.requested_at)} · expires <span data-testid="pending-expires">{when(action.expires_at)}</span> (then the agent's timeout rule decides)
      </p>
      <form class="decide" onSubmit={(e) => e.preventDefault()}>
        <label>
          reason (optional; kept with the decision, and the model reads it with a denial)
          <input name="reason" value={reason} onInput={(e) => setReason((e.target as HTMLInputElement).value)} />
        </label>
        <button type="button" class="approve" disabled={sending !== null} onClick={() => void send("approve")}>{sending === "approve" ? "Approving…" : "Approve"}</button>
        <button type="button" class="deny" disabled={sending !== null} onClick={() => void send("deny")}>{sending === "deny" ? "Denying…" : "Deny"}</button>
      </form>
    </section>
  );
}

export function RunView({ runId, report }: { runId: string; report: Report }) {
  const [run, setRun] = useState<Run | null>(null);
  const [turns, setTurns] = useState<Turn[]>([]);
  const [outcome, setOutcome] = useState<string | null>(null);
  const [newTag, setNewTag] = useState("");
  const [gone, setGone] = useState(false);

  const load = async () => {
    try {
      const [{ body: current }, { body: history }] = await Promise.all([
        call<Run>("GET", `/api/v1/runs/${runId}`),
        call<List<Turn>>("GET", withQuery(`/api/v1/runs/${runId}/turns`, { limit: 100 })),
      ]);
      setRun(current);
      setTurns(history.data);
    } catch (err) {
      report(err);
    }
  };
  useEffect(() => {
    void load();
    // Turns move on between platform events too (a queued turn starts): a slow poll besides them.
    const timer = setInterval(() => void load(), REFRESH_MS);
    return () => clearInterval(timer);
  }, [runId]);
  const [decisionFailure, setDecisionFailure] = useState<Error | null>(null);
  const onRunChange = (event: RunEvent) => {
    void load();
    // The request is announced just before the turn stores it: read again shortly after.
    if (event.type === "tool.approval_requested") setTimeout(() => void load(), 1_000);
  };
  /** POST the decision (a fresh Idempotency-Key per click), show the answer or the API's error, and read the run again. */
  const decide = async (action: PendingAction, decision: Decision, reason: string) => {
    setDecisionFailure(null);
    try {
      const { status, body } = await call<Action>("POST", `/api/v1/runs/${runId}/actions/${action.id}`, reason.trim() ? { decision, reason: reason.trim() } : { decision });
      setOutcome(`${decision}: ${status} ${body.decision === "approve" ? "approved" : "denied"} ${body.tool} (${body.id})`);
    } catch (err) {
      setDecisionFailure(err instanceof Error ? err : new Error(String(err)));
    }
    await load();
  };

  const act = async (what: string, work: () => Promise<{ status: number; body: unknown }>, describe: (status: number, body: any) => string) => {
    try {
      const { status, body } = await work();
      setOutcome(`${what}: ${status} ${describe(status, body)}`);
      await load();
    } catch (err) {
      setOutcome(err instanceof ApiFailure ? `${what}: ${err.status} ${err.code}: ${err.message}` : `${what}: ${String(err)}`);
    }
  };
  const editTags = (edit: { add?: string[]; remove?: string[] }) =>
    act("tags", () => call("POST", `/api/v1/runs/${runId}/tags`, edit), (_s, body: { tags: string[] }) => `tags now: ${body.tags.join(", ") || "none"}`);

  if (gone) return <p>Run {runId} was deleted. <a href="#/runs">Back to the runs</a></p>;
  if (!run) return <p class="muted">Loading {runId}…</p>;
  const busy = run.state === "busy" || !FINAL_STATUSES.includes(run.turn.status);
  // The run's latest turn may be queued behind the one that waits: look through the turns too.
  const waiting = run.turn.pending_action ? run.turn : turns.find((turn) => turn.pending_action && !FINAL_STATUSES.includes(turn.status));
  const pending = waiting?.pending_action ?? null;
  return (
    <section class="run" data-testid="run-view">
      <h2>
        Run {run.id} <span class={`state ${run.state}`} data-testid="run-state">{run.state}</span>
      </h2>
      <p class="muted">agent {run.agent_id} · version {run.agent_version} · created {when(run.created_at)}</p>
      <div class="actions">
        <button type="button" disabled={!busy} onClick={() => act("cancel", () => call("POST", `/api/v1/runs/${runId}/cancel`, {}), (status, body: Run) => (status === 202 ? `cancelling (turn ${body.turn.status})` : `turn ${body.turn.status}`))}>
          Cancel turn
        </button>
        <button
          type="button"
          onClick={() =>
            act("delete", async () => {
              const answer = await call("DELETE", `/api/v1/runs/${runId}`);
              setGone(true);
              return answer;
            }, () => "deleted")
          }
        >
          Delete run
        </button>
        {outcome && <output data-testid="outcome">{outcome}</output>}
      </div>
      {decisionFailure && (
        <p class="error" role="alert" data-testid="decision-error">
          decision refused:{" "}
          {decisionFailure instanceof ApiFailure ? (
            <>
              <strong>{decisionFailure.code}</strong> ({decisionFailure.status}{decisionFailure.param ? `, ${decisionFailure.param}` : ""}): {decisionFailure.message}
            </>
          ) : (
            decisionFailure.message
          )}
        </p>
      )}
      {waiting && pending && <PendingActionPanel key={pending.id} turn={waiting} action={pending} decide={(decision, reason) => decide(pending, decision, reason)} />}
      <p class="muted" data-testid="run-usage">usage: {usageText(run.usage)}</p>
      <div class="tags" data-testid="tags">
        tags:{" "}
        {run.tags.map((tag) => (
          <span class="tag" key={tag}>
            {tag} <button type="button" title={`remove ${tag}`} onClick={() => editTags({ remove: [tag] })}>×</button>
          </span>
        ))}
        <form
          onSubmit={(e) => {
            e.preventDefault();
            if (newTag) void editTags({ add: [newTag] }).then(() => setNewTag(""));
          }}
        >
          <input name="tag" placeholder="add a tag" value={newTag} onInput={(e) => setNewTag((e.target as HTMLInputElement).value)} />
          <button type="submit">Add</button>
        </form>
      </div>
      <h3>Turns</h3>
      <ol class="turns">{turns.map((turn) => <TurnCard key={turn.id} turn={turn} />)}</ol>
      <Events runId={runId} onRunChange={onRunChange} />
    </section>
  );
}
