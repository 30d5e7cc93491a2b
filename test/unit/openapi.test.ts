import test from "ava";
import { readFileSync } from "node:fs";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import { ERROR_CATALOGUE, errorTypeForStatus, type ErrorCode } from "../../src/errors.js";
import { buildOpenApiDocument, OPERATIONS } from "../../gateway/openapi.js";

const doc = buildOpenApiDocument() as any;
const METHODS = ["get", "put", "post", "delete", "patch"];

/** Codes no route answers yet; the specification names them (decisions §7 fixes their status). */
const NOT_ANSWERED_BY_ANY_ROUTE: ReadonlySet<string> = new Set([
  "deployment_expired",
  "stream_cursor_expired",
  "upstream_unavailable",
  "run_failed_internal",
]);

function* responses(): Generator<{ where: string; status: number; response: any }> {
  for (const [path, item] of Object.entries<any>(doc.paths)) {
    for (const method of METHODS) {
      const op = item[method];
      if (!op) continue;
      for (const [status, response] of Object.entries<any>(op.responses)) yield { where: `${method.toUpperCase()} ${path} ${status}`, status: Number(status), response };
    }
  }
}

test("openapi - every catalogue code is in x-error-codes with its status, type and retryable", (t) => {
  const listed = new Map<string, any>(doc["x-error-codes"].map((entry: any) => [entry.code, entry]));
  t.deepEqual([...listed.keys()].sort(), Object.keys(ERROR_CATALOGUE).sort());
  for (const [code, entry] of Object.entries(ERROR_CATALOGUE)) {
    const documented = listed.get(code);
    t.is(documented.status, entry.status, code);
    t.is(documented.type, errorTypeForStatus(entry.status), code);
    t.is(documented.retryable, entry.retryable, code);
  }
});

test("openapi - every error code on a response belongs to that response's status in the catalogue", (t) => {
  let checked = 0;
  for (const { where, status, response } of responses()) {
    if (status < 400 || !response["x-error-codes"]) continue;
    for (const code of response["x-error-codes"] as ErrorCode[]) {
      t.truthy(ERROR_CATALOGUE[code], `${where}: unknown code ${code}`);
      t.is(ERROR_CATALOGUE[code].status as number, status, `${where}: ${code}`);
      t.true(response.description.includes(code), `${where}: description names ${code}`);
      checked++;
    }
    t.deepEqual(response.content["application/json"].schema, { $ref: "#/components/schemas/Error" }, where);
  }
  t.true(checked > 100);
});

test("openapi - every catalogue code is answered by some operation, or is listed as not answered yet", (t) => {
  const used = new Set<string>();
  for (const { response } of responses()) for (const code of response["x-error-codes"] ?? []) used.add(code);
  for (const code of Object.keys(ERROR_CATALOGUE)) {
    t.true(used.has(code) !== NOT_ANSWERED_BY_ANY_ROUTE.has(code), `${code}: used ${used.has(code)}`);
  }
});

test("openapi - 429 and 503 error answers carry Retry-After; authenticated answers carry the rate-limit headers except 401/403", (t) => {
  for (const [path, item] of Object.entries<any>(doc.paths)) {
    for (const method of METHODS) {
      const op = item[method];
      if (!op) continue;
      const isPublic = Array.isArray(op.security) && op.security.length === 0;
      t.is(isPublic, op["x-required-scope"] === undefined, `${method} ${path}`);
      for (const [status, response] of Object.entries<any>(op.responses)) {
        const headers = Object.keys(response.headers ?? {});
        const where = `${method} ${path} ${status}`;
        if (!isPublic && status !== "401" && status !== "403") {
          t.true(["X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"].every((h) => headers.includes(h)), where);
        }
        if ((status === "429" || status === "503") && response["x-error-codes"]) t.true(headers.includes("Retry-After"), where);
      }
    }
  }
});

test("openapi - path parameters are declared; Idempotency-Key where the specification requires it", (t) => {
  const needsKey = new Set(["post /api/v1/runs", "post /api/v1/runs/{runId}/cancel", "delete /api/v1/runs/{runId}", "post /api/v1/files", "post /api/v1/agents/{agentId}/deployments", "post /api/v1/runs/{runId}/actions/{actionId}"]);
  for (const [path, item] of Object.entries<any>(doc.paths)) {
    const names = [...path.matchAll(/\{([^}]+)\}/g)].map((m) => m[1]);
    for (const method of METHODS) {
      const op = item[method];
      if (!op) continue;
      const params = op.parameters ?? [];
      for (const name of names) t.truthy(params.find((p: any) => p.in === "path" && p.name === name && p.required), `${method} ${path} {${name}}`);
      const key = params.find((p: any) => p.in === "header" && p.name === "Idempotency-Key");
      t.is(Boolean(key?.required), needsKey.has(`${method} ${path}`), `${method} ${path} Idempotency-Key`);
    }
  }
});

test("openapi - the document is 3.1, versioned from package.json, and every schema compiles (draft 2020-12) with refs resolved", (t) => {
  const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8"));
  t.is(doc.openapi, "3.1.0");
  t.is(doc.info.version, pkg.version);
  t.deepEqual(doc.components.securitySchemes.bearer, { type: "http", scheme: "bearer", description: "An API key: rk_live_…" });
  const ajv = new Ajv2020.default({ strict: false, allErrors: true });
  addFormats.default(ajv);
  ajv.addSchema({ $id: "https://runs.invalid/openapi.json", components: doc.components });
  for (const name of Object.keys(doc.components.schemas)) {
    t.notThrows(() => ajv.compile({ $ref: `https://runs.invalid/openapi.json#/components/schemas/${name}` }), name);
  }
  // Every $ref anywhere names something that exists.
  const text = JSON.stringify(doc);
  for (const [, target] of text.matchAll(/"\$ref":"#\/([^"]+)"/g)) {
    let node: any = doc;
    for (const part of target!.split("/")) node = node?.[part];
    t.truthy(node, target);
  }
  t.is(new Set(OPERATIONS.map((op) => op.operationId)).size, OPERATIONS.length, "operationIds are unique");
});

test("openapi - POST /api/v1/runs answers 200/202 Run, SSE, and 202 carries Location", (t) => {
  const op = doc.paths["/api/v1/runs"].post;
  // The stream is described beside the JSON answer, not in `content`, so generated clients type the JSON answer.
  t.deepEqual(Object.keys(op.responses["200"].content), ["application/json"]);
  t.deepEqual(Object.keys(op.responses["200"]["x-stream-content"]), ["text/event-stream"]);
  t.truthy(op.responses["202"].headers.Location);
  t.deepEqual(op.responses["409"]["x-error-codes"].sort(), ["agent_version_not_ready", "idempotency_conflict", "run_busy", "steering_target_ended"]);
  t.truthy(doc.paths["/api/v1/files"].post.requestBody.content["multipart/form-data"]);
  t.truthy(doc.paths["/api/v1/runs/{runId}/events"].get.responses["200"]["x-stream-content"]["text/event-stream"]);
});

test("openapi - rate classes as decisions §7 says: file upload, deployment create, key create/rotate are expensive; cancel and key revocation are exempt; nothing else is either", (t) => {
  const byClass = (rate: string) =>
    OPERATIONS.filter((op) => op.rate === rate)
      .map((op) => op.operationId)
      .sort();
  t.deepEqual(byClass("expensive"), ["createApiKey", "createDeployment", "rotateApiKey", "rotateApiKeyUnversioned", "uploadFile"]);
  t.deepEqual(byClass("exempt"), ["cancelRun", "revokeApiKey"]);
});
