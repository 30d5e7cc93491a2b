import anyTest, { type TestFn } from "ava";
import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import pino from "pino";
import { Webhook } from "standardwebhooks";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { Ids, systemClock, WebhookStore } from "../../src/index.js";
import { WebhookDeliverer } from "../../actors/index.js";

/**
 * Completion webhooks (issue 16) on a real service and store, received by a local server
 * and verified with an independent Standard Webhooks library (standardwebhooks on npm).
 */
interface Received {
  headers: IncomingHttpHeaders;
  body: string;
  answered: number;
}

/** A receiver on 127.0.0.1 that answers `status()` and keeps every request. */
class Receiver {
  readonly requests: Received[] = [];
  status: () => number = () => 200;
  private server!: Server;
  url = "";

  async start(): Promise<this> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const answered = this.status();
        this.requests.push({ headers: req.headers, body: Buffer.concat(chunks).toString("utf8"), answered });
        res.writeHead(answered).end();
      });
    });
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/hook`;
    return this;
  }

  /** Requests answered 2xx, as [type, parsed body]. */
  accepted(): Array<{ id: string; type: string; data: any }> {
    return this.requests.filter((r) => r.answered < 300).map((r) => ({ id: String(r.headers["webhook-id"]), ...JSON.parse(r.body) }));
  }

  async until(predicate: () => boolean, timeoutMs = 20_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!predicate()) {
      if (Date.now() > deadline) throw new Error(`receiver: not within ${timeoutMs} ms; got ${this.requests.map((r) => `${JSON.parse(r.body).type}:${r.answered}`).join(", ")}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  close(): void {
    this.server?.close();
  }
}

const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; strict: RunningService }>;

test.before(async (t) => {
  const servers = await startTestServers();
  // The allowance lets deliveries reach the receiver on 127.0.0.1 (tests, private networks).
  const service = await startTestService(servers, { RUNS_WEBHOOK_ALLOW_PRIVATE: "1", RUNS_WEBHOOK_RETRY_SCALE: "0.01" });
  const strict = await startTestService(servers, { RUNS_ROLES: "gateway" });
  t.context = { servers, service, strict };
});

test.after.always(async (t) => {
  await t.context.strict?.close();
  await t.context.service?.close();
  await t.context.servers?.stop();
});

async function receiver(t: { teardown: (fn: () => void) => void }): Promise<Receiver> {
  const r = await new Receiver().start();
  t.teardown(() => r.close());
  return r;
}

/** The master key test services run with (test/helpers/servers.ts). */
const TEST_MASTER_KEY = Buffer.alloc(32, 7).toString("base64");

const echo = { model: "faux/scripted", tools: [] };

test("webhooks - a turn's end is delivered once, signed as Standard Webhooks verifiers expect, with the final Run; the delivery log shows it", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const r = await receiver(t);
  const created = await ws.api.post("/api/v1/webhooks", { url: r.url, event_types: ["turn.completed"], description: "ci" });
  t.is(created.status, 201, JSON.stringify(created.body));
  t.regex(created.body.secret, /^whsec_[A-Za-z0-9+/]{43}=$/);
  t.like(created.body, { object: "webhook", url: r.url, event_types: ["turn.completed"], agent_id: null, enabled: true, disabled_reason: null });
  const agent = await ws.api.agentWith(echo);
  const run = await ws.api.post("/api/v1/runs", { agent, input: "notify me" });
  t.is(run.body.turn.status, "completed");
  await r.until(() => r.requests.length >= 1);
  const [request] = r.requests;
  const verified = new Webhook(created.body.secret).verify(request!.body, request!.headers as Record<string, string>) as { type: string; timestamp: string; data: { run: any } };
  t.is(verified.type, "turn.completed");
  t.is(verified.data.run.id, run.body.id);
  t.is(verified.data.run.state, "idle");
  t.deepEqual(verified.data.run.turn.output, [{ type: "output_text", text: "notify me" }]);
  t.is(request!.headers["content-type"], "application/json");
  t.regex(String(request!.headers["webhook-id"]), /^msg_/);
  // A wrong secret does not verify.
  t.throws(() => new Webhook(`whsec_${Buffer.alloc(32, 1).toString("base64")}`).verify(request!.body, request!.headers as Record<string, string>));

  // The attempt is recorded once the receiver has answered.
  let deliveries = await ws.api.get(`/api/v1/webhooks/${created.body.id}/deliveries`);
  for (let i = 0; i < 100 && deliveries.body.data[0]?.status === "pending"; i++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    deliveries = await ws.api.get(`/api/v1/webhooks/${created.body.id}/deliveries`);
  }
  t.is(deliveries.status, 200);
  t.is(deliveries.body.data.length, 1);
  const [delivery] = deliveries.body.data;
  t.like(delivery, { object: "webhook.delivery", event_type: "turn.completed", run_id: run.body.id, status: "delivered", attempts: 1, next_attempt_at: null, message_id: request!.headers["webhook-id"] });
  t.is(delivery.last_attempt.status_code, 200);
  const one = await ws.api.get(`/api/v1/webhooks/${created.body.id}/deliveries/${delivery.id}`);
  t.is(one.body.attempt_log.length, 1);
  t.true(one.body.attempt_log[0].latency_ms >= 0);
  await new Promise((resolve) => setTimeout(resolve, 500));
  t.is(r.requests.length, 1, "delivered once");
  // The webhook as listed carries no secret.
  const listed = await ws.api.get("/api/v1/webhooks");
  t.deepEqual(listed.body.data.map((w: any) => [w.id, w.secret]), [[created.body.id, undefined]]);
});

