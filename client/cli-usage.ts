/** How `runs usage` and `runs budget` print for a person (with --json, the documents as they are). */
import { UsageError } from "./cli-args.js";
import type { Budget, Usage, UsageBucket, UsageSummary } from "./types.js";

/** --from / --to: Unix seconds, a day (YYYY-MM-DD, UTC midnight) or an ISO time. */
export function timeOf(value: string | undefined, name: string): number | undefined {
  if (value === undefined) return undefined;
  if (/^\d+$/.test(value)) return Number(value);
  const ms = Date.parse(/^\d{4}-\d{2}-\d{2}$/.test(value) ? `${value}T00:00:00Z` : value);
  if (Number.isNaN(ms)) throw new UsageError(`--${name} must be a date (YYYY-MM-DD), an ISO time or Unix seconds`);
  return Math.floor(ms / 1000);
}

const dollars = (cost: number | null) => (cost === null ? "-" : `$${cost.toFixed(cost < 1 ? 4 : 2)}`);
const tokens = (u: Usage) => u.input_tokens + u.output_tokens + u.cache_read_tokens + u.cache_write_tokens;

function keyOf(bucket: UsageBucket): string {
  if (bucket.day !== undefined) return bucket.day;
  if (bucket.model !== undefined) return bucket.model;
  return bucket.agent_version === undefined ? String(bucket.agent_id) : `${bucket.agent_id} v${bucket.agent_version}`;
}

/** A table: one row per bucket, then the total and the budget's line. */
export function usageTable(summary: UsageSummary): string[] {
  const rows = summary.data.map((b) => [keyOf(b), String(b.turns), String(b.input_tokens), String(b.output_tokens), String(b.cache_read_tokens + b.cache_write_tokens), dollars(b.cost_usd)]);
  const total = summary.total;
  rows.push(["total", String(total.turns), String(total.input_tokens), String(total.output_tokens), String(total.cache_read_tokens + total.cache_write_tokens), dollars(total.cost_usd)]);
  const header = [summary.group_by, "turns", "input", "output", "cache", "cost"];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const format = (r: string[]) => r.map((cell, i) => (i === 0 ? cell.padEnd(widths[i]!) : cell.padStart(widths[i]!))).join("  ").trimEnd();
  const lines = [format(header), ...rows.map(format)];
  if (summary.budget) lines.push("", budgetLine(summary.budget));
  return lines;
}

/** `budget: $12.50 of $100.00, 1200 of 1000000 tokens this month (until 2026-12-01) — spent: tokens` */
export function budgetLine(budget: Budget): string {
  const parts: string[] = [];
  if (budget.monthly_cost_usd !== null) parts.push(`${dollars(budget.spent.cost_usd ?? 0)} of ${dollars(budget.monthly_cost_usd)}`);
  if (budget.monthly_tokens !== null) parts.push(`${tokens(budget.spent)} of ${budget.monthly_tokens} tokens`);
  const until = new Date(budget.period_end * 1000).toISOString().slice(0, 10);
  return `budget: ${parts.join(", ")} this month (until ${until})${budget.exhausted ? ` - spent (${budget.exhausted}): new turns are refused` : ""}`;
}
