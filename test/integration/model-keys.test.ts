/**
 * A model may put any key and any nesting in a tool call's arguments. The store cannot
 * hold keys starting with `$`, holding `.` or a NUL, or documents nested past 100 levels;
 * such values are kept as JSON in the turn's document (src/stored-json.ts) and come back
 * as the model sent them.
 */
import anyTest, { type ExecutionContext, type TestFn } from "ava";
import { createServer, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { writeChatStream } from "../helpers/chat-stream.js";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";

type Answer = (res: ServerResponse) => void;
/** `live.service` is replaced by the first test (a restart): tests get a copy of the context, not the holder. */
type Ctx = { servers: TestServers; live: { service: RunningService }; provider: Server; baseUrl: string; answers: Answer[]; bodies: any[] };
const test = anyTest as TestFn<Ctx>;

/** `levels` objects, one inside the other. */
const nested = (levels: number): unknown => {
  let v: unknown = "bottom";
  for (let i = 0; i < levels; i++) v = { in: v };
  return v;
};

/**
 * Arguments no store takes as they are: every kind of key, at the top and further down,
 * arrays in arrays, 120 levels of nesting, and (sent as `1e999`, below) an infinite number.
 */
const HOSTILE_ARGS = {
  "src/main.py": "print(1)",
  "a.b": 1,
  $where: "sleep(1000)",
  "n\u0000k": true,
  files: { "README.md": "# hi", $ref: ["$x", { "x.y": null }] },
  rows: [[1, 2], [3]],
  _runs_json: "not a wrapper",
  deep: nested(120),
  big: "INFINITE",
};
/** What the model's arguments are once parsed (`1e999` is Infinity) and written as JSON again. */
const HOSTILE_ARGS_AS_JSON = { ...HOSTILE_ARGS, big: null };

function toolCall(name: string, args: unknown): Answer {
  return (res) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    const chunk = (body: Record<string, unknown>) => `data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", created: 0, model: "m", ...body })}\n\n`;
    const call = { index: 0, id: "call_1", type: "function", function: { name, arguments: JSON.stringify(args).replace('"INFINITE"', "1e999") } };
    res.write(chunk({ choices: [{ index: 0, delta: { role: "assistant", tool_calls: [call] }, finish_reason: null }] }));
    res.write(chunk({ choices: [{ index: 0, delta: {}, finish_reason: "tool_calls" }] }));
    res.end("data: [DONE]\n\n");
  };
}
const text = (words: string): Answer => (res) => writeChatStream(res, [words]);

test.before(async (t) => {
  const servers = await startTestServers();
  // The provider listens on loopback, which operators must allow explicitly.
  const service = await startTestService(servers, { RUNS_ALLOW_PRIVATE_MODEL_ENDPOINTS: "1", RUNS_WAIT_TIMEOUT_MS: "20000" });
  const answers: Answer[] = [];
  const bodies: any[] = [];
  const provider = createServer((req, res) => {
    let raw = "";
    req.on("data", (c: Buffer) => (raw += c.toString("utf8")));
    req.on("end", () => {
      bodies.push(JSON.parse(raw));
      const answer = answers.shift();
      if (answer) return answer(res);
      res.writeHead(500).end();
    });
  });
  await new Promise<void>((resolve) => provider.listen(0, "127.0.0.1", resolve));
  const baseUrl = `http://127.0.0.1:${(provider.address() as AddressInfo).port}/v1`;
  t.context = { servers, live: { service }, provider, baseUrl, answers, bodies };
});

test.after.always(async (t) => {
  t.context.provider?.close();
  await t.context.live?.service.close();
  await t.context.servers?.stop();
});

/** The arguments of the tool calls the model was sent back in its history, parsed. */
function historyArguments(body: any): unknown[] {
  return body.messages.flatMap((m: any) => (m.tool_calls ?? []).map((c: any) => JSON.parse(c.function.arguments)));
}

