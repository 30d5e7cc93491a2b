import test from "ava";
import { createHmac } from "node:crypto";
import { ApiError } from "../../src/errors.js";
import { useCursorKey } from "../../src/cursor-key.js";
import { decodeEventId, encodeEventId, useEventIdVersion } from "../../src/event-ids.js";
import { sipHash24Into } from "../../src/siphash.js";

const RUN = "run_0000000AAAAAAAAAAAAAAA";
const OTHER = "run_0000000BBBBBBBBBBBBBBB";

function invalidCursor(t: any, fn: () => unknown, param = "after") {
  const err = t.throws(fn, { instanceOf: ApiError }) as ApiError;
  t.is(err.code, "invalid_cursor");
  t.is(err.status, 400);
  t.is(err.param, param);
}

test("event-ids - round trip over small and large positions", (t) => {
  for (const [streamSeq, runSeq] of [
    [1, 1],
    [127, 128],
    [16_384, 1],
    [2 ** 32 + 5, 999_999],
    [Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER],
  ]) {
    const id = encodeEventId({ streamSeq, runSeq, runId: RUN });
    t.regex(id, /^evt_[A-Za-z0-9_-]+$/);
    t.deepEqual(decodeEventId(id, RUN), { streamSeq, runSeq });
  }
});

test("event-ids - ids are short and differ per position and run", (t) => {
  const a = encodeEventId({ streamSeq: 10, runSeq: 1, runId: RUN });
  t.true(a.length < 40);
  t.not(a, encodeEventId({ streamSeq: 11, runSeq: 1, runId: RUN }));
  t.not(a, encodeEventId({ streamSeq: 10, runSeq: 2, runId: RUN }));
  t.not(a, encodeEventId({ streamSeq: 10, runSeq: 1, runId: OTHER }));
});

test("event-ids - another run's id is 400 invalid_cursor", (t) => {
  const id = encodeEventId({ streamSeq: 5, runSeq: 3, runId: OTHER });
  invalidCursor(t, () => decodeEventId(id, RUN));
});

test("event-ids - malformed ids are 400 invalid_cursor naming the param", (t) => {
  const good = encodeEventId({ streamSeq: 5, runSeq: 3, runId: RUN });
  const body = good.slice(4);
  for (const bad of [
    "",
    "evt_",
    "evt",
    body,
    "run_" + body,
    "evt_" + body + "=",
    "evt_" + body.slice(0, -1),
    "evt_" + body + "A",
    "evt_!!!!",
    "evt_" + Buffer.from([2, 5, 3, 0, 0, 0, 0, 0, 0]).toString("base64url"),
    "evt_" + Buffer.from([1, 0, 3, 0, 0, 0, 0, 0, 0]).toString("base64url"),
    "evt_" + Buffer.from([1, 0x80, 0x80]).toString("base64url"),
  ]) {
    invalidCursor(t, () => decodeEventId(bad, RUN));
  }
  invalidCursor(t, () => decodeEventId("evt_x", RUN, "Last-Event-ID"), "Last-Event-ID");
});

test("event-ids - a non-canonical varint is rejected so one event has one id", (t) => {
  const good = Buffer.from(encodeEventId({ streamSeq: 5, runSeq: 3, runId: RUN }).slice(4), "base64url");
  // 5 written as 0x85 0x00 instead of 0x05
  const padded = Buffer.concat([good.subarray(0, 1), Buffer.from([0x85, 0x00]), good.subarray(2)]);
  invalidCursor(t, () => decodeEventId("evt_" + padded.toString("base64url"), RUN));
});

test("event-ids - encoding refuses positions below 1", (t) => {
  t.throws(() => encodeEventId({ streamSeq: 0, runSeq: 1, runId: RUN }), { instanceOf: RangeError });
  t.throws(() => encodeEventId({ streamSeq: 1, runSeq: 1.5, runId: RUN }), { instanceOf: RangeError });
});

test("event-ids - an id made up from a run id alone (any stream sequence) is 400 invalid_cursor", (t) => {
  // What a tenant could build without the service's key: version, positions, and a guess of the tag.
  const genuine = Buffer.from(encodeEventId({ streamSeq: 7, runSeq: 2, runId: RUN }).slice(4), "base64url");
  const tag = genuine.subarray(genuine.length - 8);
  for (const streamSeq of [1, 6, 8, 1_000_000]) {
    const forged = Buffer.concat([Buffer.from([3, streamSeq < 128 ? streamSeq : 0x80 | (streamSeq & 0x7f)]), ...(streamSeq < 128 ? [] : [Buffer.from([(streamSeq >> 7) & 0x7f])]), Buffer.from([2]), tag]);
    invalidCursor(t, () => decodeEventId("evt_" + forged.toString("base64url"), RUN));
  }
  for (let i = 0; i < genuine.length; i++) {
    const edited = Buffer.from(genuine);
    edited[i] ^= 0x01;
    invalidCursor(t, () => decodeEventId("evt_" + edited.toString("base64url"), RUN));
  }
});

const uvarint = (n: number) => {
  const out: number[] = [];
  for (; n >= 0x80; n = Math.floor(n / 0x80)) out.push((n % 0x80) | 0x80);
  return [...out, n];
};
const littleEndian = (n: number) => Array.from({ length: 8 }, (_, i) => Math.floor(n / 2 ** (8 * i)) % 256);
// Runs interleaved (the encoder keeps run keys), one not ASCII and one long.
const RUNS = [RUN, OTHER, "run_é", `run_${"x".repeat(120)}`, RUN];
/** Puts a known master key in force; the cursor key derived from it, as an independent HMAC computes it. */
function knownCursorKey(): Buffer {
  const master = Buffer.alloc(32, 7).toString("base64");
  useCursorKey(master);
  return createHmac("sha256", Buffer.from(master, "base64")).update("runs-cursors:v1").digest();
}
const POSITIONS = [[1, 1], [9, 10], [127, 128], [128, 127], [16_383, 16_384], [999_999_999, 1_000_000_000], [2 ** 32 + 5, 999_999], [Number.MAX_SAFE_INTEGER, 1], [1, Number.MAX_SAFE_INTEGER]];

