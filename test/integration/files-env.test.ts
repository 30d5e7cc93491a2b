import anyTest, { type TestFn } from "ava";
import { createHash, randomBytes } from "node:crypto";
import http from "node:http";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";
import { Objm } from "@nats-io/obj";
import { Kvm } from "@nats-io/kv";
import { UploadSlots } from "../../gateway/upload-slots.js";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { EnvValues } from "../../src/env-values.js";
import { BlobKeyring } from "../../src/blob-crypto.js";
import { FileStore } from "../../src/file-store.js";
import { FILES_BUCKET } from "../../src/nats.js";
import { systemClock } from "../../src/clock.js";
import { Ids } from "../../src/ids.js";

const MASTER_KEY = Buffer.alloc(32, 7).toString("base64");
// Uploads and reveals are expensive operations under rate limiting: keep the tests clear of it.
const RATE_ENV = { RUNS_RATE_BUSINESS: "100000", RUNS_RATE_EXPENSIVE_BUSINESS: "100000" };
const TIGHT_ENV = { RUNS_UPLOAD_TAKEOVER_MS: "1500", RUNS_UPLOAD_TIME_LIMIT_MS: "4000", RUNS_MAX_FILE_BYTES: String(1024 * 1024) };

interface Ctx {
  servers: TestServers;
  service: RunningService;
  /** The same store with short upload limits (takeover 1.5 s, time limit 4 s, files up to 1 MiB). */
  tight: RunningService;
  api: Api;
  wsId: string;
  other: Api;
  tightApi: Api;
  tightWsId: string;
  nc: NatsConnection;
}

const test = anyTest as TestFn<Ctx>;

/**
 * Starts a service with `env`. The upload limits are also put in process.env while it
 * starts, for as long as the Config has no `files` section (this file runs in its own process).
 */
async function startWith(servers: TestServers, env: Record<string, string>): Promise<RunningService> {
  const saved = { ...process.env };
  Object.assign(process.env, env);
  try {
    return await startTestService(servers, env);
  } finally {
    for (const name of Object.keys(env)) {
      if (saved[name] === undefined) delete process.env[name];
      else process.env[name] = saved[name];
    }
  }
}

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startWith(servers, RATE_ENV);
  const tight = await startWith(servers, { ...RATE_ENV, ...TIGHT_ENV });
  const ws = await newWorkspace(service, "business");
  const other = await newWorkspace(service, "business");
  const tightWs = await newWorkspace(tight, "business");
  const nc = await connect({ servers: servers.natsUrl, user: "runs", pass: servers.servicePassword });
  t.context = { servers, service, tight, api: ws.api, wsId: ws.id, other: other.api, tightApi: tightWs.api, tightWsId: tightWs.id, nc };
});

test.after.always(async (t) => {
  await t.context.nc?.close();
  await t.context.tight?.close();
  await t.context.service?.close();
  await t.context.servers?.stop();
});

// ---- multipart helpers ---------------------------------------------------------------

type Part = { name: string; value: string } | { name: string; filename?: string; contentType?: string; data: Buffer };

const BOUNDARY = "----runs-test-boundary-7MA4YWxkTrZu0gW";

function partHead(part: Part): Buffer {
  if ("value" in part) {
    return Buffer.from(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="${part.name}"\r\n\r\n${part.value}\r\n`);
  }
  const filename = part.filename === undefined ? "" : `; filename="${part.filename}"`;
  const type = part.contentType === undefined ? "" : `Content-Type: ${part.contentType}\r\n`;
  return Buffer.from(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="${part.name}"${filename}\r\n${type}\r\n`);
}

function multipart(parts: Part[]): Buffer {
  const chunks: Buffer[] = [];
  for (const part of parts) {
    chunks.push(partHead(part));
    if (!("value" in part)) chunks.push(part.data, Buffer.from("\r\n"));
  }
  chunks.push(Buffer.from(`--${BOUNDARY}--\r\n`));
  return Buffer.concat(chunks);
}

async function upload(api: Api, key: string | undefined, parts: Part[]) {
  const headers: Record<string, string> = { "content-type": `multipart/form-data; boundary=${BOUNDARY}` };
  if (api.key) headers.authorization = `Bearer ${api.key}`;
  if (key !== undefined) headers["idempotency-key"] = key;
  const res = await fetch(`${api.baseUrl}/api/v1/files`, { method: "POST", headers, body: new Uint8Array(multipart(parts)), signal: AbortSignal.timeout(60_000) });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined, headers: res.headers };
}

function fileParts(data: Buffer, filename = "notes.txt", contentType = "text/plain"): Part[] {
  return [{ name: "file", filename, contentType, data }];
}

const sha256 = (data: Buffer) => createHash("sha256").update(data).digest("hex");
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const uploadIdOf = (workspaceId: string, key: string) => createHash("sha256").update(`${workspaceId}\u0000files.create\u0000${key}`).digest("hex");
const newKey = () => `up-${randomBytes(6).toString("hex")}`;

/**
 * A real socket upload whose body is written by the test: `write` sends bytes of the
 * file part (after its head), `finish` ends the form, `abort` destroys the socket.
 */
