import test from "ava";
import { addUsage, budgetSpent, hasPrices, hasUsage, modelLabel, monthStart, nextMonthStart, NO_USAGE, totalTokens, turnUsage, USAGE_GROUPS, type UsageGroup, type UsageRecordDoc, UsageTally, utcDay } from "../../src/usage.js";

const call = (input: number, output: number, cacheRead = 0, cacheWrite = 0, cost = 0) => ({ role: "assistant", usage: { input, output, cacheRead, cacheWrite, cost: { total: cost } } });

test("usage - a turn sums its assistant messages only; cost only for a priced model", (t) => {
  const messages = [{ role: "user" }, call(100, 20, 50, 0, 0.0012), { role: "toolResult" }, call(130, 10, 0, 5, 0.0008), { role: "user", usage: { input: 999, output: 999, cacheRead: 0, cacheWrite: 0 } }];
  t.deepEqual(turnUsage(messages, true), { input_tokens: 230, output_tokens: 30, cache_read_tokens: 50, cache_write_tokens: 5, cost_usd: 0.002 });
  t.deepEqual(turnUsage(messages, false), { input_tokens: 230, output_tokens: 30, cache_read_tokens: 50, cache_write_tokens: 5, cost_usd: null });
  t.deepEqual(turnUsage([], true), { ...NO_USAGE, cost_usd: 0 });
  t.deepEqual(turnUsage([{ role: "assistant" }], false), NO_USAGE, "a message without usage counts nothing");
});

test("usage - nonsense counts from a provider count as nothing", (t) => {
  const odd = [{ role: "assistant", usage: { input: -5, output: Number.NaN, cacheRead: Number.POSITIVE_INFINITY, cacheWrite: 2.7, cost: { total: -1 } } }];
  t.deepEqual(turnUsage(odd, true), { input_tokens: 0, output_tokens: 0, cache_read_tokens: 0, cache_write_tokens: 2, cost_usd: 0 });
});

test("usage - a run's sum: tokens add; the cost is known once any turn's is", (t) => {
  const a = { input_tokens: 1, output_tokens: 2, cache_read_tokens: 3, cache_write_tokens: 4, cost_usd: null };
  const b = { input_tokens: 10, output_tokens: 20, cache_read_tokens: 30, cache_write_tokens: 40, cost_usd: 0.1 };
  const c = { ...b, cost_usd: 0.2 };
  t.deepEqual(addUsage(a, a), { input_tokens: 2, output_tokens: 4, cache_read_tokens: 6, cache_write_tokens: 8, cost_usd: null });
  t.is(addUsage(a, b).cost_usd, 0.1);
  t.is(addUsage(b, a).cost_usd, 0.1);
  t.is(addUsage(b, c).cost_usd, 0.3, "no float dust: 0.1 + 0.2 is 0.3");
  t.deepEqual(addUsage(NO_USAGE, b), b);
});

test("usage - a model has prices when any of its four is above zero", (t) => {
  t.false(hasPrices(undefined));
  t.false(hasPrices({ input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }));
  for (const field of ["input", "output", "cacheRead", "cacheWrite"] as const) t.true(hasPrices({ input: 0, output: 0, cacheRead: 0, cacheWrite: 0, [field]: 0.5 }), field);
});

const rec = (over: Partial<UsageRecordDoc>): UsageRecordDoc => ({
  _id: "turn_x", workspace_id: "ws", run_id: "run_x", agent_id: "agt_a", agent_version: 1, model: "m", at: Date.UTC(2026, 10, 25, 12),
  input_tokens: 1, output_tokens: 1, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: null, ...over,
});

