import { createHash } from "node:crypto";
import test from "ava";
import {
  EVENT_ENVELOPE_ALLOWANCE_BYTES,
  MAX_EVENT_DATA_DEPTH,
  MAX_STORED_EVENT_BYTES,
  MIN_TRUNCATED_STRING_BYTES,
  replaceImageDataUrls,
  sanitizeEvent,
} from "../../src/event-sanitize.js";

const sha = (b: Buffer | string) => createHash("sha256").update(b).digest("hex");
const bytesOf = (v: unknown) => Buffer.byteLength(JSON.stringify(v), "utf8");
const png = Buffer.from("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489", "hex");
const pngB64 = png.toString("base64");
const dataUrl = `data:image/png;base64,${pngB64}`;
const DEFAULT_MAX = MAX_STORED_EVENT_BYTES - EVENT_ENVELOPE_ALLOWANCE_BYTES;

test("event-sanitize - MAX_STORED_EVENT_BYTES is 675 KiB", (t) => {
  t.is(MAX_STORED_EVENT_BYTES, 675 * 1024);
});

test("event-sanitize - rule 4: an image part in a tool result becomes its omitted form", (t) => {
  const data = {
    toolCallId: "c1",
    result: { content: [{ type: "text", text: "see image" }, { type: "image", data: pngB64, mimeType: "image/png" }] },
  };
  const out = sanitizeEvent("tool_execution_end", data) as any;
  t.deepEqual(out.result.content[1], { type: "image", mimeType: "image/png", bytes: png.length, sha256: sha(png), omitted: "not_persisted" });
  t.deepEqual(out.result.content[0], { type: "text", text: "see image" });
  t.is(data.result.content[1].data, pngB64, "input untouched");
});

test("event-sanitize - rule 4: image parts are omitted at any depth and in every event type", (t) => {
  const image = { type: "image", data: pngB64, mimeType: "image/jpeg" };
  for (const type of ["message_end", "text_delta", "toolcall_delta", "turn.completed", "future_type"]) {
    const out = sanitizeEvent(type, { a: [{ b: { c: [image] } }], top: image }) as any;
    t.is(out.a[0].b.c[0].omitted, "not_persisted", type);
    t.is(out.a[0].b.c[0].mimeType, "image/jpeg");
    t.is(out.top.bytes, png.length);
    t.false(JSON.stringify(out).includes(pngB64));
  }
});

test("event-sanitize - rule 4: objects that only look like images are kept", (t) => {
  const data = {
    a: { type: "image", mimeType: "image/png" },
    b: { type: "image", data: 42, mimeType: "image/png" },
    c: { type: "picture", data: pngB64, mimeType: "image/png" },
    d: { type: "image", data: pngB64 },
  };
  t.deepEqual(sanitizeEvent("message_end", data), data);
});

test("event-sanitize - rule 4: data URLs in whole fields become markers with media type and decoded size", (t) => {
  const data = {
    message: { role: "toolResult", content: [{ type: "text", text: `before ${dataUrl} after ${dataUrl}` }] },
    note: `data:image/svg+xml;base64,${Buffer.from("<svg/>").toString("base64")}`,
  };
  const out = sanitizeEvent("message_end", data) as any;
  const marker = `[image omitted: image/png, ${png.length} bytes]`;
  t.is(out.message.content[0].text, `before ${marker} after ${marker}`);
  t.is(out.note, "[image omitted: image/svg+xml, 6 bytes]");
  t.true(data.message.content[0].text.includes(dataUrl), "the caller's message (the turn output) keeps it");
});

test("event-sanitize - rule 4: text_delta and toolcall_delta are stored as written", (t) => {
  for (const type of ["text_delta", "toolcall_delta"]) {
    const data = { delta: `x ${dataUrl} y`, contentIndex: 0 };
    t.deepEqual(sanitizeEvent(type, data), data, type);
  }
});

test("event-sanitize - rule 4: decoded sizes follow base64 padding", (t) => {
  for (let n = 0; n < 8; n++) {
    const b64 = Buffer.alloc(n, 1).toString("base64");
    t.is(replaceImageDataUrls(`data:image/gif;base64,${b64}`), `[image omitted: image/gif, ${n} bytes]`);
  }
});

test("event-sanitize - rule 4: data URLs with parameters, and non-image data URLs", (t) => {
  t.is(replaceImageDataUrls(`data:image/png;name=a.png;base64,${pngB64}`), `[image omitted: image/png, ${png.length} bytes]`);
  const text = `data:text/plain;base64,${pngB64} and data:image/png,notbase64`;
  t.is(replaceImageDataUrls(text), text);
});

