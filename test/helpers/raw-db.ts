import { type Collection, type Db, MongoClient } from "mongodb";
import type { IdempotencyDoc, RunDoc, TombstoneDoc, TurnDoc } from "../../src/documents.js";
import { STORE_CLIENT_OPTIONS } from "../../src/mongo-store.js";

/**
 * A test's own connection to the service's database, for looking at documents as the
 * database holds them and for injecting faults (a turn left in a state, a document
 * moved). The store adapter keeps its collections private; nothing here goes through it,
 * but documents are read with the store's client options (arrays under any key come back
 * as arrays, as the service reads them).
 */
export interface RawDb {
  db: Db;
  runs: Collection<RunDoc>;
  turns: Collection<TurnDoc>;
  idempotency: Collection<IdempotencyDoc>;
  tombstones: Collection<TombstoneDoc>;
  close(): Promise<void>;
}

export async function openRawDb(uri: string, dbName: string): Promise<RawDb> {
  const client = new MongoClient(uri, { serverSelectionTimeoutMS: 10_000, maxPoolSize: 4, ...STORE_CLIENT_OPTIONS });
  await client.connect();
  const db = client.db(dbName);
  return {
    db,
    runs: db.collection("runs"),
    turns: db.collection("turns"),
    idempotency: db.collection("idempotency"),
    tombstones: db.collection("tombstones"),
    close: () => client.close(),
  };
}
