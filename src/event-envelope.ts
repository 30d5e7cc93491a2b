/**
 * A stored event: the encrypted envelope, its headers, and turning it back into the
 * API's event (its id rebuilt from the stream sequence) or its JSON.
 */
import { ApiError } from "./errors.js";
import { openedPlaintext, openText } from "./event-crypto.js";
import { encodeEventId } from "./event-ids.js";
import type { RunEvent, StreamedEvent } from "./event-types.js";

/** The plaintext that is encrypted: the event without its id, plus what the reader needs. */
export interface StoredEnvelope {
  v: 1;
  /** created_at in Unix ms: retention is decided at millisecond precision. */
  ms: number;
  /** Run sequence of the first event of this event's turn (absent for run-level events). */
  tf?: number;
  event: Omit<RunEvent, "id">;
}

export const SEQ_HEADER = "Runs-Seq";
export const TURN_HEADER = "Runs-Turn";
/** Room for the id the reader adds (an `evt_` id is under 40 characters). */
export const ID_ALLOWANCE_BYTES = 64;

export function headerSeq(value: string): number {
  const n = Number(value);
  return Number.isSafeInteger(n) && n > 0 ? n : 0;
}

export function decodeEnvelope(key: Uint8Array, data: Uint8Array): StoredEnvelope {
  return JSON.parse(openText(key, data)) as StoredEnvelope;
}

/**
 * A stored event as a subscription reads it: the fields a reader decides on and the
 * event's JSON as the stored bytes hold it, so that replaying an event costs no text
 * decoding, parsing or encoding (docs/performance.md, "SSE delivery").
 */
export interface StoredHead extends Omit<StreamedEvent, "id"> {
  /** created_at in Unix ms (retention). */
  ms: number;
}

/** Opens a stored event into a {@link StoredHead}; a failure is 503 event_history_unavailable. */
export function decodeHeadOrUnavailable(key: Uint8Array, data: Uint8Array): StoredHead {
  let plain: Uint8Array;
  try {
    plain = openedPlaintext(key, data);
  } catch (err) {
    throw unavailable(err);
  }
  const head = scanHead(plain);
  if (head) return head;
  // Not the appender's shape (an older or future writer): parsed, and encoded again.
  let envelope: StoredEnvelope;
  try {
    envelope = JSON.parse(utf8Decoder.decode(plain)) as StoredEnvelope;
  } catch (err) {
    throw unavailable(err);
  }
  const event = envelope?.event;
  if (typeof event !== "object" || event === null || !Number.isSafeInteger(event.sequence) || typeof envelope.ms !== "number") {
    throw unavailable(new Error("The stored event is not an event envelope."));
  }
  return { ms: envelope.ms, sequence: event.sequence, source: event.source, type: event.type, turn_id: event.turn_id, json: Buffer.from(JSON.stringify(event), "utf8") };
}

const utf8Decoder = new TextDecoder();

/**
 * Reads the head of a stored event written by the appender, which serializes
 *
 *     {"v":1,"ms":<ms>[,"tf":<n>],"event":{"sequence":<n>,"source":"…","type":"…","run_id":"…","turn_id":"…"|null,…}}
 *
 * in that order (src/event-appender.ts), `event` last. The plaintext is authenticated, so
 * it is the appender's JSON: the scan reads the members up to `turn_id` and takes the rest
 * of the event (`created_at`, `data`) as the appender wrote it, without reading it. Up to
 * there, anything else — another member order, a number that is not a plain integer, a
 * string with an escape or a byte outside printable ASCII — answers null and is parsed
 * instead, so the fields read are exactly what `JSON.parse` gives. What it relies on (the
 * members' order, `event` as the last member, no repeated member): a writer that changes
 * any of it must write another `v`.
 */
