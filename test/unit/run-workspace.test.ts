import test from "ava";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readdir, readFile, rm, symlink, utimes, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { errors as natsErrors } from "@nats-io/transport-node";
import pino from "pino";
import { CheckpointError, CheckpointNoRoomError, checkpointMarkerOf } from "../../actors/checkpoints.js";
import { prepareRunWorkspace, removeRunWorkspace, sweepKeptWorkspaces } from "../../actors/run-workspace.js";
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

/** The fakes' checkpoint: revision 7 when the kept directory is it, 9 (newer) when it is not. */
function resources(matches: () => Promise<boolean>) {
  const calls = { matches: 0, restores: 0, pauses: [] as number[] };
  return {
    calls,
    r: {
      clock: { sleep: async (ms: number) => void calls.pauses.push(ms) },
      checkpoints: {
        matches: async () => {
          calls.matches++;
          const current = await matches();
          return { current, revision: current ? 7 : 9 };
        },
        restore: async (_runId: string, dir: string) => {
          calls.restores++;
          await mkdir(dir, { recursive: true });
          await writeFile(path.join(dir, "note.txt"), "restored");
          return 9;
        },
      },
      sandbox: { prepareWorkspace: async () => undefined, closeWorkspacesFolder: async () => undefined, hostDiskLow: async () => false, roomFor: async () => true, watchDisk: () => () => undefined },
      log: pino({ level: "silent" }),
    },
  };
}

test("run-workspace - a kept directory that is the latest checkpoint is used as it is", async (t) => {
  const dir = await kept(t);
  const { r, calls } = resources(async () => true);
  t.deepEqual(await prepareRunWorkspace(r, run, dir, true), { failure: null, revision: 7 }, "the next save expects the checkpoint checked");
  t.deepEqual(calls, { matches: 1, restores: 0, pauses: [] });
  t.is(await readFile(path.join(dir, "note.txt"), "utf8"), "kept");
});

test("run-workspace - a kept directory older than the checkpoint is replaced by it", async (t) => {
  const dir = await kept(t);
  await writeFile(path.join(dir, "stale-only.txt"), "x");
  const { r, calls } = resources(async () => false);
  t.deepEqual(await prepareRunWorkspace(r, run, dir, true), { failure: null, revision: 9 }, "the next save expects the checkpoint restored");
  t.deepEqual(calls, { matches: 1, restores: 1, pauses: [] });
  t.is(await readFile(path.join(dir, "note.txt"), "utf8"), "restored");
  t.false(existsSync(path.join(dir, "stale-only.txt")), "nothing of the old directory is left");
});

test("run-workspace - a check that cannot be made fails the turn retryably and leaves the directory; without verify nothing is checked", async (t) => {
  const dir = await kept(t);
  const failing = resources(async () => {
    throw new CheckpointError("the object store is away");
  });
  t.deepEqual(await prepareRunWorkspace(failing.r, run, dir, true), { failure: "sandbox_snapshot_activation_failed" });
  t.is(failing.calls.restores, 0);
  t.is(await readFile(path.join(dir, "note.txt"), "utf8"), "kept");

  const unchecked = resources(async () => false);
  t.deepEqual(await prepareRunWorkspace(unchecked.r, run, dir, false), { failure: null, revision: undefined }, "the actor keeps the revision it knows");
  t.deepEqual(unchecked.calls, { matches: 0, restores: 0, pauses: [] }, "an actor that prepared it already does not ask again");

  // A run never saved: nothing to check; its first save expects none stored.
  const fresh = resources(async () => false);
  t.deepEqual(await prepareRunWorkspace(fresh.r, { ...run, checkpointed: false }, dir, true), { failure: null, revision: 0 });
  t.deepEqual(fresh.calls, { matches: 0, restores: 0, pauses: [] });
});