function rawUpload(api: Api, key: string, filename = "slow.bin") {
  const url = new URL(`${api.baseUrl}/api/v1/files`);
  const req = http.request({
    hostname: url.hostname,
    port: url.port,
    path: url.pathname,
    method: "POST",
    headers: {
      authorization: `Bearer ${api.key}`,
      "idempotency-key": key,
      "content-type": `multipart/form-data; boundary=${BOUNDARY}`,
      "transfer-encoding": "chunked",
    },
  });
  const response = new Promise<{ status: number; body: any; headers: http.IncomingHttpHeaders } | { error: Error }>((resolve) => {
    req.on("response", (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => (text += chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: text ? JSON.parse(text) : undefined, headers: res.headers }));
      res.on("error", (error) => resolve({ error }));
    });
    req.on("error", (error) => setTimeout(() => resolve({ error }), 200)); // a response may still arrive first
  });
  req.write(partHead({ name: "file", filename, contentType: "application/octet-stream", data: Buffer.alloc(0) }));
  return {
    req,
    response,
    write: (data: Buffer) => req.write(data),
    finish: () => req.end(Buffer.from(`\r\n--${BOUNDARY}--\r\n`)),
    abort: () => req.destroy(),
  };
}

/** Keeps a raw upload busy: a few bytes every `everyMs` until stopped. */
function trickle(upload: ReturnType<typeof rawUpload>, everyMs: number) {
  const timer = setInterval(() => {
    if (!upload.req.destroyed) upload.write(Buffer.from("0123456789"));
  }, everyMs);
  return () => clearInterval(timer);
}

/** Waits until the upload under `key` has claimed its record (the request reached its file part). */
async function waitUploading(servers: TestServers, workspaceId: string, key: string): Promise<void> {
  const uploads = (await servers.raw()).db.collection<{ _id: string; state: string }>("file_uploads");
  const record = await waitFor(() => uploads.findOne({ _id: uploadIdOf(workspaceId, key) }), (r) => r?.state === "uploading");
  if (record?.state !== "uploading") throw new Error(`upload ${key} never started`);
}

async function waitFor<T>(what: () => Promise<T>, ok: (value: T) => boolean, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last = await what();
  while (!ok(last) && Date.now() < deadline) {
    await sleep(100);
    last = await what();
  }
  return last;
}

// ---- environment values --------------------------------------------------------------

test("env values - a value with a control character is refused (400 param value), a tab is kept: a credential with a line break had made the HTTP client's refusal, which quotes the header, carry it into the turn's error, events and webhooks (probe)", async (t) => {
  const { api } = await newWorkspace(t.context.service, "business");
  for (const value of ["sk-one\nsk-two", "sk-one\r\nX-Injected: yes", "sk\u0000x", "sk\u0001x", "sk\u007fx", "\n"]) {
    const res = await api.request("PUT", "/api/v1/environment-values/ANTHROPIC_API_KEY", { body: { value } });
    t.is(res.status, 400, JSON.stringify(value));
    t.is(res.body.error.param, "value");
    t.regex(res.body.error.message, /control character/);
    t.false(JSON.stringify(res.body).includes("sk-one"), "the refusal does not quote the value");
  }
  t.is((await api.get("/api/v1/environment-values/ANTHROPIC_API_KEY")).status, 404, "nothing stored");
  const tab = await api.request("PUT", "/api/v1/environment-values/ANTHROPIC_API_KEY", { body: { value: "sk-a\tb é ✓" } });
  t.is(tab.status, 200);
  t.is((await api.get("/api/v1/environment-values/ANTHROPIC_API_KEY?reveal=true")).body.value, "sk-a\tb é ✓");
});

test("env values - put, list, get, reveal, replace keeps created_at, delete", async (t) => {
  const { api } = await newWorkspace(t.context.service, "business");
  const put = await api.request("PUT", "/api/v1/environment-values/OPENAI_API_KEY", { body: { value: "sk-first" } });
  t.is(put.status, 200);
  t.deepEqual(Object.keys(put.body).sort(), ["created_at", "name", "object", "updated_at"]);
  t.is(put.body.object, "environment_value");
  t.is(put.body.name, "OPENAI_API_KEY");
  t.is(typeof put.body.created_at, "number");
  await sleep(1100);
  const replaced = await api.request("PUT", "/api/v1/environment-values/OPENAI_API_KEY", { body: { value: "sk-second" } });
  t.is(replaced.status, 200);
  t.is(replaced.body.created_at, put.body.created_at);
  t.true(replaced.body.updated_at > put.body.updated_at);
  await api.request("PUT", "/api/v1/environment-values/_OTHER", { body: { value: "" } });

  const listed = await api.get("/api/v1/environment-values");
  t.is(listed.status, 200);
  t.is(listed.body.object, "list");
  t.deepEqual(listed.body.data.map((v: any) => v.name), ["OPENAI_API_KEY", "_OTHER"]);
  t.false(listed.body.data.some((v: any) => "value" in v), "list never shows values");

  const page = await api.get("/api/v1/environment-values?limit=1");
  t.true(page.body.has_more);
  const rest = await api.get(`/api/v1/environment-values?limit=1&after=${page.body.next_cursor}`);
  t.deepEqual(rest.body.data.map((v: any) => v.name), ["_OTHER"]);

  const plain = await api.get("/api/v1/environment-values/OPENAI_API_KEY");
  t.is(plain.status, 200);
  t.false("value" in plain.body);
  const revealed = await api.get("/api/v1/environment-values/OPENAI_API_KEY?reveal=true");
  t.is(revealed.body.value, "sk-second");
  t.is((await api.get("/api/v1/environment-values/OPENAI_API_KEY?reveal=yes")).body.error.param, "reveal");

  const deleted = await api.request("DELETE", "/api/v1/environment-values/OPENAI_API_KEY");
  t.deepEqual(deleted.body, { name: "OPENAI_API_KEY", object: "environment_value.deleted", deleted: true });
  const gone = await api.get("/api/v1/environment-values/OPENAI_API_KEY");
  t.is(gone.status, 404);
  t.is(gone.body.error.code, "not_found");
  t.is((await api.request("DELETE", "/api/v1/environment-values/OPENAI_API_KEY")).status, 404);
});

