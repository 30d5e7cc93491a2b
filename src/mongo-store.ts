import { MongoClient, type Collection, type Db, type Document, type Filter, type UpdateFilter } from "mongodb";
import {
  type AgentDoc,
  type DeploymentDoc,
  DeploymentStatus,
  type IdempotencyDoc,
  type RunDoc,
  type TombstoneDoc,
  type TurnDoc,
  type WorkspaceDoc,
} from "./documents.js";
import { busyGraceMs, RunState } from "./domain.js";
import { InsertBatcher } from "./insert-batcher.js";
import { UpdateBatcher } from "./update-batcher.js";
import { FreshReads } from "./fresh-reads.js";
import { loadedTurn, storedTurnFields } from "./stored-json.js";
import { ApiKeyStore } from "./api-key-store.js";
import { FencedError, type RunStore } from "./contracts.js";
import { deleteOldest, guard, insertOnce, isDuplicateKey, newestFirst, StoreUnavailableError, SWEEP_BATCH } from "./mongo-guard.js";

/**
 * Options every MongoClient of the store needs. The driver hands js-bson `fieldsAsRaw: {}`
 * by default, and js-bson looks each array field's name up in it, prototype included: an
 * array under a key such as `constructor` or `toString` (a model's tool call may use any
 * key) was read back as raw BSON buffers. An object without a prototype names no field.
 */
export const STORE_CLIENT_OPTIONS = { fieldsAsRaw: Object.freeze(Object.create(null)) as Record<string, boolean> };

/**
 * MongoDB adapter for every durable document. Works on MongoDB and on FerretDB:
 * no transactions, no TTL indexes, and only inserts rely on unique indexes.
 */
export class MongoStore implements RunStore {
  /** API keys and their use (src/api-key-store.ts). */
  readonly keys: ApiKeyStore;
  // The collections are this adapter's own: every read and write goes through a method
  // that translates driver failures (src/mongo-guard.ts). Tests that must look at or
  // tamper with documents open their own connection (test/helpers/raw-db.ts).
  private readonly workspaces: Collection<WorkspaceDoc>;
  private readonly agents: Collection<AgentDoc>;
  private readonly deployments: Collection<DeploymentDoc>;
  private readonly runs: Collection<RunDoc>;
  private readonly turns: Collection<TurnDoc>;
  private readonly idempotency: Collection<IdempotencyDoc>;
  private readonly tombstones: Collection<TombstoneDoc>;
  /** Admission's inserts, group-committed: many concurrent starts share one command. */
  private readonly runInserts: InsertBatcher<RunDoc>;
  private readonly turnInserts: InsertBatcher<TurnDoc>;
  private readonly idempotencyInserts: InsertBatcher<IdempotencyDoc>;
  /**
   * The writes that end a turn (the turn final, the run moved on, the key's record done),
   * group-committed where the store commits a bulk's updates together (see
   * {@link UpdateBatcher}); undefined on stock FerretDB, whose bulks commit each
   * statement alone and hold a pooled connection per statement until they end.
   */
  private readonly runUpdates?: UpdateBatcher<RunDoc>;
  private readonly turnUpdates?: UpdateBatcher<TurnDoc>;
  private readonly idempotencyUpdates?: UpdateBatcher<IdempotencyDoc>;
  /** Agents by id, read once for all the starts and continuations that ask at once (every one still sees an activation made before it asked). */
  private readonly agentReads: FreshReads<AgentDoc | null>;

