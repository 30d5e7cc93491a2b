/**
 * A run's workspace directory on this node: where it lives, and making it ready for a
 * turn (brought along from its checkpoint when the run moved here, then handed to the
 * sandbox's uid).
 */
import { existsSync } from "node:fs";
import { mkdir, rm } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "pino";
import type { RunDoc, TurnErrorCode } from "../src/index.js";
import { CheckpointCorruptError, checkpointMarkerOf, type WorkspaceCheckpoints } from "./checkpoints.js";
import type { Sandbox } from "./sandbox.js";

export function workspaceDirOf(dataDir: string, runId: string): string {
  return path.join(dataDir, "workspaces", runId);
}

/** Removes a run's workspace directory on this node and the checkpoint marker beside it. */
export async function removeRunWorkspace(workspaceDir: string): Promise<void> {
  await rm(workspaceDir, { recursive: true, force: true });
  await rm(checkpointMarkerOf(workspaceDir), { force: true });
}

/**
 * Makes `workspaceDir` ready for a turn of `run`; the turn's failure code when it
 * cannot be. A run that moved here from another node gets its workspace back from the
 * checkpoint: a store that cannot be read now may answer later (retryable); a
 * checkpoint that is gone or cannot be extracted will not come back. With `verify` (an
 * actor's first turn with tools), a directory this node kept from an earlier time it held
 * the run is used only if it is still the run's latest checkpoint; otherwise it is
 * replaced by that checkpoint (another node saved the run since).
 */
export async function prepareRunWorkspace(
  r: { checkpoints: Pick<WorkspaceCheckpoints, "restore" | "matches">; sandbox: Pick<Sandbox, "prepareWorkspace">; log: Logger },
  run: RunDoc,
  workspaceDir: string,
  verify = false,
): Promise<Extract<TurnErrorCode, "sandbox_snapshot_activation_failed" | "sandbox_snapshot_unavailable" | "sandbox_operation_failed"> | null> {
  let present = existsSync(workspaceDir);
  if (run.checkpointed && present && verify) {
    try {
      if (!(await r.checkpoints.matches(run._id, workspaceDir))) {
        r.log.info({ run_id: run._id }, "the workspace kept on this node is older than the run's checkpoint: restoring the checkpoint");
        await rm(workspaceDir, { recursive: true, force: true });
        present = false;
      }
    } catch (err) {
      r.log.error({ err, run_id: run._id }, "could not check the run's workspace against its checkpoint");
      return "sandbox_snapshot_activation_failed";
    }
  }
  if (run.checkpointed && !present) {
    let code: "sandbox_snapshot_activation_failed" | "sandbox_snapshot_unavailable" | undefined;
    try {
      if (!(await r.checkpoints.restore(run._id, workspaceDir, run.workspace_id))) code = "sandbox_snapshot_unavailable";
    } catch (err) {
      r.log.error({ err, run_id: run._id }, "could not restore the run's workspace");
      code = err instanceof CheckpointCorruptError ? "sandbox_snapshot_unavailable" : "sandbox_snapshot_activation_failed";
    }
    if (code) {
      // Nothing half-restored is left to pass for the workspace on the next try.
      await rm(workspaceDir, { recursive: true, force: true });
      return code;
    }
  }
  // Searchable, not listable, for the sandbox's uid; the workspace itself becomes its own.
  await mkdir(path.dirname(workspaceDir), { recursive: true, mode: 0o711 });
  await mkdir(workspaceDir, { recursive: true, mode: 0o700 });
  try {
    await r.sandbox.prepareWorkspace(workspaceDir);
  } catch (err) {
    r.log.error({ err, run_id: run._id }, "could not prepare the run's workspace for its sandbox");
    return "sandbox_operation_failed";
  }
  return null;
}
