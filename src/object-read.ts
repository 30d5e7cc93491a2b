/**
 * An object of a JetStream object store read with back-pressure: its chunks are pulled as
 * the reader takes them, so a slow reader (tar writing a restored workspace to disk) holds
 * a few pulls' bytes, not the object.
 *
 * `@nats-io/obj`'s `get` reads through a push consumer that hands every chunk to a web
 * stream as it arrives, whatever the stream's reader has taken: a checkpoint of gigabytes
 * restored on a node slower to write than NATS is to send was held in memory nearly whole.
 */
import { createHash } from "node:crypto";
import { JetStreamApiError, type JetStreamManager } from "@nats-io/jetstream";
import type { ObjectInfo, ObjectStore } from "@nats-io/obj";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Clock } from "./clock.js";
import { readOrdered } from "./ordered-read.js";

/**
 * The read of an object's chunks failed in NATS (not in what it read), or the object
 * changed while it was read (saved again, or deleted): worth reading again.
 */
export class ObjectReadUnavailableError extends Error {
  constructor(objectName: string, options?: ErrorOptions & { reason?: string }) {
    super(options?.reason ?? `the object store could not be read (object ${objectName})`, options);
    this.name = "ObjectReadUnavailableError";
  }
}

/** What was read is not the object its metadata describes (chunks missing, size or digest wrong): no read brings it back. */
export class ObjectCorruptError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ObjectCorruptError";
  }
}

/** Reads an object's chunks, as {@link readObjectChunks} does. */
export type ObjectChunkReader = (info: ObjectInfo) => AsyncGenerator<Uint8Array>;

/** The chunks of the object `info` describes in `bucket` (`store`), read by {@link readObjectChunks}. */
export function objectChunkReader(nc: NatsConnection, jsm: JetStreamManager, clock: Clock, bucket: string, store: Pick<ObjectStore, "info">): ObjectChunkReader {
  return (info) => readObjectChunks({ nc, jsm, clock, bucket, current: (name) => store.info(name) }, info);
}

/** With no chunk for this long (longer than a pull waits), the read checks the object is still whole. */
const STALL_MS = 35_000;
/** Stalls waited out with the object whole before the read gives up (~1 h). */
const MAX_STALLS = 100;

/**
 * The object's chunks in order, each handed over before the next is asked for (at most
 * ~2 pulls' bytes held: {@link readOrdered}). Throws {@link ObjectReadUnavailableError}
 * when NATS fails the read or the object changed while read (then its metadata, `current`,
 * names other chunks or none), and {@link ObjectCorruptError} when what came is not the
 * object (chunks missing, size or SHA-256 digest other than `info`'s). A consumer that
 * stops early ends the read (its consumer removed).
 */
