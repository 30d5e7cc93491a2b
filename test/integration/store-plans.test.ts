import anyTest, { type ExecutionContext, type TestFn } from "ava";
import { MongoClient, type Document } from "mongodb";
import { startTestServers, type TestServers } from "../helpers/servers.js";
import { MongoStore, STORE_CLIENT_OPTIONS } from "../../src/mongo-store.js";
import { FencedError } from "../../src/contracts.js";
import { busyGraceMs } from "../../src/domain.js";
import { listRuns, type RunListFilters } from "../../src/run-list.js";
import type { RunDoc, TombstoneDoc, TurnDoc } from "../../src/documents.js";
import { FileStore } from "../../src/file-store.js";
import { ApiKeyStore } from "../../src/api-key-store.js";
import { Ids } from "../../src/ids.js";
import { EnvValues } from "../../src/env-values.js";
import { WebhookStore } from "../../src/webhooks.js";

/**
 * The hot reads are index-backed on the embedded store: the reads the service issues
 * (captured from the driver as they are sent) are explained by FerretDB, whose plan is
 * SQLite's EXPLAIN QUERY PLAN. Each must seek an index, scan no table, and, when it
 * pages in an order, take that order from the index (no temporary sort). A plan that
 * seeks `workspace_id = ?` reads no row of another workspace; `run_id = ?` none of
 * another run. Answers are checked against the documents too.
 */

interface Context {
  servers: TestServers;
  client: MongoClient;
  store: MongoStore;
  /** find commands the store sent, in order */
  finds: Document[];
  /** every command name the store sent, in order */
  sent: string[];
}
const test = anyTest as TestFn<Context>;

const WS = "ws_plans";
const OTHER = "ws_other";
const RUNS = 300;
const TURNS = 40;
const T0 = 1_764_000_000_000;

const embedded = !process.env.RUNS_TEST_MONGODB_URI;

function run(i: number, workspaceId: string): RunDoc {
  return {
    _id: `run_${workspaceId}_${String(i).padStart(5, "0")}`,
    workspace_id: workspaceId,
    agent_id: i % 3 === 0 ? "agt_three" : "agt_other",
    agent_version: 1,
    versions: [1],
    partition: i % 8,
    state: i % 10 === 0 ? "busy" : "idle",
    tags: i % 50 === 0 ? ["rare", "common"] : ["common"],
    plan: "solo",
    retention_s: 3600,
    event_retention_s: 3600,
    created_at: T0 + i,
    // Every fourth pair shares an activity time: the page order falls back to _id.
    last_activity_at: T0 + Math.floor(i / 2) * 1000,
    expires_at: i % 7 === 0 ? T0 : T0 + 10_000_000,
    epoch: 1,
    turn_count: 1,
    latest_turn_id: `turn_${i}`,
    active_turn_id: null,
    queued_turn_id: null,
    event_seq: 0,
    pending_action: null,
  };
}

function turn(runId: string, index: number): TurnDoc {
  return { _id: `${runId}_t${index}`, run_id: runId, workspace_id: WS, index, status: "completed" } as TurnDoc;
}

test.before(async (t) => {
  const servers = await startTestServers();
  const client = new MongoClient(servers.mongoUri, { monitorCommands: true, maxPoolSize: 8, ...STORE_CLIENT_OPTIONS });
  const finds: Document[] = [];
  const sent: string[] = [];
  client.on("commandStarted", (e) => {
    sent.push(e.commandName);
    if (e.commandName === "find") finds.push(e.command);
  });
  const store = await MongoStore.over(client, servers.dbName);
  await store.provision();
  const db = client.db(servers.dbName);
  await db.collection<RunDoc>("runs").insertMany([...Array(RUNS).keys()].flatMap((i) => [run(i, WS), run(i, OTHER)]));
  const turns: TurnDoc[] = [];
  for (const r of [run(1, WS), run(2, WS), run(1, OTHER)]) for (let k = 0; k < TURNS; k++) turns.push(turn(r._id, k));
  await db.collection<TurnDoc>("turns").insertMany(turns);
  t.context = { servers, client, store, finds, sent };
});

test.after.always(async (t) => {
  await t.context.store?.close();
  await t.context.servers?.stop();
});

