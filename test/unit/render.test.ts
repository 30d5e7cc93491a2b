import test from "ava";
import { withoutUrlCredentials } from "../../src/render.js";

/** The rule as one backtracking regex, as it was written first: the reference the linear version must match. */
const REFERENCE = /([a-z][a-z0-9+.-]*:[\\/]*)[^\s"'<>]*@/gi;
const reference = (text: string) => text.replace(REFERENCE, "$1***@");

test("render - withoutUrlCredentials hides a URL's user name and password in the forms a parser takes", (t) => {
  t.is(withoutUrlCredentials('Unknown model "https://user:pw@203.0.113.7/v1"'), 'Unknown model "https://***@203.0.113.7/v1"');
  t.is(withoutUrlCredentials("https:user:pw@h/v1"), "https:***@h/v1");
  t.is(withoutUrlCredentials("https:\\\\user@h"), "https:\\\\***@h");
  t.is(withoutUrlCredentials("x https://u:p/w@h y ftp://a@b"), "x https://***@h y ftp://***@b");
  t.is(withoutUrlCredentials("mail me at someone@example.com"), "mail me at someone@example.com");
  t.is(withoutUrlCredentials("1:x@h"), "1:x@h");
});

test("render - withoutUrlCredentials does what the reference regex does, for every text of up to 6 characters from the characters that matter", (t) => {
  const alphabet = ["a", "Z", "1", "+", ":", "/", "\\", "@", " ", '"'];
  let checked = 0;
  const walk = (prefix: string): void => {
    if (withoutUrlCredentials(prefix) !== reference(prefix)) t.fail(`differs for ${JSON.stringify(prefix)}`);
    checked++;
    if (prefix.length < 6) for (const c of alphabet) walk(prefix + c);
  };
  walk("");
  t.is(checked, 1_111_111);
});

test("render - withoutUrlCredentials matches the reference on random longer texts", (t) => {
  const alphabet = 'aZ9+.-:/\\@ "\'<>\u00a0é';
  let seed = 7;
  const next = () => (seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648);
  for (let i = 0; i < 20_000; i++) {
    let text = "";
    const length = 7 + (next() % 40);
    for (let j = 0; j < length; j++) text += alphabet[next() % alphabet.length];
    t.is(withoutUrlCredentials(text), reference(text), JSON.stringify(text));
  }
});

test("render - withoutUrlCredentials is linear: a megabyte of the texts that made the regex rescan takes milliseconds", (t) => {
  // The backtracking regex took ~4 s on 50,000 letters; a deployment's error quotes its model string.
  for (const text of ["x".repeat(1 << 20), "a:".repeat(1 << 19), `${"a".repeat(1 << 20)}@`, `@${"a:".repeat(1 << 19)}`, `p/${"1:".repeat(1 << 19)}@`]) {
    const started = process.hrtime.bigint();
    withoutUrlCredentials(text);
    const ms = Number(process.hrtime.bigint() - started) / 1e6;
    t.true(ms < 500, `${ms} ms for ${JSON.stringify(text.slice(0, 8))}… (${text.length})`);
  }
});
