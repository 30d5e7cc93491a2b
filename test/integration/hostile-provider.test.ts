/**
 * A hostile (or merely strange) model endpoint: generated streams with tool calls whose
 * arguments hold any JSON (keys the store refuses, arrays in arrays, deep nesting, lone
 * surrogates, `1e999`, text that is not JSON), many calls at once, nonsense usage figures,
 * unknown finish reasons, garbage lines and streams cut off. Every turn must end in a final
 * status with the contract's error body, never as "could not be stored"; every run must
 * go idle and stay usable, also after a restart that loads the sessions from the store.
 * The same endpoint then calls the real tools with hostile arguments and links out of the
 * workspace (nothing may be written outside it), and makes gated calls that wait for a
 * decision across a restart (each action shows the call the event log holds).
 *
 * Seeded and reproducible: HOSTILE_SEED replays a run (the seed is logged); HOSTILE_DEBUG=1
 * logs what each real tool answered.
 */
import anyTest, { type TestFn } from "ava";
import fc from "fast-check";
import { type Dirent, existsSync, readdirSync, rmSync } from "node:fs";
import { createServer, type Server, type ServerResponse } from "node:http";
import os from "node:os";
import { posix } from "node:path";
import type { AddressInfo } from "node:net";
import { writeChatStream } from "../helpers/chat-stream.js";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";

const SEED = Number(process.env.HOSTILE_SEED ?? Date.now() % 2 ** 31);
const TURNS = 40;
const TOOL_TURNS = 16;
const GATED_TURNS = 8;
const INFINITE = "\u0001INFINITE\u0001";

/** `live.service` is replaced by a restart: tests get a copy of the context, not the holder. */
const test = anyTest as TestFn<{ servers: TestServers; live: { service: RunningService }; provider: Server; baseUrl: string; served: Set<string> }>;

type Script = (res: ServerResponse) => void;

const key = fc.oneof(
  fc.constantFrom("$where", "$ref", "a.b", ".", "n\u0000k", "_runs_json", "__proto__", "constructor", "", " ", "src/main.py", "ключ", "🔑"),
  fc.string({ maxLength: 8 }),
);
const leaf = fc.oneof(
  fc.integer(),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
  fc.constant(INFINITE),
  fc.string({ unit: "binary", maxLength: 12 }),
  fc.constantFrom(null, true, false, -0, 2 ** 60, "\ud800", "$where", "a.b"),
);
const { value } = fc.letrec((tie) => ({
  value: fc.oneof({ depthSize: "small" }, leaf, fc.array(tie("value"), { maxLength: 4 }), fc.dictionary(key, tie("value"), { maxKeys: 4 })),
}));
const deep = fc.tuple(fc.integer({ min: 60, max: 150 }), fc.boolean()).map(([levels, arrays]) => {
  let v: unknown = "bottom";
  for (let i = 0; i < levels; i++) v = arrays ? [v] : { in: v };
  return v;
});
const argumentsText = fc.oneof(
  fc.dictionary(key, fc.oneof(value, deep), { maxKeys: 6 }).map((args) => JSON.stringify(args).replaceAll(JSON.stringify(INFINITE), "1e999")),
  fc.constantFrom("{not json", "", "[]", "null", "1e999", '"text"', '{"a":', "{}"),
);
const usage = fc.record({
  prompt_tokens: fc.oneof(fc.integer({ min: -5, max: 2 ** 40 }), fc.constantFrom("abc", null, 1.5)),
  completion_tokens: fc.oneof(fc.nat(1000), fc.constant(-1)),
  total_tokens: fc.constantFrom(0, 7, "x"),
});

const chunk = (body: Record<string, unknown>) => `data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", created: 0, model: "m", ...body })}\n\n`;

