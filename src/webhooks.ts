/**
 * Webhook endpoints and deliveries in the store (issue 16).
 *
 * - Endpoints: one document per endpoint; secrets sealed with a key derived from the master
 *   key (label "webhooks"), shown only when created or rotated.
 * - Deliveries: one document per (event, endpoint), inserted by the run's owner where the
 *   turn's final event is emitted (actors/turn-execution.ts), keyed by event and endpoint so a
 *   repeated move-on inserts nothing new. Only the owner of the delivery's partition
 *   attempts and updates it (actors/webhook-deliverer.ts): one writer, as every mutation here.
 * - Attempts: insert-only, keyed `<delivery>:<n>`: inserting attempt n claims it, so two
 *   nodes (an old owner whose lease lapsed, the new one) never send the same attempt.
 */
import type { Collection, Db } from "mongodb";
import type { Clock } from "./clock.js";
import { deriveLabelledKey, masterKeyBytes, open, seal } from "./event-crypto.js";
import { guard, inSteps, isDuplicateKey, newestFirst, olderThan, SWEEP_BATCH, SWEEP_BOUNDS, type SweepBounds } from "./mongo-guard.js";
import { newWebhookSecret, WEBHOOK_TEST_EVENT, type WebhookEventType, wantsEvent } from "./webhook-signing.js";
import type { IdSource } from "./ids.js";

export interface WebhookSecretDoc {
  sealed: string;
  created_at: number;
  /** A rotated-out secret still signs until then; null for the current one. */
  expires_at: number | null;
}

export interface WebhookDoc {
  _id: string;
  workspace_id: string;
  url: string;
  description: string | null;
  event_types: string[];
  agent_id: string | null;
  enabled: boolean;
  /** Why delivery stopped on its own (a 410 Gone), or null. */
  disabled_reason: string | null;
  secrets: WebhookSecretDoc[];
  created_at: number;
  updated_at: number;
}

export type DeliveryStatus = "pending" | "delivered" | "failed";

export interface WebhookAttempt {
  n: number;
  at: number;
  /** The HTTP status, or null when no answer came (refused, timeout, policy). */
  status_code: number | null;
  latency_ms: number | null;
  error: string | null;
}

export interface DeliveryDoc {
  _id: string;
  workspace_id: string;
  webhook_id: string;
  /** The owner of this partition attempts the delivery (the run's partition, so a run's deliveries go in order). */
  partition: number;
  /** Orders a run's deliveries to one endpoint. */
  run_id: string | null;
  /** Standard Webhooks' webhook-id: the same on every attempt and on a redelivery. */
  message_id: string;
  event_type: string;
  /** The JSON body as sent. */
  body: string;
  status: DeliveryStatus;
  attempts: number;
  next_attempt_at: number;
  last_attempt: WebhookAttempt | null;
  created_at: number;
  completed_at: number | null;
}

export interface AttemptDoc extends WebhookAttempt {
  _id: string;
  delivery_id: string;
  webhook_id: string;
}

/** How long a rotated-out secret still signs deliveries. */
export const SECRET_GRACE_MS = 24 * 3600 * 1000;
/**
 * Rotated-out secrets that still sign, at most: the newest ones. Each signs every delivery
 * (one `v1,…` of ~48 bytes in its signature header); 400 rotations in a day had made that
 * header overflow a receiver's 16 KiB limit (431 on every attempt) and the document grow
 * without end (found by a probe).
 */
export const MAX_PREVIOUS_SECRETS = 4;
/** Workspaces whose endpoints a node keeps in memory. */
const CACHED_WORKSPACES = 10_000;
/** The error of an attempt claimed and not answered yet. */
const IN_FLIGHT = "in flight";
/** The most webhooks a workspace may have (each final turn fans out to every wanting one). */
export const MAX_WEBHOOKS_PER_WORKSPACE = 50;
/** How long a finished delivery (delivered or failed) stays in the log. */
export const DELIVERY_LOG_MS = 7 * 24 * 3600 * 1000;

/** Steps of 1,000 deliveries an endpoint's delete removes its log in, at most (200,000 deliveries). */
const DELETE_LOG_STEPS = 200;
/** How long a node trusts its list of a workspace's endpoints (its own changes apply at once). */
const ENDPOINTS_TTL_MS = 2_000;

/** A delivery as a look for due ones reads it: everything but its body. */
export type DueDelivery = Omit<DeliveryDoc, "body">;

