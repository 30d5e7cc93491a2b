import { timingSafeEqual } from "node:crypto";
import { cursorKeyGeneration, cursorTag, joinedTagInto } from "./cursor-key.js";
import { ApiError } from "./errors.js";
import { sipHash24Into } from "./siphash.js";

/**
 * Event ids are the cursors of the event list (decisions §5): `evt_` + base64url of
 *
 *     version (1 byte = 3) | stream sequence (uvarint) | run sequence (uvarint) | tag (8 bytes)
 *
 * The stream sequence locates the event in its JetStream stream; the run sequence is its
 * `sequence`; the tag makes a forged, edited or other run's id 400 `invalid_cursor` before
 * any read, so no answer depends on a stream sequence a tenant made up (which would tell it
 * other tenants' event volume). Opaque to clients.
 *
 * Version 3 (since 2026-11-26): the tag is SipHash-2-4 of both sequences (8 bytes each,
 * little-endian) under the run's own 16-byte key, the first 16 bytes of
 * cursorTag(["evt-run", runId]) (an HMAC under the service's cursor key, src/cursor-key.ts):
 * a replay computes the key once and a SipHash per event, a fraction of an HMAC-SHA256 per
 * event. Version 2 (before): the first 8 bytes of cursorTag(["evt", runId, streamSeq,
 * runSeq]); such ids, handed out before, are still accepted (an event read again now gets
 * its version 3 id; both resume at the same place).
 */

const VERSION = 3;
const VERSION_HMAC = 2;

/**
 * The version new ids are written in: 3, or 2 while a cluster is upgraded from a release
 * that reads only version 2 (RUNS_EVENT_ID_VERSION; docs/cluster.md, "Upgrading"). Both
 * are read.
 */
let writtenVersion: 2 | 3 = VERSION;

export function useEventIdVersion(version: 2 | 3): void {
  writtenVersion = version;
}
const TAG_BYTES = 8;
const PREFIX = "evt_";

export interface EventPosition {
  /** Sequence of the message in the run's JetStream stream. */
  streamSeq: number;
  /** The event's `sequence` in its run (1-based, gap-free). */
  runSeq: number;
}

/** The version 3 tag: SipHash-2-4 of both sequences under the run's key, into {@link tag}. */
function tagOf(runId: string, streamSeq: number, runSeq: number): Uint8Array {
  writeLittleEndian(sipInput, 0, streamSeq);
  writeLittleEndian(sipInput, 8, runSeq);
  sipHash24Into(runKey(runId), sipInput, tag);
  return tag.subarray(0, TAG_BYTES);
}

/** An id's bytes (at most 1 + 2 × 8 + 8), and the SipHash input; used synchronously, one id at a time. */
const idBytes = Buffer.alloc(32);
const sipInput = new Uint8Array(16);

/**
 * Run keys by run id, oldest first (replays of different runs interleave message by
 * message, and the appender names the ids of every run it stores for): at most
 * {@link RUN_KEYS}, all dropped when the cursor key changes.
 */
const runKeys = new Map<string, Uint8Array>();
const RUN_KEYS = 1024;
let runKeysGeneration = -1;

/** The run's SipHash key: the first 16 bytes of cursorTag(["evt-run", runId]). */
function runKey(runId: string): Uint8Array {
  if (runKeysGeneration !== cursorKeyGeneration()) {
    runKeys.clear();
    runKeysGeneration = cursorKeyGeneration();
  }
  let key = runKeys.get(runId);
  if (key === undefined) {
    key = new Uint8Array(cursorTag(["evt-run", runId], 16));
    if (runKeys.size >= RUN_KEYS) runKeys.delete(runKeys.keys().next().value!);
    runKeys.set(runId, key);
  }
  return key;
}