  private constructor(
    private readonly client: MongoClient,
    /** The database, for the adapters of its other collections (files, environment values), composed at the root. */
    readonly db: Db,
    /**
     * Stock FerretDB (SQLite) answers only a bare `_id` filter from its key; any other
     * filter scans the collection (measured: 2.6 ms vs 530 ms at 5,000 turns). On it,
     * fenced writes read the fencing field by `_id`, check it here, and write by `_id`
     * alone. On MongoDB, and on the FerretDB this project builds (its patch reads `_id`
     * beside other conditions from the key: deploy/tools/README.md), the condition stays
     * in the write's filter: one command. (FerretDB's updates read, then write, either
     * way; only the owning actor writes a run or its turns, so that window matters only
     * against a stale owner, which the lease has already fenced off.)
     */
    readonly idOnlyFilters: boolean,
    /**
     * The store finds the runs carrying given tags without decoding every run it passes:
     * MongoDB from its multikey index (`ws_tags_activity`), the FerretDB this project
     * builds by looking into the arrays in SQL (its patch). Stock FerretDB decodes each
     * run it reads; there a tag list reads a bounded number of runs (listRuns).
     */
    readonly tagFiltersInStore: boolean,
    /** Bulk updates commit together: MongoDB, and the FerretDB this project builds (`updateBatch`). */
    batchUpdates: boolean,
  ) {
    this.workspaces = db.collection("workspaces");
    this.keys = new ApiKeyStore(db);
    this.agents = db.collection("agents");
    this.deployments = db.collection("deployments");
    this.runs = db.collection("runs");
    this.turns = db.collection("turns");
    this.idempotency = db.collection("idempotency");
    this.tombstones = db.collection("tombstones");
    this.runInserts = new InsertBatcher(this.runs);
    this.turnInserts = new InsertBatcher(this.turns);
    this.idempotencyInserts = new InsertBatcher(this.idempotency);
    this.agentReads = new FreshReads((id) => guard(() => this.agents.findOne({ _id: id })));
    if (batchUpdates && !idOnlyFilters) {
      this.runUpdates = new UpdateBatcher(this.runs);
      this.turnUpdates = new UpdateBatcher(this.turns);
      this.idempotencyUpdates = new UpdateBatcher(this.idempotency);
    }
  }

  static async connect(uri: string, dbName: string): Promise<MongoStore> {
    const client = new MongoClient(uri, {
      serverSelectionTimeoutMS: 3_000,
      connectTimeoutMS: 3_000,
      maxPoolSize: 50,
      ...STORE_CLIENT_OPTIONS,
    });
    return MongoStore.over(client, dbName);
  }

  /**
   * The store over a client made elsewhere (tests watch its commands), which must have
   * {@link STORE_CLIENT_OPTIONS}; connects it, and closes it when its first commands fail.
   * `assume` overrides what the server's build info says it can do (tests of the paths for
   * stock FerretDB).
   */
  static async over(client: MongoClient, dbName: string, assume: { tagFiltersInStore?: boolean; batchUpdates?: boolean } = {}): Promise<MongoStore> {
    const raw = client.bsonOptions.fieldsAsRaw;
    if (!raw || Object.getPrototypeOf(raw) !== null) throw new Error("the store's MongoClient must be made with STORE_CLIENT_OPTIONS (fieldsAsRaw without a prototype)");
    let info;
    try {
      await client.connect();
      info = await client.db("admin").command({ buildInfo: 1 });
    } catch (err) {
      // A client left open keeps monitoring its servers, and the process alive.
      await client.close().catch(() => undefined);
      throw err;
    }
    const ferretDb = typeof info.ferretdbVersion === "string";
    const features = info.ferretdbFeatures ?? {};
    return new MongoStore(
      client,
      client.db(dbName),
      ferretDb && features.typedIndexPushdown !== true,
      assume.tagFiltersInStore ?? (!ferretDb || features.arrayMemberPushdown === true),
      assume.batchUpdates ?? (!ferretDb || features.updateBatch === true),
    );
  }

  async close(): Promise<void> {
    await this.client.close();
  }

  async ping(): Promise<boolean> {
    try {
      await this.db.command({ ping: 1 });
      return true;
    } catch {
      return false;
    }
  }

  /** Creates collections and indexes; safe to run on every start and from several nodes. */
  async provision(): Promise<void> {
    await guard(async () => {
      await this.keys.provision();
      // The list's order, ties by id, so a page reads only itself (an older "ws_created" without _id may exist: unused).
      await this.agents.createIndex({ workspace_id: 1, created_at: -1, _id: -1 }, { name: "ws_created_id" });
      await this.deployments.createIndex({ agent_id: 1, version: -1 }, { name: "agent_version" });
      await this.deployments.createIndex({ status: 1 }, { name: "status" });
      await this.runs.createIndex({ workspace_id: 1, last_activity_at: -1, _id: -1 }, { name: "ws_activity" });
      await this.runs.createIndex({ partition: 1, state: 1 }, { name: "partition_state" });
      await this.runs.createIndex({ partition: 1, expires_at: 1 }, { name: "partition_expires" });
      await this.turns.createIndex({ run_id: 1, index: 1 }, { unique: true, name: "run_index" });
      // Unique indexes keep FerretDB's own columns there; this one serves turn history in order.
      await this.turns.createIndex({ run_id: 1, index: -1 }, { name: "run_order" });
      await this.turns.createIndex({ workspace_id: 1, status: 1 }, { name: "ws_status" });
      await this.runs.createIndex({ workspace_id: 1, tags: 1, last_activity_at: -1, _id: -1 }, { name: "ws_tags_activity" });
      await this.idempotency.createIndex({ expires_at: 1 }, { name: "expires" });
      await this.tombstones.createIndex({ expires_at: 1 }, { name: "expires" });
      await this.tombstones.createIndex({ partition: 1, parts_due_at: 1 }, { name: "partition_parts_due" });
    });
  }