/** The at most `count` newest of `secrets` that sign at `now` (current, or in their grace), newest first. */
function signingNow(secrets: WebhookSecretDoc[], now: number, count: number): WebhookSecretDoc[] {
  return secrets
    .filter((s) => s.expires_at === null || s.expires_at > now)
    .sort((a, b) => b.created_at - a.created_at)
    .slice(0, count);
}

/** Documents ordered before (createdAt, id) by creation time, then id: keyset paging and order per run. */
export class WebhookStore {
  private readonly endpoints: Collection<WebhookDoc>;
  private readonly deliveries: Collection<DeliveryDoc>;
  private readonly attempts: Collection<AttemptDoc>;
  private readonly master: Buffer;
  private readonly cache = new Map<string, { docs: WebhookDoc[]; readAt: number }>();

  constructor(
    db: Db,
    masterKeyBase64: string,
    private readonly clock: Clock,
    private readonly ids: IdSource,
  ) {
    this.endpoints = db.collection<WebhookDoc>("webhooks");
    this.deliveries = db.collection<DeliveryDoc>("webhook_deliveries");
    this.attempts = db.collection<AttemptDoc>("webhook_attempts");
    this.master = masterKeyBytes(masterKeyBase64, "RUNS_MASTER_KEY");
  }

  async provision(): Promise<void> {
    await guard(() => this.endpoints.createIndex({ workspace_id: 1, created_at: -1 }, { name: "ws_created" }));
    await guard(() => this.deliveries.createIndex({ status: 1, next_attempt_at: 1 }, { name: "due" }));
    await guard(() => this.deliveries.createIndex({ webhook_id: 1, created_at: -1 }, { name: "webhook_created" }));
    // The delivery log's page order, ties by id, so a page reads only itself.
    await guard(() => this.deliveries.createIndex({ webhook_id: 1, created_at: -1, _id: -1 }, { name: "webhook_created_id" }));
    await guard(() => this.deliveries.createIndex({ status: 1, completed_at: 1 }, { name: "done" }));
    await guard(() => this.attempts.createIndex({ delivery_id: 1, n: 1 }, { name: "delivery_n" }));
  }

  // ---- endpoints -------------------------------------------------------------------

  private sealSecret(workspaceId: string, secret: string): string {
    return Buffer.from(seal(deriveLabelledKey(this.master, "webhooks", workspaceId), Buffer.from(secret, "utf8"))).toString("base64");
  }

  /** The secrets that sign now: the current one, and rotated-out ones within their grace. */
  signingSecrets(doc: WebhookDoc): string[] {
    const now = this.clock.nowMs();
    const key = deriveLabelledKey(this.master, "webhooks", doc.workspace_id);
    // The newest ones only, also for an endpoint rotated more often before the cap.
    return signingNow(doc.secrets, now, MAX_PREVIOUS_SECRETS + 1).map((s) => Buffer.from(open(key, Buffer.from(s.sealed, "base64"))).toString("utf8"));
  }

  private readonly insertListeners = new Set<(partition: number) => void>();

  /**
   * Calls `listener` with a delivery's partition each time this store records one (the
   * node's deliverer sends those of its partitions at once instead of at its next look).
   * Returns the way to stop.
   */
  onDeliveryInserted(listener: (partition: number) => void): () => void {
    this.insertListeners.add(listener);
    return () => this.insertListeners.delete(listener);
  }

  /** The new webhook, or null when the workspace already has the most it may have. */
  async create(input: { workspaceId: string; url: string; description: string | null; eventTypes: string[]; agentId: string | null; enabled: boolean }): Promise<{ doc: WebhookDoc; secret: string } | null> {
    const now = this.clock.nowMs();
    const secret = newWebhookSecret();
    const doc: WebhookDoc = {
      _id: this.ids.webhook(),
      workspace_id: input.workspaceId,
      url: input.url,
      description: input.description,
      event_types: input.eventTypes,
      agent_id: input.agentId,
      enabled: input.enabled,
      disabled_reason: null,
      secrets: [{ sealed: this.sealSecret(input.workspaceId, secret), created_at: now, expires_at: null }],
      created_at: now,
      updated_at: now,
    };
    await guard(() => this.endpoints.insertOne(doc));
    this.cache.delete(input.workspaceId);
    // Creates that raced past the route's count: one that finds more than the limit once it
    // is in takes itself back. Inserts are the only atomic writes here, so the limit is
    // settled after them: the last of any set of kept webhooks counted them all, so never
    // more than the limit stay (two racers may both step back, leaving a place free).
    // If the count cannot be made, the new webhook is taken back too (best effort): the
    // client, answered an error without its secret, could not use it anyway.
    const takeBack = async () => {
      await guard(() => this.endpoints.deleteOne({ _id: doc._id }));
      this.cache.delete(input.workspaceId);
    };
    let total: number;
    try {
      total = await guard(() => this.endpoints.countDocuments({ workspace_id: input.workspaceId }, { limit: MAX_WEBHOOKS_PER_WORKSPACE + 1 }));
    } catch (err) {
      await takeBack().catch(() => undefined);
      throw err;
    }
    if (total > MAX_WEBHOOKS_PER_WORKSPACE) {
      await takeBack();
      return null;
    }
    return { doc, secret };
  }

