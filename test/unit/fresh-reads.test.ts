import test from "ava";
import { FreshReads } from "../../src/fresh-reads.js";

/** A store whose reads the test ends by hand, each answering the value as it was when the read began. */
function manualStore() {
  const values = new Map<string, number>();
  const reads: Array<{ key: string; seen: number | undefined; end: () => void; fail: (err: Error) => void }> = [];
  const read = (key: string) =>
    new Promise<number | undefined>((resolve, reject) => {
      const seen = values.get(key);
      reads.push({ key, seen, end: () => resolve(seen), fail: reject });
    });
  return { values, reads, read };
}

const tick = () => new Promise((resolve) => setImmediate(resolve));

test("fresh-reads - callers that ask while a read is in flight share one read begun after it ends", async (t) => {
  const store = manualStore();
  const reads = new FreshReads(store.read);
  store.values.set("a", 1);
  const first = reads.get("a");
  const later = Array.from({ length: 10 }, () => reads.get("a"));
  t.is(store.reads.length, 1, "the later callers do not start reads of their own");
  store.reads[0]!.end();
  t.is(await first, 1);
  await tick();
  t.is(store.reads.length, 2, "one read for the ten callers, begun once the first ended");
  store.reads[1]!.end();
  t.deepEqual(await Promise.all(later), Array.from({ length: 10 }, () => 1));
});

test("fresh-reads - a caller never gets a value read before it asked", async (t) => {
  const store = manualStore();
  const reads = new FreshReads(store.read);
  store.values.set("agent", 1);
  const before = reads.get("agent");
  // A write acknowledged while that read is in flight, then a caller asks.
  store.values.set("agent", 2);
  const after = reads.get("agent");
  store.reads[0]!.end();
  t.is(await before, 1);
  await tick();
  store.reads[1]!.end();
  t.is(await after, 2);
});

test("fresh-reads - keys do not share reads; a key no one reads is forgotten", async (t) => {
  const store = manualStore();
  const reads = new FreshReads(store.read);
  store.values.set("a", 1).set("b", 2);
  const a = reads.get("a");
  const b = reads.get("b");
  t.deepEqual(store.reads.map((r) => r.key), ["a", "b"]);
  for (const r of store.reads) r.end();
  t.deepEqual(await Promise.all([a, b]), [1, 2]);
  await tick();
  t.is(store.reads.length, 2, "no read follows when no one waited");
  const again = reads.get("a");
  t.is(store.reads.length, 3, "a later caller reads at once");
  store.reads[2]!.end();
  t.is(await again, 1);
});

test("fresh-reads - a failed read fails only its own callers; the next read goes ahead", async (t) => {
  const store = manualStore();
  const reads = new FreshReads(store.read);
  store.values.set("a", 7);
  const first = reads.get("a");
  const second = [reads.get("a"), reads.get("a")];
  store.reads[0]!.fail(new Error("store away"));
  await t.throwsAsync(first, { message: "store away" });
  await tick();
  store.reads[1]!.end();
  t.deepEqual(await Promise.all(second), [7, 7]);
  const third = reads.get("a");
  store.reads[2]!.fail(new Error("again"));
  await t.throwsAsync(third, { message: "again" });
  await tick();
  t.is(store.reads.length, 3);
});

test("fresh-reads - a read that throws at once does not leave its key waiting for ever", async (t) => {
  let calls = 0;
  const reads = new FreshReads(async (key: string) => key);
  const throwing = new FreshReads<string>((key) => {
    calls++;
    if (calls === 1) throw new Error("thrown");
    return Promise.resolve(key);
  });
  await t.throwsAsync(throwing.get("k"), { message: "thrown" });
  t.is(await throwing.get("k"), "k");
  t.is(await reads.get("x"), "x");
});

test("fresh-reads - a read in flight past the patience is not waited for: later callers read alone", async (t) => {
  const store = manualStore();
  let now = 0;
  const reads = new FreshReads(store.read, 1_000, () => now);
  store.values.set("a", 1);
  const hung = reads.get("a");
  const waiting = reads.get("a");
  now = 1_001;
  const later = [reads.get("a"), reads.get("a")];
  t.is(store.reads.length, 3, "each later caller reads at once");
  store.reads[1]!.end();
  store.reads[2]!.end();
  t.deepEqual(await Promise.all(later), [1, 1]);
  // The read that did not answer holds back only the callers already waiting for it.
  store.reads[0]!.end();
  t.is(await hung, 1);
  await tick();
  store.reads[3]!.end();
  t.is(await waiting, 1);
});