test("webhooks - turn.action_required carries the waiting Run and its pending action, once per action; approving through the delivered ids completes the turn", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const r = await receiver(t);
  const created = await ws.api.post("/api/v1/webhooks", { url: r.url, event_types: ["turn.action_required", "turn.completed"] });
  t.is(created.status, 201, JSON.stringify(created.body));
  const agent = await ws.api.agentWith({
    model: "faux/scripted",
    tools: ["bash"],
    approval: { rules: [{ tool: "bash" }] },
    script: [{ tool_call: { name: "bash", arguments: { command: "echo approved" } } }, { text: "done" }],
  });
  const run = await ws.api.post("/api/v1/runs", { agent, input: "ask first", background: true });
  t.is(run.status, 202);
  await r.until(() => r.accepted().length >= 1);
  const [asked] = r.accepted();
  t.is(asked!.type, "turn.action_required");
  const verified = new Webhook(created.body.secret).verify(r.requests[0]!.body, r.requests[0]!.headers as Record<string, string>) as { data: any };
  t.is(verified.data.run.id, run.body.id);
  t.is(verified.data.run.state, "busy");
  t.is(verified.data.run.turn.status, "in_progress");
  t.deepEqual(verified.data.run.turn.pending_action.arguments, { command: "echo approved" });
  t.like(verified.data.action, { object: "action", run_id: run.body.id, turn_id: run.body.turn.id, tool: "bash", decision: null });
  t.is(verified.data.action.id, verified.data.run.turn.pending_action.id);
  // A receiver acts on what it was sent.
  const decided = await ws.api.post(`/api/v1/runs/${verified.data.action.run_id}/actions/${verified.data.action.id}`, { decision: "approve" });
  t.is(decided.status, 200);
  await r.until(() => r.accepted().length >= 2);
  await new Promise((resolve) => setTimeout(resolve, 300));
  t.deepEqual(r.accepted().map((m) => m.type), ["turn.action_required", "turn.completed"]);
  t.deepEqual(r.accepted()[1]!.data.run.turn.output, [{ type: "output_text", text: "done" }]);
});

test("webhooks - event types, the agent filter and the wildcard choose what is sent: failed turns, deleted runs", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const all = await receiver(t);
  const failures = await receiver(t);
  const agent = await ws.api.agentWith(echo, "watched");
  const failing = await ws.api.agentWith({ model: "faux/scripted", tools: [], script: [{ error: { message: "the provider broke", status: 400 } }] }, "failing");
  const a = await ws.api.post("/api/v1/webhooks", { url: all.url, event_types: ["*"], agent_id: agent });
  const b = await ws.api.post("/api/v1/webhooks", { url: failures.url, event_types: ["turn.failed", "run.deleted"] });
  t.is(a.status, 201);
  t.is(b.status, 201);
  const ok = await ws.api.post("/api/v1/runs", { agent, input: "fine" });
  const bad = await ws.api.post("/api/v1/runs", { agent: failing, input: "boom" });
  t.is(bad.body.turn.status, "failed");
  t.is((await ws.api.request("DELETE", `/api/v1/runs/${ok.body.id}`, { idempotencyKey: "del-ok" })).status, 200);
  await all.until(() => all.accepted().length >= 2);
  await failures.until(() => failures.accepted().length >= 2);
  await new Promise((resolve) => setTimeout(resolve, 300));
  t.deepEqual(all.accepted().map((m) => [m.type, m.data.run?.id ?? m.data.run_id]), [["turn.completed", ok.body.id], ["run.deleted", ok.body.id]]);
  t.deepEqual(failures.accepted().map((m) => m.type).sort(), ["run.deleted", "turn.failed"]);
  const failed = failures.accepted().find((m) => m.type === "turn.failed")!;
  t.is(failed.data.run.turn.error.code, "provider_failure");
  t.like(failures.accepted().find((m) => m.type === "run.deleted")!.data, { run_id: ok.body.id, agent_id: agent, reason: "deleted" });
});

