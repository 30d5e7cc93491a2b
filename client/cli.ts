/**
 * The API commands of the `runs` command line (everything but `admin`), on {@link RunsClient}.
 * Configuration: `RUNS_URL` (default http://127.0.0.1:8080) and `RUNS_API_KEY`.
 *
 * Output: people get short lines by default; `--json` prints one JSON document (the
 * resource the call returned; `events --follow --json` prints one event per line). While a
 * turn is awaited or streamed, progress goes to stderr only when stderr is a terminal. Exit codes: 0
 * success; 1 an API error (`runs: <code>: <message>`), or a waited turn that did not
 * complete; 2 bad usage (with the usage text).
 */
import { readFileSync } from "node:fs";
import { DEFAULT_BASE_URL, RunsApiError, RunsClient, isFinalEventOf } from "./client.js";
import { isFinalTurnStatus, type CreateRunRequest, type Run, type RunEvent, type Turn } from "./types.js";
import { CLIENT_USAGE, COMMANDS, exactly, type FlagSpec, multi, oneOf, type Parsed, parseArgs, positiveInt, str, suggestion, UsageError, usageOf } from "./cli-args.js";
import { agents, deploy } from "./cli-agents.js";
import { decideAction } from "./cli-approvals.js";
import { type CliIo, decideHint, type Environment, eventLine, Output, pendingActionLine, summaryLine, turnLine, visible } from "./cli-output.js";
import { budgetLine, timeOf, usageTable } from "./cli-usage.js";
import { webhooks } from "./cli-webhooks.js";

export { CLIENT_USAGE, UsageError, usageOf } from "./cli-args.js";
export type { CliIo, Environment, TextSink } from "./cli-output.js";

type Delivery = "wait" | "background" | "stream";
function delivery(p: Parsed): Delivery {
  const chosen = (["wait", "background", "stream"] as const).filter((d) => p.flags[d]);
  if (chosen.length > 1) throw new UsageError(`choose one of --${chosen.join(", --")}`);
  return chosen[0] ?? "wait";
}

const DELIVERY_FLAGS: FlagSpec = { wait: "boolean", background: "boolean", stream: "boolean", "idempotency-key": "string" };

/**
 * The whole `runs` command line but `admin` (node/cli.ts adds it): help, version, one API
 * command; resolves with the exit code (0, 1 an API error, 2 bad usage with the usage text).
 */
export async function runCli(args: string[], io: CliIo): Promise<number> {
  const first = args[0];
  if (first === undefined || first === "--help" || first === "-h" || first === "help") {
    (first === undefined ? io.stderr : io.stdout).write(`${first === undefined ? "runs: no command given\n\n" : ""}${CLIENT_USAGE}\n`);
    return first === undefined ? 2 : 0;
  }
  if (first === "--version" || first === "-V") {
    io.stdout.write(`${clientVersion()}\n`);
    return 0;
  }
  try {
    return await runClientCommand(args, io);
  } catch (err) {
    if (err instanceof UsageError) {
      io.stderr.write(`runs: ${err.message}\n\n${usageOf(err.command)}\n`);
      return 2;
    }
    const described = describeClientError(err, io.env);
    if (!described) throw err;
    // The service's message, shown on a terminal with its control characters escaped.
    io.stderr.write(`runs: ${io.stderr.isTTY ? visible(described) : described}\n`);
    return 1;
  }
}

/**
 * A reader that stops early (`runs models | head`) closes the pipe; the next write fails
 * with EPIPE, an 'error' event nothing handles, and Node would end with a stack trace. The
 * command ends quietly instead, as commands do when their reader has gone.
 */
export function endQuietlyWhenReaderCloses(stream: { on(event: "error", listener: (err: Error & { code?: string }) => void): unknown }): void {
  stream.on("error", (err) => {
    if (err.code !== "EPIPE") throw err;
    process.exit(process.exitCode ?? 0);
  });
}

