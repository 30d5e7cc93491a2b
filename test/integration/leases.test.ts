import anyTest, { type TestFn } from "ava";
import pino from "pino";
import { connectNats, provisionNats, type NatsResources } from "../../src/nats.js";
import { MongoStore } from "../../src/mongo-store.js";
import { FencedError } from "../../src/contracts.js";
import { PartitionLeases } from "../../actors/partition-leases.js";
import { systemClock } from "../../src/clock.js";
import { startTestServers, type TestServers } from "../helpers/servers.js";
import type { RunDoc } from "../../src/documents.js";

const test = anyTest as TestFn<{ servers: TestServers; nats: NatsResources; store: MongoStore }>;
const log = pino({ level: "silent" });
const retention = { runS: { solo: 3600, business: 3600 }, eventS: { solo: 3600, business: 3600 } };

test.before(async (t) => {
  const servers = await startTestServers();
  const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "leases-test" });
  const nats = await provisionNats(nc, retention);
  const store = await MongoStore.connect(servers.mongoUri, "leases_test");
  await store.provision();
  t.context = { servers, nats, store };
});

test.after.always(async (t) => {
  await t.context.store?.close();
  await t.context.nats?.nc.drain();
  await t.context.servers?.stop();
});

function leases(t: { context: { nats: NatsResources } }, node: string, ttlMs: number, held: Map<number, number>) {
  return new PartitionLeases(
    t.context.nats.leases,
    t.context.nats.nodes,
    node,
    4,
    ttlMs,
    systemClock,
    {
      gained: (p, epoch) => void held.set(p, epoch),
      lost: (p) => void held.delete(p),
      isIdle: () => true,
    },
    log,
  );
}

test.serial("leases - one owner per partition; a lapsed owner's partitions go to another node with a higher epoch", async (t) => {
  const heldA = new Map<number, number>();
  const heldB = new Map<number, number>();
  const a = leases(t, "node-a", 1_000, heldA);
  await a.start();
  t.is(heldA.size, 4, "alone, node-a claims every partition");
  const b = leases(t, "node-b", 1_000, heldB);
  await b.start();
  // Node b sees node a's live leases and takes nothing it does not own by placement.
  for (const p of heldB.keys()) t.false(heldA.has(p) && heldB.has(p));
  // Node a stops renewing (as if paused); its leases lapse and b takes them all.
  await a.stop();
  const epochsA = new Map(heldA);
  for (let i = 0; i < 60 && heldB.size < 4; i++) {
    await new Promise((r) => setTimeout(r, 100));
    await b.tick();
  }
  t.is(heldB.size, 4);
  for (const [p, epoch] of epochsA) t.true(heldB.get(p)! > epoch, `partition ${p}: epoch rose`);
  await b.stop();
  await b.releaseAll();
  t.is(heldB.size, 0);
});

test.serial("fencing - a write with a stale epoch matches nothing once a newer owner claimed the run", async (t) => {
  const { store } = t.context;
  const now = Date.now();
  const run: RunDoc = {
    _id: `run_fence_${now}`,
    workspace_id: "ws_x",
    agent_id: "agt_x",
    agent_version: 1,
    versions: [1],
    partition: 0,
    state: "idle",
    tags: [],
    plan: "solo",
    retention_s: 60,
    event_retention_s: 60,
    created_at: now,
    last_activity_at: now,
    expires_at: now + 60_000,
    epoch: 5,
    turn_count: 1,
    latest_turn_id: "turn_x",
    active_turn_id: null,
    queued_turn_id: null,
    event_seq: 0,
  };
  await store.insertRunOnce(run);
  await store.updateRunFenced(run._id, 5, { tags: ["ok"] });
  t.truthy(await store.claimRun(run._id, 9), "the newer owner claims it");
  t.is(await store.claimRun(run._id, 7), null, "an older epoch cannot claim it back");
  await t.throwsAsync(store.updateRunFenced(run._id, 5, { tags: ["stale"] }), { instanceOf: FencedError });
  t.deepEqual((await store.getRun(run._id))!.tags, ["ok"]);
});
