import test from "ava";
import { FrameBuffer } from "../../gateway/sse-frames.js";
import { seal } from "../../src/event-crypto.js";
import { decodeHeadOrUnavailable, scanHead, type StoredEnvelope } from "../../src/event-envelope.js";
import { type RunEvent, runEventOf, streamedEventOf } from "../../src/event-types.js";
import { ApiError } from "../../src/errors.js";

/**
 * A replayed event is framed from its stored bytes (src/event-envelope.ts scanHead,
 * gateway/sse-frames.ts): the frame must be the one JSON.stringify of the API's event gives.
 */

const KEY = new Uint8Array(32).fill(7);
const ID = "evt_AQIDBAUGBwgJ";

/** An event as the appender stores it (envelope members in the appender's order) and as the API shows it. */
function stored(event: Omit<RunEvent, "id">, tf?: number, ms = 1_763_750_000_123): { text: string; api: RunEvent } {
  const envelope: StoredEnvelope = { v: 1, ms, ...(tf === undefined ? {} : { tf }), event };
  return { text: JSON.stringify(envelope), api: { id: ID, ...event } };
}

const shell = (data: unknown, turn: string | null = "turn_1", type = "text_delta"): Omit<RunEvent, "id"> => ({
  sequence: 42,
  source: "runtime",
  type,
  run_id: "run_1",
  turn_id: turn,
  created_at: 1_763_750_000,
  data,
});

/** The frame gateway/sse.ts wrote before frames were built from bytes. */
function expectedFrame(api: RunEvent): string {
  return `id: ${api.id}\nevent: ${api.type.replace(/[\r\n]/g, " ")}\ndata: ${JSON.stringify(api)}\n\n`;
}

/** The frame's bytes as a string of their byte values (compared byte for byte, not decoded). */
function frameOf(text: string): { frame: string; scanned: boolean } {
  const head = decodeHeadOrUnavailable(KEY, seal(KEY, Buffer.from(text, "utf8")));
  const frames = new FrameBuffer();
  frames.event({ id: ID, sequence: head.sequence, source: head.source, type: head.type, turn_id: head.turn_id, json: head.json });
  return { frame: frames.take()!.toString("latin1"), scanned: scanHead(Buffer.from(text, "utf8")) !== null };
}

/** The bytes the frame must be, as a string of their byte values. */
const bytesOf = (text: string) => Buffer.from(text, "utf8").toString("latin1");

const DATAS: unknown[] = [
  { delta: "plain" },
  { delta: 'quotes " and \\ backslashes, \n line breaks, \t tabs, \u0001 controls' },
  { delta: "unicode: é 漢字 😀 and a lone surrogate \ud800" },
  { delta: '"event": inside a string, and "}}" too' },
  { nested: { deep: [1, 2.5, -0, 1e21, null, true, { a: "b" }] } },
  null,
  {},
  [],
  "a string",
];

test("stored frames - equal the frame of JSON.stringify of the API event for every kind of stored event, read without parsing", (t) => {
  for (const data of DATAS) {
    for (const tf of [undefined, 7]) {
      for (const turn of ["turn_1", null]) {
        const { text, api } = stored(shell(data, turn), tf);
        const { frame, scanned } = frameOf(text);
        t.true(scanned, "the appender's shape is read without parsing");
        t.is(frame, bytesOf(expectedFrame(api)), JSON.stringify({ data, tf, turn }));
      }
    }
  }
});

test("stored frames - what the scan does not take is parsed, and framed the same", (t) => {
  const cases: Array<{ text: string; api: RunEvent }> = [
    stored(shell({ delta: "x" }, "turn_1", 'a "quoted" type')), // an escape in a string
    stored(shell({ delta: "x" }, "turn_1", "line\nbreak")), // a type with a line break: one line
    stored(shell({ delta: "x" }, "turn_1", "typé")), // not ASCII
    stored(shell({ delta: "x" }, "türn")), // not ASCII
    stored(shell({ delta: "x" }), undefined, 1.5), // ms not an integer
    stored({ ...shell({ delta: "x" }), sequence: Number.MAX_SAFE_INTEGER }), // 16 digits: past what the scan reads
  ];
  // Another member order (an older or future writer).
  const reordered = shell({ delta: "x" });
  cases.push({ text: JSON.stringify({ ms: 5, v: 1, event: reordered }), api: { id: ID, ...reordered } });
  const { source: _source, ...noSource } = shell({ delta: "x" });
  cases.push({ text: JSON.stringify({ v: 1, ms: 5, event: { ...noSource, source: "runtime" } }), api: { id: ID, ...noSource, source: "runtime" } });
  for (const { text, api } of cases) {
    const { frame, scanned } = frameOf(text);
    t.false(scanned, text);
    t.is(frame, bytesOf(expectedFrame(api)), text);
  }
});

