import test from "ava";
import { decodeFinalNotice, encodeFinalNotice, FINAL_NOTICE_MAX_BYTES } from "../../src/final-notice.js";
import { renderRun } from "../../src/render.js";
import type { RunDoc, TurnDoc } from "../../src/documents.js";
import { TurnStatus } from "../../src/domain.js";

const run: RunDoc = {
  _id: "run_A", workspace_id: "ws_1", agent_id: "agt_1", agent_version: 1, versions: [1], partition: 3, state: "idle", tags: ["b", "a"],
  plan: "solo", retention_s: 3600, event_retention_s: 3600, created_at: 1_000_000, last_activity_at: 1_002_000, expires_at: 9_000_000,
  epoch: 1, turn_count: 1, latest_turn_id: "turn_A", active_turn_id: null, queued_turn_id: null, event_seq: 12,
};
const turn = (status: TurnStatus, text = "hi"): TurnDoc => ({
  _id: "turn_A", run_id: "run_A", workspace_id: "ws_1", index: 0, status, agent_version: 1, input: [{ type: "input_text", text }],
  output: [{ type: "output_text", text }], error: null, created_at: 1_000_000, started_at: 1_000_100, completed_at: 1_002_000,
  duration_ms: 1900, transcript: [{ secret: "transcripts are never rendered" }], disposition: "created", steer_ids: [], first_event_seq: 1, epoch: 1,
});
const bytes = (s: string) => new TextEncoder().encode(s);

test("final notice - the view round-trips for its run and turn, as renderRun made it (no transcript)", (t) => {
  const view = renderRun(run, turn(TurnStatus.completed, "héllo ✓"));
  const payload = encodeFinalNotice(view);
  t.false(payload.includes("transcripts are never rendered"));
  t.deepEqual(decodeFinalNotice(bytes(payload), "run_A", "turn_A"), JSON.parse(JSON.stringify(view)));
});

test("final notice - every final status is carried; a turn that is not final is not taken", (t) => {
  for (const status of Object.values(TurnStatus)) {
    const decoded = decodeFinalNotice(bytes(encodeFinalNotice(renderRun(run, turn(status)))), "run_A", "turn_A");
    const final = ["completed", "failed", "cancelled", "incomplete"].includes(status);
    t.is(decoded !== undefined, final, status);
  }
});

test("final notice - another run's or turn's view, an empty, cut or non-JSON payload: undefined (the store is read)", (t) => {
  const payload = encodeFinalNotice(renderRun(run, turn(TurnStatus.completed)));
  t.is(decodeFinalNotice(bytes(payload), "run_B", "turn_A"), undefined);
  t.is(decodeFinalNotice(bytes(payload), "run_A", "turn_B"), undefined);
  t.is(decodeFinalNotice(new Uint8Array(), "run_A", "turn_A"), undefined);
  t.is(decodeFinalNotice(bytes(payload.slice(0, -1)), "run_A", "turn_A"), undefined);
  for (const junk of ["null", "[]", "42", '"x"', "{}", '{"id":"run_A"}', '{"id":"run_A","turn":null}', "\u0000\u00ff"]) {
    t.is(decodeFinalNotice(bytes(junk), "run_A", "turn_A"), undefined, junk);
  }
});

test("final notice - a view past the limit in bytes is left out (an empty notice), one at it is carried", (t) => {
  // Two-byte characters: the limit counts UTF-8 bytes, not characters.
  const view = renderRun(run, turn(TurnStatus.completed, "é".repeat(5000)));
  const json = JSON.stringify(view);
  const bytes = Buffer.byteLength(json);
  t.true(bytes > json.length);
  t.is(encodeFinalNotice(view, bytes), json);
  t.is(encodeFinalNotice(view, bytes - 1), "");
  t.is(encodeFinalNotice(view, json.length), "");
  t.is(encodeFinalNotice(undefined), "");
  // The default carries a common turn and leaves a large one to be read.
  t.not(encodeFinalNotice(view), "");
  t.is(encodeFinalNotice(renderRun(run, turn(TurnStatus.completed, "x".repeat(FINAL_NOTICE_MAX_BYTES)))), "");
});