  /** How many webhooks the workspace has (bounded by the limit and one). */
  count(workspaceId: string): Promise<number> {
    return guard(() => this.endpoints.countDocuments({ workspace_id: workspaceId }, { limit: MAX_WEBHOOKS_PER_WORKSPACE + 1 }));
  }

  get(workspaceId: string, id: string): Promise<WebhookDoc | null> {
    return guard(() => this.endpoints.findOne({ _id: id, workspace_id: workspaceId }));
  }

  /** Newest first; `after` is the last of the previous page. Asks for `limit` documents (at most 50 exist). */
  async list(workspaceId: string, limit: number, after?: { createdAt: number; id: string }): Promise<WebhookDoc[]> {
    const filter = { workspace_id: workspaceId, ...newestFirst(after) };
    return guard(() => this.endpoints.find(filter).sort({ created_at: -1, _id: -1 }).limit(limit).toArray());
  }

  /** Changes an endpoint's settings; enabling clears the reason it stopped. Null when absent. */
  async update(workspaceId: string, id: string, set: Partial<Pick<WebhookDoc, "url" | "description" | "event_types" | "agent_id" | "enabled">>): Promise<WebhookDoc | null> {
    const change: Partial<WebhookDoc> = { ...set, updated_at: this.clock.nowMs() };
    if (set.enabled === true) change.disabled_reason = null;
    const doc = await guard(() => this.endpoints.findOneAndUpdate({ _id: id, workspace_id: workspaceId }, { $set: change }, { returnDocument: "after" }));
    this.cache.delete(workspaceId);
    return doc;
  }

  /** Stops delivery to an endpoint that answered 410 Gone. */
  async disable(doc: WebhookDoc, reason: string): Promise<void> {
    await guard(() => this.endpoints.updateOne({ _id: doc._id }, { $set: { enabled: false, disabled_reason: reason, updated_at: this.clock.nowMs() } }));
    this.cache.delete(doc.workspace_id);
  }

  /**
   * A new current secret; the previous one keeps signing for {@link SECRET_GRACE_MS}, and
   * at most {@link MAX_PREVIOUS_SECRETS} rotated-out ones do (the oldest's grace ends first).
   */
  async rotateSecret(workspaceId: string, id: string): Promise<{ doc: WebhookDoc; secret: string } | null> {
    const doc = await this.get(workspaceId, id);
    if (!doc) return null;
    const now = this.clock.nowMs();
    const secret = newWebhookSecret();
    const kept = signingNow(doc.secrets, now, MAX_PREVIOUS_SECRETS).map((s) => (s.expires_at === null ? { ...s, expires_at: now + SECRET_GRACE_MS } : s));
    const secrets = [{ sealed: this.sealSecret(workspaceId, secret), created_at: now, expires_at: null }, ...kept];
    const updated = await guard(() => this.endpoints.findOneAndUpdate({ _id: id, workspace_id: workspaceId }, { $set: { secrets, updated_at: now } }, { returnDocument: "after" }));
    return updated ? { doc: updated, secret } : null;
  }

