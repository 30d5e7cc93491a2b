import test from "ava";
import { readdirSync, readFileSync } from "node:fs";
import { access, chmod, mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import type { AgentMessage, StreamFn } from "@mariozechner/pi-agent-core";
import { createAssistantMessageEventStream, type AssistantMessage, type Context, type ToolResultMessage } from "@mariozechner/pi-ai";
import type { AgentConfig, InputPart, RuntimeEvent, ScriptStep } from "../../src/domain.js";
import { MAX_TOOL_CALLS_PER_MESSAGE, startTurn, SteeringTargetEndedError, type RunningTurn, type TurnRunRequest } from "../../actors/agent-runner.js";
import { buildUserMessage, classifyFile } from "../../actors/user-message.js";
import { providerFailure, sanitizeErrorText } from "../../actors/provider-failures.js";
import { resolveModel } from "../../actors/model-resolution.js";
import { listModels } from "../../src/models.js";
import { scriptedModel } from "../../actors/scripted-model.js";
import type { Sandbox } from "../../actors/sandbox.js";
import { testSandbox } from "../helpers/sandbox.js";
import { writeChatStream } from "../helpers/chat-stream.js";

let sandbox: Sandbox;
test.before(async () => {
  sandbox = await testSandbox();
});

/** Every workspace made, removed after the file's tests (also those a test left behind). */
const workspaces: string[] = [];
test.after.always(async () => {
  await Promise.all(workspaces.map((dir) => rm(dir, { recursive: true, force: true })));
});

async function workspace(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "agent-runner-"));
  workspaces.push(dir);
  await chmod(dir, 0o711);
  await sandbox.prepareWorkspace(dir);
  return dir;
}

function scripted(script?: ScriptStep[], extra: Partial<AgentConfig> = {}): AgentConfig {
  return { model: "faux/scripted", tools: ["bash"], ...(script ? { script } : {}), ...extra };
}

function bash(command: string): ScriptStep {
  return { tool_call: { name: "bash", arguments: { command } } };
}

function text(value: string): InputPart[] {
  return [{ type: "input_text", text: value }];
}

/** Starts a turn collecting its events; `onEvent` also gets the running turn. */
function run(
  req: Omit<TurnRunRequest, "onEvent" | "sandbox"> & { onEvent?: (event: RuntimeEvent, turn: RunningTurn) => void },
): { turn: RunningTurn; events: RuntimeEvent[] } {
  const events: RuntimeEvent[] = [];
  const turn: RunningTurn = startTurn({
    sandbox,
    // Tests talk to model servers of their own on loopback.
    allowPrivateModelEndpoints: true,
    ...req,
    onEvent: (event) => {
      events.push(event);
      req.onEvent?.(event, turn);
    },
  });
  return { turn, events };
}

/** A turn on `dir` whose model is `streamFn` (input "x", no history). */
function runWith(dir: string, streamFn: StreamFn, config: AgentConfig = scripted()) {
  return run({ config, workspaceDir: dir, history: [], input: text("x"), resolveModel: () => ({ model: scriptedModel, streamFn }) });
}

/** Wraps the real resolver so the test sees every context the model was called with. */
function recordingResolver(contexts: Context[]): typeof resolveModel {
  return (ref, options) => {
    const resolved = resolveModel(ref, options);
    if ("error" in resolved || !resolved.streamFn) return resolved;
    const inner = resolved.streamFn;
    const streamFn: StreamFn = (model, context, opts) => {
      contexts.push({ ...context, messages: structuredClone(context.messages) });
      return inner(model, context, opts);
    };
    return { ...resolved, streamFn };
  };
}

function userTexts(messages: AgentMessage[]): string[] {
  return messages.flatMap((m) =>
    m.role === "user" ? [typeof m.content === "string" ? m.content : m.content.map((c) => (c.type === "text" ? c.text : "")).join("")] : [],
  );
}

/** Waits (bounded) until `file` holds a whole line: the shell creates it before it writes to it. */
async function waitForLine(file: string): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if ((await readFile(file, "utf8").catch(() => "")).endsWith("\n")) return;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** Live (not zombie) host processes whose command line contains `marker`. */
function hostProcesses(marker: string): number[] {
  return readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry) && safeRead(`/proc/${entry}/cmdline`).replaceAll("\0", " ").includes(marker))
    .map(Number)
    .filter((pid) => !processGone(pid));
}

function processGone(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return true;
  }
  // A zombie (killed, not yet reaped by a container's pid 1) is gone for our purpose.
  return /\)\s+Z\s/.test(safeRead(`/proc/${pid}/stat`));
}

function safeRead(file: string): string {
  try {
    return readFileSync(file, "utf8");
  } catch {
    return "";
  }
}

test("agent-runner - a bash tool call then text completes with the text and the file", async (t) => {
  const dir = await workspace();
  const { turn, events } = run({
    config: scripted([bash("echo hi > a.txt && sleep 0.2"), { text: "done" }]),
    workspaceDir: dir,
    history: [],
    input: text("make a file"),
  });
  const result = await turn.result;
  t.is(result.outcome, "completed");
  t.deepEqual(result.output, [{ type: "output_text", text: "done" }]);
  t.is(result.error, undefined);
  t.is(await readFile(path.join(dir, "a.txt"), "utf8"), "hi\n");
  t.deepEqual(
    result.transcript.map((m) => m.role),
    ["user", "assistant", "toolResult", "assistant"],
  );
  const toolEnd = events.find((e) => e.type === "tool_execution_end");
  t.is(toolEnd?.data.toolName, "bash");
  t.is(toolEnd?.data.isError, false);
  await rm(dir, { recursive: true });
});

