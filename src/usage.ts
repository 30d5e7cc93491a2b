/**
 * Usage accounting (issue 16): what a turn's model calls used, from pi-ai's per-message
 * usage, and a run's sum over its turns. Pure.
 */
import type { TurnUsage } from "./domain.js";

export const NO_USAGE: TurnUsage = Object.freeze({ input_tokens: 0, output_tokens: 0, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: null });

/** The usage pi-ai reports on an assistant message (tokens; cost in dollars from the model's prices). */
interface MessageUsage {
  input: number;
  output: number;
  cacheRead: number;
  cacheWrite: number;
  cost?: { total: number };
}

/** A model's prices per million tokens, as pi-ai's registry states them. */
export interface ModelPrices {
  input: number;
  output: number;
  cacheRead: number;
  cacheWrite: number;
}

/** Whether a model has any price (a model without one has no cost, not a cost of 0). */
export function hasPrices(prices: ModelPrices | undefined): boolean {
  return prices !== undefined && (prices.input > 0 || prices.output > 0 || prices.cacheRead > 0 || prices.cacheWrite > 0);
}

const tokens = (n: unknown): number => (typeof n === "number" && Number.isFinite(n) && n > 0 ? Math.floor(n) : 0);

/** The usage of a turn: its assistant messages' usage summed; cost only when the model has prices. */
export function turnUsage(messages: ReadonlyArray<{ role: string; usage?: MessageUsage }>, priced: boolean): TurnUsage {
  const usage = { input_tokens: 0, output_tokens: 0, cache_read_tokens: 0, cache_write_tokens: 0 };
  let cost = 0;
  for (const message of messages) {
    if (message.role !== "assistant" || !message.usage) continue;
    usage.input_tokens += tokens(message.usage.input);
    usage.output_tokens += tokens(message.usage.output);
    usage.cache_read_tokens += tokens(message.usage.cacheRead);
    usage.cache_write_tokens += tokens(message.usage.cacheWrite);
    const total = message.usage.cost?.total;
    if (typeof total === "number" && Number.isFinite(total) && total > 0) cost += total;
  }
  return { ...usage, cost_usd: priced ? roundCost(cost) : null };
}

/** Two usages summed; a cost is known when either side's is. */
export function addUsage(a: TurnUsage, b: TurnUsage): TurnUsage {
  return {
    input_tokens: a.input_tokens + b.input_tokens,
    output_tokens: a.output_tokens + b.output_tokens,
    cache_read_tokens: a.cache_read_tokens + b.cache_read_tokens,
    cache_write_tokens: a.cache_write_tokens + b.cache_write_tokens,
    cost_usd: a.cost_usd === null && b.cost_usd === null ? null : roundCost((a.cost_usd ?? 0) + (b.cost_usd ?? 0)),
  };
}

/** Dollars to a millionth of a cent: sums of float prices stay readable and stable. */
function roundCost(dollars: number): number {
  return Math.round(dollars * 1e8) / 1e8;
}