/** The find commands `read` sends, each explained by the store. */
async function plansOf(t: ExecutionContext<Context>, read: () => Promise<unknown>): Promise<Array<{ command: Document; plan: string[]; sortPushdown: boolean }>> {
  const from = t.context.finds.length;
  await read();
  const sent = t.context.finds.slice(from);
  t.true(sent.length > 0, "the read sent a find");
  const db = t.context.client.db(t.context.servers.dbName);
  const out = [];
  for (const command of sent) {
    const { find, filter, sort, limit } = command;
    const explained = await db.command({ explain: { find, filter, ...(sort ? { sort } : {}), ...(limit ? { limit } : {}) } });
    out.push({ command, plan: (explained.queryPlanner?.Plan ?? []) as string[], sortPushdown: explained.sortPushdown === true });
  }
  return out;
}

function assertIndexBacked(t: ExecutionContext<Context>, explained: Array<{ command: Document; plan: string[]; sortPushdown: boolean }>, index: string, ordered: boolean): void {
  for (const { command, plan, sortPushdown } of explained) {
    const what = `${JSON.stringify(command.filter)} → ${plan.join(" | ")}`;
    t.true(plan.some((line) => /SEARCH \S+ USING (COVERING )?INDEX \S+_\S*?/.test(line) && line.includes(`_${index} `)), `seeks ${index}: ${what}`);
    // json_each over one run's tags shows as a scan of a virtual table: not of the collection.
    t.false(plan.some((line) => /\bSCAN\b/.test(line) && !/VIRTUAL TABLE/.test(line)), `no scan: ${what}`);
    if (ordered) {
      t.false(plan.some((line) => line.includes("TEMP B-TREE")), `order from the index: ${what}`);
      t.true(sortPushdown, `sort pushed down: ${what}`);
    }
  }
}

const expectedPage = (filter: (r: RunDoc) => boolean, after?: RunDoc) =>
  [...Array(RUNS).keys()]
    .map((i) => run(i, WS))
    .filter(filter)
    .sort((a, b) => b.last_activity_at - a.last_activity_at || (a._id < b._id ? 1 : -1))
    .filter((r) => !after || r.last_activity_at < after.last_activity_at || (r.last_activity_at === after.last_activity_at && r._id < after._id));

const listCases: Array<{ name: string; filters: RunListFilters; keep: (r: RunDoc) => boolean }> = [
  { name: "no filter", filters: { tags: [] }, keep: () => true },
  { name: "state", filters: { tags: [], state: "busy" }, keep: (r) => r.state === "busy" },
  { name: "agent", filters: { tags: [], agentId: "agt_three" }, keep: (r) => r.agent_id === "agt_three" },
  { name: "common tag", filters: { tags: ["common"] }, keep: (r) => r.tags.includes("common") },
  { name: "rare tag", filters: { tags: ["rare"] }, keep: (r) => r.tags.includes("rare") },
];

for (const { name, filters, keep } of listCases) {
  test.serial(`store plans - list runs (${name}): two pages seek the workspace's activity index, in order, and answer right`, async (t) => {
    if (!embedded) return t.pass("plans are the embedded store's (RUNS_TEST_MONGODB_URI set)");
    const { store } = t.context;
    let first!: Awaited<ReturnType<typeof listRuns>>;
    const plans1 = await plansOf(t, async () => {
      first = await listRuns(store, { workspaceId: WS, filters, limit: 7, scanLimit: 1000 });
    });
    t.deepEqual(first.runs.map((r) => r._id), expectedPage(keep).slice(0, 7).map((r) => r._id));
    const last = first.runs.at(-1)!;
    let second!: Awaited<ReturnType<typeof listRuns>>;
    const plans2 = await plansOf(t, async () => {
      second = await listRuns(store, { workspaceId: WS, filters, limit: 7, scanLimit: 1000, after: { lastActivityAt: last.last_activity_at, id: last._id } });
    });
    t.deepEqual(second.runs.map((r) => r._id), expectedPage(keep, last).slice(0, 7).map((r) => r._id));
    assertIndexBacked(t, [...plans1, ...plans2], "ws_activity", true);
  });
}

test.serial("store plans - a tag filter is the store's: one find with the tags in it, the page and no more", async (t) => {
  const { store } = t.context;
  t.true(store.tagFiltersInStore);
  const plans = await plansOf(t, () => listRuns(store, { workspaceId: WS, filters: { tags: ["common", "rare"] }, limit: 5, scanLimit: 10 }));
  t.is(plans.length, 1);
  t.deepEqual(plans[0]!.command.filter.tags, { $all: ["common", "rare"] });
  t.is(plans[0]!.command.limit, 6);
});

