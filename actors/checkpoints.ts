import { spawn, type ChildProcess } from "node:child_process";
import { mkdir, readdir, readFile, writeFile } from "node:fs/promises";
import type { ObjectInfo, ObjectStore } from "@nats-io/obj";
import { removeTree, reopenTree } from "./sandbox-host.js";
import { BlobDecryptError, type BlobKeyring, drained, type ObjectChunkReader, ObjectCorruptError, isCasConflict, isSealedBlob, isTransientFailure, openBlob, sealBlob, toStream } from "../src/index.js";

/** A workspace checkpoint could not be written or read. */
export class CheckpointError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "CheckpointError";
  }
}

/**
 * The run's checkpoint was saved by another actor since this one last read or saved it:
 * nothing was stored. `current` is the revision stored now (0: none).
 */
export class CheckpointConflictError extends CheckpointError {
  constructor(
    runId: string,
    readonly current: number,
  ) {
    super(`the checkpoint of ${runId} was saved by another owner since it was read`);
    this.name = "CheckpointConflictError";
  }
}

/** A workspace a checkpoint could not restore (a path past PATH_MAX): not saved; its message is the turn's to show. */
export class CheckpointUnrestorableError extends CheckpointError {
  constructor(message: string) {
    super(message);
    this.name = "CheckpointUnrestorableError";
  }
}

/** A failure of the object store for a moment (a JetStream timeout, a server restarting): worth asking again. */
export function isTransientCheckpointFailure(err: unknown): boolean {
  // A restore stopped for want of room is not retried, whatever else failed with it.
  return err instanceof CheckpointError && !(err instanceof CheckpointNoRoomError) && isTransientFailure(err.cause);
}

/**
 * A restore stopped because the node's disk is full or below its reserve: the checkpoint
 * itself is fine, and another node, or this one later, can restore it.
 */
export class CheckpointNoRoomError extends CheckpointError {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "CheckpointNoRoomError";
  }
}

/** A checkpoint was read but is not an archive that can be extracted. */
export class CheckpointCorruptError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "CheckpointCorruptError";
  }
}

/**
 * tar's words (C locale) for a disk that is full, or a quota that is spent: the end of one
 * of its lines, after its colon (a tenant's file name in a message cannot end a line: tar
 * escapes line breaks in names).
 */
const NO_ROOM = /: (?:No space left on device|Disk quota exceeded)$/m;

/**
 * gzip's and tar's words (C locale) for an archive they cannot read, each a whole line of
 * their own (after runTar's "tar exited N: " on the first): a member's name, which tar
 * prints after "./", cannot pass for one.
 */
const BAD_ARCHIVE =
  /^(?:tar exited \d+: )?(?:gzip: stdin: (?:not in gzip format|unexpected end of file|invalid compressed data--(?:format violated|crc error|length error)|crc error|length error)|tar: (?:This does not look like a tar archive|Skipping to next header|Unexpected EOF in archive|Damaged tar archive))$/m;

/**
 * Whether a restore's failure says the checkpoint itself is bad, so no read of it will do:
 * what was read is not the object, cannot be opened with a key this service holds, or is
 * not an archive tar can extract.
 */
function checkpointIsBad(err: unknown): boolean {
  if (err instanceof ObjectCorruptError) return true;
  // A key the service does not hold is its keyring's matter (RUNS_MASTER_KEY), not the checkpoint's.
  if (err instanceof BlobDecryptError) return !/which this service does not hold/.test(err.message);
  return err instanceof CheckpointError && BAD_ARCHIVE.test(err.message);
}

/** Where `tar` reads or writes the archive: its stdout to read, its stdin to feed. */
function runTar(args: string[], stdin: "pipe" | "ignore"): { child: ChildProcess; done: Promise<void>; lastWords: () => string } {
  // The C locale: its messages are read ("Permission denied"), whatever the service's LANG.
  const child = spawn("tar", args, { stdio: [stdin, stdin === "ignore" ? "pipe" : "ignore", "pipe"], env: { ...process.env, LC_ALL: "C" } });
  let err = "";
  // The end of what it said, however much came before (its warnings name a tenant's files).
  let tail = "";
  child.stderr!.on("data", (d: Buffer) => {
    const text = d.toString();
    if (err.length < 4_000) err += text.slice(0, 4_000 - err.length);
    tail = (tail + text).slice(-TAIL_CHARS);
  });
  const done = new Promise<void>((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (code) => (code === 0 ? resolve() : reject(new CheckpointError(`tar exited ${code}: ${err.trim()}`))));
  });
  return { child, done, lastWords: () => tail };
}