  // ---- workspaces -------------------------------------------------------------------

  insertWorkspace(doc: WorkspaceDoc): Promise<unknown> {
    return guard(() => this.workspaces.insertOne(doc));
  }

  getWorkspace(id: string): Promise<WorkspaceDoc | null> {
    return guard(() => this.workspaces.findOne({ _id: id }));
  }

  setWorkspacePlan(id: string, plan: WorkspaceDoc["plan"]): Promise<unknown> {
    return guard(() => this.workspaces.updateOne({ _id: id }, { $set: { plan } }));
  }

  countWorkspaces(): Promise<number> {
    return guard(() => this.workspaces.countDocuments({}, { limit: 1 }));
  }

  /**
   * Claims the making of the development workspace `npm start` makes on an empty store:
   * true for the one node whose claim lands (a unique insert), false for every later one,
   * so several nodes starting at once on an empty store make one.
   */
  async claimBootstrap(nowMs: number): Promise<boolean> {
    try {
      await guard(() => this.db.collection<{ _id: string; at: number }>("bootstrap").insertOne({ _id: "development_workspace", at: nowMs }));
      return true;
    } catch (err) {
      if (isDuplicateKey(err)) return false;
      throw err;
    }
  }

  // ---- agents and deployments -------------------------------------------------------

  insertAgent(doc: AgentDoc): Promise<unknown> {
    return guard(() => this.agents.insertOne(doc));
  }

  /** The agent, if it is this workspace's; the document is shared with concurrent callers (do not change it). */
  async getAgent(workspaceId: string, id: string): Promise<AgentDoc | null> {
    const agent = await this.agentReads.get(id);
    return agent && agent.workspace_id === workspaceId ? agent : null;
  }

  /** The workspace's agents newest first, `limit` after `after`, from the ws_created_id index. */
  listAgents(workspaceId: string, limit: number, after?: { createdAt: number; id: string }): Promise<AgentDoc[]> {
    const filter: Filter<AgentDoc> = { workspace_id: workspaceId, ...newestFirst(after) };
    return guard(() => this.agents.find(filter).sort({ created_at: -1, _id: -1 }).limit(limit).toArray());
  }

  setActiveVersion(agentId: string, version: number): Promise<unknown> {
    return guard(() => this.agents.updateOne({ _id: agentId }, { $set: { active_version: version } }));
  }

  /**
   * Inserts a deployment with the agent's next version. The unique `_id`
   * (`<agent>:<version>`) makes concurrent creators take distinct versions.
   */
  async insertDeployment(doc: Omit<DeploymentDoc, "_id" | "version">): Promise<DeploymentDoc> {
    for (let attempt = 0; attempt < 20; attempt++) {
      const last = await guard(() =>
        // Bounded on both sides: the embedded store reads the last version from its index.
        this.deployments.find({ agent_id: doc.agent_id, version: { $gte: 0, $lte: Number.MAX_SAFE_INTEGER } }).sort({ version: -1 }).limit(1).toArray(),
      );
      const version = (last[0]?.version ?? 0) + 1;
      const full: DeploymentDoc = { ...doc, _id: `${doc.agent_id}:${version}`, version };
      try {
        await guard(() => this.deployments.insertOne(full));
        return full;
      } catch (err) {
        if (!isDuplicateKey(err)) throw err;
      }
    }
    throw new StoreUnavailableError(new Error("could not allocate a deployment version"));
  }