/** A stream of tool calls (arguments in two pieces each, as providers send them), maybe cut off before its end. */
function writeToolCalls(res: ServerResponse, calls: Array<{ name: string; args: string }>, opts: { usage?: unknown; cut?: boolean; finish?: string } = {}): void {
  res.writeHead(200, { "content-type": "text/event-stream" });
  const toolCalls = calls.map((c, i) => ({ index: i, id: `call_${i}`, type: "function", function: { name: c.name, arguments: "" } }));
  res.write(chunk({ choices: [{ index: 0, delta: { role: "assistant", tool_calls: toolCalls }, finish_reason: null }] }));
  for (const [i, c] of calls.entries()) {
    const half = Math.floor(c.args.length / 2);
    for (const piece of [c.args.slice(0, half), c.args.slice(half)]) res.write(chunk({ choices: [{ index: 0, delta: { tool_calls: [{ index: i, function: { arguments: piece } }] }, finish_reason: null }] }));
  }
  if (opts.cut) return void res.destroy();
  res.write(chunk({ choices: [{ index: 0, delta: {}, finish_reason: opts.finish ?? "tool_calls" }] }));
  if (opts.usage) res.write(chunk({ choices: [], usage: opts.usage }).replace('"total_tokens":7', '"total_tokens":1e999'));
  res.end("data: [DONE]\n\n");
}

const CANARY = `hostile-canary-${SEED}`;
/** Parameters of the built-in tools: their values are validated and may be converted. */
const TOOL_PARAMETERS = new Set(["path", "offset", "limit", "content", "old_text", "new_text", "command"]);
/** Calls of the real tools with arguments of the wrong types, paths out of the workspace and hostile extra keys. */
const path = fc.oneof(
  fc.constantFrom(`../../../../../tmp/${CANARY}`, `/tmp/${CANARY}`, `a/../../${CANARY}`, "/etc/passwd", "/proc/self/environ", "\u0000", "", ".", "..", "x".repeat(5000), "dir/", "~/.ssh/id_rsa"),
  fc.string({ maxLength: 10 }),
  fc.constantFrom(123, null, ["a"], { p: 1 }),
);
const toolCall = fc.oneof(
  fc.record({ path, offset: fc.option(fc.constantFrom(0, -1, 1.5, "x", INFINITE, 2 ** 53)), limit: fc.option(fc.constantFrom(0, 1, -5, 1e9)) }).map((a) => ({ name: "read", a })),
  fc.record({ path, content: fc.oneof(fc.string({ unit: "binary", maxLength: 20 }), fc.constantFrom(42, null, "x".repeat(100_000))) }).map((a) => ({ name: "write", a })),
  fc.record({ path, old_text: fc.constantFrom("", "a", 1), new_text: fc.constantFrom("b", null) }).map((a) => ({ name: "edit", a })),
  fc.record({ path: fc.option(path) }).map((a) => ({ name: "ls", a })),
  fc.record({ command: fc.constantFrom(`echo x > /tmp/${CANARY}; echo done`, `touch ../../${CANARY}`, "cat /proc/self/environ | head -c 200", "ls / | head", "exit 3", "", "printf 'a\\0b'", "head -c 100000 /dev/zero | tr '\\0' a", 42, ["ls"]) }).map((a) => ({ name: "bash", a })),
);
/**
 * Links out of the workspace made in the sandbox, then written through by the file tools
 * (which run on the host) and by bash: every write must stay in the workspace or fail.
 */
const symlinkAttack: Script = (res) =>
  writeToolCalls(res, [
    { name: "bash", args: JSON.stringify({ command: `ln -s ../../../.. up; ln -s /tmp/${CANARY} f; ln -s / root; echo linked` }) },
    { name: "write", args: JSON.stringify({ path: `up/${CANARY}`, content: "escaped" }) },
    { name: "write", args: JSON.stringify({ path: "f", content: "escaped" }) },
  ]);

/**
 * Files named like the canary anywhere under `dir`, other than inside a run's own workspace
 * (not descended into: it holds the runs' links to / and ..). Links are not followed
 * (Node's recursive readdir would); unreadable directories are skipped; at most 100,000 entries.
 */