test("webhooks - a receiver that is down for a while gets every delivery afterwards, in order per run, each once", async (t) => {
  t.timeout(60_000);
  const ws = await newWorkspace(t.context.service);
  const r = await receiver(t);
  let up = false;
  r.status = () => (up ? 204 : 503);
  await ws.api.post("/api/v1/webhooks", { url: r.url, event_types: ["turn.completed"] });
  const agent = await ws.api.agentWith(echo);
  const first = await ws.api.post("/api/v1/runs", { agent, input: "t1" });
  const turns = [first.body.turn.id];
  for (const input of ["t2", "t3", "t4"]) turns.push((await ws.api.post("/api/v1/runs", { run_id: first.body.id, input })).body.turn.id);
  await r.until(() => r.requests.filter((q) => q.answered === 503).length >= 3);
  up = true;
  await r.until(() => r.accepted().length >= 4);
  await new Promise((resolve) => setTimeout(resolve, 500));
  const accepted = r.accepted();
  t.deepEqual(accepted.map((m) => m.data.run.turn.id), turns, "in turn order");
  t.is(new Set(accepted.map((m) => m.id)).size, 4, "each message once");
  // Retries of one message keep its webhook-id.
  const firstId = accepted[0]!.id;
  t.true(r.requests.filter((q) => q.headers["webhook-id"] === firstId).length >= 2);
});

test("webhooks - 410 Gone disables the endpoint; a disabled endpoint gets nothing; enabled again, what was pending goes out", async (t) => {
  t.timeout(60_000);
  const ws = await newWorkspace(t.context.service);
  const r = await receiver(t);
  r.status = () => 410;
  const hook = (await ws.api.post("/api/v1/webhooks", { url: r.url, event_types: ["turn.completed"] })).body;
  const agent = await ws.api.agentWith(echo);
  await ws.api.post("/api/v1/runs", { agent, input: "gone" });
  await r.until(() => r.requests.length >= 1);
  let disabled: any;
  for (let i = 0; i < 100 && !(disabled = (await ws.api.get(`/api/v1/webhooks/${hook.id}`)).body).disabled_reason; i++) await new Promise((resolve) => setTimeout(resolve, 50));
  t.like(disabled, { enabled: false, disabled_reason: "The endpoint answered 410 Gone." });
  const log = (await ws.api.get(`/api/v1/webhooks/${hook.id}/deliveries`)).body.data;
  t.like(log[0], { status: "failed", attempts: 1 });
  t.is(log[0].last_attempt.status_code, 410);

  // Disabled: events are not recorded for it, nothing is sent.
  await ws.api.post("/api/v1/runs", { agent, input: "while disabled" });
  await new Promise((resolve) => setTimeout(resolve, 700));
  t.is(r.requests.length, 1);
  t.is((await ws.api.get(`/api/v1/webhooks/${hook.id}/deliveries`)).body.data.length, 1);

  // Enabled: a delivery still being retried when the endpoint is disabled again waits,
  // and goes out once it is enabled.
  r.status = () => 503;
  const enabled = await ws.api.request("PATCH", `/api/v1/webhooks/${hook.id}`, { body: { enabled: true } });
  t.like(enabled.body, { enabled: true, disabled_reason: null });
  await new Promise((resolve) => setTimeout(resolve, 2_100)); // another node learns of it within 2 s
  await ws.api.post("/api/v1/runs", { agent, input: "retried" });
  await r.until(() => r.requests.length >= 2);
  t.is((await ws.api.request("PATCH", `/api/v1/webhooks/${hook.id}`, { body: { enabled: false } })).body.enabled, false);
  r.status = () => 200;
  await new Promise((resolve) => setTimeout(resolve, 1_500));
  t.is(r.accepted().length, 0, "nothing goes to a disabled endpoint");
  await ws.api.request("PATCH", `/api/v1/webhooks/${hook.id}`, { body: { enabled: true } });
  await r.until(() => r.accepted().length >= 1);
  t.deepEqual(r.accepted().map((m) => m.data.run.turn.input[0].text), ["retried"]);
});

test("webhooks - rotation signs with both secrets for a day; a test delivery and a redelivery keep their message id", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const r = await receiver(t);
  const hook = (await ws.api.post("/api/v1/webhooks", { url: r.url, event_types: ["turn.completed"] })).body;
  const rotated = await ws.api.post(`/api/v1/webhooks/${hook.id}/rotate-secret`, {});
  t.is(rotated.status, 200);
  t.not(rotated.body.secret, hook.secret);
  const sent = await ws.api.post(`/api/v1/webhooks/${hook.id}/test`, {});
  t.is(sent.status, 202);
  t.like(sent.body, { event_type: "webhook.test", status: "pending", run_id: null });
  await r.until(() => r.requests.length >= 1);
  const request = r.requests[0]!;
  t.is(String(request.headers["webhook-signature"]).split(" ").length, 2, "two v1 signatures");
  for (const secret of [hook.secret, rotated.body.secret]) t.is((new Webhook(secret).verify(request.body, request.headers as Record<string, string>) as { type: string }).type, "webhook.test");

  const again = await ws.api.post(`/api/v1/webhooks/${hook.id}/deliveries/${sent.body.id}/redeliver`, {});
  t.is(again.status, 202);
  t.not(again.body.id, sent.body.id);
  t.is(again.body.message_id, sent.body.message_id);
  await r.until(() => r.requests.length >= 2);
  t.is(r.requests[1]!.headers["webhook-id"], request.headers["webhook-id"]);
});