test.serial("model keys - a tool call whose arguments hold $-prefixed, dotted and NUL keys, arrays in arrays, 120 levels and 1e999 completes its turn; a new service loads the session from the store and sends them back unchanged", async (t) => {
  const { servers, baseUrl, answers, bodies } = t.context;
  const ws = await newWorkspace(t.context.live.service);
  const agent = await ws.api.agentWith({ model: { provider: "openai-compatible", base_url: baseUrl, model: "m" }, tools: [] });
  answers.push(toolCall("lookup", HOSTILE_ARGS), text("done"));
  const run = await ws.api.post("/api/v1/runs", { agent, input: "hi" });
  t.is(run.status, 200);
  t.is(run.body.turn.status, "completed", JSON.stringify(run.body.turn.error));
  t.deepEqual(run.body.turn.output, [{ type: "output_text", text: "done" }]);
  t.deepEqual(historyArguments(bodies.at(-1)), [HOSTILE_ARGS_AS_JSON], "the turn's second call carried the arguments");

  // Stored as JSON in a wrapper, the rest of the transcript as it was.
  const raw = await servers.raw();
  const doc = await raw.db.collection("turns").findOne({ _id: run.body.turn.id as any });
  const wrapped = (doc!.transcript as any[]).filter((m) => typeof m._runs_json === "string");
  t.is(wrapped.length, 1, "only the message holding the call is wrapped");
  t.deepEqual(JSON.parse(wrapped[0]._runs_json).content.find((c: any) => c.type === "toolCall").arguments, HOSTILE_ARGS_AS_JSON);
  t.true((doc!.transcript as any[]).some((m) => m.role === "user"), "other messages are stored as they are");

  // A new service has no session in memory: it reads the transcript from the store.
  const { live } = t.context;
  await live.service.close();
  live.service = await startTestService(servers, { RUNS_ALLOW_PRIVATE_MODEL_ENDPOINTS: "1", RUNS_WAIT_TIMEOUT_MS: "20000" });
  const api = new Api(live.service.url!, ws.key);
  answers.push(text("again"));
  const next = await api.post("/api/v1/runs", { run_id: run.body.id, input: "and again" });
  t.is(next.status, 200, JSON.stringify(next.body));
  t.is(next.body.turn.status, "completed", JSON.stringify(next.body.turn.error));
  t.deepEqual(historyArguments(bodies.at(-1)), [HOSTILE_ARGS_AS_JSON]);
  const turns = await api.get(`/api/v1/runs/${run.body.id}/turns`);
  t.deepEqual(turns.body.data.map((x: any) => x.status), ["completed", "completed"]);
});

/** A gated call with `args`: its pending action shows them as sent, before and after a restart; denied, the turn resumes from the stored transcript. */
async function gatedCallAcrossRestart(t: ExecutionContext<Ctx>, args: Record<string, unknown>): Promise<void> {
  const { servers, baseUrl, answers, bodies, live } = t.context;
  const ws = await newWorkspace(live.service);
  const agent = await ws.api.agentWith({ model: { provider: "openai-compatible", base_url: baseUrl, model: "m" }, tools: ["bash"], approval: { rules: [{ tool: "bash" }] } });
  answers.push(toolCall("bash", args), text("denied"));
  const res = await ws.api.post("/api/v1/runs", { agent, input: "go", background: true });
  t.is(res.status, 202);
  const waiting = await ws.api.waitRun(res.body.id, (r) => r.turn?.pending_action != null || r.turn?.status !== "in_progress", 30_000);
  t.is(waiting.turn.status, "in_progress", JSON.stringify(waiting.turn));
  t.deepEqual(waiting.turn.pending_action.arguments, args);
  // The new service has only the store: the waiting turn's transcript and action come from there.
  await live.service.close();
  live.service = await startTestService(servers, { RUNS_ALLOW_PRIVATE_MODEL_ENDPOINTS: "1", RUNS_WAIT_TIMEOUT_MS: "20000" });
  ws.api = new Api(live.service.url!, ws.key);
  const restored = await ws.api.waitRun(res.body.id, (r) => r.turn?.pending_action != null, 30_000);
  t.deepEqual(restored.turn.pending_action.arguments, args);
  const decided = await ws.api.post(`/api/v1/runs/${res.body.id}/actions/${waiting.turn.pending_action.id}`, { decision: "deny" });
  t.is(decided.status, 200, JSON.stringify(decided.body));
  const done = await ws.api.waitTurn(res.body.id, waiting.turn.id, 30_000);
  t.is(done.turn.status, "completed", JSON.stringify(done.turn.error));
  t.deepEqual(done.turn.output, [{ type: "output_text", text: "denied" }]);
  t.deepEqual(historyArguments(bodies.at(-1)), [args], "the resumed call's history holds the arguments as sent");
}

