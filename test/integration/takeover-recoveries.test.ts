import test from "ava";
import { collectedLogs, newWorkspace, startTestServers, startTestService, testConfig } from "../helpers/servers.js";
import { startService } from "../../node/service.js";
import { Ids, partitionOf } from "../../src/index.js";
import { sample } from "../helpers/metrics.js";


const BUSY_RUNS = 600;

test("takeover - a node gaining partitions with 600 busy runs recovers every one, 32 at a time (runs_recovering_runs, runs_recoveries_waiting), and its orphan check leaves the waiting ones to the queue", async (t) => {
  t.timeout(240_000);
  const servers = await startTestServers();
  t.teardown(() => servers.stop());
  const first = await startTestService(servers);
  const ws = await newWorkspace(first);
  const agent = await ws.api.agentWith({ model: "faux/scripted" });
  const known = (await ws.api.post("/api/v1/runs", { agent, input: "template" })).body;
  t.is(known.state, "idle", JSON.stringify(known));
  // The first node stops (its partitions released), and runs are left busy at its epoch, as
  // a node that failed mid-turn leaves them.
  await first.close();
  const raw = (await servers.raw()).db;
  const template = (await raw.collection("runs").findOne({ _id: known.id } as any))!;
  const now = Date.now();
  const runs: any[] = [];
  const turns: any[] = [];
  for (let i = 0; i < BUSY_RUNS; i++) {
    const runId = Ids.run();
    const turnId = Ids.turn();
    turns.push({
      _id: turnId, run_id: runId, workspace_id: template.workspace_id, index: 0, status: "in_progress", agent_version: template.agent_version,
      input: [{ type: "input_text", text: "left busy" }], output: [], error: null, created_at: now, started_at: now, completed_at: null, duration_ms: null,
      transcript: [], disposition: "created", steer_ids: [], first_event_seq: 0, epoch: template.epoch,
    });
    runs.push({
      ...template, _id: runId, partition: partitionOf(runId, 8), state: "busy", created_at: now, last_activity_at: now,
      turn_count: 1, latest_turn_id: turnId, active_turn_id: turnId, queued_turn_id: null, event_seq: 0, tags: [],
    });
  }
  await raw.collection("turns").insertMany(turns);
  await raw.collection("runs").insertMany(runs);

  const { logs, log } = collectedLogs();
  const began = Date.now();
  const second = await startService(testConfig(servers), { log });
  t.teardown(() => second.close());
  let maxRecovering = 0;
  let sawWaiting = false;
  let scrapes = 0;
  const deadline = Date.now() + 180_000;
  for (; scrapes < 100_000 && Date.now() < deadline; scrapes++) {
    const text = (await second.app!.inject({ method: "GET", url: "/metrics" })).body;
    const recovering = sample(text, "runs_recovering_runs");
    const waiting = sample(text, "runs_recoveries_waiting");
    if (recovering === undefined || waiting === undefined) throw new Error(`no recovery gauges in /metrics:\n${text}`);
    maxRecovering = Math.max(maxRecovering, recovering);
    if (waiting > 0) sawWaiting = true;
    if (recovering + waiting === 0) break;
  }
  t.log(`${BUSY_RUNS} runs recovered within ${Date.now() - began} ms of the node's start; ${scrapes} scrapes, at most ${maxRecovering} at once`);
  t.true(maxRecovering <= 32, `at most 32 recoveries at once; seen ${maxRecovering}`);
  t.true(maxRecovering > 0 && sawWaiting, `the node was seen recovering (${maxRecovering}) with more waiting (${sawWaiting}) in ${scrapes} scrapes`);

  const ids = runs.map((run) => run._id);
  const busyLeft = await raw.collection("runs").countDocuments({ _id: { $in: ids }, state: "busy" } as any);
  t.is(busyLeft, 0, "every run recovered");
  const interrupted = await raw.collection("turns").countDocuments({ _id: { $in: turns.map((turn) => turn._id) }, status: "incomplete" } as any);
  t.is(interrupted, BUSY_RUNS, "every lost turn ended incomplete");
  const last = await second.app!.inject({ method: "GET", url: `/api/v1/runs/${ids[BUSY_RUNS - 1]}`, headers: { authorization: `Bearer ${ws.key}` } });
  t.is(last.json().turn.error?.code, "worker_execution_interrupted", last.body);
  t.is(logs.filter((line) => /stale owner left busy/.test(String(line.msg))).length, 0, "the orphan check took none of the runs that waited their turn");
});
