/** A run's events as they happen: text as text, tool calls folded, platform events as a timeline. */
import { useEffect, useState } from "preact/hooks";
import { ApiFailure, call, stream, when, withQuery } from "./api.js";
import type { EventList, RunEvent } from "./types.js";

type Item =
  | { kind: "platform"; event: RunEvent }
  | { kind: "text"; id: string; turnId: string | null; text: string }
  | { kind: "tool"; id: string; name: string; args: unknown; result?: unknown; isError?: boolean; done: boolean; approval?: "waiting" | "approve" | "deny" }
  /** tool.approval_requested and tool.approval_decided: a gated call asked for, and its decision. */
  | { kind: "approval"; event: RunEvent };

/** Folds events into what a person reads; exported for the run view's tests of shape. */
export function itemsOf(events: RunEvent[]): Item[] {
  const items: Item[] = [];
  const tools = new Map<string, Extract<Item, { kind: "tool" }>>();
  for (const event of events) {
    const data = event.data;
    if (event.source === "platform") {
      items.push({ kind: "platform", event });
    } else if (event.type === "text_delta") {
      const last = items.at(-1);
      if (last?.kind === "text" && last.turnId === event.turn_id) last.text += String(data.delta ?? "");
      else items.push({ kind: "text", id: event.id, turnId: event.turn_id, text: String(data.delta ?? "") });
    } else if (event.type === "tool_execution_start") {
      const tool: Extract<Item, { kind: "tool" }> = { kind: "tool", id: String(data.toolCallId), name: String(data.toolName), args: data.args, done: false };
      tools.set(tool.id, tool);
      items.push(tool);
    } else if (event.type === "tool_execution_end") {
      const tool = tools.get(String(data.toolCallId));
      if (tool) Object.assign(tool, { result: data.result, isError: data.isError === true, done: true });
    } else if (event.type === "tool.approval_requested" || event.type === "tool.approval_decided") {
      const tool = tools.get(String(data.tool_call_id));
      if (tool) tool.approval = event.type === "tool.approval_requested" ? "waiting" : data.decision === "approve" ? "approve" : "deny";
      items.push({ kind: "approval", event });
    }
  }
  return items;
}

function resultText(result: unknown): string {
  const content = (result as { content?: Array<{ type: string; text?: string }> } | undefined)?.content;
  if (Array.isArray(content)) return content.map((part) => (part.type === "text" ? (part.text ?? "") : `[${part.type}]`)).join("\n");
  return JSON.stringify(result ?? null, null, 2);
}

function toolState(item: Extract<Item, { kind: "tool" }>): string {
  if (!item.done) return item.approval === "waiting" ? "waiting for approval…" : "running…";
  if (item.approval === "deny") return "denied";
  return item.isError ? "failed" : item.approval === "approve" ? "done (approved)" : "done";
}

/** An approval event in words: what was asked and until when, or who decided what and why. */
function ApprovalLine({ event }: { event: RunEvent }) {
  const data = event.data as { action_id?: string; tool?: string; arguments?: unknown; expires_at?: number; decision?: string; reason?: string | null; decided_by?: string };
  if (event.type === "tool.approval_requested") {
    return (
      <li class="approval requested" data-type={event.type} data-action-id={data.action_id}>
        <time>{when(event.created_at)}</time> <strong>approval requested</strong>: tool <strong>{data.tool}</strong>, waiting for a person until {when(data.expires_at)}{" "}
        <span class="muted">{data.action_id}</span>
        <pre>{JSON.stringify(data.arguments ?? null, null, 2)}</pre>
      </li>
    );
  }
  const verb = data.decision === "approve" ? "approved" : "denied";
  const by = data.decided_by === "timeout" ? "when the request expired" : "by a person";
  return (
    <li class={`approval decided ${data.decision === "approve" ? "approved" : "denied"}`} data-type={event.type} data-action-id={data.action_id} data-decision={data.decision}>
      <time>{when(event.created_at)}</time> <strong>{verb}</strong> {by}
      {data.reason ? `: ${data.reason}` : ""} <span class="muted">{data.action_id}</span>
    </li>
  );
}

const lastSeenItem = (runId: string) => `runs.console.last-event.${runId}`;

