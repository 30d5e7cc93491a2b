import anyTest, { type TestFn } from "ava";
import { existsSync } from "node:fs";
import { rm } from "node:fs/promises";
import path from "node:path";
import { bashThen, gatedBashConfig } from "../helpers/agent-configs.js";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";

/**
 * A turn whose deployment has no tools is given no workspace: no directory is made or
 * restored for it and nothing is saved after it, on a real service, store and sandbox.
 * What a run's earlier turns left in its workspace is still there for its later turns
 * with tools, also when the workspace had to come back from its checkpoint, and also when
 * what they left was written after a wait for an approval.
 */
const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; api: Api; dataDir: string }>;

test.before(async (t) => {
  const servers = await startTestServers();
  const dataDir = path.join(servers.dir, "toolless-node");
  const service = await startTestService(servers, { RUNS_DATA_DIR: dataDir, RUNS_WAIT_TIMEOUT_MS: "20000" });
  const ws = await newWorkspace(service);
  t.context = { servers, service, api: ws.api, dataDir };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

const workspaceOf = (dataDir: string, runId: string) => path.join(dataDir, "workspaces", runId);

async function events(api: Api, runId: string): Promise<any[]> {
  const res = await api.get(`/api/v1/runs/${runId}/events?limit=1000`);
  return res.body.data;
}

test("toolless - a run of an agent without tools completes with no workspace directory", async (t) => {
  const { api, dataDir } = t.context;
  const agent = await api.agentWith({ model: "faux/scripted", tools: [], script: [{ text: "plain" }] });
  const res = await api.post("/api/v1/runs", { agent, input: "hi" });
  t.is(res.status, 200, JSON.stringify(res.body));
  t.is(res.body.turn.status, "completed");
  t.deepEqual(res.body.turn.output, [{ type: "output_text", text: "plain" }]);
  t.false(existsSync(workspaceOf(dataDir, res.body.id)), "no directory was made for it");
});

test("toolless - files written by a turn with tools survive a later turn without tools, also when the workspace comes back from its checkpoint", async (t) => {
  const { api, dataDir } = t.context;
  // Version 1 writes a file; each later version is activated, and the run (automatic upgrades) follows it.
  const agent = await api.agentWith({ model: "faux/scripted", tools: ["bash"], script: bashThen("echo kept > note.txt", "wrote") });
  const first = await api.post("/api/v1/runs", { agent, input: "write" });
  t.is(first.body.turn?.status, "completed", JSON.stringify(first.body));
  const runId = first.body.id as string;
  const dir = workspaceOf(dataDir, runId);
  t.true(existsSync(path.join(dir, "note.txt")));

  // As if the run had moved to a node that never held its workspace.
  await rm(dir, { recursive: true, force: true });
  const toolless = await api.deploy(agent, { model: "faux/scripted", tools: [], script: [{ text: "no tools" }] });
  await api.waitDeployment(agent, toolless.version);
  const second = await api.post("/api/v1/runs", { run_id: runId, input: "talk" });
  t.is(second.status, 200, JSON.stringify(second.body));
  t.is(second.body.turn.status, "completed");
  t.is(second.body.turn.agent_version, toolless.version);
  t.false(existsSync(dir), "the turn without tools neither restored nor made the workspace");

  const reader = await api.deploy(agent, { model: "faux/scripted", tools: ["bash"], script: bashThen("cat note.txt", "read") });
  await api.waitDeployment(agent, reader.version);
  const third = await api.post("/api/v1/runs", { run_id: runId, input: "read" });
  t.is(third.body.turn?.status, "completed", JSON.stringify(third.body));
  t.is(third.body.turn.agent_version, reader.version);
  const ends = (await events(api, runId)).filter((e) => e.type === "tool_execution_end");
  t.is(ends.length, 2, "one call in the first turn, one in the third");
  t.false(ends[1].data.isError);
  t.is(ends[1].data.result.content[0].text.trim(), "kept", "the file came back from the checkpoint the turn without tools left alone");
});

test("toolless - a file written by an approved call is kept for later turns, across a turn without tools and a workspace restored from its checkpoint", async (t) => {
  const { api, dataDir } = t.context;
  // Version 1 asks before its echo runs; the workspace is saved when the turn starts to wait.
  const agent = await api.agentWith(gatedBashConfig(bashThen("echo approved > note.txt", "wrote")));
  const started = await api.post("/api/v1/runs", { agent, input: "write", background: true });
  t.is(started.status, 202, JSON.stringify(started.body));
  const runId = started.body.id as string;
  const waiting = await api.waitRun(runId, (r) => r.turn?.pending_action != null || ["completed", "failed"].includes(r.turn?.status), 30_000);
  t.truthy(waiting.turn.pending_action, JSON.stringify(waiting.turn));
  const decided = await api.post(`/api/v1/runs/${runId}/actions/${waiting.turn.pending_action.id}`, { decision: "approve" });
  t.is(decided.status, 200, JSON.stringify(decided.body));
  const done = await api.waitRun(runId, (r) => r.state === "idle", 30_000);
  t.is(done.turn.status, "completed", JSON.stringify(done.turn));
  const dir = workspaceOf(dataDir, runId);
  t.true(existsSync(path.join(dir, "note.txt")), "the approved call wrote its file");

  const toolless = await api.deploy(agent, { model: "faux/scripted", tools: [], script: [{ text: "no tools" }] });
  await api.waitDeployment(agent, toolless.version);
  const second = await api.post("/api/v1/runs", { run_id: runId, input: "talk" });
  t.is(second.body.turn?.status, "completed", JSON.stringify(second.body));
  // As if the run had moved to a node that never held its workspace: only the checkpoint has it.
  await rm(dir, { recursive: true, force: true });

  const reader = await api.deploy(agent, { model: "faux/scripted", tools: ["bash"], script: bashThen("cat note.txt", "read") });
  await api.waitDeployment(agent, reader.version);
  const third = await api.post("/api/v1/runs", { run_id: runId, input: "read" });
  t.is(third.body.turn?.status, "completed", JSON.stringify(third.body));
  const ends = (await events(api, runId)).filter((e) => e.type === "tool_execution_end");
  t.is(ends.length, 2, "the approved call, then the read");
  t.false(ends[1].data.isError, JSON.stringify(ends[1].data));
  t.is(ends[1].data.result.content[0].text.trim(), "approved", "the checkpoint holds what the approved call wrote");
});