test("webhooks - rotations keep at most the 4 newest rotated-out secrets signing beside the current one: 400 rotations had made the signature header overflow a receiver's limit (431 on every attempt; probe)", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const r = await receiver(t);
  const hook = (await ws.api.post("/api/v1/webhooks", { url: r.url, event_types: ["turn.completed"] })).body;
  const secrets: string[] = [hook.secret];
  for (let i = 0; i < 12; i++) {
    const rotated = await ws.api.post(`/api/v1/webhooks/${hook.id}/rotate-secret`, {});
    t.is(rotated.status, 200);
    secrets.push(rotated.body.secret);
  }
  t.is((await ws.api.post(`/api/v1/webhooks/${hook.id}/test`, {})).status, 202);
  await r.until(() => r.requests.length >= 1);
  const request = r.requests[0]!;
  t.is(String(request.headers["webhook-signature"]).split(" ").length, 5, "the current secret and 4 rotated out");
  const verifies = secrets.map((secret) => {
    try {
      new Webhook(secret).verify(request.body, request.headers as Record<string, string>);
      return true;
    } catch {
      return false;
    }
  });
  t.deepEqual(verifies, [...Array(8).fill(false), ...Array(5).fill(true)], "the newest five sign");
  const raw = await t.context.servers.raw();
  const stored = (await raw.db.collection("webhooks").findOne({ _id: hook.id as never })) as { secrets: Array<{ sealed: string; created_at: number; expires_at: number | null }> } | null;
  t.is(stored?.secrets.length, 5, "the document keeps no more");
  // An endpoint rotated often before the cap (its document holds more) signs with the newest five too.
  const older = Array.from({ length: 10 }, (_, i) => ({ ...stored!.secrets[1]!, created_at: stored!.secrets[4]!.created_at - 1_000 * (i + 1) }));
  await raw.db.collection("webhooks").updateOne({ _id: hook.id as never }, { $set: { secrets: [...stored!.secrets, ...older] } });
  await new Promise((resolve) => setTimeout(resolve, 2_500)); // the deliverer's endpoints are read again
  t.is((await ws.api.post(`/api/v1/webhooks/${hook.id}/test`, {})).status, 202);
  await r.until(() => r.requests.length >= 2);
  t.is(String(r.requests[1]!.headers["webhook-signature"]).split(" ").length, 5);
});

test("webhooks - one tenant's receiver that never answers, with hundreds of due deliveries, does not hold back another tenant's: those are left out of the look while its attempts are at their limit (a probe measured 0.3 s → 148 s)", async (t) => {
  t.timeout(90_000);
  const slow = await newWorkspace(t.context.service);
  const hanging = createServer(() => undefined);
  const sockets = new Set<import("node:net").Socket>();
  hanging.on("connection", (socket) => (sockets.add(socket), socket.on("close", () => sockets.delete(socket))));
  await new Promise<void>((resolve) => hanging.listen(0, "127.0.0.1", resolve));
  const slowHook = (await slow.api.post("/api/v1/webhooks", { url: `http://127.0.0.1:${(hanging.address() as AddressInfo).port}/hang`, event_types: ["turn.completed"] })).body;
  t.teardown(async () => {
    await slow.api.request("DELETE", `/api/v1/webhooks/${slowHook.id}`);
    for (const socket of sockets) socket.destroy();
    hanging.close();
  });
  // More due deliveries than one look reads (200), all older than the other tenant's.
  for (let i = 0; i < 260; i += 20) {
    const sent = await Promise.all(Array.from({ length: 20 }, () => slow.api.post(`/api/v1/webhooks/${slowHook.id}/test`, {})));
    t.true(sent.every((res) => res.status === 202));
  }
  const other = await newWorkspace(t.context.service);
  const r = await receiver(t);
  const hook = (await other.api.post("/api/v1/webhooks", { url: r.url, event_types: ["turn.completed"] })).body;
  const started = Date.now();
  t.is((await other.api.post(`/api/v1/webhooks/${hook.id}/test`, {})).status, 202);
  await r.until(() => r.requests.length >= 1, 8_000);
  t.log(`delivered ${Date.now() - started} ms after it was sent`);
  t.true(sockets.size > 0 && sockets.size <= 4, `the slow receiver holds the endpoint's limit of attempts (${sockets.size})`);
});

