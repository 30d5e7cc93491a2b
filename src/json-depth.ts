/**
 * Nesting depth of parsed JSON. The store refuses documents nested deeper than 100
 * levels, and recursive code (fingerprints, sanitizing, rendering) should never meet
 * unbounded depth: request bodies deeper than {@link MAX_JSON_DEPTH} are refused at
 * parse time. Iterative, so a hostile depth cannot overflow the stack here.
 */
export const MAX_JSON_DEPTH = 64;

/** The path to the first value nested deeper than `max` levels, or undefined. */
export function tooDeepPath(value: unknown, max = MAX_JSON_DEPTH): string[] | undefined {
  const stack: Array<{ value: unknown; path: string[] }> = [{ value, path: [] }];
  while (stack.length > 0) {
    const { value: current, path } = stack.pop()!;
    if (current === null || typeof current !== "object") continue;
    if (path.length >= max) return path;
    for (const [key, child] of Object.entries(current)) {
      if (child !== null && typeof child === "object") stack.push({ value: child, path: [...path, key] });
    }
  }
  return undefined;
}

/**
 * The path to the first object key the store cannot hold, or undefined: one starting with
 * `$` or holding a `.` (FerretDB refuses both anywhere in a document; MongoDB reads them as
 * operators and paths in updates) or holding a NUL (BSON cannot encode it). Iterative,
 * as {@link tooDeepPath}.
 */
export function unstorableKeyPath(value: unknown): string[] | undefined {
  // Each entry links to its parent: the path is built once, for the key found.
  type Step = { key: string; parent: Step | null };
  const pathOf = (step: Step | null): string[] => {
    const path: string[] = [];
    for (let s = step; s; s = s.parent) path.push(s.key);
    return path.reverse();
  };
  const stack: Array<{ value: unknown; at: Step | null }> = [{ value, at: null }];
  while (stack.length > 0) {
    const { value: current, at } = stack.pop()!;
    if (current === null || typeof current !== "object") continue;
    const keyed = !Array.isArray(current);
    for (const [key, child] of Object.entries(current)) {
      if (keyed && (key.startsWith("$") || key.includes(".") || key.includes("\u0000"))) return pathOf({ key, parent: at });
      if (child !== null && typeof child === "object") stack.push({ value: child, at: { key, parent: at } });
    }
  }
  return undefined;
}

/** The field a too-deep path names: its first `segments` segments (`config.script.0.tool_call.arguments`). */
export function fieldOfPath(path: readonly string[], segments = 5): string {
  return path.slice(0, segments).join(".");
}
