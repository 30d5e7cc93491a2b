import test from "ava";
import { SCOPES, scopeListProblem } from "../../src/scopes.js";
import { decodeCursor, encodeCursor } from "../../src/cursors.js";
import { createHmac } from "node:crypto";
import { cursorTag, useCursorKey } from "../../src/cursor-key.js";
import { parseWith, queryLimit } from "../../src/request-schemas.js";
import { z } from "zod";

/** The `limit` query parameter as a list route validates it. */
const parseLimit = (raw: string | undefined, fallback: number, max: number) => parseWith(z.object({ limit: queryLimit(max, fallback) }), { limit: raw }).limit;
import { ApiError, ERROR_CATALOGUE, ErrorType, type ErrorCode } from "../../src/errors.js";
import { partitionOf, rendezvousOwner } from "../../src/partition.js";
import { retryAfterSeconds } from "../../gateway/unavailable.js";

test("scopes - the specification's eleven, then webhooks:read and webhooks:write (issue 16); write and reveal need their read scope", (t) => {
  t.is(SCOPES.length, 13);
  t.deepEqual(SCOPES.slice(11), ["webhooks:read", "webhooks:write"]);
  t.truthy(scopeListProblem(["webhooks:write"]));
  t.is(scopeListProblem(["webhooks:read", "webhooks:write"]), undefined);
  t.is(scopeListProblem([...SCOPES]), undefined);
  t.truthy(scopeListProblem([]));
  t.truthy(scopeListProblem(["run:write"]));
  t.truthy(scopeListProblem(["env_vars:reveal"]));
  t.is(scopeListProblem(["env_vars:read", "env_vars:reveal"]), undefined);
  t.truthy(scopeListProblem(["run:read", "run:read"]));
  t.truthy(scopeListProblem(["run:admin"]));
  t.truthy(scopeListProblem([...SCOPES, "run:read"]));
  // Every single scope alone is valid exactly when it is not a write/reveal scope.
  for (const scope of SCOPES) {
    const alone = scopeListProblem([scope]);
    t.is(alone === undefined, !/:(write|reveal)$/.test(scope), scope);
  }
});

test("cursors - round trip; another owner's cursor is invalid_cursor; garbage is invalid_request", (t) => {
  const raw = encodeCursor({ s: "turns", o: "run_a", k: "3", id: "turn_x" });
  t.deepEqual(decodeCursor(raw, "turns", "run_a"), { s: "turns", o: "run_a", k: "3", id: "turn_x" });
  const other = t.throws(() => decodeCursor(raw, "turns", "run_b")) as ApiError;
  t.is(other.code, "invalid_cursor");
  t.is(other.status, 400);
  const garbage = t.throws(() => decodeCursor("%%%", "turns", "run_a")) as ApiError;
  t.is(garbage.code, "invalid_cursor");
  t.is(garbage.param, "after");
});

test("cursors - a forged or edited cursor is invalid_cursor before its position is read", (t) => {
  const raw = encodeCursor({ s: "runs", o: "ws_a", k: "1000", id: "run_x" });
  const [body, tag] = raw.split(".") as [string, string];
  const forgedBody = Buffer.from(JSON.stringify({ s: "runs", o: "ws_a", k: "1", id: "run_y" })).toString("base64url");
  const flipped = Buffer.from(tag, "base64url");
  flipped[0] ^= 1;
  const cases = [
    forgedBody, // the old, untagged form
    `${forgedBody}.${tag}`, // another position under a genuine tag
    `${body}.${flipped.toString("base64url")}`,
    `${body}.`,
    `${body}.${tag}.${tag}`,
    `.${tag}`,
    "",
  ];
  for (const bad of cases) {
    const err = t.throws(() => decodeCursor(bad, "runs", "ws_a", "after"), undefined, bad) as ApiError;
    t.is(err.code, "invalid_cursor", bad);
    t.is(err.status, 400);
    t.is(err.param, "after");
  }
  t.deepEqual(decodeCursor(raw, "runs", "ws_a"), { s: "runs", o: "ws_a", k: "1000", id: "run_x" });
});

test("cursors - the tag is the HMAC of each part as `length:text;` in turn: cursors and event ids handed out before stay valid", (t) => {
  const master = Buffer.alloc(32, 3).toString("base64");
  useCursorKey(master);
  const key = createHmac("sha256", Buffer.from(master, "base64")).update("runs-cursors:v1").digest();
  const mac = createHmac("sha256", key);
  for (const part of ["evt", "run_abc", 1234, 7]) mac.update(`${String(part).length}:${part};`);
  t.deepEqual(cursorTag(["evt", "run_abc", 1234, 7], 8), mac.digest().subarray(0, 8));
  t.notDeepEqual(cursorTag(["evt", "run_abc", 123, 47], 8), cursorTag(["evt", "run_abc", 1234, 7], 8), "parts are joined unambiguously");
  t.is(cursorTag(["list", "x"], 32).length, 32);
  t.throws(() => cursorTag(["list", "x"], 33), { instanceOf: RangeError }, "an HMAC-SHA256 has 32 bytes");
});

