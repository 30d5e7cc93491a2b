import { createHash } from "node:crypto";
import type { Readable } from "node:stream";
import type { Collection, Db } from "mongodb";
import type { ObjectStore } from "@nats-io/obj";
import type { Clock } from "./clock.js";
import { BlobKeyring, collect, isSealedBlob, once, openBlob, sealBlob } from "./blob-crypto.js";
import { ApiError } from "./errors.js";
import type { IdSource } from "./ids.js";
import { StoreUnavailableError, findEachById, guard, isDuplicateKey } from "./mongo-guard.js";
import { fromStream, toStream } from "./byte-streams.js";
import { decideUpload, decisionError, type FileUploadDoc, UploadState } from "./upload-decisions.js";

/**
 * Uploaded files (decisions §6): bytes in the JetStream object store `runs_files` under
 * the file id (never the filename), metadata in the Mongo collection `files`, and one
 * upload record per (workspace, Idempotency-Key) in `file_uploads` that carries the
 * spec's idempotency rules for POST /api/v1/files.
 */

export const FILES_COLLECTION = "files";
export const FILE_UPLOADS_COLLECTION = "file_uploads";
/** Objects of upload attempts that no record names any more, deleted by the sweep once no attempt can still write them. */
export const FILE_ORPHANS_COLLECTION = "file_orphans";
/**
 * How long after it is recorded an orphan's object is deleted: past the longest upload
 * (RUNS_UPLOAD_TIME_LIMIT_MS, 20 min by default) and 10 minutes more (a paused node's
 * attempt, clocks apart), so the attempt that wrote it has ended; at least 30 minutes.
 */
export function orphanGraceMs(uploadTimeLimitMs: number): number {
  return Math.max(30 * 60_000, uploadTimeLimitMs + 10 * 60_000);
}
/** Upload records are kept at least this long (decisions §4: at least 24 hours). */
export const UPLOAD_RECORD_KEEP_MS = 48 * 3600_000;
/** Store failures tolerated by a running upload before it stops (spec Limits: about a minute). */
export const UPLOAD_STORE_OUTAGE_MS = 60_000;
const CHUNK_BYTES = 512 * 1024;

export interface FileDoc {
  /** `file_…` */
  _id: string;
  workspace_id: string;
  filename: string;
  media_type: string;
  bytes: number;
  /** Lowercase hex. */
  sha256: string;
  /** Unix milliseconds. */
  created_at: number;
  /** Name of the object in `runs_files` (the file id; never the filename). */
  object_name: string;
  /** Unix milliseconds: the file and its object are removed after this (absent: kept). */
  expires_at?: number;
}

/** Limits of one upload. */
export interface UploadLimits {
  maxFileBytes: number;
  /** Silence after which a repeat takes a running upload over. */
  takeoverMs: number;
  /** Longest an upload attempt may run (then 408 request_timeout). */
  timeLimitMs: number;
}

/** An upload attempt this request owns. */
export interface UploadSession {
  uploadId: string;
  workspaceId: string;
  fileId: string;
  startedAt: number;
}

export type UploadClaim = { kind: "owned"; session: UploadSession } | { kind: "replay"; file: FileDoc };

/** What `receive` stored. */
export interface ReceivedObject {
  bytes: number;
  sha256: string;
}

/** A file's bytes and description, as the agent runner reads them. */
export interface FileContent {
  filename: string;
  media_type: string;
  bytes: number;
  data: Buffer;
}

/** The source stream of an upload failed (client went away, malformed multipart). */
export class UploadSourceError extends Error {
  constructor(cause: unknown) {
    super("the upload's body could not be read", { cause });
    this.name = "UploadSourceError";
  }
}

/** A file document exists but its bytes are gone from the object store. */
export class FileDataMissingError extends Error {
  constructor(readonly fileId: string) {
    super(`The data of ${fileId} is missing.`);
    this.name = "FileDataMissingError";
  }
}


export class FileStore {
  readonly files: Collection<FileDoc>;
  readonly uploads: Collection<FileUploadDoc>;
  private readonly orphans: Collection<{ _id: string; at: number }>;

