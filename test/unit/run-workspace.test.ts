import test from "ava";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import pino from "pino";
import { CheckpointError, checkpointMarkerOf } from "../../actors/checkpoints.js";
import { prepareRunWorkspace, removeRunWorkspace } from "../../actors/run-workspace.js";
import type { RunDoc } from "../../src/index.js";

/**
 * prepareRunWorkspace with a kept directory: used as it is when it is the run's latest
 * checkpoint, replaced by the checkpoint when it is not, and a turn failure (retryable)
 * with the directory left alone when the check cannot be made. Fakes for the object store.
 */
const run = { _id: "run_unitworkspace0000001", workspace_id: "ws_unit", checkpointed: true } as RunDoc;

async function kept(t: { teardown(fn: () => Promise<void>): void }): Promise<string> {
  const root = await mkdtemp(path.join(os.tmpdir(), "runs-test-workspace-"));
  t.teardown(() => rm(root, { recursive: true, force: true }));
  const dir = path.join(root, "workspaces", run._id);
  await mkdir(dir, { recursive: true });
  await writeFile(path.join(dir, "note.txt"), "kept");
  await writeFile(checkpointMarkerOf(dir), "nuid-kept");
  return dir;
}

function resources(matches: () => Promise<boolean>) {
  const calls = { matches: 0, restores: 0 };
  return {
    calls,
    r: {
      checkpoints: {
        matches: async () => {
          calls.matches++;
          return matches();
        },
        restore: async (_runId: string, dir: string) => {
          calls.restores++;
          await mkdir(dir, { recursive: true });
          await writeFile(path.join(dir, "note.txt"), "restored");
          return true;
        },
      },
      sandbox: { prepareWorkspace: async () => undefined },
      log: pino({ level: "silent" }),
    },
  };
}

test("run-workspace - a kept directory that is the latest checkpoint is used as it is", async (t) => {
  const dir = await kept(t);
  const { r, calls } = resources(async () => true);
  t.is(await prepareRunWorkspace(r, run, dir, true), null);
  t.deepEqual(calls, { matches: 1, restores: 0 });
  t.is(await readFile(path.join(dir, "note.txt"), "utf8"), "kept");
});

test("run-workspace - a kept directory older than the checkpoint is replaced by it", async (t) => {
  const dir = await kept(t);
  await writeFile(path.join(dir, "stale-only.txt"), "x");
  const { r, calls } = resources(async () => false);
  t.is(await prepareRunWorkspace(r, run, dir, true), null);
  t.deepEqual(calls, { matches: 1, restores: 1 });
  t.is(await readFile(path.join(dir, "note.txt"), "utf8"), "restored");
  t.false(existsSync(path.join(dir, "stale-only.txt")), "nothing of the old directory is left");
});

test("run-workspace - a check that cannot be made fails the turn retryably and leaves the directory; without verify nothing is checked", async (t) => {
  const dir = await kept(t);
  const failing = resources(async () => {
    throw new CheckpointError("the object store is away");
  });
  t.is(await prepareRunWorkspace(failing.r, run, dir, true), "sandbox_snapshot_activation_failed");
  t.is(failing.calls.restores, 0);
  t.is(await readFile(path.join(dir, "note.txt"), "utf8"), "kept");

  const unchecked = resources(async () => false);
  t.is(await prepareRunWorkspace(unchecked.r, run, dir, false), null);
  t.deepEqual(unchecked.calls, { matches: 0, restores: 0 }, "an actor that prepared it already does not ask again");
});

test("run-workspace - removing a run's workspace removes its marker too", async (t) => {
  const dir = await kept(t);
  await removeRunWorkspace(dir);
  t.false(existsSync(dir));
  t.false(existsSync(checkpointMarkerOf(dir)));
  await t.notThrowsAsync(removeRunWorkspace(dir), "absent already");
});
