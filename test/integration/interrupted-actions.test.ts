import test from "ava";
import { Api, newWorkspace, startTestServers, startTestService } from "../helpers/servers.js";

/** The run's events of `type` (first page), polled until there are some; bounded. */
async function untilEvent(api: Api, runId: string, type: string, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const events = (await api.get(`/api/v1/runs/${runId}/events?limit=1000`)).body.data as Array<{ type: string }>;
    if (events.some((event) => event.type === type)) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`no ${type} event in ${runId} within ${timeoutMs} ms`);
}

/**
 * A turn a node stops before it ends says whether a tool call was running: such a call may
 * have done what it does (sent a request, changed a file), so the turn is not retryable
 * (runs-api.md: worker_action_interrupted, "check its result first"); a turn stopped in a
 * model call is (worker_execution_interrupted). Real service, store, event log and sandbox;
 * the drain's end (RUNS_DRAIN_MS) interrupts both.
 */
test("interrupted actions - a node that stops while a turn's bash call runs ends it worker_action_interrupted (not retryable); a turn stopped while its model answers ends worker_execution_interrupted (retryable)", async (t) => {
  t.timeout(120_000);
  const servers = await startTestServers();
  t.teardown(() => servers.stop());
  const env = { RUNS_WAIT_TIMEOUT_MS: "20000", RUNS_DRAIN_MS: "300" };
  const first = await startTestService(servers, env);
  const ws = await newWorkspace(first);
  const acting = await ws.api.agentWith({ model: "faux/scripted", tools: ["bash"], script: [{ tool_call: { name: "bash", arguments: { command: "echo acting; sleep 30" } } }, { text: "never" }] });
  const thinking = await ws.api.agentWith({ model: "faux/scripted", tokens_per_second: 2, script: [{ text: "a slow answer ".repeat(40) }] });
  const inCall = (await ws.api.post("/api/v1/runs", { agent: acting, input: "act", background: true })).body;
  const inModel = (await ws.api.post("/api/v1/runs", { agent: thinking, input: "think", background: true })).body;
  await untilEvent(ws.api, inCall.id, "tool_execution_start");
  await untilEvent(ws.api, inModel.id, "text_delta");
  await first.close();

  const second = await startTestService(servers, env);
  t.teardown(() => second.close());
  const api = new Api(second.url!, ws.key);
  const acted = await api.waitTurn(inCall.id, inCall.turn.id, 30_000);
  t.is(acted.turn.status, "incomplete");
  t.is(acted.turn.error?.code, "worker_action_interrupted");
  t.false(acted.turn.error?.retryable);
  const thought = await api.waitTurn(inModel.id, inModel.turn.id, 30_000);
  t.is(thought.turn.status, "incomplete");
  t.is(thought.turn.error?.code, "worker_execution_interrupted");
  t.true(thought.turn.error?.retryable);
  // Both runs go on.
  for (const run of [inCall, inModel]) {
    const next = await api.post("/api/v1/runs", { run_id: run.id, input: "again", background: true });
    t.is(next.status, 202, JSON.stringify(next.body));
  }
});