test("event-ids - the bytes are version 3, both sequences as uvarints and SipHash-2-4 of them under the run's key (an HMAC under the cursor key)", (t) => {
  const cursorKey = knownCursorKey();
  for (const [streamSeq, runSeq] of POSITIONS) {
    for (const runId of RUNS) {
      const runKey = createHmac("sha256", cursorKey).update(`7:evt-run;${runId.length}:${runId};`).digest().subarray(0, 16);
      const tag = new Uint8Array(8);
      sipHash24Into(runKey, Uint8Array.from([...littleEndian(streamSeq!), ...littleEndian(runSeq!)]), tag);
      const expected = "evt_" + Buffer.from([3, ...uvarint(streamSeq!), ...uvarint(runSeq!), ...tag]).toString("base64url");
      t.is(encodeEventId({ streamSeq: streamSeq!, runSeq: runSeq!, runId }), expected, `${runId} ${streamSeq}/${runSeq}`);
      t.deepEqual(decodeEventId(expected, runId), { streamSeq, runSeq });
    }
  }
});

test("event-ids - version 2 ids handed out before (the first 8 bytes of an HMAC of run and positions) are still accepted, and only for their run", (t) => {
  const key = knownCursorKey();
  for (const [streamSeq, runSeq] of POSITIONS) {
    for (const runId of RUNS) {
      const tag = createHmac("sha256", key).update(`3:evt;${runId.length}:${runId};${String(streamSeq).length}:${streamSeq};${String(runSeq).length}:${runSeq};`).digest();
      const v2 = "evt_" + Buffer.from([2, ...uvarint(streamSeq!), ...uvarint(runSeq!), ...tag.subarray(0, 8)]).toString("base64url");
      t.deepEqual(decodeEventId(v2, runId), { streamSeq, runSeq }, `${runId} ${streamSeq}/${runSeq}`);
      invalidCursor(t, () => decodeEventId(v2, runId === RUN ? OTHER : RUN));
      // The same bytes under the other version are not valid, either way.
      const swapped = Buffer.from(v2.slice(4), "base64url");
      swapped[0] = 3;
      invalidCursor(t, () => decodeEventId("evt_" + swapped.toString("base64url"), runId));
      const v3 = Buffer.from(encodeEventId({ streamSeq: streamSeq!, runSeq: runSeq!, runId }).slice(4), "base64url");
      t.is(v3[0], 3);
      v3[0] = 2;
      invalidCursor(t, () => decodeEventId("evt_" + v3.toString("base64url"), runId));
    }
  }
});

test("event-ids - a new cursor key gives new run keys: ids from before it are 400 invalid_cursor", (t) => {
  useCursorKey(Buffer.alloc(32, 1).toString("base64"));
  const before = encodeEventId({ streamSeq: 5, runSeq: 3, runId: RUN });
  t.deepEqual(decodeEventId(before, RUN), { streamSeq: 5, runSeq: 3 });
  useCursorKey(Buffer.alloc(32, 2).toString("base64"));
  invalidCursor(t, () => decodeEventId(before, RUN));
  t.not(encodeEventId({ streamSeq: 5, runSeq: 3, runId: RUN }), before);
});

test("event-ids - RUNS_EVENT_ID_VERSION=2 writes the version 2 ids a release before 2026-11-26 reads; both versions are read either way", (t) => {
  const key = knownCursorKey();
  try {
    useEventIdVersion(2);
    const v2 = encodeEventId({ streamSeq: 9, runSeq: 10, runId: RUN });
    const tag = createHmac("sha256", key).update(`3:evt;${RUN.length}:${RUN};1:9;2:10;`).digest();
    t.is(v2, "evt_" + Buffer.from([2, 9, 10, ...tag.subarray(0, 8)]).toString("base64url"));
    useEventIdVersion(3);
    const v3 = encodeEventId({ streamSeq: 9, runSeq: 10, runId: RUN });
    t.is(Buffer.from(v3.slice(4), "base64url")[0], 3);
    for (const id of [v2, v3]) t.deepEqual(decodeEventId(id, RUN), { streamSeq: 9, runSeq: 10 });
  } finally {
    useEventIdVersion(3);
  }
});

test("event-ids - ids of many runs interleaved (replays side by side) are each their run's, past the run keys kept", (t) => {
  useCursorKey(Buffer.alloc(32, 3).toString("base64"));
  const runs = Array.from({ length: 1_500 }, (_, i) => `run_${String(i).padStart(26, "0")}`);
  const first = runs.map((runId, i) => encodeEventId({ streamSeq: i + 1, runSeq: 1, runId }));
  // Again, in another order: the same ids (keys dropped and derived again give the same tags).
  for (let i = runs.length - 1; i >= 0; i--) t.is(encodeEventId({ streamSeq: i + 1, runSeq: 1, runId: runs[i]! }), first[i]);
  for (let i = 0; i < runs.length; i += 97) {
    t.deepEqual(decodeEventId(first[i]!, runs[i]!), { streamSeq: i + 1, runSeq: 1 });
    invalidCursor(t, () => decodeEventId(first[i]!, runs[(i + 1) % runs.length]!));
  }
});
