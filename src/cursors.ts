import { timingSafeEqual } from "node:crypto";
import { ApiError, invalid } from "./errors.js";
import { cursorTag } from "./cursor-key.js";

/**
 * Opaque list cursors: base64url JSON naming the list (`s`), its owner (`o`: the
 * workspace or run that issued it) and the keyset position (`k`, `id`), then `.` and a
 * tag (HMAC under the service's cursor key, src/cursor-key.ts): a cursor the service did
 * not issue for this list is 400 `invalid_cursor`, never a position it looks up.
 */
export interface Cursor {
  s: string;
  o: string;
  k: string;
  id: string;
}

const TAG_BYTES = 16;

export function encodeCursor(cursor: Cursor): string {
  const body = Buffer.from(JSON.stringify({ s: cursor.s, o: cursor.o, k: cursor.k, id: cursor.id })).toString("base64url");
  return `${body}.${cursorTag(["list", body], TAG_BYTES).toString("base64url")}`;
}

/** Decodes a cursor for list `scope` of `owner`; another owner's cursor is 400 invalid_cursor. */
export function decodeCursor(raw: string, scope: string, owner: string, param = "after"): Cursor {
  const [body, tag, ...rest] = typeof raw === "string" ? raw.split(".") : [];
  const given = Buffer.from(tag ?? "", "base64url");
  const expected = body ? cursorTag(["list", body], TAG_BYTES) : undefined;
  if (!body || rest.length > 0 || !expected || given.length !== TAG_BYTES || !timingSafeEqual(given, expected)) {
    throw new ApiError("invalid_cursor", { param, message: "The cursor is not valid." });
  }
  let cursor: Cursor;
  try {
    cursor = JSON.parse(Buffer.from(body, "base64url").toString("utf8")) as Cursor;
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