test("agent-runner - without a script the model echoes the input", async (t) => {
  const dir = await workspace();
  const { turn } = run({ config: scripted(), workspaceDir: dir, history: [], input: text("hello there") });
  const result = await turn.result;
  t.is(result.outcome, "completed");
  t.deepEqual(result.output, [{ type: "output_text", text: "hello there" }]);
  await rm(dir, { recursive: true });
});

test("agent-runner - history reaches the model and is not repeated in the transcript", async (t) => {
  const dir = await workspace();
  const first = await run({ config: scripted(), workspaceDir: dir, history: [], input: text("one") }).turn.result;
  const contexts: Context[] = [];
  const second = await run({
    config: scripted(),
    workspaceDir: dir,
    history: first.transcript,
    input: text("two"),
    resolveModel: recordingResolver(contexts),
  }).turn.result;
  t.deepEqual(userTexts(contexts[0].messages), ["one", "two"]);
  t.deepEqual(userTexts(second.transcript), ["two"]);
  t.deepEqual(second.output, [{ type: "output_text", text: "two" }]);
  await rm(dir, { recursive: true });
});

test("agent-runner - error step with status 429 fails with provider_rate_limited, retryable", async (t) => {
  const dir = await workspace();
  const { turn } = run({
    config: scripted([{ error: { message: "slow down", status: 429 } }]),
    workspaceDir: dir,
    history: [],
    input: text("x"),
  });
  const result = await turn.result;
  t.is(result.outcome, "failed");
  t.is(result.error?.code, "provider_rate_limited");
  t.is(result.error?.retryable, true);
  t.is(result.error?.source, "provider");
  t.is(result.error?.message, "slow down");
  t.regex(result.error?.reference ?? "", /^ref_[0-9A-Za-z]{20}$/);
  await rm(dir, { recursive: true });
});

test("agent-runner - error step with status 401 fails with provider_authentication_failed", async (t) => {
  const dir = await workspace();
  const result = await run({
    config: scripted([{ error: { message: "bad key", status: 401 } }]),
    workspaceDir: dir,
    history: [],
    input: text("x"),
  }).turn.result;
  t.is(result.outcome, "failed");
  t.is(result.error?.code, "provider_authentication_failed");
  t.is(result.error?.retryable, false);
  await rm(dir, { recursive: true });
});

test("agent-runner - error step without status fails with provider_failure", async (t) => {
  const dir = await workspace();
  const result = await run({
    config: scripted([{ error: { message: "x" } }]),
    workspaceDir: dir,
    history: [],
    input: text("x"),
  }).turn.result;
  t.is(result.error?.code, "provider_failure");
  t.is(result.error?.retryable, true);
  await rm(dir, { recursive: true });
});

test("agent-runner - a failing tool is an error result for the model, not a turn failure", async (t) => {
  const dir = await workspace();
  const result = await run({
    config: scripted([bash("echo broken; exit 2"), { text: "recovered" }]),
    workspaceDir: dir,
    history: [],
    input: text("x"),
  }).turn.result;
  t.is(result.outcome, "completed");
  t.deepEqual(result.output, [{ type: "output_text", text: "recovered" }]);
  const toolResult = result.transcript.find((m) => m.role === "toolResult");
  t.true(toolResult?.role === "toolResult" && toolResult.isError);
  t.regex(JSON.stringify(toolResult), /exited with code 2/);
  await rm(dir, { recursive: true });
});

test("agent-runner - abort during sleep 5 ends aborted quickly and kills the process", async (t) => {
  const dir = await workspace();
  // The command runs in its own PID namespace: it is found on the host by its arguments.
  const marker = `5.${process.pid}${Date.now() % 100000}`;
  let abortedAt = 0;
  const { turn } = run({
    config: scripted([bash(`echo started > pid && exec sleep ${marker}`), { text: "never" }]),
    workspaceDir: dir,
    history: [],
    input: text("x"),
    onEvent: (event, running) => {
      // Abort once the command is really running (its pid is written).
      if (event.type === "tool_execution_start") {
        void waitForLine(path.join(dir, "pid")).then(() => {
          abortedAt = Date.now();
          running.abort();
        });
      }
    },
  });
  const result = await turn.result;
  const elapsed = Date.now() - abortedAt;
  t.is(result.outcome, "aborted");
  t.is(result.error, undefined);
  t.true(result.actionInterrupted, "aborted while the command ran: an action may have acted");
  t.true(abortedAt > 0 && elapsed < 1500, `took ${elapsed} ms after abort`);
  t.false(result.output.some((part) => part.text === "never"));
  t.is((await readFile(path.join(dir, "pid"), "utf8")).trim(), "started");
  await new Promise((resolve) => setTimeout(resolve, 100));
  t.deepEqual(hostProcesses(`sleep ${marker}`), [], "the command's process is gone from the host");
  t.throws(() => turn.steer("too late"), { instanceOf: SteeringTargetEndedError });
  await rm(dir, { recursive: true });
});