/** How much of the end of tar's stderr is kept: more than its totals line. */
const TAIL_CHARS = 512;

/**
 * The archive's size as tar wrote it, before compression (`--totals`: "Total bytes written:
 * N (…)"), from the last line tar printed; undefined when that line is not there. It is
 * printed as tar exits, after every warning: a tenant's file name cannot come after it.
 */
export function archiveBytesOf(lastWords: string): number | undefined {
  const match = /(?:^|\n)Total bytes written: (\d+) \([^\n]*\)\n?$/.exec(lastWords);
  const bytes = Number(match?.[1]);
  return match && Number.isSafeInteger(bytes) ? bytes : undefined;
}

/**
 * The object metadata that holds what a checkpoint's archive takes once extracted (its size
 * before compression); checkpoints saved before it was kept have none.
 */
export const EXTRACTED_BYTES_METADATA = "runs-extracted-bytes";

/**
 * An estimate of what restoring the checkpoint takes on disk: its archive's size before
 * compression (file contents padded to 512 bytes, a 512-byte header per entry; sparse files'
 * holes take nothing either way), never less than its stored size; saved before that was
 * kept, its stored size. Files of many blocks take about that; a tree of tiny entries takes
 * more (a 4 KiB block for a folder or a long link's target against 512 bytes of header: up
 * to 8 times), many names of one file less (its data once, a header per name). The
 * restore's watch of the node's disk is the bound that holds.
 */
export function extractedBytesOf(info: Pick<ObjectInfo, "size" | "metadata">): number {
  const kept = info.metadata?.[EXTRACTED_BYTES_METADATA];
  const bytes = kept !== undefined && /^\d{1,16}$/.test(kept) ? Number(kept) : NaN;
  return Number.isSafeInteger(bytes) ? Math.max(bytes, info.size) : info.size;
}

/**
 * The first name below `dir` that tar could archive but not extract (PATH_MAX), as tar
 * names it (`./…`, as bytes in a latin1 string), or undefined. find(1) walks by
 * descriptors, off the event loop, and stops at the first; in the C locale each `?` of its
 * pattern is one byte (a glob: a regular expression costs seconds per thousand long
 * paths). Throws when find fails without an answer (a folder it could not read: the
 * caller opens the tree and asks again), so a tree it did not see whole is never passed.
 */
async function unrestorableName(dir: string): Promise<string | undefined> {
  const pattern = `${"?".repeat(RESTORABLE_NAME_BYTES)}*`;
  return new Promise<string | undefined>((resolve, reject) => {
    const child = spawn("find", [".", "-path", pattern, "-print", "-quit"], { cwd: dir, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, LC_ALL: "C" } });
    let out = "";
    let err = "";
    child.stdout.on("data", (d: Buffer) => {
      if (out.length < 16_384) out += d.toString("latin1");
    });
    child.stderr.on("data", (d: Buffer) => {
      if (err.length < 1_000) err += d.toString().slice(0, 1_000 - err.length);
    });
    child.on("error", (e) => reject(new CheckpointError(`could not check the workspace's paths: ${e.message}`, { cause: e })));
    child.on("close", (code) => {
      if (out) resolve(out.replace(/\n$/, ""));
      else if (code === 0) resolve(undefined);
      else reject(new CheckpointError(`could not check the workspace's paths: find exited ${code}: ${err.trim()}`));
    });
  });
}

