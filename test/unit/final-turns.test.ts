import test from "ava";
import { FinalTurnCache } from "../../gateway/final-turns.js";
import { TurnStatus, type TurnStatus as Status } from "../../src/domain.js";
import type { TurnDoc } from "../../src/documents.js";

function turn(id: string, status: Status, text = "hello"): TurnDoc {
  return {
    _id: id,
    run_id: "run_1",
    workspace_id: "ws_1",
    index: 0,
    status,
    agent_version: 1,
    input: [{ type: "input_text", text: "hi" }],
    output: [{ type: "output_text", text }],
    error: null,
    created_at: 1,
    started_at: 1,
    completed_at: status === TurnStatus.in_progress ? null : 2,
    duration_ms: 1,
    transcript: [{ role: "user", content: "a long session" }],
    disposition: "created",
    steer_ids: [],
    first_event_seq: 1,
    epoch: 1,
  };
}

/** A loader that counts its calls. */
function loader(doc: TurnDoc | null) {
  const calls = { n: 0 };
  return { calls, load: async () => (calls.n++, doc) };
}

test("final-turns - a final turn is read once, then served from memory without its transcript", async (t) => {
  const cache = new FinalTurnCache();
  for (const status of [TurnStatus.completed, TurnStatus.failed, TurnStatus.cancelled, TurnStatus.incomplete]) {
    const { calls, load } = loader(turn(`turn_${status}`, status));
    const first = await cache.get(`turn_${status}`, load);
    const second = await cache.get(`turn_${status}`, load);
    t.is(calls.n, 1, status);
    t.is(first!.status, status);
    t.deepEqual(second!.output, [{ type: "output_text", text: "hello" }]);
    t.deepEqual(second!.transcript, []);
  }
});

test("final-turns - a turn not final yet, or missing, is read every time", async (t) => {
  const cache = new FinalTurnCache();
  for (const status of [TurnStatus.queued, TurnStatus.in_progress, TurnStatus.cancelling]) {
    const { calls, load } = loader(turn(`turn_${status}`, status));
    await cache.get(`turn_${status}`, load);
    await cache.get(`turn_${status}`, load);
    t.is(calls.n, 2, status);
  }
  const missing = loader(null);
  t.is(await cache.get("turn_none", missing.load), null);
  t.is(await cache.get("turn_none", missing.load), null);
  t.is(missing.calls.n, 2);
  t.is(cache.size, 0);
});

test("final-turns - the byte budget evicts the least recently used; a very large turn is not kept", async (t) => {
  const cache = new FinalTurnCache(64 * 1024);
  const text = "x".repeat(400); // ~1 KiB per turn with the fixed allowance
  for (let i = 0; i < 200; i++) await cache.get(`turn_${i}`, async () => turn(`turn_${i}`, TurnStatus.completed, text));
  t.true(cache.size < 200 && cache.size > 20, `kept ${cache.size}`);
  // The oldest went first; the newest is still there.
  const oldest = loader(turn("turn_0", TurnStatus.completed, text));
  await cache.get("turn_0", oldest.load);
  t.is(oldest.calls.n, 1);
  const newest = loader(turn("turn_199", TurnStatus.completed, text));
  await cache.get("turn_199", newest.load);
  t.is(newest.calls.n, 0);
  const huge = loader(turn("turn_huge", TurnStatus.completed, "y".repeat(2048)));
  await cache.get("turn_huge", huge.load);
  await cache.get("turn_huge", huge.load);
  t.is(huge.calls.n, 2);
});