  constructor(
    db: Db,
    private readonly objects: ObjectStore,
    private readonly clock: Clock,
    private readonly ids: IdSource,
    /** Seals file contents per workspace (src/blob-crypto.ts); without it they are stored in clear. */
    private readonly keys?: BlobKeyring,
  ) {
    this.files = db.collection<FileDoc>(FILES_COLLECTION);
    this.uploads = db.collection<FileUploadDoc>(FILE_UPLOADS_COLLECTION);
    this.orphans = db.collection(FILE_ORPHANS_COLLECTION);
  }

  /** Creates indexes; safe on every start. */
  async provision(): Promise<void> {
    await guard(async () => {
      await this.files.createIndex({ workspace_id: 1, created_at: -1 }, { name: "ws_created" });
      await this.files.createIndex({ expires_at: 1 }, { name: "expires" });
      await this.uploads.createIndex({ expires_at: 1 }, { name: "expires" });
      await this.orphans.createIndex({ at: 1 }, { name: "at" });
    });
  }

  /** The record id of a key: scoped to workspace and operation like other idempotency records. */
  uploadId(workspaceId: string, key: string): string {
    return createHash("sha256").update(`${workspaceId}\u0000files.create\u0000${key}`).digest("hex");
  }

  getUpload(uploadId: string): Promise<FileUploadDoc | null> {
    return guard(() => this.uploads.findOne({ _id: uploadId }));
  }

  /** A file of the workspace; null when absent, expired or another workspace's. */
  async get(workspaceId: string, fileId: string): Promise<FileDoc | null> {
    const doc = await guard(() => this.files.findOne({ _id: fileId, workspace_id: workspaceId }));
    return doc && !(doc.expires_at !== undefined && doc.expires_at <= this.clock.nowMs()) ? doc : null;
  }

  /**
   * Removes what has outlived its retention (the store has no TTL indexes): files past
   * `expires_at` with their objects, upload records past theirs with any object an
   * unfinished attempt left, and the objects of attempts no record names any more once
   * those attempts have surely ended (`uploadTimeLimitMs`: the node's upload time limit).
   * At most `batch` of each per call; safe on every node at once.
   */
  async sweep(nowMs: number, { uploadTimeLimitMs, batch = 200 }: { uploadTimeLimitMs: number; batch?: number }): Promise<{ files: number; uploads: number; orphans: number; failed: number }> {
    // A record goes only once its object is gone: an object whose delete failed (NATS away)
    // is tried again at the next sweep, never left behind without a record that names it.
    let failed = 0;
    const removeEach = async <D>(docs: D[], objectOf: (doc: D) => Promise<string | null>, removeRecord: (doc: D) => Promise<unknown>) => {
      let removed = 0;
      for (const doc of docs) {
        const object = await objectOf(doc);
        if (object !== null && !(await this.deleteObject(object))) {
          failed++;
          continue;
        }
        await guard(() => removeRecord(doc));
        removed++;
      }
      return removed;
    };
    const files = await removeEach(
      await guard(() => this.files.find({ expires_at: { $lte: nowMs } }).limit(batch).toArray()),
      async (file) => file.object_name,
      (file) => this.files.deleteOne({ _id: file._id }),
    );
    const uploads = await removeEach(
      await guard(() => this.uploads.find({ expires_at: { $lte: nowMs } }).limit(batch).toArray()),
      async (upload) => (upload.state === UploadState.done ? null : upload.file_id),
      (upload) => this.uploads.deleteOne({ _id: upload._id, expires_at: upload.expires_at }),
    );
    const orphans = await removeEach(
      await guard(() => this.orphans.find({ at: { $lte: nowMs - orphanGraceMs(uploadTimeLimitMs) } }).limit(batch).toArray()),
      // An attempt recorded as left behind that finished after all (two writers of one
      // record: the store's updates are not atomic) is a file: its object stays with it.
      async (orphan) => ((await guard(() => this.files.findOne({ _id: orphan._id }, { projection: { _id: 1 } }))) ? null : orphan._id),
      (orphan) => this.orphans.deleteOne({ _id: orphan._id }),
    );
    return { files, uploads, orphans, failed };
  }

