import test from "ava";
import { findOccurrences } from "../../actors/file-tools.js";

/** What the edit tool did before: String.indexOf, then a count of non-overlapping matches. */
function reference(haystack: string, needle: string): { first: number; occurrences: number } {
  const first = haystack.indexOf(needle);
  let occurrences = 0;
  for (let at = first; at >= 0; at = haystack.indexOf(needle, at + needle.length)) occurrences++;
  return { first, occurrences };
}

test("file-tools - findOccurrences agrees with indexOf and a non-overlapping count: every text up to 9 characters and needle up to 4 over 'ab', and random texts", (t) => {
  const words = (length: number): string[] => (length === 0 ? [""] : words(length - 1).flatMap((w) => [`${w}a`, `${w}b`]));
  const needles = [1, 2, 3, 4].flatMap(words);
  let checked = 0;
  for (let length = 0; length <= 9; length++) {
    for (const text of words(length)) {
      for (const needle of needles) {
        const want = reference(text, needle);
        const got = findOccurrences(text, needle);
        if (got.first !== want.first || got.occurrences !== want.occurrences) t.fail(`${JSON.stringify(text)} / ${JSON.stringify(needle)}: ${JSON.stringify(got)}`);
        checked++;
      }
    }
  }
  t.is(checked, 1023 * 30);
  let seed = 5;
  const next = (n: number) => (seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648) % n;
  const alphabet = "abé😀\n";
  for (let i = 0; i < 2_000; i++) {
    const text = Array.from({ length: next(300) }, () => alphabet[next(alphabet.length)]).join("");
    const start = next(text.length + 1);
    const needle = next(2) ? text.slice(start, start + 1 + next(6)) : Array.from({ length: 1 + next(4) }, () => alphabet[next(alphabet.length)]).join("");
    t.deepEqual(findOccurrences(text, needle), reference(text, needle), JSON.stringify([text, needle]));
  }
});

test("file-tools - findOccurrences is linear: an 8 MiB file and a 100,000-character needle that made indexOf rescan take well under a second", (t) => {
  const file = "a".repeat(8 * 1024 * 1024);
  for (const needle of [`${"a".repeat(50_000)}b${"a".repeat(50_000)}`, `${"a".repeat(99_999)}b`, `b${"a".repeat(99_999)}`]) {
    const started = process.hrtime.bigint();
    const found = findOccurrences(file, needle);
    const ms = Number(process.hrtime.bigint() - started) / 1e6;
    t.deepEqual(found, { first: -1, occurrences: 0 });
    t.true(ms < 2_000, `${ms} ms`);
  }
  t.deepEqual(findOccurrences(`${file}b`, `${"a".repeat(99_999)}b`), { first: file.length - 99_999, occurrences: 1 });
});