/** Throws {@link CheckpointUnrestorableError} when `dir` holds a name tar could not extract. */
async function requireRestorable(dir: string): Promise<void> {
  const name = await unrestorableName(dir);
  if (name === undefined) return;
  const excerpt = Buffer.from(name.slice(2, 42), "latin1").toString("utf8");
  throw new CheckpointUnrestorableError(
    `The workspace holds a path of ${name.length - 2} bytes or more, longer than a checkpoint can restore (at most ${RESTORABLE_NAME_BYTES - 3}), below ${JSON.stringify(excerpt)}: it was not saved, and its last checkpoint is kept. Shorten or remove that path: until then every turn with tools ends so.`,
  );
}

/** Names (`./…`) as long as this (PATH_MAX, the terminating NUL's byte included) tar cannot extract. */
const RESTORABLE_NAME_BYTES = 4_096;

/**
 * `tar`'s output, failing at its end if tar failed (so a bad archive never replaces a good one).
 * Holes stay holes (`--sparse`, GNU tar; extraction keeps them without being told): a command
 * can make files of its whole file size limit that take no disk (`truncate`), and archived in
 * full, as many as it liked, they cost the node minutes of CPU to save and their full size in
 * disk to restore. `onArchived` is told the archive's size before compression once tar has
 * ended well, before the last piece is handed on.
 */
async function* archiveOf(dir: string, onArchived: (bytes: number | undefined) => void): AsyncGenerator<Uint8Array> {
  const { child, done, lastWords } = runTar(["--sparse", "--totals", "-czf", "-", "-C", dir, "."], "ignore");
  try {
    for await (const chunk of child.stdout as AsyncIterable<Buffer>) yield chunk;
    await done;
    // Before the last piece is taken: the object's metadata is written after it.
    onArchived(archiveBytesOf(lastWords()));
  } finally {
    // The store stopped reading (it failed): tar must not linger.
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGKILL");
      await done.catch(() => undefined);
    }
  }
}

/**
 * Beside a workspace directory (outside it: a sandboxed command never sees it), the id of
 * the checkpoint the directory was last saved as or restored from.
 */
export function checkpointMarkerOf(dir: string): string {
  return `${dir}.checkpoint`;
}

/**
 * Best effort: a marker left unwritten (or naming an older checkpoint: each save has a new
 * id) only makes the next check restore the checkpoint, never keep a stale directory.
 */
async function writeMarker(dir: string, nuid: string): Promise<void> {
  await writeFile(checkpointMarkerOf(dir), nuid, { mode: 0o600 }).catch(() => undefined);
}

/**
 * The first piece of `source` and an iterable of all of it (the first piece included);
 * `stop` ends `source` where it is (read to its end or not, and `all` begun or not).
 */
async function peek(source: AsyncGenerator<Uint8Array>): Promise<{ head: Uint8Array; all: AsyncIterable<Uint8Array>; stop: () => Promise<void> }> {
  const first = await source.next();
  const head = first.done ? new Uint8Array(0) : first.value;
  async function* all(): AsyncGenerator<Uint8Array> {
    if (!first.done) yield head;
    for (let next = await source.next(); !next.done; next = await source.next()) yield next.value;
  }
  return { head, all: all(), stop: async () => void (await source.return(undefined)) };
}

/**
 * Run workspaces saved to a JetStream object store after every turn (DESIGN §4), and
 * restored on the node that takes a run over. The object is named by run id; its
 * contents are sealed per workspace (src/blob-crypto.ts) and stream through, never held
 * whole in memory.
 */
/**
 * A checkpoint save that has stored no chunk for this long (as the node purging sees it)
 * has ended (a save streams its archive as it is read from the directory): its chunks no
 * object names are a save that died (src/object-chunks.ts).
 */
export const CHECKPOINT_WRITE_GRACE_MS = 60 * 60_000;

export class WorkspaceCheckpoints {
  constructor(
    private readonly store: ObjectStore,
    /** How a restore reads a checkpoint's chunks (`objectChunkReader` over the store's bucket). */
    private readonly chunks: ObjectChunkReader,
    private readonly keys?: BlobKeyring,
  ) {}

