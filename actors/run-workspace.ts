/**
 * A run's workspace directory on this node: where it lives, and making it ready for a
 * turn (brought along from its checkpoint when the run moved here, then handed to the
 * sandbox's uid).
 */
import { randomUUID } from "node:crypto";
import { existsSync, mkdirSync, renameSync, rmSync } from "node:fs";
import { mkdir, readdir, rm, stat, utimes } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "pino";
import { type Clock, type RunDoc, type TurnErrorCode } from "../src/index.js";
import { CheckpointCorruptError, CheckpointNoRoomError, checkpointMarkerOf, isTransientCheckpointFailure, type WorkspaceCheckpoints } from "./checkpoints.js";
import { withRetries } from "./turn-input.js";
import { removeTree } from "./sandbox-host.js";
import type { Sandbox } from "./sandbox.js";

export function workspaceDirOf(dataDir: string, runId: string): string {
  return path.join(dataDir, "workspaces", runId);
}

/** Removes a run's workspace directory on this node and the checkpoint marker beside it. */
export async function removeRunWorkspace(workspaceDir: string): Promise<void> {
  await removeTree(workspaceDir);
  await rm(checkpointMarkerOf(workspaceDir), { force: true });
}

type PreparationFailure = Extract<TurnErrorCode, "sandbox_snapshot_activation_failed" | "sandbox_snapshot_unavailable" | "sandbox_operation_failed" | "sandbox_capacity_exceeded">;

/**
 * The workspace's preparation: `failure`, the turn's failure code when it cannot be made
 * ready; `revision`, the run's checkpoint revision when the preparation read it (checked,
 * restored, or none stored yet: 0), which the actor's next save expects.
 */
export interface PreparedWorkspace {
  failure: PreparationFailure | null;
  revision?: number;
}

/**
 * A checkpoint read, again while the object store fails for a moment (a NATS server
 * restarting, a stream leader being elected): five attempts, 3 s of pauses between them,
 * each attempt bounded by its request's own timeout. A checkpoint that cannot be extracted
 * is never read again here (a stream cut after its first chunk is reported so too).
 */
function readCheckpoint<T>(clock: Pick<Clock, "sleep">, read: () => Promise<T>): Promise<T> {
  return withRetries(clock, read, { attempts: 5, transient: isTransientCheckpointFailure });
}

/**
 * Makes `workspaceDir` ready for a turn of `run`. A run that moved here from another node
 * gets its workspace back from the checkpoint: a store that fails for a moment is asked
 * again, one that cannot be read for longer may answer later (the turn fails retryably);
 * a checkpoint that is gone or cannot be extracted will not come back.
 * With `verify` (an actor's first turn with tools), a directory this node kept from an
 * earlier time it held the run is used only if it is still the run's latest checkpoint;
 * otherwise it is replaced by that checkpoint (another node saved the run since).
 */
export async function prepareRunWorkspace(
  r: { checkpoints: Pick<WorkspaceCheckpoints, "restore" | "matches">; sandbox: Pick<Sandbox, "prepareWorkspace" | "closeWorkspacesFolder" | "hostDiskLow" | "roomFor" | "watchDisk">; log: Logger; clock: Pick<Clock, "sleep"> },
  run: RunDoc,
  workspaceDir: string,
  verify = false,
): Promise<PreparedWorkspace> {
  let present = existsSync(workspaceDir);
  // A run never saved has no checkpoint to check against (one saved by an owner that died
  // before it marked the run is found by the save, which expects none).
  let revision = verify && !run.checkpointed ? 0 : undefined;
  if (run.checkpointed && present && verify) {
    try {
      const kept = await readCheckpoint(r.clock, () => r.checkpoints.matches(run._id, workspaceDir));
      revision = kept.revision;
      if (!kept.current) {
        r.log.info({ run_id: run._id }, "the workspace kept on this node is older than the run's checkpoint: restoring the checkpoint");
        await removeTree(workspaceDir);
        present = false;
      }
    } catch (err) {
      r.log.error({ err, run_id: run._id }, "could not check the run's workspace against its checkpoint");
      return { failure: "sandbox_snapshot_activation_failed" };
    }
  }
  if (run.checkpointed && !present) {
    // A restore can take what disk the node has left (RUNS_DISK_RESERVE_MB): none begins
    // while the node is short, and one under way stops when it becomes short. The turn
    // fails retryably; the checkpoint is untouched.
    const workspaces = path.dirname(workspaceDir);
    try {
      await mkdir(workspaces, { recursive: true, mode: 0o700 });
    } catch (err) {
      r.log.error({ err, run_id: run._id }, "could not make the workspaces' folder");
      return { failure: "sandbox_operation_failed" };
    }
    if (await r.sandbox.hostDiskLow(workspaces)) {
      r.log.warn({ run_id: run._id }, "the node's disk is almost full: the run's workspace is not restored now");
      return { failure: "sandbox_capacity_exceeded" };
    }
    let failure: PreparationFailure | undefined;
    const noRoom = new AbortController();
    const unwatch = r.sandbox.watchDisk(workspaces, () => noRoom.abort());
    try {
      const fits = (bytes: number) => r.sandbox.roomFor(workspaces, bytes);
      const restored = await readCheckpoint(r.clock, () => r.checkpoints.restore(run._id, workspaceDir, run.workspace_id, { fits, stop: noRoom.signal }));
      if (restored === null) failure = "sandbox_snapshot_unavailable";
      else revision = restored;
    } catch (err) {
      r.log.error({ err, run_id: run._id }, "could not restore the run's workspace");
      failure =
        err instanceof CheckpointNoRoomError ? "sandbox_capacity_exceeded" : err instanceof CheckpointCorruptError ? "sandbox_snapshot_unavailable" : "sandbox_snapshot_activation_failed";
    } finally {
      unwatch();
    }
    if (failure) {
      // Nothing half-restored is left to pass for the workspace on the next try.
      await removeTree(workspaceDir);
      return { failure };
    }
  }
  // The workspaces' folder closed to other host users; the workspace itself becomes the sandbox uid's.
  await mkdir(path.dirname(workspaceDir), { recursive: true, mode: 0o700 });
  await mkdir(workspaceDir, { recursive: true, mode: 0o700 });
  try {
    await r.sandbox.closeWorkspacesFolder(path.dirname(workspaceDir));
    await r.sandbox.prepareWorkspace(workspaceDir);
  } catch (err) {
    r.log.error({ err, run_id: run._id }, "could not prepare the run's workspace for its sandbox");
    return { failure: "sandbox_operation_failed" };
  }
  // In use now: a kept directory's age counts from its last use (sweepKeptWorkspaces).
  // Best effort (the directory is the sandbox's own; the marker may not exist yet).
  const now = new Date();
  await Promise.all([utimes(checkpointMarkerOf(workspaceDir), now, now), utimes(workspaceDir, now, now)].map((p) => p.catch(() => undefined)));
  return { failure: null, revision };
}

