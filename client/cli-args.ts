/**
 * The `runs` command line's words: its usage text, per-command help, and argument parsing
 * (node:util parseArgs, strict) with the mistakes a person makes answered plainly: an
 * unknown option or command names the closest real one.
 */
import { parseArgs as parseNodeArgs } from "node:util";

export const CLIENT_USAGE = `usage: runs <command> [options]

runs:
  runs start --agent ID [--version N] [--tag T]... [--wait|--background|--stream] INPUT...
  runs continue RUN_ID [--on-busy queue|steer|reject] [--wait|--background|--stream] INPUT...
  runs get RUN_ID [--turn TURN_ID]
  runs list [--agent ID] [--version N] [--state idle|busy] [--tag T]... [--waiting] [--limit N] [--after CURSOR]
  runs turns RUN_ID
  runs events RUN_ID [--turn TURN_ID] [--after EVENT_ID] [--follow]
  runs cancel RUN_ID [--turn TURN_ID]
  runs delete RUN_ID
  runs tag RUN_ID [--add T]... [--remove T]...
  runs approve RUN_ID ACTION_ID [--reason TEXT]   (run the tool call the turn waits for; runs get RUN_ID shows it)
  runs deny RUN_ID ACTION_ID [--reason TEXT]      (refuse the tool call the turn waits for; the model gets the reason)
usage:
  runs usage [--from DATE] [--to DATE] [--group-by day|agent|version|model]
             (DATE: YYYY-MM-DD, an ISO time or Unix seconds; default this month)
  runs budget [show]
  runs budget set [--cost USD] [--tokens N]   (monthly; needs api_keys:manage)
  runs budget delete
webhooks:
  runs webhooks [list]
  runs webhooks create URL [--event TYPE]... [--agent ID] [--description TEXT] [--disabled]
             (TYPE: turn.completed|turn.failed|turn.cancelled|turn.incomplete|turn.action_required|run.deleted|run.expired, default *)
  runs webhooks get|enable|disable|rotate-secret|delete|test|deliveries WEBHOOK_ID
  runs webhooks redeliver WEBHOOK_ID DELIVERY_ID
agents:
  runs agents [list]
  runs agents create NAME [--description TEXT]
  runs agents get AGENT_ID
  runs deploy AGENT_ID (--model MODEL | --config JSON | --config-file PATH) [--no-activate]
              [--upgrade-policy automatic|new_run_only] [--no-wait]
  runs models
admin (on the server's machine, against its store; not in the runs-client package):
  runs admin create-workspace --plan solo|business [--name NAME] [--create]
  runs admin set-plan WORKSPACE_ID --plan solo|business
  runs admin set-budget WORKSPACE_ID [--cost USD] [--tokens N] [--remove]

Every command takes --json (one JSON document on stdout) and --help. start, continue,
cancel, delete, approve and deny take --idempotency-key KEY (default: a new one per
command) to repeat a command safely. INPUT "-" reads the input from stdin. --wait (the default) waits for the
turn: the server's wait, then polling, with progress on a terminal's stderr; Ctrl-C stops
waiting and leaves the turn running. runs --version prints the client's version.

Environment: RUNS_URL (default http://127.0.0.1:8080), RUNS_API_KEY.`;

/** Bad usage: exit 2 with the usage text, never a stack trace. `command` narrows the usage shown. */
export class UsageError extends Error {
  constructor(
    message: string,
    public command?: string,
  ) {
    super(message);
  }
}

export type FlagKind = "string" | "boolean" | "multi";
export type FlagSpec = Record<string, FlagKind>;
export interface Parsed {
  flags: Record<string, string | boolean | string[] | undefined>;
  positionals: string[];
}

/** The commands of the usage text, each with its lines (a continuation line stays with its command). */
function usageLines(): Map<string, string[]> {
  const byCommand = new Map<string, string[]>();
  let last: string[] | undefined;
  for (const line of CLIENT_USAGE.split("\n")) {
    const command = /^ {2}runs ([a-z-]+)/.exec(line)?.[1];
    if (command) {
      last = byCommand.get(command) ?? [];
      byCommand.set(command, last);
      last.push(line);
    } else if (last && /^ {6,}\S/.test(line)) {
      last.push(line);
    } else {
      last = undefined;
    }
  }
  return byCommand;
}

export const COMMANDS = [...usageLines().keys()];

/** The usage of one command (all of them for an unknown one), as printed after a mistake or for --help. */
export function usageOf(command: string | undefined): string {
  const lines = command === undefined ? undefined : usageLines().get(command);
  if (!lines) return CLIENT_USAGE;
  return `usage: runs <command> [options]\n${lines.join("\n")}\n\nEvery command takes --json and --help; runs --help lists every command.`;
}

