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

/**
 * The most one model call is counted for, in tokens and dollars. A model (or a tenant's
 * endpoint) reports what it likes: 1e308 tokens had summed to Infinity, which the store
 * refuses, and the run's every later write failed with it (found by a probe). No real call
 * comes near these.
 */
export const MAX_CALL_TOKENS = 1e9;
export const MAX_CALL_COST_USD = 1e6;

const tokens = (n: unknown): number => (typeof n === "number" && Number.isFinite(n) && n > 0 ? Math.min(Math.floor(n), MAX_CALL_TOKENS) : 0);

/** A sum that stays a finite, exact number however many turns it adds up. */
const saturated = (n: number): number => Math.min(n, Number.MAX_SAFE_INTEGER);

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
    if (typeof total === "number" && Number.isFinite(total) && total > 0) cost += Math.min(total, MAX_CALL_COST_USD);
  }
  const summed = { input_tokens: saturated(usage.input_tokens), output_tokens: saturated(usage.output_tokens), cache_read_tokens: saturated(usage.cache_read_tokens), cache_write_tokens: saturated(usage.cache_write_tokens) };
  return { ...summed, cost_usd: priced ? roundCost(saturated(cost)) : null };
}

/** Two usages summed; a cost is known when either side's is. */
export function addUsage(a: TurnUsage, b: TurnUsage): TurnUsage {
  return {
    input_tokens: saturated(a.input_tokens + b.input_tokens),
    output_tokens: saturated(a.output_tokens + b.output_tokens),
    cache_read_tokens: saturated(a.cache_read_tokens + b.cache_read_tokens),
    cache_write_tokens: saturated(a.cache_write_tokens + b.cache_write_tokens),
    cost_usd: a.cost_usd === null && b.cost_usd === null ? null : roundCost(saturated((a.cost_usd ?? 0) + (b.cost_usd ?? 0))),
  };
}

/** Dollars to a millionth of a cent: sums of float prices stay readable and stable. */
function roundCost(dollars: number): number {
  return Math.round(dollars * 1e8) / 1e8;
}

/** One final turn's usage as the ledger keeps it: written once per turn (its id), read by workspace and time. */
export interface UsageRecordDoc extends TurnUsage {
  /** The turn's id: a retried write of the same turn is the same record. */
  _id: string;
  workspace_id: string;
  run_id: string;
  agent_id: string;
  agent_version: number;
  /** The model as the deployment names it (an OpenAI-compatible endpoint: `openai-compatible/<model>`, never its URL). */
  model: string;
  /** When the turn became final (ms). */
  at: number;
}

export const USAGE_GROUPS = ["day", "agent", "version", "model"] as const;
export type UsageGroup = (typeof USAGE_GROUPS)[number];

/** One bucket of a usage summary: its key fields, the number of turns and their usage. */
export interface UsageBucket extends TurnUsage {
  day?: string;
  agent_id?: string;
  agent_version?: number;
  model?: string;
  turns: number;
}

/** The label a deployment's model gets in usage and metrics (bounded, no URL). */
export function modelLabel(model: string | { provider: string; model: string }): string {
  return typeof model === "string" ? model : `${model.provider}/${model.model}`;
}

/** The UTC day of a time, `YYYY-MM-DD`. */
export function utcDay(ms: number): string {
  return new Date(ms).toISOString().slice(0, 10);
}

/** Start of the UTC calendar month holding `ms` (a budget's period). */
export function monthStart(ms: number): number {
  const d = new Date(ms);
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1);
}

/** Start of the UTC calendar month after the one holding `ms`. */
export function nextMonthStart(ms: number): number {
  const d = new Date(ms);
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
}

/** Every token a turn's model calls processed: what a token budget counts. */
export function totalTokens(usage: TurnUsage): number {
  return usage.input_tokens + usage.output_tokens + usage.cache_read_tokens + usage.cache_write_tokens;
}

/** Whether a record is worth keeping: a turn that called no model (or one that reported nothing) is not. */
export function hasUsage(usage: TurnUsage): boolean {
  return totalTokens(usage) > 0 || (usage.cost_usd ?? 0) > 0;
}

function bucketKey(record: UsageRecordDoc, group: UsageGroup): { key: string; fields: Partial<UsageBucket> } {
  switch (group) {
    case "day": {
      const day = utcDay(record.at);
      return { key: day, fields: { day } };
    }
    case "agent":
      return { key: record.agent_id, fields: { agent_id: record.agent_id } };
    case "version":
      return { key: `${record.agent_id}@${record.agent_version}`, fields: { agent_id: record.agent_id, agent_version: record.agent_version } };
    case "model":
      return { key: record.model, fields: { model: record.model } };
  }
}

/**
 * Folds usage records into buckets and a total. Buckets are ordered by day ascending, else
 * by cost (unpriced last), then tokens, descending, then key: the biggest spender first.
 */
export class UsageTally {
  private readonly buckets = new Map<string, UsageBucket>();
  private totalUsage: TurnUsage = NO_USAGE;
  private turnCount = 0;

  constructor(private readonly group: UsageGroup) {}

  add(record: UsageRecordDoc): void {
    const { key, fields } = bucketKey(record, this.group);
    const usage = pickUsage(record);
    const bucket = this.buckets.get(key);
    this.buckets.set(key, bucket ? { ...bucket, ...addUsage(bucket, usage), turns: bucket.turns + 1 } : { ...fields, ...usage, turns: 1 });
    this.totalUsage = addUsage(this.totalUsage, usage);
    this.turnCount++;
  }

  get total(): TurnUsage & { turns: number } {
    return { ...this.totalUsage, turns: this.turnCount };
  }

  get data(): UsageBucket[] {
    const entries = [...this.buckets.entries()];
    if (this.group === "day") entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    else
      entries.sort(([ka, a], [kb, b]) => (b.cost_usd ?? -1) - (a.cost_usd ?? -1) || totalTokens(b) - totalTokens(a) || (ka < kb ? -1 : ka > kb ? 1 : 0));
    return entries.map(([, bucket]) => bucket);
  }
}

/** The usage fields of a record (or any object holding them). */
export function pickUsage(u: TurnUsage): TurnUsage {
  return { input_tokens: u.input_tokens, output_tokens: u.output_tokens, cache_read_tokens: u.cache_read_tokens, cache_write_tokens: u.cache_write_tokens, cost_usd: u.cost_usd };
}

/** A workspace's monthly budget; either limit may be absent. */
export interface Budget {
  monthly_cost_usd: number | null;
  monthly_tokens: number | null;
}

/** Which limit a month's usage has reached, if any (a limit is spent once reached). */
export function budgetSpent(budget: Budget, spent: TurnUsage): "cost" | "tokens" | null {
  if (budget.monthly_cost_usd !== null && (spent.cost_usd ?? 0) >= budget.monthly_cost_usd) return "cost";
  if (budget.monthly_tokens !== null && totalTokens(spent) >= budget.monthly_tokens) return "tokens";
  return null;
}
