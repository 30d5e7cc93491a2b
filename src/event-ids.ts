import { createHash } from "node:crypto";
import { ApiError } from "./errors.js";

/**
 * Event ids are the cursors of the event list (decisions §5): `evt_` + base64url of
 *
 *     version (1 byte = 1) | stream sequence (uvarint) | run sequence (uvarint) | run hash (6 bytes)
 *
 * The stream sequence locates the event in its JetStream stream; the run sequence is its
 * `sequence`; the run hash (first 6 bytes of sha256 of the run id) tells a cursor of another
 * run apart without a lookup. Opaque to clients; pure.
 */

const VERSION = 1;
const RUN_HASH_BYTES = 6;
const PREFIX = "evt_";

export interface EventPosition {
  /** Sequence of the message in the run's JetStream stream. */
  streamSeq: number;
  /** The event's `sequence` in its run (1-based, gap-free). */
  runSeq: number;
}

/** Recent runs' hashes: every id of a run's events carries the same one. */
const runHashes = new Map<string, Buffer>();
const RUN_HASH_CACHE = 1024;

export function runHash(runId: string): Buffer {
  let hash = runHashes.get(runId);
  if (!hash) {
    hash = createHash("sha256").update(runId, "utf8").digest().subarray(0, RUN_HASH_BYTES);
    if (runHashes.size >= RUN_HASH_CACHE) runHashes.clear();
    runHashes.set(runId, hash);
  }
  return hash;
}

export function encodeEventId(position: EventPosition & { runId: string }): string {
  const { streamSeq, runSeq, runId } = position;
  if (!isPositiveSafeInteger(streamSeq) || !isPositiveSafeInteger(runSeq)) {
    throw new RangeError(`event position out of range: ${streamSeq}/${runSeq}`);
  }
  const bytes = [VERSION, ...uvarint(streamSeq), ...uvarint(runSeq), ...runHash(runId)];
  return PREFIX + Buffer.from(bytes).toString("base64url");
}

/**
 * Decodes an event id issued for `runId`. A malformed id, or one issued for another run,
 * is 400 `invalid_cursor` naming `param`.
 */
export function decodeEventId(id: string, runId: string, param = "after"): EventPosition {
  const invalid = (message: string) => new ApiError("invalid_cursor", { param, message });
  if (typeof id !== "string" || !id.startsWith(PREFIX) || !/^[A-Za-z0-9_-]+$/.test(id.slice(PREFIX.length))) {
    throw invalid("The event cursor is not valid.");
  }
  const bytes = Buffer.from(id.slice(PREFIX.length), "base64url");
  // base64url decoding is lenient; insist on the canonical form so one event has one id.
  if (bytes.toString("base64url") !== id.slice(PREFIX.length) || bytes[0] !== VERSION) {
    throw invalid("The event cursor is not valid.");
  }
  let offset = 1;
  const read = (): number => {
    const [value, next] = readUvarint(bytes, offset);
    offset = next;
    return value;
  };
  let streamSeq: number;
  let runSeq: number;
  try {
    streamSeq = read();
    runSeq = read();
  } catch {
    throw invalid("The event cursor is not valid.");
  }
  if (!isPositiveSafeInteger(streamSeq) || !isPositiveSafeInteger(runSeq) || bytes.length - offset !== RUN_HASH_BYTES) {
    throw invalid("The event cursor is not valid.");
  }
  if (!bytes.subarray(offset).equals(runHash(runId))) {
    throw invalid("This event cursor was issued for another run.");
  }
  return { streamSeq, runSeq };
}

function isPositiveSafeInteger(n: number): boolean {
  return Number.isSafeInteger(n) && n >= 1;
}

function uvarint(n: number): number[] {
  const out: number[] = [];
  let v = n;
  while (v >= 0x80) {
    out.push((v % 0x80) | 0x80);
    v = Math.floor(v / 0x80);
  }
  out.push(v);
  return out;
}

/** Reads a canonical (no redundant zero groups) uvarint of at most 8 bytes (< 2^56). */
function readUvarint(bytes: Buffer, start: number): [number, number] {
  let value = 0;
  let scale = 1;
  for (let i = start; i < bytes.length && i < start + 8; i++) {
    const b = bytes[i];
    value += (b & 0x7f) * scale;
    if ((b & 0x80) === 0) {
      if (b === 0 && i > start) throw new Error("non-canonical uvarint");
      return [value, i + 1];
    }
    scale *= 0x80;
  }
  throw new Error("truncated uvarint");
}
