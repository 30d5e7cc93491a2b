/** API keys (decisions §2) in MongoDB: the key documents, and when each was last used. */
import type { Collection, Db, Filter } from "mongodb";
import type { ApiKeyDoc } from "./documents.js";
import { findEachById, guard, newestFirst } from "./mongo-guard.js";

export class ApiKeyStore {
  private readonly keys: Collection<ApiKeyDoc>;
  /**
   * `last_used_at` of keys, apart from the key documents: FerretDB updates are
   * read-modify-write, so a usage write must never race a revocation on one document.
   */
  private readonly usage: Collection<{ _id: string; last_used_at: number }>;

  constructor(db: Db) {
    this.keys = db.collection("api_keys");
    this.usage = db.collection("api_key_usage");
  }

  async provision(): Promise<void> {
    await this.keys.createIndex({ hash: 1 }, { unique: true, name: "hash_unique" });
    // The list's order, ties by id, so a page reads only itself (an older "ws_created" without _id may exist: unused).
    await this.keys.createIndex({ workspace_id: 1, created_at: -1, _id: -1 }, { name: "ws_created_id" });
  }

  insert(doc: ApiKeyDoc): Promise<unknown> {
    return guard(() => this.keys.insertOne(doc));
  }

  findByHash(hash: string): Promise<ApiKeyDoc | null> {
    return guard(() => this.keys.findOne({ hash }));
  }

  async get(workspaceId: string, id: string): Promise<ApiKeyDoc | null> {
    // By `_id` alone (the one filter FerretDB answers from its key), workspace checked here.
    const key = await guard(() => this.keys.findOne({ _id: id }));
    return key && key.workspace_id === workspaceId ? key : null;
  }

  /** The workspace's keys newest first, `limit` of them after `after` (the last of the page before), from the ws_created_id index. */
  list(workspaceId: string, limit: number, after?: { createdAt: number; id: string }): Promise<ApiKeyDoc[]> {
    const filter: Filter<ApiKeyDoc> = { workspace_id: workspaceId, ...newestFirst(after) };
    return guard(() => this.keys.find(filter).sort({ created_at: -1, _id: -1 }).limit(limit).toArray());
  }

  recordUse(id: string, atMs: number): Promise<unknown> {
    return guard(() => this.usage.updateOne({ _id: id }, { $set: { last_used_at: atMs } }, { upsert: true }));
  }

  /** `last_used_at` by key id, for rendering keys. */
  async lastUses(ids: string[]): Promise<Map<string, number>> {
    const docs = await findEachById(this.usage, ids);
    return new Map(docs.map((d) => [d._id, d.last_used_at]));
  }

  update(id: string, set: Partial<ApiKeyDoc>): Promise<unknown> {
    return guard(() => this.keys.updateOne({ _id: id }, { $set: set }));
  }
}