/** The client package's version (client/package.json; beside dist/ once built). */
export function clientVersion(): string {
  for (const candidate of ["./package.json", "../package.json"]) {
    try {
      const pkg = JSON.parse(readFileSync(new URL(candidate, import.meta.url), "utf8")) as { name?: string; version?: string };
      if (pkg.name === "runs-client" && pkg.version) return pkg.version;
    } catch {
      // not here
    }
  }
  return "unknown";
}

/** Runs one API command; resolves with the exit code. Bad usage throws a UsageError naming the command. */
export async function runClientCommand(args: string[], io: CliIo): Promise<number> {
  const [command, ...rest] = args;
  if (command !== undefined && COMMANDS.includes(command) && (rest.includes("--help") || rest.includes("-h"))) {
    io.stdout.write(`${usageOf(command)}\n`);
    return 0;
  }
  try {
    return await runCommand(command, rest, args, io);
  } catch (err) {
    if (err instanceof UsageError && err.command === undefined && command !== undefined && COMMANDS.includes(command)) err.command = command;
    throw err;
  }
}

async function runCommand(command: string | undefined, rest: string[], args: string[], io: CliIo): Promise<number> {
  const out = new Output(io);
  const client = () => clientFrom(io.env);
  switch (command) {
    case "start": {
      const p = parseArgs(rest, { agent: "string", version: "string", tag: "multi", ...DELIVERY_FLAGS });
      const agent = str(p, "agent");
      if (!agent) throw new UsageError("start needs --agent ID");
      const mode = delivery(p);
      const input = await inputOf(p.positionals, io);
      const request: CreateRunRequest = { agent, input, version: positiveInt(p, "version"), tags: multi(p, "tag") };
      return deliver(client(), request, mode, p, out);
    }
    case "continue": {
      const p = parseArgs(rest, { "on-busy": "string", ...DELIVERY_FLAGS });
      const [runId, ...words] = p.positionals;
      if (!runId) throw new UsageError("continue needs RUN_ID");
      const mode = delivery(p);
      const input = await inputOf(words, io);
      const onBusy = oneOf(str(p, "on-busy"), ["queue", "steer", "reject"] as const, "on-busy");
      return deliver(client(), { run_id: runId, input, on_busy: onBusy }, mode, p, out);
    }
    case "get": {
      const p = parseArgs(rest, { turn: "string" });
      const [runId] = exactly(p, 1, "RUN_ID");
      const run = await client().getRun(runId, { turnId: str(p, "turn") });
      out.json(p) ? out.document(run) : out.run(run);
      return 0;
    }
    case "list": {
      const p = parseArgs(rest, { agent: "string", version: "string", state: "string", tag: "multi", waiting: "boolean", limit: "string", after: "string" });
      exactly(p, 0, "");
      const page = await client().listRuns({
        agent_id: str(p, "agent"),
        version: positiveInt(p, "version"),
        state: oneOf(str(p, "state"), ["idle", "busy"] as const, "state"),
        tag: multi(p, "tag"),
        // Runs waiting for a person's decision (runs approve|deny decides).
        pending_action: p.flags.waiting ? true : undefined,
        limit: positiveInt(p, "limit"),
        after: str(p, "after"),
      });
      if (out.json(p)) out.document(page);
      else {
        for (const run of page.data) out.line(summaryLine(run));
        if (page.has_more && page.next_cursor) out.note(`more: --after ${page.next_cursor}`);
      }
      return 0;
    }
    case "turns": {
      const p = parseArgs(rest, {});
      const [runId] = exactly(p, 1, "RUN_ID");
      const c = client();
      const turns: Turn[] = [];
      for await (const turn of c.paginate((after) => c.listTurns(runId, { limit: 100, after }))) turns.push(turn);
      if (out.json(p)) out.document({ object: "list", data: turns, has_more: false, next_cursor: null });
      else for (const turn of turns) out.line(turnLine(turn));
      return 0;
    }
    case "events": {
      const p = parseArgs(rest, { turn: "string", after: "string", follow: "boolean" });
      const [runId] = exactly(p, 1, "RUN_ID");
      return events(client(), runId, p, out);
    }
    case "cancel": {
      const p = parseArgs(rest, { turn: "string", "idempotency-key": "string" });
      const [runId] = exactly(p, 1, "RUN_ID");
      const run = await client().cancelRun(runId, { turnId: str(p, "turn"), idempotencyKey: str(p, "idempotency-key") });
      out.json(p) ? out.document(run) : out.run(run);
      return 0;
    }
    case "delete": {
      const p = parseArgs(rest, { "idempotency-key": "string" });
      const [runId] = exactly(p, 1, "RUN_ID");
      const deleted = await client().deleteRun(runId, { idempotencyKey: str(p, "idempotency-key") });
      out.json(p) ? out.document(deleted) : out.line(`${deleted.id} deleted`);
      return 0;
    }
    case "approve":
    case "deny":
      return decideAction(client, command === "approve" ? "approve" : "deny", rest, out);
    case "tag": {
      const p = parseArgs(rest, { add: "multi", remove: "multi" });
      const [runId] = exactly(p, 1, "RUN_ID");
      const add = multi(p, "add");
      const remove = multi(p, "remove");
      if (!add && !remove) throw new UsageError("tag needs --add or --remove");
      const tags = await client().updateTags(runId, { add, remove });
      out.json(p) ? out.document(tags) : out.line(`${tags.run_id} tags: ${tags.tags.join(", ") || "(none)"}`);
      return 0;
    }
    case "usage": {
      const p = parseArgs(rest, { from: "string", to: "string", "group-by": "string" });
      exactly(p, 0, "");
      const summary = await client().getUsage({
        from: timeOf(str(p, "from"), "from"),
        to: timeOf(str(p, "to"), "to"),
        group_by: oneOf(str(p, "group-by"), ["day", "agent", "version", "model"] as const, "group-by"),
      });
      if (out.json(p)) out.document(summary);
      else for (const line of usageTable(summary)) out.line(line);
      return 0;
    }
    case "budget":
      return budget(client, rest, out);
    case "webhooks":
      return webhooks(client, rest, out);
    case "agents":
      return agents(client, rest, out);
    case "deploy":
      return deploy(client(), rest, out);
    case "models": {
      const p = parseArgs(rest, {});
      exactly(p, 0, "");
      const models = await client().listModels();
      if (out.json(p)) out.document(models);
      else for (const m of models.data) out.line(String(m.id ?? JSON.stringify(m)));
      return 0;
    }
    case "admin":
      // node/cli.ts serves admin before this; the runs-client package has no store to act on.
      throw new UsageError("admin runs on the service's machine, with its own runs command (npx runs admin … in its folder), not from the runs-client package");
    default:
      throw new UsageError(command === undefined ? "no command given" : `unknown command: ${command}${suggestion(command, COMMANDS)}`);
  }
}

