import test from "ava";
import fc from "fast-check";
import type { z } from "zod";
import { ApiError } from "../../src/errors.js";
import { parseWith } from "../../src/request-schemas.js";
import { parseRunRequest } from "../../src/run-request.js";
import { AgentCreateRequestSchema, ApiKeyCreateRequestSchema, ApiKeyRotateRequestSchema, BudgetRequestSchema, DeploymentRequestSchema, EnvValuePutRequestSchema, WebhookCreateRequestSchema, WebhookUpdateRequestSchema } from "../../gateway/schemas-resources.js";
import { CancelRequestSchema, TagsRequestSchema } from "../../gateway/schemas-runs.js";

/**
 * Every JSON request body, valid examples mutated one place at a time (a field dropped,
 * replaced by any JSON value, nulled, or a part added): parsing answers or refuses with an
 * ApiError, never throws anything else. The HTTP fuzz (integration › fuzz) sends random
 * bodies, which rarely come close enough to a valid one to reach the checks that run
 * after a part's own: `{type: "input_file", filename}` without its data answered 500 so.
 */
type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

const file = { type: "input_file", filename: "a.txt", file_data: "aGk=", media_type: "text/plain" };
const EXAMPLES: Array<[string, (body: unknown) => unknown, Json[]]> = [
  ["RunRequest", parseRunRequest, [
    { agent: "agt_1", version: 1, input: [{ type: "input_text", text: "hi" }, file, { type: "input_file", file_id: "file_1" }], tags: ["a", "b"], background: true },
    { run_id: "run_1", input: "hi", on_busy: "steer", stream: true },
  ]],
  ...([
    ["DeploymentRequest", DeploymentRequestSchema, [
      { config: { model: "faux/scripted", instructions: "x", tools: ["bash", "read"], limits: { command_timeout_s: 5, memory_mb: 64 }, network: { allow: ["pypi.org"] }, script: [{ text: "a" }, { tool_call: { name: "bash", arguments: { command: "ls", nested: { a: [1, "b"] } } } }, { error: { message: "x", status: 500 } }], tokens_per_second: 10, approval: { rules: [{ tool: "bash", command_prefix: "rm" }], timeout_s: 5, on_timeout: "deny" } }, upgrade_policy: "automatic", activate: true },
      { config: { model: { provider: "openai-compatible", base_url: "https://203.0.113.7/v1", model: "m", api_key_env: "KEY" } } },
    ]],
    ["AgentCreateRequest", AgentCreateRequestSchema, [{ name: "a", description: "d" }]],
    ["ApiKeyCreateRequest", ApiKeyCreateRequestSchema, [{ label: "k", scopes: ["run:read", "run:write"], mode: "live" }]],
    ["ApiKeyRotateRequest", ApiKeyRotateRequestSchema, [{ label: "k", scopes: ["run:read"], mode: "live", gracePeriodSeconds: 60 }]],
    ["BudgetRequest", BudgetRequestSchema, [{ monthly_cost_usd: 10, monthly_tokens: 1000 }]],
    ["EnvironmentValuePutRequest", EnvValuePutRequestSchema, [{ value: "v" }]],
    ["WebhookCreateRequest", WebhookCreateRequestSchema, [{ url: "https://203.0.113.7/hook", event_types: ["turn.completed", "*"], agent_id: "agt_1", description: "d", enabled: true }]],
    ["WebhookUpdateRequest", WebhookUpdateRequestSchema, [{ url: "https://203.0.113.7/hook", event_types: ["turn.completed"], agent_id: null, enabled: false }]],
    ["CancelRequest", CancelRequestSchema, [{ turn_id: "turn_1" }]],
    ["TagsRequest", TagsRequestSchema, [{ add: ["a", "b"], remove: ["c"] }]],
  ] as Array<[string, z.ZodType, Json[]]>).map(([name, schema, bodies]): [string, (body: unknown) => unknown, Json[]] => [name, (body) => parseWith(schema, body, "path"), bodies]),
];

/** Every place in `value`: the path to it. */
function places(value: Json, path: Array<string | number> = []): Array<Array<string | number>> {
  const out = [path];
  if (Array.isArray(value)) value.forEach((item, i) => out.push(...places(item, [...path, i])));
  else if (value !== null && typeof value === "object") for (const [key, item] of Object.entries(value)) out.push(...places(item, [...path, key]));
  return out;
}

type Mutation = { kind: "drop" } | { kind: "replace"; value: Json } | { kind: "add"; key: string; value: Json };

function mutate(value: Json, path: Array<string | number>, mutation: Mutation): Json {
  if (path.length === 0) {
    if (mutation.kind === "replace") return mutation.value;
    if (mutation.kind === "add" && value !== null && typeof value === "object") return Array.isArray(value) ? [...value, mutation.value] : { ...value, [mutation.key]: mutation.value };
    return mutation.kind === "drop" ? null : value;
  }
  const [head, ...rest] = path;
  if (Array.isArray(value)) {
    const copy = [...value];
    if (rest.length === 0 && mutation.kind === "drop") copy.splice(head as number, 1);
    else copy[head as number] = mutate(copy[head as number]!, rest, mutation);
    return copy;
  }
  const object = { ...(value as Record<string, Json>) };
  if (rest.length === 0 && mutation.kind === "drop") delete object[head as string];
  else object[head as string] = mutate(object[head as string]!, rest, mutation);
  return object;
}

const nasty: fc.Arbitrary<Json> = fc.oneof(
  fc.constantFrom<Json>(null, "", " ", "a".repeat(300), "\ud800", "\u0000", "data:x;base64,aGk=", "1e309", -1, 0, 1.5, 1e309 as number, Number.MAX_SAFE_INTEGER + 2, true, [], {}, [[]], { __proto__: { x: 1 } } as Json, { constructor: 1 }, ["a", "a"]),
  fc.jsonValue({ maxDepth: 2 }) as fc.Arbitrary<Json>,
);
const mutation: fc.Arbitrary<Mutation> = fc.oneof(
  fc.constant<Mutation>({ kind: "drop" }),
  nasty.map((value): Mutation => ({ kind: "replace", value })),
  fc.record({ kind: fc.constant("add" as const), key: fc.constantFrom("type", "file_data", "extra", "__proto__", "0"), value: nasty }),
);

for (const [name, parse, bodies] of EXAMPLES) {
  test(`request-mutations - ${name}: a valid body mutated in up to three places is answered or refused with an ApiError, never a thrown error`, (t) => {
    for (const body of bodies) t.notThrows(() => parse(body), `${name}: the example itself is valid`);
    const mutated = fc
      .tuple(fc.constantFrom(...bodies), fc.array(fc.tuple(fc.nat(), mutation), { minLength: 1, maxLength: 3 }))
      .map(([body, steps]) => steps.reduce((value, [n, step]) => {
        const all = places(value);
        return mutate(value, all[n % all.length]!, step);
      }, body));
    fc.assert(
      fc.property(mutated, (body) => {
        try {
          parse(body);
        } catch (err) {
          if (!(err instanceof ApiError)) throw new Error(`${JSON.stringify(body)} threw ${String(err)}`);
          if (err.status !== 400 && err.status !== 413) throw new Error(`${JSON.stringify(body)} answered ${err.status}`);
        }
      }),
      { numRuns: 3_000, seed: 42 },
    );
    t.pass();
  });
}