test("agent-runner - a tool call runs only once beforeAction has settled, after its start was reported; a turn aborted in a model call reports no action interrupted", async (t) => {
  const dir = await workspace();
  const seen: string[] = [];
  const { turn } = run({
    config: scripted([bash("touch ran.txt"), { text: "done" }]),
    workspaceDir: dir,
    history: [],
    input: text("x"),
    onEvent: (event) => {
      if (event.type === "tool_execution_start" || event.type === "tool_execution_end") seen.push(event.type);
    },
    beforeAction: async () => {
      seen.push("beforeAction");
      await new Promise((resolve) => setTimeout(resolve, 200));
      seen.push(`ran before it settled: ${await access(path.join(dir, "ran.txt")).then(() => "yes", () => "no")}`);
      return true;
    },
  });
  const result = await turn.result;
  t.is(result.outcome, "completed");
  t.deepEqual(seen, ["tool_execution_start", "beforeAction", "ran before it settled: no", "tool_execution_end"]);
  await access(path.join(dir, "ran.txt"));
  t.is(result.actionInterrupted, undefined);

  // A start that could not be stored: the call does not run and the model is told; a read-only tool's call needs no record.
  let asked = 0;
  const refused = run({
    config: { ...scripted([bash("touch refused.txt"), { tool_call: { name: "ls", arguments: {} } }, { text: "done" }]), tools: ["bash", "ls"] },
    workspaceDir: dir,
    history: [],
    input: text("x"),
    beforeAction: async () => {
      asked++;
      return false;
    },
  });
  const denied = await refused.turn.result;
  t.is(denied.outcome, "completed");
  t.is(asked, 1, "asked for the bash call only");
  await t.throwsAsync(access(path.join(dir, "refused.txt")));
  const results = denied.transcript.filter((m) => m.role === "toolResult") as ToolResultMessage[];
  t.true(results[0]!.isError);
  t.regex(JSON.stringify(results[0]!.content), /did not run: the service could not record that it was starting/);
  t.false(results[1]!.isError, JSON.stringify(results[1]!.content));

  // Aborted while the model streams its answer, after a call that ended: no action was running.
  const slow = run({
    config: scripted([bash("true"), { text: "a long answer ".repeat(50) }], { tokens_per_second: 20 }),
    workspaceDir: dir,
    history: [],
    input: text("x"),
    onEvent: (event, running) => {
      if (event.type === "text_delta") running.abort();
    },
  });
  const aborted = await slow.turn.result;
  t.is(aborted.outcome, "aborted");
  t.is(aborted.actionInterrupted, undefined);
});

test("agent-runner - the request's abort signal cancels the turn", async (t) => {
  const dir = await workspace();
  const controller = new AbortController();
  const { turn } = run({
    config: scripted([bash("sleep 5")]),
    workspaceDir: dir,
    history: [],
    input: text("x"),
    signal: controller.signal,
    onEvent: (event) => {
      if (event.type === "tool_execution_start") setTimeout(() => controller.abort(), 50);
    },
  });
  const started = Date.now();
  const result = await turn.result;
  t.is(result.outcome, "aborted");
  t.true(Date.now() - started < 3000);
  await rm(dir, { recursive: true });
});

test("agent-runner - an already aborted signal never starts the agent", async (t) => {
  const dir = await workspace();
  const { turn, events } = run({
    config: scripted([bash("touch ran.txt")]),
    workspaceDir: dir,
    history: [],
    input: text("x"),
    signal: AbortSignal.abort(),
  });
  const result = await turn.result;
  t.is(result.outcome, "aborted");
  t.deepEqual(userTexts(result.transcript), ["x"]);
  t.is(events.length, 0);
  await t.throwsAsync(access(path.join(dir, "ran.txt")));
  await rm(dir, { recursive: true });
});

test("agent-runner - a steer during a tool call is seen by the model before its final answer", async (t) => {
  const dir = await workspace();
  const contexts: Context[] = [];
  const { turn } = run({
    config: scripted([bash("sleep 1"), { text: "done" }]),
    workspaceDir: dir,
    history: [],
    input: text("start"),
    resolveModel: recordingResolver(contexts),
    onEvent: (event, running) => {
      if (event.type === "tool_execution_start") setTimeout(() => running.steer("also mind the tests"), 100);
    },
  });
  const result = await turn.result;
  t.is(result.outcome, "completed");
  t.deepEqual(result.output, [{ type: "output_text", text: "done" }]);
  t.is(contexts.length, 2);
  t.deepEqual(userTexts(contexts[1].messages), ["start", "also mind the tests"]);
  const steerIndex = result.transcript.findIndex(
    (m) => m.role === "user" && userTexts([m])[0] === "also mind the tests",
  );
  const finalIndex = result.transcript.length - 1;
  t.true(steerIndex > 0 && steerIndex < finalIndex);
  t.is(result.transcript[finalIndex].role, "assistant");
  await rm(dir, { recursive: true });
});