function clientFrom(env: Environment): RunsClient {
  const apiKey = env.RUNS_API_KEY;
  if (!apiKey) throw new UsageError("RUNS_API_KEY is not set");
  const baseUrl = env.RUNS_URL || undefined;
  // fetch would throw its own parse error, shown as a stack trace.
  if (baseUrl !== undefined && !/^https?:$/.test(protocolOf(baseUrl))) {
    throw new UsageError(`RUNS_URL must be the service's http or https address, such as ${DEFAULT_BASE_URL}`);
  }
  return new RunsClient({ baseUrl, apiKey });
}

function protocolOf(url: string): string {
  try {
    return new URL(url).protocol;
  } catch {
    return "";
  }
}

async function inputOf(words: string[], io: CliIo): Promise<string> {
  if (words.length === 1 && words[0] === "-") {
    const chunks: Buffer[] = [];
    for await (const chunk of io.stdin) chunks.push(Buffer.from(chunk as Buffer));
    return Buffer.concat(chunks).toString("utf8");
  }
  if (words.length === 0) throw new UsageError("INPUT is required");
  return words.join(" ");
}

/** start and continue: wait (the server's wait, then polling), background, or stream. */
async function deliver(client: RunsClient, request: CreateRunRequest, mode: Delivery, p: Parsed, out: Output): Promise<number> {
  const idempotencyKey = str(p, "idempotency-key");
  if (mode === "background") {
    const run = await client.createRun({ ...request, background: true }, { idempotencyKey });
    out.json(p) ? out.document(run) : out.run(run);
    return 0;
  }
  if (mode === "stream") return stream(client, request, idempotencyKey, p, out);

  const progress = out.progress("waiting");
  let waitingFor: Run | undefined;
  const onSigint = () => {
    progress.stop();
    out.note(waitingFor ? `stopped waiting; ${waitingFor.turn.id} keeps running (runs get ${waitingFor.id} --turn ${waitingFor.turn.id})` : "stopped waiting");
    process.exit(130);
  };
  process.once("SIGINT", onSigint);
  // A turn that waits for a person's decision: said once per action (stderr); this command goes on waiting.
  let said: string | undefined;
  const show = (r: Run) => {
    const action = r.turn.pending_action;
    progress.label(`${r.turn.id} ${action ? `waiting for approval of ${action.id}` : r.turn.status}`);
    if (action && action.id !== said) {
      said = action.id;
      progress.say(`${pendingActionLine(action)}\n${decideHint(r.id, action.id)}`);
    }
  };
  try {
    let run = await client.createRun(request, { idempotencyKey });
    if (!isFinalTurnStatus(run.turn.status)) {
      waitingFor = run;
      show(run);
      run = await client.waitForTurn(run.id, run.turn.id, { onPoll: show });
    }
    progress.stop();
    out.json(p) ? out.document(run) : out.run(run);
    return run.turn.status === "completed" ? 0 : 1;
  } finally {
    progress.stop();
    process.off("SIGINT", onSigint);
  }
}

