import test from "ava";
import { fromStored, loadedTurn, storedTurnFields, toStored, WRAPPED_KEY } from "../../src/stored-json.js";
import { unstorablePath } from "../../src/json-depth.js";
import type { ActionDoc } from "../../src/approval.js";
import type { TurnDoc } from "../../src/documents.js";
import { TurnStatus } from "../../src/domain.js";

/** `levels` objects, one inside the other. */
const nested = (levels: number): unknown => {
  let v: unknown = "bottom";
  for (let i = 0; i < levels; i++) v = { in: v };
  return v;
};
const isWrapped = (v: unknown) => typeof (v as Record<string, unknown> | null)?.[WRAPPED_KEY] === "string" && Object.keys(v as object).length === 1;

test("stored-json - storable values are stored as they are (the same object), and read back as they are", (t) => {
  for (const value of [null, 1, "x", true, [], {}, { a: { b: [1, "$x", "a.b"] } }, [{ role: "user", content: [{ type: "text", text: "$where a.b" }] }], { "c$": 1, "": 2, _runs_json: 3 }, { _runs_json: "x", other: 1 }, nested(64)]) {
    t.is(toStored(value), value);
    t.is(fromStored(value), value);
  }
});

test("stored-json - every key the store refuses, arrays in arrays, at any depth, and nesting past 64 levels are stored as JSON and read back equal", (t) => {
  const cases: unknown[] = [
    { $where: 1 },
    { "a.b": 1 },
    { "n\u0000k": 1 },
    { ok: [{ deeper: { $ref: "x" } }] },
    [{ "file.txt": "hi" }],
    { rows: [[1, 2], [3]] },
    [[]],
    [{ a: [{ b: [["x"]] }] }],
    nested(65),
    { args: nested(200) },
  ];
  for (const value of cases) {
    const stored = toStored(value);
    t.true(isWrapped(stored), JSON.stringify(value).slice(0, 60));
    t.is(unstorablePath(stored, 64), undefined);
    t.deepEqual(fromStored(stored), value);
  }
});

test("stored-json - NaN and infinities are stored as JSON and read back as null, as JSON and the events give them", (t) => {
  const value = { usage: { cost: { total: NaN } }, n: Infinity, list: [-Infinity, 1] };
  const stored = toStored(value);
  t.true(isWrapped(stored));
  t.deepEqual(fromStored(stored), { usage: { cost: { total: null } }, n: null, list: [null, 1] });
});

test("stored-json - a value shaped like a wrapper is wrapped itself, so it reads back as the value, not as its text", (t) => {
  const lookalike = { [WRAPPED_KEY]: JSON.stringify({ injected: true }) };
  const stored = toStored(lookalike);
  t.not(stored, lookalike);
  t.deepEqual(fromStored(stored), lookalike);
});

test("stored-json - a wrapper whose text is not JSON, or not the JSON of an object or array, is read as it is, not thrown", (t) => {
  for (const text of ["{not json", "5", '"text"', "null", "true"]) {
    const lookalike = { [WRAPPED_KEY]: text };
    t.is(fromStored(lookalike), lookalike, text);
  }
  t.deepEqual(fromStored({ [WRAPPED_KEY]: "[1,[2]]" }), [1, [2]]);
});

test("stored-json - storedTurnFields wraps transcript messages and action arguments one by one, without changing its input; loadedTurn restores them", (t) => {
  const good = { role: "user", content: [{ type: "text", text: "hi" }] };
  const bad = { role: "assistant", content: [{ type: "toolCall", id: "c1", name: "t", arguments: { "a.b": 1 } }] };
  const action = (args: Record<string, unknown>): ActionDoc =>
    ({ id: "act_1", tool_call_id: "c1", tool: "bash", arguments: args, requested_at: 1, expires_at: 2, on_timeout: "deny", assistant_index: 1, decision: null, reason: null, decided_at: null, decided_by: null }) as ActionDoc;
  const fields = { transcript: [good, bad], actions: [action({ command: "ls" }), action({ $x: { "y.z": 1 } })], status: TurnStatus.completed };
  const copy = structuredClone(fields);
  const stored = storedTurnFields(fields);
  t.deepEqual(fields, copy, "the input is not changed");
  t.is(stored.status, TurnStatus.completed);
  t.is(stored.transcript[0], good);
  t.true(isWrapped(stored.transcript[1]));
  t.is(stored.actions[0]!.arguments, fields.actions[0]!.arguments);
  t.true(isWrapped(stored.actions[1]!.arguments));
  t.is(unstorablePath(stored, 64), undefined);
  t.deepEqual(loadedTurn(structuredClone(stored)), fields);
  const other: Partial<TurnDoc> = { status: TurnStatus.failed, error: null };
  t.deepEqual(storedTurnFields(other), { status: TurnStatus.failed, error: null }, "fields it does not name are left alone");
  t.is(loadedTurn(null), null);
});
