/**
 * The parts of a deleted or expired run besides its document: its turns, its events, its
 * workspace directory on this node and its checkpoint. The run's actor removes them right
 * after the run (RunActor.removeRun); the partition owner's sweep removes what a removal
 * left behind, found through the run's tombstone (ActorHost.sweep).
 */
import type { Plan } from "../src/index.js";
import type { ActorResources } from "./actor-resources.js";
import { removeRunWorkspace, workspaceDirOf } from "./run-workspace.js";
import { withRetries } from "./turn-input.js";

/** When the partition's owner checks a removed run's parts, after its tombstone is written (the removal's own work takes seconds). */
export const PARTS_CHECK_AFTER_MS = 10 * 60_000;
/** When it checks again after a check that could not remove them all. */
export const PARTS_RECHECK_MS = 10 * 60_000;

export interface RemovedRun {
  id: string;
  workspace_id: string;
  plan: Plan;
}

type Removal = Pick<ActorResources, "store" | "events" | "checkpoints" | "clock" | "log"> & { config: Pick<ActorResources["config"], "dataDir"> };

/**
 * Removes the run's parts, each whatever became of the others (a failure must not keep the
 * parts after it for good); whether all of them went. Each removal is idempotent: removing
 * what is gone already does nothing.
 */
export async function removeRunParts(r: Removal, run: RemovedRun): Promise<boolean> {
  let removedAll = true;
  const remove = async (part: string, work: () => Promise<unknown>) => {
    try {
      await work();
    } catch (err) {
      removedAll = false;
      r.log.warn({ err, run_id: run.id }, `could not remove the removed run's ${part}; its partition's owner tries again later`);
    }
  };
  await remove("turns", () => withRetries(r.clock, () => r.store.deleteTurnsOf(run.id)));
  await remove("events (their retention removes them)", () => r.events.purge({ id: run.id, workspace_id: run.workspace_id, plan: run.plan }));
  await remove("workspace directory", () => removeRunWorkspace(workspaceDirOf(r.config.dataDir, run.id)));
  await remove("checkpoint", () => r.checkpoints.remove(run.id));
  return removedAll;
}