  /**
   * Deletes an attempt's object; when that fails (NATS away), records it as an orphan for
   * the sweep, since no record may name it afterwards (a repeat's attempt takes the key's
   * record over). Recording it is best effort: with the store away too, it is left.
   */
  private async deleteOrOrphan(name: string): Promise<void> {
    if (!(await this.deleteObject(name))) await this.orphan(name);
  }

  /** Records an object no record will name, for the sweep to delete once its attempt has ended (insert only: a repeat is one record). */
  private async orphan(name: string): Promise<void> {
    // A duplicate is the same record; a store away too leaves the object (best effort).
    await guard(() => this.orphans.insertOne({ _id: name, at: this.clock.nowMs() })).catch(() => undefined);
  }

  /** Deletes an object; whether it is gone (deleting one that is absent already is nothing to do). */
  private async deleteObject(name: string): Promise<boolean> {
    try {
      await this.objects.delete(name);
      return true;
    } catch {
      return false;
    }
  }

  private keyOf(kind: "files", workspaceId: string): (keyId: number) => Uint8Array | undefined {
    return (keyId) => (this.keys && keyId === this.keys.keyId ? this.keys.keyFor(kind, workspaceId) : undefined);
  }

  /** Files of the workspace among `fileIds`, each read by its id (absent, expired or other workspaces' ids are left out). */
  async getMany(workspaceId: string, fileIds: readonly string[]): Promise<FileDoc[]> {
    if (fileIds.length === 0) return [];
    const docs = await findEachById(this.files, fileIds, { workspace_id: workspaceId });
    const now = this.clock.nowMs();
    return docs.filter((doc) => doc.expires_at === undefined || doc.expires_at > now);
  }

  /**
   * A file's bytes for the agent runner, read whole into memory; null when the file is
   * unknown in the workspace. Throws {@link FileDataMissingError} if its object is gone.
   */
  async read(workspaceId: string, fileId: string): Promise<FileContent | null> {
    const doc = await this.get(workspaceId, fileId);
    if (!doc) return null;
    const stored = await this.objects.getBlob(doc.object_name);
    if (!stored) throw new FileDataMissingError(fileId);
    // Files stored before encryption are read as they are.
    const data = isSealedBlob(stored) ? await collect(openBlob(this.keyOf("files", workspaceId), once(stored))) : Buffer.from(stored.buffer, stored.byteOffset, stored.byteLength);
    return { filename: doc.filename, media_type: doc.media_type, bytes: doc.bytes, data };
  }

  /**
   * Takes the key for this request or answers from its record, by {@link decideUpload}:
   * returns an owned attempt (start, restart, takeover) or the finished file; throws
   * upload_in_progress (503) or conflict (409). Races between repeats are settled by
   * conditional writes; a loser decides again on the winner's record.
   */
  async claim(workspaceId: string, key: string, fingerprint: string, takeoverMs: number): Promise<UploadClaim> {
    const uploadId = this.uploadId(workspaceId, key);
    for (let attempt = 0; attempt < 10; attempt++) {
      const record = await this.getUpload(uploadId);
      const now = this.clock.nowMs();
      const decision = decideUpload(record, fingerprint, now, takeoverMs);
      if (decision.kind === "need_fingerprint") throw new Error("unreachable: fingerprint given");
      if (decision.kind === "in_progress" || decision.kind === "conflict") throw decisionError(decision)!;
      const fileId = this.ids.file();
      const fresh = { state: UploadState.uploading, file_id: fileId, fingerprint, heartbeat_at: now, started_at: now };
      if (decision.kind === "replay") {
        const file = await this.get(workspaceId, decision.fileId);
        if (file) return { kind: "replay", file };
        // Done but its document is gone (deleted): nothing to return, the key is spent.
        throw decisionError({ kind: "conflict", reason: "expired" })!;
      }
      if (decision.kind === "start") {
        try {
          await guard(() =>
            this.uploads.insertOne({ _id: uploadId, workspace_id: workspaceId, ...fresh, created_at: now, expires_at: now + UPLOAD_RECORD_KEEP_MS }),
          );
          return { kind: "owned", session: { uploadId, workspaceId, fileId, startedAt: now } };
        } catch (err) {
          if (isDuplicateKey(err)) continue;
          throw err;
        }
      }
      const previous = decision.previous;
      const result = await guard(() =>
        this.uploads.updateOne(
          { _id: uploadId, state: previous.state, file_id: previous.file_id, heartbeat_at: previous.heartbeat_at },
          { $set: { ...fresh, expires_at: now + UPLOAD_RECORD_KEEP_MS } },
        ),
      );
      if (result.matchedCount === 1) {
        // A silent attempt taken over may have stored its object and died before recording
        // it (or may still be writing it), and a failed one's delete may have failed: from
        // here no record names the previous attempt's object.
        await this.orphan(previous.file_id);
        return { kind: "owned", session: { uploadId, workspaceId, fileId, startedAt: now } };
      }
    }
    throw new ApiError("upload_in_progress", { param: "Idempotency-Key", retryAfterS: 1 });
  }