test.serial("store plans - on stock FerretDB, a tag filter past its first reads: a rare tag answers from the tag index, common tags read on, a page it cannot fill is refused; answers as the documents say", async (t) => {
  const client = new MongoClient(t.context.servers.mongoUri, { maxPoolSize: 4, ...STORE_CLIENT_OPTIONS });
  const store = await MongoStore.over(client, t.context.servers.dbName, { tagFiltersInStore: false });
  t.teardown(() => store.close());
  // 300 runs carry "common": over a scan limit of 200 it is common, under 1000 rare.
  for (const { filters, keep, scanLimit } of [
    { filters: { tags: ["rare"] }, keep: (r: RunDoc) => r.tags.includes("rare"), scanLimit: 1000 },
    { filters: { tags: ["common"], state: "busy" as const }, keep: (r: RunDoc) => r.state === "busy", scanLimit: 200 },
  ]) {
    const first = await listRuns(store, { workspaceId: WS, filters, limit: 3, scanLimit, quickScan: 5 });
    t.deepEqual(first.runs.map((r) => r._id), expectedPage(keep).slice(0, 3).map((r) => r._id), JSON.stringify(filters));
    t.true(first.hasMore);
    const last = first.runs.at(-1)!;
    const second = await listRuns(store, { workspaceId: WS, filters, limit: 3, scanLimit, quickScan: 5, after: { lastActivityAt: last.last_activity_at, id: last._id } });
    t.deepEqual(second.runs.map((r) => r._id), expectedPage(keep, last).slice(0, 3).map((r) => r._id), JSON.stringify(filters));
  }
  // "common" alone: more than a scan limit of 200 carry it; a page of 250 cannot be filled from 200 runs.
  const refused = await listRuns(store, { workspaceId: WS, filters: { tags: ["common"] }, limit: 250, scanLimit: 200, quickScan: 5 }).catch((err: unknown) => err);
  t.like(refused, { status: 400, code: "invalid_request", param: "tag" });
});

test.serial("store plans - turn history and session load seek the run's turns in index order", async (t) => {
  if (!embedded) return t.pass("plans are the embedded store's (RUNS_TEST_MONGODB_URI set)");
  const { store } = t.context;
  const runId = run(1, WS)._id;
  let session!: TurnDoc[];
  const sessionPlans = await plansOf(t, async () => {
    session = await store.listTurns(runId, { withTranscript: true });
  });
  t.deepEqual(session.map((d) => d.index), [...Array(TURNS).keys()]);
  let page!: TurnDoc[];
  const historyPlans = await plansOf(t, async () => {
    page = await store.listTurns(runId, { afterIndex: 9, limit: 5 });
  });
  t.deepEqual(page.map((d) => d.index), [10, 11, 12, 13, 14]);
  t.true(page.every((d) => d.run_id === runId));
  assertIndexBacked(t, [...sessionPlans, ...historyPlans], "run_order", true);
});

test.serial("store plans - expiry sweep and orphan check seek their partitions", async (t) => {
  if (!embedded) return t.pass("plans are the embedded store's (RUNS_TEST_MONGODB_URI set)");
  const { store } = t.context;
  let expired!: Array<Pick<RunDoc, "_id" | "partition">>;
  const sweepPlans = await plansOf(t, async () => {
    expired = await store.expiredRunsIn([0, 3], T0 + 1, 12 * 3600_000);
  });
  // Past retention and not busy (a busy run expires only past the turn limit too: domain.ts runExpired).
  const past = (busyToo: boolean) => [WS, OTHER].flatMap((ws) => [...Array(RUNS).keys()].filter((i) => i % 7 === 0 && (busyToo || i % 10 !== 0) && [0, 3].includes(i % 8)).map((i) => run(i, ws)._id));
  t.deepEqual(expired.map((r) => r._id).sort(), past(false).sort());
  let all!: Array<Pick<RunDoc, "_id" | "partition">>;
  const graceTurnLimit = 1_000_000; // the grace ends before the other runs' retention (T0 + 10,000,000)
  const lateSweepPlans = await plansOf(t, async () => {
    all = await store.expiredRunsIn([0, 3], T0 + busyGraceMs(graceTurnLimit), graceTurnLimit);
  });
  t.deepEqual(all.map((r) => r._id).sort(), past(true).sort());
  assertIndexBacked(t, lateSweepPlans, "partition_expires", false);
  let busy!: Array<Pick<RunDoc, "_id" | "partition" | "epoch">>;
  const orphanPlans = await plansOf(t, async () => {
    busy = await store.busyRunsIn([0, 5]);
  });
  const wantBusy = [WS, OTHER].flatMap((ws) => [...Array(RUNS).keys()].filter((i) => i % 10 === 0 && [0, 5].includes(i % 8)).map((i) => run(i, ws)._id));
  t.deepEqual(busy.map((r) => r._id).sort(), wantBusy.sort());
  assertIndexBacked(t, sweepPlans, "partition_expires", false);
  assertIndexBacked(t, orphanPlans, "partition_state", false);
});