test("webhooks - what a webhook sends and where takes run:read too: webhooks:write alone cannot direct runs' data to an address (found by a probe)", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const key = async (scopes: string[]) => ws.api.withKey((await ws.api.post("/api/v1/api-keys", { scopes })).body.key);
  const writer = await key(["webhooks:read", "webhooks:write"]);
  const hook = (await ws.api.post("/api/v1/webhooks", { url: "https://example.com/x", event_types: ["turn.completed"], enabled: false })).body;
  const sent = await ws.api.post(`/api/v1/webhooks/${hook.id}/test`, {});
  t.is(sent.status, 202);

  const refused = [
    await writer.post("/api/v1/webhooks", { url: "https://example.com/mine", event_types: ["*"] }),
    ...(await Promise.all(
      [{ url: "https://example.com/mine" }, { event_types: ["*"] }, { agent_id: null }, { enabled: true }, { description: "d", enabled: true }].map((body) =>
        writer.request("PATCH", `/api/v1/webhooks/${hook.id}`, { body }),
      ),
    )),
    await writer.post(`/api/v1/webhooks/${hook.id}/deliveries/${sent.body.id}/redeliver`, {}),
  ];
  for (const res of refused) {
    t.is(res.status, 403, JSON.stringify(res.body));
    t.is(res.body.error.code, "permission_denied");
    t.regex(res.body.error.message, /lacks the scope run:read: a webhook sends runs' inputs and outputs/);
  }
  const unchanged = (await ws.api.get(`/api/v1/webhooks/${hook.id}`)).body;
  t.like(unchanged, { url: "https://example.com/x", event_types: ["turn.completed"], enabled: false, description: null });
  t.is((await ws.api.get(`/api/v1/webhooks/${hook.id}/deliveries`)).body.data.length, 1);

  // What sends nothing new, or nothing to a new place, stays with webhooks:write.
  t.is((await writer.request("PATCH", `/api/v1/webhooks/${hook.id}`, { body: { description: "kept", enabled: false } })).status, 200);
  t.is((await writer.post(`/api/v1/webhooks/${hook.id}/rotate-secret`, {})).status, 200);
  t.is((await writer.post(`/api/v1/webhooks/${hook.id}/test`, {})).status, 202);
  // With run:read as well, all of it.
  const full = await key(["webhooks:read", "webhooks:write", "run:read"]);
  t.is((await full.request("PATCH", `/api/v1/webhooks/${hook.id}`, { body: { url: "https://example.com/y", enabled: true } })).status, 200);
  t.is((await full.post(`/api/v1/webhooks/${hook.id}/deliveries/${sent.body.id}/redeliver`, {})).status, 202);
  t.is((await full.post("/api/v1/webhooks", { url: "https://example.com/z", event_types: ["*"] })).status, 201);
  t.is((await writer.request("DELETE", `/api/v1/webhooks/${hook.id}`)).status, 200);
});

