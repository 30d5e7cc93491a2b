import anyTest, { type ExecutionContext, type TestFn } from "ava";
import pino from "pino";
import type { NatsConnection } from "@nats-io/transport-node";
import { connectNats } from "../../src/nats.js";
import { ApiError, type CommandReply, Ids, partitionOf, Subjects, systemClock, type RunCommand } from "../../src/index.js";
import { CommandRouter } from "../../gateway/router.js";
import type { RunningService } from "../../node/service.js";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";

type Ctx = { servers: TestServers; service: RunningService; api: Api; workspaceId: string; agent: string; nc: NatsConnection };
const test = anyTest as TestFn<Ctx>;
const log = pino({ level: "silent" });
/** As the service's config in the tests (test/helpers/servers.ts). */
const PARTITIONS = 8;
const encoder = new TextEncoder();

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers);
  const ws = await newWorkspace(service);
  const agent = await ws.api.agentWith({ model: "faux/scripted" });
  const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "lost-replies-test" });
  t.context = { servers, service, api: ws.api, workspaceId: ws.id, agent, nc };
});

test.after.always(async (t) => {
  await t.context.nc?.drain();
  await t.context.service?.close();
  await t.context.servers?.stop();
});

test.serial("lost replies - a delete whose reply was lost is answered as the first when resent, not run again (which would say run_not_found)", async (t) => {
  const { api, agent, workspaceId, nc } = t.context;
  const run = (await api.post("/api/v1/runs", { agent, input: "hello" })).body;
  t.is(run.turn.status, "completed");
  const del: RunCommand = { op: "delete", workspace_id: workspaceId, run_id: run.id, command_id: `lost-${run.id}` };
  // Sent without a reply subject: the owner deletes the run and its reply goes nowhere.
  nc.publish(Subjects.command(partitionOf(run.id, PARTITIONS)), encoder.encode(JSON.stringify(del)));
  const router = new CommandRouter({ nc, partitions: PARTITIONS, retryMs: 1_500, log, clock: systemClock });
  const resent = await router.send(del);
  t.like(resent, { ok: true, run_id: run.id });
  t.is((await api.get(`/api/v1/runs/${run.id}`)).status, 404, "the run is deleted");
  // A new delete (another command id) is a new command: the run is gone.
  const fresh = await router.send({ op: "delete", workspace_id: workspaceId, run_id: run.id }).catch((err: unknown) => err);
  t.true(fresh instanceof ApiError);
  t.like(fresh, { code: "run_not_found" });
});

test.serial("lost replies - a start resent while the first is still running joins it: one run, one turn.started", async (t) => {
  const { api, agent, workspaceId, nc } = t.context;
  const agentDoc = (await api.get(`/api/v1/agents/${agent}`)).body;
  t.true(Number.isInteger(agentDoc.active_version));
  // The same start twice on the wire, back to back; the first one's reply goes nowhere.
  const start: Extract<RunCommand, { op: "start" }> = {
    op: "start", workspace_id: workspaceId, run_id: Ids.run(), turn_id: Ids.turn(), agent_id: agent,
    version: agentDoc.active_version, input: [{ type: "input_text", text: "twice?" }], tags: [], plan: "solo", command_id: "start-once",
  };
  const subject = Subjects.command(partitionOf(start.run_id, PARTITIONS));
  nc.publish(subject, encoder.encode(JSON.stringify(start)));
  const router = new CommandRouter({ nc, partitions: PARTITIONS, retryMs: 1_500, log, clock: systemClock });
  const reply = await router.send(start);
  t.like(reply, { ok: true, run_id: start.run_id, turn_id: start.turn_id });
  await api.waitTurn(start.run_id, start.turn_id);
  const listed = await api.get(`/api/v1/runs/${start.run_id}/events?limit=100`);
  t.is(listed.status, 200);
  t.false(listed.body.has_more);
  const events = listed.body.data;
  t.is(events.filter((e: any) => e.type === "run.created").length, 1);
  t.is(events.filter((e: any) => e.type === "turn.started").length, 1);
});

