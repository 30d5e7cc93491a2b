import test from "ava";
import { fieldOfPath, memberCount, tooDeepPath, unstorablePath } from "../../src/json-depth.js";

const nest = (levels: number, leaf: unknown = 1, key = "a"): unknown => {
  let v = leaf;
  for (let i = 0; i < levels; i++) v = key === "[]" ? [v] : { [key]: v };
  return v;
};

test("json-depth - depth up to the limit passes, one more is refused, for objects and arrays", (t) => {
  for (const key of ["a", "[]"]) {
    for (let levels = 0; levels <= 6; levels++) {
      const path = tooDeepPath(nest(levels, 1, key), 4);
      t.is(path === undefined, levels <= 4, `${key} ${levels}`);
      if (path) t.is(path.length, 4);
    }
  }
});

test("json-depth - the path names where the depth is, 100,000 levels without a stack overflow", (t) => {
  const body = { config: { script: [{ tool_call: { name: "bash", arguments: nest(100_000) } }] }, other: 1 };
  const path = tooDeepPath(body, 64)!;
  t.deepEqual(path.slice(0, 6), ["config", "script", "0", "tool_call", "arguments", "a"]);
  t.is(fieldOfPath(path), "config.script.0.tool_call.arguments");
  t.is(tooDeepPath({ a: "x".repeat(1000), b: [1, 2, 3], c: null }), undefined);
  // Depth only: a body that is a bare 1e999 (JSON.parse gives Infinity) is not "too deep".
  for (const number of [Infinity, NaN, { a: -Infinity }]) t.is(tooDeepPath(number), undefined);
});

test("json-depth - unstorablePath names the first key starting with $ or holding . or NUL, at any depth and inside arrays; values and array indices are not keys", (t) => {
  t.deepEqual(unstorablePath({ a: 1, $b: 2 }), { path: ["$b"], why: "key" });
  t.deepEqual(unstorablePath({ a: [{ ok: 1 }, { "x.y": 1 }] }), { path: ["a", "1", "x.y"], why: "key" });
  t.deepEqual(unstorablePath({ a: { b: { "n\u0000k": 1 } } }), { path: ["a", "b", "n\u0000k"], why: "key" });
  t.is(unstorablePath({ a: "$where", b: ["x.y", "\u0000"], "c$": 1, "": 2, n: -0, big: Number.MAX_VALUE }), undefined);
  t.is(unstorablePath(null), undefined);
  const deep = nest(100_000, { $gt: 1 });
  t.is(unstorablePath(deep)?.path.length, 100_001, "100,000 levels without a stack overflow");
});

test("json-depth - unstorablePath names an array held directly in an array, and no other array", (t) => {
  t.deepEqual(unstorablePath([1, [2]]), { path: ["1"], why: "nested array" });
  t.deepEqual(unstorablePath({ rows: [[1, 2], [3]] }), { path: ["rows", "0"], why: "nested array" });
  t.deepEqual(unstorablePath({ a: [{ b: [{ c: [[]] }] }] }), { path: ["a", "0", "b", "0", "c", "0"], why: "nested array" });
  t.is(unstorablePath({ a: [1, { b: [2, { c: [3] }] }], d: [] }), undefined, "arrays in objects in arrays are fine");
});

test("json-depth - unstorablePath names NaN and infinities wherever they are, and depth only when asked", (t) => {
  for (const bad of [NaN, Infinity, -Infinity, JSON.parse("1e999") as number]) {
    t.deepEqual(unstorablePath(bad), { path: [], why: "non-finite number" });
    t.deepEqual(unstorablePath({ usage: { cost: [{ total: bad }] } }), { path: ["usage", "cost", "0", "total"], why: "non-finite number" });
  }
  t.is(unstorablePath(nest(200)), undefined);
  for (let levels = 0; levels <= 6; levels++) {
    const found = unstorablePath(nest(levels), 4);
    t.is(found === undefined, levels <= 4, `${levels}`);
    if (found) t.deepEqual(found, { path: ["a", "a", "a", "a"], why: "depth" });
  }
  // Arrays count as levels too.
  t.deepEqual(unstorablePath([{ a: [{ a: 1 }] }], 3), { path: ["0", "a", "0"], why: "depth" });
  t.is(unstorablePath([{ a: [{ a: 1 }] }], 4), undefined);
});

test("json depth - memberCount counts members and items at every depth, and stops just past its limit", (t) => {
  t.is(memberCount({ a: 1, b: [1, 2, { c: 3 }] }, 100), 6);
  t.is(memberCount("x", 100), 0);
  t.is(memberCount(Object.fromEntries(Array.from({ length: 1_000_000 }, (_, i) => [`k${i}`, i])), 10), 11);
});