test("env values - names and values are validated: 400 param name / value", async (t) => {
  const { api } = t.context;
  for (const name of ["lower", "1ABC", "A-B", "A".repeat(129)]) {
    const res = await api.request("PUT", `/api/v1/environment-values/${name}`, { body: { value: "x" } });
    t.is(res.status, 400, name);
    t.is(res.body.error.param, "name", name);
  }
  t.is((await api.request("PUT", `/api/v1/environment-values/${"A".repeat(128)}`, { body: { value: "x" } })).status, 200);
  for (const body of [{ value: 5 }, { value: null }, {}, { value: "x".repeat(64 * 1024 + 1) }]) {
    const res = await api.request("PUT", "/api/v1/environment-values/OK_NAME", { body });
    t.is(res.status, 400, JSON.stringify(body).slice(0, 40));
    t.is(res.body.error.param, "value");
  }
  t.is((await api.request("PUT", "/api/v1/environment-values/OK_NAME", { body: { value: "x".repeat(64 * 1024) } })).status, 200);
  t.is((await api.request("PUT", "/api/v1/environment-values/OK_NAME", { body: { value: "x", extra: 1 } })).body.error.param, "extra");
});

test("env values - reveal needs env_vars:reveal (403 naming it); other workspaces see nothing", async (t) => {
  const { api, other } = t.context;
  await api.request("PUT", "/api/v1/environment-values/REVEAL_ME", { body: { value: "hidden" } });
  const created = await api.post("/api/v1/api-keys", { label: "env reader", scopes: ["env_vars:read"] });
  t.is(created.status, 201);
  const reader = api.withKey(created.body.key);
  t.is((await reader.get("/api/v1/environment-values/REVEAL_ME")).status, 200);
  const denied = await reader.get("/api/v1/environment-values/REVEAL_ME?reveal=true");
  t.is(denied.status, 403);
  t.is(denied.body.error.code, "permission_denied");
  t.regex(denied.body.error.message, /env_vars:reveal/);
  const write = await reader.request("PUT", "/api/v1/environment-values/REVEAL_ME", { body: { value: "x" } });
  t.is(write.status, 403);
  t.regex(write.body.error.message, /env_vars:write/);
  t.is((await other.get("/api/v1/environment-values/REVEAL_ME")).status, 404);
  t.false((await other.get("/api/v1/environment-values")).body.data.some((v: any) => v.name === "REVEAL_ME"));
});

test("env values - stored sealed, never in plaintext; resolveAll decrypts for the agent runner", async (t) => {
  // A workspace of its own: the undecryptable value below would fail a sibling test's turn
  // in the shared workspace (its environment is read when the turn starts).
  const { service } = t.context;
  const { api, id: wsId } = await newWorkspace(service, "business");
  const secret = `plaintext-canary-${randomBytes(8).toString("hex")}`;
  await api.request("PUT", "/api/v1/environment-values/CANARY", { body: { value: secret } });
  const doc = await (await t.context.servers.raw()).db.collection("env_values").findOne({ workspace_id: wsId, name: "CANARY" });
  t.truthy(doc);
  const stored = JSON.stringify(doc);
  t.false(stored.includes(secret));
  t.false(stored.includes(Buffer.from(secret).toString("base64")));
  const values = new EnvValues(service.store.db, MASTER_KEY, systemClock);
  const all = await values.resolveAll(wsId);
  t.is(all.CANARY, secret);
  t.deepEqual(await new EnvValues(service.store.db, MASTER_KEY, systemClock).resolveAll("ws_nobody"), {});
  // A sealed value moved under another name does not open.
  await (await t.context.servers.raw()).db.collection("env_values").insertOne({ ...doc!, _id: `${wsId}:MOVED` as any, name: "MOVED" });
  await t.throwsAsync(values.resolveAll(wsId), { name: "EnvValueDecryptError" });
  await (await t.context.servers.raw()).db.collection("env_values").deleteOne({ _id: `${wsId}:MOVED` as any });
});