test("usage - a tally buckets by each group; days ascending, others by cost then tokens, unpriced last", (t) => {
  const records = [
    rec({ _id: "1", at: Date.UTC(2026, 10, 26, 0, 0, 0), agent_id: "agt_b", model: "cheap", cost_usd: 0.1 }),
    rec({ _id: "2", at: Date.UTC(2026, 10, 25, 23, 59, 59), agent_version: 2, model: "dear", cost_usd: 2, input_tokens: 5 }),
    rec({ _id: "3", at: Date.UTC(2026, 10, 25, 0, 0, 0), model: "free", input_tokens: 100 }),
  ];
  const tally = (group: UsageGroup) => {
    const tl = new UsageTally(group);
    for (const r of records) tl.add(r);
    return tl;
  };
  t.deepEqual(tally("day").data.map((b) => [b.day, b.turns, b.input_tokens]), [["2026-11-25", 2, 105], ["2026-11-26", 1, 1]]);
  t.deepEqual(tally("model").data.map((b) => [b.model, b.cost_usd]), [["dear", 2], ["cheap", 0.1], ["free", null]]);
  t.deepEqual(tally("agent").data.map((b) => [b.agent_id, b.turns, b.cost_usd]), [["agt_a", 2, 2], ["agt_b", 1, 0.1]]);
  t.deepEqual(tally("version").data.map((b) => [b.agent_id, b.agent_version]), [["agt_a", 2], ["agt_b", 1], ["agt_a", 1]]);
  t.deepEqual(tally("day").total, { input_tokens: 106, output_tokens: 3, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: 2.1, turns: 3 });
  t.deepEqual(new UsageTally("day").total, { ...NO_USAGE, turns: 0 });
  // Every group names exactly its key fields.
  for (const group of USAGE_GROUPS) {
    const keys = Object.keys(tally(group).data[0]!).filter((k) => !(k in NO_USAGE) && k !== "turns").sort();
    t.deepEqual(keys, { day: ["day"], agent: ["agent_id"], version: ["agent_id", "agent_version"], model: ["model"] }[group], group);
  }
});

test("usage - budgets: a limit is spent once reached; cost before tokens; an unpriced month never spends a cost limit", (t) => {
  const spent = (tokens: number, cost: number | null) => ({ input_tokens: tokens, output_tokens: 0, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: cost });
  const cases: Array<[number | null, number | null, number, number | null, "cost" | "tokens" | null]> = [
    [null, null, 1e9, 1e9, null],
    [10, null, 0, 9.99, null],
    [10, null, 0, 10, "cost"],
    [10, null, 1e9, null, null],
    [null, 100, 99, null, null],
    [null, 100, 100, null, "tokens"],
    [10, 100, 100, 10, "cost"],
    [10, 100, 100, 1, "tokens"],
  ];
  for (const [cost, tokens, usedTokens, usedCost, expected] of cases) {
    t.is(budgetSpent({ monthly_cost_usd: cost, monthly_tokens: tokens }, spent(usedTokens, usedCost)), expected, JSON.stringify([cost, tokens, usedTokens, usedCost]));
  }
  // A token budget counts every kind of token.
  t.is(totalTokens({ input_tokens: 1, output_tokens: 2, cache_read_tokens: 3, cache_write_tokens: 4, cost_usd: null }), 10);
});

test("usage - months and days are UTC; model labels never hold an endpoint's URL", (t) => {
  t.is(monthStart(Date.UTC(2026, 11, 31, 23, 59, 59, 999)), Date.UTC(2026, 11, 1));
  t.is(nextMonthStart(Date.UTC(2026, 11, 31, 23, 59)), Date.UTC(2027, 0, 1));
  t.is(monthStart(Date.UTC(2026, 1, 1)), Date.UTC(2026, 1, 1));
  t.is(utcDay(Date.UTC(2026, 10, 25, 23, 59, 59, 999)), "2026-11-25");
  t.is(modelLabel("anthropic/claude-x"), "anthropic/claude-x");
  t.is(modelLabel({ provider: "openai-compatible", base_url: "http://10.0.0.1:8000/v1", model: "llama" } as never), "openai-compatible/llama");
  t.false(hasUsage(NO_USAGE));
  t.true(hasUsage({ ...NO_USAGE, output_tokens: 1 }));
});

test("usage - a call counts at most a billion tokens and a million dollars, and sums saturate at the largest exact number: 1e308 from a model had summed to Infinity, which the store refuses (found by a probe)", (t) => {
  const huge = [{ role: "assistant", usage: { input: 1e308, output: 1e308, cacheRead: Number.MAX_VALUE, cacheWrite: 5, cost: { total: 1e308 } } }];
  const one = turnUsage(huge, true);
  t.deepEqual(one, { input_tokens: 1e9, output_tokens: 1e9, cache_read_tokens: 1e9, cache_write_tokens: 5, cost_usd: 1e6 });
  let sum = one;
  for (let i = 0; i < 30; i++) sum = addUsage(sum, { ...sum });
  for (const n of [sum.input_tokens, sum.output_tokens, sum.cache_read_tokens, sum.cost_usd!]) t.true(Number.isFinite(n) && n <= Number.MAX_SAFE_INTEGER, String(n));
  t.is(sum.input_tokens, Number.MAX_SAFE_INTEGER);
});
