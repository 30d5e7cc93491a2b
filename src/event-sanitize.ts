import { createHash } from "node:crypto";

/**
 * What of an event's data is stored (spec Events rules 4–5). Pure; never mutates its input
 * (the turn's output keeps what the stored event drops).
 *
 * 1. Image parts (pi-ai `ImageContent`: `type: "image"`, base64 `data`, `mimeType`), anywhere
 *    in the data of any event, become `{type, mimeType, bytes, sha256, omitted: "not_persisted"}`.
 * 2. Inline `data:image/<subtype>;base64,<…>` URLs inside string values become
 *    `[image omitted: image/<subtype>, <decoded bytes> bytes]`, in every event type except
 *    the streamed fragments `text_delta` and `toolcall_delta`, which are stored as written.
 * 3. Depth: data nested more than {@link MAX_EVENT_DATA_DEPTH} levels (a model's tool call can
 *    be nested at any depth) is stored as `{omitted: "unserializable"}`, as data that JSON
 *    cannot write is. The bound is ours, the same on every Node version: how deep
 *    `JSON.stringify` goes is the engine's (Node 20 throws past ~10⁴ levels; Node 26 writes
 *    10⁵), and the walks below are recursive.
 * 4. Size: when the JSON of the data exceeds its budget, strings are replaced, largest first
 *    (only strings over {@link MIN_TRUNCATED_STRING_BYTES}), by `[truncated: <utf8 bytes> bytes]`
 *    until it fits. If that is not enough (many small values), the smallest single object or
 *    array whose replacement makes it fit becomes `{truncated: true, originalBytes, sha256}`
 *    (bytes and sha256 of its JSON); that may be the whole data as a last resort.
 */

/** Limit of one stored event's JSON (spec Limits: "about 675 KiB of JSON"). */
export const MAX_STORED_EVENT_BYTES = 675 * 1024;

/** Deepest nesting of an event's data that is stored (point 3 of the module comment). */
export const MAX_EVENT_DATA_DEPTH = 1_000;

/** Thrown inside the walk when the data is nested past {@link MAX_EVENT_DATA_DEPTH}. */
class TooDeep extends Error {}

/** Room left for the event's other fields when only its data is measured. */
export const EVENT_ENVELOPE_ALLOWANCE_BYTES = 1024;

/** Strings at or below this size are never replaced one by one (a marker would save little). */
export const MIN_TRUNCATED_STRING_BYTES = 1024;

/** Event types stored as written: fragments of a field, not a whole field (the spec's event rule 4). */
export const FRAGMENT_EVENT_TYPES: ReadonlySet<string> = new Set(["text_delta", "toolcall_delta"]);

export interface OmittedImage {
  type: "image";
  mimeType: string;
  bytes: number;
  sha256: string;
  omitted: "not_persisted";
}

export interface TruncatedValue {
  truncated: true;
  originalBytes: number;
  sha256: string;
}

export interface SanitizeOptions {
  /** Budget for the JSON of `data`; default leaves {@link EVENT_ENVELOPE_ALLOWANCE_BYTES} for the rest of the event. */
  maxDataBytes?: number;
}

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type Container = Json[] | { [key: string]: Json };

/**
 * Returns the data to store for an event of `type` (a new value; `data` is not changed).
 * Never throws: data that cannot be stored as it is becomes `{omitted: "unserializable"}`.
 */
export function sanitizeEvent(type: string, data: unknown, options: SanitizeOptions = {}): Json {
  const maxDataBytes = options.maxDataBytes ?? MAX_STORED_EVENT_BYTES - EVENT_ENVELOPE_ALLOWANCE_BYTES;
  try {
    // The JSON round trip is the stored form (toJSON, undefined, NaN handled as JSON does)
    // and a deep copy, so the caller's objects stay untouched.
    const text = JSON.stringify(data);
    const tree = text === undefined ? null : (JSON.parse(text) as Json);
    // The first walk bounds the depth (TooDeep) before any other recursion meets it.
    return fitToSize(omitImages(tree, !FRAGMENT_EVENT_TYPES.has(type), 0), maxDataBytes);
  } catch {
    // Not JSON (a BigInt, a cycle, a throwing toJSON), too deep, or deeper than the stack.
    return { omitted: "unserializable" };
  }
}

function isImagePart(value: { [key: string]: Json }): value is { type: "image"; data: string; mimeType: string } {
  return value.type === "image" && typeof value.data === "string" && typeof value.mimeType === "string";
}

