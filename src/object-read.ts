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
import type { JetStreamManager } from "@nats-io/jetstream";
import type { ObjectInfo } from "@nats-io/obj";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Clock } from "./clock.js";
import { readOrdered } from "./ordered-read.js";

/** The read of an object's chunks failed in NATS (not in what it read): worth reading again. */
export class ObjectReadUnavailableError extends Error {
  constructor(objectName: string, options?: ErrorOptions) {
    super(`the object store could not be read (object ${objectName})`, options);
    this.name = "ObjectReadUnavailableError";
  }
}

/** Reads an object's chunks, as {@link readObjectChunks} does. */
export type ObjectChunkReader = (info: ObjectInfo) => AsyncGenerator<Uint8Array>;

/** The chunks of the object `info` describes in `bucket` ({@link readOrdered}'s bounded pulls). */
export function objectChunkReader(nc: NatsConnection, jsm: JetStreamManager, clock: Clock, bucket: string): ObjectChunkReader {
  return (info) => readObjectChunks(nc, jsm, clock, bucket, info);
}

/**
 * The object's chunks in order, each handed over before the next is asked for (at most
 * ~2 pulls' bytes held). Throws {@link ObjectReadUnavailableError} when NATS fails the
 * read, and a plain Error when what came is not the object (its size or SHA-256 digest
 * differ from `info`'s). A consumer that stops early ends the read (its consumer removed).
 */
export async function* readObjectChunks(nc: NatsConnection, jsm: JetStreamManager, clock: Clock, bucket: string, info: ObjectInfo): AsyncGenerator<Uint8Array> {
  if (info.size === 0) return;
  const stream = `OBJ_${bucket}`;
  const subject = `$O.${bucket}.C.${info.nuid}`;
  // An ordered read of a subject with no message waits for one: an object whose chunks are
  // gone (purged) would be waited for forever. Counted first (no payload read).
  let stored: number;
  try {
    stored = (await jsm.streams.info(stream, { subjects_filter: subject })).state.subjects?.[subject] ?? 0;
  } catch (err) {
    throw new ObjectReadUnavailableError(info.name, { cause: err });
  }
  if (stored !== info.chunks) throw new Error(`received a corrupt object ${info.name}: ${stored} of its ${info.chunks} chunks are stored`);
  const stop = new AbortController();
  // One chunk offered at a time: the read's handler waits until the generator has yielded it.
  let offered: { chunk: Uint8Array; last: boolean; taken: () => void } | undefined;
  let wake: (() => void) | undefined;
  let ended: { error?: unknown } | undefined;
  const read = readOrdered(
    nc,
    jsm,
    clock,
    { stream, subject, startSeq: 1 },
    (msg, _seq, pending) =>
      new Promise<void>((taken) => {
        offered = { chunk: msg.data, last: pending === 0, taken };
        wake?.();
      }),
    stop.signal,
  ).then(
    () => {
      ended = {};
      wake?.();
    },
    (error: unknown) => {
      ended = { error: new ObjectReadUnavailableError(info.name, { cause: error }) };
      wake?.();
    },
  );
  const hash = createHash("sha256");
  let bytes = 0;
  // The offer being handed over: its handler still waits.
  let handing: { taken: () => void } | undefined;
  try {
    for (let chunks = 0; ; chunks++) {
      while (!offered && !ended) await new Promise<void>((resolve) => (wake = resolve));
      const offer = offered;
      if (!offer) throw ended?.error ?? new Error(`the read of object ${info.name} ended after ${chunks} of its chunks`);
      offered = undefined;
      handing = offer;
      hash.update(offer.chunk);
      bytes += offer.chunk.length;
      if (bytes > info.size) throw new Error(`object ${info.name} is longer than its ${info.size} bytes`);
      if (offer.chunk.length > 0) yield offer.chunk;
      handing = undefined;
      offer.taken();
      if (offer.last) break;
    }
    if (bytes !== info.size || !sameDigest(info.digest, hash.digest("base64url"))) {
      throw new Error(`received a corrupt object ${info.name}: its size or digest does not match`);
    }
  } finally {
    // Stopped early (or failed): the handlers' offers are let go, so the read can end.
    handing?.taken();
    offered?.taken();
    stop.abort();
    await read;
  }
}

/** Whether an object's digest (`SHA-256=` and base64, URL-safe or not, padded or not) is `base64url`. */
function sameDigest(digest: string, base64url: string): boolean {
  if (!digest.startsWith("SHA-256=")) return false;
  return digest.slice(8).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "") === base64url;
}