test("agent-runner - a steer arriving as the agent finishes still gets one more step", async (t) => {
  const dir = await workspace();
  let steered = false;
  const { turn, events } = run({
    config: scripted([{ text: "first answer" }]),
    workspaceDir: dir,
    history: [],
    input: text("start"),
    onEvent: (event, running) => {
      if (event.type === "agent_end" && !steered) {
        steered = true;
        running.steer("one more thing");
      }
    },
  });
  const result = await turn.result;
  t.true(steered);
  t.is(result.outcome, "completed");
  // Past the script the model echoes the latest user message: the steer.
  t.deepEqual(result.output, [{ type: "output_text", text: "one more thing" }]);
  t.deepEqual(userTexts(result.transcript), ["start", "one more thing"]);
  t.deepEqual(
    result.transcript.map((m) => m.role),
    ["user", "assistant", "user", "assistant"],
  );
  t.is(events.filter((e) => e.type === "agent_start").length, 2);
  t.throws(() => turn.steer("after the end"), { instanceOf: SteeringTargetEndedError });
});

test("agent-runner - steers the agent never saw stay in the transcript of a failed turn", async (t) => {
  const dir = await workspace();
  const { turn } = run({
    config: scripted([{ error: { message: "down", status: 503 } }]),
    workspaceDir: dir,
    history: [],
    input: text("start"),
    onEvent: (event, running) => {
      if (event.type === "message_end" && (event.data.message as AgentMessage).role === "assistant") {
        running.steer("undelivered");
      }
    },
  });
  const result = await turn.result;
  t.is(result.outcome, "failed");
  t.is(result.error?.code, "provider_service_unavailable");
  t.deepEqual(userTexts(result.transcript), ["start", "undelivered"]);
  await rm(dir, { recursive: true });
});

test("agent-runner - events map 1:1, message updates flattened, never a partial", async (t) => {
  const dir = await workspace();
  const { turn, events } = run({
    config: scripted([bash("echo hi"), { text: "All done here, with a longer answer to stream." }]),
    workspaceDir: dir,
    history: [],
    input: text("x"),
  });
  await turn.result;
  const types = events.map((e) => e.type);
  t.is(types[0], "agent_start");
  t.is(types.at(-1), "agent_end");
  t.false(types.includes("message_update"));
  for (const type of ["turn_start", "message_start", "message_end", "text_delta", "toolcall_delta", "tool_execution_start", "tool_execution_end", "turn_end"]) {
    t.true(types.includes(type), type);
  }
  const textDelta = events.find((e) => e.type === "text_delta")!;
  t.deepEqual(Object.keys(textDelta.data).sort(), ["contentIndex", "delta"]);
  for (const event of events) t.false("partial" in event.data, event.type);
  const agentEnd = events.at(-1)!;
  t.deepEqual(agentEnd.data, { messageCount: 4 }); // user, assistant, toolResult, assistant
  const deltas = events
    .filter((e) => e.type === "text_delta")
    .map((e) => e.data.delta)
    .join("");
  t.is(deltas, "All done here, with a longer answer to stream.");
  await rm(dir, { recursive: true });
});

test("agent-runner - onEvent is not called before startTurn returns", async (t) => {
  const dir = await workspace();
  let returned = false;
  let early = false;
  const turn = startTurn({
    sandbox,
    config: scripted(),
    workspaceDir: dir,
    history: [],
    input: text("x"),
    onEvent: () => {
      if (!returned) early = true;
    },
  });
  returned = true;
  await turn.result;
  t.false(early);
  await rm(dir, { recursive: true });
});

test("agent-runner - an exception in the loop fails with agent_execution_failed, sanitized", async (t) => {
  const dir = await workspace();
  const result = await runWith(dir, () => {
    throw new Error("kaboom with sk-abcdefghijklmnop1234567");
  }).turn.result;
  t.is(result.outcome, "failed");
  t.is(result.error?.code, "agent_execution_failed");
  t.is(result.error?.source, "runtime");
  t.regex(result.error?.message ?? "", /kaboom/);
  t.notRegex(result.error?.message ?? "", /sk-abcdefghijklmnop/);
  await rm(dir, { recursive: true });
});

test("agent-runner - the result never rejects, even when preparing the turn throws", async (t) => {
  const dir = await workspace();
  const result = await run({
    config: scripted(),
    workspaceDir: dir,
    history: [],
    input: text("x"),
    resolveModel: () => {
      throw new Error("resolver broke");
    },
  }).turn.result;
  t.is(result.outcome, "failed");
  t.is(result.error?.code, "agent_execution_failed");
  t.regex(result.error?.message ?? "", /resolver broke/);
  await rm(dir, { recursive: true });
});

test("agent-runner - a missing API key fails before calling the model: agent_configuration_invalid", async (t) => {
  const dir = await workspace();
  const { turn, events } = run({
    config: { model: "openai/gpt-4.1-mini" },
    workspaceDir: dir,
    history: [],
    input: text("x"),
    getApiKey: () => undefined,
  });
  const result = await turn.result;
  t.is(result.outcome, "failed");
  t.is(result.error?.code, "agent_configuration_invalid");
  t.is(result.error?.source, "configuration");
  t.regex(result.error?.message ?? "", /provider "openai"/);
  t.is(events.length, 0);
  t.deepEqual(userTexts(result.transcript), ["x"]);
  await rm(dir, { recursive: true });
});

