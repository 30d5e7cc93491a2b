import anyTest, { type TestFn } from "ava";
import { writeFile } from "node:fs/promises";
import path from "node:path";
import { Api, newWorkspace, restartFerret, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { MAX_TURN_FILE_BYTES } from "../../src/run-request.js";

/**
 * A turn's input, its files and its stored result are bounded, and no failed write of a
 * finished turn leaves its run busy (issue 12, finding 2).
 */
const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; api: Api; echo: string; dataDir: string }>;

test.before(async (t) => {
  const servers = await startTestServers();
  // Orphan checks every second: a run an actor could not settle is recovered quickly.
  const dataDir = path.join(servers.dir, "node-bounds");
  const service = await startTestService(servers, { RUNS_WAIT_TIMEOUT_MS: "30000", RUNS_LEASE_TTL_MS: "1000", RUNS_DATA_DIR: dataDir });
  const ws = await newWorkspace(service);
  const echo = await ws.api.agentWith({ model: "faux/scripted" });
  t.context = { servers, service, api: ws.api, echo, dataDir };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

const BOUNDARY = "----runs-turn-bounds-boundary";

async function upload(api: Api, filename: string, data: Buffer): Promise<string> {
  const body = Buffer.concat([
    Buffer.from(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="${filename}"\r\nContent-Type: text/plain\r\n\r\n`),
    data,
    Buffer.from(`\r\n--${BOUNDARY}--\r\n`),
  ]);
  const res = await fetch(`${api.baseUrl}/api/v1/files`, {
    method: "POST",
    headers: { authorization: `Bearer ${api.key}`, "content-type": `multipart/form-data; boundary=${BOUNDARY}`, "idempotency-key": `up-${filename}` },
    body: new Uint8Array(body),
    signal: AbortSignal.timeout(60_000),
  });
  const json = (await res.json()) as { id: string };
  if (res.status !== 201) throw new Error(`upload ${res.status}: ${JSON.stringify(json)}`);
  return json.id;
}

test("an input of 33 parts is 400 with param input; 32 are taken", async (t) => {
  const { api, echo } = t.context;
  const parts = (n: number) => Array.from({ length: n }, (_, i) => ({ type: "input_text", text: `part ${i}` }));
  const refused = await api.post("/api/v1/runs", { agent: echo, input: parts(33) });
  t.is(refused.status, 400);
  t.is(refused.body.error.param, "input");
  const taken = await api.post("/api/v1/runs", { agent: echo, input: parts(32) });
  t.is(taken.status, 200, JSON.stringify(taken.body));
});

test("inline files over 4 MiB together, or text over 4 MiB, are 413 with param input", async (t) => {
  const { api, echo } = t.context;
  const file = (name: string, bytes: number) => ({ type: "input_file", filename: name, file_data: Buffer.alloc(bytes, 97).toString("base64") });
  const files = await api.post("/api/v1/runs", { agent: echo, input: [file("a.txt", 3 * 1024 * 1024), file("b.txt", 1024 * 1024 + 1)] });
  t.is(files.status, 413, JSON.stringify(files.body).slice(0, 300));
  t.is(files.body.error.code, "payload_too_large");
  t.is(files.body.error.param, "input");
  const text = await api.post("/api/v1/runs", { agent: echo, input: "x".repeat(4 * 1024 * 1024 + 1) });
  t.is(text.status, 413);
  t.is(text.body.error.param, "input");
});

test("20 uploaded files of 1 MiB: the turn completes, files past the budget are described, the run is idle", async (t) => {
  t.timeout(120_000);
  const { api } = t.context;
  const ids: string[] = [];
  for (let i = 0; i < 20; i++) ids.push(await upload(api, `big-${i}.txt`, Buffer.alloc(1024 * 1024, 65 + (i % 26))));
  // An agent that answers briefly: echoing 6 MiB of file text would only time the model.
  const reader = await api.agentWith({ model: "faux/scripted", script: [{ text: "read them" }] });
  const res = await api.post("/api/v1/runs", { agent: reader, input: [...ids.map((file_id) => ({ type: "input_file", file_id })), { type: "input_text", text: "done?" }] });
  t.is(res.status, 200, JSON.stringify(res.body).slice(0, 500));
  t.is(res.body.turn.status, "completed");
  t.is(res.body.state, "idle");
  const turns = await (await t.context.servers.raw()).turns.find({ run_id: res.body.id }).toArray();
  const user = (turns[0]!.transcript as Array<{ role: string; content: Array<{ type: string; text?: string }> }>).find((m) => m.role === "user")!;
  const included = user.content.filter((c) => c.text?.startsWith("<file name=")).length;
  const described = user.content.filter((c) => /too large to include/.test(c.text ?? "")).length;
  t.is(included, Math.floor(MAX_TURN_FILE_BYTES / (1024 * 1024)), "files within the 6 MiB budget are included");
  t.is(included + described, 20);
});

test.serial("the store gone for seconds when a turn finishes: the turn keeps its result (completed, not failed), the run goes idle, cancel settles", async (t) => {
  t.timeout(150_000);
  const { servers, api } = t.context;
  // The command ends when the test says so (a file in the run's workspace), not after a
  // time that a loaded machine may outlast before the store is down.
  const waiter = "for i in $(seq 1 600); do [ -f release ] && exit 0; sleep 0.1; done; exit 1";
  const sleeper = await api.agentWith({ model: "faux/scripted", tools: ["bash"], script: [{ tool_call: { name: "bash", arguments: { command: waiter } } }, { text: "slept" }] });
  const started = await api.post("/api/v1/runs", { agent: sleeper, input: "go", background: true });
  t.is(started.status, 202);
  const { id: runId, turn } = started.body;
  // The store stops while the command sleeps: the finished turn cannot be stored.
  for (let i = 0; i < 100; i++) {
    const events = await api.get(`/api/v1/runs/${runId}/events`);
    if (events.body.data?.some((e: { type: string }) => e.type === "tool_execution_start")) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const port = servers.ferret.port;
  await servers.ferret.stop();
  await writeFile(path.join(t.context.dataDir, "workspaces", runId, "release"), "");
  await new Promise((resolve) => setTimeout(resolve, 6_000));
  await restartFerret(servers, port);
  const run = await api.waitRun(runId, (r) => r.state === "idle", 90_000);
  t.is(run.state, "idle");
  const final = (await api.get(`/api/v1/runs/${runId}/turns`)).body.data.find((x: { id: string }) => x.id === turn.id);
  // A store outage shorter than the finished turn's write retries (~15 s) costs the turn nothing.
  t.is(final.status, "completed", JSON.stringify(final));
  t.is(final.error, null);
  t.deepEqual(final.output, [{ type: "output_text", text: "slept" }]);
  // The turn has exactly one final event.
  const events = (await api.get(`/api/v1/runs/${runId}/events?turn_id=${turn.id}&limit=1000`)).body.data as Array<{ type: string }>;
  t.is(events.filter((e) => /^turn\.(completed|failed|cancelled|incomplete)$/.test(e.type)).length, 1, JSON.stringify(events.map((e) => e.type)));
  // Cancel of the settled turn answers at once, with the turn's final status.
  const cancel = await api.post(`/api/v1/runs/${runId}/cancel`, {});
  t.true(cancel.status < 500, JSON.stringify(cancel.body));
  const after = await api.post("/api/v1/runs", { run_id: runId, input: "still usable" });
  t.is(after.status, 200, JSON.stringify(after.body));
  t.is(after.body.turn.status, "completed");
});
