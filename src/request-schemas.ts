import { z } from "zod";
import { ApiError, invalid } from "./errors.js";

/**
 * What every request part (body, query, path) is validated with: zod schemas that the
 * route declarations give to Fastify (gateway/operation.ts), and the one translation of a
 * refused request into the contract's 400 (or 413) naming the parameter.
 *
 * Conventions the schemas follow so that translation stays mechanical:
 * - a field's own message says what it must be ("must be a run id."); the answer prefixes
 *   the field's path ("run_id: must be a run id.");
 * - a rule across fields is a refinement whose custom issue carries a whole sentence and,
 *   in `params`, the parameter it names and, for size limits, `code: "payload_too_large"`.
 */

/**
 * How an error names its parameter: the top-level field (`input` for a fault in
 * `input.0.text`) or the whole dotted path (`config.network.allow.0`, for the nested
 * documents of deployments).
 */
export type ParamStyle = "field" | "path";

/** The params a refinement's custom issue may carry. */
export interface IssueParams {
  param?: string | null;
  code?: "payload_too_large";
}

/** Turns a refused request into the answer: the first issue, an unknown field before anything else. */
export function requestError(error: z.ZodError, style: ParamStyle = "field"): ApiError {
  const issue = innermost(error.issues.find((i) => i.code === "unrecognized_keys" && i.path.length === 0) ?? error.issues[0]!);
  const path = issue.path.map(String);
  if (issue.code === "unrecognized_keys") path.push(issue.keys[0]!);
  const dotted = path.join(".");
  const params = issue.code === "custom" ? ((issue.params ?? {}) as IssueParams) : {};
  const param = params.param !== undefined ? params.param : (style === "field" ? path[0] : dotted) || null;
  if (issue.code === "unrecognized_keys") return invalid(param, `Unknown field ${dotted}.`);
  // refuse()'s issues name their param and are whole sentences; every other issue, a
  // refinement's included, is a predicate its field's path is put before.
  const message = (issue.code === "custom" && params.param !== undefined) || dotted === "" ? issue.message : `${dotted}: ${issue.message}`;
  if (params.code === "payload_too_large") return new ApiError("payload_too_large", { param, message });
  return invalid(param, message);
}

/**
 * A value that matched none of a union's forms is answered for the one form whose type it
 * has (`input: [{type: "input_text", text: 1}]` is an array, so the answer is about
 * `input.0.text`, not "a string or an array"). When no form, or several, took the value's
 * type, the union's own issue stands: the request could have meant any of them.
 */
function innermost(issue: z.core.$ZodIssue): z.core.$ZodIssue {
  if (issue.code !== "invalid_union") return issue;
  const typed = issue.errors.map((branch) => branch[0]).filter((first) => first !== undefined && !(first.path.length === 0 && first.code === "invalid_type"));
  if (typed.length !== 1) return issue;
  const only = typed[0]!;
  return innermost({ ...only, path: [...issue.path, ...only.path] });
}

/** Validates `value` (an absent body counts as `{}`) or throws the answer {@link requestError} gives. */
export function parseWith<S extends z.ZodType>(schema: S, value: unknown, style: ParamStyle = "field"): z.output<S> {
  const parsed = schema.safeParse(value === undefined ? {} : value);
  if (!parsed.success) throw requestError(parsed.error, style);
  return parsed.data;
}

/** A JSON body: an object with exactly these fields (anything else: 400 naming the unknown field). */
export function jsonBody<T extends z.core.$ZodLooseShape>(shape: T) {
  return z.strictObject(shape, { error: "The body must be a JSON object." });
}

/** A custom issue: a whole sentence naming `param` (and, for size limits, its 413 code). */
export function refuse(ctx: z.RefinementCtx, param: string | null, message: string, code?: IssueParams["code"]): void {
  ctx.addIssue({ code: "custom", message, path: [], params: code ? { param, code } : { param } });
}

// ---------------------------------------------------------------------------------
// Query parameters arrive as strings (an array when repeated).

/** A query parameter given at most once. */
export const queryOnce = (what = "may be given once.") => z.string({ error: what });

/** A query parameter given once and not empty (ids, cursors). */
export const queryId = () => queryOnce("must be given once, not empty.").min(1, "must be given once, not empty.");

/** A whole number from `min` to `max`, written in digits. */
export function queryInt(min: number, max: number, what: string) {
  return queryOnce(what)
    .regex(/^[0-9]{1,16}$/, what)
    .transform(Number)
    .pipe(z.int().min(min, what).max(max, what));
}

/** `limit`: a page size from 1 to `max`, `fallback` when absent. */
export function queryLimit(max: number, fallback: number) {
  return queryInt(1, max, `must be a whole number from 1 to ${max}.`)
    .default(fallback)
    .describe(`Page size, 1 to ${max}.`);
}

/** `after`: the next_cursor of the previous page; what list it belongs to is checked where it is decoded. */
export const queryCursor = () =>
  queryId().optional().describe("Cursor: next_cursor of the previous page (opaque). A cursor of another list: 400 invalid_cursor.");

/** `true` or `false`, `false` when absent. */
export const queryFlag = () =>
  z
    .enum(["true", "false"], { error: "must be true or false." })
    .transform((value) => value === "true")
    .pipe(z.boolean())
    .default(false);

/** A path parameter that is a positive whole number (deployment versions). */
export const pathVersion = () => queryInt(1, Number.MAX_SAFE_INTEGER, "must be a positive whole number.");

/** A run of percent-encoded bytes. */
const ENCODED_BYTES = /(?:%[0-9a-f]{2})+/gi;

/**
 * The first query parameter of `url` that `reads` (every one when not given) whose
 * percent-encoded bytes are not UTF-8 (`%FF`, `%E2%82`), by its name; undefined when there
 * is none. Such a value names no string, and the query parser (fast-querystring) keeps it
 * as typed, so a tag filter `%FF` would look for those three characters. A `%` not
 * followed by two hex digits is taken as itself, as the parser takes it. The query begins
 * at the first `?` or `#`, as the router takes it.
 */
export function malformedQueryParam(url: string, reads: (name: string) => boolean = () => true): string | undefined {
  const start = url.search(/[?#]/);
  if (start < 0) return undefined;
  for (const pair of url.slice(start + 1).split("&")) {
    const bytes = pair.match(ENCODED_BYTES);
    if (bytes === null) continue;
    const name = decodedOrAsIs(pair.split("=", 1)[0]!);
    if (!reads(name)) continue;
    for (const run of bytes) {
      try {
        decodeURIComponent(run);
      } catch {
        return name;
      }
    }
  }
  return undefined;
}

function decodedOrAsIs(text: string): string {
  try {
    return decodeURIComponent(text.replace(/\+/g, " "));
  } catch {
    return text;
  }
}
