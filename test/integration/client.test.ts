import anyTest, { type TestFn } from "ava";
import { bashThen, gatedBashConfig } from "../helpers/agent-configs.js";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { RunsApiError, RunsClient, type Action, type PendingAction, type Run, type RunEvent } from "../../client/index.js";

/**
 * RunsClient against the real service: a typed call for each endpoint family, and the
 * reference client behaviour end to end through a small HTTP proxy that injects 503s
 * (before and after the work was done) and cuts an event stream mid-frame.
 */

interface Context {
  servers: TestServers;
  service: RunningService;
  key: string;
  api: Api;
  client: RunsClient;
  /** Echoes its input. */
  echoAgent: string;
  /** Streams a long text slowly (many text_delta events). */
  slowAgent: string;
  /** Asks for `echo gated` through bash, which its approval policy gives to a person, then says "approved or not". */
  gatedAgent: string;
}
const test = anyTest as TestFn<Context>;

const LONG_TEXT = Array.from({ length: 60 }, (_, i) => `word${i}`).join(" ");

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers);
  const { key, api } = await newWorkspace(service, "business");
  const echoAgent = await api.agentWith({ model: "faux/scripted", tools: [] }, "echo");
  const slowAgent = await api.agentWith({ model: "faux/scripted", tools: [], script: [{ text: LONG_TEXT }], tokens_per_second: 60 }, "slow");
  const gatedAgent = await api.agentWith(gatedBashConfig(bashThen("echo gated", "approved or not")), "gated");
  const client = new RunsClient({ baseUrl: service.url!, apiKey: key });
  t.context = { servers, service, key, api, client, echoAgent, slowAgent, gatedAgent };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

// ---- a fault-injecting proxy ----------------------------------------------------------------

interface Seen {
  method: string;
  url: string;
  idempotencyKey?: string;
  lastEventId?: string;
}

/** What the proxy does with request number `n` (0-based). */
type Behaviour =
  /** Answer 503 runtime_unavailable, Retry-After: 1, without forwarding. */
  | "refuse"
  /** Forward (the work is done), then answer 503 instead of the service's answer. */
  | "lose_answer"
  | "forward"
  /** Forward; after `frames` complete SSE frames, send half of the next one and cut the connection. */
  | { cutAfterFrames: number };

