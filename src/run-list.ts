import type { Filter } from "mongodb";
import type { RunDoc } from "./documents.js";
import { runExpired } from "./domain.js";
import { ApiError, invalid } from "./errors.js";
import type { MongoStore } from "./mongo-store.js";
import { z } from "zod";
import { TagSchema } from "./run-request.js";
import { queryId, queryInt } from "./request-schemas.js";

export const MAX_TAG_FILTERS = 5;

/** Runs a tag filter reads in list order before it counts the tags (a page at 1 in 50 fills within it). */
const QUICK_TAG_SCAN = 1_000;

export interface RunListFilters {
  agentId?: string;
  version?: number;
  state?: "idle" | "busy";
  tags: string[];
  createdAfterS?: number;
  createdBeforeS?: number;
  /** true: only runs waiting for a person's decision; false: only runs that are not. */
  pendingAction?: boolean;
}

const unixSeconds = (what: string) => queryInt(0, 999_999_999_999, "must be a Unix timestamp in seconds.").optional().describe(what);

/** GET /api/v1/runs filters (tag may repeat up to 5 times); paging is added by the route. */
export const RunListQuerySchema = z.object({
  agent_id: queryId().optional().describe("Runs of one agent."),
  version: queryInt(1, Number.MAX_SAFE_INTEGER, "must be a positive whole number.").optional().describe("Runs with at least one turn on this deployment version."),
  state: z.enum(["idle", "busy"], { error: "must be idle or busy." }).optional().describe("idle or busy runs."),
  tag: z
    .preprocess((value) => (value === undefined ? [] : Array.isArray(value) ? value : [value]), z.array(TagSchema).max(MAX_TAG_FILTERS, `at most ${MAX_TAG_FILTERS} tag filters are allowed.`))
    .describe(`Runs carrying every given tag (exact, case-sensitive); up to ${MAX_TAG_FILTERS} times. On a store that cannot look into arrays (stock FerretDB; not MongoDB or the FerretDB this project builds), a filter of only common tags that cannot fill a page within the scan limit: 400 invalid_request, param tag.`),
  created_after: unixSeconds("Runs created at or after this Unix time (seconds)."),
  created_before: unixSeconds("Runs created at or before this Unix time (seconds)."),
  pending_action: z.enum(["true", "false"], { error: "must be true or false." }).optional().describe("true: runs whose active turn waits for a person's decision (config.approval); false: the others."),
});

/** The filters of a validated query. */
export function runListFilters(query: z.output<typeof RunListQuerySchema>): RunListFilters {
  const filters: RunListFilters = { tags: [...new Set(query.tag)] };
  if (query.agent_id !== undefined) filters.agentId = query.agent_id;
  if (query.version !== undefined) filters.version = query.version;
  if (query.state !== undefined) filters.state = query.state;
  filters.createdAfterS = query.created_after;
  filters.createdBeforeS = query.created_before;
  if (query.pending_action !== undefined) filters.pendingAction = query.pending_action === "true";
  return filters;
}

export interface RunListPage {
  runs: RunDoc[];
  hasMore: boolean;
}

/**
 * Lists runs by most recent activity with keyset paging. A tag filter is the store's
 * where it can find tagged runs without decoding every run (MongoDB, the FerretDB this
 * project builds). On stock FerretDB it first reads a few recent runs in list order; a
 * page it cannot fill there comes from the tag index when one of its tags is rare in the
 * workspace (at most `scanLimit` runs carry it), or else from reading on, at most
 * `scanLimit` runs; it refuses (400, param tag) a page it cannot fill rather than
 * answer a short one.
 */
