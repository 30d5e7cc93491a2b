/** The workspace's usage this month by day, and its budget (GET /api/v1/usage). */
import { useEffect, useState } from "preact/hooks";
import { call, type Report } from "./api.js";
import type { Budget, Usage, UsageSummary } from "./types.js";

export const tokensOf = (u: Usage) => u.input_tokens + u.output_tokens + u.cache_read_tokens + u.cache_write_tokens;
const dollars = (cost: number | null) => (cost === null ? "no price" : `$${cost.toFixed(cost < 1 ? 4 : 2)}`);

/** `1,234 tokens (1,000 in, 200 out, 34 cache) · $0.0123` */
export function usageText(u: Usage): string {
  const cache = u.cache_read_tokens + u.cache_write_tokens;
  return `${tokensOf(u).toLocaleString("en")} tokens (${u.input_tokens.toLocaleString("en")} in, ${u.output_tokens.toLocaleString("en")} out${cache ? `, ${cache.toLocaleString("en")} cache` : ""}) · ${dollars(u.cost_usd)}`;
}

function BudgetLine({ budget }: { budget: Budget }) {
  const parts: string[] = [];
  if (budget.monthly_cost_usd !== null) parts.push(`${dollars(budget.spent.cost_usd ?? 0)} of ${dollars(budget.monthly_cost_usd)}`);
  if (budget.monthly_tokens !== null) parts.push(`${tokensOf(budget.spent).toLocaleString("en")} of ${budget.monthly_tokens.toLocaleString("en")} tokens`);
  return (
    <p class={budget.exhausted ? "error" : "muted"} data-testid="budget">
      Budget this month: {parts.join(", ")}
      {budget.exhausted && ` — spent (${budget.exhausted}): new turns are refused until ${new Date(budget.period_end * 1000).toISOString().slice(0, 10)}.`}
    </p>
  );
}

export function UsagePage({ report }: { report: Report }) {
  const [summary, setSummary] = useState<UsageSummary | null>(null);
  useEffect(() => {
    call<UsageSummary>("GET", "/api/v1/usage?group_by=day").then(({ body }) => setSummary(body), report);
  }, []);
  if (!summary) return <p class="muted">Loading…</p>;
  const widest = Math.max(1, ...summary.data.map(tokensOf));
  return (
    <section>
      <h2>Usage this month</h2>
      <p data-testid="usage-total">{summary.total.turns} turns · {usageText(summary.total)}</p>
      {summary.budget ? <BudgetLine budget={summary.budget} /> : <p class="muted">No budget (set one with PUT /api/v1/usage/budget).</p>}
      {summary.data.length === 0 ? (
        <p class="muted">No turn used a model this month.</p>
      ) : (
        <table data-testid="usage-days">
          <thead><tr><th>day (UTC)</th><th>turns</th><th>tokens</th><th>cost</th><th></th></tr></thead>
          <tbody>
            {summary.data.map((day) => (
              <tr key={day.day}>
                <td>{day.day}</td>
                <td>{day.turns}</td>
                <td>{tokensOf(day).toLocaleString("en")}</td>
                <td>{dollars(day.cost_usd)}</td>
                <td class="bar-cell"><span class="bar" style={{ width: `${Math.round((tokensOf(day) / widest) * 100)}%` }} /></td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}
