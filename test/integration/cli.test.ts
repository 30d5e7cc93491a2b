import anyTest, { type TestFn } from "ava";
import { execFile, spawn } from "node:child_process";
import { once } from "node:events";
import { promisify } from "node:util";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import { bashThen, gatedBashConfig } from "../helpers/agent-configs.js";
import type { RunningService } from "../../node/service.js";
import { PROJECT_ROOT } from "../../node/servers.js";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import { type CliIo, runCli } from "../../client/cli.js";
import { COMMANDS } from "../../client/cli-args.js";

/** The `runs` command (bin/runs.js) against the real service, configured by RUNS_URL and RUNS_API_KEY. */

interface Context {
  servers: TestServers;
  service: RunningService;
  key: string;
  api: Api;
  echoAgent: string;
  /** A turn that runs `sleep 300` through the bash tool (cancelled long before; a slow machine spawning the CLI must not see it end). */
  sleepyAgent: string;
}
const test = anyTest as TestFn<Context>;

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers);
  const { key, api } = await newWorkspace(service, "business");
  const echoAgent = await api.agentWith({ model: "faux/scripted", tools: [] }, "echo");
  const sleepyAgent = await api.agentWith(
    { model: "faux/scripted", tools: ["bash"], script: [{ tool_call: { name: "bash", arguments: { command: "sleep 300" } } }, { text: "woke" }] },
    "sleepy",
  );
  t.context = { servers, service, key, api, echoAgent, sleepyAgent };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

interface Result {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * The file's tests run at once, each spawning `runs` processes that compile TypeScript on
 * start: at most 3 at a time, so on 2 busy cores none waits past its 50 s bound for CPU
 * (a CI run saw a `runs admin` start starve that long with 15 spawning at once).
 */
const CLI_SLOTS = 3;
let cliRunning = 0;
const cliWaiting: Array<() => void> = [];
async function cliSlot(): Promise<() => void> {
  if (cliRunning >= CLI_SLOTS) await new Promise<void>((resolve) => cliWaiting.push(resolve));
  cliRunning++;
  return () => {
    cliRunning--;
    cliWaiting.shift()?.();
  };
}

async function runs(t: { context: Context }, args: string[], env: Record<string, string | undefined> = {}): Promise<Result> {
  const fullEnv: NodeJS.ProcessEnv = { ...process.env, RUNS_URL: t.context.service.url, RUNS_API_KEY: t.context.key, ...env };
  for (const [name, value] of Object.entries(env)) if (value === undefined) delete fullEnv[name];
  const release = await cliSlot();
  try {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, ["bin/runs.js", ...args], { cwd: PROJECT_ROOT, env: fullEnv, timeout: 50_000 });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code?: number; stdout?: string; stderr?: string };
    if (typeof e.code !== "number") throw err;
    return { code: e.code, stdout: e.stdout ?? "", stderr: e.stderr ?? "" };
  } finally {
    release();
  }
}

const NO_STACK = /at .*\.(ts|js):\d+/;

test("cli - a reader that has gone (runs models | head) ends the command quietly: no EPIPE stack trace (found by a probe)", async (t) => {
  const release = await cliSlot();
  try {
    const env = { ...process.env, RUNS_URL: t.context.service.url, RUNS_API_KEY: t.context.key };
    const child = spawn(process.execPath, ["bin/runs.js", "models"], { cwd: PROJECT_ROOT, env, stdio: ["ignore", "pipe", "pipe"] });
    let stderr = "";
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const exited = once(child, "exit");
    // Gone before the first line: every write the command makes finds the pipe closed.
    child.stdout.destroy();
    const [code] = (await exited) as [number | null];
    t.is(code, 0, stderr);
    t.notRegex(stderr, /EPIPE|Error/);
    t.notRegex(stderr, NO_STACK);
  } finally {
    release();
  }
});

test("cli - start --wait prints the run line and the output text", async (t) => {
  const res = await runs(t, ["start", "--agent", t.context.echoAgent, "--wait", "hello", "from", "the", "cli"]);
  t.is(res.code, 0, res.stderr);
  const [line, text] = res.stdout.trimEnd().split("\n");
  t.regex(line, /^run_\S+ idle {2}turn turn_\S+ completed$/);
  t.is(text, "hello from the cli");
  t.is(res.stderr, "", "no progress on a stderr that is not a terminal");
});

