import test from "ava";
import { GatewayMetrics } from "../../gateway/metrics.js";

/** The usage counters of /metrics: tokens by kind, cost only for priced turns. */
test("metrics - usage counts tokens by workspace, model and kind, and cost in dollars", async (t) => {
  const metrics = new GatewayMetrics({ sseStreams: () => 0, natsConnected: () => true, storeReachable: async () => true });
  const record = { _id: "turn_1", workspace_id: "ws_a", run_id: "run_1", agent_id: "agt_1", agent_version: 1, model: "openai/gpt-x", at: 0, input_tokens: 100, output_tokens: 20, cache_read_tokens: 5, cache_write_tokens: 0, cost_usd: 0.25 };
  metrics.countUsage(record);
  metrics.countUsage({ ...record, _id: "turn_2", cost_usd: 0.5, input_tokens: 1 });
  metrics.countUsage({ ...record, _id: "turn_3", model: "faux/scripted", cost_usd: null });
  const text = await metrics.text();
  t.regex(text, /^runs_tokens_total\{workspace="ws_a",model="openai\/gpt-x",kind="input"\} 101$/m);
  t.regex(text, /^runs_tokens_total\{workspace="ws_a",model="openai\/gpt-x",kind="output"\} 40$/m);
  t.regex(text, /^runs_tokens_total\{workspace="ws_a",model="openai\/gpt-x",kind="cache_read"\} 10$/m);
  t.notRegex(text, /kind="cache_write"/, "a kind never used is not a series");
  t.regex(text, /^runs_cost_usd_total\{workspace="ws_a",model="openai\/gpt-x"\} 0\.75$/m);
  t.notRegex(text, /runs_cost_usd_total\{workspace="ws_a",model="faux\/scripted"\}/);
});

test("metrics - without the operator's token (RUNS_METRICS_TOKEN) the series that name workspaces are neither kept nor shown", async (t) => {
  const sources = { sseStreams: () => 0, natsConnected: () => true, storeReachable: async () => true };
  const record = { _id: "turn_1", workspace_id: "ws_secret", run_id: "run_1", agent_id: "agt_1", agent_version: 1, model: "openai/gpt-x", at: 0, input_tokens: 100, output_tokens: 20, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: 0.25 };
  const open = new GatewayMetrics(sources, false);
  open.countUsage(record);
  const text = await open.text();
  t.regex(text, /^runs_sse_streams 0$/m, "the node's own series are there");
  t.false(text.includes("ws_secret"));
  t.notRegex(text, /runs_tokens_total|runs_cost_usd_total/);
  const kept = new GatewayMetrics(sources, true);
  kept.countUsage(record);
  t.regex(await kept.text(), /^runs_tokens_total\{workspace="ws_secret",model="openai\/gpt-x",kind="input"\} 100$/m);
});

test("metrics - the turn gauges read the node's actors once per scrape", async (t) => {
  let walks = 0;
  const metrics = new GatewayMetrics({ sseStreams: () => 0, natsConnected: () => true, storeReachable: async () => true, turns: () => (walks++, { active: 2, queued: 1, recovering: 3, recoveriesWaiting: 4 }) }, false);
  const text = await metrics.text();
  t.regex(text, /^runs_active_turns 2$/m);
  t.regex(text, /^runs_recoveries_waiting 4$/m);
  t.is(walks, 1);
});

test("metrics - a tenant's own endpoint's models are one label (openai-compatible), however many ids it names", async (t) => {
  const metrics = new GatewayMetrics({ sseStreams: () => 0, natsConnected: () => true, storeReachable: async () => true }, true);
  for (let i = 0; i < 50; i++) {
    metrics.countUsage({ _id: `turn_${i}`, workspace_id: "ws_a", run_id: "run_1", agent_id: "agt_1", agent_version: 1, model: `openai-compatible/model-${i}`, at: 0, input_tokens: 1, output_tokens: 0, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: null });
  }
  const text = await metrics.text();
  t.regex(text, /^runs_tokens_total\{workspace="ws_a",model="openai-compatible",kind="input"\} 50$/m);
  t.notRegex(text, /model-\d/);
});