  /**
   * Streams `source` into the object store under the session's file id, hashing and
   * counting as it goes, without holding the file in memory. While bytes arrive it
   * refreshes the record's heartbeat; it stops the upload (destroying `source`) with
   * 413 payload_too_large past `maxFileBytes`, 408 request_timeout past `timeLimitMs`,
   * 409 conflict when a repeat took the key over, and StoreUnavailableError (503
   * runtime_unavailable) when the record cannot be written for about a minute or the
   * object store fails. Errors of `source` itself come back as {@link UploadSourceError}. On any
   * failure the stored chunks are removed; the caller then calls {@link abandon}.
   * `onProgress` is called at each heartbeat that saw new bytes (the gateway refreshes
   * the upload's concurrency slot with it).
   */
  async receive(session: UploadSession, source: Readable, limits: UploadLimits, onProgress?: () => Promise<void>): Promise<ReceivedObject> {
    const hash = createHash("sha256");
    let bytes = 0;
    let beatBytes = 0;
    let lastStoreOk = this.clock.nowMs();
    let stopped: Error | undefined;
    const stop = (error: Error) => {
      if (stopped) return;
      stopped = error;
      source.destroy(error);
    };

    let ticking = false;
    const heartbeatMs = Math.min(5_000, Math.max(100, Math.floor(limits.takeoverMs / 5)));
    const heartbeat = this.clock.every(heartbeatMs, () => {
      if (ticking || stopped) return;
      ticking = true;
      // An ApiError from onProgress (the upload lost its place) stops the upload with it.
      if (bytes !== beatBytes) {
        onProgress?.().catch((err: unknown) => {
          if (err instanceof ApiError) stop(err);
        });
      }
      void this.beat(session, bytes !== beatBytes)
        .then((owned) => {
          lastStoreOk = this.clock.nowMs();
          beatBytes = bytes;
          if (!owned) {
            stop(new ApiError("conflict", { param: "Idempotency-Key", message: "A later request with this Idempotency-Key took the upload over." }));
          }
        })
        .catch((err: unknown) => {
          if (this.clock.nowMs() - lastStoreOk > UPLOAD_STORE_OUTAGE_MS) stop(new StoreUnavailableError(err));
        })
        .finally(() => {
          ticking = false;
        });
    });
    const remainingMs = Math.max(0, session.startedAt + limits.timeLimitMs - this.clock.nowMs());
    const deadline = this.clock.after(remainingMs, () => {
      // Not retryable: the key's upload has expired, and a repeat under it is 409 conflict.
      stop(new ApiError("request_timeout", { retryable: false, message: `A file upload may run at most ${Math.round(limits.timeLimitMs / 1000)} seconds; upload again with a new Idempotency-Key.` }));
    });

    const chunks = source[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        let next: IteratorResult<Buffer>;
        try {
          next = await chunks.next();
        } catch (err) {
          throw stopped ?? new UploadSourceError(err);
        }
        if (stopped) throw stopped;
        if (next.done) {
          controller.close();
          return;
        }
        bytes += next.value.length;
        if (bytes > limits.maxFileBytes) {
          const tooLarge = new ApiError("payload_too_large", { param: "file", message: `A file may be at most ${limits.maxFileBytes} bytes.` });
          stop(tooLarge);
          throw tooLarge;
        }
        hash.update(next.value);
        controller.enqueue(next.value);
      },
      cancel(reason) {
        source.destroy(reason instanceof Error ? reason : undefined);
      },
    });

    try {
      const stored = this.keys ? toStream(sealBlob(this.keys.keyFor("files", session.workspaceId), this.keys.keyId, fromStream(body))) : body;
      await this.objects.put({ name: session.fileId, options: { max_chunk_size: CHUNK_BYTES } }, stored);
    } catch (err) {
      if (stopped) throw stopped;
      if (err instanceof ApiError || err instanceof UploadSourceError) throw err;
      // The object store (JetStream) failed: the gateway answers 503 runtime_unavailable.
      throw new StoreUnavailableError(err);
    } finally {
      heartbeat.cancel();
      deadline.cancel();
    }
    if (stopped) {
      await this.deleteOrOrphan(session.fileId);
      throw stopped;
    }
    return { bytes, sha256: hash.digest("hex") };
  }

  /**
   * Records the received object as the file and marks the key done, fenced on the
   * attempt's file id. If a repeat took the key over meanwhile, removes this attempt's
   * file and object and throws 409 conflict.
   */
  async finish(session: UploadSession, meta: { filename: string; media_type: string }, received: ReceivedObject, retentionMs?: number): Promise<FileDoc> {
    const now = this.clock.nowMs();
    const doc: FileDoc = {
      _id: session.fileId,
      workspace_id: session.workspaceId,
      filename: meta.filename,
      media_type: meta.media_type,
      bytes: received.bytes,
      sha256: received.sha256,
      created_at: now,
      object_name: session.fileId,
      ...(retentionMs !== undefined ? { expires_at: now + retentionMs } : {}),
    };
    // The file document first: a crash before the record says done leaves an orphan
    // document, never a done record pointing at nothing.
    await guard(() => this.files.insertOne(doc));
    const marked = await guard(() =>
      this.uploads.updateOne(
        { _id: session.uploadId, file_id: session.fileId, state: UploadState.uploading },
        { $set: { state: UploadState.done } },
      ),
    );
    if (marked.matchedCount === 1) return doc;
    await guard(() => this.files.deleteOne({ _id: doc._id }));
    await this.deleteOrOrphan(session.fileId);
    throw new ApiError("conflict", { param: "Idempotency-Key", message: "A later request with this Idempotency-Key took the upload over." });
  }

  /**
   * Gives up an attempt: its object is removed and, if the key is still this attempt's,
   * the record becomes `failed` (a repeat restarts) or `expired` (a repeat is 409).
   * Best effort: a record left `uploading` is taken over after the silence window.
   */
  async abandon(session: UploadSession, state: typeof UploadState.failed | typeof UploadState.expired): Promise<void> {
    // Nothing is removed that may be the key's file: `finish`'s mark may have been stored
    // with its answer lost (the record says done with this file), and with the store away
    // nothing can be known (the record is taken over or swept later, with its object).
    try {
      const record = await this.getUpload(session.uploadId);
      if (record?.state === UploadState.done && record.file_id === session.fileId) return;
      // A document `finish` inserted before its mark failed names bytes about to go.
      await guard(() => this.files.deleteOne({ _id: session.fileId, workspace_id: session.workspaceId }));
    } catch {
      return;
    }
    await this.deleteOrOrphan(session.fileId);
    await guard(() =>
      this.uploads.updateOne(
        { _id: session.uploadId, file_id: session.fileId, state: UploadState.uploading },
        { $set: { state, heartbeat_at: this.clock.nowMs() } },
      ),
    ).catch(() => undefined);
  }

  /**
   * Refreshes the heartbeat when bytes arrived since the last beat, or else only checks
   * that the key is still this attempt's. Returns false once another attempt holds it.
   */
  private async beat(session: UploadSession, progressed: boolean): Promise<boolean> {
    const mine = { _id: session.uploadId, file_id: session.fileId, state: UploadState.uploading };
    if (progressed) {
      const result = await guard(() => this.uploads.updateOne(mine, { $set: { heartbeat_at: this.clock.nowMs() } }));
      return result.matchedCount === 1;
    }
    return (await guard(() => this.uploads.countDocuments(mine, { limit: 1 }))) === 1;
  }
}
