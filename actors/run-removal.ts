/**
 * The parts of a deleted or expired run besides its document: its turns, its events, its
 * workspace directory on this node and its checkpoint. The run's actor removes them right
 * after the run (RunActor.removeRun); the partition owner's sweep removes what a removal
 * left behind, found through the run's tombstone (ActorHost.sweep).
 */
import type { Plan, TombstoneDoc } from "../src/index.js";
import type { ActorResources } from "./actor-resources.js";
import { removeRunWorkspace, workspaceDirOf } from "./run-workspace.js";
import { withRetries } from "./turn-input.js";

/** When the partition's owner checks a removed run's parts, after its tombstone is written (the removal's own work takes seconds). */
export const PARTS_CHECK_AFTER_MS = 10 * 60_000;
/** When it checks again after a check that could not remove them all. */
export const PARTS_RECHECK_MS = 10 * 60_000;
/** A node removes at most this many deleted runs' parts at once (a long history takes seconds)... */
export const PART_REMOVALS_AT_ONCE = 4;
/** ...and keeps at most this many waiting; a delete past them leaves its run's parts to the tombstone's check. */
export const PART_REMOVALS_WAITING = 1_000;
/** At most this many of a gained partition's kept workspace directories are looked up at once. */
const MAX_KEPT_LOOKUPS = 10_000;

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

/**
 * Removes what the removal of a run left behind (its node died during it, or the store
 * failed for longer than its retries), found through the run's tombstone by the owner of
 * its partition. A run that still exists was not removed (its delete failed after the
 * tombstone was written): it is checked again later, in case a repeated delete removes it.
 */
export async function removeLeftParts(r: Removal, tombstone: TombstoneDoc, nowMs: number): Promise<void> {
  if (tombstone.plan === undefined) return;
  if (await r.store.getRun(tombstone._id)) {
    await r.store.setPartsDue(tombstone._id, nowMs + PARTS_RECHECK_MS);
    return;
  }
  const removed = await removeRunParts(r, { id: tombstone._id, workspace_id: tombstone.workspace_id, plan: tombstone.plan });
  await r.store.setPartsDue(tombstone._id, removed ? null : nowMs + PARTS_RECHECK_MS);
  r.log[removed ? "info" : "warn"](
    { run_id: tombstone._id, reason: tombstone.reason },
    removed ? "removed what a removed run left behind" : "could not remove all a removed run left behind; checking again later",
  );
}

/**
 * Removes this node's workspace directories of `runIds` whose run no longer exists, asked
 * when the node gains their partition: a run removed while another node held it had its
 * directory removed there, not here, and a directory of a partition this node holds is
 * otherwise kept. A directory whose run has an actor here (`inUse`, asked again after the
 * store's answer) is left alone; a run's directory is made only after its document is
 * stored (RunActor.start), so a run without one has none in use. One store read per
 * directory, at most 10,000 from a random place in the list (none is always left behind
 * the bound); a failed read or removal is counted in `failed` and the rest go on.
 */
export async function removeGoneWorkspaces(r: Removal, runIds: string[], inUse: (runId: string) => boolean): Promise<{ checked: number; removed: number; failed: string[] }> {
  const done = { checked: 0, removed: 0, failed: [] as string[] };
  const from = Math.floor(Math.random() * runIds.length);
  for (let i = 0; i < Math.min(runIds.length, MAX_KEPT_LOOKUPS); i++) {
    const runId = runIds[(from + i) % runIds.length]!;
    if (inUse(runId)) continue;
    done.checked++;
    try {
      if ((await r.store.getRun(runId)) || inUse(runId)) continue;
      await removeRunWorkspace(workspaceDirOf(r.config.dataDir, runId));
      done.removed++;
    } catch {
      done.failed.push(runId);
    }
  }
  return done;
}