test("run-workspace - an object store that fails for a moment is asked again (the check and the restore); a lasting failure, after five attempts, or any other at once, fails the turn", async (t) => {
  const transient = () => new CheckpointError("could not look up the workspace", { cause: new natsErrors.TimeoutError() });
  const dir = await kept(t);
  let failures = 2;
  const flaky = resources(async () => {
    if (failures-- > 0) throw transient();
    return false;
  });
  t.deepEqual(await prepareRunWorkspace(flaky.r, run, dir, true), { failure: null, revision: 9 }, "checked on the third attempt, then restored");
  t.deepEqual(flaky.calls, { matches: 3, restores: 1, pauses: [200, 400] });
  t.is(await readFile(path.join(dir, "note.txt"), "utf8"), "restored");

  // A restore that fails for a moment (the directory gone, as on a node new to the run).
  await rm(dir, { recursive: true, force: true });
  const restoring = resources(async () => true);
  let restoreFailures = 1;
  const restore = restoring.r.checkpoints.restore;
  restoring.r.checkpoints.restore = async (...args: Parameters<typeof restore>) => {
    if (restoreFailures-- > 0) throw transient();
    return restore(...args);
  };
  t.deepEqual(await prepareRunWorkspace(restoring.r, run, dir, true), { failure: null, revision: 9 });
  t.deepEqual(restoring.calls.pauses, [200]);

  const away = resources(async () => {
    throw transient();
  });
  t.deepEqual(await prepareRunWorkspace(away.r, run, dir, true), { failure: "sandbox_snapshot_activation_failed" });
  t.deepEqual(away.calls, { matches: 5, restores: 0, pauses: [200, 400, 800, 1600] });

  const broken = resources(async () => {
    throw new CheckpointError("the object store answered garbage", { cause: new Error("bad") });
  });
  t.deepEqual(await prepareRunWorkspace(broken.r, run, dir, true), { failure: "sandbox_snapshot_activation_failed" });
  t.deepEqual(broken.calls, { matches: 1, restores: 0, pauses: [] }, "not a moment's failure: not asked again");
});

test("run-workspace - a node below its disk reserve restores nothing: the turn fails retryably (sandbox_capacity_exceeded) and the checkpoint is not read", async (t) => {
  const dir = await kept(t);
  await removeRunWorkspace(dir);
  const { r, calls } = resources(async () => true);
  const asked: string[] = [];
  const short = { ...r, sandbox: { ...r.sandbox, hostDiskLow: async (at: string) => (asked.push(at), true) } };
  t.deepEqual(await prepareRunWorkspace(short, run, dir, true), { failure: "sandbox_capacity_exceeded" });
  t.deepEqual(asked, [path.dirname(dir)], "the workspaces' filesystem is the one asked about");
  t.is(calls.restores, 0);
  t.false(existsSync(dir));
  // A kept directory that is current needs no room: it is used.
  const keptAgain = await kept(t);
  t.deepEqual(await prepareRunWorkspace(short, run, keptAgain, true), { failure: null, revision: 7 });
});

test("run-workspace - a restore under way when the node falls below its reserve is stopped: retryable (sandbox_capacity_exceeded), nothing of it left, the watch ended", async (t) => {
  const dir = await kept(t);
  await removeRunWorkspace(dir);
  const { r } = resources(async () => true);
  let watching = 0;
  const restores: AbortSignal[] = [];
  const filling = {
    ...r,
    sandbox: {
      ...r.sandbox,
      // The node becomes short 20 ms into the restore.
      watchDisk: (_dir: string, short: () => void) => {
        watching++;
        const timer = setTimeout(short, 20);
        return () => {
          watching--;
          clearTimeout(timer);
        };
      },
    },
    checkpoints: {
      ...r.checkpoints,
      restore: async (_runId: string, into: string, _ws?: string, room?: { stop?: AbortSignal }) => {
        const noRoom = room!.stop!;
        restores.push(noRoom);
        await mkdir(into, { recursive: true });
        await writeFile(path.join(into, "half.bin"), "half written");
        await new Promise((resolve) => noRoom.addEventListener("abort", resolve, { once: true }));
        throw new CheckpointNoRoomError("no room");
      },
    },
  };
  t.deepEqual(await prepareRunWorkspace(filling, run, dir, true), { failure: "sandbox_capacity_exceeded" });
  t.is(restores.length, 1, "not a moment's failure: not asked again");
  t.true(restores[0]!.aborted);
  t.false(existsSync(dir), "nothing half-restored is left");
  t.is(watching, 0, "the disk's watch ended with the restore");

  // A restore that ends well ends its watch too.
  const { r: fine } = resources(async () => true);
  const watched = { ...fine, sandbox: { ...fine.sandbox, watchDisk: filling.sandbox.watchDisk } };
  t.deepEqual(await prepareRunWorkspace(watched, run, dir, true), { failure: null, revision: 9 });
  t.is(watching, 0);
});

