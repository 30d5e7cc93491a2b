import { type Budget, type Clock, Ids, type MongoStore, newApiKey, type Plan, renderApiKey, renderBudget, SCOPES, unixSeconds, UsageLedger, type WorkspaceDoc } from "../src/index.js";

export function renderWorkspace(doc: WorkspaceDoc) {
  return { id: doc._id, object: "workspace", name: doc.name, plan: doc.plan, created_at: unixSeconds(doc.created_at) };
}

/**
 * Changes a workspace's plan. Runs keep the retention they were created with, so the
 * change applies to runs created afterwards only (decisions §1).
 */
export async function setWorkspacePlan(store: MongoStore, workspaceId: string, plan: Plan) {
  await store.setWorkspacePlan(workspaceId, plan);
  const workspace = await store.getWorkspace(workspaceId);
  return workspace ? renderWorkspace(workspace) : null;
}

/**
 * Sets (or, with both limits null, removes) a workspace's monthly budget; null when there
 * is no such workspace. The answer is the budget as GET /api/v1/usage/budget shows it.
 */
export async function setWorkspaceBudget(store: MongoStore, workspaceId: string, budget: Budget, clock: Clock) {
  if (!(await store.getWorkspace(workspaceId))) return null;
  const state = await new UsageLedger(store.db, clock).setBudget(workspaceId, budget);
  return { workspace_id: workspaceId, budget: state ? renderBudget(state) : null };
}

/** Creates a workspace and an all-scopes key (decisions §1); the secret is only in the answer. */
export async function createWorkspace(store: MongoStore, input: { plan: Plan; name?: string; nowMs: number }) {
  const workspace: WorkspaceDoc = {
    _id: Ids.workspace(),
    name: input.name ?? "default",
    plan: input.plan,
    created_at: input.nowMs,
  };
  await store.insertWorkspace(workspace);
  const { doc, secret } = newApiKey({ workspaceId: workspace._id, label: "admin", scopes: [...SCOPES], nowMs: input.nowMs, ids: Ids });
  await store.keys.insert(doc);
  return { workspace: renderWorkspace(workspace), api_key: renderApiKey(doc, input.nowMs, { secret }) };
}
