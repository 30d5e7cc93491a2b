import test from "ava";
import { parseRunRequest, runRequestFingerprint, TagSchema } from "../../src/run-request.js";
import { ApiError } from "../../src/errors.js";
import { tagProblem as oracle } from "../helpers/tag-oracle.js";

/** What the schema says of a tag: undefined when valid, else its first issue's message. */
function tagProblem(tag: unknown): string | undefined {
  const parsed = TagSchema.safeParse(tag);
  if (!parsed.success) return parsed.error.issues[0]!.message;
  // The schema and the hand-written rules of runs-api.md agree on every tag asked about.
  if (oracle(tag) !== undefined) throw new Error(`TagSchema accepts ${JSON.stringify(tag)}: ${oracle(tag)}`);
  return undefined;
}

/** The tags a start request keeps (distinct, sorted), or the ApiError it is refused with. */
function parseTags(tags: unknown, _param: "tags"): string[] {
  const request = parseRunRequest({ agent: "agt_1", input: "x", tags });
  return request.kind === "start" ? request.tags : [];
}

function paramOf(body: unknown): string | null | undefined {
  try {
    parseRunRequest(body);
    return undefined;
  } catch (err) {
    if (err instanceof ApiError) return err.param;
    throw err;
  }
}

test("run-request - a string input becomes one input_text part", (t) => {
  const r = parseRunRequest({ agent: "agt_1", input: "hi" });
  t.is(r.kind, "start");
  t.deepEqual(r.input, [{ type: "input_text", text: "hi" }]);
});

test("run-request - on_busy defaults to queue on a continuation", (t) => {
  const r = parseRunRequest({ run_id: "run_1", input: "hi" });
  t.is(r.kind, "continue");
  if (r.kind === "continue") t.is(r.on_busy, "queue");
});

test("run-request - selector and flag rules name their parameter", (t) => {
  t.is(paramOf({ input: "x" }), "agent");
  t.is(paramOf({ agent: "a", run_id: "r", input: "x" }), "run_id");
  t.is(paramOf({ agent: "a", input: "x", background: true, stream: true }), "stream");
  t.is(paramOf({ agent: "a", input: "x", background: "yes" }), "background");
  t.is(paramOf({ run_id: "r", version: 2, input: "x" }), "version");
  t.is(paramOf({ run_id: "r", tags: ["a"], input: "x" }), "tags");
  t.is(paramOf([1, 2]), null);
  t.is(paramOf(null), null);
  t.is(paramOf({ agent: "a", input: "x" }), undefined);
  t.is(paramOf({ agent: "a", input: "x", background: true }), undefined);
});

test("run-request - version must be a positive whole number", (t) => {
  for (const version of [0, -1, 1.5, "1", null, true, Number.MAX_SAFE_INTEGER + 2]) {
    t.is(paramOf({ agent: "a", version, input: "x" }), "version", String(version));
  }
  for (const version of [1, 2, 1000]) t.is(paramOf({ agent: "a", version, input: "x" }), undefined);
});

test("run-request - tag rules: length, whitespace, control characters", (t) => {
  t.is(tagProblem("a"), undefined);
  t.is(tagProblem("x".repeat(64)), undefined);
  t.is(tagProblem(" a "), undefined, "not trimmed, still valid");
  t.is(tagProblem("日本"), undefined);
  t.truthy(tagProblem(""));
  t.truthy(tagProblem("x".repeat(65)));
  t.truthy(tagProblem(" \t "));
  for (const c of ["\t", "\n", "\r", "\u0000", "\u007f", "\u0085", "\u2028"]) t.truthy(tagProblem(`a${c}b`), JSON.stringify(c));
  t.truthy(tagProblem(5));
});

test("run-request - at most 20 distinct tags; repeats count once; result sorted", (t) => {
  const twenty = Array.from({ length: 20 }, (_, i) => `t${String(i).padStart(2, "0")}`);
  t.deepEqual(parseTags([...twenty].reverse().concat(["t00", "t01"]), "tags"), twenty);
  t.throws(() => parseTags([...twenty, "t20"], "tags"), { instanceOf: ApiError });
  t.deepEqual(parseTags(["b", "B", "a"], "tags"), ["B", "a", "b"], "case-sensitive");
});

test("run-request - inline files: base64 checked, 4 MiB decoded limit is 413", (t) => {
  const ok = parseRunRequest({ agent: "a", input: [{ type: "input_file", filename: "a.txt", file_data: "aGk=" }] });
  t.is(ok.input[0]?.type, "input_file");
  t.is(paramOf({ agent: "a", input: [{ type: "input_file", filename: "a.txt", file_data: "***" }] }), "input");
  const big = Buffer.alloc(4 * 1024 * 1024 + 1).toString("base64");
  const err = t.throws(() => parseRunRequest({ agent: "a", input: [{ type: "input_file", filename: "a", file_data: big }] }));
  t.is((err as ApiError).status, 413);
});