/** `depth`: how many objects and arrays hold `value`. */
function omitImages(value: Json, replaceDataUrls: boolean, depth: number): Json {
  if (typeof value === "string") return replaceDataUrls ? replaceImageDataUrls(value) : value;
  if (value === null || typeof value !== "object") return value;
  if (depth >= MAX_EVENT_DATA_DEPTH) throw new TooDeep();
  if (Array.isArray(value)) return value.map((item) => omitImages(item, replaceDataUrls, depth + 1));
  if (isImagePart(value)) return omittedImage(value.mimeType, Buffer.from(value.data, "base64"));
  const out: { [key: string]: Json } = {};
  for (const [key, item] of Object.entries(value)) {
    const kept = omitImages(item, replaceDataUrls, depth + 1);
    // A model's key "__proto__" stays a key: assigning it would set the copy's prototype instead.
    if (key === "__proto__") Object.defineProperty(out, key, { value: kept, enumerable: true, writable: true, configurable: true });
    else out[key] = kept;
  }
  return out;
}

export function omittedImage(mimeType: string, decoded: Uint8Array): OmittedImage & { [key: string]: Json } {
  return {
    type: "image",
    mimeType,
    bytes: decoded.length,
    sha256: createHash("sha256").update(decoded).digest("hex"),
    omitted: "not_persisted",
  };
}

const DATA_URL = /data:image\/([A-Za-z0-9.+-]+)(?:;[A-Za-z0-9_.+-]+=[A-Za-z0-9_.+-]*)*;base64,([A-Za-z0-9+/]*)(={0,2})/g;

/** Replaces every inline base64 image data URL in `text` by its marker. */
export function replaceImageDataUrls(text: string): string {
  if (!text.includes("data:image/")) return text;
  return text.replace(DATA_URL, (_match, subtype: string, payload: string) => {
    const bytes = Math.floor((payload.length * 3) / 4);
    return `[image omitted: image/${subtype}, ${bytes} bytes]`;
  });
}

function jsonBytes(value: Json): number {
  return Buffer.byteLength(JSON.stringify(value), "utf8");
}

function truncatedStringMarker(text: string): string {
  return `[truncated: ${Buffer.byteLength(text, "utf8")} bytes]`;
}

function truncatedValue(value: Json): TruncatedValue & { [key: string]: Json } {
  const json = JSON.stringify(value);
  return { truncated: true, originalBytes: Buffer.byteLength(json, "utf8"), sha256: createHash("sha256").update(json, "utf8").digest("hex") };
}

interface Slot {
  parent: Container;
  key: string | number;
}

function setSlot(slot: Slot, value: Json): void {
  (slot.parent as Record<string | number, Json>)[slot.key] = value;
}

function fitToSize(tree: Json, maxBytes: number): Json {
  let total = jsonBytes(tree);
  if (total <= maxBytes) return tree;
  // A holder gives the root a slot like every other value; JSON sizes are additive, so a
  // replacement changes the total by exactly (new size − old size).
  const holder: Json[] = [tree];

  // 1. Large strings, largest first.
  const strings: Array<Slot & { value: string; size: number }> = [];
  const collect = (value: Json, slot: Slot): void => {
    if (typeof value === "string") {
      const size = jsonBytes(value);
      if (size > MIN_TRUNCATED_STRING_BYTES) strings.push({ ...slot, value, size });
    } else if (Array.isArray(value)) {
      value.forEach((item, index) => collect(item, { parent: value, key: index }));
    } else if (value !== null && typeof value === "object") {
      for (const [key, item] of Object.entries(value)) collect(item, { parent: value, key });
    }
  };
  collect(tree, { parent: holder, key: 0 });
  strings.sort((a, b) => b.size - a.size);
  for (const entry of strings) {
    if (total <= maxBytes) break;
    const marker = truncatedStringMarker(entry.value);
    setSlot(entry, marker);
    total -= entry.size - jsonBytes(marker);
  }
  if (total <= maxBytes) return holder[0];

  // 2. The smallest object or array whose replacement alone makes the data fit.
  const excess = total - maxBytes;
  let best: (Slot & { value: Container; size: number }) | undefined;
  const measure = (value: Json, slot: Slot): number => {
    if (value === null || typeof value !== "object") return jsonBytes(value);
    let size: number;
    if (Array.isArray(value)) {
      size = 2 + Math.max(0, value.length - 1);
      value.forEach((item, index) => {
        size += measure(item, { parent: value, key: index });
      });
    } else {
      const entries = Object.entries(value);
      size = 2 + Math.max(0, entries.length - 1);
      for (const [key, item] of entries) size += jsonBytes(key) + 1 + measure(item, { parent: value, key });
    }
    // A marker holds two numbers-ish fields and a 64-char hash: ≤ 130 bytes.
    if (size - 130 >= excess && (!best || size < best.size)) best = { ...slot, value, size };
    return size;
  };
  measure(holder[0], { parent: holder, key: 0 });
  if (best) setSlot(best, truncatedValue(best.value));
  if (jsonBytes(holder[0]) > maxBytes) holder[0] = truncatedValue(holder[0]);
  return holder[0];
}