test("run-workspace - removing a run's workspace removes its marker too", async (t) => {
  const dir = await kept(t);
  await removeRunWorkspace(dir);
  t.false(existsSync(dir));
  t.false(existsSync(checkpointMarkerOf(dir)));
  await t.notThrowsAsync(removeRunWorkspace(dir), "absent already");
});

/** A data folder with kept workspaces: each run's directory (a file in it) and marker, last saved `ageMs` ago. */
async function dataDirWith(t: { teardown(fn: () => Promise<void>): void }, runs: Record<string, number>, nowMs: number): Promise<string> {
  const dataDir = await mkdtemp(path.join(os.tmpdir(), "runs-test-workspace-"));
  t.teardown(() => rm(dataDir, { recursive: true, force: true }));
  for (const [runId, ageMs] of Object.entries(runs)) {
    const dir = path.join(dataDir, "workspaces", runId);
    await mkdir(path.join(dir, "sub"), { recursive: true });
    await writeFile(path.join(dir, "sub", "note.txt"), runId);
    await writeFile(checkpointMarkerOf(dir), "nuid");
    const at = new Date(nowMs - ageMs);
    await utimes(checkpointMarkerOf(dir), at, at);
    await utimes(dir, at, at);
  }
  return dataDir;
}

test("run-workspace - kept workspaces of runs this node no longer holds are removed once old; held or recent ones stay", async (t) => {
  const now = Date.now();
  const hour = 3_600_000;
  const dataDir = await dataDirWith(t, { run_held: 2 * hour, run_moved: 2 * hour, run_recent: 60_000 }, now);
  const root = path.join(dataDir, "workspaces");
  // A marker whose directory is gone (a failed restore removed it), and a crash's leftover trash.
  await writeFile(path.join(root, "run_orphan.checkpoint"), "nuid");
  await utimes(path.join(root, "run_orphan.checkpoint"), new Date(now - 2 * hour), new Date(now - 2 * hour));
  await mkdir(path.join(root, ".trash", "run_old-1"), { recursive: true });
  const removed = await sweepKeptWorkspaces(dataDir, (runId) => runId === "run_held", { nowMs: now, olderThanMs: hour });
  t.deepEqual(removed, { removed: 2, failed: 0 });
  t.deepEqual((await readdir(root)).sort(), ["run_held", "run_held.checkpoint", "run_recent", "run_recent.checkpoint"]);
  t.is(await readFile(path.join(root, "run_held", "sub", "note.txt"), "utf8"), "run_held");
  // Nothing to do: nothing more removed; no workspaces folder at all is no error.
  t.deepEqual(await sweepKeptWorkspaces(dataDir, (runId) => runId === "run_held", { nowMs: now, olderThanMs: hour }), { removed: 0, failed: 0 });
  t.deepEqual(await sweepKeptWorkspaces(path.join(dataDir, "nowhere"), () => false, { nowMs: now, olderThanMs: 0 }), { removed: 0, failed: 0 });
});

test("run-workspace - a run this node comes to hold while the sweep looks is asked about again, right before its directory is moved", async (t) => {
  const now = Date.now();
  const dataDir = await dataDirWith(t, { run_claimed: 10 * 3_600_000 }, now);
  const asked: string[] = [];
  // Not held when the sweep lists it; held (an actor is starting) by the time it would move it.
  const removed = await sweepKeptWorkspaces(dataDir, (runId) => asked.push(runId) > 1, { nowMs: now, olderThanMs: 0 });
  t.deepEqual(removed, { removed: 0, failed: 0 });
  t.deepEqual(asked, ["run_claimed", "run_claimed"]);
  t.true(existsSync(path.join(dataDir, "workspaces", "run_claimed", "sub", "note.txt")));
  t.true(existsSync(checkpointMarkerOf(path.join(dataDir, "workspaces", "run_claimed"))));
});