test("cli - start --json prints one JSON document; get, turns, tag, events and continue read it back", async (t) => {
  const started = await runs(t, ["start", "--agent", t.context.echoAgent, "--tag", "cli", "--tag", "json", "--json", "first"]);
  t.is(started.code, 0, started.stderr);
  const run = JSON.parse(started.stdout);
  t.is(run.object, "run");
  t.is(run.turn.status, "completed");
  t.deepEqual(run.turn.output, [{ type: "output_text", text: "first" }]);
  t.deepEqual(run.tags, ["cli", "json"]);

  const cont = await runs(t, ["continue", run.id, "--on-busy", "queue", "--json", "second"]);
  t.is(cont.code, 0, cont.stderr);
  const second = JSON.parse(cont.stdout);
  t.is(second.disposition, "continued");
  t.is(second.turn.output[0].text, "second");

  const got = await runs(t, ["get", run.id, "--turn", run.turn.id]);
  t.is(got.code, 0);
  t.is(got.stdout, `${run.id} idle  turn ${run.turn.id} completed\nfirst\n`);

  const turns = await runs(t, ["turns", run.id, "--json"]);
  t.deepEqual(JSON.parse(turns.stdout).data.map((turn: { id: string }) => turn.id), [run.turn.id, second.turn.id]);
  const turnLines = await runs(t, ["turns", run.id]);
  t.is(turnLines.stdout.trimEnd().split("\n").length, 2);

  const tagged = await runs(t, ["tag", run.id, "--add", "x", "--remove", "json"]);
  t.is(tagged.stdout, `${run.id} tags: cli, x\n`);

  const events = await runs(t, ["events", run.id, "--turn", run.turn.id, "--json"]);
  const list = JSON.parse(events.stdout);
  t.is(list.history.status, "complete");
  t.is(list.data.at(-1).type, "turn.completed");
  const followed = await runs(t, ["events", run.id, "--turn", second.turn.id, "--follow"]);
  t.is(followed.code, 0);
  t.regex(followed.stdout.trimEnd().split("\n").at(-1)!, /platform\/turn\.completed/);
});

test("cli - --background answers at once; --stream prints the text as it arrives", async (t) => {
  const bg = await runs(t, ["start", "--agent", t.context.echoAgent, "--background", "--json", "later"]);
  t.is(bg.code, 0, bg.stderr);
  const run = JSON.parse(bg.stdout);
  const done = await t.context.api.waitTurn(run.id, run.turn.id);
  t.is(done.turn.output[0].text, "later");

  const streamed = await runs(t, ["start", "--agent", t.context.echoAgent, "--stream", "streamed words arrive"]);
  t.is(streamed.code, 0, streamed.stderr);
  const lines = streamed.stdout.split("\n");
  t.is(lines[0], "streamed words arrive");
  t.regex(lines[1], /^run_\S+ idle {2}turn turn_\S+ completed$/);
});

test("cli - list filters by agent and tag; --json is the list envelope", async (t) => {
  const tag = `list-${Math.random().toString(36).slice(2)}`;
  const a = JSON.parse((await runs(t, ["start", "--agent", t.context.echoAgent, "--tag", tag, "--json", "a"])).stdout);
  const b = JSON.parse((await runs(t, ["start", "--agent", t.context.echoAgent, "--tag", tag, "--json", "b"])).stdout);
  const listed = await runs(t, ["list", "--agent", t.context.echoAgent, "--tag", tag, "--json"]);
  t.is(listed.code, 0, listed.stderr);
  const page = JSON.parse(listed.stdout);
  t.is(page.object, "list");
  t.deepEqual(page.data.map((r: { id: string }) => r.id).sort(), [a.id, b.id].sort());
  const human = await runs(t, ["list", "--tag", tag, "--state", "idle", "--limit", "1"]);
  t.is(human.code, 0, human.stderr);
  t.regex(human.stdout, new RegExp(`^run_\\S+ {2}idle {2}${t.context.echoAgent} v1 {2}\\[${tag}\\]\\n$`));
  t.regex(human.stderr, /^more: --after \S+\n$/);
});