export async function* readObjectChunks(
  r: { nc: NatsConnection; jsm: JetStreamManager; clock: Clock; bucket: string; current: (name: string) => Promise<ObjectInfo | null>; stallMs?: number },
  info: ObjectInfo,
): AsyncGenerator<Uint8Array> {
  if (info.options?.link) throw new ObjectCorruptError(`object ${info.name} is a link, not an object`);
  if (info.size === 0) return;
  if (!info.digest.startsWith(DIGEST_PREFIX)) throw new ObjectCorruptError(`object ${info.name} has a digest of an unknown kind`);
  const stream = `OBJ_${r.bucket}`;
  const subject = `$O.${r.bucket}.C.${info.nuid}`;
  const storedChunks = async () => {
    try {
      return (await r.jsm.streams.info(stream, { subjects_filter: subject })).state.subjects?.[subject] ?? 0;
    } catch (err) {
      throw unavailable(info, err);
    }
  };
  /** Chunks are missing: the object changed meanwhile (read again), or it is not whole. */
  const missing = async (why: string): Promise<Error> => {
    const now = await r.current(info.name).catch((err: unknown) => unavailable(info, err));
    if (now instanceof Error) return now;
    if (!now || now.deleted || now.nuid !== info.nuid) {
      return new ObjectReadUnavailableError(info.name, { reason: `object ${info.name} changed while it was read (${why})` });
    }
    return new ObjectCorruptError(`received a corrupt object ${info.name}: ${why}`);
  };
  // An ordered read of a subject with no message waits for one: an object whose chunks are
  // gone (purged) would be waited for forever. Counted first (no payload read).
  const stored = await storedChunks();
  if (stored !== info.chunks) throw await missing(`${stored} of its ${info.chunks} chunks are stored`);
  const stop = new AbortController();
  // One chunk offered at a time: the read's handler waits until the generator has yielded it.
  let offered: { chunk: Uint8Array; pending: number; taken: () => void } | undefined;
  let wake: (() => void) | undefined;
  let ended: { error?: unknown } | undefined;
  const read = readOrdered(
    r.nc,
    r.jsm,
    r.clock,
    { stream, subject, startSeq: 1 },
    (msg, _seq, pending) =>
      new Promise<void>((taken) => {
        offered = { chunk: msg.data, pending, taken };
        wake?.();
      }),
    stop.signal,
  ).then(
    () => {
      ended = {};
      wake?.();
    },
    (error: unknown) => {
      ended = { error: unavailable(info, error) };
      wake?.();
    },
  );
  /** Until a chunk is offered or the read ended (true), or STALL_MS pass (false). */
  const offer = () =>
    new Promise<boolean>((resolve) => {
      const timer = r.clock.after(r.stallMs ?? STALL_MS, () => resolve(false));
      wake = () => {
        timer.cancel();
        resolve(true);
      };
    });
  const hash = createHash("sha256");
  let bytes = 0;
  // The offer being handed over: its handler still waits.
  let handing: { taken: () => void } | undefined;
  try {
    for (let chunks = 0, stalls = 0; chunks < info.chunks; chunks++) {
      while (!offered && !ended) {
        if (await offer()) continue;
        // Nothing for a while: its chunks purged under the read (saved again, deleted)?
        if ((await storedChunks()) < info.chunks) throw await missing("its chunks went while it was read");
        if (++stalls >= MAX_STALLS) throw unavailable(info, new Error(`no chunk came in ${stalls} waits of ${r.stallMs ?? STALL_MS} ms`));
      }
      const given = offered;
      if (!given) throw ended?.error ?? unavailable(info, new Error(`the read ended after ${chunks} of its chunks`));
      offered = undefined;
      handing = given;
      hash.update(given.chunk);
      bytes += given.chunk.length;
      if (bytes > info.size) throw new ObjectCorruptError(`received a corrupt object ${info.name}: longer than its ${info.size} bytes`);
      // The subject's last message before the object's last chunk: the rest went meanwhile.
      if (given.pending === 0 && chunks + 1 < info.chunks) throw await missing(`its chunks ended after ${chunks + 1} of ${info.chunks}`);
      if (given.chunk.length > 0) yield given.chunk;
      handing = undefined;
      given.taken();
    }
    if (bytes !== info.size || !sameDigest(info.digest, hash.digest())) {
      throw new ObjectCorruptError(`received a corrupt object ${info.name}: its size or digest does not match`);
    }
  } finally {
    // Stopped early (or failed): the handlers' offers are let go, so the read can end.
    handing?.taken();
    offered?.taken();
    stop.abort();
    await read;
  }
}

const DIGEST_PREFIX = "SHA-256=";

/** A NATS failure as the read's: transient, but for JetStream's refusals (4xx), which are not. */
function unavailable(info: ObjectInfo, err: unknown): Error {
  if (err instanceof JetStreamApiError && err.status < 500) return err;
  return new ObjectReadUnavailableError(info.name, { cause: err });
}

/** Whether an object's digest (`SHA-256=` and base64, URL-safe or not, padded or not, or hex) is `sha256`. */
function sameDigest(digest: string, sha256: Buffer): boolean {
  const value = digest.slice(DIGEST_PREFIX.length);
  if (/^[0-9a-fA-F]{64}$/.test(value)) return value.toLowerCase() === sha256.toString("hex");
  return value.replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "") === sha256.toString("base64url");
}
