import anyTest, { type TestFn } from "ava";
import { MongoClient, type Collection } from "mongodb";
import { startTestServers, type TestServers } from "../helpers/servers.js";
import { InsertBatcher } from "../../src/insert-batcher.js";
import { isDuplicateKey } from "../../src/mongo-guard.js";

interface Doc {
  _id: string;
  n: number;
}
interface Context {
  servers: TestServers;
  client: MongoClient;
  /** insert commands the driver sent, by collection */
  inserts: Map<string, number>;
}
const test = anyTest as TestFn<Context>;

test.before(async (t) => {
  const servers = await startTestServers();
  const client = new MongoClient(servers.mongoUri, { monitorCommands: true, maxPoolSize: 50 });
  await client.connect();
  const inserts = new Map<string, number>();
  client.on("commandStarted", (e) => {
    if (e.commandName === "insert") inserts.set(String(e.command.insert), (inserts.get(String(e.command.insert)) ?? 0) + 1);
  });
  t.context = { servers, client, inserts };
});

test.after.always(async (t) => {
  await t.context.client?.close();
  await t.context.servers?.stop();
});

function collection(t: { context: Context }, name: string): Collection<Doc> {
  return t.context.client.db(t.context.servers.dbName).collection<Doc>(name);
}

test("insert-batcher - concurrent inserts share commands and every document is stored", async (t) => {
  const c = collection(t, "batched");
  const batcher = new InsertBatcher(c);
  await Promise.all(Array.from({ length: 300 }, (_, n) => batcher.insert({ _id: `d${n}`, n })));
  t.is(await c.countDocuments({}), 300);
  const commands = t.context.inserts.get("batched") ?? 0;
  t.true(commands >= 2 && commands <= 10, `300 concurrent inserts took ${commands} insert commands`);
  // Alone, an insert is sent at once, as insertOne.
  await batcher.insert({ _id: "alone", n: -1 });
  t.is(t.context.inserts.get("batched"), commands + 1);
  t.deepEqual(await c.findOne({ _id: "alone" }), { _id: "alone", n: -1 });
});

test("insert-batcher - a duplicate fails only its own caller; the rest of its batch is stored", async (t) => {
  const c = collection(t, "duplicates");
  const batcher = new InsertBatcher(c);
  await c.insertMany([{ _id: "taken1", n: 0 }, { _id: "taken2", n: 0 }]);
  const ids = Array.from({ length: 60 }, (_, n) => (n === 17 ? "taken1" : n === 41 ? "taken2" : n === 50 ? "twice" : n === 51 ? "twice" : `fresh${n}`));
  // A first insert in flight makes the other 59 wait and go as one batch.
  const outcomes = await Promise.allSettled(ids.map((_id, n) => batcher.insert({ _id, n: n + 1 })));
  const refused = outcomes.flatMap((o, i) => (o.status === "rejected" ? [i] : []));
  t.deepEqual(refused, [17, 41, 51]);
  for (const i of refused) t.true(isDuplicateKey((outcomes[i] as PromiseRejectedResult).reason), `index ${i} is a duplicate-key error`);
  t.is(await c.countDocuments({}), 2 + 57);
  t.is((await c.findOne({ _id: "taken1" }))?.n, 0, "the stored document is untouched");
  t.is((await c.findOne({ _id: "twice" }))?.n, 51, "the first of two equal ids in a batch wins");
});

test("insert-batcher - a failed command fails every caller of its batch, later inserts go on", async (t) => {
  const c = collection(t, "failing");
  const batcher = new InsertBatcher(c);
  // A document the server cannot store ($-prefixed top-level field) fails the command or its own insert;
  // either way the callers learn of it and the batcher keeps working afterwards.
  const outcomes = await Promise.allSettled([
    batcher.insert({ _id: "ok1", n: 1 }),
    batcher.insert({ _id: "bad", n: 2, $bad: 1 } as unknown as Doc),
    batcher.insert({ _id: "ok2", n: 3 }),
  ]);
  t.is(outcomes[1]!.status, "rejected");
  await batcher.insert({ _id: "after", n: 4 });
  t.is((await c.findOne({ _id: "after" }))?.n, 4);
  t.is(await c.countDocuments({ _id: "bad" }), 0);
});
