import { timingSafeEqual } from "node:crypto";
import { joinedTag } from "./cursor-key.js";
import { ApiError } from "./errors.js";

/**
 * Event ids are the cursors of the event list (decisions §5): `evt_` + base64url of
 *
 *     version (1 byte = 2) | stream sequence (uvarint) | run sequence (uvarint) | tag (8 bytes)
 *
 * The stream sequence locates the event in its JetStream stream; the run sequence is its
 * `sequence`; the tag, an HMAC of the run id and both sequences under the service's
 * cursor key (src/cursor-key.ts), makes a forged, edited or other run's id 400
 * `invalid_cursor` before any read, so no answer depends on a stream sequence a tenant
 * made up (which would tell it other tenants' event volume). Opaque to clients.
 */

const VERSION = 2;
const TAG_BYTES = 8;
const PREFIX = "evt_";

export interface EventPosition {
  /** Sequence of the message in the run's JetStream stream. */
  streamSeq: number;
  /** The event's `sequence` in its run (1-based, gap-free). */
  runSeq: number;
}

/** The first 8 bytes of cursorTag(["evt", runId, streamSeq, runSeq]), joined here in one template. */
function tagOf(runId: string, streamSeq: number, runSeq: number): Uint8Array {
  const s = String(streamSeq);
  const r = String(runSeq);
  return joinedTag(`3:evt;${runId.length}:${runId};${s.length}:${s};${r.length}:${r};`).subarray(0, TAG_BYTES);
}

export function encodeEventId(position: EventPosition & { runId: string }): string {
  const { streamSeq, runSeq, runId } = position;
  if (!isPositiveSafeInteger(streamSeq) || !isPositiveSafeInteger(runSeq)) {
    throw new RangeError(`event position out of range: ${streamSeq}/${runSeq}`);
  }
  // Written into one buffer (every replayed event gets an id: arrays and spreads showed in its profile).
  const bytes = Buffer.allocUnsafe(1 + uvarintLength(streamSeq) + uvarintLength(runSeq) + TAG_BYTES);
  bytes[0] = VERSION;
  let at = writeUvarint(bytes, 1, streamSeq);
  at = writeUvarint(bytes, at, runSeq);
  bytes.set(tagOf(runId, streamSeq, runSeq), at);
  return PREFIX + bytes.toString("base64url");
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
  if (!isPositiveSafeInteger(streamSeq) || !isPositiveSafeInteger(runSeq) || bytes.length - offset !== TAG_BYTES) {
    throw invalid("The event cursor is not valid.");
  }
  // A forged id and another run's id are told apart by nothing: both are not valid here.
  if (!timingSafeEqual(bytes.subarray(offset), tagOf(runId, streamSeq, runSeq))) {
    throw invalid("The event cursor is not valid.");
  }
  return { streamSeq, runSeq };
}

function isPositiveSafeInteger(n: number): boolean {
  return Number.isSafeInteger(n) && n >= 1;
}

function uvarintLength(n: number): number {
  let length = 1;
  for (let v = n; v >= 0x80; v = Math.floor(v / 0x80)) length++;
  return length;
}

/** Writes `n` as a uvarint at `offset`; returns the offset after it. */
function writeUvarint(bytes: Buffer, offset: number, n: number): number {
  let at = offset;
  let v = n;
  while (v >= 0x80) {
    bytes[at++] = (v % 0x80) | 0x80;
    v = Math.floor(v / 0x80);
  }
  bytes[at++] = v;
  return at;
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
