/**
 * WorkspaceCheckpoints.restore against an object store stand-in that serves a real archive
 * (made by tar here), whole, cut by a transient failure partway, or as bytes that are not
 * an archive: only the cut is worth reading again, and it leaves no half-restored files.
 */
import test from "ava";
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { ObjectInfo, ObjectStore } from "@nats-io/obj";
import { errors as natsErrors } from "@nats-io/transport-node";
import { archiveBytesOf, CheckpointCorruptError, CheckpointError, CheckpointNoRoomError, EXTRACTED_BYTES_METADATA, extractedBytesOf, isTransientCheckpointFailure, WorkspaceCheckpoints } from "../../actors/checkpoints.js";
import { JetStreamApiError } from "@nats-io/jetstream";
import { ObjectCorruptError } from "../../src/object-read.js";
import { BlobDecryptError } from "../../src/blob-crypto.js";

async function archive(t: { teardown(fn: () => Promise<void>): void }): Promise<{ bytes: Buffer; root: string }> {
  const root = await mkdtemp(path.join(os.tmpdir(), "runs-test-restore-"));
  t.teardown(() => rm(root, { recursive: true, force: true }));
  const src = path.join(root, "src");
  await mkdir(src);
  await writeFile(path.join(src, "note.txt"), "restored");
  // Incompressible, so the archive spans several chunks.
  await writeFile(path.join(src, "blob.bin"), randomBytes(256 * 1024));
  return { bytes: execFileSync("tar", ["-czf", "-", "-C", src, "."]), root };
}

/** Checkpoints over an object store whose object's chunks are `chunks`, then a failure of the read (if any). */
function checkpointsServing(chunks: Buffer[], failure?: Error): WorkspaceCheckpoints {
  const info = { name: "run_1", nuid: "nuid-1", revision: 7, size: chunks.reduce((n, c) => n + c.length, 0), deleted: false } as ObjectInfo;
  const store = { info: async () => info } as unknown as ObjectStore;
  return new WorkspaceCheckpoints(store, async function* () {
    yield* chunks;
    if (failure) throw failure;
  });
}

const chunksOf = (bytes: Buffer, size = 64 * 1024) => Array.from({ length: Math.ceil(bytes.length / size) }, (_, i) => bytes.subarray(i * size, (i + 1) * size));

test("checkpoint restore - whole: extracted, its revision answered", async (t) => {
  const { bytes, root } = await archive(t);
  const dir = path.join(root, "whole");
  t.is(await checkpointsServing(chunksOf(bytes)).restore("run_1", dir), 7);
  t.is(await readFile(path.join(dir, "note.txt"), "utf8"), "restored");
});

test("checkpoint restore - a read cut by a transient failure partway is a CheckpointError (read again) and leaves no directory", async (t) => {
  const { bytes, root } = await archive(t);
  const dir = path.join(root, "cut");
  const chunks = chunksOf(bytes);
  t.true(chunks.length > 2);
  const err = await t.throwsAsync(checkpointsServing(chunks.slice(0, 2), new natsErrors.TimeoutError()).restore("run_1", dir));
  t.true(err instanceof CheckpointError, String(err));
  t.false(err instanceof CheckpointCorruptError);
  t.true((err as CheckpointError).cause instanceof natsErrors.TimeoutError);
  t.false(existsSync(dir), "nothing half-restored is left");
});

test("checkpoint restore - bytes that are not an archive, or a read cut by a failure that is not transient, are CheckpointCorruptError", async (t) => {
  const { bytes, root } = await archive(t);
  await t.throwsAsync(checkpointsServing([randomBytes(4096)]).restore("run_1", path.join(root, "garbage")), { instanceOf: CheckpointCorruptError });
  const cut = checkpointsServing(chunksOf(bytes).slice(0, 1), new ObjectCorruptError("its size or digest does not match"));
  await t.throwsAsync(cut.restore("run_1", path.join(root, "mismatch")), { instanceOf: CheckpointCorruptError });
  // Found before its first chunk (its chunks are not all stored): the same.
  const notWhole = checkpointsServing([], new ObjectCorruptError("0 of its 3 chunks are stored"));
  await t.throwsAsync(notWhole.restore("run_1", path.join(root, "not-whole")), { instanceOf: CheckpointCorruptError });
  t.false(existsSync(path.join(root, "not-whole")));
});

test("checkpoint restore - JetStream refusing the read partway (4xx) is a CheckpointError, not asked again, and says nothing of the checkpoint", async (t) => {
  const { bytes, root } = await archive(t);
  const refusal = new JetStreamApiError({ code: 400, err_code: 10026, description: "maximum consumers limit reached" });
  const err = await t.throwsAsync(checkpointsServing(chunksOf(bytes).slice(0, 2), refusal).restore("run_1", path.join(root, "refused")));
  t.true(err instanceof CheckpointError && !(err instanceof CheckpointCorruptError), String(err));
  t.false(isTransientCheckpointFailure(err), "not a moment's failure: not asked again (the turn fails retryably)");
  t.false(existsSync(path.join(root, "refused")));
});