// ---- files ---------------------------------------------------------------------------

test("files - upload text and binary: bytes and sha256 are right; GET; FileStore.read returns the bytes", async (t) => {
  const { api, other, wsId, service, nc } = t.context;
  const text = Buffer.from("hello, files\n");
  const first = await upload(api, newKey(), fileParts(text));
  t.is(first.status, 201, JSON.stringify(first.body));
  t.regex(first.body.id, /^file_/);
  t.deepEqual(
    { ...first.body, id: undefined, created_at: undefined },
    { id: undefined, object: "file", filename: "notes.txt", media_type: "text/plain", bytes: text.length, sha256: sha256(text), created_at: undefined },
  );
  t.is(typeof first.body.created_at, "number");
  const got = await api.get(`/api/v1/files/${first.body.id}`);
  t.deepEqual(got.body, first.body);

  const binary = randomBytes(700 * 1024 + 17); // several object store chunks
  const second = await upload(api, newKey(), [
    { name: "filename", value: "data.bin" },
    { name: "media_type", value: "application/x-custom" },
    { name: "file", filename: "ignored-name.dat", contentType: "application/octet-stream", data: binary },
  ]);
  t.is(second.status, 201, JSON.stringify(second.body));
  t.is(second.body.filename, "data.bin", "the filename field wins over the part's");
  t.is(second.body.media_type, "application/x-custom");
  t.is(second.body.bytes, binary.length);
  t.is(second.body.sha256, sha256(binary));

  const other404 = await other.get(`/api/v1/files/${second.body.id}`);
  t.is(other404.status, 404);
  t.is(other404.body.error.code, "not_found");

  const bucket = await new Objm(jetstream(nc)).open(FILES_BUCKET);
  // At rest the object is sealed with the workspace's key: no plaintext, the envelope's magic first.
  const stored = Buffer.from((await bucket.getBlob(second.body.id))!);
  t.is(stored.subarray(0, 3).toString(), "RBX");
  t.is(stored.indexOf(binary.subarray(1000, 1064)), -1, "no plaintext of the file in its object");
  const storedText = Buffer.from((await bucket.getBlob(first.body.id))!);
  t.false(storedText.includes(Buffer.from(text.slice(0, 24))), "no plaintext of the text file");
  // Read with the service's master key (the test config's): the bytes come back.
  const files = new FileStore(service.store.db, bucket, systemClock, Ids, new BlobKeyring(Buffer.alloc(32, 7).toString("base64")));
  const read = await files.read(wsId, second.body.id);
  t.truthy(read);
  t.is(read!.filename, "data.bin");
  t.is(read!.media_type, "application/x-custom");
  t.is(read!.bytes, binary.length);
  t.true(read!.data.equals(binary));
  t.is(await files.read("ws_other", second.body.id), null);
  // Without the key (another master key) the object does not open.
  const stranger = new FileStore(service.store.db, bucket, systemClock, Ids, new BlobKeyring(Buffer.alloc(32, 8).toString("base64")));
  await t.throwsAsync(stranger.read(wsId, second.body.id), { name: "BlobDecryptError" });
  // Object names carry the file id, never the filename.
  const doc = await (await t.context.servers.raw()).db.collection("files").findOne({ _id: second.body.id as any });
  t.is(doc?.object_name, second.body.id);
});

test("files - a multipart body without a boundary, or cut before its end, is 400 param file, never 500", async (t) => {
  const { api } = t.context;
  for (const [type, body] of [
    ["multipart/form-data", "{"],
    ["multipart/form-data; boundary=x", "--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nno end"],
    // Past RFC 2046's 70 characters (the parser failed with a 500 past 252; found by a probe).
    [`multipart/form-data; boundary=${"b".repeat(300)}`, `--${"b".repeat(300)}\r\n`],
    [`multipart/form-data; boundary="${"b".repeat(71)}"`, `--${"b".repeat(71)}\r\n`],
  ] as const) {
    const res = await fetch(`${api.baseUrl}/api/v1/files`, { method: "POST", headers: { authorization: `Bearer ${api.key}`, "content-type": type, "idempotency-key": newKey() }, body });
    const answer = (await res.json()) as { error: { param: string | null; code: string } };
    t.is(res.status, 400, `${type} ${JSON.stringify(body)}: ${JSON.stringify(answer)}`);
    t.is(answer.error.param, "file");
  }
  // A boundary of 70 characters is fine.
  const boundary = "b".repeat(70);
  const body = `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\nContent-Type: text/plain\r\n\r\nhello\r\n--${boundary}--\r\n`;
  const ok = await fetch(`${api.baseUrl}/api/v1/files`, { method: "POST", headers: { authorization: `Bearer ${api.key}`, "content-type": `multipart/form-data; boundary=${boundary}`, "idempotency-key": newKey() }, body });
  t.is(ok.status, 201, await ok.clone().text());
  t.is(((await ok.json()) as { bytes: number }).bytes, 5);
});

