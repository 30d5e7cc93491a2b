/**
 * How the `runs` command line writes: where (its {@link CliIo}), the short lines people get
 * by default (runs, turns, events, pending and decided actions), and the progress spinner on
 * a terminal's stderr. With `--json` the commands print the documents as they are.
 */
import type { Parsed } from "./cli-args.js";
import type { Action, PendingAction, Run, RunEvent, RunSummary, Turn } from "./types.js";

/** Where the command writes (process.stdout and stderr are these); structural, so the package's types need no @types/node. */
export interface TextSink {
  write(text: string): unknown;
}
export type Environment = Record<string, string | undefined>;

export interface CliIo {
  stdout: TextSink & { isTTY?: boolean };
  stderr: TextSink & { isTTY?: boolean };
  stdin: AsyncIterable<string | Uint8Array>;
  env: Environment;
}

/**
 * Control characters but line breaks and tabs (a carriage return only before a line feed),
 * C1 ones included: from a model's output, an event or an error message they would drive
 * the terminal (move the cursor, rewrite lines, set the title or the clipboard). And the
 * bidirectional embeddings, overrides and isolates, which make a terminal show text in
 * another order than it is (a command that reads as harmless, a run id that is another's).
 */
const CONTROL = /\r(?!\n)|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]/g;