test.serial("store plans - the check of removed runs' parts seeks its partitions' due tombstones; a tombstone from before they were kept is never due", async (t) => {
  const { store, client, servers } = t.context;
  const tombstones = client.db(servers.dbName).collection<TombstoneDoc>("tombstones");
  const docs: TombstoneDoc[] = [...Array(RUNS).keys()].map((i) => ({
    _id: `run_gone_${String(i).padStart(5, "0")}`,
    workspace_id: i % 2 ? WS : OTHER,
    reason: "deleted",
    at: T0,
    expires_at: T0 + 10_000_000,
    // Every tenth from before the parts were kept; every third checked already.
    ...(i % 10 === 0 ? {} : { partition: i % 8, plan: "solo" as const, ...(i % 3 === 0 ? {} : { parts_due_at: T0 + (i % 5) * 1000 }) }),
  }));
  await tombstones.insertMany(docs);
  let due!: TombstoneDoc[];
  const plans = await plansOf(t, async () => {
    due = await store.tombstonesDueIn([0, 3], T0 + 2000, 1_000);
  });
  const want = docs.filter((d) => d.partition !== undefined && [0, 3].includes(d.partition) && d.parts_due_at !== undefined && d.parts_due_at <= T0 + 2000);
  t.true(want.length > 10);
  t.deepEqual(due.map((d) => d._id).sort(), want.map((d) => d._id).sort());
  await store.setPartsDue(want[0]!._id, null);
  await store.setPartsDue(want[1]!._id, T0 + 5000);
  t.deepEqual((await store.tombstonesDueIn([0, 3], T0 + 2000, 1_000)).map((d) => d._id).sort(), want.slice(2).map((d) => d._id).sort(), "marked gone, or put off");
  t.false("parts_due_at" in (await tombstones.findOne({ _id: want[0]!._id }))!);
  if (embedded) assertIndexBacked(t, plans, "partition_parts_due", false);
});

test.serial("store plans - a fenced write is one conditional update (the build's FerretDB reads `_id` beside the epoch from the key); a stale epoch is refused", async (t) => {
  const { store, sent } = t.context;
  const id = run(3, WS)._id;
  const from = sent.length;
  await store.updateRunFenced(id, 1, { state: "idle" });
  t.deepEqual(sent.slice(from), ["update"]);
  await t.throwsAsync(store.updateRunFenced(id, 0, { state: "busy" }), { instanceOf: FencedError });
  t.is((await store.getRun(id))?.state, "idle");
  if (embedded) {
    const explained = await t.context.client.db(t.context.servers.dbName).command({ explain: { find: "runs", filter: { _id: id, epoch: 1 } } });
    t.true((explained.queryPlanner.Plan as string[]).some((line) => /SEARCH \S+ USING INDEX \S+__id_ /.test(line)), JSON.stringify(explained.queryPlanner));
  }
});