test("files - a field given twice, or two file parts, is 400 saying so (not a last one winning, not 'interrupted')", async (t) => {
  const { api } = t.context;
  const twice = await upload(api, newKey(), [{ name: "media_type", value: "text/plain" }, { name: "media_type", value: "image/png" }, ...fileParts(Buffer.from("x"))]);
  t.is(twice.status, 400, JSON.stringify(twice.body));
  t.is(twice.body.error.param, "media_type");
  t.regex(twice.body.error.message, /given twice/);
  const twoFiles = await upload(api, newKey(), [...fileParts(Buffer.from("one"), "one.txt"), ...fileParts(Buffer.from("two"), "two.txt")]);
  t.is(twoFiles.status, 400, JSON.stringify(twoFiles.body));
  t.is(twoFiles.body.error.param, "file");
  t.regex(twoFiles.body.error.message, /one file part/);
});

test("files - a file over the 16 MiB JSON body limit streams through", async (t) => {
  const { api } = t.context;
  const big = randomBytes(20 * 1024 * 1024);
  const res = await upload(api, newKey(), fileParts(big, "big.bin", "application/octet-stream"));
  t.is(res.status, 201, JSON.stringify(res.body));
  t.is(res.body.bytes, big.length);
  t.is(res.body.sha256, sha256(big));
});

test("files - missing Idempotency-Key, no file part, not multipart, fields after the file are 400", async (t) => {
  const { api } = t.context;
  const noKey = await upload(api, undefined, fileParts(Buffer.from("x")));
  t.is(noKey.status, 400);
  t.is(noKey.body.error.param, "Idempotency-Key");
  const noFile = await upload(api, newKey(), [{ name: "filename", value: "a.txt" }]);
  t.is(noFile.status, 400);
  t.is(noFile.body.error.param, "file");
  t.is(noFile.body.error.code, "invalid_request");
  const json = await api.post("/api/v1/files", { file: "x" });
  t.is(json.status, 400);
  t.is(json.body.error.param, "file");
  const lateKey = newKey();
  const late = await upload(api, lateKey, [...fileParts(Buffer.from("x")), { name: "media_type", value: "text/csv" }]);
  t.is(late.status, 400);
  t.is(late.body.error.param, "media_type");
  // Refused after its file part began: the key is free for the corrected form (found by a probe: 409).
  const corrected = await upload(api, lateKey, [{ name: "media_type", value: "text/csv" }, ...fileParts(Buffer.from("x"), "notes.csv")]);
  t.is(corrected.status, 201, JSON.stringify(corrected.body));
  t.like(corrected.body, { filename: "notes.csv", media_type: "text/csv" });
  const unknown = await upload(api, newKey(), [{ name: "purpose", value: "x" }, ...fileParts(Buffer.from("x"))]);
  t.is(unknown.body.error.param, "purpose");
  const badType = await upload(api, newKey(), [{ name: "media_type", value: "not a type" }, ...fileParts(Buffer.from("x"))]);
  t.is(badType.body.error.param, "media_type");
  // A control character in a quoted parameter, or in the name (C1 too): found by a probe.
  const quoted = await upload(api, newKey(), [{ name: "media_type", value: 'text/plain; a="\x01X-Evil: 1"' }, ...fileParts(Buffer.from("x"))]);
  t.is(quoted.body.error?.param, "media_type", JSON.stringify(quoted.body));
  const c1 = await upload(api, newKey(), [{ name: "filename", value: "a\u009bb.txt" }, ...fileParts(Buffer.from("x"))]);
  t.is(c1.body.error?.param, "filename", JSON.stringify(c1.body));
  const noName = await upload(api, newKey(), [{ name: "file", data: Buffer.from("x") }]);
  t.is(noName.status, 400);
  t.is(noName.body.error.param, "filename");
});

test("files - a repeat after a finished upload returns the file unchanged; another file under the key is 409 conflict", async (t) => {
  const { api } = t.context;
  const key = newKey();
  const first = await upload(api, key, fileParts(Buffer.from("version one")));
  t.is(first.status, 201);
  const repeat = await upload(api, key, fileParts(Buffer.from("version one")));
  t.is(repeat.status, 201);
  t.deepEqual(repeat.body, first.body);
  // Same name and type, other content: a different file (the content is part of the fingerprint).
  const otherContent = await upload(api, key, fileParts(Buffer.from("version two, not stored")));
  t.is(otherContent.status, 409);
  t.is(otherContent.body.error.param, "Idempotency-Key");
  const sameLength = await upload(api, key, fileParts(Buffer.from("version 1ne")));
  t.is(sameLength.status, 409);
  t.deepEqual((await upload(api, key, fileParts(Buffer.from("version one")))).body, first.body, "the key still answers with its file");
  const different = await upload(api, key, fileParts(Buffer.from("version one"), "other.txt"));
  t.is(different.status, 409);
  t.is(different.body.error.code, "conflict");
  t.is(different.body.error.type, "conflict_error");
  const otherType = await upload(api, key, fileParts(Buffer.from("version one"), "notes.txt", "text/csv"));
  t.is(otherType.status, 409);
});