/** `text` with its control characters shown as `\u001b`-style escapes: what a terminal is given. */
export function visible(text: string): string {
  return text.replace(CONTROL, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

export function outputText(turn: Turn): string {
  return turn.output
    .filter((part): part is { type: "output_text"; text: string } => part.type === "output_text" && typeof part.text === "string")
    .map((part) => part.text)
    .join("\n");
}

export function summaryLine(run: RunSummary): string {
  const waiting = run.pending_action ? `  waiting for approval: ${run.pending_action.id} ${run.pending_action.tool}` : "";
  return `${run.id}  ${run.state.padEnd(4)}  ${run.agent_id} v${run.agent_version}${run.tags.length ? `  [${run.tags.join(", ")}]` : ""}${waiting}`;
}

export function turnLine(turn: Turn): string {
  const text = outputText(turn).split("\n")[0] ?? "";
  const duration = turn.duration_ms === null ? "" : `  ${turn.duration_ms} ms`;
  const error = turn.error ? `  ${turn.error.code}: ${turn.error.message}` : "";
  const waiting = turn.pending_action ? `  waiting for approval: ${turn.pending_action.id} ${turn.pending_action.tool}` : "";
  return `${turn.id}  ${turn.status}  v${turn.agent_version}${duration}${error}${waiting}${text ? `  ${truncate(text, 60)}` : ""}`;
}

export function eventLine(event: RunEvent): string {
  const detail = event.type === "text_delta" && typeof event.data?.delta === "string" ? JSON.stringify(event.data.delta) : truncate(JSON.stringify(event.data ?? null), 100);
  return `${String(event.sequence).padStart(4)}  ${event.id}  ${event.source}/${event.type}  ${detail}`;
}

function truncate(text: string, max: number): string {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** Unix seconds as an ISO time in UTC, to the second. */
function isoTime(seconds: number): string {
  return new Date(seconds * 1000).toISOString().replace(/\.\d{3}Z$/, "Z");
}

function timeLeft(seconds: number, nowMs: number): string {
  const left = Math.round(seconds - nowMs / 1000);
  if (left <= 0) return "due now";
  if (left < 120) return `in ${left} s`;
  if (left < 7200) return `in ${Math.round(left / 60)} min`;
  return `in ${(left / 3600).toFixed(1)} h`;
}

/**
 * The tool call a turn waits for, all of it (a person decides on what it shows, so the
 * arguments are never shortened): `waiting for approval: act_…  bash {"command":"…"}  expires … (in 59 min)`.
 */
export function pendingActionLine(action: Pick<PendingAction, "id" | "tool" | "arguments" | "expires_at">, nowMs = Date.now()): string {
  return `waiting for approval: ${action.id}  ${action.tool} ${JSON.stringify(action.arguments)}  expires ${isoTime(action.expires_at)} (${timeLeft(action.expires_at, nowMs)})`;
}

/** What a person types to decide an action. */
export function decideHint(runId: string, actionId: string): string {
  return `decide: runs approve ${runId} ${actionId} [--reason TEXT]  or  runs deny ${runId} ${actionId} [--reason TEXT]`;
}

/** A decided action: `act_… approved by person  run_… turn_…  bash {"command":"…"}  reason: …`. */
export function actionLine(action: Action): string {
  const decided = action.decision === null ? "undecided" : `${action.decision === "approve" ? "approved" : "denied"} by ${action.decided_by ?? "?"}`;
  return `${action.id} ${decided}  ${action.run_id} ${action.turn_id}  ${action.tool} ${JSON.stringify(action.arguments)}${action.reason ? `  reason: ${action.reason}` : ""}`;
}

const SPINNER = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

/** What a command's progress can do: relabel the spinner, say a line above it, stop it. */
export interface Progress {
  label(text: string): void;
  /** A line on stderr (above the spinner on a terminal). */
  say(text: string): void;
  stop(): void;
}

export class Output {
  constructor(private readonly io: CliIo) {}

  json(p: Parsed): boolean {
    return p.flags.json === true;
  }

  /** What the service answered goes to a terminal with its control characters shown, to a file or pipe as it is. */
  write(text: string): void {
    this.io.stdout.write(this.io.stdout.isTTY ? visible(text) : text);
  }

  line(text: string): void {
    this.write(`${text}\n`);
  }

  /** Remarks for people: stderr, so stdout stays the result. */
  note(text: string): void {
    this.io.stderr.write(`${this.io.stderr.isTTY ? visible(text) : text}\n`);
  }

  document(value: unknown): void {
    this.line(JSON.stringify(value, null, 2));
  }

  /**
   * `run_… idle  turn turn_… completed`, then the output text, or the turn's error; a turn
   * that waits for a person's decision shows the tool call (stdout) and how to decide it (stderr).
   */
  run(run: Run, options: { output?: boolean } = {}): void {
    const turn = run.turn;
    this.line(`${run.id} ${run.state}  turn ${turn.id} ${turn.status}`);
    if (turn.pending_action) {
      this.line(pendingActionLine(turn.pending_action));
      this.note(decideHint(run.id, turn.pending_action.id));
    }
    const text = outputText(turn);
    if (options.output !== false && text) this.line(text);
    if (turn.error) this.note(`error: ${turn.error.code}: ${turn.error.message}${turn.error.retryable ? " (retryable)" : ""}`);
  }

  /** A spinner with elapsed seconds on stderr, only when stderr is a terminal. */
  progress(initial: string): Progress {
    if (!this.io.stderr.isTTY) return { label: () => undefined, say: (text) => this.note(text), stop: () => undefined };
    const started = Date.now();
    let text = initial;
    let frame = 0;
    let stopped = false;
    const draw = () => {
      const seconds = Math.floor((Date.now() - started) / 1000);
      this.io.stderr.write(`\r\x1b[2K${SPINNER[frame++ % SPINNER.length]} ${visible(text)}  ${seconds}s`);
    };
    const timer = setInterval(draw, 100);
    timer.unref();
    draw();
    return {
      // Shown at once: a step that begins and ends between two frames is still seen.
      label: (next) => {
        if (stopped || next === text) return;
        text = next;
        draw();
      },
      say: (line) => {
        if (stopped) return this.note(line);
        this.io.stderr.write(`\r\x1b[2K${visible(line)}\n`);
        draw();
      },
      stop: () => {
        if (stopped) return;
        stopped = true;
        clearInterval(timer);
        this.io.stderr.write("\r\x1b[2K");
      },
    };
  }
}