/** A partition the service does not serve (it has 8 of 1,000): the test answers `runId`'s commands with `answer` (undefined: no reply). */
async function answering(t: ExecutionContext<Ctx>, runId: string, answer: (commandId: string, nth: number) => object | undefined): Promise<{ partitions: number; seen: string[] }> {
  const { nc } = t.context;
  const partitions = 1_000;
  const partition = partitionOf(runId, partitions);
  t.true(partition >= PARTITIONS, `partition ${partition}`);
  const seen: string[] = [];
  const sub = nc.subscribe(Subjects.command(partition), {
    callback: (_err, msg) => {
      const cmd = JSON.parse(new TextDecoder().decode(msg.data)) as RunCommand;
      seen.push(cmd.command_id ?? "");
      const reply = answer(cmd.command_id ?? "", seen.length);
      if (reply) msg.respond(encoder.encode(JSON.stringify(reply)));
    },
  });
  t.teardown(() => sub.unsubscribe());
  await nc.flush();
  return { partitions, seen };
}

const tags = (runId: string, tag: string): RunCommand => ({ op: "tags", workspace_id: "ws_x", run_id: runId, add: [tag], remove: [] });

test.serial("lost replies - the router resends a command whose reply does not come within the attempt timeout, with the same command id, and returns the answer in a few seconds", async (t) => {
  const runId = "run_lostreplyrouter";
  // The first try is dropped.
  const { partitions, seen } = await answering(t, runId, (_id, nth) => (nth > 1 ? { ok: true, run_id: runId, tags: ["a"] } : undefined));
  const router = new CommandRouter({ nc: t.context.nc, partitions, retryMs: 1_500, log, clock: systemClock, answerWithinMs: 15_000, connection: { connected: true }, attemptTimeoutMs: 1_000 });
  const started = Date.now();
  const reply = await router.send(tags(runId, "a"));
  const tookMs = Date.now() - started;
  t.like(reply, { ok: true, tags: ["a"] });
  t.is(seen.length, 2);
  t.truthy(seen[0]);
  t.is(seen[1], seen[0], "the resend carries the first send's command id");
  t.true(tookMs >= 1_000 && tookMs < 3_000, `answered in ${tookMs} ms`);
});

test.serial("lost replies - with no reply at all the router answers 503 after its bound, not later", async (t) => {
  const runId = "run_lostreplysilent";
  const { partitions, seen } = await answering(t, runId, () => undefined);
  const router = new CommandRouter({ nc: t.context.nc, partitions, retryMs: 1_500, log, clock: systemClock, answerWithinMs: 3_000, connection: { connected: true }, attemptTimeoutMs: 1_000 });
  const started = Date.now();
  const err = await router.send(tags(runId, "a")).catch((e: unknown) => e);
  const tookMs = Date.now() - started;
  t.like(err, { code: "runtime_unavailable" });
  t.true(tookMs >= 2_900 && tookMs < 4_500, `answered in ${tookMs} ms`);
  t.true(seen.length >= 3 && seen.length <= 4, `sent ${seen.length} times`);
});

test.serial("lost replies - an owner whose lease is in doubt answers 'in doubt'; the router asks again with the same command id until it is answered", async (t) => {
  const runId = "run_lostreplydoubt";
  // As actors/actor-host.ts answers while the partition's lease is in doubt, three times; then the lease is confirmed.
  const { partitions, seen } = await answering(t, runId, (_id, nth) => (nth <= 3 ? { ok: false, in_doubt: true } : { ok: true, run_id: runId, tags: ["d"] }));
  const router = new CommandRouter({ nc: t.context.nc, partitions, retryMs: 5_000, log, clock: systemClock, answerWithinMs: 15_000, connection: { connected: true }, attemptTimeoutMs: 1_000 });
  const started = Date.now();
  const reply = await router.send(tags(runId, "d"));
  const tookMs = Date.now() - started;
  t.like(reply, { ok: true, tags: ["d"] });
  t.is(seen.length, 4);
  t.is(new Set(seen).size, 1, "every try carries the same command id");
  // Backoff 25, 50, 100 ms: well inside the retry budget.
  t.true(tookMs < 2_000, `answered in ${tookMs} ms`);
});

