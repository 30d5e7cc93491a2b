/**
 * Chunks no object names. A JetStream object store writes an object's chunks on
 * `$O.<bucket>.C.<nuid>` and then its meta on `$O.<bucket>.M.<name>`, which names the nuid;
 * a writer that dies between the two (a node killed during an upload or a checkpoint save)
 * leaves chunks no meta names. No delete by name reaches them (a delete finds the nuid
 * through the meta), and the buckets have no TTL, so they would be kept for good.
 *
 * Purging is a deletion of what may be a tenant's bytes, so it is decided on an exact
 * listing only: every meta is read, with a consumer until the server says none is pending,
 * and every meta subject the stream listed must have come (the object store's own `list()`
 * ends at a heartbeat or a closed connection without an error, which here would purge live
 * objects). And a subject is purged only when a pass at least the grace before found it
 * unnamed with the same last chunk: no chunk written to it since, by the node's own clock
 * (no comparison with the server's timestamps).
 *
 * A deleted object keeps a meta saying so, for good, and every pass reads it: the metas of
 * objects deleted over the grace ago (by the server's timestamp: forgetting early breaks
 * nothing) are forgotten (purged). Our objects' names (file and run ids) are never used
 * again, so nothing needs a deleted one's meta later; a delete repeated after it finds no
 * object, as after a successful one.
 */
import { DeliverPolicy, type JetStreamClient, type JetStreamManager } from "@nats-io/jetstream";

export interface ChunkBucket {
  /** The bucket's name (its stream is `OBJ_<name>`). */
  name: string;
  /**
   * How long a write may go without storing a chunk and still be going on: past the
   * longest upload or save the node allows.
   */
  graceMs: number;
}

/** An unnamed chunk subject as a pass found it: when (the node's clock) and its last chunk's stream sequence. */
export interface ChunkSuspect {
  at: number;
  seq: number;
}

/** At most this many unnamed chunk subjects are looked at per bucket and pass (each costs a read of its last chunk, up to a chunk's size). */
export const MAX_UNNAMED_PER_PASS = 200;
/** Deleted objects' metas are forgotten for at most this long per bucket and pass (a purge request each). */
export const FORGET_MS = 30_000;
/** The metas are read in pulls of this many. */
const META_PULL = 1_000;
/** A listing of the metas that takes longer than this (a bucket written without pause) is given up and tried at the next pass. */
const META_LISTING_MS = 60_000;

type Nats = { js: JetStreamClient; jsm: Pick<JetStreamManager, "streams"> };

/** What a pass did: unnamed chunk subjects found, purged; deleted objects' metas forgotten and left; the suspects for the next pass. */
export interface ChunkPass {
  unnamed: number;
  purged: number;
  forgotten: number;
  /** Deleted objects' metas read and not forgotten (recent, or past the pass's time for it): a backlog shows here. */
  deletedLeft: number;
  suspects: Map<string, ChunkSuspect>;
  /** Why the metas could not all be read: then no chunk was purged (the suspects are kept as they were). */
  incomplete?: string;
}

/**
 * Purges the chunk subjects of `bucket` that no live object names and that `suspects` (the
 * previous pass's answer) holds with the same last chunk, found at least `graceMs` before
 * (`now()`, read after a subject's last chunk is read when it is suspected and before when
 * it is compared); purged up to that chunk, so a chunk written meanwhile stays. Then
 * forgets the metas of deleted objects (a delete keeps one saying so, for good) written
 * over the grace before, for at most {@link FORGET_MS}. The chunk subjects are listed before
 * the metas, so an object finished between the two is found named. A listing that could
 * not read every meta purges no chunk (`incomplete` says why) but still forgets the deleted
 * metas it read: a meta that says deleted is enough for that, and a backlog too large to
 * list within the bound then shrinks pass by pass. Safe on several nodes at once (a purge of
 * what is gone purges nothing; a meta one forgets while another reads makes that listing
 * incomplete).
 */