function canariesUnder(dir: string): string[] {
  const found: string[] = [];
  const stack = [dir];
  for (let seen = 0; stack.length > 0 && seen < 100_000; ) {
    const current = stack.pop()!;
    let entries: Dirent[];
    try {
      entries = readdirSync(current, { withFileTypes: true });
    } catch {
      continue;
    }
    for (const entry of entries) {
      seen++;
      const full = posix.join(current, entry.name);
      if (entry.name === CANARY) found.push(full);
      if (entry.isDirectory() && !(posix.basename(current) === "workspaces" && entry.name.startsWith("run_"))) stack.push(full);
    }
  }
  return found;
}

/** Where a write that left the workspace would land: the servers' tree (every node's data), the host's temp dir and home. */
function assertNoCanaryOutside(t: { deepEqual: (a: unknown, b: unknown, m?: string) => void; false: (v: boolean, m?: string) => void }, servers: TestServers): void {
  t.deepEqual(canariesUnder(servers.dir), [], "nothing named like the canary outside the runs' workspaces");
  for (const outside of [`/tmp/${CANARY}`, `${os.tmpdir()}/${CANARY}`, `${os.homedir()}/${CANARY}`]) t.false(existsSync(outside), `${outside} was written`);
}

/** Calls of the file tools with paths that leave the workspace: each must end as an error. */
function escapingFileCalls(events: any[]): Array<{ tool: string; path: string; isError: boolean }> {
  const starts = new Map<string, any>(events.filter((e) => e.type === "tool_execution_start").map((e) => [e.data.toolCallId, e.data]));
  return events
    .filter((e) => e.type === "tool_execution_end" && ["read", "write", "edit", "ls"].includes(e.data.toolName))
    .flatMap((e) => {
      const p = starts.get(e.data.toolCallId)?.args?.path;
      const leaves = typeof p === "string" && (p.startsWith("/") || posix.normalize(p).split("/")[0] === "..");
      return leaves ? [{ tool: e.data.toolName, path: p, isError: e.data.isError === true }] : [];
    });
}

const toolScript: fc.Arbitrary<Script> = fc
  .record({ calls: fc.array(fc.tuple(toolCall, fc.dictionary(key, value, { maxKeys: 2 })), { minLength: 1, maxLength: 3 }), finish: fc.constantFrom("tool_calls", "stop") })
  .map(({ calls, finish }) => (res: ServerResponse) =>
    writeToolCalls(res, calls.map(([c, extra]) => ({ name: c.name, args: JSON.stringify({ ...extra, ...c.a }).replaceAll(JSON.stringify(INFINITE), "1e999") })), { finish }),
  );

const script: fc.Arbitrary<Script> = fc.oneof(
  // Tool calls, one to five, with hostile arguments, maybe cut off or followed by nonsense usage.
  fc
    .record({
      calls: fc.array(fc.record({ name: fc.oneof(fc.constantFrom("lookup", "bash", "$x", "a.b", ""), fc.string({ maxLength: 6 })), args: argumentsText }), { minLength: 1, maxLength: 5 }),
      usage: fc.option(usage),
      cut: fc.boolean(),
      finish: fc.constantFrom("tool_calls", "stop", "length", "content_filter", "weird"),
    })
    .map(({ calls, usage: u, cut, finish }) => (res: ServerResponse) => writeToolCalls(res, calls, { usage: u, cut, finish })),
  // Text with garbage lines between the chunks.
  fc.record({ words: fc.array(fc.string({ unit: "binary", maxLength: 10 }), { minLength: 1, maxLength: 4 }), garbage: fc.constantFrom("data: {not json}\n\n", ": comment\n\n", "event: x\ndata: 1\n\n", "data: []\n\n") }).map(
    ({ words, garbage }) =>
      (res: ServerResponse) => {
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write(garbage);
        for (const w of words) res.write(chunk({ choices: [{ index: 0, delta: { content: w }, finish_reason: null }] }) + garbage);
        res.end("data: [DONE]\n\n");
      },
  ),
);