/** The run's stored events, then its live stream resumed from the last one seen (kept across a reload). */
/** The run's events; `onRunChange` hears those that change what the run view shows (platform events, approvals). */
export function Events({ runId, onRunChange }: { runId: string; onRunChange: (event: RunEvent) => void }) {
  const [events, setEvents] = useState<RunEvent[]>([]);
  const [history, setHistory] = useState<string | null>(null);
  const [live, setLive] = useState<"connecting" | "live" | "ended" | "error">("connecting");
  const [problem, setProblem] = useState<string | null>(null);

  useEffect(() => {
    const controller = new AbortController();
    let lastId: string | undefined;
    // By sequence (an event's place in its run), not id: an event read again may carry another id (README, event ids).
    const seen = new Set<number>();
    const add = (batch: RunEvent[]) => {
      const fresh = batch.filter((e) => !seen.has(e.sequence));
      for (const e of fresh) seen.add(e.sequence);
      if (fresh.length === 0) return;
      lastId = fresh.at(-1)!.id;
      sessionStorage.setItem(lastSeenItem(runId), lastId);
      setEvents((old) => [...old, ...fresh]);
      for (const e of fresh) if (e.source === "platform" || e.type.startsWith("tool.approval_")) onRunChange(e);
    };
    (async () => {
      try {
        // What is stored (bounded: 10 pages of 1,000), for the history status and the timeline.
        let after: string | undefined;
        for (let page = 0; page < 10; page++) {
          const { body } = await call<EventList>("GET", withQuery(`/api/v1/runs/${runId}/events`, { limit: 1000, after }));
          if (page === 0) setHistory(body.history.status);
          add(body.data);
          if (!body.has_more || !body.next_cursor) break;
          after = body.next_cursor;
        }
        lastId ??= sessionStorage.getItem(lastSeenItem(runId)) ?? undefined;
        // Then live: reconnect after a cut from the last event seen, a bounded number of times in a row.
        for (let attempt = 0; attempt < 20 && !controller.signal.aborted; attempt++) {
          setLive("live");
          let got = 0;
          try {
            await stream(withQuery(`/api/v1/runs/${runId}/events`, { stream: true }), lastId, (frame) => {
              if (frame.event === "error") throw new ApiFailure(0, "stream_error", frame.data);
              got++;
              add([JSON.parse(frame.data) as RunEvent]);
            }, controller.signal);
          } catch (err) {
            if (controller.signal.aborted) return;
            if (err instanceof ApiFailure && err.status >= 400 && err.status < 500) throw err;
            if (err instanceof ApiFailure && err.code === "stream_error") setProblem(`The stream ended with an error: ${err.message}`);
          }
          if (got > 0) attempt = 0;
          await new Promise((resolve) => setTimeout(resolve, 1_000));
        }
        if (!controller.signal.aborted) setLive("ended");
      } catch (err) {
        if (controller.signal.aborted) return;
        setLive("error");
        setProblem(err instanceof ApiFailure ? `${err.message} (${err.code})` : String(err));
      }
    })();
    return () => controller.abort();
  }, [runId]);

  return (
    <section class="events" aria-label="events">
      <h3>
        Events <span class="muted" data-testid="history-status">history: {history ?? "…"}</span>{" "}
        <span class={`live ${live}`} data-testid="live-state">{live}</span>
      </h3>
      {problem && <p class="error">{problem}</p>}
      <ol class="timeline" data-testid="timeline">
        {itemsOf(events).map((item) =>
          item.kind === "platform" ? (
            <li key={item.event.id} class="platform" data-type={item.event.type}>
              <time>{when(item.event.created_at)}</time> <strong>{item.event.type}</strong>
              {item.event.turn_id && <span class="muted"> {item.event.turn_id}</span>}
            </li>
          ) : item.kind === "approval" ? (
            <ApprovalLine key={item.event.id} event={item.event} />
          ) : item.kind === "text" ? (
            <li key={item.id} class="text" data-testid="event-text">{item.text}</li>
          ) : (
            <li key={item.id} class={`tool${item.isError ? " failed" : ""}`}>
              <details>
                <summary>
                  tool <strong>{item.name}</strong> {toolState(item)}
                </summary>
                <pre>{JSON.stringify(item.args, null, 2)}</pre>
                {item.done && <pre>{resultText(item.result)}</pre>}
              </details>
            </li>
          ),
        )}
      </ol>
    </section>
  );
}
