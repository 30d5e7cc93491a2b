/**
 * The usage ledger (issue 16): one record per final turn that used a model, written by the
 * run's owner as the turn becomes final and never changed (an insert keyed by the turn id,
 * so a retried write is the same record; FerretDB updates are not atomic, inserts are).
 * Summaries and budgets read records by workspace and time; runs are never scanned, and a
 * run's deletion or expiry leaves its turns' records (they are not run data: no input,
 * output or tags).
 */
import type { Collection, Db } from "mongodb";
import { type Clock, unixSeconds } from "./clock.js";
import { ApiError } from "./errors.js";
import { deleteOldest, guard, isDuplicateKey } from "./mongo-guard.js";
import { type Budget, budgetSpent, monthStart, nextMonthStart, NO_USAGE, pickUsage, type UsageGroup, type UsageRecordDoc, UsageTally, addUsage } from "./usage.js";
import type { TurnUsage } from "./domain.js";

export const USAGE_COLLECTION = "usage";
export const BUDGETS_COLLECTION = "budgets";

/** A workspace's budget as stored: one document per workspace (its id). */
interface BudgetDoc extends Budget {
  _id: string;
  updated_at: number;
}

/** What a budget looks like this month. */
export interface BudgetState extends Budget {
  period_start: number;
  period_end: number;
  spent: TurnUsage;
  /** Which limit is spent (new turns are refused), or null. */
  exhausted: "cost" | "tokens" | null;
  updated_at: number;
}

/** What the actor needs of the ledger: record a final turn's usage (true when it was new). */
export interface UsageRecorder {
  record(doc: UsageRecordDoc): Promise<boolean>;
}

/** A workspace's spend this month as this node last summed it. */
interface SpentCache {
  periodStart: number;
  spent: TurnUsage;
  summedAt: number;
}

/** How long a node trusts its sum of a month's spend before it reads the records again. */
export const SPENT_TTL_MS = 5_000;
/** How long a node trusts a budget it read (its own changes apply at once). */
export const BUDGET_TTL_MS = 2_000;
/** Workspaces whose budget and spend a node keeps in memory (bounded: cleared when full). */
const CACHED_WORKSPACES = 10_000;
/** The longest range one summary reads. */
export const MAX_USAGE_RANGE_MS = 366 * 24 * 3600 * 1000;

export class UsageLedger implements UsageRecorder {
  private readonly records: Collection<UsageRecordDoc>;
  private readonly budgets: Collection<BudgetDoc>;
  private readonly observers: Array<(doc: UsageRecordDoc) => void> = [];
  private readonly spentCache = new Map<string, SpentCache>();
  private readonly budgetCache = new Map<string, { budget: BudgetDoc | null; readAt: number }>();

  constructor(
    db: Db,
    private readonly clock: Clock,
  ) {
    this.records = db.collection<UsageRecordDoc>(USAGE_COLLECTION);
    this.budgets = db.collection<BudgetDoc>(BUDGETS_COLLECTION);
  }

  /** Creates the summary and retention indexes; safe on every start. */
  async provision(): Promise<void> {
    await guard(() => this.records.createIndex({ workspace_id: 1, at: 1 }, { name: "ws_at" }));
    await guard(() => this.records.createIndex({ at: 1 }, { name: "at" }));
  }

  /**
   * Removes the records of turns that ended before `beforeMs`, oldest first and a bounded
   * number per call (the retention sweep; every node runs it, and a record removed twice
   * is removed once). How many were removed.
   */
  sweep(beforeMs: number): Promise<number> {
    return deleteOldest(this.records, "at", beforeMs);
  }

  /** Calls `observer` for every record this process wrote first (the Prometheus counters). */
  onRecorded(observer: (doc: UsageRecordDoc) => void): void {
    this.observers.push(observer);
  }

  async record(doc: UsageRecordDoc): Promise<boolean> {
    try {
      await guard(() => this.records.insertOne(doc));
    } catch (err) {
      if (isDuplicateKey(err)) return false;
      throw err;
    }
    const cached = this.spentCache.get(doc.workspace_id);
    if (cached && cached.periodStart === monthStart(doc.at)) cached.spent = addUsage(cached.spent, pickUsage(doc));
    for (const observer of this.observers) observer(doc);
    return true;
  }

  /** The workspace's usage in [fromMs, toMs), grouped; reads its records in that range only. */
  async summary(workspaceId: string, fromMs: number, toMs: number, group: UsageGroup): Promise<UsageTally> {
    const tally = new UsageTally(group);
    await guard(async () => {
      const cursor = this.records.find(
        { workspace_id: workspaceId, at: { $gte: fromMs, $lt: toMs } },
        { projection: { run_id: 0 } },
      );
      for await (const doc of cursor) tally.add(doc);
    });
    return tally;
  }

