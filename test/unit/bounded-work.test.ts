/**
 * BoundedWork: at most `concurrency` tasks run, the next waiting ones start in order as
 * slots free (also after a rejection), a task offered to a full queue is refused at once,
 * and closing refuses what waits.
 */
import test from "ava";
import { BoundedWork } from "../../src/bounded-work.js";

/** A task that runs until `release`, recording when it started. */
function parked(started: string[], name: string) {
  let release!: () => void;
  let fail!: (err: Error) => void;
  const done = new Promise<void>((resolve, reject) => {
    release = resolve;
    fail = reject;
  });
  const task = async () => {
    started.push(name);
    await done;
  };
  return { task, release: () => release(), fail: (err: Error) => fail(err) };
}

const tick = () => new Promise((resolve) => setImmediate(resolve));

test("bounded-work - every combination of concurrency 1..3 and queue 0..3: at most that many run, the waiting start in order, the rest are refused at once", async (t) => {
  for (let concurrency = 1; concurrency <= 3; concurrency++) {
    for (let maxWaiting = 0; maxWaiting <= 3; maxWaiting++) {
      const work = new BoundedWork(concurrency, maxWaiting);
      const started: string[] = [];
      const tasks = Array.from({ length: concurrency + maxWaiting + 2 }, (_, i) => parked(started, `t${i}`));
      const results = tasks.map((p) => work.run(p.task));
      await tick();
      const taken = concurrency + maxWaiting;
      const where = `concurrency ${concurrency}, queue ${maxWaiting}`;
      t.deepEqual(started, tasks.slice(0, concurrency).map((_, i) => `t${i}`), `${where}: the first run at once`);
      t.deepEqual(work.size, { running: concurrency, waiting: maxWaiting }, where);
      for (const refused of results.slice(taken)) t.false(await refused, `${where}: refused without waiting`);
      // Each release starts the next waiting task, in the order they came.
      for (let i = 0; i < taken; i++) {
        tasks[i]!.release();
        t.true(await results[i], `${where}: t${i} ran`);
        await tick();
        t.deepEqual(started, tasks.slice(0, Math.min(taken, concurrency + i + 1)).map((_, j) => `t${j}`), `${where}: after t${i}`);
      }
      t.deepEqual(work.size, { running: 0, waiting: 0 }, `${where}: every slot freed`);
      t.is(started.length, taken, `${where}: the refused never ran`);
    }
  }
});

test("bounded-work - a task's rejection is passed on and frees its slot for the next", async (t) => {
  const work = new BoundedWork(1, 1);
  const started: string[] = [];
  const first = parked(started, "a");
  const second = parked(started, "b");
  const a = work.run(first.task);
  const b = work.run(second.task);
  await tick();
  first.fail(new Error("the store answered garbage"));
  await t.throwsAsync(a, { message: "the store answered garbage" });
  await tick();
  t.deepEqual(started, ["a", "b"]);
  second.release();
  t.true(await b);
  t.deepEqual(work.size, { running: 0, waiting: 0 });
  // A task that throws before its first await is a rejection too.
  await t.throwsAsync(work.run(() => { throw new Error("at once"); }), { message: "at once" });
  t.deepEqual(work.size, { running: 0, waiting: 0 });
});

test("bounded-work - closing refuses the waiting tasks and every later one; the running one goes on and its slot is not handed over", async (t) => {
  const work = new BoundedWork(1, 5);
  const started: string[] = [];
  const running = parked(started, "running");
  const waiting = [parked(started, "w1"), parked(started, "w2")];
  const ran = work.run(running.task);
  const refused = waiting.map((p) => work.run(p.task));
  await tick();
  t.false(work.closed);
  work.close();
  t.true(work.closed);
  for (const r of refused) t.false(await r, "a waiting task is refused as the work closes");
  t.false(await work.run(parked(started, "later").task), "and one offered later");
  running.release();
  t.true(await ran, "the running task ran to its end");
  await tick();
  t.deepEqual(started, ["running"]);
  t.deepEqual(work.size, { running: 0, waiting: 0 });
});

test("bounded-work - a bound below one slot is refused", (t) => {
  t.throws(() => new BoundedWork(0, 5), { instanceOf: RangeError });
  t.throws(() => new BoundedWork(1, -1), { instanceOf: RangeError });
  t.throws(() => new BoundedWork(Number.NaN, 1), { instanceOf: RangeError });
  t.throws(() => new BoundedWork(1.5, 1), { instanceOf: RangeError });
});