export function scanHead(plain: Uint8Array): StoredHead | null {
  scanAt = 0;
  if (!literal(plain, V1_MS)) return null;
  const ms = integer(plain);
  if (ms < 0) return null;
  if (literal(plain, TF) && integer(plain) < 0) return null;
  if (!literal(plain, EVENT)) return null;
  const eventStart = scanAt;
  if (!literal(plain, SEQUENCE)) return null;
  const sequence = integer(plain);
  if (sequence < 0 || !literal(plain, SOURCE)) return null;
  const source = plainString(plain, 0);
  if (source === null || !literal(plain, TYPE)) return null;
  const type = plainString(plain, 1);
  if (type === null || !literal(plain, RUN_ID)) return null;
  if (plainString(plain, 2) === null || !literal(plain, TURN_ID)) return null;
  let turnId: string | null = null;
  if (!literal(plain, NULL) && (turnId = plainString(plain, 3)) === null) return null;
  // The envelope ends with the event: `…}}`.
  const end = plain.length;
  if (end < scanAt + 2 || plain[end - 1] !== 0x7d || plain[end - 2] !== 0x7d) return null;
  // A pooled Buffer and a copy: a typed array's slice cost ~4× as much here.
  const json = Buffer.allocUnsafe(end - 1 - eventStart);
  json.set(plain.subarray(eventStart, end - 1));
  return { ms, sequence, source, type, turn_id: turnId, json };
}

const ascii = (text: string) => Uint8Array.from(text, (c) => c.charCodeAt(0));
const V1_MS = ascii('{"v":1,"ms":');
const TF = ascii(',"tf":');
const EVENT = ascii(',"event":');
const SEQUENCE = ascii('{"sequence":');
const SOURCE = ascii(',"source":');
const TYPE = ascii(',"type":');
const RUN_ID = ascii(',"run_id":');
const TURN_ID = ascii(',"turn_id":');
const NULL = ascii("null");

/** Where the scan is in the bytes (used synchronously, one event at a time). */
let scanAt = 0;

function literal(bytes: Uint8Array, expected: Uint8Array): boolean {
  if (scanAt + expected.length > bytes.length) return false;
  for (let i = 0; i < expected.length; i++) if (bytes[scanAt + i] !== expected[i]) return false;
  scanAt += expected.length;
  return true;
}

/** A non-negative integer in plain decimal (no sign, fraction, exponent or leading zero), up to 15 digits; -1 otherwise. */
function integer(bytes: Uint8Array): number {
  const start = scanAt;
  let n = 0;
  while (scanAt < bytes.length && scanAt - start < 16) {
    const digit = bytes[scanAt]! - 0x30;
    if (digit < 0 || digit > 9) break;
    n = n * 10 + digit;
    scanAt++;
  }
  const digits = scanAt - start;
  if (digits === 0 || digits > 15 || (digits > 1 && bytes[start] === 0x30)) return -1;
  return n;
}

/**
 * The last string read per member (source, type, run id, turn id): a run's events repeat
 * them, so the bytes are first compared with it, and give the same string without being
 * checked and built again (it was checked when it was read).
 */
const lastStrings: string[] = ["", "", "", ""];

/** A JSON string of printable ASCII without escapes (ids, types, sources) for member `slot` of {@link lastStrings}; null otherwise. */
function plainString(bytes: Uint8Array, slot: number): string | null {
  if (bytes[scanAt] !== 0x22) return null;
  const start = scanAt + 1;
  const last = lastStrings[slot]!;
  const length = last.length;
  if (length > 0 && bytes[start + length] === 0x22) {
    let i = 0;
    while (i < length && last.charCodeAt(i) === bytes[start + i]) i++;
    if (i === length) {
      scanAt = start + length + 1;
      return last;
    }
  }
  let at = start;
  for (; at < bytes.length; at++) {
    const code = bytes[at]!;
    if (code === 0x22) break;
    if (code < 0x20 || code > 0x7e || code === 0x5c) return null;
  }
  if (at >= bytes.length || at - start > 256) return null;
  scanAt = at + 1;
  const text = String.fromCharCode.apply(null, bytes.subarray(start, at) as unknown as number[]);
  lastStrings[slot] = text;
  return text;
}

export function toRunEvent(envelope: StoredEnvelope, streamSeq: number, runId: string): RunEvent {
  const { event } = envelope;
  return { id: encodeEventId({ streamSeq, runSeq: event.sequence, runId }), ...event };
}

export function unavailable(cause: unknown): ApiError {
  if (cause instanceof ApiError) return cause;
  const err = new ApiError("event_history_unavailable", { retryAfterS: 1 });
  (err as { cause?: unknown }).cause = cause;
  return err;
}

/** Runs `fn`, turning every failure that is not already an API error into 503 event_history_unavailable. */
export async function withUnavailable<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw unavailable(err);
  }
}