test("cursors - limit is a whole number within range", (t) => {
  t.is(parseLimit(undefined, 20, 100), 20);
  t.is(parseLimit("1", 20, 100), 1);
  t.is(parseLimit("100", 20, 100), 100);
  for (const bad of ["0", "101", "-1", "1.5", "abc", ""]) t.throws(() => parseLimit(bad, 20, 100), undefined, bad);
});

test("errors - every catalogue entry maps to its status's type and renders the spec body", (t) => {
  const expectedType: Record<number, ErrorType> = {
    400: ErrorType.invalid_request,
    401: ErrorType.authentication,
    403: ErrorType.permission,
    404: ErrorType.not_found,
    408: ErrorType.request_timeout,
    409: ErrorType.conflict,
    410: ErrorType.gone,
    413: ErrorType.payload_too_large,
    429: ErrorType.rate_limit,
    500: ErrorType.api,
    502: ErrorType.unavailable,
    503: ErrorType.unavailable,
  };
  for (const code of Object.keys(ERROR_CATALOGUE) as ErrorCode[]) {
    const err = new ApiError(code, { param: "x" });
    t.is(err.type, expectedType[err.status], code);
    const body = err.toBody().error;
    t.deepEqual(Object.keys(body).sort(), ["code", "message", "param", "retryable", "type"], code);
  }
});

test("errors - the spec's status for each named code", (t) => {
  const spec: Record<string, number> = {
    invalid_request: 400, invalid_cursor: 400, agent_not_found: 404, agent_version_not_found: 404, run_not_found: 404,
    turn_not_found: 404, agent_version_not_ready: 409, idempotency_conflict: 409, steering_target_ended: 409, conflict: 409,
    run_expired: 410, event_cursor_expired: 410, request_timeout: 408, rate_limited: 429, runtime_unavailable: 503,
    upload_in_progress: 503, event_boundary_pending: 503, event_history_unavailable: 503, run_failed_internal: 500,
    internal_error: 500, unauthorized: 401, permission_denied: 403, not_found: 404, deployment_expired: 410,
    quota_exceeded: 429, upstream_unavailable: 502, stream_cursor_expired: 410, payload_too_large: 413,
  };
  for (const [code, status] of Object.entries(spec)) t.is(ERROR_CATALOGUE[code as ErrorCode].status as number, status, code);
  t.false(ERROR_CATALOGUE.steering_target_ended.retryable);
  t.true(ERROR_CATALOGUE.runtime_unavailable.retryable);
  t.false(ERROR_CATALOGUE.run_failed_internal.retryable);
  t.false(ERROR_CATALOGUE.internal_error.retryable);
});

test("errors - runtime_unavailable keeps its fixed message without store wording", (t) => {
  const err = new ApiError("runtime_unavailable", { message: "MongoServerSelectionError: connect ECONNREFUSED" });
  t.notRegex(err.message, /mongo|database|ECONN/i);
});

test("unavailable - Retry-After is 1 to 3 seconds and varies", (t) => {
  const seen = new Set<number>();
  for (const r of [0, 0.2, 0.34, 0.5, 0.67, 0.99]) seen.add(retryAfterSeconds(() => r));
  t.deepEqual([...seen].sort(), [1, 2, 3]);
});

test("partitions - stable hashing and rendezvous placement", (t) => {
  t.is(partitionOf("run_abc", 64), partitionOf("run_abc", 64));
  const counts = new Array(8).fill(0);
  for (let i = 0; i < 8000; i++) counts[partitionOf(`run_${i}`, 8)]++;
  for (const c of counts) t.true(c > 800 && c < 1200, `balanced: ${counts}`);
  const nodes = ["a", "b", "c"];
  const owners = Array.from({ length: 64 }, (_, p) => rendezvousOwner(p, nodes));
  // Removing a node only moves that node's partitions.
  const without = Array.from({ length: 64 }, (_, p) => rendezvousOwner(p, ["a", "c"]));
  for (let p = 0; p < 64; p++) if (owners[p] !== "b") t.is(without[p], owners[p]);
  t.is(rendezvousOwner(3, []), undefined);
});