  /** The workspace's budget, or null; read at most every {@link BUDGET_TTL_MS} per node. */
  private async budgetOf(workspaceId: string): Promise<BudgetDoc | null> {
    const now = this.clock.nowMs();
    const cached = this.budgetCache.get(workspaceId);
    if (cached && now - cached.readAt < BUDGET_TTL_MS) return cached.budget;
    const budget = await guard(() => this.budgets.findOne({ _id: workspaceId }));
    if (this.budgetCache.size >= CACHED_WORKSPACES) this.budgetCache.clear();
    this.budgetCache.set(workspaceId, { budget, readAt: now });
    return budget;
  }

  /** Sets (or, with both limits null, removes) the workspace's monthly budget. */
  async setBudget(workspaceId: string, budget: Budget): Promise<BudgetState | null> {
    const now = this.clock.nowMs();
    if (budget.monthly_cost_usd === null && budget.monthly_tokens === null) {
      await guard(() => this.budgets.deleteOne({ _id: workspaceId }));
      this.budgetCache.set(workspaceId, { budget: null, readAt: now });
      return null;
    }
    const doc: BudgetDoc = { _id: workspaceId, monthly_cost_usd: budget.monthly_cost_usd, monthly_tokens: budget.monthly_tokens, updated_at: now };
    await guard(() => this.budgets.replaceOne({ _id: workspaceId }, doc, { upsert: true }));
    this.budgetCache.set(workspaceId, { budget: doc, readAt: now });
    return this.stateOf(workspaceId, doc);
  }

  /** This month's budget and spend, or null without a budget. */
  async budgetState(workspaceId: string): Promise<BudgetState | null> {
    const budget = await this.budgetOf(workspaceId);
    return budget ? this.stateOf(workspaceId, budget) : null;
  }

  /** Refuses a new turn with 429 quota_exceeded when the workspace's budget is spent. */
  async admit(workspaceId: string): Promise<void> {
    const state = await this.budgetState(workspaceId);
    if (!state?.exhausted) return;
    const limit = state.exhausted === "cost" ? `${state.monthly_cost_usd} USD` : `${state.monthly_tokens} tokens`;
    throw new ApiError("quota_exceeded", {
      // The budget renews with the month (or sooner, when it is raised).
      retryAfterS: Math.max(1, Math.ceil((state.period_end - this.clock.nowMs()) / 1000)),
      message: `The workspace's monthly budget of ${limit} is spent; new turns are refused until ${new Date(state.period_end).toISOString()} or until the budget is raised.`,
    });
  }

  private async stateOf(workspaceId: string, budget: BudgetDoc): Promise<BudgetState> {
    const now = this.clock.nowMs();
    const periodStart = monthStart(now);
    const spent = await this.spentThisMonth(workspaceId, periodStart, now);
    return {
      monthly_cost_usd: budget.monthly_cost_usd,
      monthly_tokens: budget.monthly_tokens,
      period_start: periodStart,
      period_end: nextMonthStart(now),
      spent,
      exhausted: budgetSpent(budget, spent),
      updated_at: budget.updated_at,
    };
  }

  /**
   * The month's spend: summed from the records at most every {@link SPENT_TTL_MS}, and
   * between two sums raised by every record this process writes (its own turns count at
   * once; another node's within the TTL).
   */
  private async spentThisMonth(workspaceId: string, periodStart: number, now: number): Promise<TurnUsage> {
    const cached = this.spentCache.get(workspaceId);
    if (cached && cached.periodStart === periodStart && now - cached.summedAt < SPENT_TTL_MS) return cached.spent;
    const tally = await this.summary(workspaceId, periodStart, nextMonthStart(now), "model");
    const spent = tally.total.turns ? pickUsage(tally.total) : NO_USAGE;
    if (this.spentCache.size >= CACHED_WORKSPACES) this.spentCache.clear();
    this.spentCache.set(workspaceId, { periodStart, spent, summedAt: now });
    return spent;
  }
}

/** A budget as the API shows it (GET /api/v1/usage/budget, `runs admin set-budget`). */
export function renderBudget(state: BudgetState) {
  return {
    object: "usage.budget" as const,
    monthly_cost_usd: state.monthly_cost_usd,
    monthly_tokens: state.monthly_tokens,
    period_start: unixSeconds(state.period_start),
    period_end: unixSeconds(state.period_end),
    spent: state.spent,
    exhausted: state.exhausted,
    updated_at: unixSeconds(state.updated_at),
  };
}