test("files - an upload interrupted by a client abort is restarted by a repeat with the same key", async (t) => {
  const { api } = t.context;
  const key = newKey();
  const first = rawUpload(api, key, "restart.bin");
  first.write(randomBytes(300 * 1024));
  await sleep(300);
  first.abort();
  // The server notices the abort at once: the record turns failed, without waiting out
  // the 30 s silence window.
  const uploads = (await t.context.servers.raw()).db.collection("file_uploads");
  const record = await waitFor(() => uploads.findOne({ _id: uploadIdOf(t.context.wsId, key) as any }), (r) => r?.state === "failed", 3_000);
  t.is(record?.state, "failed");
  const data = randomBytes(200 * 1024);
  const repeat = await upload(api, key, fileParts(data, "restart.bin", "application/octet-stream"));
  t.is(repeat.status, 201, JSON.stringify(repeat.body));
  t.is(repeat.body.sha256, sha256(data));
  t.is(repeat.body.bytes, data.length);
});

test("files - a repeat while the first upload still sends is 503 upload_in_progress with Retry-After", async (t) => {
  const { api } = t.context;
  const key = newKey();
  const first = rawUpload(api, key, "slow.bin");
  const head = randomBytes(64 * 1024);
  first.write(head);
  const stop = trickle(first, 200);
  // Should an assertion below fail, the trickling upload must not keep the file's process alive (a CI run waited out its timeout).
  t.teardown(() => {
    stop();
    first.abort();
  });
  await waitUploading(t.context.servers, t.context.wsId, key);
  const repeat = await upload(api, key, fileParts(Buffer.from("same key"), "slow.bin", "application/octet-stream"));
  t.is(repeat.status, 503);
  t.is(repeat.body.error.code, "upload_in_progress");
  t.is(repeat.body.error.retryable, true);
  t.regex(repeat.headers.get("retry-after") ?? "", /^[1-9][0-9]*$/);
  // Answered before its body is read, a repeat whose body is still arriving gets its answer
  // (a probe reported fetch failing with EPIPE here; not reproduced in this form).
  for (let i = 0; i < 3; i++) {
    // Its body still arriving when the answer goes out (64 KiB, then a pause the answer
    // comes in, then the rest in 64 KiB every 20 ms).
    const body = multipart(fileParts(randomBytes(1024 * 1024), "slow.bin", "application/octet-stream"));
    let at = 0;
    const slowBody = new ReadableStream<Uint8Array>({
      async pull(controller) {
        await sleep(at === 64 * 1024 ? 500 : 20);
        if (at >= body.length) return controller.close();
        controller.enqueue(new Uint8Array(body.subarray(at, (at += 64 * 1024))));
      },
    });
    const large = await fetch(`${api.baseUrl}/api/v1/files`, {
      method: "POST",
      headers: { authorization: `Bearer ${api.key}`, "idempotency-key": key, "content-type": `multipart/form-data; boundary=${BOUNDARY}` },
      body: slowBody,
      duplex: "half",
      signal: AbortSignal.timeout(30_000),
    } as RequestInit)
      .then(async (res) => ({ status: res.status, body: await res.json() }))
      .catch((err: Error) => ({ status: 0, body: String(err.cause ?? err) }));
    t.is(large.status, 503, JSON.stringify(large.body));
  }
  stop();
  first.finish();
  const done = await first.response;
  t.true("status" in done && done.status === 201, JSON.stringify(done));
  // The key now belongs to the finished file: other content under it is 409 conflict.
  const again = await upload(api, key, fileParts(Buffer.from("anything"), "slow.bin", "application/octet-stream"));
  t.is(again.status, 409);
  t.is(again.body.error.param, "Idempotency-Key");
});

test("files - after the silence window a repeat takes a stalled upload over", async (t) => {
  const { tightApi } = t.context;
  const key = newKey();
  const first = rawUpload(tightApi, key, "stalled.bin");
  first.write(randomBytes(10 * 1024));
  await waitUploading(t.context.servers, t.context.tightWsId, key);
  const early = await upload(tightApi, key, fileParts(Buffer.from("x"), "stalled.bin", "application/octet-stream"));
  t.is(early.status, 503, "still within the 1.5 s window");
  t.is(early.body.error.code, "upload_in_progress");
  await sleep(1800);
  const data = randomBytes(1000);
  const takeover = await upload(tightApi, key, fileParts(data, "stalled.bin", "application/octet-stream"));
  t.is(takeover.status, 201, JSON.stringify(takeover.body));
  t.is(takeover.body.sha256, sha256(data));
  // The stalled request is stopped once it sees it lost the key.
  const stalled = await first.response;
  t.true("status" in stalled && stalled.status === 409, JSON.stringify(stalled));
  first.abort();
  const again = await upload(tightApi, key, fileParts(data, "stalled.bin", "application/octet-stream"));
  t.is(again.body.id, takeover.body.id);
});

