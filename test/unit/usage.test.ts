import test from "ava";
import { addUsage, hasPrices, NO_USAGE, turnUsage } from "../../src/usage.js";

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