test("cli - cancel a busy run, then delete it", async (t) => {
  const bg = await runs(t, ["start", "--agent", t.context.sleepyAgent, "--background", "--json", "nap"]);
  const run = JSON.parse(bg.stdout);
  await t.context.api.waitRun(run.id, (r) => r.turn?.status === "in_progress");
  const cancelled = await runs(t, ["cancel", run.id]);
  t.is(cancelled.code, 0, cancelled.stderr);
  t.regex(cancelled.stdout, new RegExp(`^${run.id} busy {2}turn ${run.turn.id} cancelling\\n$`));
  const settled = await t.context.api.waitTurn(run.id, run.turn.id);
  t.is(settled.turn.status, "cancelled");
  await t.context.api.waitRun(run.id, (r) => r.state === "idle");
  const deleted = await runs(t, ["delete", run.id]);
  t.is(deleted.code, 0, deleted.stderr);
  t.is(deleted.stdout, `${run.id} deleted\n`);
});

test("cli - approvals: get and turns show the pending action and how to decide it; approve and deny print the action; a second decision exits 1", async (t) => {
  t.timeout(120_000);
  const { api } = t.context;
  // bash commands starting with echo need a person; the model then says "after the decision".
  const gated = await api.agentWith(gatedBashConfig(bashThen("echo gated", "after the decision")), "gated");
  const bg = await runs(t, ["start", "--agent", gated, "--background", "--json", "go"]);
  t.is(bg.code, 0, bg.stderr);
  const run = JSON.parse(bg.stdout);
  const waiting = await api.waitRun(run.id, (r) => r.turn?.pending_action != null);
  const action = waiting.turn.pending_action;

  const got = await runs(t, ["get", run.id]);
  t.is(got.code, 0, got.stderr);
  t.regex(got.stdout, new RegExp(`^${run.id} busy {2}turn ${run.turn.id} in_progress\nwaiting for approval: ${action.id} {2}bash \\{"command":"echo gated"\\} {2}expires \\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\dZ \\(in \\d+ min\\)\n$`));
  t.is(got.stderr, `decide: runs approve ${run.id} ${action.id} [--reason TEXT]  or  runs deny ${run.id} ${action.id} [--reason TEXT]\n`);
  t.is(JSON.parse((await runs(t, ["get", run.id, "--json"])).stdout).turn.pending_action.id, action.id);
  const turns = await runs(t, ["turns", run.id]);
  t.regex(turns.stdout, new RegExp(`^${run.turn.id} {2}in_progress {2}v1 {2}waiting for approval: ${action.id} bash\n$`));
  // The inbox: runs waiting for a person, with what they wait for.
  const inbox = await runs(t, ["list", "--waiting", "--agent", gated]);
  t.is(inbox.code, 0, inbox.stderr);
  t.is(inbox.stdout, `${run.id}  busy  ${gated} v1  waiting for approval: ${action.id} bash\n`);

  const approved = await runs(t, ["approve", run.id, action.id, "--reason", "fine by me"]);
  t.is(approved.code, 0, approved.stderr);
  t.is(approved.stdout, `${action.id} approved by person  ${run.id} ${run.turn.id}  bash {"command":"echo gated"}  reason: fine by me\n`);
  const again = await runs(t, ["deny", run.id, action.id]);
  t.is(again.code, 1);
  t.regex(again.stderr, /^runs: action_already_decided: .+\n$/);
  t.notRegex(again.stderr, NO_STACK);
  const unknown = await runs(t, ["approve", run.id, "act_doesnotexist"]);
  t.is(unknown.code, 1);
  t.regex(unknown.stderr, /^runs: action_not_found: /);
  const done = await api.waitTurn(run.id, run.turn.id);
  t.is(done.turn.status, "completed");
  t.deepEqual(done.turn.output, [{ type: "output_text", text: "after the decision" }]);

  // A streamed turn says what it waits for on stderr and goes on after `runs deny` from elsewhere.
  const tag = `gated-${Math.random().toString(36).slice(2)}`;
  const streaming = runs(t, ["start", "--agent", gated, "--tag", tag, "--stream", "again"]);
  let second: any;
  for (const deadline = Date.now() + 60_000; !second?.turn?.pending_action && Date.now() < deadline; ) {
    await new Promise((resolve) => setTimeout(resolve, 300));
    const listed = await api.get(`/api/v1/runs?tag=${tag}`);
    if (listed.body.data?.[0]) second = (await api.get(`/api/v1/runs/${listed.body.data[0].id}`)).body;
  }
  t.truthy(second?.turn?.pending_action, "the streamed turn waits for a decision");
  const secondAction = second.turn.pending_action;
  const denied = await runs(t, ["deny", second.id, secondAction.id, "--reason", "not today", "--json"]);
  t.is(denied.code, 0, denied.stderr);
  t.like(JSON.parse(denied.stdout), { id: secondAction.id, object: "action", run_id: second.id, decision: "deny", reason: "not today", decided_by: "person" });
  const streamed = await streaming;
  t.is(streamed.code, 0, streamed.stderr);
  t.regex(streamed.stdout, new RegExp(`^after the decision\n${second.id} idle {2}turn ${second.turn.id} completed\n$`));
  t.regex(streamed.stderr, new RegExp(`^waiting for approval: ${secondAction.id} {2}bash \\{"command":"echo gated"\\} {2}expires .+\ndecide: runs approve ${second.id} ${secondAction.id} `));
});