  /**
   * Deletes an endpoint and then its deliveries' records; false when it was not the
   * workspace's. The log goes 1,000 deliveries (and their attempts) at a time, at most
   * {@link DELETE_LOG_STEPS} steps: the embedded store deletes every match of one delete in
   * one SQL statement with a variable each (at most 32,766), so a busy endpoint's week of
   * deliveries could not be deleted at once (the request answered 500). Once the endpoint is
   * gone, a log that cannot be removed now (the store away, or more than the steps take) is
   * left to the log's sweep, which removes finished deliveries once the log's week is over,
   * not answered as a failure: `logLeft` says why, for the log line.
   */
  async delete(workspaceId: string, id: string): Promise<false | { logLeft?: unknown }> {
    const deleted = await guard(() => this.endpoints.deleteOne({ _id: id, workspace_id: workspaceId }));
    this.cache.delete(workspaceId);
    if (deleted.deletedCount === 0) return false;
    let full = false;
    try {
      // Newest first by the webhook_created index; a number range bounded on both sides is
      // what the embedded store serves sorted from an index, so it reads 1,000 rows, not all.
      const everyTime = { $gte: Number.MIN_SAFE_INTEGER, $lte: Number.MAX_SAFE_INTEGER };
      await inSteps({ maxSteps: DELETE_LOG_STEPS, budgetMs: Infinity }, async () => {
        const batch = await guard(() =>
          this.deliveries.find({ webhook_id: id, created_at: everyTime }, { projection: { _id: 1, created_at: 1 } }).sort({ created_at: -1 }).limit(SWEEP_BATCH).toArray(),
        );
        if (batch.length === 0) return { removed: 0, full: false };
        const ids = batch.map((d) => d._id);
        await guard(() => this.attempts.deleteMany({ delivery_id: { $in: ids } }));
        // The batch's time range seeks the same index (`_id: {$in}` alone reads the collection).
        const range = { $gte: batch[batch.length - 1]!.created_at, $lte: Number.MAX_SAFE_INTEGER };
        await guard(() => this.deliveries.deleteMany({ webhook_id: id, created_at: range, _id: { $in: ids } }));
        full = batch.length === SWEEP_BATCH;
        return { removed: ids.length, full };
      });
    } catch (err) {
      return { logLeft: err ?? new Error("the delivery log's removal failed") };
    }
    // The last step came back full: the steps ended before the log did.
    return full ? { logLeft: new Error(`${DELETE_LOG_STEPS * SWEEP_BATCH} deliveries removed, the most one delete takes; the rest stay`) } : {};
  }

  /** The workspace's endpoints, read at most every 2 s per node. */
  private async endpointsOf(workspaceId: string): Promise<WebhookDoc[]> {
    const now = this.clock.nowMs();
    const cached = this.cache.get(workspaceId);
    if (cached && now - cached.readAt < ENDPOINTS_TTL_MS) return cached.docs;
    const docs = await guard(() => this.endpoints.find({ workspace_id: workspaceId }).limit(1_000).toArray());
    // Bounded: a node serving many workspaces forgets them all at once now and then.
    if (this.cache.size >= CACHED_WORKSPACES) this.cache.clear();
    this.cache.set(workspaceId, { docs, readAt: now });
    return docs;
  }

  // ---- deliveries ------------------------------------------------------------------

  /**
   * Records an event's delivery to every endpoint that wants it (the run's owner calls this
   * where it emits the event). Keyed by event and endpoint: a repeat inserts nothing.
   */
  async enqueue(event: { workspaceId: string; agentId: string; runId: string; partition: number; type: WebhookEventType; eventKey: string; data: unknown }): Promise<number> {
    const wanted = (await this.endpointsOf(event.workspaceId)).filter((e) => wantsEvent(e, event.type, event.agentId));
    let inserted = 0;
    for (const endpoint of wanted) {
      const id = `whd_${event.eventKey}_${endpoint._id}`;
      if (await this.insertDelivery(this.newDelivery(id, endpoint, event.partition, event.runId, event.type, event.data))) inserted++;
    }
    return inserted;
  }

  /** A `webhook.test` delivery to one endpoint (its own partition: no run orders it). */
  async enqueueTest(endpoint: WebhookDoc, partition: number): Promise<DeliveryDoc> {
    const doc = this.newDelivery(this.ids.webhookDelivery(), endpoint, partition, null, WEBHOOK_TEST_EVENT, { webhook_id: endpoint._id });
    await this.insertDelivery(doc);
    return doc;
  }

  /** A new delivery of an earlier one's message (same webhook-id and body), attempted afresh. */
  async redeliver(original: DeliveryDoc): Promise<DeliveryDoc> {
    const now = this.clock.nowMs();
    const doc: DeliveryDoc = { ...original, _id: this.ids.webhookDelivery(), status: "pending", attempts: 0, next_attempt_at: now, last_attempt: null, created_at: now, completed_at: null };
    await this.insertDelivery(doc);
    return doc;
  }