test("agent-runner - an unknown model fails with agent_configuration_invalid naming it", async (t) => {
  const dir = await workspace();
  const result = await run({
    config: { model: "nowhere/model-x" },
    workspaceDir: dir,
    history: [],
    input: text("x"),
  }).turn.result;
  t.is(result.error?.code, "agent_configuration_invalid");
  t.regex(result.error?.message ?? "", /nowhere\/model-x/);
  await rm(dir, { recursive: true });
});

test("agent-runner - a real provider's HTTP status is mapped (openai-compatible server answering 401 and 429)", async (t) => {
  const dir = await workspace();
  let status = 401;
  let authorization: string | undefined;
  const server = createServer((req, res) => {
    authorization = req.headers.authorization;
    req.resume();
    res.writeHead(status, { "content-type": "application/json", "retry-after-ms": "1" });
    res.end(JSON.stringify({ error: { message: "nope", type: "test_error" } }));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
  try {
    const config: AgentConfig = { model: { provider: "openai-compatible", base_url: baseUrl, model: "m" }, tools: [] };
    const unauthorized = await run({ config, workspaceDir: dir, history: [], input: text("x") }).turn.result;
    t.is(unauthorized.error?.code, "provider_authentication_failed");
    t.is(authorization, "Bearer none"); // the placeholder key when none is configured
    status = 429;
    const limited = await run({
      config,
      workspaceDir: dir,
      history: [],
      input: text("x"),
      getApiKey: () => "sk-test",
    }).turn.result;
    t.is(limited.error?.code, "provider_rate_limited");
    t.is(authorization, "Bearer sk-test");
  } finally {
    server.close();
    await rm(dir, { recursive: true });
  }
});

test("agent-runner - an openai-compatible endpoint whose name rebinds to loopback after the check fails network_policy_denied, and its server gets nothing", async (t) => {
  const dir = await workspace();
  let hits = 0;
  const server = createServer((req, res) => {
    hits++;
    req.resume();
    res.writeHead(500).end();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  let lookups = 0;
  // Public to the check before the turn, loopback to the model call's connection.
  const modelEndpointLookup = async () => (lookups++ === 0 ? [{ address: "93.184.216.34", family: 4 }] : [{ address: "127.0.0.1", family: 4 }]);
  try {
    const config: AgentConfig = { model: { provider: "openai-compatible", base_url: `http://rebind.test:${(server.address() as AddressInfo).port}/v1`, model: "m" }, tools: [] };
    const result = await run({ config, workspaceDir: dir, history: [], input: text("x"), allowPrivateModelEndpoints: false, modelEndpointLookup }).turn.result;
    t.is(result.outcome, "failed");
    t.is(result.error?.code, "network_policy_denied");
    // runs-api.md's error table: network_policy_denied is not retryable.
    t.is(result.error?.retryable, false);
    t.regex(result.error?.message ?? "", /rebind\.test .*loopback address 127\.0\.0\.1/);
    t.true(lookups >= 2, "the model call resolved the name again");
    t.is(hits, 0);
  } finally {
    server.close();
    await rm(dir, { recursive: true });
  }
});

test("agent-runner - a guarded openai-compatible call that the guard allows streams its answer, and the endpoint never sees the guard's header", async (t) => {
  const dir = await workspace();
  const seen: Record<string, string | string[] | undefined>[] = [];
  const server = createServer((req, res) => {
    seen.push(req.headers);
    req.resume();
    req.on("end", () => writeChatStream(res, ["guarded ", "and streamed"]));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  try {
    const config: AgentConfig = { model: { provider: "openai-compatible", base_url: `http://models.test:${port}/v1`, model: "m" }, tools: [] };
    const result = await run({
      config,
      workspaceDir: dir,
      history: [],
      input: text("x"),
      allowPrivateModelEndpoints: false,
      // Public to the check; the guarded connection goes to the loopback server (the test's stand-in for a public one).
      modelEndpointLookup: async () => [{ address: "93.184.216.34", family: 4 }],
      modelEndpointTestHosts: new Map([["models.test", { host: "127.0.0.1", port }]]),
    }).turn.result;
    t.is(result.outcome, "completed", JSON.stringify(result.error));
    t.deepEqual(result.output, [{ type: "output_text", text: "guarded and streamed" }]);
    t.is(seen.length, 1);
    t.is(seen[0]?.["x-runs-model-egress"], undefined);
    t.is(seen[0]?.authorization, "Bearer none");
  } finally {
    server.close();
    await rm(dir, { recursive: true });
  }
});

test("agent-runner - providerFailure parses provider error messages in one place", (t) => {
  const failed = (errorMessage: string): AssistantMessage => ({
    role: "assistant",
    content: [],
    api: "openai-completions",
    provider: "openai",
    model: "m",
    usage: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0, cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } },
    stopReason: "error",
    errorMessage,
    timestamp: 0,
  });
  t.is(providerFailure(failed("429 Rate limit reached for requests")).code, "provider_rate_limited");
  t.is(providerFailure(failed("401 Incorrect API key provided")).code, "provider_authentication_failed");
  t.is(providerFailure(failed("got status: 503 Service Unavailable")).code, "provider_service_unavailable");
  t.is(providerFailure(failed('{"error":{"code":400,"message":"bad"}}')).code, "provider_request_rejected");
  t.is(providerFailure(failed("402 insufficient credits")).code, "provider_quota_exhausted");
  t.is(providerFailure(failed("Connection error.")).code, "provider_transport_failed");
  t.is(providerFailure(failed("fetch failed")).code, "provider_transport_failed");
  t.is(providerFailure(failed("Something odd")).code, "provider_failure");
  t.is(providerFailure(failed("Something odd")).message, "openai: Something odd");
  // A tenant's own endpoint is summarised: a connection that broke mid-answer is not "never reached".
  const own = (errorMessage: string) => providerFailure({ ...failed(errorMessage), provider: "openai-compatible" });
  t.deepEqual(own("other side closed"), { code: "provider_transport_failed", message: "The model endpoint could not be reached, or its answer broke off." });
  t.deepEqual(own("Something odd: secret-ish body"), { code: "provider_failure", message: "The model endpoint's answer could not be used." });
});

test("agent-runner - providerFailure reads a hostile message in linear time: 'status' and a megabyte of blanks, scripted or from an endpoint (found by an audit: seconds at 50,000)", (t) => {
  const failed = (errorMessage: string, provider = "openai"): AssistantMessage => ({
    role: "assistant", content: [], api: "openai-completions", provider, model: "m",
    usage: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0, cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } },
    stopReason: "error", errorMessage, timestamp: 0,
  });
  for (const text of [`status${" ".repeat(1 << 20)}`, `status${" ".repeat(1 << 19)}:${" ".repeat(1 << 19)}x`, "status ".repeat(1 << 17), `${"x".repeat(1 << 20)} status 503`]) {
    for (const provider of ["openai", "openai-compatible"]) {
      const started = process.hrtime.bigint();
      const failure = providerFailure(failed(text, provider));
      const ms = Number(process.hrtime.bigint() - started) / 1e6;
      t.true(ms < 500, `${ms} ms for ${JSON.stringify(text.slice(0, 12))}…`);
      t.is(failure.code, "provider_failure", "a status past the first 4 KiB is not looked for");
    }
  }
  // What the regex must still read.
  for (const [message, code] of [["status code 401", "provider_authentication_failed"], ["Status=429", "provider_rate_limited"], ["got status : 503", "provider_service_unavailable"], ["status 200 then 500", "provider_failure"]] as const) {
    t.is(providerFailure(failed(message)).code, code, message);
  }
});

test("agent-runner - sanitizeErrorText redacts secrets and caps length", (t) => {
  t.notRegex(sanitizeErrorText("key sk-proj-abcdefghijklmnopqrstuv rejected"), /abcdefghijkl/);
  t.notRegex(sanitizeErrorText("Authorization: Bearer abc.def.ghi"), /abc\.def/);
  t.notRegex(sanitizeErrorText('{"api_key": "secretvalue123"}'), /secretvalue123/);
  t.true(sanitizeErrorText("x".repeat(5000)).length <= 1001);
});

test("agent-runner - resolveModel and listModels", (t) => {
  const scriptedResolved = resolveModel("faux/scripted");
  t.true("model" in scriptedResolved && scriptedResolved.streamFn !== undefined);
  const registry = resolveModel("openai/gpt-4.1-mini");
  t.true("model" in registry && registry.model.id === "gpt-4.1-mini" && registry.streamFn === undefined);
  const slashInId = resolveModel("openrouter/anthropic/claude-sonnet-4");
  t.true("model" in slashInId && slashInId.model.provider === "openrouter");
  const unknown = resolveModel("openai/no-such-model");
  t.true("error" in unknown && unknown.error.includes("openai/no-such-model"));
  t.true("error" in resolveModel("nonsense"));
  const compatible = resolveModel({ provider: "openai-compatible", base_url: "http://localhost:11434/v1", model: "llama3" });
  t.true(
    "model" in compatible &&
      compatible.model.api === "openai-completions" &&
      compatible.model.baseUrl === "http://localhost:11434/v1" &&
      compatible.model.id === "llama3",
  );
  t.true("error" in resolveModel({ provider: "openai-compatible", base_url: "not a url", model: "m" }));

  const models = listModels();
  t.true(models.some((m) => m.id === "faux/scripted" && m.input.includes("image")));
  t.true(models.some((m) => m.id === "openai/gpt-4.1-mini" && m.provider === "openai"));
});

test("agent-runner - input files: text included, images as image content or a note, binary described", (t) => {
  const b64 = (s: string | Buffer) => Buffer.from(s).toString("base64");
  const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0, 1, 2, 3]);
  const input: InputPart[] = [
    { type: "input_text", text: "look" },
    { type: "input_file", filename: "notes.md", file_data: b64("# Notes") },
    { type: "input_file", filename: "data.bin", media_type: "application/json", file_data: b64('{"a":1}') },
    { type: "input_file", filename: "pic.png", file_data: png.toString("base64") },
    { type: "input_file", filename: "blob", media_type: "application/pdf", file_data: b64(Buffer.from([0, 1, 2])) },
    { type: "input_file", filename: 'q"uote', file_data: b64("plain utf8, no type") },
  ];
  const withImages = buildUserMessage(input, true, 0);
  const content = withImages.content as Array<{ type: string; text?: string; data?: string; mimeType?: string }>;
  t.is(content[0].text, "look");
  t.is(content[1].text, '<file name="notes.md">\n# Notes\n</file>');
  t.is(content[2].text, '<file name="data.bin">\n{"a":1}\n</file>');
  t.deepEqual(content[3], { type: "image", data: png.toString("base64"), mimeType: "image/png" });
  t.regex(content[4].text ?? "", /binary and is not included/);
  t.is(content[5].text, '<file name="q&quot;uote">\nplain utf8, no type\n</file>');

  const textOnly = buildUserMessage(input, false, 0).content as Array<{ type: string; text?: string }>;
  t.is(textOnly[3].type, "text");
  t.regex(textOnly[3].text ?? "", /does not accept images/);
});

