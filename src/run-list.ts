import type { Filter } from "mongodb";
import type { RunDoc } from "./documents.js";
import { invalid } from "./errors.js";
import type { MongoStore } from "./mongo-store.js";
import { tagProblem } from "./run-request.js";

export const MAX_TAG_FILTERS = 5;

export interface RunListFilters {
  agentId?: string;
  version?: number;
  state?: "idle" | "busy";
  tags: string[];
  createdAfterS?: number;
  createdBeforeS?: number;
}

/** Validates GET /api/v1/runs query parameters (tag may repeat up to 5 times). */
export function parseRunListQuery(query: Record<string, unknown>): RunListFilters {
  const one = (name: string): string | undefined => {
    const value = query[name];
    if (value === undefined) return undefined;
    if (Array.isArray(value) || typeof value !== "string") throw invalid(name, `${name} may be given once.`);
    return value;
  };
  const unix = (name: string): number | undefined => {
    const raw = one(name);
    if (raw === undefined) return undefined;
    if (!/^[0-9]{1,12}$/.test(raw)) throw invalid(name, `${name} must be a Unix timestamp in seconds.`);
    return Number(raw);
  };
  const filters: RunListFilters = { tags: [] };
  const agentId = one("agent_id");
  if (agentId !== undefined) filters.agentId = agentId;
  const version = one("version");
  if (version !== undefined) {
    if (!/^[1-9][0-9]{0,15}$/.test(version)) throw invalid("version", "version must be a positive whole number.");
    filters.version = Number(version);
  }
  const state = one("state");
  if (state !== undefined) {
    if (state !== "idle" && state !== "busy") throw invalid("state", "state must be idle or busy.");
    filters.state = state;
  }
  const rawTags = query.tag === undefined ? [] : Array.isArray(query.tag) ? query.tag : [query.tag];
  if (rawTags.length > MAX_TAG_FILTERS) throw invalid("tag", `At most ${MAX_TAG_FILTERS} tag filters are allowed.`);
  for (const tag of rawTags) {
    const problem = tagProblem(tag);
    if (problem) throw invalid("tag", `${problem}: ${JSON.stringify(tag)}`);
  }
  filters.tags = [...new Set(rawTags as string[])];
  filters.createdAfterS = unix("created_after");
  filters.createdBeforeS = unix("created_before");
  return filters;
}

export interface RunListPage {
  runs: RunDoc[];
  hasMore: boolean;
}

/**
 * Lists runs by most recent activity with keyset paging. A tag filter uses the tag
 * index when one of its tags is rare in the workspace (at most `scanLimit` runs carry
 * it). When every tag is common, it scans at most `scanLimit` runs in list order and
 * refuses (400, param tag) a page it cannot fill, rather than answering a short page.
 */
export async function listRuns(
  store: MongoStore,
  input: { workspaceId: string; filters: RunListFilters; limit: number; after?: { lastActivityAt: number; id: string }; scanLimit: number },
): Promise<RunListPage> {
  const { filters, limit } = input;
  const base: Filter<RunDoc> = { workspace_id: input.workspaceId };
  if (filters.agentId !== undefined) base.agent_id = filters.agentId;
  if (filters.version !== undefined) base.versions = filters.version;
  if (filters.state !== undefined) base.state = filters.state;
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

  const counts = await Promise.all(filters.tags.map((tag) => store.countRunsWithTag(input.workspaceId, tag, input.scanLimit + 1)));
  if (counts.some((count) => count <= input.scanLimit)) {
    return page(await store.findRuns({ ...base, tags: { $all: filters.tags } }, limit + 1));
  }
  // Only common tags: scan in list order, bounded.
  const found: RunDoc[] = [];
  let scanned = 0;
  for await (const run of store.scanRuns(base, input.scanLimit + 1)) {
    scanned++;
    if (scanned > input.scanLimit) {
      if (found.length >= limit) return { runs: found.slice(0, limit), hasMore: true };
      throw invalid("tag", `These tags are common in the workspace; a page could not be filled from the ${input.scanLimit} most recent runs. Narrow the filter (agent_id, version, state, created_after/created_before) or add a rarer tag.`);
    }
    if (filters.tags.every((tag) => run.tags.includes(tag))) found.push(run);
    if (found.length > limit) break;
  }
  return page(found);
}