test.serial("lost replies - an owner that stays in doubt is answered 503 after the router's retry budget, not at once and not later", async (t) => {
  const runId = "run_lostreplydoubtful";
  const { partitions, seen } = await answering(t, runId, () => ({ ok: false, in_doubt: true }));
  const router = new CommandRouter({ nc: t.context.nc, partitions, retryMs: 1_500, log, clock: systemClock, answerWithinMs: 15_000, connection: { connected: true }, attemptTimeoutMs: 1_000 });
  const started = Date.now();
  const err = await router.send(tags(runId, "a")).catch((e: unknown) => e);
  const tookMs = Date.now() - started;
  t.true(err instanceof ApiError);
  t.like(err, { code: "runtime_unavailable" });
  // runs-api.md: a 503 runtime_unavailable carries Retry-After of 1 to 3 s, is retryable, and its message never names the store or the platform's parts.
  const retryAfterS = (err as ApiError).retryAfterS;
  t.true(retryAfterS !== undefined && retryAfterS >= 1 && retryAfterS <= 3, `Retry-After ${retryAfterS}`);
  t.true((err as ApiError).retryable);
  t.notRegex((err as ApiError).message, /mongo|ferret|database|nats|jetstream|lease|partition|owner|doubt/i);
  t.true(tookMs >= 1_000 && tookMs < 2_500, `answered in ${tookMs} ms`);
  // 25, 50, 100, 200, 400, 500 ms … within 1.5 s: a handful of tries, not a busy loop.
  t.true(seen.length >= 4 && seen.length <= 10, `asked ${seen.length} times`);
});

test.serial("served here - a node's commands for partitions it serves are answered in its process: a start, a continuation, a steer, tags, a cancel and a delete put no command on NATS and work as through it", async (t) => {
  const { api, agent, nc } = t.context;
  const slow = await api.agentWith({ model: "faux/scripted", tools: [], tokens_per_second: 20, script: [{ text: "one two three four five six seven eight nine ten" }] }, "slow-here");
  const seen: string[] = [];
  const sub = nc.subscribe("runs.cmd.>", { callback: (_err, msg) => void seen.push(msg.subject) });
  t.teardown(() => sub.unsubscribe());
  await nc.flush();
  const run = (await api.post("/api/v1/runs", { agent, input: "hello" })).body;
  t.is(run.turn.status, "completed");
  const again = await api.post("/api/v1/runs", { run_id: run.id, input: "again" });
  t.is(again.status, 200);
  t.is(again.body.turn.status, "completed");
  t.deepEqual((await api.post(`/api/v1/runs/${run.id}/tags`, { add: ["here"] })).body.tags, ["here"]);
  const busy = (await api.post("/api/v1/runs", { agent: slow, input: "go", background: true })).body;
  t.is(busy.state, "busy");
  const steered = await api.post("/api/v1/runs", { run_id: busy.id, input: "also", on_busy: "steer", background: true });
  t.is(steered.status, 202);
  const cancel = await api.post(`/api/v1/runs/${busy.id}/cancel`, {});
  t.true(cancel.status === 200 || cancel.status === 202, `cancel ${cancel.status}`);
  t.is((await api.waitTurn(busy.id, busy.turn.id)).turn.status, "cancelled");
  t.is((await api.request("DELETE", `/api/v1/runs/${run.id}`, { idempotencyKey: `k-${run.id}` })).status, 200);
  t.is((await api.get(`/api/v1/runs/${run.id}`)).status, 404);
  await nc.flush();
  t.deepEqual(seen, [], "no command crossed NATS");
});