  async activeVersionOf(agentId: string): Promise<number | null> {
    return (await this.agentReads.get(agentId))?.active_version ?? null;
  }

  getDeployment(agentId: string, version: number): Promise<DeploymentDoc | null> {
    return guard(() => this.deployments.findOne({ _id: `${agentId}:${version}` }));
  }

  /** An agent's deployments by version, `limit` of them after `afterVersion`. */
  listDeployments(agentId: string, limit: number, afterVersion = 0): Promise<DeploymentDoc[]> {
    // Bounded on both sides: the embedded store then orders the page from its index.
    return guard(() => this.deployments.find({ agent_id: agentId, version: { $gt: afterVersion, $lte: Number.MAX_SAFE_INTEGER } }).sort({ version: 1 }).limit(limit).toArray());
  }

  listBuildingDeployments(): Promise<DeploymentDoc[]> {
    return guard(() => this.deployments.find({ status: DeploymentStatus.building }).limit(1000).toArray());
  }

  /** Asks a building deployment to become active when its build finishes. */
  requestActivation(id: string): Promise<unknown> {
    return guard(() => this.deployments.updateOne({ _id: id, status: DeploymentStatus.building }, { $set: { activate: true } }));
  }

  /**
   * Moves a deployment out of `building`; false when it already left that state, or, with
   * `unlessActivating`, when activation was asked for (src/deployments.ts finishBuild).
   */
  async finishDeployment(id: string, set: Partial<DeploymentDoc>, options: { unlessActivating?: boolean } = {}): Promise<boolean> {
    const filter: Filter<DeploymentDoc> = { _id: id, status: DeploymentStatus.building, ...(options.unlessActivating ? { activate: { $ne: true } } : {}) };
    const r = await guard(() => this.deployments.updateOne(filter, { $set: set }));
    return r.modifiedCount === 1;
  }

  // ---- runs and turns ---------------------------------------------------------------

  /** Inserts a run unless one with its id exists; false when it did. */
  insertRunOnce(doc: RunDoc): Promise<boolean> {
    return insertOnce(this.runInserts, doc);
  }

  getRun(id: string): Promise<RunDoc | null> {
    return guard(() => this.runs.findOne({ _id: id }));
  }

  /**
   * Raises the run's fencing epoch to `epoch` unless a newer owner already did.
   * Returns the run as stored afterwards, or null when a newer epoch holds it.
   */
  async claimRun(id: string, epoch: number): Promise<RunDoc | null> {
    if (this.idOnlyFilters) {
      const current = await this.getRun(id);
      if (!current || current.epoch > epoch) return null;
      if (current.epoch < epoch) await guard(() => this.runs.updateOne({ _id: id }, { $set: { epoch } }));
    } else {
      await guard(() => this.runs.updateOne({ _id: id, epoch: { $lt: epoch } }, { $set: { epoch } }));
    }
    const run = await this.getRun(id);
    if (!run || run.epoch !== epoch) return null;
    return run;
  }

  /** A write conditional on the run's epoch; throws FencedError when another owner holds it. */
  async updateRunFenced(id: string, epoch: number, set: Partial<RunDoc>): Promise<void> {
    const update: UpdateFilter<RunDoc> = { $set: set };
    if (this.idOnlyFilters) {
      const current = await guard(() => this.runs.findOne({ _id: id }, { projection: { epoch: 1 } }));
      if (!current || current.epoch !== epoch) throw new FencedError(id);
      await guard(() => this.runs.updateOne({ _id: id }, update));
      return;
    }
    if (!(await guard(() => updateOne(this.runUpdates, this.runs, { _id: id, epoch }, update)))) throw new FencedError(id);
  }

  /** Runs matching `filter`, most recently active first, at most `limit` (scans use {@link scanRuns}). */
  findRuns(filter: Filter<RunDoc>, limit: number): Promise<RunDoc[]> {
    return guard(() => this.runs.find(filter).sort({ last_activity_at: -1, _id: -1 }).limit(limit).toArray());
  }