test("agent-runner - classifyFile decides by media type, then extension, then content", (t) => {
  const utf8 = Buffer.from("hello");
  t.is(classifyFile(utf8, "text/plain; charset=utf-8", undefined).kind, "text");
  t.is(classifyFile(utf8, "application/vnd.api+json", undefined).kind, "text");
  t.is(classifyFile(utf8, "image/webp", "x.txt").kind, "image");
  t.is(classifyFile(utf8, undefined, "photo.JPG").kind, "image");
  t.is(classifyFile(utf8, "application/x-custom", "main.py").kind, "text");
  t.is(classifyFile(utf8, "application/x-custom", "x.custom").kind, "binary");
  t.is(classifyFile(Buffer.from([0xff, 0xfe, 0]), undefined, "x.unknown").kind, "binary");
});

type ModelId = { api: string; provider: string; id: string };

/** An assistant message asking for `calls`, as a provider would end it. */
function toolUse(model: ModelId, calls: AssistantMessage["content"]): AssistantMessage {
  return {
    role: "assistant",
    content: calls,
    api: model.api,
    provider: model.provider,
    model: model.id,
    usage: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0, cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } },
    stopReason: "toolUse",
    timestamp: Date.now(),
  };
}

test("agent-runner - approvals: gated calls without a unique id are refused, not waited for; nothing of them runs", async (t) => {
  const dir = await workspace();
  let calls = 0;
  const asking = (model: ModelId) =>
    toolUse(model, [
      { type: "toolCall", id: "", name: "bash", arguments: { command: "touch one" } },
      { type: "toolCall", id: "", name: "bash", arguments: { command: "touch two" } },
    ]);
  const result = await runWith(dir, (model) => {
    calls++;
    const message = calls === 1 ? asking(model) : { ...asking(model), content: [{ type: "text" as const, text: "gave up" }], stopReason: "stop" as const };
    const stream = createAssistantMessageEventStream();
    stream.push({ type: "done", reason: message.stopReason as "stop" | "toolUse", message });
    stream.end(message);
    return stream;
  }, scripted(undefined, { approval: { rules: [{ tool: "bash" }] } })).turn.result;
  t.is(result.outcome, "completed");
  t.is(result.pause, undefined);
  const results = result.transcript.filter((m) => m.role === "toolResult") as ToolResultMessage[];
  t.is(results.length, 2);
  for (const r of results) {
    t.true(r.isError);
    t.regex((r.content[0] as { text: string }).text, /no unique id/);
  }
  t.deepEqual(await readdir(dir), [], "no command ran");
  await rm(dir, { recursive: true });
});