async function stream(client: RunsClient, request: CreateRunRequest, idempotencyKey: string | undefined, p: Parsed, out: Output): Promise<number> {
  const json = out.json(p);
  let final: Run | undefined;
  let last: RunEvent | undefined;
  let printed = false;
  let endsWithNewline = true;
  // A delta's last carriage return waits for the next delta: a line break split between
  // two deltas reaches a terminal as one, not as an escaped lone \r.
  let heldReturn = false;
  // On a terminal: what the turn is doing until its text begins (queued, started, a tool running).
  const progress = out.progress("streaming");
  try {
    for await (const event of client.streamRun(request, { idempotencyKey })) {
      last = event;
      if (!printed) {
        if (event.source === "platform") progress.label(`${event.turn_id ?? ""} ${event.type}`);
        else if (event.type === "tool_execution_start") progress.label(`${event.turn_id ?? ""} running ${String(event.data?.toolName ?? "a tool")}`);
        else if (event.type === "tool.approval_requested") progress.label(`${event.turn_id ?? ""} waiting for approval of ${String(event.data?.action_id)}`);
      }
      if (event.type === "tool.approval_requested" && event.data) {
        const { action_id: id, tool, arguments: args, expires_at } = event.data;
        progress.say(`${pendingActionLine({ id, tool, arguments: args, expires_at })}\n${decideHint(event.run_id, id)}`);
      }
      if (event.type === "text_delta" && typeof event.data?.delta === "string" && !json) {
        progress.stop();
        const delta: string = `${heldReturn ? "\r" : ""}${event.data.delta}`;
        heldReturn = delta.endsWith("\r");
        out.write(heldReturn ? delta.slice(0, -1) : delta);
        printed = true;
        endsWithNewline = event.data.delta.endsWith("\n");
      }
      if (isFinalEventOf(event, event.turn_id ?? undefined) && event.data?.run) final = event.data.run as Run;
    }
  } finally {
    progress.stop();
  }
  if (heldReturn) out.write("\r");
  if (printed && !endsWithNewline) out.write("\n");
  // A stream that ended without its final event (for example resumed after it): read the turn.
  if (!final && last?.turn_id) final = await client.getRun(last.run_id, { turnId: last.turn_id });
  if (!final) throw new Error("the stream ended without a result");
  if (json) out.document(final);
  else out.run(final, { output: !printed });
  return final.turn.status === "completed" ? 0 : 1;
}

