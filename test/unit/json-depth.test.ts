import test from "ava";
import { fieldOfPath, tooDeepPath, unstorableKeyPath } from "../../src/json-depth.js";

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
});

test("json-depth - unstorableKeyPath names the first key starting with $ or holding . or NUL, at any depth and inside arrays; values and array indices are not keys", (t) => {
  t.deepEqual(unstorableKeyPath({ a: 1, $b: 2 }), ["$b"]);
  t.deepEqual(unstorableKeyPath({ a: [{ ok: 1 }, { "x.y": 1 }] }), ["a", "1", "x.y"]);
  t.deepEqual(unstorableKeyPath({ a: { b: { "n\u0000k": 1 } } }), ["a", "b", "n\u0000k"]);
  t.is(unstorableKeyPath({ a: "$where", b: ["x.y", "\u0000"], "c$": 1, "": 2 }), undefined);
  t.is(unstorableKeyPath(null), undefined);
  t.is(unstorableKeyPath([1, [2, [3]]]), undefined);
  const deep = nest(100_000, { $gt: 1 });
  t.is(unstorableKeyPath(deep)?.length, 100_001, "100,000 levels without a stack overflow");
});