export async function listRuns(
  store: MongoStore,
  input: {
    workspaceId: string;
    filters: RunListFilters;
    limit: number;
    after?: { lastActivityAt: number; id: string };
    scanLimit: number;
    /** Runs read before counting tags (tests lower it). */
    quickScan?: number;
  },
): Promise<RunListPage> {
  const { filters, limit } = input;
  // The bounds on last_activity_at and _id match every run; they state the sort
  // keys' types (numbers, strings), which lets the embedded store order rows from
  // its index (deploy/tools/ferretdb/README.md) and read only the page.
  const base: Filter<RunDoc> = {
    workspace_id: input.workspaceId,
    last_activity_at: { $gte: 0, $lte: input.after ? input.after.lastActivityAt : Number.MAX_SAFE_INTEGER },
    _id: { $gte: "" },
  };
  if (filters.agentId !== undefined) base.agent_id = filters.agentId;
  if (filters.version !== undefined) base.versions = filters.version;
  if (filters.state !== undefined) base.state = filters.state;
  if (filters.pendingAction !== undefined) base.pending_action = filters.pendingAction ? { $ne: null } : null;
  if (filters.createdAfterS !== undefined || filters.createdBeforeS !== undefined) {
    base.created_at = {};
    if (filters.createdAfterS !== undefined) base.created_at.$gte = filters.createdAfterS * 1000;
    if (filters.createdBeforeS !== undefined) base.created_at.$lte = filters.createdBeforeS * 1000 + 999;
  }
  if (input.after) {
    base.$or = [
      { last_activity_at: { $lt: input.after.lastActivityAt } },
      { last_activity_at: input.after.lastActivityAt, _id: { $lt: input.after.id } },
    ];
  }
  const page = (runs: RunDoc[]): RunListPage => ({ runs: runs.slice(0, limit), hasMore: runs.length > limit });
  if (filters.tags.length === 0) return page(await store.findRuns(base, limit + 1));
  if (store.tagFiltersInStore) return page(await store.findRuns({ ...base, tags: { $all: filters.tags } }, limit + 1));

  // A store that decodes every run it reads to check its tags (stock FerretDB):
  // in list order, a page of tags common among recent runs fills within the first
  // runs read, without counting (and reads no further). Past those, a rare tag answers from the tag index;
  // common tags read on up to the scan limit.
  /** The page from the tag index when one of the tags is rare; undefined when all are common. */
  const fromTagIndex = async (): Promise<RunListPage | undefined> => {
    const counts = await Promise.all(filters.tags.map((tag) => store.countRunsWithTag(input.workspaceId, tag, input.scanLimit + 1)));
    if (counts.some((count) => count <= input.scanLimit)) return page(await store.findRuns({ ...base, tags: { $all: filters.tags } }, limit + 1));
  };
  const quick = Math.min(input.scanLimit, input.quickScan ?? QUICK_TAG_SCAN);
  let counted = false;
  const found: RunDoc[] = [];
  let scanned = 0;
  for await (const run of store.scanRuns(base, input.scanLimit + 1)) {
    if (++scanned > input.scanLimit) break;
    if (scanned > quick && !counted) {
      counted = true;
      const indexed = await fromTagIndex();
      if (indexed) return indexed;
    }
    if (filters.tags.every((tag) => run.tags.includes(tag))) found.push(run);
    if (found.length > limit) return page(found);
  }
  if (scanned <= input.scanLimit) return page(found); // every run after the cursor was read
  const indexed = counted ? undefined : await fromTagIndex();
  if (indexed) return indexed;
  if (found.length >= limit) return { runs: found.slice(0, limit), hasMore: true };
  throw invalid("tag", `These tags are common in the workspace; a page could not be filled from the ${input.scanLimit} most recent runs. Narrow the filter (agent_id, version, state, created_after/created_before) or add a rarer tag.`);
}

/**
 * A page of {@link listRuns} without the runs past their retention that the sweeper has not
 * removed yet (unreadable: 410). A page they leave short is filled from the next ones (a few
 * more reads at most: the sweeper removes them within a minute), or answered as it is when a
 * refill cannot be made (the tag scan's 400). `lastRead` is the last run read, shown or not:
 * the page's cursor goes past the runs it left out.
 */
export async function listReadableRuns(
  store: MongoStore,
  input: Parameters<typeof listRuns>[1] & { nowMs: number; turnLimitMs: number },
): Promise<RunListPage & { lastRead?: RunDoc }> {
  const readable = (runs: RunDoc[]) => runs.filter((run) => !runExpired(run, input.nowMs, input.turnLimitMs));
  let page = await listRuns(store, input);
  let lastRead = page.runs.at(-1);
  const shown = readable(page.runs);
  for (let round = 0; round < 4 && shown.length < input.limit && page.hasMore && lastRead; round++) {
    const after = { lastActivityAt: lastRead.last_activity_at, id: lastRead._id };
    const more = await listRuns(store, { ...input, limit: input.limit - shown.length, after }).catch((err: unknown) => {
      if (err instanceof ApiError && err.status === 400) return undefined;
      throw err;
    });
    if (!more) break;
    page = more;
    lastRead = page.runs.at(-1) ?? lastRead;
    shown.push(...readable(page.runs));
  }
  return { runs: shown, hasMore: page.hasMore, lastRead };
}