test.before(async (t) => {
  const servers = await startTestServers();
  const env = { RUNS_ALLOW_PRIVATE_MODEL_ENDPOINTS: "1", RUNS_WAIT_TIMEOUT_MS: "20000", RUNS_RATE_SOLO: "1000000", RUNS_ACTIVE_TURNS_SOLO: "1000" };
  const service = await startTestService(servers, env);
  const scripts: Record<string, Script[]> = {
    hostile: fc.sample(script, { seed: SEED, numRuns: TURNS }),
    // The first tools turn always tries the links out of the workspace.
    "hostile-tools": [symlinkAttack, ...fc.sample(toolScript, { seed: SEED, numRuns: TOOL_TURNS - 1 })],
    "hostile-gated": fc.sample(toolScript, { seed: SEED + 1, numRuns: GATED_TURNS }),
  };
  for (const dir of [os.tmpdir(), os.homedir()]) rmSync(`${dir}/${CANARY}`, { force: true }); // a failed run's leftovers
  const served = new Set<string>();
  // Stateless: a hostile answer to "hostile <n>", a plain one after a tool result or to anything else.
  const provider = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on("data", (c: Buffer) => parts.push(c));
    req.on("end", () => {
      let messages: Array<{ role: string; content?: unknown }>;
      try {
        messages = JSON.parse(Buffer.concat(parts).toString("utf8")).messages ?? [];
      } catch {
        return void res.writeHead(400).end();
      }
      const last = messages.at(-1);
      const text = typeof last?.content === "string" ? last.content : Array.isArray(last?.content) ? last.content.map((p: { text?: string }) => p.text ?? "").join("") : "";
      const [, kind, n] = (last?.role === "user" ? /^(hostile|hostile-tools|hostile-gated) (\d+)$/.exec(text.trim()) : null) ?? [];
      const hostile = kind === undefined ? undefined : scripts[kind]?.[Number(n)];
      if (hostile) {
        served.add(`${kind} ${n}`);
        return hostile(res);
      }
      // Counts no call has: two such turns had summed to Infinity (found by a probe).
      if (last?.role === "user" && text.trim() === "huge usage") return writeChatStream(res, ["ok"], { prompt_tokens: 1e308, completion_tokens: 1e308, total_tokens: 1e308 });
      writeChatStream(res, ["ok"]);
    });
  });
  await new Promise<void>((resolve) => provider.listen(0, "127.0.0.1", resolve));
  const baseUrl = `http://127.0.0.1:${(provider.address() as AddressInfo).port}/v1`;
  t.context = { servers, live: { service }, provider, baseUrl, served };
});

test.after.always(async (t) => {
  t.context.provider?.close();
  // A restart that failed leaves the old, closed service here: closing it again is harmless.
  await t.context.live?.service.close().catch(() => undefined);
  await t.context.servers?.stop();
});

const FINAL = ["completed", "failed", "incomplete"];

/**
 * `value` with lone surrogates in its strings and keys replaced by U+FFFD, as the store's
 * UTF-8 keeps them (the event log's JSON keeps them as escapes).
 */
function wellFormed(value: unknown): unknown {
  const text = (s: string) => s.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, "\ufffd");
  if (typeof value === "string") return text(value);
  if (Array.isArray(value)) return value.map(wellFormed);
  if (value === null || typeof value !== "object") return value;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) Object.defineProperty(out, text(k), { value: wellFormed(v), enumerable: true, writable: true, configurable: true });
  return out;
}