  /**
   * Saves the directory, only over the checkpoint this actor knows: `expected` is the
   * revision it last read or saved (0: none stored). A stale owner, one whose partition
   * moved while it was paused, cannot replace what the new owner saved since: its put is
   * refused with {@link CheckpointConflictError} and nothing is stored. An empty workspace
   * of a run never saved before is skipped (undefined); otherwise the new revision.
   */
  async save(runId: string, dir: string, savedBefore: boolean, workspaceId: string, expected: number): Promise<number | undefined> {
    let entries: string[];
    try {
      entries = await readdir(dir);
    } catch {
      entries = [];
    }
    if (entries.length === 0 && !savedBefore) return undefined;
    // A checkpoint that saves but cannot be restored would replace the last good one, and
    // the run would lose its whole workspace the next time it moves: such a tree is not saved.
    try {
      await requireRestorable(dir);
    } catch (err) {
      if (err instanceof CheckpointUnrestorableError) throw err;
      // find could not read a folder a command closed (`chmod 000`): opened, as below, and asked again.
      await reopenTree(dir);
      await requireRestorable(dir);
    }
    const put = () => {
      // Filled in as the archive ends, before the object's metadata is written: the object
      // store writes this very record then (@nats-io/obj keeps it by reference; a test,
      // `integration › workspace-checkpoints`, reads it back).
      const metadata: Record<string, string> = {};
      const archive = archiveOf(dir, (bytes) => {
        if (bytes !== undefined) metadata[EXTRACTED_BYTES_METADATA] = String(bytes);
      });
      const stored = this.keys ? sealBlob(this.keys.keyFor("checkpoints", workspaceId), this.keys.keyId, archive) : archive;
      // The object's metadata is written last, only if its subject is still at `expected`
      // (JetStream's expected last subject sequence); a refused put's chunks are purged.
      return this.store.put({ name: runId, metadata }, toStream(stored), { previousRevision: expected });
    };
    try {
      let info: Awaited<ReturnType<typeof put>>;
      try {
        info = await put();
      } catch (err) {
        // tar could not read a file or folder a command made unreadable (`chmod 000`): a
        // service sharing the sandboxes' uid gives the tree back to its owner (`u+rwX`, as
        // the disk check does), then saves once more.
        if (!(err instanceof CheckpointError && err.message.includes("Permission denied"))) throw err;
        await reopenTree(dir);
        // What the closed folder held was not looked at above.
        await requireRestorable(dir);
        info = await put();
      }
      await writeMarker(dir, info.nuid);
      return info.revision;
    } catch (err) {
      if (err instanceof CheckpointError) throw err;
      if (isCasConflict(err)) throw new CheckpointConflictError(runId, await this.revision(runId));
      throw new CheckpointError(`could not save the workspace of ${runId}`, { cause: err });
    }
  }

  /** The revision of the run's checkpoint stored now; 0 when none ever was. */
  async revision(runId: string): Promise<number> {
    try {
      return (await this.store.info(runId))?.revision ?? 0;
    } catch (err) {
      throw new CheckpointError(`could not look up the workspace of ${runId}`, { cause: err });
    }
  }

  /**
   * Restores the latest checkpoint into `dir`: its revision, or null when the run has none.
   * One that does not `fit` (what it extracts, {@link extractedBytesOf}, would take the node's
   * disk below its reserve) is not begun; one that finds the disk full, or
   * whose `stop` is aborted (the node's disk fell below its reserve), stops: tar is killed,
   * what it wrote is removed. Both throw {@link CheckpointNoRoomError}.
   */
  async restore(runId: string, dir: string, workspaceId = "", room: { fits?: (bytes: number) => Promise<boolean>; stop?: AbortSignal } = {}): Promise<number | null> {
    let info: ObjectInfo | null;
    let first: Awaited<ReturnType<typeof peek>>;
    try {
      info = await this.store.info(runId);
      if (!info || info.deleted) return null;
      const needed = extractedBytesOf(info);
      if (room.fits && !(await room.fits(needed))) {
        throw new CheckpointNoRoomError(`no room on the node's disk for the ${needed} bytes of the workspace of ${runId}`);
      }
      // Pulled as tar takes it (src/object-read.ts).
      first = await peek(this.chunks(info));
    } catch (err) {
      if (err instanceof CheckpointNoRoomError) throw err;
      if (err instanceof ObjectCorruptError) throw new CheckpointCorruptError(`the checkpoint of ${runId} cannot be read`, { cause: err });
      throw new CheckpointError(`could not read the workspace of ${runId}`, { cause: err });
    }
    try {
      return await this.extract(runId, dir, workspaceId, info, first, room.stop);
    } finally {
      // A restore that stopped early ends the read.
      await first.stop();
    }
  }

