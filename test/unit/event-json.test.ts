import test from "ava";
import { eventJson } from "../../src/event-envelope.js";
import type { RunEvent } from "../../src/event-types.js";

/** An event as the appender stores it (envelope members in the appender's order) and as the API shows it. */
function stored(event: Omit<RunEvent, "id">, tf?: number): { text: string; api: RunEvent } {
  const text = JSON.stringify({ v: 1, ms: 1_763_750_000_123, ...(tf === undefined ? {} : { tf }), event });
  return { text, api: { id: "evt_AQIDBAUGBwgJ", ...event } };
}

const shell = (data: unknown, turn: string | null = "turn_1"): Omit<RunEvent, "id"> => ({
  sequence: 42,
  source: "runtime",
  type: "text_delta",
  run_id: "run_1",
  turn_id: turn,
  created_at: 1_763_750_000,
  data,
});

test("eventJson - equals JSON.stringify of the API event for every kind of stored event", (t) => {
  const datas: unknown[] = [
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
  for (const data of datas) {
    for (const tf of [undefined, 7]) {
      for (const turn of ["turn_1", null]) {
        const { text, api } = stored(shell(data, turn), tf);
        t.is(eventJson(api, text), JSON.stringify(api), JSON.stringify({ data, tf, turn }));
      }
    }
  }
});

test("eventJson - text not shaped like the appender's falls back to encoding the event", (t) => {
  const { api } = stored(shell({ delta: "x" }));
  t.is(eventJson(api, '{"v":1,"ms":1}'), JSON.stringify(api));
  t.is(eventJson(api, '{"event":"not an object"}'), JSON.stringify(api));
  t.is(eventJson(api, ""), JSON.stringify(api));
});