test("stored frames - a cut envelope is declined up to the end of its data; a changed one is declined or read as JSON.parse reads it", (t) => {
  const { text } = stored(shell({ delta: "abc" }), 3);
  const bytes = Buffer.from(text, "utf8");
  // The scan reads the members before `data` and trusts the authenticated rest (the
  // appender's JSON): a cut before `data` ends is declined.
  const dataEnd = text.lastIndexOf("}}}");
  for (let cut = 0; cut <= dataEnd; cut++) t.is(scanHead(bytes.subarray(0, cut)), null, `cut at ${cut}`);
  // Every single-byte change: the scan either declines, or reads what JSON.parse reads.
  let declined = 0;
  for (let at = 0; at < bytes.length; at++) {
    for (const value of [0x00, 0x22, 0x2c, 0x30, 0x5c, 0x7d, 0xc3]) {
      const changed = Buffer.from(bytes);
      changed[at] = value;
      const head = scanHead(changed);
      if (head === null) {
        declined++;
        continue;
      }
      let parsed: StoredEnvelope;
      try {
        parsed = JSON.parse(changed.toString("utf8")) as StoredEnvelope;
      } catch {
        continue; // not JSON at all: never written by the appender (the box is authenticated)
      }
      t.is(head.ms, parsed.ms);
      t.is(head.sequence, parsed.event.sequence);
      t.is(head.source, parsed.event.source);
      t.is(head.type, parsed.event.type);
      t.is(head.turn_id, parsed.event.turn_id);
      t.deepEqual(JSON.parse(Buffer.from(head.json).toString("utf8")), parsed.event);
    }
  }
  t.true(declined > bytes.length, "most changes are declined");
});

test("stored frames - a box that does not open is 503 event_history_unavailable", (t) => {
  const sealed = seal(KEY, Buffer.from(stored(shell({ delta: "x" })).text, "utf8"));
  sealed[sealed.length - 1] ^= 1;
  const err = t.throws(() => decodeHeadOrUnavailable(KEY, sealed));
  t.true(err instanceof ApiError && err.code === "event_history_unavailable");
  for (const text of ["not json", "{}", "null", '{"v":1,"ms":1,"event":{"sequence":"1"}}', '{"v":1,"event":{"sequence":1}}']) {
    const junkErr = t.throws(() => decodeHeadOrUnavailable(KEY, seal(KEY, Buffer.from(text, "utf8"))), undefined, text);
    t.true(junkErr instanceof ApiError && junkErr.code === "event_history_unavailable", text);
  }
});

test("stored frames - streamed and API events convert both ways", (t) => {
  for (const data of DATAS) {
    const api: RunEvent = { id: ID, ...shell(data) };
    t.is(JSON.stringify(runEventOf(streamedEventOf(api))), JSON.stringify(api));
  }
});

test("frame buffer - gathers frames and text in order, grows past its chunk, and holds nothing once taken", (t) => {
  const frames = new FrameBuffer();
  t.is(frames.take(), null);
  const big = { id: ID, ...shell({ delta: "x".repeat(300_000) }) };
  const small = { id: ID, ...shell({ delta: "é" }) };
  let expected = "";
  for (let i = 0; i < 50; i++) {
    frames.event(streamedEventOf(small));
    expected += expectedFrame(small);
    frames.text(": ping\n\n");
    expected += ": ping\n\n";
  }
  frames.event(streamedEventOf(big));
  expected += expectedFrame(big);
  t.is(frames.size, Buffer.byteLength(expected));
  const taken = frames.take()!;
  t.is(taken.toString("latin1"), bytesOf(expected));
  t.is(frames.size, 0);
  t.is(frames.take(), null);
  // What was taken is the socket's: later frames never write into it.
  const copy = Buffer.from(taken);
  for (let i = 0; i < 200; i++) {
    frames.event(streamedEventOf({ ...small, type: "tÿpé ☃ 😀".repeat(1 + (i % 5)) }));
    frames.text(": ping\n\n");
  }
  frames.event(streamedEventOf(big));
  t.true(frames.take()!.length > 300_000);
  t.true(taken.equals(copy), "a taken buffer is not written again");
  // Non-ASCII types up to the edge of a chunk: each frame whole, in order.
  let text = "";
  for (let i = 0; i < 3_000; i++) {
    const event = { ...small, type: "é".repeat(i % 13), sequence: i };
    frames.event(streamedEventOf(event));
    text += expectedFrame(event);
    if (frames.size >= 64 * 1024) {
      t.is(frames.take()!.toString("latin1"), bytesOf(text));
      text = "";
    }
  }
  t.is(frames.take()!.toString("latin1"), bytesOf(text));
  // An event without members but its id.
  frames.event({ id: ID, sequence: 1, source: "runtime", type: "t", turn_id: null, json: Buffer.from("{}") });
  t.is(frames.take()!.toString("latin1"), `id: ${ID}\nevent: t\ndata: {"id":"${ID}"}\n\n`);
});

test("stored frames - strings that follow one another (the scan reuses the last one read) are read as JSON.parse reads them", (t) => {
  const types = ["text", "text_delta", "text", "t", "text_delta", "text_deltas", "text_delt"];
  const turns = ["turn_1", null, "turn_12", "turn_1", "turn_", null, "turn_1"];
  const runs = ["run_1", "run_1", "run_12", "run_", "run_1", "run_1x", "run_1"];
  for (let round = 0; round < 3; round++) {
    for (let i = 0; i < types.length; i++) {
      const event = { ...shell({ delta: "x" }, turns[(i + round) % turns.length]!, types[i]!), run_id: runs[(i + 2 * round) % runs.length]!, source: i % 2 === 0 ? "runtime" : "platform" } as Omit<RunEvent, "id">;
      const { text } = stored(event);
      const head = scanHead(Buffer.from(text, "utf8"));
      t.truthy(head, text);
      t.deepEqual({ source: head!.source, type: head!.type, turn_id: head!.turn_id }, { source: event.source, type: event.type, turn_id: event.turn_id }, text);
      t.deepEqual(JSON.parse(Buffer.from(head!.json).toString("utf8")), event);
    }
  }
});
