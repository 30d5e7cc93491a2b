import anyTest, { type TestFn } from "ava";
import { MongoClient } from "mongodb";
import { startTestServers, type TestServers } from "./servers.js";

export interface StoreClients {
  servers: TestServers;
  /** Three clients with pools of 64, as three nodes would hold. */
  clients: MongoClient[];
}

/**
 * The file's test function, with servers of its own and three store clients opened
 * before its tests and closed after them.
 */
export function withStoreClients(): TestFn<StoreClients> {
  const test = anyTest as TestFn<StoreClients>;
  test.before(async (t) => {
    const servers = await startTestServers();
    const clients = [0, 1, 2].map(() => new MongoClient(servers.mongoUri, { maxPoolSize: 64 }));
    await Promise.all(clients.map((c) => c.connect()));
    t.context = { servers, clients };
  });
  test.after.always(async (t) => {
    await Promise.all((t.context.clients ?? []).map((c) => c.close()));
    await t.context.servers?.stop();
  });
  return test;
}
