/**
 * Model-made JSON in store documents: a turn's transcript (tool calls' arguments, tool
 * results, a provider's usage figures) and its gated calls' arguments. A model may use any
 * key (`{"src/main.py": …}`, `{"$ref": …}`), arrays of arrays (`{"rows": [[1, 2]]}`), any
 * nesting and numbers such as `1e999`, and the store cannot hold every such value
 * ({@link unstorablePath}: FerretDB refuses `$`-prefixed and dotted keys, arrays in arrays
 * and infinities, BSON cannot encode a key with a NUL, MongoDB refuses nesting past 100
 * levels). Such a value is stored as its JSON text in a one-key wrapper,
 * `{ _runs_json: "<JSON>" }`, and read back as JSON gives it (a non-finite number as
 * null, as the events show it); every other value is stored as it is, so documents look
 * as they did.
 *
 * A value that is itself an object with the one key `_runs_json` holding a string is
 * wrapped too, so a read never takes a model's value for a wrapper.
 */
import { unstorablePath } from "./json-depth.js";
import type { ActionDoc } from "./approval.js";
import type { TurnDoc } from "./documents.js";

export const WRAPPED_KEY = "_runs_json";

/**
 * Nesting a stored value may keep as it is: it sits at most four levels down in its
 * document (turn → transcript → message, turn → actions → action → arguments), and the
 * stores' limit is 100.
 */
const STORED_DEPTH = 64;

function isWrapper(value: unknown): value is { [WRAPPED_KEY]: string } {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return false;
  const keys = Object.keys(value);
  return keys.length === 1 && keys[0] === WRAPPED_KEY && typeof (value as Record<string, unknown>)[WRAPPED_KEY] === "string";
}

/** `value` as the store keeps it: the value itself, or its JSON in a wrapper (see the module comment). */
export function toStored<T>(value: T): T | { [WRAPPED_KEY]: string } {
  if (value === null || typeof value !== "object") return value;
  if (isWrapper(value) || unstorablePath(value, STORED_DEPTH) !== undefined) {
    return { [WRAPPED_KEY]: JSON.stringify(value) };
  }
  return value;
}

/**
 * The value {@link toStored} was given (as JSON gives it back: `undefined` members dropped,
 * non-finite numbers null). {@link toStored} wraps only objects and arrays: a wrapper whose
 * text is not the JSON of one (edited by hand, or a model's value stored as it was before
 * wrappers existed) is returned as it is.
 */
export function fromStored(value: unknown): unknown {
  if (!isWrapper(value)) return value;
  try {
    const parsed = JSON.parse(value[WRAPPED_KEY]) as unknown;
    return parsed !== null && typeof parsed === "object" ? parsed : value;
  } catch {
    return value;
  }
}

type TurnJsonFields = Pick<TurnDoc, "transcript" | "actions">;

/** The turn's model-made fields in `fields` as stored; a new object, `fields` untouched. */
export function storedTurnFields<T extends Partial<TurnJsonFields>>(fields: T): T {
  const out = { ...fields };
  if (fields.transcript) out.transcript = fields.transcript.map(toStored);
  if (fields.actions) out.actions = fields.actions.map((a): ActionDoc => ({ ...a, arguments: toStored(a.arguments) as ActionDoc["arguments"] }));
  return out;
}

/** A turn as read from the store with its model-made fields as they were given. */
export function loadedTurn<T extends Partial<TurnJsonFields>>(doc: T): T;
export function loadedTurn<T extends Partial<TurnJsonFields>>(doc: T | null): T | null;
export function loadedTurn<T extends Partial<TurnJsonFields>>(doc: T | null): T | null {
  if (!doc) return doc;
  if (doc.transcript?.some(isWrapper)) doc.transcript = doc.transcript.map(fromStored);
  if (doc.actions?.some((a) => isWrapper(a.arguments))) {
    doc.actions = doc.actions.map((a) => ({ ...a, arguments: fromStored(a.arguments) as ActionDoc["arguments"] }));
  }
  return doc;
}
