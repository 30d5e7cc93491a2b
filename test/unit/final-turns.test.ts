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
  const cache = new FinalTurnCache(128 * 1024);
  const text = "x".repeat(400); // ~1.4 KiB per turn with the fixed allowance (2 KiB kept at most)
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

/** A loader whose reads wait for `release`, counting its calls; each call answers the next of `docs` (the last one repeated). */
function slowLoader(...docs: Array<TurnDoc | Error>) {
  const calls = { n: 0 };
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const load = async () => {
    const doc = docs[Math.min(calls.n++, docs.length - 1)]!;
    await gate;
    if (doc instanceof Error) throw doc;
    return doc;
  };
  return { calls, load, release };
}

test("final-turns - requests for a turn being read share that read when it is final, a turn too large to keep included", async (t) => {
  for (const text of ["hello", "y".repeat(4096)]) {
    const cache = new FinalTurnCache(128 * 1024);
    const { calls, load, release } = slowLoader(turn("turn_1", TurnStatus.completed, text));
    const all = Array.from({ length: 20 }, () => cache.get("turn_1", load));
    release();
    const answers = await Promise.all(all);
    t.is(calls.n, 1, `one read for 20 requests (${text.length} characters)`);
    t.true(answers.every((a) => a?.status === TurnStatus.completed && a.output[0]?.type === "output_text"));
    await cache.get("turn_1", load);
    t.is(calls.n, text.length > 2048 ? 2 : 1, "kept when small; a turn too large is read again later");
  }
});

test("final-turns - a request that joined the read of a turn not final then, or of a read that failed, reads the turn itself", async (t) => {
  const cache = new FinalTurnCache();
  const running = slowLoader(turn("turn_1", TurnStatus.in_progress), turn("turn_1", TurnStatus.completed));
  const first = cache.get("turn_1", running.load);
  const second = cache.get("turn_1", running.load);
  running.release();
  t.is((await first)!.status, TurnStatus.in_progress);
  t.is((await second)!.status, TurnStatus.completed, "the joiner's own read sees the turn final");
  t.is(running.calls.n, 2);

  const failing = slowLoader(new Error("store away"), turn("turn_2", TurnStatus.completed));
  const a = cache.get("turn_2", failing.load);
  const b = cache.get("turn_2", failing.load);
  failing.release();
  await t.throwsAsync(a, { message: "store away" });
  t.is((await b)!.status, TurnStatus.completed);
  t.is(failing.calls.n, 2);
});

test("final-turns - the size estimate counts every member kept (a turn's actions too), not only its input and output", async (t) => {
  const cache = new FinalTurnCache(128 * 1024); // a turn of over 2 KiB is not kept
  const plain = loader(turn("turn_plain", TurnStatus.completed));
  await cache.get("turn_plain", plain.load);
  await cache.get("turn_plain", plain.load);
  t.is(plain.calls.n, 1, "the same turn without actions is kept");
  const gated = { ...turn("turn_actions", TurnStatus.completed), actions: [{ id: "act_1", tool: "bash", args: "z".repeat(2048) }] } as unknown as TurnDoc;
  const { calls, load } = loader(gated);
  await cache.get("turn_actions", load);
  await cache.get("turn_actions", load);
  t.is(calls.n, 2, "over the per-turn bound (1/64 of the budget): not kept");
});