test("webhooks - bad input answers 400 naming the field; scopes; another workspace's webhook is not found", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const other = await newWorkspace(t.context.service);
  const cases: Array<[unknown, string]> = [
    [{ url: "ftp://example.com/x", event_types: ["*"] }, "url"],
    [{ url: "https://user:pw@example.com/x", event_types: ["*"] }, "url"],
    [{ url: "not a url", event_types: ["*"] }, "url"],
    // A host no delivery could reach (found by an adversarial probe: each was 201).
    [{ url: "https://example.com:0/x", event_types: ["*"] }, "url"],
    [{ url: "http://./x", event_types: ["*"] }, "url"],
    [{ url: "http://a..b/x", event_types: ["*"] }, "url"],
    [{ url: "https://example.com/x", event_types: [] }, "event_types"],
    [{ url: "https://example.com/x", event_types: ["turn.started"] }, "event_types"],
    [{ url: "https://example.com/x" }, "event_types"],
    [{ url: "https://example.com/x", event_types: ["*"], enabled: "yes" }, "enabled"],
    [{ url: "https://example.com/x", event_types: ["*"], secret: "whsec_mine" }, "secret"],
    [{ url: `https://example.com/${"a".repeat(2_040)}`, event_types: ["*"] }, "url"],
    [{ url: "https://example.com/x", event_types: ["*"], description: "d".repeat(501) }, "description"],
    [{ url: "https://example.com/x", event_types: Array(50).fill("*") }, "event_types"],
    [{ url: "https://example.com/x", event_types: ["*"], agent_id: "a".repeat(101) }, "agent_id"],
  ];
  for (const [body, param] of cases) {
    const res = await ws.api.post("/api/v1/webhooks", body);
    t.is(res.status, 400, JSON.stringify(body));
    t.is(res.body.error.param, param, JSON.stringify(body));
  }
  const portZero = await ws.api.post("/api/v1/webhooks", { url: "https://example.com:0/x", event_types: ["*"] });
  t.regex(portZero.body.error.message, /DNS name or an IP address, and a port other than 0/);
  // What is not a URL at all says so, not that it must be http (probe).
  for (const url of ["http://example.com:99999/", "not a url"]) {
    t.regex((await ws.api.post("/api/v1/webhooks", { url, event_types: ["*"] })).body.error.message, /valid absolute URL/, url);
  }
  t.regex((await ws.api.post("/api/v1/webhooks", { url: "ftp://example.com/x", event_types: ["*"] })).body.error.message, /http or https/);
  const hook = (await ws.api.post("/api/v1/webhooks", { url: "https://example.com/x", event_types: ["*"] })).body;
  // An agent filter names an agent of the workspace: none, or another workspace's, never matches.
  const theirs = await other.api.agentWith({ model: "faux/scripted" });
  for (const agentId of ["agt_nosuchagent000000000001", theirs]) {
    const created = await ws.api.post("/api/v1/webhooks", { url: "https://example.com/x", event_types: ["*"], agent_id: agentId });
    t.is(created.status, 404, JSON.stringify(created.body));
    t.like(created.body.error, { code: "agent_not_found", param: "agent_id" });
    const changed = await ws.api.request("PATCH", `/api/v1/webhooks/${hook.id}`, { body: { agent_id: agentId } });
    t.is(changed.status, 404, JSON.stringify(changed.body));
    t.like(changed.body.error, { code: "agent_not_found", param: "agent_id" });
  }
  const mine = await ws.api.agentWith({ model: "faux/scripted" });
  t.is((await ws.api.request("PATCH", `/api/v1/webhooks/${hook.id}`, { body: { agent_id: mine } })).body.agent_id, mine);
  t.is((await ws.api.request("PATCH", `/api/v1/webhooks/${hook.id}`, { body: { agent_id: null } })).body.agent_id, null);
  t.is((await other.api.get(`/api/v1/webhooks/${hook.id}`)).status, 404);
  t.is((await other.api.request("DELETE", `/api/v1/webhooks/${hook.id}`)).status, 404);
  t.is((await other.api.post(`/api/v1/webhooks/${hook.id}/test`, {})).status, 404);
  t.is((await ws.api.get(`/api/v1/webhooks/${hook.id}/deliveries/whd_nope`)).status, 404);

  const key = async (scopes: string[]) => ws.api.withKey((await ws.api.post("/api/v1/api-keys", { scopes })).body.key);
  const runOnly = await key(["run:read", "run:write"]);
  t.is((await runOnly.get("/api/v1/webhooks")).status, 403);
  const reader = await key(["webhooks:read"]);
  t.is((await reader.get("/api/v1/webhooks")).status, 200);
  t.is((await reader.post("/api/v1/webhooks", { url: "https://example.com/y", event_types: ["*"] })).status, 403);
  t.is((await reader.post(`/api/v1/webhooks/${hook.id}/rotate-secret`, {})).status, 403);

  t.deepEqual((await ws.api.request("DELETE", `/api/v1/webhooks/${hook.id}`)).body, { id: hook.id, object: "webhook.deleted", deleted: true });
  t.is((await ws.api.get(`/api/v1/webhooks/${hook.id}`)).status, 404);

  // At most 50 per workspace: each final turn fans out to every one.
  for (let i = 0; i < 50; i++) t.is((await ws.api.post("/api/v1/webhooks", { url: `https://example.com/${i}`, event_types: ["*"] })).status, 201);
  const past = await ws.api.post("/api/v1/webhooks", { url: "https://example.com/51", event_types: ["*"] });
  t.is(past.status, 400);
  t.regex(past.body.error.message, /50 webhooks, the most it may have/);
  const firstPage = await ws.api.get("/api/v1/webhooks?limit=30");
  const secondPage = await ws.api.get(`/api/v1/webhooks?limit=30&after=${firstPage.body.next_cursor}`);
  t.is(firstPage.body.data.length + secondPage.body.data.length, 50);
  t.false(secondPage.body.has_more);
  t.is(new Set([...firstPage.body.data, ...secondPage.body.data].map((w: any) => w.id)).size, 50, "pages do not overlap");
  t.is((await other.api.get(`/api/v1/webhooks?after=${firstPage.body.next_cursor}`)).body.error.code, "invalid_cursor");
});

test("webhooks - creates racing for the last places, through two nodes, never pass the limit; the losers answer it and keep nothing", async (t) => {
  const ws = await newWorkspace(t.context.service);
  // The same workspace and key through the second (gateway-only) node too.
  const viaStrict = new Api(t.context.strict.url!, ws.key);
  for (let i = 0; i < 45; i++) t.is((await ws.api.post("/api/v1/webhooks", { url: `https://example.com/${i}`, event_types: ["*"] })).status, 201);
  const racers = await Promise.all(
    Array.from({ length: 12 }, (_, i) => (i % 2 ? viaStrict : ws.api).post("/api/v1/webhooks", { url: `https://example.com/race-${i}`, event_types: ["*"] })),
  );
  const won = racers.filter((r) => r.status === 201);
  const lost = racers.filter((r) => r.status !== 201);
  // At most the five places left; two racers stepping back together may leave one free.
  t.true(won.length >= 1 && won.length <= 5, JSON.stringify(racers.map((r) => r.status)));
  for (const r of lost) {
    t.is(r.status, 400);
    t.regex(r.body.error.message, /50 webhooks, the most it may have|50 at most, the most it may have/);
  }
  const listed = async () => new Set(((await ws.api.get("/api/v1/webhooks?limit=100")).body.data as { id: string; url: string }[]).map((w) => w.url));
  const kept = await listed();
  t.is(kept.size, 45 + won.length);
  for (const r of won) t.true(kept.has(r.body.url));
  for (const [i, r] of racers.entries()) if (r.status !== 201) t.false(kept.has(`https://example.com/race-${i}`));
  // The places left are there to take, one at a time, up to the limit and no further.
  for (let i = kept.size; i < 50; i++) t.is((await ws.api.post("/api/v1/webhooks", { url: `https://example.com/after-${i}`, event_types: ["*"] })).status, 201);
  t.is((await ws.api.post("/api/v1/webhooks", { url: "https://example.com/one-too-many", event_types: ["*"] })).status, 400);
  t.is((await listed()).size, 50);
});

