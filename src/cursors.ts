import { ApiError, invalid } from "./errors.js";

/**
 * Opaque list cursors: base64url JSON naming the list (`s`), its owner (`o`: the
 * workspace or run that issued it) and the keyset position (`k`, `id`).
 */
export interface Cursor {
  s: string;
  o: string;
  k: string;
  id: string;
}

export function encodeCursor(cursor: Cursor): string {
  return Buffer.from(JSON.stringify(cursor)).toString("base64url");
}

/** Decodes a cursor for list `scope` of `owner`; another owner's cursor is 400 invalid_cursor. */
export function decodeCursor(raw: string, scope: string, owner: string, param = "after"): Cursor {
  let cursor: Cursor;
  try {
    cursor = JSON.parse(Buffer.from(raw, "base64url").toString("utf8")) as Cursor;
  } catch {
    throw invalid(param, "The cursor is not valid.");
  }
  if (!cursor || typeof cursor !== "object" || typeof cursor.s !== "string" || typeof cursor.o !== "string" || typeof cursor.k !== "string" || typeof cursor.id !== "string") {
    throw invalid(param, "The cursor is not valid.");
  }
  if (cursor.s !== scope || cursor.o !== owner) {
    throw new ApiError("invalid_cursor", { param, message: "This cursor was issued for another list." });
  }
  return cursor;
}

/** `limit` query parameter: a whole number in [1, max], default `fallback`. */
export function parseLimit(raw: unknown, fallback: number, max: number): number {
  if (raw === undefined) return fallback;
  const text = String(raw);
  const value = Number(text);
  if (!/^[0-9]+$/.test(text) || !Number.isSafeInteger(value) || value < 1 || value > max) {
    throw invalid("limit", `limit must be a whole number from 1 to ${max}.`);
  }
  return value;
}