/** Edit distance, for "did you mean". */
function distance(a: string, b: string): number {
  const row = Array.from({ length: b.length + 1 }, (_, i) => i);
  for (let i = 1; i <= a.length; i++) {
    let diagonal = row[0]!;
    row[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const above = row[j]!;
      row[j] = Math.min(row[j]! + 1, row[j - 1]! + 1, diagonal + (a[i - 1] === b[j - 1] ? 0 : 1));
      diagonal = above;
    }
  }
  return row[b.length]!;
}

/** " (did you mean X?)" for the closest candidate within a small distance, else "". */
export function suggestion(word: string, candidates: readonly string[], prefix = ""): string {
  let best: string | undefined;
  let bestDistance = Math.max(2, Math.floor(word.length / 3)) + 1;
  for (const candidate of candidates) {
    const d = distance(word, candidate);
    if (d < bestDistance) [best, bestDistance] = [candidate, d];
  }
  return best === undefined ? "" : ` (did you mean ${prefix}${best}?)`;
}

/** `--name value`, `--name=value`, repeatable flags, `--` ends the flags; every command knows --json and --help. */
export function parseArgs(args: string[], spec: FlagSpec): Parsed {
  const all: FlagSpec = { json: "boolean", help: "boolean", ...spec };
  // Unknown options first: node's message would not say what was meant.
  for (const arg of args) {
    if (arg === "--") break;
    if (!arg.startsWith("--") || arg.length === 2) continue;
    const name = arg.slice(2).split("=")[0]!;
    if (!(name in all)) throw new UsageError(`unknown option --${name}${suggestion(name, Object.keys(all), "--")}`);
  }
  const options = Object.fromEntries(Object.entries(all).map(([name, kind]) => [name, { type: kind === "boolean" ? "boolean" : "string", multiple: kind === "multi" }])) as Record<string, { type: "string" | "boolean"; multiple: boolean }>;
  let parsed;
  try {
    parsed = parseNodeArgs({ args, options, allowPositionals: true, strict: true, tokens: true });
  } catch (err) {
    throw new UsageError(plainParseError(err, all));
  }
  const seen = new Set<string>();
  for (const token of parsed.tokens) {
    if (token.kind !== "option") continue;
    if (all[token.name] === "boolean" && token.inlineValue) throw new UsageError(`--${token.name} takes no value`);
    if (all[token.name] === "string" && seen.has(token.name)) throw new UsageError(`--${token.name} given twice`);
    if (all[token.name] !== "boolean" && token.value !== undefined && /^--./.test(token.value) && !token.inlineValue) throw new UsageError(`--${token.name} needs a value`);
    seen.add(token.name);
  }
  return { flags: parsed.values as Parsed["flags"], positionals: parsed.positionals };
}

/** node:util's parse errors in the words of this command line. */
function plainParseError(err: unknown, all: FlagSpec): string {
  const code = (err as { code?: string }).code;
  const message = err instanceof Error ? err.message : String(err);
  const option = /'(-{1,2}[^' ]+)/.exec(message)?.[1];
  if (code === "ERR_PARSE_ARGS_INVALID_OPTION_VALUE" && option) {
    const name = option.replace(/^-+/, "");
    return all[name] === "boolean" ? `--${name} takes no value` : `--${name} needs a value`;
  }
  if (code === "ERR_PARSE_ARGS_UNKNOWN_OPTION" && option) return `unknown option ${option} (options start with --; to pass a word that starts with -, put it after --)`;
  return message;
}

/** A string flag's value. */
export function str(p: Parsed, name: string): string | undefined {
  return p.flags[name] as string | undefined;
}
/** A repeatable flag's values. */
export function multi(p: Parsed, name: string): string[] | undefined {
  return p.flags[name] as string[] | undefined;
}
/** A flag holding a positive whole number. */
export function positiveInt(p: Parsed, name: string): number | undefined {
  const raw = str(p, name);
  if (raw === undefined) return undefined;
  if (!/^[1-9][0-9]*$/.test(raw) || !Number.isSafeInteger(Number(raw))) throw new UsageError(`--${name} must be a positive whole number`);
  return Number(raw);
}
/** Exactly `count` positional arguments (`what` names them when missing). */
export function exactly(p: Parsed, count: number, what: string): string[] {
  if (p.positionals.length !== count) throw new UsageError(p.positionals.length < count ? `${what} is required` : `unexpected argument: ${p.positionals[count]}`);
  return p.positionals;
}
/** A flag whose value must be one of `allowed`. */
export function oneOf<T extends string>(value: string | undefined, allowed: readonly T[], name: string): T | undefined {
  if (value === undefined) return undefined;
  if (!(allowed as readonly string[]).includes(value)) throw new UsageError(`--${name} must be ${allowed.join(", ")}`);
  return value as T;
}
