/**
 * Nesting depth of parsed JSON. The store refuses documents nested deeper than 100
 * levels, and recursive code (fingerprints, sanitizing, rendering) should never meet
 * unbounded depth: request bodies deeper than {@link MAX_JSON_DEPTH} are refused at
 * parse time. Iterative, so a hostile depth cannot overflow the stack here.
 */
export const MAX_JSON_DEPTH = 64;

/** The path to the first value nested deeper than `max` levels, or undefined. */
export function tooDeepPath(value: unknown, max = MAX_JSON_DEPTH): string[] | undefined {
  return firstProblem(value, max, false)?.path;
}

/** Why the store cannot hold a value (see {@link unstorablePath}). */
export type Unstorable = "key" | "nested array" | "non-finite number" | "depth";

/**
 * The path to the first part of `value` the store cannot hold, and why, or undefined:
 * - `key`: an object key starting with `$` or holding a `.` (FerretDB refuses both anywhere
 *   in a document; MongoDB reads them as operators and paths in updates) or a NUL (BSON
 *   cannot encode it);
 * - `nested array`: an array directly inside an array (FerretDB 1.24 refuses it);
 * - `non-finite number`: NaN or ±Infinity (FerretDB refuses infinities and drops the
 *   connection on a NaN; `JSON.parse("1e999")` is Infinity);
 * - `depth`: an object or array `maxDepth` levels down (MongoDB refuses documents nested
 *   past 100 levels), only when `maxDepth` is given.
 *
 * One iterative walk, linear in the value's size at any depth (no stack to overflow).
 */
export function unstorablePath(value: unknown, maxDepth = Infinity): { path: string[]; why: Unstorable } | undefined {
  return firstProblem(value, maxDepth, true);
}

/** How many members and items `value` holds at every depth, counted up to just past `limit`. */
export function memberCount(value: unknown, limit: number): number {
  let count = 0;
  const stack: unknown[] = [value];
  while (stack.length > 0 && count <= limit) {
    const current = stack.pop();
    if (current === null || typeof current !== "object") continue;
    for (const key in current) {
      if (++count > limit) return count;
      const child = (current as Record<string, unknown>)[key];
      if (child !== null && typeof child === "object") stack.push(child);
    }
  }
  return count;
}

/** The one walk of both checks: depth always, what the store refuses when `storable` is asked. */
function firstProblem(value: unknown, maxDepth: number, storable: boolean): { path: string[]; why: Unstorable } | undefined {
  // Each entry links to its parent: the path is built once, for the part found.
  type Step = { key: string; parent: Step | null };
  const pathOf = (step: Step | null): string[] => {
    const path: string[] = [];
    for (let s = step; s; s = s.parent) path.push(s.key);
    return path.reverse();
  };
  const nonFinite = (v: unknown): boolean => typeof v === "number" && !Number.isFinite(v);
  if (storable && nonFinite(value)) return { path: [], why: "non-finite number" };
  const stack: Array<{ value: unknown; at: Step | null; depth: number }> = [{ value, at: null, depth: 0 }];
  while (stack.length > 0) {
    const { value: current, at, depth } = stack.pop()!;
    if (current === null || typeof current !== "object") continue;
    if (depth >= maxDepth) return { path: pathOf(at), why: "depth" };
    const list = Array.isArray(current);
    for (const [key, child] of Object.entries(current)) {
      const step = { key, parent: at };
      if (storable) {
        if (!list && (key.startsWith("$") || key.includes(".") || key.includes("\u0000"))) return { path: pathOf(step), why: "key" };
        if (list && Array.isArray(child)) return { path: pathOf(step), why: "nested array" };
        if (nonFinite(child)) return { path: pathOf(step), why: "non-finite number" };
      }
      if (child !== null && typeof child === "object") stack.push({ value: child, at: step, depth: depth + 1 });
    }
  }
  return undefined;
}

/** The field a too-deep path names: its first `segments` segments (`config.script.0.tool_call.arguments`). */
export function fieldOfPath(path: readonly string[], segments = 5): string {
  return path.slice(0, segments).join(".");
}