test("event-sanitize - plain values pass unchanged; undefined and functions drop as in JSON", (t) => {
  t.deepEqual(sanitizeEvent("agent_start", {}), {});
  t.deepEqual(sanitizeEvent("x", { a: 1, b: "s", c: null, d: [true, 1.5e300] }), { a: 1, b: "s", c: null, d: [true, 1.5e300] });
  t.deepEqual(sanitizeEvent("x", { a: undefined, f: () => 1, n: NaN }), { n: null });
  t.is(sanitizeEvent("x", undefined), null);
});

test("event-sanitize - unserializable data is replaced, not thrown", (t) => {
  const a: any = {};
  a.self = a;
  t.deepEqual(sanitizeEvent("x", a), { omitted: "unserializable" });
  t.deepEqual(sanitizeEvent("x", { n: 10n }), { omitted: "unserializable" });
});

test("event-sanitize - depth: data nested up to MAX_EVENT_DATA_DEPTH levels is kept, deeper is replaced, at any depth and on any Node version", (t) => {
  const nested = (levels: number, leaf: unknown = 1): unknown => {
    let v: unknown = leaf;
    for (let i = 0; i < levels; i++) v = i % 2 ? [v] : { k: v };
    return v;
  };
  const kept = nested(MAX_EVENT_DATA_DEPTH);
  t.deepEqual(sanitizeEvent("message_end", kept), kept, `${MAX_EVENT_DATA_DEPTH} objects and arrays deep: as it is`);
  t.deepEqual(sanitizeEvent("message_end", nested(MAX_EVENT_DATA_DEPTH + 1)), { omitted: "unserializable" });
  // Past what JSON.stringify writes on Node 20 (it throws), and what Node 26 writes: the same answer.
  for (const levels of [20_000, 100_000]) {
    t.deepEqual(sanitizeEvent("toolcall_delta", { args: nested(levels) }), { omitted: "unserializable" }, `${levels} levels`);
  }
  // A deep value too large for the event is replaced too, never walked past the bound.
  t.deepEqual(sanitizeEvent("x", nested(MAX_EVENT_DATA_DEPTH + 1, "y".repeat(MAX_STORED_EVENT_BYTES))), { omitted: "unserializable" });
});

test("event-sanitize - rule 5: data within the limit is not truncated", (t) => {
  const data = { text: "a".repeat(DEFAULT_MAX - 20) };
  t.true(bytesOf(data) <= DEFAULT_MAX);
  t.true((sanitizeEvent("message_end", data) as any).text === data.text);
});

test("event-sanitize - rule 5: the largest string becomes [truncated: <utf8 bytes> bytes]", (t) => {
  const big = "é".repeat(400 * 1024); // 800 KiB of UTF-8
  const medium = "m".repeat(200 * 1024);
  const out = sanitizeEvent("message_end", { message: { content: [{ type: "text", text: big }, { type: "text", text: medium }] } }) as any;
  t.is(out.message.content[0].text, `[truncated: ${800 * 1024} bytes]`);
  t.true(out.message.content[1].text === medium, "the smaller string is kept once it fits");
  t.true(bytesOf(out) <= DEFAULT_MAX);
});

test("event-sanitize - rule 5: several strings go, largest first, until it fits", (t) => {
  const data = { a: "a".repeat(400_000), b: "b".repeat(350_000), c: "c".repeat(300_000), d: "d".repeat(100_000) };
  const out = sanitizeEvent("tool_execution_end", data) as any;
  t.is(out.a, "[truncated: 400000 bytes]");
  t.is(out.b, "[truncated: 350000 bytes]");
  t.true(out.c === data.c, "c kept");
  t.true(out.d === data.d, "d kept");
  t.true(bytesOf(out) <= DEFAULT_MAX);
});

test("event-sanitize - rule 5: escaping counts (the stored JSON is measured)", (t) => {
  // 200k newlines are 200 KB of text but 400 KB of JSON; four of them overflow.
  const nl = "\n".repeat(200_000);
  const out = sanitizeEvent("x", { a: nl, b: nl, c: nl, d: nl + "\n" }) as any;
  t.is(out.d, "[truncated: 200001 bytes]");
  t.true(bytesOf(out) <= DEFAULT_MAX);
  t.is([out.a, out.b, out.c].filter((s: string) => s.startsWith("[truncated")).length, 2);
});