  private async extract(
    runId: string,
    dir: string,
    workspaceId: string,
    info: ObjectInfo,
    first: Awaited<ReturnType<typeof peek>>,
    noRoom: AbortSignal | undefined,
  ): Promise<number> {
    // Closed (its parent, the workspaces' folder, too, if it makes it: see closedToOthers).
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const keyFor = (keyId: number) => (this.keys && keyId === this.keys.keyId ? this.keys.keyFor("checkpoints", workspaceId) : undefined);
    // Checkpoints saved before encryption are read as they are.
    const archive = isSealedBlob(first.head) ? openBlob(keyFor, first.all) : first.all;
    const { child, done } = runTar(["-xzf", "-", "-C", dir], "pipe");
    const stdin = child.stdin!;
    stdin.on("error", () => undefined);
    const stopTar = () => child.kill("SIGKILL");
    noRoom?.addEventListener("abort", stopTar, { once: true });
    try {
      if (noRoom?.aborted) stopTar();
      for await (const chunk of archive) {
        // tar ended early (it failed, or was stopped): its exit says why.
        if (stdin.destroyed || noRoom?.aborted) break;
        if (!stdin.write(chunk)) await drained(stdin);
      }
      stdin.end();
      await done;
    } catch (err) {
      stdin.destroy();
      child.kill("SIGKILL");
      await done.catch(() => undefined);
      if (noRoom?.aborted || (err instanceof CheckpointError && NO_ROOM.test(err.message))) {
        await removeTree(dir);
        throw new CheckpointNoRoomError(`no room on the node's disk to restore the workspace of ${runId}`, { cause: err });
      }
      // Read, but not a workspace this service can open: no retry brings it back.
      if (checkpointIsBad(err)) throw new CheckpointCorruptError(`the checkpoint of ${runId} cannot be extracted`, { cause: err });
      // Anything else is not the checkpoint's: the object store stopped answering partway (a
      // NATS server restarting: read again, into an empty directory) or refused the read,
      // or this node failed (tar could not start or was killed, its disk failed, its keys
      // lack the checkpoint's).
      await removeTree(dir);
      throw new CheckpointError(`could not read the workspace of ${runId}`, { cause: err });
    } finally {
      noRoom?.removeEventListener("abort", stopTar);
    }
    await writeMarker(dir, info.nuid);
    return info.revision;
  }

  /**
   * Whether `dir` holds the run's latest checkpoint: it was saved as or restored from it
   * here. A directory kept from an earlier time this node held the run is not, once another
   * node saved the run's workspace since. No checkpoint stored: the directory is all there is.
   * `revision` is the checkpoint's (0: none), what a save over it expects.
   */
  async matches(runId: string, dir: string): Promise<{ current: boolean; revision: number }> {
    const marker = await readFile(checkpointMarkerOf(dir), "utf8").catch(() => null);
    let info: Awaited<ReturnType<ObjectStore["info"]>>;
    try {
      info = await this.store.info(runId);
    } catch (err) {
      throw new CheckpointError(`could not look up the workspace of ${runId}`, { cause: err });
    }
    return { current: info === null || info.deleted || marker === info.nuid, revision: info?.revision ?? 0 };
  }

  /**
   * Removes the run's checkpoint; nothing to do when it has none or it is removed already
   * (the object store answers those without an error). A failure (NATS away) is thrown:
   * the removal is then tried again (actors/run-removal.ts).
   */
  async remove(runId: string): Promise<void> {
    try {
      await this.store.delete(runId);
    } catch (err) {
      throw new CheckpointError(`could not remove the workspace checkpoint of ${runId}`, { cause: err });
    }
  }
}