async function startProxy(target: string, decide: (n: number, req: http.IncomingMessage) => Behaviour) {
  const seen: Seen[] = [];
  const upstream = new URL(target);
  const server = http.createServer((req, res) => {
    const n = seen.length;
    seen.push({
      method: req.method!,
      url: req.url!,
      idempotencyKey: req.headers["idempotency-key"] as string | undefined,
      lastEventId: req.headers["last-event-id"] as string | undefined,
    });
    const behaviour = decide(n, req);
    const unavailable = () => {
      res.writeHead(503, { "content-type": "application/json", "retry-after": "1" });
      res.end(JSON.stringify({ error: { message: "Temporarily unavailable.", type: "unavailable_error", param: null, code: "runtime_unavailable", retryable: true } }));
    };
    if (behaviour === "refuse") {
      req.resume();
      req.on("end", unavailable);
      return;
    }
    const forward = http.request(
      { host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers: { ...req.headers, host: upstream.host } },
      (answer) => {
        if (behaviour === "lose_answer") {
          answer.resume();
          answer.on("end", unavailable);
          return;
        }
        res.writeHead(answer.statusCode!, answer.headers);
        if (typeof behaviour === "object" && String(answer.headers["content-type"]).startsWith("text/event-stream")) {
          let buffered = "";
          let frames = 0;
          answer.setEncoding("utf8");
          answer.on("data", (text: string) => {
            buffered += text;
            let end: number;
            while ((end = buffered.indexOf("\n\n")) !== -1) {
              const frame = buffered.slice(0, end + 2);
              buffered = buffered.slice(end + 2);
              if (frame.includes("\nid: ") || frame.startsWith("id: ")) frames++;
              if (frames >= behaviour.cutAfterFrames + 1) {
                // Half of the next frame, then the connection dies.
                res.write(frame.slice(0, Math.floor(frame.length / 2)), () => res.socket?.destroy());
                answer.destroy();
                return;
              }
              res.write(frame);
            }
          });
          answer.on("end", () => res.end(buffered));
          return;
        }
        answer.pipe(res);
      },
    );
    forward.on("error", () => res.destroy());
    req.pipe(forward);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url,
    seen,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

// ---- typed calls -------------------------------------------------------------------------

test("client - runs: start and wait, background, get, list, tags, turns, events, cancel, delete", async (t) => {
  const { client, echoAgent } = t.context;
  const run = await client.startRun({ agent: echoAgent, input: "hello client", tags: ["client-test", "b"] });
  t.is(run.object, "run");
  t.is(run.disposition, "created");
  t.is(run.turn.status, "completed");
  t.deepEqual(run.turn.output, [{ type: "output_text", text: "hello client" }]);
  t.deepEqual(run.tags, ["b", "client-test"]);

  const second = await client.continueRun({ run_id: run.id, input: "again", background: true });
  t.is(second.id, run.id);
  t.not(second.turn.id, run.turn.id);
  const done = await client.waitForTurn(run.id, second.turn.id);
  t.is(done.turn.status, "completed");
  t.deepEqual(done.turn.output, [{ type: "output_text", text: "again" }]);

  const first = await client.getRun(run.id, { turnId: run.turn.id });
  t.is(first.turn.id, run.turn.id);
  const latest = await client.getRun(run.id);
  t.is(latest.turn.id, second.turn.id);

  const listed = await client.listRuns({ agent_id: echoAgent, tag: ["client-test"], limit: 10 });
  t.is(listed.object, "list");
  t.true(listed.data.some((r) => r.id === run.id));
  t.false("turn" in listed.data[0]);

  const tags = await client.updateTags(run.id, { add: ["c"], remove: ["b"] });
  t.deepEqual(tags, { object: "run_tags", run_id: run.id, tags: ["c", "client-test"] });

  const turns = await client.listTurns(run.id);
  t.deepEqual(turns.data.map((turn) => turn.id), [run.turn.id, second.turn.id]);
  const turn = await client.getTurn(run.id, second.turn.id);
  t.is(turn.status, "completed");
  t.is(typeof turn.duration_ms, "number");

  const events = await client.listEvents(run.id, { turn_id: run.turn.id });
  t.is(events.history.status, "complete");
  t.true(events.data.some((e) => e.type === "turn.completed" && e.source === "platform"));

  const all: RunEvent[] = [];
  for await (const event of client.streamEvents(run.id, { turnId: second.turn.id })) all.push(event);
  t.is(all.at(-1)?.type, "turn.completed", "a finished turn's stream replays it and ends after its final event");
  t.is(all.at(-1)?.data.run.turn.id, second.turn.id);

  const cancelled = await client.cancelRun(run.id);
  t.is(cancelled.turn.status, "completed", "cancel on an idle run returns the existing result");

  const deleted = await client.deleteRun(run.id);
  t.deepEqual(deleted, { id: run.id, object: "run.deleted", deleted: true });
  const gone = await t.throwsAsync(client.getRun(run.id), { instanceOf: RunsApiError });
  t.is(gone?.status, 404);
  t.is(gone?.code, "run_not_found");
  t.is(gone?.type, "not_found_error");
});

test("client - errors carry status, code, type and param; 409 is not retried", async (t) => {
  const { client, echoAgent } = t.context;
  const bad = await t.throwsAsync(client.createRun({ run_id: "run_x", version: 2, input: "x" } as never), { instanceOf: RunsApiError });
  t.is(bad?.status, 400);
  t.is(bad?.code, "invalid_request");
  t.is(bad?.param, "version");
  const key = `conflict-${Math.random()}`;
  await client.startRun({ agent: echoAgent, input: "one" }, { idempotencyKey: key });
  const conflict = await t.throwsAsync(client.startRun({ agent: echoAgent, input: "one", tags: ["other"] }, { idempotencyKey: key }), { instanceOf: RunsApiError });
  t.is(conflict?.status, 409);
  t.is(conflict?.code, "idempotency_conflict");
  t.is(conflict?.idempotencyKey, key);
});

/** Reads the run until its turn waits for a decision (the turn stays in_progress meanwhile). */
async function pendingActionOf(client: RunsClient, runId: string): Promise<{ run: Run; action: PendingAction }> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const run = await client.getRun(runId);
    if (run.turn.pending_action) return { run, action: run.turn.pending_action };
    if (!["queued", "in_progress"].includes(run.turn.status) || Date.now() > deadline) throw new Error(`the turn did not wait for a decision: ${JSON.stringify(run.turn)}`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

test("client - approvals: a gated call waits with its pending_action; decideAction approves it and the turn completes", async (t) => {
  const { client, gatedAgent } = t.context;
  const started = await client.startRun({ agent: gatedAgent, input: "go", background: true });
  const { run, action } = await pendingActionOf(client, started.id);
  t.is(run.turn.id, started.turn.id);
  t.is(run.turn.status, "in_progress");
  t.regex(action.id, /^act_/);
  t.is(action.tool, "bash");
  t.deepEqual(action.arguments, { command: "echo gated" });
  t.true(action.expires_at > action.requested_at);

  const decided: Action = await client.decideAction(run.id, action.id, { decision: "approve", reason: "looks harmless" }, { idempotencyKey: `approve-${run.id}` });
  t.like(decided, { id: action.id, object: "action", run_id: run.id, turn_id: run.turn.id, tool: "bash", tool_call_id: action.tool_call_id, decision: "approve", reason: "looks harmless", decided_by: "person" });
  t.is(typeof decided.decided_at, "number");
  // The same key repeats the call safely: the same answer.
  t.deepEqual(await client.decideAction(run.id, action.id, { decision: "approve", reason: "looks harmless" }, { idempotencyKey: `approve-${run.id}` }), decided);

  const done = await client.waitForTurn(run.id, run.turn.id, { deadlineMs: 30_000 });
  t.is(done.turn.status, "completed");
  t.deepEqual(done.turn.output, [{ type: "output_text", text: "approved or not" }]);
  t.is(done.turn.pending_action, null);
  const events = await client.listEvents(run.id, { turn_id: run.turn.id, limit: 1000 });
  t.like(events.data.find((e) => e.type === "tool.approval_requested")?.data, { action_id: action.id, tool: "bash" });
  t.like(events.data.find((e) => e.type === "tool.approval_decided")?.data, { action_id: action.id, decision: "approve", decided_by: "person" });
});

test("client - approvals: a second decision with a new key is RunsApiError 409 action_already_decided, not retried; unknown actions are 404", async (t) => {
  const { client, gatedAgent } = t.context;
  const started = await client.startRun({ agent: gatedAgent, input: "go", background: true });
  const { run, action } = await pendingActionOf(client, started.id);
  const denied = await client.decideAction(run.id, action.id, { decision: "deny", reason: "not today" });
  t.like(denied, { decision: "deny", reason: "not today", decided_by: "person" });

  let requests = 0;
  const counting = new RunsClient({ baseUrl: t.context.service.url!, apiKey: t.context.key, fetch: (input, init) => (requests++, fetch(input, init)) });
  const again = await t.throwsAsync(counting.decideAction(run.id, action.id, { decision: "approve" }, { idempotencyKey: `second-${run.id}` }), { instanceOf: RunsApiError });
  t.is(again?.status, 409);
  t.is(again?.code, "action_already_decided");
  t.is(again?.type, "conflict_error");
  t.is(again?.param, "actionId");
  t.is(again?.retryable, false);
  t.is(again?.idempotencyKey, `second-${run.id}`);
  t.is(requests, 1, "a 409 is not retried");

  const unknown = await t.throwsAsync(client.decideAction(run.id, "act_doesnotexist", { decision: "approve" }), { instanceOf: RunsApiError });
  t.is(unknown?.status, 404);
  t.is(unknown?.code, "action_not_found");
  const done = await client.waitForTurn(run.id, run.turn.id, { deadlineMs: 30_000 });
  t.is(done.turn.status, "completed", "a denial goes back to the model, which answers");
});

test("client - agents, deployments and models", async (t) => {
  const { client } = t.context;
  const agent = await client.createAgent({ name: "typed", description: "made by the client" });
  t.is(agent.object, "agent");
  t.is(agent.active_version, null);
  const deployment = await client.createDeployment(agent.id, { config: { model: "faux/scripted" }, activate: false });
  t.is(deployment.version, 1);
  const ready = await client.waitForDeployment(agent.id, 1);
  t.is(ready.status, "ready");
  t.is((await client.getAgent(agent.id)).active_version, null);
  const activated = await client.activateDeployment(agent.id, 1);
  t.is(activated.active_version, 1);
  t.deepEqual((await client.listDeployments(agent.id)).data.map((d) => d.version), [1]);
  const page = await client.listDeployments(agent.id, { limit: 1 });
  t.deepEqual([page.data.length, page.has_more, page.next_cursor], [1, false, null]);
  t.is((await client.getDeployment(agent.id, 1)).config.model, "faux/scripted");
  const agents = [];
  for await (const a of client.paginate((after) => client.listAgents({ limit: 1, after }))) agents.push(a.id);
  t.true(agents.includes(agent.id));
  t.is(new Set(agents).size, agents.length);
  const models = await client.listModels();
  t.true(models.data.some((m) => m.id === "faux/scripted" || JSON.stringify(m).includes("faux")));
});

test("client - API keys: create, list, get, rotate, revoke", async (t) => {
  const { client, service } = t.context;
  const created = await client.createApiKey({ label: "ci", scopes: ["run:read"] });
  t.regex(created.key!, /^rk_live_/);
  t.deepEqual(created.scopes, ["run:read"]);
  t.true((await client.listApiKeys()).data.some((k) => k.id === created.id));
  t.is((await client.getApiKey(created.id)).key, undefined, "the secret is shown only once");
  const rotated = await client.rotateApiKey(created.id, { gracePeriodSeconds: 0 });
  t.regex(rotated.key!, /^rk_live_/);
  t.is(typeof rotated.old_key_revokes_at, "string");
  const withNew = new RunsClient({ baseUrl: service.url!, apiKey: rotated.key });
  t.is((await withNew.listRuns({ limit: 1 })).object, "list");
  const revoked = await client.revokeApiKey(rotated.id);
  t.is(typeof revoked.revoked_at, "number");
});

test("client - environment values and files", async (t) => {
  const { client } = t.context;
  const name = `CLIENT_TEST_${Math.floor(Math.random() * 1e6)}`;
  const put = await client.putEnvironmentValue(name, "s3cret");
  t.is(put.name, name);
  t.is(put.value, undefined);
  t.true((await client.listEnvironmentValues({ limit: 100 })).data.some((v) => v.name === name));
  t.is((await client.getEnvironmentValue(name, { reveal: true })).value, "s3cret");
  t.is((await client.getEnvironmentValue(name)).value, undefined);
  t.deepEqual(await client.deleteEnvironmentValue(name), { name, object: "environment_value.deleted", deleted: true });

  const key = `upload-${Math.random()}`;
  const file = await client.uploadFile({ file: "file body", filename: "notes.txt", media_type: "text/plain" }, { idempotencyKey: key });
  t.is(file.object, "file");
  t.is(file.filename, "notes.txt");
  t.is(file.bytes, 9);
  t.regex(file.sha256, /^[0-9a-f]{64}$/);
  const again = await client.uploadFile({ file: new TextEncoder().encode("file body"), filename: "notes.txt", media_type: "text/plain" }, { idempotencyKey: key });
  t.is(again.id, file.id, "a repeat with the same key returns the file");
  t.deepEqual(await client.getFile(file.id), file);
});

// ---- injected failures ------------------------------------------------------------------------

test("client - injected 503s: retried after Retry-After with the same Idempotency-Key, one run", async (t) => {
  const { service, key, echoAgent } = t.context;
  // Request 0 reaches the service and its answer is lost (a 503 after the work was done),
  // request 1 is refused outright, request 2 goes through.
  const proxy = await startProxy(service.url!, (n) => (n === 0 ? "lose_answer" : n === 1 ? "refuse" : "forward"));
  try {
    const client = new RunsClient({ baseUrl: proxy.url, apiKey: key });
    const tag = `retry-${Math.random().toString(36).slice(2)}`;
    const started = Date.now();
    const run = await client.startRun({ agent: echoAgent, input: "through the proxy", tags: [tag] });
    t.true(Date.now() - started >= 2000, "waited Retry-After (1 s) twice");
    t.is(run.turn.status, "completed");
    t.deepEqual(run.turn.output, [{ type: "output_text", text: "through the proxy" }]);
    t.is(proxy.seen.length, 3);
    const keys = proxy.seen.map((s) => s.idempotencyKey);
    t.truthy(keys[0]);
    t.deepEqual(keys, [keys[0], keys[0], keys[0]]);
    const runs = await t.context.client.listRuns({ tag: [tag] });
    t.deepEqual(runs.data.map((r) => r.id), [run.id], "one run, although the first request was done");
    t.is((await t.context.client.listTurns(run.id)).data.length, 1, "and one turn");
  } finally {
    await proxy.close();
  }
});

test("client - injected 503s beyond maxRetries reach the caller with Retry-After", async (t) => {
  const { service, key } = t.context;
  const proxy = await startProxy(service.url!, () => "refuse");
  try {
    const client = new RunsClient({ baseUrl: proxy.url, apiKey: key, maxRetries: 1 });
    const err = await t.throwsAsync(client.getRun("run_x"), { instanceOf: RunsApiError });
    t.is(err?.status, 503);
    t.is(err?.retryAfterS, 1);
    t.is(proxy.seen.length, 2);
  } finally {
    await proxy.close();
  }
});

test("client - a cut stream reconnects from the last event: no gap, no duplicate", async (t) => {
  const { service, key, slowAgent, client: direct } = t.context;
  // The first stream (the POST) is cut after 5 frames, mid-frame; the first resume after 4 more.
  let sseConnections = 0;
  const proxy = await startProxy(service.url!, (_n, req) => {
    const isStream = req.method === "POST" || String(req.url).includes("stream=true");
    if (!isStream) return "forward";
    sseConnections++;
    return sseConnections === 1 ? { cutAfterFrames: 5 } : sseConnections === 2 ? { cutAfterFrames: 4 } : "forward";
  });
  try {
    const client = new RunsClient({ baseUrl: proxy.url, apiKey: key });
    const events: RunEvent[] = [];
    for await (const event of client.streamRun({ agent: slowAgent, input: "go" })) events.push(event);
    const last = events.at(-1)!;
    t.is(last.type, "turn.completed");
    t.is(last.data.run.turn.output[0].text, LONG_TEXT);

    // The stored history of the turn is exactly what was received.
    const stored = await direct.listEvents(last.run_id, { turn_id: last.turn_id!, limit: 1000 });
    t.deepEqual(
      events.map((e) => e.id),
      stored.data.map((e) => e.id),
    );
    t.is(new Set(events.map((e) => e.id)).size, events.length, "no duplicate");
    const sequences = events.map((e) => e.sequence);
    t.deepEqual(sequences, [...sequences].sort((a, b) => a - b));
    t.is(
      events.filter((e) => e.type === "text_delta").map((e) => e.data.delta).join(""),
      LONG_TEXT,
      "the deltas add up to the text: nothing missing",
    );

    // Connections: the POST (cut), then resumes naming the last complete event.
    const streams = proxy.seen.filter((s) => s.method === "POST" || s.url.includes("stream=true"));
    t.is(streams.length, 3);
    t.is(streams[0].method, "POST");
    t.is(streams[1].lastEventId, events[4].id, "resumed after the 5th event, not the half frame");
    t.regex(streams[1].url, new RegExp(`/api/v1/runs/${last.run_id}/events\\?stream=true&turn_id=${last.turn_id}`));
    t.is(streams[2].lastEventId, events[8].id);
  } finally {
    await proxy.close();
  }
});