test("event-sanitize - rule 5: many small values become {truncated, originalBytes, sha256}", (t) => {
  const numbers = Array.from({ length: 200_000 }, (_, i) => i);
  const data = { kept: "small", numbers };
  const out = sanitizeEvent("tool_execution_end", data) as any;
  const json = JSON.stringify(numbers);
  t.deepEqual(out.numbers, { truncated: true, originalBytes: Buffer.byteLength(json), sha256: sha(json) });
  t.is(out.kept, "small");
  t.true(bytesOf(out) <= DEFAULT_MAX);
});

test("event-sanitize - rule 5: the smallest container that suffices is chosen", (t) => {
  const small = Array.from({ length: 10 }, (_, i) => i);
  const rows = Array.from({ length: 120_000 }, (_, i) => `r${i}`); // strings too small to truncate one by one
  const data = { meta: { small, other: [1, 2, 3] }, payload: { rows, tag: "t" } };
  const out = sanitizeEvent("x", data) as any;
  t.deepEqual(out.meta, data.meta);
  t.is(out.payload.tag, "t");
  t.true(out.payload.rows.truncated);
  t.is(out.payload.rows.sha256, sha(JSON.stringify(rows)));
});

test("event-sanitize - rule 5: strings first, then a container if still over", (t) => {
  const numbers = Array.from({ length: 150_000 }, (_, i) => i); // ~1 MB
  const data = { text: "t".repeat(100_000), numbers };
  const out = sanitizeEvent("x", data) as any;
  t.is(out.text, "[truncated: 100000 bytes]");
  t.true(out.numbers.truncated);
  t.true(bytesOf(out) <= DEFAULT_MAX);
});

test("event-sanitize - rule 5: a root made only of small values is itself replaced", (t) => {
  const data = Array.from({ length: 400_000 }, () => 1);
  const out = sanitizeEvent("x", data) as any;
  t.true(out.truncated);
  t.is(out.originalBytes, bytesOf(data));
});

test("event-sanitize - rule 5: maxDataBytes sets the budget", (t) => {
  const data = { a: "a".repeat(5000), b: "b".repeat(3000), c: "c".repeat(500) };
  const out = sanitizeEvent("x", data, { maxDataBytes: 5000 }) as any;
  t.is(out.a, "[truncated: 5000 bytes]");
  t.true(out.b === data.b);
  t.true(bytesOf(out) <= 5000);
  const tight = sanitizeEvent("x", data, { maxDataBytes: 700 }) as any;
  t.true(bytesOf(tight) <= 700);
  t.true(tight.c === data.c, `strings of ${MIN_TRUNCATED_STRING_BYTES} bytes or less stay`);
});

test("event-sanitize - images are omitted before sizes are measured", (t) => {
  const huge = Buffer.alloc(900 * 1024, 3).toString("base64");
  const out = sanitizeEvent("tool_execution_end", { content: [{ type: "image", data: huge, mimeType: "image/png" }, { type: "text", text: `data:image/png;base64,${huge}` }] }) as any;
  t.is(out.content[0].bytes, 900 * 1024);
  t.is(out.content[1].text, `[image omitted: image/png, ${900 * 1024} bytes]`);
});

test("event-sanitize - a huge data URL in a delta is truncated by size, not by marker", (t) => {
  const huge = Buffer.alloc(700 * 1024, 3).toString("base64");
  const delta = `data:image/png;base64,${huge}`;
  const out = sanitizeEvent("text_delta", { delta }) as any;
  t.is(out.delta, `[truncated: ${delta.length} bytes]`);
});

test("event-sanitize - a key named __proto__ is kept as a key at any depth, never made the stored object's prototype", (t) => {
  const data = JSON.parse('{"__proto__": {"type": "image", "data": "aGk=", "mimeType": "image/png"}, "args": {"__proto__": 5, "b": [{"__proto__": {"x": 1}}]}}');
  const stored = sanitizeEvent("message_end", data) as Record<string, any>;
  const image = `{"type":"image","mimeType":"image/png","bytes":2,"sha256":"${sha(Buffer.from("hi"))}","omitted":"not_persisted"}`;
  t.is(JSON.stringify(stored), `{"__proto__":${image},"args":{"__proto__":5,"b":[{"__proto__":{"x":1}}]}}`);
  t.is(Object.getPrototypeOf(stored), Object.prototype);
  t.is(Object.getPrototypeOf(stored.args), Object.prototype);
  t.true(Object.hasOwn(stored.args.b[0], "__proto__"));
});