/** A safe integer as 8 little-endian bytes. */
function writeLittleEndian(bytes: Uint8Array, at: number, n: number): void {
  let low = n % 0x1_0000_0000;
  let high = Math.floor(n / 0x1_0000_0000);
  for (let i = 0; i < 4; i++, low >>>= 8, high >>>= 8) {
    bytes[at + i] = low & 0xff;
    bytes[at + 4 + i] = high & 0xff;
  }
}

/**
 * The version 2 tag: the first 8 bytes of cursorTag(["evt", runId, streamSeq, runSeq]),
 * its input written as bytes (the run's part once per run, then the two numbers' digits).
 */
function hmacTagOf(runId: string, streamSeq: number, runSeq: number): Uint8Array {
  let at = runPrefix(runId);
  if (at < 0) return cursorTag(["evt", runId, streamSeq, runSeq], TAG_BYTES);
  at = writePart(input, at, streamSeq);
  at = writePart(input, at, runSeq);
  joinedTagInto(input.subarray(0, at), tag);
  return tag.subarray(0, TAG_BYTES);
}

/** The HMAC input being built, and the tag written; used synchronously, one id at a time. */
const input = new Uint8Array(128);
const tag = new Uint8Array(32);
let prefixOf: string | undefined;
let prefixBytes = -1;

/** Writes `3:evt;<length>:<runId>;` into `input` (kept for the next id of the same run); its length, or -1 for a run id that is not short ASCII. */
function runPrefix(runId: string): number {
  if (runId === prefixOf) return prefixBytes;
  prefixOf = runId;
  const text = `3:evt;${runId.length}:${runId};`;
  prefixBytes = -1;
  // Room for the two numbers' parts (at most 2 × 20 bytes) after it.
  if (text.length > input.length - 40) return -1;
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i);
    if (code >= 0x80) return -1;
    input[i] = code;
  }
  prefixBytes = text.length;
  return prefixBytes;
}

/** Writes `<digits>:<n>;` for a positive safe integer (at most 16 digits) at `offset`. */
function writePart(bytes: Uint8Array, offset: number, n: number): number {
  let digits = 1;
  for (let v = n; v >= 10; v = Math.floor(v / 10)) digits++;
  let at = offset;
  if (digits >= 10) bytes[at++] = 0x30 + Math.floor(digits / 10);
  bytes[at++] = 0x30 + (digits % 10);
  bytes[at++] = 0x3a; // :
  let v = n;
  for (let i = at + digits - 1; i >= at; i--) {
    bytes[i] = 0x30 + (v % 10);
    v = Math.floor(v / 10);
  }
  at += digits;
  bytes[at++] = 0x3b; // ;
  return at;
}

export function encodeEventId(position: EventPosition & { runId: string }): string {
  const { streamSeq, runSeq, runId } = position;
  if (!isPositiveSafeInteger(streamSeq) || !isPositiveSafeInteger(runSeq)) {
    throw new RangeError(`event position out of range: ${streamSeq}/${runSeq}`);
  }
  // Written into one scratch buffer (every replayed event gets an id: arrays, spreads and a
  // buffer per id showed in its profile).
  idBytes[0] = writtenVersion;
  let at = writeUvarint(idBytes, 1, streamSeq);
  at = writeUvarint(idBytes, at, runSeq);
  idBytes.set(writtenVersion === VERSION ? tagOf(runId, streamSeq, runSeq) : hmacTagOf(runId, streamSeq, runSeq), at);
  return PREFIX + idBytes.toString("base64url", 0, at + TAG_BYTES);
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
  const version = bytes[0];
  if (bytes.toString("base64url") !== id.slice(PREFIX.length) || (version !== VERSION && version !== VERSION_HMAC)) {
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
  const expected = version === VERSION ? tagOf(runId, streamSeq, runSeq) : hmacTagOf(runId, streamSeq, runSeq);
  if (!timingSafeEqual(bytes.subarray(offset), expected)) {
    throw invalid("The event cursor is not valid.");
  }
  return { streamSeq, runSeq };
}

function isPositiveSafeInteger(n: number): boolean {
  return Number.isSafeInteger(n) && n >= 1;
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