  private newDelivery(id: string, endpoint: WebhookDoc, partition: number, runId: string | null, type: string, data: unknown): DeliveryDoc {
    const now = this.clock.nowMs();
    const messageId = this.ids.webhookMessage();
    const body = JSON.stringify({ type, timestamp: new Date(now).toISOString(), data });
    return { _id: id, workspace_id: endpoint.workspace_id, webhook_id: endpoint._id, partition, run_id: runId, message_id: messageId, event_type: type, body, status: "pending", attempts: 0, next_attempt_at: now, last_attempt: null, created_at: now, completed_at: null };
  }

  private async insertDelivery(doc: DeliveryDoc): Promise<boolean> {
    try {
      await guard(() => this.deliveries.insertOne(doc));
    } catch (err) {
      if (isDuplicateKey(err)) return false;
      throw err;
    }
    for (const listener of this.insertListeners) {
      try {
        listener(doc.partition);
      } catch {
        // A listener only hastens the sending; the delivery is recorded either way.
      }
    }
    return true;
  }

  getDelivery(webhookId: string, id: string): Promise<DeliveryDoc | null> {
    return guard(() => this.deliveries.findOne({ _id: id, webhook_id: webhookId }));
  }

  /** An endpoint's deliveries, newest first, from the webhook_created_id index (a busy endpoint's week is a long log). */
  listDeliveries(webhookId: string, limit: number, after?: { createdAt: number; id: string }): Promise<DeliveryDoc[]> {
    const filter = { webhook_id: webhookId, ...newestFirst(after) };
    return guard(() => this.deliveries.find(filter, { projection: { body: 0 } }).sort({ created_at: -1, _id: -1 }).limit(limit).toArray());
  }

  /**
   * Pending deliveries of these partitions that are due, oldest first, without their bodies
   * (read when attempted: {@link bodyOf}), leaving out `exclude` (those being attempted).
   */
  due(partitions: number[], nowMs: number, limit: number, exclude: { deliveries?: string[]; endpoints?: string[] } = {}): Promise<DueDelivery[]> {
    const { deliveries = [], endpoints = [] } = exclude;
    const filter = {
      status: "pending" as const,
      next_attempt_at: { $lte: nowMs },
      partition: { $in: partitions },
      ...(deliveries.length ? { _id: { $nin: deliveries } } : {}),
      ...(endpoints.length ? { webhook_id: { $nin: endpoints } } : {}),
    };
    return guard(() => this.deliveries.find(filter, { projection: { body: 0 } }).sort({ created_at: 1, _id: 1 }).limit(limit).toArray()) as Promise<DueDelivery[]>;
  }

  /** A delivery's body; null when the delivery is gone (its webhook was deleted). */
  async bodyOf(id: string): Promise<string | null> {
    const doc = await guard(() => this.deliveries.findOne({ _id: id }, { projection: { body: 1 } }));
    return doc ? doc.body : null;
  }

  /**
   * An earlier delivery of the same run to the same endpoint that is still pending (order per
   * run): when it is due next, or null when there is none.
   */
  async earlierPending(doc: DueDelivery): Promise<number | null> {
    if (doc.run_id === null) return null;
    const earlier = await guard(() =>
      this.deliveries.findOne(
        { webhook_id: doc.webhook_id, run_id: doc.run_id, status: "pending", ...olderThan(doc.created_at, doc._id) },
        { projection: { next_attempt_at: 1 } },
      ),
    );
    return earlier ? earlier.next_attempt_at : null;
  }

  /** Claims attempt `n` of a delivery: false when another node already made it. */
  async claimAttempt(doc: DueDelivery, n: number): Promise<boolean> {
    try {
      await guard(() => this.attempts.insertOne({ _id: `${doc._id}:${n}`, delivery_id: doc._id, webhook_id: doc.webhook_id, n, at: this.clock.nowMs(), status_code: null, latency_ms: null, error: IN_FLIGHT }));
      return true;
    } catch (err) {
      if (isDuplicateKey(err)) return false;
      throw err;
    }
  }

