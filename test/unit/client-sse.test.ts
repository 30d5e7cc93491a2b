import test from "ava";
import { SseParser, sseFrames } from "../../client/sse.js";

const WIRE =
  ": ping\n\n" +
  "id: evt_1\nevent: turn.started\ndata: {\"a\":1}\n\n" +
  "id: evt_2\r\nevent: text_delta\r\ndata: line one\r\ndata: line two\r\n\r\n" +
  ":comment without space\n" +
  "retry: 1000\n" +
  "event: error\ndata:{\"error\":{\"code\":\"x\"}}\n\n" +
  "id: evt_3\nevent: cut\ndata: {\"half";

const FRAMES = [
  { id: "evt_1", event: "turn.started", data: '{"a":1}' },
  { id: "evt_2", event: "text_delta", data: "line one\nline two" },
  { event: "error", data: '{"error":{"code":"x"}}' },
];

test("client-sse - frames: id, event, multi-line data, comments ignored, CRLF, unfinished frame dropped", (t) => {
  const parser = new SseParser();
  t.deepEqual(parser.push(WIRE), FRAMES);
});

test("client-sse - the same frames however the text is split", (t) => {
  for (const size of [1, 2, 3, 7, 16]) {
    const parser = new SseParser();
    const frames = [];
    for (let i = 0; i < WIRE.length; i += size) frames.push(...parser.push(WIRE.slice(i, i + size)));
    t.deepEqual(frames, FRAMES, `chunk size ${size}`);
  }
});

test("client-sse - a lone CR ends a line; a CR split from its LF is one line break", (t) => {
  const parser = new SseParser();
  t.deepEqual(parser.push("data: a\r"), []);
  t.deepEqual(parser.push("\n\r\n"), [{ event: "message", data: "a" }]);
  t.deepEqual(parser.push("data: b\r\rdata: c\n\n"), [{ event: "message", data: "b" }, { event: "message", data: "c" }]);
});

function body(chunks: Array<string | Error>): AsyncIterable<Uint8Array> {
  return (async function* () {
    for (const chunk of chunks) {
      if (chunk instanceof Error) throw chunk;
      yield new TextEncoder().encode(chunk);
    }
  })();
}

test("client-sse - sseFrames decodes multi-byte characters split across chunks", async (t) => {
  const bytes = new TextEncoder().encode("data: héllo ✓\n\n");
  const frames = [];
  const split = (async function* () {
    for (const b of bytes) yield Uint8Array.of(b);
  })();
  for await (const frame of sseFrames(split)) frames.push(frame);
  t.deepEqual(frames, [{ event: "message", data: "héllo ✓" }]);
});

test("client-sse - sseFrames rethrows a cut after the complete frames", async (t) => {
  const frames: unknown[] = [];
  const error = await t.throwsAsync(async () => {
    for await (const frame of sseFrames(body(["id: 1\ndata: x\n\nid: 2\nda", new TypeError("terminated")]))) frames.push(frame);
  });
  t.is(error?.message, "terminated");
  t.deepEqual(frames, [{ id: "1", event: "message", data: "x" }]);
});
