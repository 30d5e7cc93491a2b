/**
 * The tag rules of runs-api.md written out by hand, as an oracle for the TagSchema the
 * routes validate with (its regex is easy to get subtly wrong): why a value is not a
 * valid tag, or undefined.
 */
const MAX_TAG_LENGTH = 64;
// Control characters (C0, DEL, C1) and the Unicode line/paragraph separators.
const CONTROL = /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/;

export function tagProblem(tag: unknown): string | undefined {
  if (typeof tag !== "string") return "a tag must be a string";
  const length = [...tag].length;
  if (length < 1 || length > MAX_TAG_LENGTH) return `a tag must be 1 to ${MAX_TAG_LENGTH} characters`;
  if (tag.trim() === "") return "a tag must not be whitespace only";
  if (CONTROL.test(tag)) return "a tag must not contain control characters";
  return undefined;
}