test("webhooks - finished deliveries leave the log after 7 days; pending ones stay", async (t) => {
  const ws = await newWorkspace(t.context.strict);
  const raw = await t.context.servers.raw();
  const store = new WebhookStore(raw.db, TEST_MASTER_KEY, systemClock, Ids);
  const { doc } = (await store.create({ workspaceId: ws.id, url: "https://example.com/x", description: null, eventTypes: ["*"], agentId: null, enabled: true }))!;
  const done = await store.enqueueTest(doc, 999_998);
  const waiting = await store.enqueueTest(doc, 999_998);
  t.true(await store.claimAttempt(done, 1));
  t.false(await store.claimAttempt(done, 1), "an attempt is claimed once");
  await store.recordAttempt(done, { n: 1, at: Date.now(), status_code: 200, latency_ms: 3, error: null }, { status: "delivered", nextAttemptAt: Date.now() });
  t.is(await store.sweep([999_998], Date.now() - 1000), 0, "not old enough yet");
  t.is(await store.sweep([999_998], Date.now() + 1000), 1);
  t.is(await store.getDelivery(doc._id, done._id), null);
  t.deepEqual(await store.attemptsOf(done._id), []);
  t.truthy(await store.getDelivery(doc._id, waiting._id), "the pending one stays");

  // An attempt claimed by a node that stopped before the answer: once certainly over, it
  // counts as lost and the next attempt may be claimed.
  t.true(await store.claimAttempt(waiting, 1));
  t.false(await store.reconcileAttempt(waiting, 1, Date.now() - 60_000, false), "too recent: it may still be running");
  t.true(await store.reconcileAttempt(waiting, 1, Date.now() + 1_000, false));
  const after = (await store.getDelivery(doc._id, waiting._id))!;
  t.like(after, { status: "pending", attempts: 1 });
  t.regex(after.last_attempt?.error ?? "", /^lost/);
  t.true(await store.claimAttempt(after, 2));

  // A lapsed owner got an answer and recorded only its attempt: the new owner applies it.
  const third = await store.enqueueTest(doc, 999_998);
  t.true(await store.claimAttempt(third, 1));
  await store.recordAttempt(third, { n: 1, at: Date.now(), status_code: 204, latency_ms: 5, error: null }, { status: "delivered", nextAttemptAt: Date.now() }, false);
  t.is((await store.getDelivery(doc._id, third._id))!.status, "pending", "the lapsed owner did not write the delivery");
  t.true(await store.reconcileAttempt(third, 1, Date.now() - 60_000, false), "an answered attempt is applied at once");
  t.like(await store.getDelivery(doc._id, third._id), { status: "delivered", attempts: 1 });
});

test("webhooks - private, loopback and metadata destinations are refused without the operator's allowance, at creation and at delivery", async (t) => {
  const ws = await newWorkspace(t.context.strict);
  const r = await receiver(t);
  for (const url of [r.url, "http://localhost:9/x", "http://169.254.169.254/latest/meta-data", "http://[::1]:9/x", "http://10.0.0.8/x"]) {
    const res = await ws.api.post("/api/v1/webhooks", { url, event_types: ["*"] });
    t.is(res.status, 400, url);
    t.is(res.body.error.param, "url", url);
  }
  // A webhook that reached the store anyway (created under an allowance since withdrawn):
  // the deliverer refuses the address when it connects.
  const raw = await t.context.servers.raw();
  const store = new WebhookStore(raw.db, TEST_MASTER_KEY, systemClock, Ids);
  const { doc } = (await store.create({ workspaceId: ws.id, url: r.url, description: null, eventTypes: ["*"], agentId: null, enabled: true }))!;
  // A partition no node of this test holds: only this deliverer looks at it.
  const delivery = await store.enqueueTest(doc, 999_999);
  const deliverer = new WebhookDeliverer({ store, clock: systemClock, log: pino({ level: "silent" }), held: () => [999_999], allowPrivate: false, timeoutMs: 2_000, horizonMs: 60_000, retryScale: 0.01, maxInFlight: 1 });
  await deliverer.tick();
  await deliverer.stop();
  const attempts = await store.attemptsOf(delivery._id);
  t.is(attempts.length, 1);
  t.is(attempts[0]!.status_code, null);
  t.regex(attempts[0]!.error ?? "", /loopback/);
  t.is(r.requests.length, 0, "nothing reached the receiver");
});