  /**
   * Iterates runs matching `filter` in list order, at most `max` of them, 100 per batch:
   * a tag page usually fills within a few hundred runs, and the store decodes every run
   * of a batch (1,000 per batch made a tag page 2× slower on the embedded store).
   */
  async *scanRuns(filter: Filter<RunDoc>, max: number): AsyncGenerator<RunDoc> {
    const cursor = this.runs.find(filter).sort({ last_activity_at: -1, _id: -1 }).limit(max).batchSize(100);
    try {
      while (true) {
        const next = await guard(() => cursor.next());
        if (!next) return;
        yield next;
      }
    } finally {
      await cursor.close().catch(() => undefined);
    }
  }

  /** Runs of a workspace carrying `tag`, counted up to `cap` (a bounded count). */
  countRunsWithTag(workspaceId: string, tag: string, cap: number): Promise<number> {
    return guard(() => this.runs.countDocuments({ workspace_id: workspaceId, tags: tag }, { limit: cap }));
  }

  busyRunsIn(partitions: number[]): Promise<Array<Pick<RunDoc, "_id" | "partition" | "epoch">>> {
    return guard(() =>
      this.runs
        .find({ partition: { $in: partitions }, state: "busy" }, { projection: { _id: 1, partition: 1, epoch: 1 } })
        .limit(10_000)
        .toArray(),
    );
  }

  /** Inserts a turn unless one with its id exists; false when it did (a resent command). */
  insertTurnOnce(doc: TurnDoc): Promise<boolean> {
    return insertOnce(this.turnInserts, storedTurnFields(doc));
  }

  async getTurn(id: string): Promise<TurnDoc | null> {
    return loadedTurn(await guard(() => this.turns.findOne({ _id: id })));
  }

  /**
   * A turn write conditional on no newer owner having written the turn; it stamps
   * the writer's epoch so a stale owner's later write matches nothing.
   */
  async updateTurnFenced(id: string, epoch: number, fields: Partial<TurnDoc>): Promise<void> {
    const set = storedTurnFields(fields);
    if (this.idOnlyFilters) {
      const current = await guard(() => this.turns.findOne({ _id: id }, { projection: { epoch: 1 } }));
      if (!current || current.epoch > epoch) throw new FencedError(id);
      await guard(() => this.turns.updateOne({ _id: id }, { $set: { ...set, epoch } }));
      return;
    }
    const update: UpdateFilter<TurnDoc> = { $set: { ...set, epoch } };
    if (!(await guard(() => updateOne(this.turnUpdates, this.turns, { _id: id, epoch: { $lte: epoch } }, update)))) throw new FencedError(id);
  }

  /** The run's turns in order, without transcripts unless asked. */
  async listTurns(runId: string, options: { afterIndex?: number; limit?: number; withTranscript?: boolean } = {}): Promise<TurnDoc[]> {
    // Bounds on index even without afterIndex: they state the sort key's type (numbers
    // within ±2^53), so the embedded store reads the run's turns in order from its index.
    const filter: Filter<TurnDoc> = { run_id: runId, index: { $gt: options.afterIndex ?? -1, $lt: Number.MAX_SAFE_INTEGER } };
    const cursor = this.turns.find(filter, options.withTranscript ? {} : { projection: { transcript: 0 } }).sort({ index: 1 });
    if (options.limit) cursor.limit(options.limit);
    return (await guard(() => cursor.toArray())).map((turn) => loadedTurn(turn));
  }

  // ---- idempotency ------------------------------------------------------------------

  /** Inserts a pending record; returns null on success or the record that already holds the key. */
  async claimIdempotencyKey(doc: IdempotencyDoc): Promise<IdempotencyDoc | null> {
    try {
      await guard(() => this.idempotencyInserts.insert(doc));
      return null;
    } catch (err) {
      if (!isDuplicateKey(err)) throw err;
      const existing = await guard(() => this.idempotency.findOne({ _id: doc._id }));
      if (existing && existing.expires_at <= doc.created_at) {
        // An expired record no longer protects its key: replace it.
        await guard(() => this.idempotency.deleteOne({ _id: doc._id, expires_at: existing.expires_at }));
        return this.claimIdempotencyKey(doc);
      }
      return existing;
    }
  }

  getIdempotency(id: string): Promise<IdempotencyDoc | null> {
    return guard(() => this.idempotency.findOne({ _id: id }));
  }

  completeIdempotency(id: string, result: Record<string, unknown>): Promise<unknown> {
    return guard(() => updateOne(this.idempotencyUpdates, this.idempotency, { _id: id }, { $set: { state: "done", result } }));
  }