test.serial(`hostile provider - ${TURNS} generated hostile streams: every turn ends final with the contract's error body, never 'could not be stored'; every run goes idle, reads back, and continues after a restart`, async (t) => {
  t.timeout(300_000);
  t.log(`HOSTILE_SEED=${SEED}`);
  const { servers, live, baseUrl } = t.context;
  const ws = await newWorkspace(live.service);
  const agent = await ws.api.agentWith({ model: { provider: "openai-compatible", base_url: baseUrl, model: "m" }, tools: [] });
  const runs: string[] = [];
  const outcomes = new Map<string, number>();
  for (let i = 0; i < TURNS; i++) {
    const res = await ws.api.post("/api/v1/runs", { agent, input: `hostile ${i}` });
    t.is(res.status, 200, `${i}: ${JSON.stringify(res.body).slice(0, 300)}`);
    if (res.status !== 200) continue;
    runs.push(res.body.id);
    const turn = res.body.turn;
    const outcome = turn.error ? `${turn.status} ${turn.error.code}` : turn.status;
    outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
    if (process.env.HOSTILE_DEBUG && turn.error) t.log(i, JSON.stringify(turn.error));
    t.true(FINAL.includes(turn.status), `${i}: ${turn.status}`);
    t.is(res.body.state, "idle", `${i}`);
    if (turn.error) {
      t.regex(turn.error.code, /^[a-z_]+$/, `${i}`);
      t.is(typeof turn.error.retryable, "boolean");
      t.not(turn.error.message, "The turn finished, but its result could not be stored.", `${i}: ${JSON.stringify(turn.error)}`);
      t.notRegex(turn.error.message, /mongo|ferret|sqlite|bson|\bat \w+ \(/i, `${i}`);
    }
    const turns = await ws.api.get(`/api/v1/runs/${res.body.id}/turns`);
    t.is(turns.status, 200, `${i}`);
    const events = await ws.api.get(`/api/v1/runs/${res.body.id}/events?limit=1000`);
    t.is(events.status, 200, `${i}`);
  }
  t.log(`outcomes: ${JSON.stringify(Object.fromEntries(outcomes))}`);
  t.is([...t.context.served].filter((k) => k.startsWith("hostile ")).length, TURNS, "every hostile stream was served");
  // The new service has no sessions in memory: each continuation loads its run's transcript from the store.
  await live.service.close();
  live.service = await startTestService(servers, { RUNS_ALLOW_PRIVATE_MODEL_ENDPOINTS: "1", RUNS_WAIT_TIMEOUT_MS: "20000", RUNS_RATE_SOLO: "1000000", RUNS_ACTIVE_TURNS_SOLO: "1000" });
  const api = new Api(live.service.url!, ws.key);
  for (const [i, id] of runs.entries()) {
    const next = await api.post("/api/v1/runs", { run_id: id, input: "benign" });
    t.is(next.status, 200, `${i}: ${JSON.stringify(next.body).slice(0, 300)}`);
    t.is(next.body.turn?.status, "completed", `${i}: ${JSON.stringify(next.body.turn?.error)}`);
  }
});

test.serial("hostile provider - an endpoint reporting 1e308 tokens per call: each call counts at most a billion, sums stay finite, and the run continues, cancels and deletes (two such turns had summed to Infinity, which the store refuses: the run stayed busy for good and answered 500)", async (t) => {
  const { live, baseUrl } = t.context;
  const ws = await newWorkspace(live.service);
  const agent = await ws.api.agentWith({ model: { provider: "openai-compatible", base_url: baseUrl, model: "m" }, tools: [] });
  const first = await ws.api.post("/api/v1/runs", { agent, input: "huge usage" });
  t.is(first.status, 200, JSON.stringify(first.body));
  t.is(first.body.turn.status, "completed");
  t.is(first.body.turn.usage.input_tokens, 1e9);
  const runId = first.body.id;
  for (let i = 0; i < 2; i++) {
    const next = await ws.api.post("/api/v1/runs", { run_id: runId, input: "huge usage" });
    t.is(next.status, 200, JSON.stringify(next.body));
    t.is(next.body.turn.status, "completed");
    t.is(next.body.state, "idle");
  }
  const run = await ws.api.get(`/api/v1/runs/${runId}`);
  t.is(run.body.usage.input_tokens, 3e9);
  t.is(run.body.usage.output_tokens, 3e9);
  const listed = await ws.api.get("/api/v1/runs");
  t.is(listed.body.data.find((r: { id: string }) => r.id === runId)?.state, "idle");
  const usage = await ws.api.get("/api/v1/usage");
  t.is(usage.status, 200);
  t.is(usage.body.total.input_tokens, 3e9);
  t.is((await ws.api.post(`/api/v1/runs/${runId}/cancel`, {})).status, 200);
  t.is((await ws.api.request("DELETE", `/api/v1/runs/${runId}`, { idempotencyKey: `del-${runId}` })).status, 200);
});

test.serial(`hostile provider - ${TOOL_TURNS} generated calls of the real tools (wrong types, paths out of the workspace, /proc and /etc, NULs, 100 KB contents, hostile extra keys): every turn ends final, the run goes idle, nothing is written outside the workspace`, async (t) => {
  t.timeout(300_000);
  t.log(`HOSTILE_SEED=${SEED}`);
  const { servers, live, baseUrl } = t.context;
  const ws = await newWorkspace(live.service);
  const agent = await ws.api.agentWith({ model: { provider: "openai-compatible", base_url: baseUrl, model: "m" } });
  const outcomes = new Map<string, number>();
  const escapes: Array<{ tool: string; path: string; isError: boolean }> = [];
  for (let i = 0; i < TOOL_TURNS; i++) {
    const res = await ws.api.post("/api/v1/runs", { agent, input: `hostile-tools ${i}` });
    t.is(res.status, 200, `${i}: ${JSON.stringify(res.body).slice(0, 300)}`);
    if (res.status !== 200) continue;
    const turn = res.body.turn;
    const outcome = turn.error ? `${turn.status} ${turn.error.code}` : turn.status;
    outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
    t.true(FINAL.includes(turn.status), `${i}: ${turn.status}`);
    t.is(res.body.state, "idle", `${i}`);
    if (turn.error) t.not(turn.error.message, "The turn finished, but its result could not be stored.", `${i}: ${JSON.stringify(turn.error)}`);
    const events = await ws.api.get(`/api/v1/runs/${res.body.id}/events?limit=1000`);
    t.is(events.status, 200, `${i}`);
    if (process.env.HOSTILE_DEBUG) for (const e of events.body.data.filter((e: any) => e.type === "tool_execution_end")) t.log(i, e.data.toolName, JSON.stringify(e.data.result).slice(0, 200));
    escapes.push(...escapingFileCalls(events.body.data));
    if (i === 0) {
      // The links made in the sandbox: writes through them run in the sandbox too, so they
      // reach its read-only / (refused) or its private /tmp (gone with it), never the host's.
      const writes = events.body.data.filter((e: any) => e.type === "tool_execution_end" && e.data.toolName === "write");
      t.is(writes.length, 2, "both writes through the links ran");
      t.true(writes[0]?.data.isError, `the write through a link to the sandbox's /: ${JSON.stringify(writes[0]?.data.result).slice(0, 200)}`);
    }
  }
  t.log(`outcomes: ${JSON.stringify(Object.fromEntries(outcomes))}; ${escapes.length} file-tool calls with paths out of the workspace`);
  t.is([...t.context.served].filter((k) => k.startsWith("hostile-tools ")).length, TOOL_TURNS, "every hostile stream was served");
  for (const e of escapes) t.true(e.isError, `${e.tool} ${JSON.stringify(e.path)} was not refused`);
  assertNoCanaryOutside(t, servers);
});

test.serial(`hostile provider - ${GATED_TURNS} turns whose hostile tool calls each wait for a decision (approved or denied at random, the service restarted while one waits): every pending action shows every key of the model's call and its nested values unchanged, every turn ends final, no run stays busy`, async (t) => {
  t.timeout(300_000);
  t.log(`HOSTILE_SEED=${SEED}`);
  const { servers, live, baseUrl } = t.context;
  const ws = await newWorkspace(live.service);
  let api = ws.api;
  const agent = await api.agentWith({ model: { provider: "openai-compatible", base_url: baseUrl, model: "m" }, approval: { rules: [{ tool: "*" }], timeout_s: 60 } });
  const decisions = fc.sample(fc.constantFrom("approve", "deny"), { seed: SEED, numRuns: GATED_TURNS * 3 * 2 });
  const outcomes = new Map<string, number>();
  let restarted = false;
  let compared = 0;
  for (let i = 0; i < GATED_TURNS; i++) {
    const started = await api.post("/api/v1/runs", { agent, input: `hostile-gated ${i}`, background: true });
    t.is(started.status, 202, `${i}: ${JSON.stringify(started.body).slice(0, 300)}`);
    if (started.status !== 202) continue;
    const runId = started.body.id;
    let run: any;
    // At most three calls a message, each decided once: bounded.
    for (let step = 0; step < 8; step++) {
      run = await api.waitRun(runId, (r) => r.turn?.pending_action != null || FINAL.includes(r.turn?.status), 30_000);
      const action = run.turn.pending_action;
      if (!action) break;
      t.is(typeof action.arguments, "object", `${i}`);
      t.false(Array.isArray(action.arguments));
      // Against the model's call as the event log (JetStream, not the store) keeps it: every
      // key, and every value the tool's parameters do not name, unchanged (those it names are
      // as the tool would run with them: converted where their type differs).
      if (!action.arguments.truncated) {
        const events = (await api.get(`/api/v1/runs/${runId}/events?limit=1000`)).body.data as any[];
        const calls = events.filter((e) => e.type === "message_end" && e.data.message.role === "assistant").flatMap((e) => e.data.message.content.filter((c: any) => c.type === "toolCall"));
        const written = calls.find((c: any) => c.id === action.tool_call_id)?.arguments;
        t.truthy(written, `${i}: the call is in the event log`);
        t.deepEqual(Object.keys(wellFormed(action.arguments) as object).sort(), Object.keys(wellFormed(written ?? {}) as object).sort(), `${i}: ${action.tool}`);
        for (const [k, v] of Object.entries(written ?? {})) if (!TOOL_PARAMETERS.has(k)) t.deepEqual(wellFormed(action.arguments[k]), wellFormed(v), `${i}: ${action.tool}.${k}`);
        compared++;
      }
      if (!restarted) {
        // The wait and its hostile arguments come back from the store alone.
        restarted = true;
        await live.service.close();
        live.service = await startTestService(servers, { RUNS_ALLOW_PRIVATE_MODEL_ENDPOINTS: "1", RUNS_WAIT_TIMEOUT_MS: "20000", RUNS_RATE_SOLO: "1000000", RUNS_ACTIVE_TURNS_SOLO: "1000" });
        api = new Api(live.service.url!, ws.key);
        const again = await api.waitRun(runId, (r) => r.turn?.pending_action?.id === action.id, 30_000);
        t.deepEqual(again.turn.pending_action.arguments, action.arguments, `${i}: the restored action's arguments`);
      }
      const decision = decisions.pop() ?? "deny";
      const res = await api.post(`/api/v1/runs/${runId}/actions/${action.id}`, { decision });
      t.is(res.status, 200, `${i}: ${JSON.stringify(res.body).slice(0, 300)}`);
    }
    t.true(FINAL.includes(run.turn.status), `${i}: ${run.turn.status}`);
    const idle = await api.waitRun(runId, (r) => r.state === "idle", 30_000);
    const turn = idle.turn;
    const outcome = turn.error ? `${turn.status} ${turn.error.code}` : turn.status;
    outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
    if (turn.error) t.not(turn.error.message, "The turn finished, but its result could not be stored.", `${i}: ${JSON.stringify(turn.error)}`);
  }
  t.log(`outcomes: ${JSON.stringify(Object.fromEntries(outcomes))}; ${compared} actions compared with their calls`);
  t.true(restarted, "a call waited for a decision");
  // Calls that fail validation never wait (they are refused before the gate): not every turn has one.
  t.true(compared > 0, "actions were compared with their calls");
  t.is([...t.context.served].filter((k) => k.startsWith("hostile-gated ")).length, GATED_TURNS, "every hostile stream was served");
  assertNoCanaryOutside(t, servers);
});