test("run-request - an inline file's name has no control character or lone surrogate, and its media_type is a media type without control characters (found by a probe)", (t) => {
  const file = (extra: Record<string, unknown>) => ({ agent: "a", input: [{ type: "input_file", filename: "a.txt", file_data: "aGk=", ...extra }] });
  for (const filename of ["a\u0085b", "a\u009bb", "a\u007fb", "a\nb", "a\ud800b.txt", "\udc00", "x\ud83d"]) t.is(paramOf(file({ filename })), "input", JSON.stringify(filename));
  for (const filename of ["a😀b.txt", "ünï cødé.txt", "a b.txt"]) t.is(paramOf(file({ filename })), undefined, filename);
  for (const media_type of ['text/plain; a="\r\nX-Evil: 1"', "text/plain\u0000", "not a type", "x".repeat(300) + "/y"]) t.is(paramOf(file({ media_type })), "input", JSON.stringify(media_type));
  for (const media_type of ["text/plain", " text/csv; charset=utf-8 ", 'text/plain; name="a b"']) t.is(paramOf(file({ media_type })), undefined, media_type);
  const kept = parseRunRequest(file({ media_type: " text/csv " }));
  t.like(kept.input[0], { media_type: "text/csv" });
});

test("run-request - the fingerprint ignores delivery flags and tag order", (t) => {
  const a = runRequestFingerprint(parseRunRequest({ agent: "a", input: "x", tags: ["b", "a"] }));
  const b = runRequestFingerprint(parseRunRequest({ agent: "a", input: "x", tags: ["a", "b", "a"], background: true }));
  t.deepEqual(a, b);
  const c = runRequestFingerprint(parseRunRequest({ agent: "a", version: 1, input: "x", tags: ["a", "b"] }));
  t.notDeepEqual(a, c);
});

test("run-request - at most 32 parts, 4 MiB of text and 4 MiB of inline files per input, at the edges", (t) => {
  const text = (n: number) => Array.from({ length: n }, () => ({ type: "input_text", text: "a" }));
  t.is(parseRunRequest({ agent: "agt_1", input: text(32) }).input.length, 32);
  t.is(paramOf({ agent: "agt_1", input: text(33) }), "input");
  const status = (input: unknown) => {
    try {
      parseRunRequest({ agent: "agt_1", input });
      return 200;
    } catch (err) {
      return (err as ApiError).status;
    }
  };
  const MiB = 1024 * 1024;
  t.is(status("é".repeat(2 * MiB)), 200, "4 MiB of UTF-8 exactly");
  t.is(status("é".repeat(2 * MiB) + "a"), 413);
  t.is(status([{ type: "input_text", text: "a".repeat(2 * MiB) }, { type: "input_text", text: "a".repeat(2 * MiB + 1) }]), 413, "counted across parts");
  const file = (bytes: number) => ({ type: "input_file", filename: "f.bin", file_data: Buffer.alloc(bytes).toString("base64") });
  t.is(status([file(2 * MiB), file(2 * MiB)]), 200);
  t.is(status([file(2 * MiB), file(2 * MiB), file(1)]), 413);
});

test("run-request - a refused inline file's message names the field it is about (it had been a bare 'is not valid base64.'); a data: URL is told how to send it", (t) => {
  const messageOf = (part: Record<string, unknown>) => {
    try {
      parseRunRequest({ agent: "a", input: [{ type: "input_text", text: "x" }, { type: "input_file", ...part }] });
      return undefined;
    } catch (err) {
      return (err as ApiError).message;
    }
  };
  t.is(messageOf({ filename: "a.txt", file_data: "data:text/plain;base64,aGk=" }), "input.1.file_data: must be base64 alone: for a data: URL, send what follows its comma, and its media type as media_type.");
  t.is(messageOf({ filename: "a.txt", file_data: "a" }), "input.1.file_data: must be base64 alone: for a data: URL, send what follows its comma, and its media type as media_type.");
  t.is(messageOf({ filename: "a.txt" }), "input.1: needs file_id, or filename with file_data.");
  t.regex(messageOf({ filename: "a\ud800", file_data: "aGk=" }) ?? "", /^input\.1\.filename: must be 1 to 255 characters/);
  t.is(messageOf({ filename: "a.txt", file_data: "aGk=" }), undefined);
  // refuse()'s whole sentences stay as they are, and name their field (found by a probe: "at most 20 distinct tags are allowed.").
  t.is((() => { try { parseRunRequest({ agent: "a", input: "x", tags: Array.from({ length: 21 }, (_, i) => `t${i}`) }); } catch (err) { return (err as ApiError).message; } })(), "tags may hold at most 20 distinct tags.");
  t.is(messageOf({ filename: "a.bin", file_data: Buffer.alloc(4 * 1024 * 1024 + 1).toString("base64") }), "An inline file may hold at most 4 MiB; upload larger files with POST /api/v1/files.");
});