test("webhooks - a delivery recorded on the node that sends its partition goes out at once, not at the next poll; another partition's waits for its sender", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const r = await receiver(t);
  const raw = await t.context.servers.raw();
  const store = new WebhookStore(raw.db, TEST_MASTER_KEY, systemClock, Ids);
  const { doc } = (await store.create({ workspaceId: ws.id, url: r.url, description: null, eventTypes: ["*"], agentId: null, enabled: true }))!;
  // Partitions no node of this test holds; the poll is ten minutes away.
  const deliverer = new WebhookDeliverer({ store, clock: systemClock, log: pino({ level: "silent" }), held: () => [999_996], allowPrivate: true, timeoutMs: 2_000, horizonMs: 60_000, retryScale: 0.01, maxInFlight: 1, pollMs: 600_000 });
  deliverer.start();
  try {
    const elsewhere = await store.enqueueTest(doc, 999_995);
    const here = await store.enqueueTest(doc, 999_996);
    await r.until(() => r.requests.length >= 1, 10_000);
    t.deepEqual(r.requests.map((q) => q.headers["webhook-id"]), [here.message_id]);
    // Several at once: each goes, the looks they start coalesced.
    const burst = await Promise.all(Array.from({ length: 5 }, () => store.enqueueTest(doc, 999_996)));
    await r.until(() => r.requests.length >= 6, 10_000);
    t.deepEqual(r.requests.slice(1).map((q) => String(q.headers["webhook-id"])).sort(), burst.map((d) => d.message_id).sort());
    t.false(r.requests.some((q) => q.headers["webhook-id"] === elsewhere.message_id));
  } finally {
    await deliverer.stop();
  }
});

test("webhooks - a look for due deliveries leaves out those being attempted and reads no bodies; a failing insert listener loses nothing", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const raw = await t.context.servers.raw();
  const store = new WebhookStore(raw.db, TEST_MASTER_KEY, systemClock, Ids);
  const { doc } = (await store.create({ workspaceId: ws.id, url: "https://example.com/due", description: null, eventTypes: ["*"], agentId: null, enabled: true }))!;
  const stop = store.onDeliveryInserted(() => {
    throw new Error("a listener that fails");
  });
  const a = await store.enqueueTest(doc, 999_994);
  const b = await store.enqueueTest(doc, 999_994);
  stop();
  const due = await store.due([999_994], Date.now() + 1_000, 10);
  t.deepEqual(due.map((d) => d._id).sort(), [a._id, b._id].sort());
  t.true(due.every((d) => !("body" in d)));
  t.deepEqual((await store.due([999_994], Date.now() + 1_000, 10, { deliveries: [a._id] })).map((d) => d._id), [b._id]);
  t.is(await store.bodyOf(a._id), a.body);
  t.is(await store.bodyOf("whd_none"), null);
});

test("webhooks - a delivery waiting behind an earlier one of its run leaves the due window; one whose webhook is gone fails", async (t) => {
  const ws = await newWorkspace(t.context.strict);
  const raw = await t.context.servers.raw();
  const store = new WebhookStore(raw.db, TEST_MASTER_KEY, systemClock, Ids);
  const { doc } = (await store.create({ workspaceId: ws.id, url: "https://example.com/hook", description: null, eventTypes: ["*"], agentId: null, enabled: true }))!;
  const event = (key: string) => ({ workspaceId: ws.id, agentId: "agt_x", runId: "run_order", partition: 999_997, type: "turn.completed" as const, eventKey: key, data: {} });
  t.is(await store.enqueue(event("turn_a")), 1);
  t.is(await store.enqueue(event("turn_b")), 1);
  t.is(await store.enqueue(event("turn_a")), 0, "a repeat records nothing");
  const [first, second] = (await store.listDeliveries(doc._id, 10)).reverse();
  const later = Date.now() + 60_000;
  await store.postpone((await store.getDelivery(doc._id, first!._id))!, later, false);
  const deliverer = new WebhookDeliverer({ store, clock: systemClock, log: pino({ level: "silent" }), held: () => [999_997], allowPrivate: false, timeoutMs: 2_000, horizonMs: 60_000, retryScale: 0.01, maxInFlight: 4 });
  await deliverer.tick();
  t.is((await store.getDelivery(doc._id, second!._id))!.next_attempt_at, later, "put off until the earlier one is due");
  t.deepEqual(await store.attemptsOf(second!._id), [], "and not attempted");
  t.deepEqual((await store.due([999_997], Date.now(), 10)).map((d) => d._id), [], "neither is due now");

  const { doc: gone } = (await store.create({ workspaceId: ws.id, url: "https://example.com/gone", description: null, eventTypes: ["*"], agentId: null, enabled: true }))!;
  const orphan = await store.enqueueTest(gone, 999_997);
  await raw.db.collection("webhooks").deleteOne({ _id: gone._id as never });
  await deliverer.tick();
  await deliverer.stop();
  t.is((await store.getDelivery(gone._id, orphan._id))!.status, "failed");
});