async function events(client: RunsClient, runId: string, p: Parsed, out: Output): Promise<number> {
  const turnId = str(p, "turn");
  const json = out.json(p);
  if (p.flags.follow) {
    for await (const event of client.streamEvents(runId, { turnId, after: str(p, "after") })) {
      // --follow --json: one event per line, as they arrive.
      json ? out.line(JSON.stringify(event)) : out.line(eventLine(event));
    }
    return 0;
  }
  const first = await client.listEvents(runId, { turn_id: turnId, after: str(p, "after"), limit: 1000 });
  const all = [...first.data];
  let page = first;
  while (page.has_more && page.next_cursor) {
    page = await client.listEvents(runId, { turn_id: turnId, after: page.next_cursor, limit: 1000 });
    all.push(...page.data);
  }
  if (json) out.document({ ...first, data: all, has_more: false, next_cursor: null });
  else {
    for (const event of all) out.line(eventLine(event));
    if (first.history.status && first.history.status !== "complete") out.note(`history: ${first.history.status}`);
  }
  return 0;
}

async function budget(client: () => RunsClient, args: string[], out: Output): Promise<number> {
  const [sub = "show", ...rest] = args[0]?.startsWith("--") ? ["show", ...args] : args;
  if (sub === "show") {
    const p = parseArgs(rest, {});
    exactly(p, 0, "");
    const state = await client().getBudget();
    out.json(p) ? out.document(state) : out.line(budgetLine(state));
    return 0;
  }
  if (sub === "set") {
    const p = parseArgs(rest, { cost: "string", tokens: "string" });
    exactly(p, 0, "");
    const cost = str(p, "cost");
    if (cost !== undefined && !(/^\d+(\.\d+)?$/.test(cost) && Number(cost) > 0)) throw new UsageError("--cost must be a positive number of US dollars");
    const tokens = positiveInt(p, "tokens");
    if (cost === undefined && tokens === undefined) throw new UsageError("budget set needs --cost, --tokens or both");
    const state = await client().setBudget({ monthly_cost_usd: cost === undefined ? null : Number(cost), monthly_tokens: tokens ?? null });
    out.json(p) ? out.document(state) : out.line(budgetLine(state));
    return 0;
  }
  if (sub === "delete") {
    const p = parseArgs(rest, {});
    exactly(p, 0, "");
    const deleted = await client().deleteBudget();
    out.json(p) ? out.document(deleted) : out.line("budget removed");
    return 0;
  }
  throw new UsageError(`unknown command: budget ${sub}${suggestion(sub, ["show", "set", "delete"], "budget ")}`);
}

/**
 * The line after `runs: ` for an error of an API command: `<code>: <message>` for an API
 * error, a plain sentence when the service could not be reached; undefined otherwise.
 */
export function describeClientError(err: unknown, env: Environment = process.env): string | undefined {
  if (err instanceof RunsApiError) return `${err.code}: ${err.message}`;
  if (err instanceof TypeError && err.message === "fetch failed") {
    const cause = (err as { cause?: { code?: string; message?: string } }).cause;
    return `cannot reach ${env.RUNS_URL || DEFAULT_BASE_URL}: ${cause?.code ?? cause?.message ?? err.message}`;
  }
  return undefined;
}