  /**
   * Attempt n was claimed already, yet the delivery does not count it: its sender stopped, or
   * its delivery write failed, or a lapsed owner recorded only the attempt. An answer it
   * recorded is applied (2xx: delivered); one never recorded counts as lost once certainly
   * over (claimed before `claimedBeforeMs`). Past the horizon, the delivery fails. True when
   * the delivery moved on.
   */
  async reconcileAttempt(doc: DueDelivery, n: number, claimedBeforeMs: number, pastHorizon: boolean): Promise<boolean> {
    const claimed = await guard(() => this.attempts.findOne({ _id: `${doc._id}:${n}` }));
    if (!claimed) return false;
    const answered = claimed.error !== IN_FLIGHT;
    if (!answered && claimed.at >= claimedBeforeMs) return false;
    const attempt: WebhookAttempt = answered
      ? { n, at: claimed.at, status_code: claimed.status_code, latency_ms: claimed.latency_ms, error: claimed.error }
      : { n, at: claimed.at, status_code: null, latency_ms: null, error: "lost: the sending node stopped before an answer" };
    const delivered = attempt.status_code !== null && attempt.status_code >= 200 && attempt.status_code < 300;
    await this.recordAttempt(doc, attempt, { status: delivered ? "delivered" : pastHorizon ? "failed" : "pending", nextAttemptAt: this.clock.nowMs() });
    return true;
  }

  /**
   * Records an attempt's outcome: the delivery's next state first (so a failure between the
   * two writes never leaves the delivery behind its attempts), then the attempt's own record.
   * `ownsDelivery` false (the partition moved during the attempt): only the attempt's record;
   * the new owner applies it (reconcileAttempt).
   */
  async recordAttempt(doc: DueDelivery, attempt: WebhookAttempt, next: { status: DeliveryStatus; nextAttemptAt: number }, ownsDelivery = true): Promise<void> {
    if (ownsDelivery) {
      const completed = next.status === "pending" ? null : this.clock.nowMs();
      await guard(() =>
        this.deliveries.updateOne({ _id: doc._id }, { $set: { status: next.status, attempts: attempt.n, next_attempt_at: next.nextAttemptAt, last_attempt: attempt, completed_at: completed } }),
      );
    }
    await guard(() => this.attempts.updateOne({ _id: `${doc._id}:${attempt.n}` }, { $set: { status_code: attempt.status_code, latency_ms: attempt.latency_ms, error: attempt.error } }));
  }

  /** Puts a delivery off without an attempt (its endpoint is disabled); `failed` once past its horizon. */
  async postpone(doc: DueDelivery, until: number, failed: boolean): Promise<void> {
    const set: Partial<DeliveryDoc> = failed ? { status: "failed", completed_at: this.clock.nowMs() } : { next_attempt_at: until };
    await guard(() => this.deliveries.updateOne({ _id: doc._id }, { $set: set }));
  }

  /**
   * Forgets finished deliveries of these partitions (and their attempts) that ended before
   * `beforeMs`, 1,000 at a time while steps come back full, within `bounds` (one step of
   * 1,000 every ten minutes capped a node at 144,000 deliveries a day; a busier log grew for
   * good). The partition owner calls it, so nothing it removes is being attempted. Every
   * read is a seek of the `done` index (finished, by completion time): the embedded store
   * answered the old conditions by reading the week's log, and `_id: {$in}` alone by
   * reading the whole collection.
   */
  async sweep(partitions: number[], beforeMs: number, bounds: SweepBounds = SWEEP_BOUNDS): Promise<number> {
    const finished = { status: { $in: ["delivered", "failed"] as DeliveryStatus[] }, completed_at: { $gte: Number.MIN_SAFE_INTEGER, $lt: beforeMs } };
    return inSteps(bounds, async () => {
      const old = await guard(() => this.deliveries.find({ ...finished, partition: { $in: partitions } }, { projection: { _id: 1 } }).limit(SWEEP_BATCH).toArray());
      if (old.length === 0) return { removed: 0, full: false };
      const ids = old.map((d) => d._id);
      await guard(() => this.attempts.deleteMany({ delivery_id: { $in: ids } }));
      await guard(() => this.deliveries.deleteMany({ ...finished, _id: { $in: ids } }));
      return { removed: ids.length, full: old.length === SWEEP_BATCH };
    });
  }

  /** Every attempt of a delivery, in order. */
  attemptsOf(deliveryId: string): Promise<AttemptDoc[]> {
    return guard(() => this.attempts.find({ delivery_id: deliveryId }).sort({ n: 1 }).limit(100).toArray());
  }

  getEndpoint(id: string): Promise<WebhookDoc | null> {
    return guard(() => this.endpoints.findOne({ _id: id }));
  }
}