test("cli - a waited turn that does not complete exits 1 with its error", async (t) => {
  const agent = await t.context.api.agentWith({ model: "faux/scripted", tools: [], script: [{ error: { message: "no credit", status: 402 } }] }, "broke");
  const res = await runs(t, ["start", "--agent", agent, "hi"]);
  t.is(res.code, 1);
  t.regex(res.stdout, /^run_\S+ idle {2}turn turn_\S+ failed\n$/);
  t.regex(res.stderr, /^error: provider_quota_exhausted: /);
});

test("cli - API errors print runs: <code>: <message> and exit 1", async (t) => {
  const res = await runs(t, ["get", "run_doesnotexist"]);
  t.is(res.code, 1);
  t.regex(res.stderr, /^runs: run_not_found: .+\n$/);
  t.notRegex(res.stderr, NO_STACK);
  const unauthorized = await runs(t, ["list"], { RUNS_API_KEY: "rk_live_wrong" });
  t.is(unauthorized.code, 1);
  t.regex(unauthorized.stderr, /^runs: unauthorized: /);
});

test("cli - bad usage exits 2 with the usage text and no stack trace", async (t) => {
  const cases: Array<[string[], RegExp, Record<string, string | undefined>?]> = [
    [["start", "hello"], /start needs --agent ID/],
    [["start", "--agent", "agt_x"], /INPUT is required/],
    [["start", "--agent", "agt_x", "--wait", "--background", "x"], /choose one of --wait, --background/],
    [["start", "--agent", "agt_x", "--version", "0", "x"], /--version must be a positive whole number/],
    [["continue", "run_x", "--on-busy", "later", "x"], /--on-busy must be queue, steer, reject/],
    [["list", "--state", "asleep"], /--state must be idle, busy/],
    [["get"], /RUN_ID is required/],
    [["get", "run_x", "--bogus"], /unknown option --bogus/],
    [["tag", "run_x"], /tag needs --add or --remove/],
    [["approve", "run_x"], /ACTION_ID is required \(act_…: runs get run_x shows the action the turn waits for\)/],
    [["deny"], /RUN_ID is required/],
    [["deny", "run_x", "act_x", "--reason"], /--reason needs a value/],
    [["frobnicate"], /unknown command: frobnicate/],
    [[], /no command given/],
    [["list"], /RUNS_API_KEY is not set/, { RUNS_API_KEY: undefined }],
    // fetch's own parse error had ended in a stack trace.
    ...["notaurl", "http://[::1", "ftp://127.0.0.1/", "127.0.0.1:8080"].map((url): [string[], RegExp, Record<string, string>] => [["list"], /RUNS_URL must be the service's http or https address/, { RUNS_URL: url }]),
  ];
  for (const [args, message, env] of cases) {
    const res = await runs(t, args, env);
    t.is(res.code, 2, `runs ${args.join(" ")}`);
    t.regex(res.stderr, message);
    t.regex(res.stderr, /usage: runs <command>/);
    t.notRegex(res.stderr, NO_STACK);
    t.is(res.stdout, "");
  }
  const help = await runs(t, ["--help"]);
  t.is(help.code, 0);
  t.regex(help.stdout, /usage: runs <command>/);
});

test("cli - agents and deploy helpers", async (t) => {
  const created = await runs(t, ["agents", "create", "cli-agent", "--json"]);
  t.is(created.code, 0, created.stderr);
  const agent = JSON.parse(created.stdout);
  const deployed = await runs(t, ["deploy", agent.id, "--model", "faux/scripted"]);
  t.is(deployed.code, 0, deployed.stderr);
  t.is(deployed.stdout, `${agent.id} v1 ready\n`);
  const listed = await runs(t, ["agents"]);
  t.regex(listed.stdout, new RegExp(`${agent.id} {2}cli-agent {2}v1`));
  const started = await runs(t, ["start", "--agent", agent.id, "deployed"]);
  t.regex(started.stdout, /\ndeployed\n$/);
});

test("cli - --version, --help of every command, and mistakes answered with the command's usage and a suggestion", async (t) => {
  const version = await runs(t, ["--version"]);
  t.is(version.code, 0, version.stderr);
  t.is(version.stdout, "0.1.0\n");

  const help = await runs(t, ["--help"]);
  for (const command of COMMANDS) t.regex(help.stdout, new RegExp(`\\n {2}runs ${command}\\b`), command);
  t.regex(help.stdout, /runs admin set-plan WORKSPACE_ID --plan solo\|business/);

  // Every command's own help, in process (a spawn each would cost seconds).
  for (const command of COMMANDS) {
    const io = bufferIo();
    t.is(await runCli([command, "--help"], io), 0, command);
    t.regex(io.out(), new RegExp(`^usage: runs <command> \\[options\\]\\n {2}runs ${command}\\b`), command);
    t.notRegex(io.out(), command === "agents" ? /runs start/ : /runs start .*\n.*runs list/, "only the command's own lines");
  }

  const typo = await runs(t, ["get", "run_x", "--tunr", "turn_1"]);
  t.is(typo.code, 2);
  t.regex(typo.stderr, /^runs: unknown option --tunr \(did you mean --turn\?\)\n\nusage: runs <command> \[options\]\n {2}runs get RUN_ID \[--turn TURN_ID\]\n/);
  t.notRegex(typo.stderr, /runs list/, "the command's usage, not every command's");
  const command = await runs(t, ["lsit"]);
  t.is(command.code, 2);
  t.regex(command.stderr, /^runs: unknown command: lsit \(did you mean list\?\)/);
  // The command alone, not the whole line (found by a probe: "unknown command: strat --agent x hi").
  const words = await runs(t, ["strat", "--agent", "agt_x", "hi"]);
  t.regex(words.stderr, /^runs: unknown command: strat \(did you mean start\?\)\n/);
  // The client package's runs has no admin (the service's runs serves it before this).
  const admin = bufferIo();
  t.is(await runCli(["admin", "create-workspace", "--plan", "solo"], { ...admin, env: {} }), 2);
  t.regex(admin.out(), /^runs: admin runs on the service's machine, with its own runs command/);
  const value = await runs(t, ["list", "--limit"]);
  t.is(value.code, 2);
  t.regex(value.stderr, /^runs: --limit needs a value\n/);
  const twice = await runs(t, ["get", "run_x", "--turn", "a", "--turn", "b"]);
  t.regex(twice.stderr, /^runs: --turn given twice\n/);
  const flagValue = await runs(t, ["events", "run_x", "--follow=yes"]);
  t.regex(flagValue.stderr, /^runs: --follow takes no value\n/);
});

function bufferIo(): CliIo & { out: () => string } {
  let out = "";
  const sink = new Writable({
    write(chunk, _encoding, done) {
      out += String(chunk);
      done();
    },
  });
  return { stdout: sink, stderr: sink, stdin: process.stdin, env: {}, out: () => out };
}

test("cli - usage and budget: a table and --json; a budget set, shown and removed; bad flags exit 2", async (t) => {
  const counting = await t.context.api.agentWith({ model: "faux/scripted", tools: [], script: [{ text: "n", usage: { input: 40, output: 2 } }] }, "counting");
  t.is((await runs(t, ["start", "--agent", counting, "hi"])).code, 0);
  const table = await runs(t, ["usage", "--group-by", "agent"]);
  t.is(table.code, 0, table.stderr);
  const lines = table.stdout.trimEnd().split("\n");
  t.regex(lines[0]!, /^agent\s+turns\s+input\s+output\s+cache\s+cost$/);
  t.regex(table.stdout, new RegExp(`${counting}\\s+1\\s+40\\s+2\\s+0\\s+-`));
  t.regex(lines.at(-1)!, /^total\s+\d+/);
  const lastMonth = new Date(Date.UTC(new Date().getUTCFullYear(), new Date().getUTCMonth() - 1, 1));
  const json = JSON.parse((await runs(t, ["usage", "--group-by", "model", "--from", lastMonth.toISOString().slice(0, 10), "--json"])).stdout);
  t.is(json.object, "usage");
  t.is(json.from, lastMonth.getTime() / 1000);
  t.true(json.total.input_tokens >= 40);

  const set = await runs(t, ["budget", "set", "--tokens", "1000000"]);
  t.is(set.code, 0, set.stderr);
  t.regex(set.stdout, /^budget: \d+ of 1000000 tokens this month \(until \d{4}-\d{2}-01\)\n$/);
  t.is(JSON.parse((await runs(t, ["budget", "--json"])).stdout).monthly_tokens, 1_000_000);
  t.regex((await runs(t, ["usage"])).stdout, /\nbudget: /);
  t.is((await runs(t, ["budget", "delete"])).stdout, "budget removed\n");
  const none = await runs(t, ["budget"]);
  t.is(none.code, 1);
  t.regex(none.stderr, /^runs: not_found: The workspace has no budget/);

  const tooLong = await runs(t, ["usage", "--from", "2020-01-01"]);
  t.is(tooLong.code, 1);
  t.regex(tooLong.stderr, /^runs: invalid_request: A summary covers at most 366 days/);
  for (const bad of [["usage", "--group-by", "week"], ["usage", "--from", "yesterday"], ["budget", "set"], ["budget", "set", "--cost", "free"], ["budget", "sett"]]) {
    const refused = await runs(t, bad);
    t.is(refused.code, 2, bad.join(" "));
    t.regex(refused.stderr, /^runs: /, bad.join(" "));
  }
});

test("cli - webhooks: create shows the secret once, list, disable, deliveries, delete; a private address and a bad subcommand are refused", async (t) => {
  const created = await runs(t, ["webhooks", "create", "https://hooks.example.com/runs", "--event", "turn.completed", "--event", "turn.failed"]);
  t.is(created.code, 0, created.stderr);
  const id = /^(wh_\w+)  enabled  turn\.completed,turn\.failed  https:\/\/hooks\.example\.com\/runs\n$/.exec(created.stdout)?.[1];
  t.truthy(id, created.stdout);
  t.regex(created.stderr, /^secret \(shown once\): whsec_/);
  t.regex((await runs(t, ["webhooks"])).stdout, new RegExp(`^${id}  enabled`, "m"));
  t.regex((await runs(t, ["webhooks", "disable", id!])).stdout, new RegExp(`^${id}  disabled  `));
  t.is(JSON.parse((await runs(t, ["webhooks", "get", id!, "--json"])).stdout).enabled, false);
  const deliveries = await runs(t, ["webhooks", "deliveries", id!]);
  t.is(deliveries.code, 0);
  // Other tests of this file run turns in the workspace meanwhile: whatever was delivered (or not) is listed a line each.
  t.regex(deliveries.stdout, /^(whd_\S+  turn\.(completed|failed)  (pending|delivered|failed)  attempts \d+.*\n)*$/);
  t.is((await runs(t, ["webhooks", "delete", id!])).stdout, `${id} deleted\n`);
  const privateAddress = await runs(t, ["webhooks", "create", "http://127.0.0.1:9/x"]);
  t.is(privateAddress.code, 1);
  t.regex(privateAddress.stderr, /^runs: invalid_request: .*loopback/);
  const typo = await runs(t, ["webhooks", "delte", "wh_x"]);
  t.is(typo.code, 2);
  t.regex(typo.stderr, /did you mean webhooks delete/);
});

test("cli - admin says which store it uses and refuses a missing or empty one unless --create", async (t) => {
  t.timeout(120_000);
  const dataDir = await mkdtemp(path.join(os.tmpdir(), "runs-admin-"));
  t.teardown(() => rm(dataDir, { recursive: true, force: true }));
  const env = { RUNS_DATA_DIR: dataDir, MONGODB_URI: undefined, NATS_URL: undefined, RUNS_URL: undefined, RUNS_API_KEY: undefined };

  const refused = await runs(t, ["admin", "create-workspace", "--plan", "solo"], env);
  t.is(refused.code, 2);
  t.is(refused.stderr, `runs: no store in ${dataDir} (RUNS_DATA_DIR): is that the folder npm start uses? Run from the service's folder or set RUNS_DATA_DIR; --create makes a new store there.\n`);
  t.false(existsSync(path.join(dataDir, "ferretdb")), "nothing was created");

  const created = await runs(t, ["admin", "create-workspace", "--plan", "solo", "--create"], env);
  t.is(created.code, 0, created.stderr);
  t.is(created.stderr, `runs: store: the embedded store in ${dataDir} (the service is not running)\n`);
  t.is(JSON.parse(created.stdout).workspace.plan, "solo");
  const again = await runs(t, ["admin", "set-plan", JSON.parse(created.stdout).workspace.id, "--plan", "business"], env);
  t.is(again.code, 0, again.stderr);
  t.is(JSON.parse(again.stdout).workspace.plan, "business");
  const wsId = JSON.parse(created.stdout).workspace.id;
  const budget = await runs(t, ["admin", "set-budget", wsId, "--tokens", "1000", "--cost", "2.5"], env);
  t.is(budget.code, 0, budget.stderr);
  t.like(JSON.parse(budget.stdout), { workspace_id: wsId, budget: { object: "usage.budget", monthly_tokens: 1000, monthly_cost_usd: 2.5, exhausted: null } });
  const removed = await runs(t, ["admin", "set-budget", wsId, "--remove"], env);
  t.deepEqual(JSON.parse(removed.stdout), { workspace_id: wsId, budget: null });
  for (const bad of [["--cost", "-1"], ["--tokens", "1.5"], [], ["--remove", "--tokens", "5"]]) {
    const refused = await runs(t, ["admin", "set-budget", wsId, ...bad], env);
    t.is(refused.code, 2, bad.join(" "));
    t.regex(refused.stderr, /set-budget|--cost|--tokens/, bad.join(" "));
  }
  const unknown = await runs(t, ["admin", "set-budget", "ws_nope", "--tokens", "5"], env);
  t.is(unknown.code, 2);
  t.regex(unknown.stderr, /no workspace ws_nope/);

  // A MongoDB database with no workspace is not the service's store: refused, its URI shown without credentials.
  const uri = new URL(t.context.servers.mongoUri);
  uri.username = "someone";
  uri.password = "secret-password";
  const empty = await runs(t, ["admin", "create-workspace", "--plan", "solo"], { ...env, MONGODB_URI: t.context.servers.mongoUri, MONGODB_DB: `empty_${process.pid}` });
  t.is(empty.code, 2);
  t.regex(empty.stderr, /^runs: store: MONGODB_URI mongodb:\/\/.+, database empty_\d+\nruns: the store \(.+\) has no workspace: not the service's store\? --create makes its first workspace there\.\n$/);
  const hidden = await runs(t, ["admin", "set-plan", "ws_x", "--plan", "solo"], { ...env, MONGODB_URI: uri.toString(), MONGODB_DB: `empty_${process.pid}` });
  t.false(hidden.stderr.includes("secret-password"), hidden.stderr);
  t.regex(hidden.stderr, /MONGODB_URI mongodb:\/\/\*\*\*@/);
});

test("cli - on a terminal, a streamed turn shows what it is doing on stderr until its text begins; stdout has the text and the run line only", async (t) => {
  const io = bufferIo();
  let err = "";
  const stderr = new Writable({
    write(chunk, _encoding, done) {
      err += String(chunk);
      done();
    },
  });
  const tty = Object.assign(stderr, { isTTY: true });
  const napper = await t.context.api.agentWith({ model: "faux/scripted", tools: ["bash"], script: [{ tool_call: { name: "bash", arguments: { command: "sleep 1" } } }, { text: "woke" }] }, "napper");
  const code = await runCli(["start", "--agent", napper, "--stream", "hi"], { ...io, stderr: tty, env: { RUNS_URL: t.context.service.url, RUNS_API_KEY: t.context.key } });
  t.is(code, 0, err);
  t.regex(err, /running bash/, "the tool the turn runs is shown while it runs");
  t.regex(io.out(), /^woke\nrun_\w+ idle {2}turn turn_\w+ completed\n$/, "stdout: the text, then the run line; no progress");
});

test("cli - a model's control characters reach a terminal as visible escapes (no cursor moves, titles or clipboard writes), a file or pipe as they are; waited and streamed", async (t) => {
  const hostile = "ok\u001b]52;c;aGk=\u0007 \u001b[2J\u009b31m\rspoof\r\nnext\tcol \u202erm -rf\u2066x\u2069";
  const shown = "ok\\u001b]52;c;aGk=\\u0007 \\u001b[2J\\u009b31m\\u000dspoof\r\nnext\tcol \\u202erm -rf\\u2066x\\u2069";
  const agent = await t.context.api.agentWith({ model: "faux/scripted", tools: [], script: [{ text: hostile }] }, "hostile");
  const env = { RUNS_URL: t.context.service.url, RUNS_API_KEY: t.context.key };
  for (const streamed of [false, true]) {
    const args = ["start", "--agent", agent, ...(streamed ? ["--stream"] : []), "hi"];
    const terminal = bufferIo();
    // stdout a terminal; stderr (the spinner's) apart.
    const stdout = Object.assign(new Writable({ write: (chunk, _encoding, done) => done(void terminal.stdout.write(chunk)) }), { isTTY: true });
    t.is(await runCli(args, { ...terminal, stdout, stderr: bufferIo().stderr, env }), 0, terminal.out());
    t.true(terminal.out().includes(shown), `${streamed}: ${JSON.stringify(terminal.out())}`);
    t.false(/[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]|\r(?!\n)/.test(terminal.out()), `${streamed}: no raw control character`);
    const piped = bufferIo();
    t.is(await runCli(args, { ...piped, env }), 0);
    t.true(piped.out().includes(hostile), `${streamed}: piped as it is`);
  }
  // Line breaks a stream splits between two deltas (chunks of 12-20 characters over 5-character
  // lines: some fall between \r and \n) still reach the terminal as line breaks.
  const crlf = await t.context.api.agentWith({ model: "faux/scripted", tools: [], script: [{ text: "abc\r\n".repeat(200) }] }, "crlf");
  const terminal = bufferIo();
  const stdout = Object.assign(new Writable({ write: (chunk, _encoding, done) => done(void terminal.stdout.write(chunk)) }), { isTTY: true });
  t.is(await runCli(["start", "--agent", crlf, "--stream", "hi"], { ...terminal, stdout, stderr: bufferIo().stderr, env }), 0);
  t.true(terminal.out().startsWith("abc\r\n".repeat(200)), JSON.stringify(terminal.out().slice(0, 200)));
});