test("files - an upload past the time limit is 408 request_timeout; its key then answers 409 conflict", async (t) => {
  const { tightApi } = t.context;
  const key = newKey();
  const first = rawUpload(tightApi, key, "long.bin");
  first.write(Buffer.from("start"));
  const stop = trickle(first, 250); // never silent, so never taken over: only the time limit stops it
  const started = Date.now();
  const res = await first.response;
  stop();
  first.abort();
  t.true("status" in res, JSON.stringify(res));
  if (!("status" in res)) return;
  t.is(res.status, 408);
  t.is(res.body.error.code, "request_timeout");
  t.is(res.body.error.type, "request_timeout_error");
  // Its key is spent: a retry under it would be 409 (found by a probe: it said retryable).
  t.is(res.body.error.retryable, false);
  t.regex(res.body.error.message, /new Idempotency-Key/);
  t.true(Date.now() - started >= 3_500);
  const repeat = await upload(tightApi, key, fileParts(Buffer.from("x"), "long.bin", "application/octet-stream"));
  t.is(repeat.status, 409);
  t.is(repeat.body.error.code, "conflict");
});

test("files - a file over the size limit is 413 payload_too_large; the limit itself is fine", async (t) => {
  const { tightApi } = t.context;
  const overKey = newKey();
  const over = await upload(tightApi, overKey, fileParts(randomBytes(1024 * 1024 + 1), "big.bin", "application/octet-stream"));
  t.is(over.status, 413);
  t.is(over.body.error.code, "payload_too_large");
  t.is(over.body.error.type, "payload_too_large_error");
  // Its key is free for a smaller file under another name.
  const smaller = await upload(tightApi, overKey, fileParts(randomBytes(1024), "small.bin", "application/octet-stream"));
  t.is(smaller.status, 201, JSON.stringify(smaller.body));
  const exact = randomBytes(1024 * 1024);
  const ok = await upload(tightApi, newKey(), fileParts(exact, "exact.bin", "application/octet-stream"));
  t.is(ok.status, 201, JSON.stringify(ok.body));
  t.is(ok.body.bytes, exact.length);
});

// ---- upload concurrency --------------------------------------------------------------

test("files - concurrent uploads per workspace are capped: the next one is 429 until the running one ends", async (t) => {
  const capped = await startWith(t.context.servers, { ...RATE_ENV, RUNS_UPLOADS_BUSINESS: "1" });
  try {
    const ws = await newWorkspace(capped, "business");
    const first = rawUpload(ws.api, newKey());
    const stop = trickle(first, 200);
    t.teardown(() => {
      stop();
      first.abort();
    });
    await waitUploading(t.context.servers, ws.id, (first.req.getHeader("idempotency-key") as string) ?? "");
    const second = await upload(ws.api, newKey(), fileParts(Buffer.from("second")));
    t.is(second.status, 429);
    t.is(second.body.error.code, "rate_limited");
    t.truthy(second.headers.get("retry-after"));
    // A repeat of the running upload's key is refused by its claim (503) and takes no
    // slot: it cannot free the running upload's slot for another key either.
    const repeat = await upload(ws.api, (first.req.getHeader("idempotency-key") as string) ?? "", fileParts(Buffer.from("repeat")));
    t.is(repeat.status, 503, JSON.stringify(repeat.body));
    t.is(repeat.body.error.code, "upload_in_progress");
    t.is((await upload(ws.api, newKey(), fileParts(Buffer.from("still capped")))).status, 429);
    stop();
    first.finish();
    const done = await first.response;
    t.is("status" in done ? done.status : 0, 201);
    const third = await upload(ws.api, newKey(), fileParts(Buffer.from("third")));
    t.is(third.status, 201);
  } finally {
    await capped.close();
  }
});

test("files - an upload silent past its hold whose slot another upload took stops when its bytes come again (429), so the cap holds; its key then starts again (found by a probe: both ran)", async (t) => {
  const capped = await startWith(t.context.servers, { ...RATE_ENV, RUNS_UPLOADS_BUSINESS: "1", RUNS_UPLOAD_TAKEOVER_MS: "1500", RUNS_UPLOAD_TIME_LIMIT_MS: "30000" });
  try {
    const ws = await newWorkspace(capped, "business");
    const key = newKey();
    const first = rawUpload(ws.api, key);
    first.write(randomBytes(10 * 1024));
    await waitUploading(t.context.servers, ws.id, key);
    await sleep(2_000);
    // Its hold ran out: another upload takes the workspace's one slot.
    const second = await upload(ws.api, newKey(), fileParts(Buffer.from("second")));
    t.is(second.status, 201, JSON.stringify(second.body));
    // The first goes on sending: it finds its slot was taken and stops.
    const stopFirst = trickle(first, 100);
    const stalled = await first.response;
    stopFirst();
    t.true("status" in stalled && stalled.status === 429, JSON.stringify(stalled));
    t.like("body" in stalled ? stalled.body : {}, { error: { code: "rate_limited" } });
    first.abort();
    // The stopped upload's key is free: a repeat starts again.
    const again = await upload(ws.api, key, fileParts(Buffer.from("again"), "slow.bin", "application/octet-stream"));
    t.is(again.status, 201, JSON.stringify(again.body));
  } finally {
    await capped.close();
  }
});