test.serial("store plans - the files an input names and the keys' last uses are read by `_id`: each read seeks the `_id` index and reads no other workspace's files or other keys' uses", async (t) => {
  const { client, servers } = t.context;
  const db = client.db(servers.dbName);
  const files = new FileStore(db, null as never, { nowMs: () => T0 } as never, Ids);
  await files.provision();
  const file = (i: number, workspaceId: string) => ({ _id: `file_${workspaceId}_${i}`, workspace_id: workspaceId, object_name: `file_${workspaceId}_${i}`, filename: "a.txt", media_type: "text/plain", bytes: 1, sha256: "", created_at: T0 + i, expires_at: i % 5 === 0 ? T0 - 1 : T0 + 1_000 });
  await files.files.insertMany([...Array(RUNS).keys()].flatMap((i) => [file(i, WS), file(i, OTHER)]) as never);
  const ids = [`file_${WS}_1`, `file_${WS}_2`, `file_${WS}_1`, `file_${OTHER}_3`, `file_${WS}_5`, "file_absent"];
  let got!: string[];
  const filePlans = await plansOf(t, async () => {
    got = (await files.getMany(WS, ids)).map((f) => f._id).sort();
  });
  t.deepEqual(got, [`file_${WS}_1`, `file_${WS}_2`], "the workspace's unexpired ones, each once");
  t.is(filePlans.length, 5, "one read per distinct id");

  const keys = new ApiKeyStore(db);
  const usage = db.collection<{ _id: string; last_used_at: number }>("api_key_usage");
  await usage.insertMany([...Array(RUNS).keys()].map((i) => ({ _id: `key_${i}`, last_used_at: T0 + i })));
  let uses!: Map<string, number>;
  const keyPlans = await plansOf(t, async () => {
    uses = await keys.lastUses(Array.from({ length: 40 }, (_, i) => `key_${i * 2}`).concat(["key_absent"]));
  });
  t.is(uses.size, 40);
  t.is(uses.get("key_38"), T0 + 38);
  t.is(keyPlans.length, 41);
  if (embedded) {
    assertIndexBacked(t, filePlans, "_id_", false);
    assertIndexBacked(t, keyPlans, "_id_", false);
  }
});

test.serial("store plans - a page of API keys seeks the workspace's key index in list order, first and later pages, and answers right", async (t) => {
  const { store, client, servers } = t.context;
  const keys = client.db(servers.dbName).collection<{ _id: string }>("api_keys");
  const key = (i: number, workspaceId: string) => ({ _id: `key_${workspaceId}_${String(i).padStart(4, "0")}`, workspace_id: workspaceId, hash: `h_${workspaceId}_${i}`, key_prefix: "rk_live_xxxx", label: null, scopes: ["run:read"], mode: "live", created_at: T0 + Math.floor(i / 2), revoked_at: null, last_used_at: null });
  await keys.insertMany([...Array(RUNS).keys()].flatMap((i) => [key(i, WS), key(i, OTHER)]));
  let first!: Awaited<ReturnType<typeof store.keys.list>>;
  let second!: Awaited<ReturnType<typeof store.keys.list>>;
  const plans = await plansOf(t, async () => {
    first = await store.keys.list(WS, 21);
    // The cut falls inside a tie (each pair of keys shares created_at): the next page goes on by id.
    const last = first[18]!;
    second = await store.keys.list(WS, 21, { createdAt: last.created_at, id: last._id });
  });
  t.is(first[18]!.created_at, first[19]!.created_at, "a tie at the cut");
  const want = [...Array(RUNS).keys()].map((i) => key(i, WS)).sort((a, b) => b.created_at - a.created_at || (a._id < b._id ? 1 : -1)).map((k) => k._id);
  t.deepEqual(first.map((k) => k._id), want.slice(0, 21));
  t.deepEqual(second.map((k) => k._id), want.slice(19, 40));
  if (embedded) assertIndexBacked(t, plans, "ws_created_id", true);
});

test.serial("store plans - pages of agents and of an agent's deployments seek their indexes in list order, first and later pages, and answer right", async (t) => {
  const { store, client, servers } = t.context;
  const db = client.db(servers.dbName);
  const agent = (i: number, workspaceId: string) => ({ _id: `agt_${workspaceId}_${String(i).padStart(4, "0")}`, workspace_id: workspaceId, name: `a${i}`, description: null, active_version: null, created_at: T0 + Math.floor(i / 2) });
  await db.collection<{ _id: string }>("agents").insertMany([...Array(RUNS).keys()].flatMap((i) => [agent(i, WS), agent(i, OTHER)]));
  const deployment = (agentId: string, version: number) => ({ _id: `${agentId}:${version}`, agent_id: agentId, version, status: "ready", created_at: T0 + version });
  await db.collection<{ _id: string }>("deployments").insertMany([...Array(RUNS).keys()].flatMap((i) => [deployment("agt_plans", i + 1), deployment("agt_other", i + 1)]));
  let agents: Array<{ _id: string }> = [];
  let deployments: Array<{ version: number }> = [];
  const agentPlans = await plansOf(t, async () => {
    const first = await store.listAgents(WS, 21);
    // The cut falls inside a tie (each pair shares created_at).
    const last = first[18]!;
    t.is(last.created_at, first[19]!.created_at, "a tie at the cut");
    agents = [...first.slice(0, 19), ...(await store.listAgents(WS, 21, { createdAt: last.created_at, id: last._id }))];
  });
  const deploymentPlans = await plansOf(t, async () => {
    deployments = [...(await store.listDeployments("agt_plans", 20)), ...(await store.listDeployments("agt_plans", 20, 20))];
  });
  const want = [...Array(RUNS).keys()].map((i) => agent(i, WS)).sort((a, b) => b.created_at - a.created_at || (a._id < b._id ? 1 : -1)).map((a) => a._id);
  t.deepEqual(agents.map((a) => a._id), want.slice(0, 40));
  t.deepEqual(deployments.map((d) => d.version), Array.from({ length: 40 }, (_, i) => i + 1));
  if (embedded) {
    assertIndexBacked(t, agentPlans, "ws_created_id", true);
    assertIndexBacked(t, deploymentPlans, "agent_version", true);
  }
});

