import test from "ava";
import { MAX_EVENTS_AHEAD, resumePosition, SequenceOrder } from "../../src/event-order.js";

const HORIZON = 1_000;
/** Stored at `storedMs`, without a stored-below header. */
const at = (storedMs: number) => () => ({ storedMs, storedBelow: 0 });

/**
 * Pushes `sequences` stored 1 ms apart from `t0`; returns what was emitted, in order. As the
 * event log's subscription does, the next event with nothing held is taken with takeNext
 * (`pushOnly`: every event through push).
 */
function run(order: SequenceOrder<number>, sequences: number[], t0 = 0, pushOnly = false): number[] {
  const out: number[] = [];
  sequences.forEach((seq, i) => {
    if (!pushOnly && order.takeNext(seq)) out.push(seq);
    else out.push(...order.push(seq, seq, () => ({ storedMs: t0 + i, storedBelow: 0 })));
  });
  return out;
}

function permutations(items: number[]): number[][] {
  if (items.length <= 1) return [items];
  return items.flatMap((first, i) => permutations([...items.slice(0, i), ...items.slice(i + 1)]).map((rest) => [first, ...rest]));
}

test("event-order - every order of 1..6 comes out as 1..6, nothing held after (with takeNext and with push alone)", (t) => {
  let cases = 0;
  for (let n = 1; n <= 6; n++) {
    for (const stored of permutations(Array.from({ length: n }, (_, i) => i + 1))) {
      const order = new SequenceOrder<number>(1, HORIZON);
      const out = run(order, stored);
      const pushed = new SequenceOrder<number>(1, HORIZON);
      if (run(pushed, stored, 0, true).join() !== out.join() || pushed.holding !== order.holding) {
        t.fail(`stored ${stored.join(",")}: push alone differs`);
        return;
      }
      if (out.join() !== Array.from({ length: n }, (_, i) => i + 1).join() || order.holding) {
        t.fail(`stored ${stored.join(",")} came out ${out.join(",")}`);
        return;
      }
      cases++;
    }
  }
  t.is(cases, 1 + 2 + 6 + 24 + 120 + 720);
});

test("event-order - every order of 1..5 with one event repeated anywhere: each once, in order", (t) => {
  for (const stored of permutations([1, 2, 3, 4, 5])) {
    for (let dup = 1; dup <= 5; dup++) {
      for (let at = 0; at <= 5; at++) {
        const withDup = [...stored.slice(0, at), dup, ...stored.slice(at)];
        const out = run(new SequenceOrder<number>(1, HORIZON), withDup);
        if (out.join() !== "1,2,3,4,5") {
          t.fail(`stored ${withDup.join(",")} came out ${out.join(",")}`);
          return;
        }
      }
    }
  }
  t.pass();
});

test("event-order - a resume after event 3 starts at 4 and drops what was already given", (t) => {
  const order = new SequenceOrder<number>(4, HORIZON);
  t.deepEqual(run(order, [2, 5, 3, 4, 6]), [4, 5, 6]);
  t.is(order.expected, 7);
});

test("event-order - events held for one that never comes wait until a later store past the horizon", (t) => {
  const order = new SequenceOrder<number>(1, HORIZON);
  t.deepEqual(order.push(1, 1, at(0)), [1]);
  t.deepEqual(order.push(3, 3, at(10)), []);
  t.deepEqual(order.push(4, 4, at(500)), []);
  t.true(order.holding);
  // Stored more than the horizon after 3: event 2 would have been stored by then.
  t.deepEqual(order.push(6, 6, at(10 + HORIZON + 1)), [3, 4]);
  t.true(order.holding, "6 still waits for 5");
  t.deepEqual(order.push(5, 5, at(10 + HORIZON + 2)), [5, 6]);
  t.false(order.holding);
});

test("event-order - at the end of what is stored, held events go out once the horizon passed by the reader's clock", (t) => {
  const order = new SequenceOrder<number>(1, HORIZON);
  t.deepEqual(run(order, [2, 3], 100), []);
  t.deepEqual(order.release(100 + HORIZON), [], "within the horizon: the missing one may still come");
  t.true(order.holding);
  t.deepEqual(order.release(100 + HORIZON + 1), [2, 3]);
  t.false(order.holding);
  t.deepEqual(order.release(1e12), [], "nothing held: nothing released");
});

test("event-order - an event MAX_EVENTS_AHEAD past a missing one gives it up at once (bounded holding)", (t) => {
  const order = new SequenceOrder<number>(1, HORIZON);
  // 1 is missing; 2..MAX_EVENTS_AHEAD are held, all stored within 1 ms.
  const out: number[] = [];
  for (let seq = 2; seq <= MAX_EVENTS_AHEAD; seq++) out.push(...order.push(seq, seq, at(0)));
  t.deepEqual(out, []);
  // The appender sends MAX_EVENTS_AHEAD + 1 only once 1 is stored: 1 is not coming after this.
  const released = order.push(MAX_EVENTS_AHEAD + 1, MAX_EVENTS_AHEAD + 1, at(0));
  t.deepEqual(released, Array.from({ length: MAX_EVENTS_AHEAD }, (_, i) => i + 2));
  t.false(order.holding);
  // A run whose first events expired: a first event far past the expected one waits only for its window.
  const expired = new SequenceOrder<number>(1, HORIZON);
  t.deepEqual(expired.push(1_000, 1_000, at(0)), []);
  t.deepEqual(expired.push(1_000 + MAX_EVENTS_AHEAD - 1, 1_255, at(1)), [1_000], "999 and below are not coming after 1,255");
  t.deepEqual(expired.release(HORIZON + 1), [], "1,001 could still come");
  t.deepEqual(expired.release(HORIZON + 2), [1_255]);
});