test.serial("model keys - a gated call's arguments with keys the store cannot hold are shown on its pending action as the model sent them; after a restart, denying it resumes the turn from the stored transcript", (t) =>
  gatedCallAcrossRestart(t, { command: "echo hi", "a.b": 1, $where: { "x.y": [1] }, grid: [[0]] }));

// The store keeps these as they are; the driver read arrays under such keys back as raw BSON
// buffers (it looked their names up in an object with a prototype: src/mongo-store.ts).
test.serial("model keys - a gated call's arrays under keys named as Object.prototype's members (constructor, toString, valueOf, hasOwnProperty, __proto__) come back as sent after a restart", (t) =>
  gatedCallAcrossRestart(t, JSON.parse('{"command":"echo hi","constructor":[{"_runs_json":[]}],"toString":[{"a":1}],"valueOf":[{"b":[2]}],"hasOwnProperty":["x"],"__proto__":[{"c":3}]}')));

test.serial("model keys - abuse: a tool call nested 100,000 levels deep (past what JSON.stringify can write) ends its turn final without taking the node down; the run's next turn completes", async (t) => {
  const { baseUrl, answers, live } = t.context;
  const ws = await newWorkspace(live.service);
  const agent = await ws.api.agentWith({ model: { provider: "openai-compatible", base_url: baseUrl, model: "m" }, tools: [] });
  const depth = 100_000;
  answers.push((res) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    const chunk = (body: Record<string, unknown>) => `data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", created: 0, model: "m", ...body })}\n\n`;
    const args = `{"deep":${"[".repeat(depth)}1${"]".repeat(depth)}}`;
    res.write(chunk({ choices: [{ index: 0, delta: { role: "assistant", tool_calls: [{ index: 0, id: "call_1", type: "function", function: { name: "lookup", arguments: args } }] }, finish_reason: null }] }));
    res.write(chunk({ choices: [{ index: 0, delta: {}, finish_reason: "tool_calls" }] }));
    res.end("data: [DONE]\n\n");
  });
  const run = await ws.api.post("/api/v1/runs", { agent, input: "hi" });
  t.is(run.status, 200, JSON.stringify(run.body).slice(0, 300));
  t.log(`the deep turn: ${run.body.turn.status} ${JSON.stringify(run.body.turn.error)}`);
  t.true(["completed", "failed"].includes(run.body.turn.status), run.body.turn.status);
  t.is(run.body.state, "idle");
  const events = await ws.api.get(`/api/v1/runs/${run.body.id}/events?limit=1000`);
  t.is(events.status, 200);
  t.is(events.body.data.at(-1).type, `turn.${run.body.turn.status}`, "the turn's end is in the event log");
  const sequences = (events.body.data as Array<{ sequence: number }>).map((e) => e.sequence);
  t.deepEqual(sequences, Array.from({ length: sequences.length }, (_, i) => i + 1), "no event was skipped (a gap holds readers)");
  // What JSON cannot hold at that depth is stored as a marker, the same on every Node version.
  const deep = (events.body.data as Array<{ type: string; data: unknown }>).filter((e) => e.type === "message_end" || e.type === "turn_end");
  t.true(deep.some((e) => JSON.stringify(e.data) === '{"omitted":"unserializable"}'), JSON.stringify(deep.map((e) => e.type)));
  answers.length = 0; // whatever the turn left unasked
  answers.push(text("still here"));
  const next = await ws.api.post("/api/v1/runs", { run_id: run.body.id, input: "again" });
  t.is(next.status, 200, JSON.stringify(next.body).slice(0, 300));
  t.is(next.body.turn.status, "completed", JSON.stringify(next.body.turn.error));
  t.deepEqual(next.body.turn.output, [{ type: "output_text", text: "still here" }]);
});