test("agent-runner - approvals: a gated call pauses the turn before it runs; resuming with approve runs it once and asks the model only for what follows", async (t) => {
  const dir = await workspace();
  const config = scripted([bash("echo ran >> count.txt; wc -l < count.txt"), { text: "done" }], { approval: { rules: [{ tool: "bash" }] } });
  const paused = await run({ config, workspaceDir: dir, history: [], input: text("go") }).turn.result;
  t.is(paused.outcome, "paused");
  t.is(paused.pause?.tool, "bash");
  t.is(paused.pause?.assistantIndex, 1);
  t.deepEqual(paused.transcript.map((m) => m.role), ["user", "assistant"]);
  t.deepEqual(await readdir(dir), [], "nothing ran before the decision");
  const { turn, events } = run({
    config,
    workspaceDir: dir,
    history: [],
    input: text("go"),
    resume: { transcript: paused.transcript, assistantIndex: paused.pause!.assistantIndex, toolCallId: paused.pause!.toolCallId, decision: "approve", denial: "", steers: [] },
  });
  const resumed = await turn.result;
  t.is(resumed.outcome, "completed");
  t.deepEqual(resumed.output, [{ type: "output_text", text: "done" }]);
  t.deepEqual(resumed.transcript.map((m) => m.role), ["user", "assistant", "toolResult", "assistant"]);
  t.is(((resumed.transcript[2] as ToolResultMessage).content[0] as { text: string }).text.trim(), "1");
  // Nothing before the decided call is reported again.
  t.is(events.filter((e) => e.type === "message_end" && (e.data.message as { role: string }).role === "assistant").length, 1);
  t.is(events.filter((e) => e.type === "tool_execution_start").length, 0);
  t.is(events.filter((e) => e.type === "agent_start").length, 0);
  t.is(events.filter((e) => e.type === "tool_execution_end").length, 1);
  await rm(dir, { recursive: true });
});