test("run-workspace - a kept directory's age counts from its last use: preparing it for a turn makes it young again, whatever its last save", async (t) => {
  const hour = 3_600_000;
  const dir = await kept(t);
  const dataDir = path.dirname(path.dirname(dir));
  const old = new Date(Date.now() - 10 * hour);
  await utimes(checkpointMarkerOf(dir), old, old);
  await utimes(dir, old, old);
  const { r } = resources(async () => true);
  t.is((await prepareRunWorkspace(r, run, dir, true)).failure, null);
  // Not held any more (the run moved on), but used just now: kept.
  t.deepEqual(await sweepKeptWorkspaces(dataDir, () => false, { nowMs: Date.now(), olderThanMs: hour }), { removed: 0, failed: 0 });
  t.true(existsSync(path.join(dir, "note.txt")));
  t.deepEqual(await sweepKeptWorkspaces(dataDir, () => false, { nowMs: Date.now() + 2 * hour, olderThanMs: hour }), { removed: 1, failed: 0 });
  t.false(existsSync(dir));
});

test("run-workspace - one sweep looks at no more directories than its limit; the next goes on", async (t) => {
  const now = Date.now();
  const dataDir = await dataDirWith(t, { run_a: 5 * 3_600_000, run_b: 5 * 3_600_000, run_c: 5 * 3_600_000, run_held: 5 * 3_600_000 }, now);
  const holds = (runId: string) => runId === "run_held";
  t.deepEqual(await sweepKeptWorkspaces(dataDir, holds, { nowMs: now, olderThanMs: 0, limit: 2 }), { removed: 2, failed: 0 });
  t.deepEqual(await sweepKeptWorkspaces(dataDir, holds, { nowMs: now, olderThanMs: 0, limit: 2 }), { removed: 1, failed: 0 });
  t.deepEqual((await readdir(path.join(dataDir, "workspaces"))).sort(), ["run_held", "run_held.checkpoint"]);
});

test("run-workspace - one sweep removes no more directories than its cap; the rest go at the next", async (t) => {
  const now = Date.now();
  const runs = Object.fromEntries(Array.from({ length: 5 }, (_, i) => [`run_old${i}`, 10 * 3_600_000]));
  const dataDir = await dataDirWith(t, runs, now);
  t.deepEqual(await sweepKeptWorkspaces(dataDir, () => false, { nowMs: now, olderThanMs: 0, maxRemovals: 3 }), { removed: 3, failed: 0 });
  t.deepEqual(await sweepKeptWorkspaces(dataDir, () => false, { nowMs: now, olderThanMs: 0, maxRemovals: 3 }), { removed: 2, failed: 0 });
  t.deepEqual(await readdir(path.join(dataDir, "workspaces")), []);
});

test("run-workspace - sweeping a kept workspace whose tools left links to outside files removes the links, never what they point at", async (t) => {
  const now = Date.now();
  const dataDir = await dataDirWith(t, { run_linked: 10 * 3_600_000 }, now);
  const outside = path.join(dataDir, "outside");
  await mkdir(path.join(outside, "dir"), { recursive: true });
  await writeFile(path.join(outside, "secret.txt"), "keep me");
  await writeFile(path.join(outside, "dir", "inner.txt"), "keep me too");
  const dir = path.join(dataDir, "workspaces", "run_linked");
  // What `ln -s` in a tool command could leave (the sandbox sees other paths, the host follows these).
  await symlink(path.join(outside, "secret.txt"), path.join(dir, "file-link"));
  await symlink(path.join(outside, "dir"), path.join(dir, "sub", "dir-link"));
  const old = new Date(now - 10 * 3_600_000);
  await utimes(dir, old, old);
  t.deepEqual(await sweepKeptWorkspaces(dataDir, () => false, { nowMs: now, olderThanMs: 3_600_000 }), { removed: 1, failed: 0 });
  t.false(existsSync(dir));
  t.is(await readFile(path.join(outside, "secret.txt"), "utf8"), "keep me");
  t.is(await readFile(path.join(outside, "dir", "inner.txt"), "utf8"), "keep me too");
});
