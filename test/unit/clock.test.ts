import test from "ava";
import { systemClock, within } from "../../src/clock.js";

const after = <T>(ms: number, value: T) => new Promise<T>((resolve) => setTimeout(() => resolve(value), ms));

test("clock - within: the work's outcome when it comes first, late()'s value or error once the time passes first", async (t) => {
  t.is(await within(after(5, "work"), 1_000, systemClock, () => "late"), "work");
  t.is(await within(after(1_000, "work"), 10, systemClock, () => "late"), "late");
  await t.throwsAsync(within(after(1_000, "work"), 10, systemClock, (): never => { throw new Error("too slow"); }), { message: "too slow" });
  await t.throwsAsync(within(Promise.reject(new Error("failed")), 1_000, systemClock, () => "late"), { message: "failed" });
});
