import test from "ava";
import { fromStored, loadedTurn, storedTurnFields, toStored, WRAPPED_KEY } from "../../src/stored-json.js";
import { unstorableKeyPath } from "../../src/json-depth.js";
import type { ActionDoc } from "../../src/approval.js";
import type { TurnDoc } from "../../src/documents.js";
import { TurnStatus } from "../../src/domain.js";

const nested = (levels: number): unknown => {
  let v: unknown = "bottom";
  for (let i = 0; i < levels; i++) v = [v];
  return v;
};
const isWrapped = (v: unknown) => typeof (v as Record<string, unknown> | null)?.[WRAPPED_KEY] === "string" && Object.keys(v as object).length === 1;

test("stored-json - storable values are stored as they are (the same object), and read back as they are", (t) => {
  for (const value of [null, 1, "x", true, [], {}, { a: { b: [1, "$x", "a.b"] } }, [{ role: "user", content: [{ type: "text", text: "$where a.b" }] }], { "c$": 1, "": 2, _runs_json: 3 }, { _runs_json: "x", other: 1 }, nested(64)]) {
    t.is(toStored(value), value);
    t.is(fromStored(value), value);
  }
});

test("stored-json - every key the store refuses, at any depth, and nesting past 64 levels are stored as JSON and read back equal", (t) => {
  const cases: unknown[] = [
    { $where: 1 },
    { "a.b": 1 },
    { "n\u0000k": 1 },
    { ok: [{ deeper: { $ref: "x" } }] },
    [{ "file.txt": "hi" }],
    nested(65),
    { args: nested(200) },
  ];
  for (const value of cases) {
    const stored = toStored(value);
    t.true(isWrapped(stored), JSON.stringify(value).slice(0, 60));
    t.is(unstorableKeyPath(stored), undefined);
    t.deepEqual(fromStored(stored), value);
  }
});

test("stored-json - a value shaped like a wrapper is wrapped itself, so it reads back as the value, not as its text", (t) => {
  const lookalike = { [WRAPPED_KEY]: JSON.stringify({ injected: true }) };
  const stored = toStored(lookalike);
  t.not(stored, lookalike);
  t.deepEqual(fromStored(stored), lookalike);
});

test("stored-json - a wrapper whose text is not JSON is read as it is, not thrown", (t) => {
  const broken = { [WRAPPED_KEY]: "{not json" };
  t.is(fromStored(broken), broken);
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
  t.is(unstorableKeyPath(stored), undefined);
  t.deepEqual(loadedTurn(structuredClone(stored)), fields);
  const other: Partial<TurnDoc> = { status: TurnStatus.failed, error: null };
  t.deepEqual(storedTurnFields(other), { status: TurnStatus.failed, error: null }, "fields it does not name are left alone");
  t.is(loadedTurn(null), null);
});
