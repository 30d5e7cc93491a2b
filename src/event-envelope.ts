/**
 * A stored event: the encrypted envelope, its headers, and turning it back into the
 * API's event (its id rebuilt from the stream sequence) or its JSON.
 */
import { ApiError } from "./errors.js";
import { openText } from "./event-crypto.js";
import { encodeEventId } from "./event-ids.js";
import type { RunEvent } from "./event-types.js";

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
/** Messages fetched per pull when reading pages. */
/** Bounds a page read if messages vanish (expire) between counting and fetching them. */

export function headerSeq(value: string): number {
  const n = Number(value);
  return Number.isSafeInteger(n) && n > 0 ? n : 0;
}

/** The stored envelope and its JSON text. */
export function decodeStored(key: Uint8Array, data: Uint8Array): { envelope: StoredEnvelope; text: string } {
  const text = openText(key, data);
  return { envelope: JSON.parse(text) as StoredEnvelope, text };
}

export function decodeEnvelope(key: Uint8Array, data: Uint8Array): StoredEnvelope {
  return decodeStored(key, data).envelope;
}

export function decodeStoredOrUnavailable(key: Uint8Array, data: Uint8Array): { envelope: StoredEnvelope; text: string } {
  try {
    return decodeStored(key, data);
  } catch (err) {
    throw unavailable(err);
  }
}

const EVENT_KEY = '"event":';

/**
 * `JSON.stringify(event)` without re-encoding: the appender writes the envelope with
 * `event` as its last member, so the stored text ends with the event's own JSON, and the
 * API's event is that JSON with `id` put first. Falls back to encoding anything else.
 */
export function eventJson(event: RunEvent, storedText: string): string {
  const at = storedText.indexOf(EVENT_KEY);
  if (at > 0 && storedText.charCodeAt(at + EVENT_KEY.length) === 0x7b /* { */ && storedText.endsWith("}}")) {
    const body = storedText.slice(at + EVENT_KEY.length + 1, -1);
    return body === "}" ? `{"id":${JSON.stringify(event.id)}}` : `{"id":${JSON.stringify(event.id)},${body}`;
  }
  return JSON.stringify(event);
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