const CHECKPOINT_SUFFIX = checkpointMarkerOf("");
/** Where swept directories go before they are removed (a crash between the two leaves them here). */
const TRASH = ".trash";

/** The runs with a workspace directory (or its checkpoint marker) on this node. */
export async function keptWorkspaceIds(dataDir: string): Promise<string[]> {
  const names = await readdir(path.join(dataDir, "workspaces")).catch((err: NodeJS.ErrnoException) => {
    if (err.code === "ENOENT") return [] as string[];
    throw err;
  });
  return [...new Set(names.filter((name) => !name.startsWith(".")).map((name) => (name.endsWith(CHECKPOINT_SUFFIX) ? name.slice(0, -CHECKPOINT_SUFFIX.length) : name)))];
}

/**
 * Removes the workspace directories (and checkpoint markers) this node kept for runs it
 * no longer holds, once untouched for `olderThanMs` (last prepared for a turn, saved or
 * restored: the newer of the marker's and the directory's times): runs that moved to
 * another node, or were deleted or expired there. What such a directory holds beyond the
 * run's checkpoint (a turn whose save failed) is then given up; until then it is used
 * again if the run comes back and the checkpoint is still the one it was saved as.
 * `holds(runId)` is asked again right before a directory is moved out of the way, in the
 * same synchronous step, so no actor of this node can begin to use it in between. Bounded
 * per call: at most `limit` directories not held are looked at and `maxRemovals` removed,
 * from a random place in the listing (so none is always left behind the bound).
 */
export async function sweepKeptWorkspaces(
  dataDir: string,
  holds: (runId: string) => boolean,
  o: { nowMs: number; olderThanMs: number; limit?: number; maxRemovals?: number },
): Promise<{ removed: number; failed: number }> {
  const root = path.join(dataDir, "workspaces");
  const trash = path.join(root, TRASH);
  const done = { removed: 0, failed: 0 };
  // What a crash (or a failed removal) left there; tried again at every sweep.
  await removeTree(trash).catch(() => undefined);
  const runIds = await keptWorkspaceIds(dataDir);
  const from = Math.floor(Math.random() * runIds.length);
  let looked = 0;
  for (let i = 0; i < runIds.length && looked < (o.limit ?? 1_000) && done.removed < (o.maxRemovals ?? 50); i++) {
    const runId = runIds[(from + i) % runIds.length]!;
    if (holds(runId)) continue;
    looked++;
    const dir = path.join(root, runId);
    const marker = checkpointMarkerOf(dir);
    const times = await Promise.all([stat(marker), stat(dir)].map((p) => p.then((st) => st.mtimeMs, () => undefined)));
    const touched = Math.max(...times.filter((t): t is number => t !== undefined));
    if (!Number.isFinite(touched) || o.nowMs - touched < o.olderThanMs) continue;
    // Checked and moved in one synchronous step (no await between them).
    if (holds(runId)) continue;
    const away = path.join(trash, `${runId}-${randomUUID()}`);
    try {
      if (existsSync(dir)) {
        if (!existsSync(trash)) mkdirSync(trash, { mode: 0o700 });
        renameSync(dir, away);
      }
      rmSync(marker, { force: true });
      await removeTree(away);
      done.removed++;
    } catch {
      done.failed++;
    }
  }
  await removeTree(trash).catch(() => undefined);
  return done;
}