test("event-order - the resume position is the floor's next, else the event's own next", (t) => {
  t.is(resumePosition(100, "90"), 91);
  t.is(resumePosition(100, "0"), 1);
  t.is(resumePosition(100, undefined), 101, "events stored before floors existed");
  t.is(resumePosition(100, ""), 101);
  t.is(resumePosition(100, "100"), 101, "a floor is below the event's own position, or ignored");
  t.is(resumePosition(100, "250"), 101);
  t.is(resumePosition(100, "-3"), 101);
  t.is(resumePosition(100, "1e3"), 101);
  t.is(resumePosition(100, "abc"), 101);
});

/**
 * A model of the appender: event i is sent at step i; it is stored at once, or (late) `delay`
 * steps later, after events sent meanwhile. Its stored-below header is the lowest event not
 * stored when it was sent. Returns the stored order with each event's header.
 */
function storedRun(delays: number[]): Array<{ seq: number; storedBelow: number }> {
  const n = delays.length;
  const storeAt = delays.map((d, i) => i + 1 + d); // step at which event i+1 is stored
  const storedBelowAt = (step: number) => {
    let lowest = 1;
    while (lowest <= n && storeAt[lowest - 1]! < step) lowest++;
    return lowest;
  };
  const events = delays.map((_, i) => ({ seq: i + 1, storedBelow: storedBelowAt(i + 1), at: storeAt[i]! }));
  // Stored by step; within a step, the ones sent earlier first.
  return events.sort((a, b) => a.at - b.at || a.seq - b.seq).map(({ seq, storedBelow }) => ({ seq, storedBelow }));
}

test("event-order - every late-store pattern of 7 events (delays 0..3), whole or with its oldest stored events expired: each event once, in order, nothing waits", (t) => {
  let cases = 0;
  for (let code = 0; code < 4 ** 7; code++) {
    const delays = Array.from({ length: 7 }, (_, i) => Math.floor(code / 4 ** i) % 4);
    const stored = storedRun(delays);
    for (let expired = 0; expired <= 7; expired++) {
      const kept = stored.slice(expired);
      const order = new SequenceOrder<number>(1, HORIZON);
      const out: number[] = [];
      // All stored at once, long ago: only the headers and the end of the stream tell.
      for (const e of kept) out.push(...order.push(e.seq, e.seq, () => ({ storedMs: 0, storedBelow: e.storedBelow })));
      const waited = order.holding;
      out.push(...order.release(HORIZON + 1));
      const expected = kept.map((e) => e.seq).sort((a, b) => a - b);
      if (out.join() !== expected.join()) {
        t.fail(`delays ${delays.join("")}, ${expired} expired: stored ${kept.map((e) => `${e.seq}<${e.storedBelow}`).join(" ")} came out ${out.join(",")}`);
        return;
      }
      // Without expiry nothing waits for the clock; with it, only a cut through events in flight does.
      if (expired === 0 && waited) {
        t.fail(`delays ${delays.join("")}: held at the end though nothing is missing`);
        return;
      }
      cases++;
    }
  }
  t.is(cases, 4 ** 7 * 8);
});

test("event-order - a later event's stored-below header gives up what expired at once; held events below it still come out", (t) => {
  const order = new SequenceOrder<number>(1, HORIZON);
  // 1 and 2 expired; 3 was sent once both were stored.
  t.deepEqual(order.push(3, 3, () => ({ storedMs: 0, storedBelow: 3 })), [3]);
  const held = new SequenceOrder<number>(1, HORIZON);
  t.deepEqual(held.push(5, 5, at(0)), []);
  t.deepEqual(held.push(8, 8, () => ({ storedMs: 1, storedBelow: 7 })), [5], "1-4 and 6 gone; 5 was held, so it comes out, then 8 waits for 7");
  t.deepEqual(held.push(7, 7, at(2)), [7, 8]);
  // A stored-below past the event's own number is not the appender's: it gives nothing up.
  const odd = new SequenceOrder<number>(1, HORIZON);
  t.deepEqual(odd.push(3, 3, () => ({ storedMs: 0, storedBelow: 1_000 })), []);
  t.deepEqual(odd.push(1, 1, at(0)), [1]);
  t.deepEqual(odd.push(2, 2, at(0)), [2, 3]);
});

test("event-order - giving up by distance emits the held events below the new start, it never drops them", (t) => {
  const order = new SequenceOrder<number>(1, HORIZON);
  t.deepEqual(order.push(100, 100, at(0)), []);
  t.deepEqual(order.push(300, 300, at(0)), []);
  t.deepEqual(order.push(400, 400, at(0)), [100], "below 145 nothing more comes; 100 was held");
  t.true(order.holding);
  t.deepEqual(order.release(HORIZON + 1), [300, 400]);
});