test.serial("served here - a command its own node serves is answered 503 after the router's bound when it has no answer by then, and asked again while its host is in doubt or not the owner; one it does not serve goes to the owner through NATS", async (t) => {
  const runId = "run_servedhere";
  const { partitions, seen } = await answering(t, runId, () => ({ ok: true, run_id: runId, tags: ["n"] }));
  // This node's host has no answer for it (a command stuck behind held writes, say).
  const asked: RunCommand[] = [];
  const stuck = new CommandRouter({ nc: t.context.nc, partitions, retryMs: 1_500, log, clock: systemClock, answerWithinMs: 2_000, connection: { connected: true }, attemptTimeoutMs: 1_000, here: (_runId, command) => (asked.push(JSON.parse(command) as RunCommand), new Promise(() => undefined)) });
  const started = Date.now();
  const err = await stuck.send(tags(runId, "a")).catch((e: unknown) => e);
  const tookMs = Date.now() - started;
  t.true(err instanceof ApiError);
  t.like(err, { code: "runtime_unavailable" });
  t.true(tookMs >= 1_900 && tookMs < 3_000, `answered in ${tookMs} ms`);
  t.is(asked.length, 1, "asked once: the host joins a resend to the first anyway");
  t.truthy(asked[0]!.command_id);
  t.deepEqual(seen, [], "nothing went through NATS");
  // This node does not serve the partition: the owner answers through NATS.
  const elsewhere = new CommandRouter({ nc: t.context.nc, partitions, retryMs: 1_500, log, clock: systemClock, answerWithinMs: 2_000, connection: { connected: true }, attemptTimeoutMs: 1_000, here: () => undefined });
  t.like(await elsewhere.send(tags(runId, "n")), { ok: true, tags: ["n"] });
  t.is(seen.length, 1);
  // The host's refusal is the client's answer, as the owner's would be through NATS.
  const refusing = new CommandRouter({ nc: t.context.nc, partitions, retryMs: 1_500, log, clock: systemClock, answerWithinMs: 2_000, connection: { connected: true }, attemptTimeoutMs: 1_000, here: async () => ({ ok: false, code: "run_not_found", message: "No run." }) });
  t.like(await refusing.send(tags(runId, "r")).catch((e: unknown) => e), { code: "run_not_found", status: 404 });
  t.is(seen.length, 1);
  // "In doubt" and "not the owner" from this node's host are asked again, as from an owner through NATS, with the same command id.
  const ids: string[] = [];
  const replies: CommandReply[] = [{ ok: false, in_doubt: true }, { ok: false, not_owner: true }, { ok: true, run_id: runId, tags: ["h"] }];
  const doubting = new CommandRouter({ nc: t.context.nc, partitions, retryMs: 1_500, log, clock: systemClock, answerWithinMs: 2_000, attemptTimeoutMs: 1_000, here: async (_runId, command) => (ids.push((JSON.parse(command) as RunCommand).command_id!), replies[ids.length - 1]!) });
  t.like(await doubting.send(tags(runId, "h")), { ok: true, tags: ["h"] });
  t.is(ids.length, 3);
  t.is(new Set(ids).size, 1);
  t.is(seen.length, 1);
});

test.serial("large commands - a start with the largest input a body may carry (4 MiB of text and a 4 MiB inline file) reaches its owner through NATS as it does in process", async (t) => {
  const { api, workspaceId, nc } = t.context;
  // A brief answer (the echo model would echo 4 MiB back, past what a turn may store).
  const agent = await api.agentWith({ model: "faux/scripted", tools: [], script: [{ text: "ok" }] }, "brief");
  const agentDoc = (await api.get(`/api/v1/agents/${agent}`)).body;
  const input = [
    { type: "input_text", text: "x".repeat(4 * 1024 * 1024) },
    { type: "input_file", filename: "big.bin", file_data: Buffer.alloc(4 * 1024 * 1024, 7).toString("base64") },
  ] as const;
  const start: Extract<RunCommand, { op: "start" }> = {
    op: "start", workspace_id: workspaceId, run_id: Ids.run(), turn_id: Ids.turn(), agent_id: agent,
    version: agentDoc.active_version, input: input as never, tags: [], plan: "solo",
  };
  // Through NATS (a router with no actor host of its own: a gateway-only node).
  const router = new CommandRouter({ nc, partitions: PARTITIONS, retryMs: 1_500, log, clock: systemClock });
  t.like(await router.send(start), { ok: true, run_id: start.run_id });
  t.is((await api.waitTurn(start.run_id, start.turn_id, 60_000)).turn.status, "completed");
  // Through the API, whose node serves the run in process.
  const res = await api.post("/api/v1/runs", { agent, input: input as never, background: true });
  t.is(res.status, 202, JSON.stringify(res.body).slice(0, 300));
  // Past what the NATS servers take (no body can carry that much): refused alike either way, 413, never 503.
  const huge = { ...start, run_id: Ids.run(), turn_id: Ids.turn(), input: [{ type: "input_text" as const, text: "y".repeat(nc.info!.max_payload + 1) }] };
  let askedHere = 0;
  for (const here of [undefined, () => void askedHere++]) {
    const refusing = new CommandRouter({ nc, partitions: PARTITIONS, retryMs: 1_500, log, clock: systemClock, answerWithinMs: 15_000, connection: { connected: true }, attemptTimeoutMs: 2_000, here });
    t.like(await refusing.send(huge).catch((e: unknown) => e), { code: "payload_too_large", status: 413, param: "input" });
  }
  t.is(askedHere, 0, "not handed to this node's host either");
});