test.serial("store plans - pages of environment values and of a webhook's delivery log, and a new deployment's look-up of the last version, seek their indexes in order", async (t) => {
  const { store, client, servers } = t.context;
  const db = client.db(servers.dbName);
  const master = Buffer.alloc(32, 3).toString("base64");
  const clock = { nowMs: () => T0 } as never;
  const values = new EnvValues(db, master, clock);
  await values.provision();
  const value = (i: number, workspaceId: string) => ({ _id: `${workspaceId}:V${String(i).padStart(4, "0")}`, workspace_id: workspaceId, name: `V${String(i).padStart(4, "0")}`, sealed: "", created_at: T0, updated_at: T0 });
  await db.collection<{ _id: string }>("env_values").insertMany([...Array(RUNS).keys()].flatMap((i) => [value(i, WS), value(i, OTHER)]));
  const webhooks = new WebhookStore(db, master, clock, Ids);
  await webhooks.provision();
  const delivery = (i: number, webhookId: string) => ({ _id: `whd_${webhookId}_${String(i).padStart(4, "0")}`, webhook_id: webhookId, created_at: T0 + Math.floor(i / 2), status: "delivered", partition: 0 });
  await db.collection<{ _id: string }>("webhook_deliveries").insertMany([...Array(RUNS).keys()].flatMap((i) => [delivery(i, "wh_plans"), delivery(i, "wh_other")]));

  let names: string[] = [];
  const valuePlans = await plansOf(t, async () => {
    const first = await values.list(WS, 21);
    names = [...first.slice(0, 20), ...(await values.list(WS, 21, first[19]!.name))].map((v) => v.name);
  });
  t.deepEqual(names, [...Array(41).keys()].map((i) => `V${String(i).padStart(4, "0")}`));
  let deliveries: string[] = [];
  const deliveryPlans = await plansOf(t, async () => {
    const first = await webhooks.listDeliveries("wh_plans", 21);
    // The cut falls inside a tie (each pair shares created_at).
    const last = first[18]!;
    t.is(last.created_at, first[19]!.created_at, "a tie at the cut");
    deliveries = [...first.slice(0, 19), ...(await webhooks.listDeliveries("wh_plans", 21, { createdAt: last.created_at, id: last._id }))].map((d) => d._id);
  });
  const want = [...Array(RUNS).keys()].map((i) => delivery(i, "wh_plans")).sort((a, b) => b.created_at - a.created_at || (a._id < b._id ? 1 : -1)).map((d) => d._id);
  t.deepEqual(deliveries, want.slice(0, 40));
  // An agent with 300 versions: the next one is 301, its last found from the index.
  await db.collection<{ _id: string }>("deployments").insertMany([...Array(RUNS).keys()].flatMap((i) => [{ _id: `agt_deploy:${i + 1}`, agent_id: "agt_deploy", version: i + 1 }, { _id: `agt_deploy_other:${i + 1}`, agent_id: "agt_deploy_other", version: i + 1 }]));
  const deployPlans = await plansOf(t, async () => {
    const made = await store.insertDeployment({ agent_id: "agt_deploy", status: "building", config: {}, upgrade_policy: "automatic", created_at: T0 } as never);
    t.is(made.version, RUNS + 1);
  });
  if (embedded) {
    assertIndexBacked(t, valuePlans, "ws_name", true);
    assertIndexBacked(t, deliveryPlans, "webhook_created_id", true);
    assertIndexBacked(t, deployPlans, "agent_version", true);
  }
});