test("agent-runner - approvals: after a resume, a later message reusing the decided call's id is gated on its own", async (t) => {
  const dir = await workspace();
  const config = scripted(undefined, { approval: { rules: [{ tool: "bash" }] } });
  const message = (model: ModelId, command: string) => toolUse(model, [{ type: "toolCall", id: "call_0", name: "bash", arguments: { command } }]);
  const answering = (command: string) => () => ({
    model: scriptedModel,
    streamFn: ((model: ModelId) => {
      const m = message(model, command);
      const stream = createAssistantMessageEventStream();
      stream.push({ type: "done", reason: "toolUse", message: m });
      stream.end(m);
      return stream;
    }) as unknown as StreamFn,
  });
  const paused = await run({ config, workspaceDir: dir, history: [], input: text("go"), resolveModel: answering("touch approved") }).turn.result;
  t.is(paused.outcome, "paused");
  // The model asks again with the same id (providers number calls per message).
  const again = await run({
    config,
    workspaceDir: dir,
    history: [],
    input: text("go"),
    resolveModel: answering("touch never_approved"),
    resume: { transcript: paused.transcript, assistantIndex: 1, toolCallId: "call_0", decision: "approve", denial: "", steers: [] },
  }).turn.result;
  t.is(again.outcome, "paused", "the second call waits for its own decision");
  t.deepEqual(again.pause?.arguments, { command: "touch never_approved" });
  t.is(again.pause?.assistantIndex, 3);
  t.deepEqual((await readdir(dir)).sort(), ["approved"], "only the approved call ran");
  await rm(dir, { recursive: true });
});

test("model-resolution - a base_url that is not a URL (stored before deployments checked it) is refused without being quoted", (t) => {
  const resolved = resolveModel({ provider: "openai-compatible", base_url: "https://user:s3cret@models example/v1", model: "m" });
  t.true("error" in resolved);
  if ("error" in resolved) {
    t.regex(resolved.error, /base_url of the openai-compatible model is not a URL/);
    t.false(resolved.error.includes("s3cret"));
  }
});

test("agent-runner - a model message asking for more tool calls than MAX_TOOL_CALLS_PER_MESSAGE ends in an error at the first one past it: its request is aborted, none of its calls runs, and the burst is not turned into events (30,000 calls held a node 11 s: model probe)", async (t) => {
  const dir = await workspace();
  let signal: AbortSignal | undefined;
  const CALLS = 30_000;
  const started = Date.now();
  const { turn, events } = runWith(dir, (model, _context, opts) => {
    signal = opts?.signal;
    const stream = createAssistantMessageEventStream();
    // As a tenant's own endpoint answers (its errors are otherwise only summarised).
    const message = toolUse({ ...model, provider: "openai-compatible" }, []);
    stream.push({ type: "start", partial: message });
    // One burst, as one network chunk of a hostile endpoint parses into.
    for (let i = 0; i < CALLS; i++) {
      message.content.push({ type: "toolCall", id: `call_${i}`, name: "bash", arguments: { command: `touch f${i}` } });
      stream.push({ type: "toolcall_start", contentIndex: i, partial: message });
      stream.push({ type: "toolcall_end", contentIndex: i, toolCall: message.content[i] as never, partial: message });
    }
    stream.push({ type: "done", reason: "toolUse", message });
    stream.end(message);
    return stream;
  });
  const result = await turn.result;
  t.is(result.outcome, "failed");
  t.is(result.error?.code, "agent_execution_failed", "named as it is, not retryable (a tenant endpoint's errors are only summarised: review)");
  t.false(result.error?.retryable);
  t.regex(result.error?.message ?? "", new RegExp(`more than ${MAX_TOOL_CALLS_PER_MESSAGE} tool calls`));
  t.true(signal?.aborted, "the model's request is aborted");
  t.deepEqual(await readdir(dir), [], "no call ran");
  t.is(events.filter((e) => e.type === "tool_execution_start").length, 0);
  t.true(events.length < 4 * MAX_TOOL_CALLS_PER_MESSAGE, `${events.length} events`);
  t.log(`${Date.now() - started} ms, ${events.length} events`);
  await rm(dir, { recursive: true });
});

test("agent-runner - a message with MAX_TOOL_CALLS_PER_MESSAGE calls is taken whole", async (t) => {
  const dir = await workspace();
  let calls = 0;
  const result = await runWith(dir, (model) => {
    calls++;
    const content = Array.from({ length: MAX_TOOL_CALLS_PER_MESSAGE }, (_, i) => ({ type: "toolCall" as const, id: `c${i}`, name: "read", arguments: { path: "none.txt" } }));
    const message = calls === 1 ? toolUse(model, content) : { ...toolUse(model, [{ type: "text" as const, text: "done" }]), stopReason: "stop" as const };
    const stream = createAssistantMessageEventStream();
    stream.push({ type: "start", partial: message });
    if (calls === 1) for (let i = 0; i < content.length; i++) stream.push({ type: "toolcall_start", contentIndex: i, partial: message });
    stream.push({ type: "done", reason: message.stopReason as "stop" | "toolUse", message });
    stream.end(message);
    return stream;
  }).turn.result;
  t.is(result.outcome, "completed", JSON.stringify(result.error));
  t.is(result.transcript.filter((m) => m.role === "toolResult").length, MAX_TOOL_CALLS_PER_MESSAGE);
  await rm(dir, { recursive: true });
});
