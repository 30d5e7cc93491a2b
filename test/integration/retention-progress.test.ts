import anyTest, { type TestFn } from "ava";
import { type Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { retentionRefreshMs } from "../../actors/turn-execution.js";

/** runs-api.md, "Retention rules": a run's clock restarts when it accepts input or a turn makes progress. */
const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; api: Api }>;

const RETENTION_S = 3;

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers, { RUNS_RETENTION_SOLO_S: String(RETENTION_S), RUNS_SWEEP_INTERVAL_MS: "250" });
  const ws = await newWorkspace(service, "solo");
  t.context = { servers, service, api: ws.api };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test("retention - a turn that makes progress for longer than the retention keeps its run readable (its clock restarts as the turn streams); once the turn ends the clock runs from its end", async (t) => {
  t.timeout(60_000);
  const { api, service } = t.context;
  // ~120 words at 16 tokens/s: a turn that streams for several retention periods.
  const agent = await api.agentWith({ model: "faux/scripted", tools: [], tokens_per_second: 16, script: [{ text: "still going ".repeat(60) }] });
  const started = (await api.post("/api/v1/runs", { agent, input: "stream for a while", background: true })).body;
  t.is(started.state, "busy", JSON.stringify(started));
  const begun = Date.now();
  let reads = 0;
  let lastActivity = started.last_activity_at as number;
  let endedAt = 0;
  for (; reads < 200 && Date.now() - begun < 45_000; reads++) {
    await sleep(400);
    const res = await api.get(`/api/v1/runs/${started.id}`);
    t.is(res.status, 200, `read ${Math.round((Date.now() - begun) / 100) / 10} s into the turn: ${JSON.stringify(res.body)}`);
    if (res.status !== 200) return;
    lastActivity = Math.max(lastActivity, res.body.last_activity_at);
    if (res.body.state === "idle") {
      endedAt = Date.now();
      t.is(res.body.turn.status, "completed");
      break;
    }
  }
  t.true(endedAt - begun > 2 * RETENTION_S * 1000, `the turn streamed for ${endedAt - begun} ms, past two retention periods`);
  t.true(lastActivity > started.last_activity_at, "the run's last activity moved while its turn made progress");
  t.truthy(await service.store.getRun(started.id), "the sweeper left it");
  // From the turn's end, the retention as usual: readable, then 410 and swept.
  await sleep(RETENTION_S * 1000 - 1_500);
  t.is((await api.get(`/api/v1/runs/${started.id}`)).status, 200);
  await sleep(2_500);
  t.is((await api.get(`/api/v1/runs/${started.id}`)).status, 410);
});

test("retention - a turn at work without a sign of progress (a silent command longer than the retention) keeps its run readable, listed and unswept; from its end the clock runs as usual", async (t) => {
  t.timeout(60_000);
  const { api, service } = t.context;
  const agent = await api.agentWith({ model: "faux/scripted", tools: ["bash"], script: [{ tool_call: { name: "bash", arguments: { command: "sleep 7" } } }, { text: "slept" }] });
  const started = (await api.post("/api/v1/runs", { agent, input: "sleep", background: true, tags: ["silent"] })).body;
  t.is(started.state, "busy", JSON.stringify(started));
  await sleep((RETENTION_S + 2) * 1000);
  const during = await api.get(`/api/v1/runs/${started.id}`);
  t.is(during.status, 200, JSON.stringify(during.body));
  t.is(during.body.state, "busy");
  t.true((await service.store.getRun(started.id))!.expires_at < Date.now(), "its clock ran out while the command said nothing");
  t.deepEqual((await api.get("/api/v1/runs?tag=silent")).body.data.map((run: { id: string }) => run.id), [started.id]);
  const ended = await api.waitRun(started.id, (run) => run.state === "idle", 30_000);
  t.is(ended.turn.status, "completed");
  t.is((await api.get(`/api/v1/runs/${started.id}`)).status, 200);
  await sleep(RETENTION_S * 1000 + 1_000);
  t.is((await api.get(`/api/v1/runs/${started.id}`)).status, 410);
});

test("retention - the progress refresh is a hundredth of the retention, between 1 s and 10 min", (t) => {
  t.is(retentionRefreshMs(3), 1_000);
  t.is(retentionRefreshMs(3_600), 36_000);
  t.is(retentionRefreshMs(7 * 86_400), 600_000);
  t.is(retentionRefreshMs(30 * 86_400), 600_000);
});
