/**
 * Chunks no object names. A JetStream object store writes an object's chunks on
 * `$O.<bucket>.C.<nuid>` and then its meta on `$O.<bucket>.M.<name>`, which names the nuid;
 * a writer that dies between the two (a node killed during an upload or a checkpoint save)
 * leaves chunks no meta names. No delete by name reaches them (a delete finds the nuid
 * through the meta), and the buckets have no TTL, so they would be kept for good.
 *
 * Purging is a deletion of what may be a tenant's bytes, so it is decided on an exact
 * listing only: the metas are read with a consumer until the server says none is pending
 * (the object store's own `list()` ends at a heartbeat or a closed connection without an
 * error, which here would purge live objects), and a subject is purged only when two
 * passes apart found it unnamed and its last chunk older than the grace.
 */
import { DeliverPolicy, type JetStreamClient, type JetStreamManager } from "@nats-io/jetstream";

export interface ChunkBucket {
  /** The bucket's name (its stream is `OBJ_<name>`). */
  name: string;
  /**
   * How long after its last chunk a write has surely ended: past the longest upload or
   * save the node allows. Chunks written more recently may be a write in progress.
   */
  graceMs: number;
}

/** At most this many unnamed chunk subjects are looked at per bucket and pass (each costs a read of its last chunk). */
export const MAX_UNNAMED_PER_PASS = 1_000;
/** The metas are read in pulls of this many. */
const META_PULL = 1_000;
/** A listing of the metas that takes longer than this (a bucket written without pause) is given up and tried at the next pass. */
const META_LISTING_MS = 60_000;

export class IncompleteListingError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "IncompleteListingError";
  }
}

/**
 * Purges the chunk subjects of `bucket` that no live object names, whose last chunk was
 * written over `graceMs` before `nowMs`, and that the previous pass found so too
 * (`suspects`, its returned `suspects`). The chunk subjects are listed before the metas, so
 * an object finished between the two is found named. Returns how many subjects were
 * unnamed, how many it purged, and the suspects for the next pass. Safe on several nodes at
 * once (a purge of what is gone purges nothing); throws when a listing fails.
 */
export async function purgeUnnamedChunks(
  nats: { js: JetStreamClient; jsm: Pick<JetStreamManager, "streams"> },
  bucket: ChunkBucket,
  nowMs: number,
  suspects: ReadonlySet<string>,
  max = MAX_UNNAMED_PER_PASS,
): Promise<{ unnamed: number; purged: number; suspects: Set<string> }> {
  const stream = `OBJ_${bucket.name}`;
  const prefix = `$O.${bucket.name}.C.`;
  const next = new Set<string>();
  const info = await nats.jsm.streams.info(stream, { subjects_filter: `${prefix}>` });
  const chunkSubjects = Object.keys(info.state.subjects ?? {});
  if (chunkSubjects.length === 0) return { unnamed: 0, purged: 0, suspects: next };
  const named = await liveNuids(nats, bucket.name);
  const unnamed = chunkSubjects.filter((subject) => !named.has(subject.slice(prefix.length)));
  // The previous pass's suspects first; the rest from a random place, so that none is always left past the bound.
  const from = Math.floor(Math.random() * unnamed.length);
  const rotated = [...unnamed.slice(from), ...unnamed.slice(0, from)];
  const looked = [...rotated.filter((s) => suspects.has(s)), ...rotated.filter((s) => !suspects.has(s))].slice(0, max);
  let purged = 0;
  for (const subject of looked) {
    const last = await nats.jsm.streams.getMessage(stream, { last_by_subj: subject });
    if (!last || nowMs - last.time.getTime() <= bucket.graceMs) continue;
    if (!suspects.has(subject)) {
      next.add(subject);
      continue;
    }
    await nats.jsm.streams.purge(stream, { filter: subject });
    purged++;
  }
  return { unnamed: unnamed.length, purged, suspects: next };
}

/**
 * The nuids the bucket's live (not deleted) objects name, read from the last meta of each
 * name until the consumer has none pending; throws {@link IncompleteListingError} when the
 * listing cannot be finished.
 */
async function liveNuids(nats: { js: JetStreamClient; jsm: Pick<JetStreamManager, "streams"> }, bucket: string): Promise<Set<string>> {
  const stream = `OBJ_${bucket}`;
  const filter = `$O.${bucket}.M.>`;
  const named = new Set<string>();
  const metas = Object.keys((await nats.jsm.streams.info(stream, { subjects_filter: filter })).state.subjects ?? {}).length;
  if (metas === 0) return named;
  const consumer = await nats.js.consumers.get(stream, { filter_subjects: [filter], deliver_policy: DeliverPolicy.LastPerSubject });
  const began = Date.now();
  try {
    // Every meta once, plus as many written meanwhile; a pull that brings nothing, or the time bound, ends it unfinished.
    for (let read = 0; read <= 2 * metas + META_PULL; ) {
      if (Date.now() - began > META_LISTING_MS) break;
      let got = 0;
      let pending = -1;
      for await (const msg of await consumer.fetch({ max_messages: META_PULL, expires: 5_000 })) {
        got++;
        pending = msg.info.pending;
        const meta = msg.json<{ nuid?: string; deleted?: boolean }>();
        if (!meta.deleted && meta.nuid) named.add(meta.nuid);
        if (pending === 0) break;
      }
      read += got;
      if (pending === 0) return named;
      if (got === 0) break;
    }
  } finally {
    await consumer.delete().catch(() => undefined);
  }
  throw new IncompleteListingError(`could not read every object of ${bucket}; nothing purged`);
}