  async releaseIdempotency(id: string): Promise<void> {
    if (this.idOnlyFilters) {
      const current = await this.getIdempotency(id);
      if (current?.state === "pending") await guard(() => this.idempotency.deleteOne({ _id: id }));
      return;
    }
    await guard(() => this.idempotency.deleteOne({ _id: id, state: "pending" }));
  }

  async deleteRunFenced(id: string, epoch: number): Promise<void> {
    if (this.idOnlyFilters) {
      const current = await guard(() => this.runs.findOne({ _id: id }, { projection: { epoch: 1 } }));
      if (!current || current.epoch !== epoch) throw new FencedError(id);
      await guard(() => this.runs.deleteOne({ _id: id }));
      return;
    }
    const r = await guard(() => this.runs.deleteOne({ _id: id, epoch }));
    if (r.deletedCount === 0) throw new FencedError(id);
  }

  /**
   * Removes a run's turns in ranges of {@link SWEEP_BATCH} turn indexes, never in one
   * delete: the embedded store deletes every match of a delete in one SQL statement with a
   * variable each, at most 32,766 (a run with more turns could never be removed). Each
   * range is a seek of the (run_id, index) index; then a last delete takes anything else.
   */
  async deleteTurnsOf(runId: string): Promise<void> {
    const everyIndex = { $gte: 0, $lte: Number.MAX_SAFE_INTEGER };
    const [last] = await guard(() => this.turns.find({ run_id: runId, index: everyIndex }, { projection: { index: 1 } }).sort({ index: -1 }).limit(1).toArray());
    for (let from = 0; last && from <= last.index; from += SWEEP_BATCH) {
      await guard(() => this.turns.deleteMany({ run_id: runId, index: { $gte: from, $lt: from + SWEEP_BATCH } }));
    }
    await guard(() => this.turns.deleteMany({ run_id: runId }));
  }

  /** Runs of these partitions whose retention ran out (a busy one only past its grace: domain.ts runExpired). */
  expiredRunsIn(partitions: number[], nowMs: number, turnLimitMs: number, limit = 500): Promise<Array<Pick<RunDoc, "_id" | "partition">>> {
    const filter: Filter<RunDoc> = {
      partition: { $in: partitions },
      expires_at: { $lte: nowMs },
      $or: [{ state: { $ne: RunState.busy } }, { expires_at: { $lte: nowMs - busyGraceMs(turnLimitMs) } }],
    };
    return guard(() =>
      this.runs
        .find(filter, { projection: { _id: 1, partition: 1 } })
        .limit(limit)
        .toArray(),
    );
  }

  /** Forgets idempotency records and tombstones past their keeping time. */
  async sweepRecords(nowMs: number): Promise<void> {
    await deleteOldest(this.idempotency, "expires_at", nowMs + 1);
    await deleteOldest(this.tombstones, "expires_at", nowMs + 1);
  }

  // ---- tombstones -------------------------------------------------------------------

  async insertTombstone(doc: TombstoneDoc): Promise<void> {
    try {
      await guard(() => this.tombstones.insertOne(doc));
    } catch (err) {
      if (!isDuplicateKey(err)) throw err;
    }
  }

  getTombstone(id: string): Promise<TombstoneDoc | null> {
    return guard(() => this.tombstones.findOne({ _id: id }));
  }

  tombstonesDueIn(partitions: number[], nowMs: number, limit = 100): Promise<TombstoneDoc[]> {
    return guard(() =>
      this.tombstones
        .find({ partition: { $in: partitions }, parts_due_at: { $lte: nowMs } })
        .limit(limit)
        .toArray(),
    );
  }

  async setPartsDue(runId: string, dueAt: number | null): Promise<void> {
    const update = dueAt === null ? { $unset: { parts_due_at: "" as const } } : { $set: { parts_due_at: dueAt } };
    await guard(() => this.tombstones.updateOne({ _id: runId }, update));
  }
}

/** One document's update, through the collection's batcher when it has one; whether a document matched. */
async function updateOne<T extends Document>(batcher: UpdateBatcher<T> | undefined, collection: Collection<T>, filter: Filter<T>, update: UpdateFilter<T>): Promise<boolean> {
  if (batcher) return batcher.update(filter, update);
  return (await collection.updateOne(filter, update)).matchedCount > 0;
}