test("files - upload slots: a refresh whose stored answer was lost goes on from the stored revision; a hold another upload took is lost (found by a review: a lost answer would have stopped a healthy upload)", async (t) => {
  const kv = await new Kvm(t.context.nc).create(`test_slots_${Date.now()}`, { history: 1 });
  const slots = new UploadSlots(kv, systemClock, 60_000);
  const held = await slots.take("ws_slots", 1, "file_a");
  t.truthy(held);
  t.true(await held!.refresh());
  // A refresh stored whose answer never came back: the key is a revision ahead of the holder's.
  await kv.put("uploads.ws_slots.0", JSON.stringify({ holder: "file_a", until: Date.now() + 60_000 }));
  t.true(await held!.refresh(), "still this upload's hold");
  t.true(await held!.refresh(), "and on from there");
  // Taken by another upload (its hold ran out meanwhile): lost.
  await kv.put("uploads.ws_slots.0", JSON.stringify({ holder: "file_b", until: Date.now() + 60_000 }));
  t.false(await held!.refresh());
  await held!.release();
  t.is((await kv.get("uploads.ws_slots.0"))?.json<{ holder: string }>().holder, "file_b", "the release leaves the new holder's hold");
});

test("files - the upload cap holds across nodes: 8 uploads started at once through two nodes of a workspace capped at 2, exactly 2 run, the rest 429; finished ones free their slots", async (t) => {
  t.timeout(90_000);
  const env = { ...RATE_ENV, RUNS_UPLOADS_BUSINESS: "2" };
  const [nodeA, nodeB] = await Promise.all([startWith(t.context.servers, env), startWith(t.context.servers, env)]);
  try {
    const ws = await newWorkspace(nodeA!, "business");
    const apis = [ws.api, new Api(nodeB!.url!, ws.key)];
    const uploads = Array.from({ length: 8 }, (_, i) => rawUpload(apis[i % 2]!, newKey(), `race-${i}.bin`));
    const stops = uploads.map((u) => trickle(u, 100));
    // The refused answer at once; the admitted ones keep sending.
    const refused: number[] = [];
    for (const [i, u] of uploads.entries()) void u.response.then((r) => "status" in r && r.status === 429 && refused.push(i));
    await waitFor(async () => refused.length, (n) => n >= 6, 20_000);
    await sleep(500);
    t.is(refused.length, 6, `refused: ${refused.length} of 8`);
    const records = (await t.context.servers.raw()).db.collection<{ workspace_id: string; state: string }>("file_uploads");
    t.is(await records.countDocuments({ workspace_id: ws.id, state: "uploading" }), 2);
    const running = uploads.filter((_, i) => !refused.includes(i));
    for (const stop of stops) stop();
    for (const u of running) u.finish();
    for (const u of running) {
      const done = await u.response;
      t.is("status" in done ? done.status : 0, 201, JSON.stringify(done));
    }
    for (const u of uploads) if (!u.req.destroyed) u.abort();
    // Both slots are free again, on either node.
    for (const api of apis) t.is((await upload(api, newKey(), fileParts(Buffer.from("after")))).status, 201);
  } finally {
    await Promise.all([nodeA?.close(), nodeB?.close()]);
  }
});

test("files - an uploaded text file given by file_id reaches the agent as text", async (t) => {
  const { api } = t.context;
  const content = "the quarterly numbers are up 7 percent";
  const uploaded = await upload(api, newKey(), fileParts(Buffer.from(content), "report.txt", "text/plain"));
  t.is(uploaded.status, 201);
  const agent = await api.agentWith({ model: "faux/scripted" });
  const startedAt = Date.now();
  const run = await api.post("/api/v1/runs", {
    agent,
    input: [
      { type: "input_text", text: "summarise" },
      { type: "input_file", file_id: uploaded.body.id },
    ],
  });
  t.is(run.status, 200, `${Date.now() - startedAt} ms ${JSON.stringify(run.body)}`);
  t.is(run.body.turn.status, "completed");
  t.deepEqual(run.body.turn.input[1], { type: "input_file", file_id: uploaded.body.id }, "the stored input keeps the id");
  // The scripted model echoes the text the agent was given: the file's content is in it.
  const echoed = run.body.turn.output.map((p: any) => p.text).join("");
  t.true(echoed.includes(content), echoed);
  t.true(echoed.includes("report.txt"));
});

test("files - an unknown or another workspace's file_id is 400 param input", async (t) => {
  const { api, other } = t.context;
  const agent = await api.agentWith({ model: "faux/scripted" });
  const unknown = await api.post("/api/v1/runs", { agent, input: [{ type: "input_file", file_id: "file_doesnotexist" }] });
  t.is(unknown.status, 400);
  t.is(unknown.body.error.param, "input");
  const theirs = await upload(other, newKey(), fileParts(Buffer.from("private")));
  const foreign = await api.post("/api/v1/runs", { agent, input: [{ type: "input_file", file_id: theirs.body.id }] });
  t.is(foreign.status, 400);
});