export async function purgeUnnamedChunks(
  nats: Nats,
  bucket: ChunkBucket,
  now: () => number,
  suspects: ReadonlyMap<string, ChunkSuspect>,
  max = MAX_UNNAMED_PER_PASS,
): Promise<ChunkPass> {
  const stream = `OBJ_${bucket.name}`;
  const prefix = `$O.${bucket.name}.C.`;
  const chunkSubjects = await subjectsOf(nats, stream, `${prefix}>`);
  const metas = await readMetas(nats, bucket.name);
  const unnamed = metas.incomplete ? [] : chunkSubjects.filter((subject) => !metas.named.has(subject.slice(prefix.length)));
  const next = metas.incomplete ? new Map(suspects) : new Map<string, ChunkSuspect>();
  // The previous pass's suspects first; the rest from a random place, so that none is always left past the bound.
  const from = Math.floor(Math.random() * unnamed.length);
  const rotated = [...unnamed.slice(from), ...unnamed.slice(0, from)];
  const looked = [...rotated.filter((s) => suspects.has(s)), ...rotated.filter((s) => !suspects.has(s))].slice(0, max);
  let purged = 0;
  for (const subject of looked) {
    const asked = now();
    const last = await nats.jsm.streams.getMessage(stream, { last_by_subj: subject });
    if (!last) continue;
    const earlier = suspects.get(subject);
    if (earlier?.seq !== last.seq) {
      next.set(subject, { at: now(), seq: last.seq });
    } else if (asked - earlier.at < bucket.graceMs) {
      next.set(subject, earlier);
    } else {
      await nats.jsm.streams.purge(stream, { filter: subject, seq: last.seq + 1 });
      purged++;
    }
  }
  // Forgetting a deleted object's meta early would break nothing (no name is used again), so
  // its age is judged on the server's timestamp, unlike the chunks above.
  const began = Date.now();
  let forgotten = 0;
  for (const meta of metas.deleted) {
    if (Date.now() - began > FORGET_MS) break;
    if (now() - meta.time <= bucket.graceMs) continue;
    await nats.jsm.streams.purge(stream, { filter: meta.subject, seq: meta.seq + 1 });
    forgotten++;
  }
  return { unnamed: unnamed.length, purged, forgotten, deletedLeft: metas.deleted.length - forgotten, suspects: next, ...(metas.incomplete ? { incomplete: metas.incomplete } : {}) };
}

/** The subjects of `stream` that match `filter` (the client pages through a long list). */
async function subjectsOf(nats: Nats, stream: string, filter: string): Promise<string[]> {
  return Object.keys((await nats.jsm.streams.info(stream, { subjects_filter: filter })).state.subjects ?? {});
}

/**
 * Every meta of the bucket, read from the last one of each name until the consumer has none
 * pending: the nuids live (not deleted) objects name, and the metas of deleted objects.
 * `incomplete` says why unless every meta subject the stream listed first was read (and the
 * consumer had metas to deliver when the listing showed some).
 */
async function readMetas(nats: Nats, bucket: string): Promise<{ named: Set<string>; deleted: Array<{ subject: string; seq: number; time: number }>; incomplete?: string }> {
  const stream = `OBJ_${bucket}`;
  const filter = `$O.${bucket}.M.>`;
  const named = new Set<string>();
  const deleted: Array<{ subject: string; seq: number; time: number }> = [];
  const listed = await subjectsOf(nats, stream, filter);
  const read = new Set<string>();
  const consumer = await nats.js.consumers.get(stream, { filter_subjects: [filter], deliver_policy: DeliverPolicy.LastPerSubject });
  const began = Date.now();
  let finished = false;
  try {
    // An empty listing is believed only if the consumer has nothing to deliver either.
    if ((await consumer.info()).num_pending === 0) {
      return listed.length > 0 ? { named, deleted, incomplete: `${listed.length} metas listed but none to read` } : { named, deleted };
    }
    // Every meta once, plus as many written meanwhile; a pull that brings nothing, or the time bound, ends it unfinished.
    for (let count = 0; count <= 2 * listed.length + META_PULL && !finished; ) {
      if (Date.now() - began > META_LISTING_MS) break;
      let got = 0;
      for await (const msg of await consumer.fetch({ max_messages: META_PULL, expires: 5_000 })) {
        got++;
        read.add(msg.subject);
        const meta = msg.json<{ nuid?: string; deleted?: boolean }>();
        if (meta.deleted) deleted.push({ subject: msg.subject, seq: msg.seq, time: Math.floor(msg.info.timestampNanos / 1e6) });
        else if (meta.nuid) named.add(meta.nuid);
        if (msg.info.pending === 0) {
          finished = true;
          break;
        }
      }
      count += got;
      if (got === 0) break;
    }
  } finally {
    await consumer.delete().catch(() => undefined);
  }
  const missed = listed.filter((subject) => !read.has(subject)).length;
  if (!finished || missed > 0) return { named, deleted, incomplete: `${missed} of ${listed.length} metas listed not read${finished ? "" : " (the read did not finish)"}` };
  return { named, deleted };
}
