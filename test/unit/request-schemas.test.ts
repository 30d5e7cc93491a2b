import test from "ava";
import { z } from "zod";
import { ApiError } from "../../src/errors.js";
import { jsonBody, malformedQueryParam, parseWith, queryFlag, queryId, queryInt, queryLimit, refuse, requestError } from "../../src/request-schemas.js";
import { DeploymentRequestSchema } from "../../src/agent-config.js";
import { RunRequestBodySchema } from "../../src/run-request.js";
import { RunListQuerySchema } from "../../src/run-list.js";

/** The answer a schema gives `value`: undefined when accepted. */
function answer(schema: z.ZodType, value: unknown, style?: "field" | "path"): { code: string; param: string | null; message: string } | undefined {
  const parsed = schema.safeParse(value);
  if (parsed.success) return undefined;
  const err = requestError(parsed.error, style);
  return { code: err.code, param: err.param, message: err.message };
}

const Body = jsonBody({ name: z.string({ error: "must be a string." }).optional(), size: z.int().max(10).optional() }).superRefine((body, ctx) => {
  if (body.size === 9) refuse(ctx, "size", "Nine is too big for this test.", "payload_too_large");
  if (body.name === "both") refuse(ctx, null, "A rule across fields names no field.");
});

test("request-schemas - a body that is not an object names no parameter", (t) => {
  for (const value of [null, 3, "x", [1], true]) t.deepEqual(answer(Body, value), { code: "invalid_request", param: null, message: "The body must be a JSON object." }, JSON.stringify(value));
});

test("request-schemas - an unknown field is answered before any other fault", (t) => {
  t.deepEqual(answer(Body, { name: 5, colour: "red" }), { code: "invalid_request", param: "colour", message: "Unknown field colour." });
});

test("request-schemas - a field's message is prefixed by its path; a rule's custom issue keeps its sentence, param and code", (t) => {
  t.deepEqual(answer(Body, { name: 5 }), { code: "invalid_request", param: "name", message: "name: must be a string." });
  t.deepEqual(answer(Body, { size: 9 }), { code: "payload_too_large", param: "size", message: "Nine is too big for this test." });
  t.deepEqual(answer(Body, { name: "both" }), { code: "invalid_request", param: null, message: "A rule across fields names no field." });
  t.is(answer(Body, { name: "x", size: 3 }), undefined);
});

test("request-schemas - field style names the top-level field, path style the whole dotted path", (t) => {
  const nested = { config: { model: "faux/scripted", tools: ["rm"] } };
  t.is(answer(DeploymentRequestSchema, nested, "path")?.param, "config.tools.0");
  t.is(answer(DeploymentRequestSchema, nested, "field")?.param, "config");
  t.is(answer(RunRequestBodySchema, { agent: "a", input: [{ type: "input_text", text: 1 }] })?.param, "input");
  t.is(answer(RunRequestBodySchema, { agent: "a", input: [{ type: "input_text", text: 1 }] })?.message, "input.0.text: must be a string.");
});

test("request-schemas - a union is answered for the one form that took the value's type, else as the union", (t) => {
  // An array: only the parts form takes it, so the fault inside a part is named.
  t.is(answer(RunRequestBodySchema, { agent: "a", input: [5] })?.message, "input.0: must be an object.");
  t.is(answer(RunRequestBodySchema, { agent: "a", input: [{ type: "voice" }] })?.message, "input.0.type: must be input_text or input_file.");
  // A number: no form takes it.
  t.is(answer(RunRequestBodySchema, { agent: "a", input: 3 })?.message, "input: must be a string or an array of input parts.");
  t.is(answer(RunRequestBodySchema, { agent: "a" })?.message, "input: is required.");
  // A script step is an object every form takes: the step itself is named.
  t.is(answer(DeploymentRequestSchema, { config: { model: "faux/scripted", script: [{ say: "x" }] } }, "path")?.param, "config.script.0");
});

test("request-schemas - query helpers: once, digits within range, defaults, true/false", (t) => {
  const Query = z.object({ limit: queryLimit(100, 20), n: queryInt(1, 5, "must be 1 to 5.").optional(), flag: queryFlag(), id: queryId().optional() });
  t.deepEqual(parseWith(Query, {}), { limit: 20, flag: false });
  t.deepEqual(parseWith(Query, { limit: "100", n: "5", flag: "true", id: "x" }), { limit: 100, n: 5, flag: true, id: "x" });
  for (const [name, value] of [["limit", "0"], ["limit", "101"], ["limit", "1.5"], ["limit", "1e2"], ["limit", " 5"], ["limit", ["1", "2"]], ["n", "6"], ["n", "-1"], ["flag", "yes"], ["flag", ["true", "true"]], ["id", ""], ["id", ["a", "b"]]] as const) {
    const err = t.throws(() => parseWith(Query, { [name]: value }), { instanceOf: ApiError }, `${name}=${JSON.stringify(value)}`);
    t.is(err?.param, name);
  }
});

test("request-schemas - run list filters: tag repeats up to 5 times, each a valid tag", (t) => {
  t.deepEqual(parseWith(RunListQuerySchema, { tag: "a" }).tag, ["a"]);
  t.deepEqual(parseWith(RunListQuerySchema, { tag: ["a", "b"] }).tag, ["a", "b"]);
  t.deepEqual(parseWith(RunListQuerySchema, {}).tag, []);
  t.is(t.throws<ApiError>(() => parseWith(RunListQuerySchema, { tag: ["a", "b", "c", "d", "e", "f"] }))?.param, "tag");
  t.is(t.throws<ApiError>(() => parseWith(RunListQuerySchema, { tag: "a\tb" }))?.param, "tag");
  t.is(t.throws<ApiError>(() => parseWith(RunListQuerySchema, { state: "asleep" }))?.param, "state");
  t.is(t.throws<ApiError>(() => parseWith(RunListQuerySchema, { created_after: "yesterday" }))?.param, "created_after");
});

test("request-schemas - a query parameter whose encoded bytes are not UTF-8 is named; well-formed values, a lone %, and paths are not", (t) => {
  const cases: Array<[string, string | undefined]> = [
    ["/api/v1/runs", undefined],
    ["/api/v1/runs?tag=a&tag=%C3%A9&tag=%E2%82%AC&limit=5", undefined],
    ["/api/v1/runs?tag=100%&tag=%zz&tag=%", undefined],
    ["/api/v1/runs/%FF?limit=5", undefined],
    ["/api/v1/runs?tag=%FF", "tag"],
    ["/api/v1/runs?limit=5&tag=a%E2%82", "tag"],
    ["/api/v1/runs?tag=ok&tag=%C3", "tag"],
    ["/api/v1/runs?tag=%E2%82%AC%80", "tag"],
    ["/api/v1/runs?ag%65nt=%FF", "agent"],
    ["/api/v1/runs?%FF=1", "%FF"],
    ["/api/v1/runs?tag", undefined],
    // The router takes the query from the first ? or #.
    ["/api/v1/runs#tag=%FF", "tag"],
  ];
  for (const [url, param] of cases) t.is(malformedQueryParam(url), param, url);
  // Only the parameters the route reads.
  const readsTag = (name: string) => name === "tag";
  t.is(malformedQueryParam("/api/v1/runs?utm=%FF&tag=a", readsTag), undefined);
  t.is(malformedQueryParam("/api/v1/runs?utm=%FF&tag=%FF", readsTag), "tag");
});