test("checkpoint restore - an object sealed with a key this service does not hold is not called corrupt (the keyring's matter); one that cannot be opened is", async (t) => {
  const { bytes, root } = await archive(t);
  const keyless = checkpointsServing(chunksOf(bytes).slice(0, 1), new BlobDecryptError("The stored object was sealed with key id 9, which this service does not hold."));
  const err = await t.throwsAsync(keyless.restore("run_1", path.join(root, "keyless")));
  t.true(err instanceof CheckpointError && !(err instanceof CheckpointCorruptError), String(err));
  t.false(existsSync(path.join(root, "keyless")));
  const cutOff = checkpointsServing(chunksOf(bytes).slice(0, 1), new BlobDecryptError("The stored object is cut off."));
  await t.throwsAsync(cutOff.restore("run_1", path.join(root, "cut-off")), { instanceOf: CheckpointCorruptError });
});

test("checkpoint restore - the archive's size is read from tar's totals line only as the last line it printed, so a tenant's file name in a warning cannot pass for it", (t) => {
  t.is(archiveBytesOf("Total bytes written: 3112960 (3.0MiB, 67MiB/s)\n"), 3_112_960);
  t.is(archiveBytesOf("tar: ./sock: socket ignored\nTotal bytes written: 10240 (10KiB, 8.1MiB/s)\n"), 10_240);
  t.is(archiveBytesOf("Total bytes written: 10240 (10KiB, 8.1MiB/s)"), 10_240, "the stream's end without its line break");
  // tar escapes line breaks in names, so a name never starts a line; nor can it follow the totals.
  t.is(archiveBytesOf("tar: ./Total bytes written: 1 (x): socket ignored\n"), undefined);
  t.is(archiveBytesOf("Total bytes written: 99 (x)\ntar: ./a: file changed as we read it\n"), undefined);
  t.is(archiveBytesOf("Total bytes written: 99999999999999999999 (x)\n"), undefined, "not a safe integer");
  t.is(archiveBytesOf(""), undefined);
});

test("checkpoint restore - the room a checkpoint asks for is what its archive takes extracted, never less than what is stored; without the figure (saved before it was kept, or unreadable), its stored size", (t) => {
  const info = (metadata?: Record<string, string>) => ({ size: 1_000, metadata }) as ObjectInfo;
  t.is(extractedBytesOf(info({ [EXTRACTED_BYTES_METADATA]: "25165824" })), 25_165_824);
  t.is(extractedBytesOf(info({ [EXTRACTED_BYTES_METADATA]: "10" })), 1_000);
  t.is(extractedBytesOf(info()), 1_000);
  t.is(extractedBytesOf(info({})), 1_000);
  for (const bad of ["", "-5", "1e9", "12.5", " 12", "99999999999999999"]) t.is(extractedBytesOf(info({ [EXTRACTED_BYTES_METADATA]: bad })), 1_000, bad);
});

test("checkpoint restore - a checkpoint whose archive alone does not fit above the node's reserve is not read: no room, nothing made", async (t) => {
  const { bytes, root } = await archive(t);
  const asked: number[] = [];
  let reads = 0;
  const info = { name: "run_1", nuid: "nuid-1", revision: 7, size: bytes.length, chunks: 1, deleted: false } as ObjectInfo;
  const checkpoints = new WorkspaceCheckpoints({ info: async () => info } as unknown as ObjectStore, async function* () {
    reads++;
    yield bytes;
  });
  const fits = (room: boolean) => async (size: number) => (asked.push(size), room);
  await t.throwsAsync(checkpoints.restore("run_1", path.join(root, "no-room"), "", { fits: fits(false) }), { instanceOf: CheckpointNoRoomError });
  t.deepEqual(asked, [bytes.length], "asked about the archive's size");
  t.is(reads, 0, "nothing of it was read");
  t.false(existsSync(path.join(root, "no-room")));
  t.is(await checkpoints.restore("run_1", path.join(root, "room"), "", { fits: fits(true) }), 7);
  t.is(reads, 1);
});

test.serial("checkpoint restore - tar killed partway (as the OOM killer would) is the node's failure, not a checkpoint that cannot be extracted", async (t) => {
  const { bytes, root } = await archive(t);
  const chunks = chunksOf(bytes);
  t.true(chunks.length > 2);
  const info = { name: "run_1", nuid: "nuid-1", revision: 7, size: bytes.length, chunks: chunks.length, deleted: false } as ObjectInfo;
  const checkpoints = new WorkspaceCheckpoints({ info: async () => info } as unknown as ObjectStore, async function* () {
    yield chunks[0]!;
    // This process's tar, the one extracting (serial: no other test of this file has a tar then).
    execFileSync("pkill", ["-KILL", "-P", String(process.pid), "-x", "tar"]);
    await new Promise((resolve) => setTimeout(resolve, 200));
    yield* chunks.slice(1);
  });
  const err = await t.throwsAsync(checkpoints.restore("run_1", path.join(root, "killed")));
  t.true(err instanceof CheckpointError && !(err instanceof CheckpointCorruptError), String(err));
  t.regex(String((err as CheckpointError).cause), /tar exited null/);
  t.false(existsSync(path.join(root, "killed")), "nothing half-restored is left");
});
