import test from "ava";
import { parseDeploymentRequest } from "../../src/agent-config.js";
import { FILENAME_PATTERN, hasLoneSurrogate, MEDIA_TYPE_PATTERN, parseRunRequest } from "../../src/run-request.js";
import { buildOpenApiDocument } from "../../gateway/openapi.js";
import { scopeListProblem } from "../../src/scopes.js";
import { ApiKeyCreateRequestSchema, DeploymentRequestSchema, RunRequestSchema, TagSchema } from "../../gateway/schemas.js";
import { tagProblem } from "../helpers/tag-oracle.js";

/**
 * The request schemas the document shows are the ones the routes validate with. These
 * samples hold them to the functions callers outside a route use (parseRunRequest,
 * parseDeploymentRequest) and to the hand-written rules of the contract (scopes, tags).
 */

function parses(fn: () => unknown): boolean {
  try {
    fn();
    return true;
  } catch {
    return false;
  }
}

test("openapi schemas - DeploymentRequest mirror agrees with parseDeploymentRequest", (t) => {
  const samples: unknown[] = [
    { config: { model: "faux/scripted" } },
    { config: { model: "openai/gpt-4.1-mini", instructions: "x", tools: ["bash", "ls"], limits: { command_timeout_s: 5 } }, upgrade_policy: "new_run_only", activate: false },
    { config: { model: { provider: "openai-compatible", base_url: "http://127.0.0.1:1/v1", model: "m" } } },
    { config: { model: "faux/scripted", script: [{ text: "a" }, { tool_call: { name: "bash", arguments: { command: "ls" } } }, { error: { message: "x", status: 429 } }], tokens_per_second: 50 } },
    { config: { model: "faux/scripted" }, extra: 1 },
    { config: { model: "no-slash" } },
    { config: { model: "faux/scripted", tools: ["rm"] } },
    { config: { model: "faux/scripted", limits: { command_timeout_s: 0 } } },
    { config: { model: "faux/scripted", script: [{ text: 1 }] } },
    { config: { model: "faux/scripted", script: [{ error: { message: "x", status: 99 } }] } },
    { config: { model: { provider: "openai-compatible", base_url: "not a url", model: "m" } } },
    { config: { model: { provider: "openai-compatible", base_url: "ftp://203.0.113.7/v1", model: "m" } } },
    { config: { model: { provider: "openai-compatible", base_url: "http://u:p@203.0.113.7/v1", model: "m" } } },
    { config: { model: "faux/scripted" }, upgrade_policy: "sometimes" },
    { config: { model: "faux/scripted" }, activate: "yes" },
    {},
  ];
  for (const sample of samples) {
    t.is(DeploymentRequestSchema.safeParse(sample).success, parses(() => parseDeploymentRequest(sample)), JSON.stringify(sample));
  }
});

test("openapi schemas - RunRequest accepts what parseRunRequest accepts and refuses wrong shapes", (t) => {
  const accepted: unknown[] = [
    { agent: "agt_1", input: "hi" },
    { agent: "agt_1", version: 2, input: [{ type: "input_text", text: "x" }], tags: ["a", "b c"], background: true },
    { run_id: "run_1", input: "x", on_busy: "steer", stream: true },
    { run_id: "run_1", input: [{ type: "input_file", file_id: "file_1" }], on_busy: null },
    { agent: "agt_1", input: [{ type: "input_file", filename: "a.txt", file_data: "aGk=" }] },
  ];
  for (const sample of accepted) {
    t.true(parses(() => parseRunRequest(sample)), JSON.stringify(sample));
    t.true(RunRequestSchema.safeParse(sample).success, JSON.stringify(sample));
  }
  const refused: unknown[] = [
    { agent: "agt_1", input: "x", colour: 1 },
    { agent: "agt_1", input: "x", version: 0 },
    { agent: "agt_1", input: "x", version: 1.5 },
    { agent: "agt_1", input: [] },
    { agent: "agt_1", input: 3 },
    { run_id: "run_1", input: "x", on_busy: "later" },
    { agent: "agt_1", input: "x", tags: [""] },
    { agent: "agt_1", input: "x", tags: ["a\tb"] },
    { agent: "agt_1", input: "x", tags: ["   "] },
    { agent: "agt_1", input: "x", tags: ["x".repeat(65)] },
    { agent: "agt_1", input: "x", background: "yes" },
  ];
  for (const sample of refused) {
    t.false(parses(() => parseRunRequest(sample)), JSON.stringify(sample));
    t.false(RunRequestSchema.safeParse(sample).success, JSON.stringify(sample));
  }
});

test("openapi schemas - Tag pattern agrees with tagProblem", (t) => {
  for (const tag of ["a", "A b", "ünï", "🙂".repeat(64), "🙂".repeat(65), "", " ", "\u00a0", "a\nb", "a\u0085", "a\u2028", "x".repeat(64), "x".repeat(65), " lead"]) {
    t.is(TagSchema.safeParse(tag).success, tagProblem(tag) === undefined, JSON.stringify(tag));
  }
});

test("openapi schemas - every pattern of the document reads the same without the u flag (JSON Schema carries none): no \\p classes; filename and media type patterns agree with the validators (found by a review)", (t) => {
  const patterns = new Set<string>();
  const walk = (node: unknown): void => {
    if (Array.isArray(node)) return node.forEach(walk);
    if (node === null || typeof node !== "object") return;
    for (const [key, value] of Object.entries(node)) {
      if (key === "pattern" && typeof value === "string") patterns.add(value);
      else walk(value);
    }
  };
  walk(buildOpenApiDocument());
  t.true(patterns.size > 0);
  for (const pattern of patterns) {
    t.notRegex(pattern, /\\[pP]\{/, pattern);
    t.notThrows(() => new RegExp(pattern), pattern);
  }
  const inline = (extra: Record<string, unknown>) => parses(() => parseRunRequest({ agent: "a", input: [{ type: "input_file", filename: "a.txt", file_data: "aGk=", ...extra }] }));
  for (const filename of ["report.pdf", "ünï 😀.txt", "a\u0085b", "a\nb", "a\ud800b"]) {
    t.is(new RegExp(`^${FILENAME_PATTERN.source.replace(/^\^|\$$/g, "")}$`).test(filename) && !hasLoneSurrogate(filename), inline({ filename }), JSON.stringify(filename));
  }
  for (const media_type of ["text/plain", 'text/plain; a="b c"', "text/plain;\r\nX-Evil=1", 'text/plain; a="\u0085"', "text/plain; a=\"\u2028\""]) {
    t.is(MEDIA_TYPE_PATTERN.test(media_type), inline({ media_type }), JSON.stringify(media_type));
  }
  t.false(inline({ media_type: "text/plain;\r\nX-Evil=1" }));
  t.false(inline({ media_type: 'text/plain; a="\u0085"' }));
});

test("openapi schemas - ApiKeyCreateRequest scopes: canonical values, 1 to 11 (uniqueness and read pairs are described)", (t) => {
  for (const scopes of [["run:read"], ["run:read", "run:write"], [], ["nope"], ["run:write"]]) {
    const schemaOk = ApiKeyCreateRequestSchema.safeParse({ scopes }).success;
    if (schemaOk === false) t.truthy(scopeListProblem(scopes), JSON.stringify(scopes));
    else if (scopeListProblem(scopes) === undefined) t.pass();
    else t.regex(scopeListProblem(scopes)!, /requires|twice/, "only the described rules are beyond the schema");
  }
});
