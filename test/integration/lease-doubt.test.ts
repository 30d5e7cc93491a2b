import anyTest, { type TestFn } from "ava";
import pino from "pino";
import type { NatsConnection } from "@nats-io/transport-node";
import { connectNats } from "../../src/nats.js";
import { Ids, systemClock, type CommandReply, type RunCommand } from "../../src/index.js";
import { CommandRouter } from "../../gateway/router.js";
import { startService, type RunningService } from "../../node/service.js";
import { Api, collectedLogs, newWorkspace, startTestServers, testConfig, type TestServers } from "../helpers/servers.js";

const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; api: Api; workspaceId: string; agent: string; nc: NatsConnection; logs: Array<Record<string, unknown>> }>;
/** As the service's config in the tests (test/helpers/servers.ts). */
const PARTITIONS = 8;
const LEASE_TTL_MS = 1_000;

test.before(async (t) => {
  const servers = await startTestServers();
  // In this process: the test holds the service's event loop to put its leases in doubt.
  const { logs, log } = collectedLogs();
  const service = await startService(testConfig(servers, { RUNS_LEASE_TTL_MS: String(LEASE_TTL_MS) }), { log });
  const ws = await newWorkspace(service);
  const agent = await ws.api.agentWith({ model: "faux/scripted" });
  const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "lease-doubt-test" });
  t.context = { servers, service, api: ws.api, workspaceId: ws.id, agent, nc, logs };
});

test.after.always(async (t) => {
  await t.context.nc?.drain();
  await t.context.service?.close();
  await t.context.servers?.stop();
});

/** Holds this process (the service's event loop with it) for `ms`, as a CPU-starved or paused node is held. */
function holdEventLoop(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

test.serial("lease doubt - a start that reaches its owner while the partition's lease is in doubt is run once the lease is confirmed, not answered 503", async (t) => {
  t.timeout(60_000);
  const { api, agent, workspaceId, nc, logs } = t.context;
  const agentDoc = (await api.get(`/api/v1/agents/${agent}`)).body;
  // The router's connection, recording each reply it gets (the router only sends requests).
  const replies: CommandReply[] = [];
  const recording = {
    async request(subject: string, payload: Uint8Array, options: { timeout: number }) {
      const msg = await nc.request(subject, payload, options);
      replies.push(JSON.parse(new TextDecoder().decode(msg.data)) as CommandReply);
      return msg;
    },
  } as unknown as NatsConnection;
  const router = new CommandRouter({ nc: recording, partitions: PARTITIONS, retryMs: 5_000, log: pino({ level: "silent" }), clock: systemClock });
  // The owner's first answer must be "in doubt" for the test to say anything; whether the
  // command reaches it before the renewal sent on waking is confirmed is a race the
  // command nearly always wins (it is routed; the renewal is stored first). Bounded tries.
  let doubted = 0;
  for (let round = 0; round < 5 && doubted === 0; round++) {
    const start: Extract<RunCommand, { op: "start" }> = {
      op: "start", workspace_id: workspaceId, run_id: Ids.run(), turn_id: Ids.turn(), agent_id: agent,
      version: agentDoc.active_version, input: [{ type: "input_text", text: `round ${round}` }], tags: [], plan: "solo",
    };
    replies.length = 0;
    const logged = logs.length;
    const sent = router.send(start);
    // Past the lease's TTL without a renewal: on waking, the owner's lease is in doubt until one lands.
    holdEventLoop(LEASE_TTL_MS * 1.5);
    const reply = await sent;
    t.like(reply, { ok: true, run_id: start.run_id, turn_id: start.turn_id }, `round ${round}`);
    const run = await api.waitTurn(start.run_id, start.turn_id);
    t.is(run.turn.status, "completed");
    t.log(`round ${round}: ${JSON.stringify(replies.map((r) => (r.ok ? "ok" : r)))}`);
    if (replies[0] && "in_doubt" in replies[0]) {
      // Answered "in doubt" (not run), then asked again and run: the service said why.
      doubted++;
      t.true(logs.slice(logged).some((line) => line.msg === "lease in doubt: renewals unanswered for a TTL; holding event writes"), "the owner logged its doubt");
    }
  }
  t.true(doubted > 0, "a start reached its owner in doubt and was asked again");
});
