/**
 * Sends webhook deliveries (issue 16). Each node sends the deliveries of the partitions it
 * holds, so a delivery has one sender; attempt n is claimed by inserting its record first,
 * so a lapsed owner and the new one never both send it. A run's deliveries to one endpoint
 * go in order: a later one waits while an earlier one is pending. Destinations pass the
 * address guard at connect time (the checked address is the one connected to).
 */
import http from "node:http";
import https from "node:https";
import net, { type LookupFunction } from "node:net";
import type { Logger } from "pino";
import { type Clock, DELIVERY_LOG_MS, type DueDelivery, guardedLookup, nextAttemptAt, NetworkPolicyError, resolveAllowed, signWebhook, type Timer, type WebhookAttempt, type WebhookStore } from "../src/index.js";

export interface DelivererOptions {
  store: WebhookStore;
  clock: Clock;
  log: Logger;
  /** The partitions this node holds now. */
  held: () => number[];
  allowPrivate: boolean;
  timeoutMs: number;
  horizonMs: number;
  retryScale: number;
  maxInFlight: number;
  /** How often due deliveries are looked for. */
  pollMs?: number;
}

/** The least time between two looks started other than by the poll (new deliveries, attempts ending). */
const NUDGE_GAP_MS = 50;
/** How often finished deliveries past the log's 7 days are swept. */
const SWEEP_EVERY_MS = 10 * 60_000;
/** How long a delivery to a disabled endpoint waits before it is looked at again. */
const DISABLED_RECHECK_MS = 5_000;
/** Bytes of an answer read (and thrown away) before the connection is closed. */
const MAX_ANSWER_BYTES = 64 * 1024;

export class WebhookDeliverer {
  private timer: Timer | undefined;
  private sweeper: Timer | undefined;
  private ticking = false;
  /** A delivery came while a look was running: look again when it ends. */
  private again = false;
  /** The last look left due deliveries for endpoints at their limit: look again as attempts end. */
  private heldBack = false;
  /** Attempts that ended during the running look: its list is older than what they recorded. */
  private readonly endedDuringLook = new Set<string>();
  private nudged: Timer | undefined;
  private lastTickAt = 0;
  private stopListening: (() => void) | undefined;
  private stopped = false;
  private readonly inFlight = new Map<string, Promise<void>>();
  private readonly perEndpoint = new Map<string, number>();

  constructor(private readonly o: DelivererOptions) {}

  start(): void {
    this.timer = this.o.clock.every(this.o.pollMs ?? 500, () => void this.tick(), { keepAlive: false });
    this.stopListening = this.o.store.onDeliveryInserted((partition) => this.nudge(partition));
    this.sweeper = this.o.clock.every(SWEEP_EVERY_MS, () => void this.sweep(), { keepAlive: false });
  }

  /** Forgets finished deliveries older than the log keeps them (bounded per run). */
  async sweep(): Promise<number> {
    const held = this.o.held();
    if (held.length === 0 || this.stopped) return 0;
    try {
      return await this.o.store.sweep(held, this.o.clock.nowMs() - DELIVERY_LOG_MS);
    } catch (err) {
      this.o.log.warn({ err }, "sweeping old webhook deliveries failed; retrying later");
      return 0;
    }
  }

  /**
   * A delivery of `partition` was recorded here: if this node sends that partition's, it
   * looks now (at most one look every NUDGE_GAP_MS this way), not at its next poll.
   */
  nudge(partition: number): void {
    if (!this.stopped && this.o.held().includes(partition)) this.soon();
  }

  /** A look soon: after the one running, or NUDGE_GAP_MS after the last one began. */
  private soon(): void {
    if (this.nudged) return;
    if (this.ticking) {
      this.again = true;
      return;
    }
    const wait = Math.max(0, this.lastTickAt + NUDGE_GAP_MS - this.o.clock.nowMs());
    this.nudged = this.o.clock.after(wait, () => {
      this.nudged = undefined;
      void this.tick();
    }, { keepAlive: false });
  }

  /** Stops looking for work and waits (bounded) for attempts in flight. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.stopListening?.();
    this.nudged?.cancel();
    this.timer?.cancel();
    this.sweeper?.cancel();
    await Promise.race([Promise.all(this.inFlight.values()), this.o.clock.sleep(this.o.timeoutMs + 1_000, { keepAlive: false })]);
  }

  /** One look for due deliveries; never overlaps itself (one asked for meanwhile follows it). */
  async tick(): Promise<void> {
    if (this.stopped) return;
    if (this.ticking) {
      // Whatever called for this look (a new delivery, the poll) is looked for once the running one ends.
      this.again = true;
      return;
    }
    this.ticking = true;
    this.again = false;
    this.heldBack = false;
    this.endedDuringLook.clear();
    this.lastTickAt = this.o.clock.nowMs();
    try {
      const held = this.o.held();
      if (held.length === 0) return;
      // Endpoints at their limit of attempts in flight are left out of the look: their due
      // deliveries, oldest first, had filled its window and hidden every other endpoint's, so
      // one tenant's slow receiver held back every tenant's deliveries on the node (a probe:
      // 0.3 s → 148 s).
      const saturated = [...this.perEndpoint].filter(([, n]) => n >= this.o.maxInFlight).map(([id]) => id);
      // What they leave out may be due: looked for again when one of their attempts ends.
      if (saturated.length > 0) this.heldBack = true;
      const due = await this.o.store.due(held, this.o.clock.nowMs(), 200, { deliveries: [...this.inFlight.keys()], endpoints: saturated });
      const started = new Set<string>();
      for (const doc of due) {
        if (this.stopped) return;
        if (this.inFlight.has(doc._id)) continue;
        if (this.endedDuringLook.has(doc._id)) {
          // Its attempt ended after this list was read (and recorded what comes next): the next look reads it again.
          this.again = true;
          continue;
        }
        if ((this.perEndpoint.get(doc.webhook_id) ?? 0) >= this.o.maxInFlight) {
          // Its endpoint's attempts in flight are at the limit: looked for again when one ends.
          this.heldBack = true;
          continue;
        }
        // In order per run and endpoint: not while an earlier one is pending (or starting now).
        const orderKey = `${doc.webhook_id}/${doc.run_id}`;
        if (doc.run_id !== null && started.has(orderKey)) continue;
        const earlier = await this.o.store.earlierPending(doc);
        if (earlier !== null) {
          // Waits for the earlier one; put off until it is due, so it leaves the due window
          // and never starves other deliveries.
          await this.o.store.postpone(doc, Math.max(earlier, this.o.clock.nowMs() + (this.o.pollMs ?? 500)), false);
          continue;
        }
        started.add(orderKey);
        this.launch(doc);
      }
    } catch (err) {
      this.o.log.warn({ err }, "looking for due webhook deliveries failed; retrying");
    } finally {
      this.ticking = false;
      if (this.again && !this.stopped) this.soon();
      this.again = false;
    }
  }

  private launch(doc: DueDelivery): void {
    this.perEndpoint.set(doc.webhook_id, (this.perEndpoint.get(doc.webhook_id) ?? 0) + 1);
    const work = this.attempt(doc)
      .catch((err) => this.o.log.warn({ err, delivery_id: doc._id }, "webhook attempt failed to record; it is retried"))
      .finally(() => {
        this.inFlight.delete(doc._id);
        if (this.ticking) this.endedDuringLook.add(doc._id);
        const n = (this.perEndpoint.get(doc.webhook_id) ?? 1) - 1;
        if (n > 0) this.perEndpoint.set(doc.webhook_id, n);
        else this.perEndpoint.delete(doc.webhook_id);
        if (this.heldBack && !this.stopped) this.soon();
      });
    this.inFlight.set(doc._id, work);
  }

  private async attempt(due: DueDelivery): Promise<void> {
    const endpoint = await this.o.store.getEndpoint(due.webhook_id);
    const now = this.o.clock.nowMs();
    // Its webhook was deleted (another node's list of endpoints was up to 2 s old): nothing to send.
    if (!endpoint) return this.o.store.postpone(due, now, true);
    const body = await this.o.store.bodyOf(due._id);
    // Deleted with its webhook since the look read it.
    if (body === null) return;
    const doc = { ...due, body };
    if (!endpoint.enabled) {
      // Kept until the endpoint is enabled again (looked at again every few seconds) or the horizon passes.
      await this.o.store.postpone(doc, now + DISABLED_RECHECK_MS, now - doc.created_at > this.o.horizonMs);
      return;
    }
    const n = doc.attempts + 1;
    if (!(await this.o.store.claimAttempt(doc, n))) {
      // Claimed before and not counted: apply what it recorded, or, once it is certainly
      // over, count it as lost so the next attempt may go.
      await this.o.store.reconcileAttempt(doc, n, now - 2 * this.o.timeoutMs - 1_000, now - doc.created_at > this.o.horizonMs);
      return;
    }
    // The partition may have moved while this node looked (a pause): then its new owner sends.
    if (!this.o.held().includes(doc.partition)) return;
    const timestampS = Math.floor(now / 1000);
    const signature = signWebhook(this.o.store.signingSecrets(endpoint), doc.message_id, timestampS, doc.body);
    const started = this.o.clock.nowMs();
    const answer = await this.send(endpoint.url, doc, timestampS, signature);
    const done = this.o.clock.nowMs();
    const attempt: WebhookAttempt = { n, at: started, status_code: answer.status, latency_ms: answer.status === null ? null : done - started, error: answer.error };
    const log = { delivery_id: doc._id, webhook_id: doc.webhook_id, workspace_id: doc.workspace_id, event_type: doc.event_type, attempt: n, status: answer.status, error: answer.error };
    // A lapsed owner records only its attempt; the partition's new owner applies it.
    const owns = this.o.held().includes(doc.partition);
    if (answer.status !== null && answer.status >= 200 && answer.status < 300) {
      await this.o.store.recordAttempt(doc, attempt, { status: "delivered", nextAttemptAt: done }, owns);
      this.o.log.info(log, "webhook delivered");
      return;
    }
    if (answer.status === 410) {
      await this.o.store.recordAttempt(doc, attempt, { status: "failed", nextAttemptAt: done }, owns);
      if (owns) await this.o.store.disable(endpoint, "The endpoint answered 410 Gone.");
      this.o.log.warn(log, "webhook endpoint answered 410 Gone: disabled");
      return;
    }
    const next = nextAttemptAt(n, done, doc.created_at, this.o.horizonMs, Math.random(), this.o.retryScale);
    await this.o.store.recordAttempt(doc, attempt, { status: next === null ? "failed" : "pending", nextAttemptAt: next ?? done }, owns);
    this.o.log.warn({ ...log, next_attempt_at: next }, next === null ? "webhook delivery failed for good (past its horizon)" : "webhook attempt failed; retrying later");
  }

  /** One POST; never throws. No redirects are followed (a 3xx is a failed attempt). */
  private send(url: string, doc: DueDelivery & { body: string }, timestampS: number, signature: string): Promise<{ status: number | null; error: string | null }> {
    let target: URL;
    try {
      target = new URL(url);
    } catch {
      return Promise.resolve({ status: null, error: "not a URL" });
    }
    const allowPrivate = this.o.allowPrivate;
    const lookup = guardedLookup({ allowPrivate });
    const client = target.protocol === "https:" ? https : http;
    // An address literal is connected to without a lookup: it is checked here.
    const literal = net.isIP(target.hostname.replace(/^\[|\]$/g, "")) !== 0;
    const checked = literal ? resolveAllowed(target.hostname, { allowPrivate }).then(() => null, (err: Error) => err.message) : Promise.resolve(null);
    return checked.then((refused) => (refused ? { status: null, error: refused } : this.post(client, target, lookup, doc, timestampS, signature)));
  }

  private post(
    client: typeof http | typeof https,
    target: URL,
    lookup: LookupFunction,
    doc: DueDelivery & { body: string },
    timestampS: number,
    signature: string,
  ): Promise<{ status: number | null; error: string | null }> {
    return new Promise((resolve) => {
      let settled = false;
      const finish = (status: number | null, error: string | null) => {
        if (settled) return;
        settled = true;
        resolve({ status, error });
      };
      const req = client.request(
        target,
        {
          method: "POST",
          lookup,
          timeout: this.o.timeoutMs,
          headers: {
            "content-type": "application/json",
            "user-agent": "runs-webhooks/1",
            "webhook-id": doc.message_id,
            "webhook-timestamp": String(timestampS),
            "webhook-signature": signature,
          },
        },
        (res) => {
          let read = 0;
          res.on("data", (chunk: Buffer) => {
            read += chunk.length;
            if (read > MAX_ANSWER_BYTES) res.destroy();
          });
          res.on("close", () => finish(res.statusCode ?? null, res.statusCode && res.statusCode >= 200 && res.statusCode < 300 ? null : `HTTP ${res.statusCode}`));
          res.on("error", () => finish(res.statusCode ?? null, `HTTP ${res.statusCode}`));
        },
      );
      const deadline = setTimeout(() => req.destroy(new Error(`no answer within ${this.o.timeoutMs} ms`)), this.o.timeoutMs);
      deadline.unref();
      req.on("timeout", () => req.destroy(new Error(`no answer within ${this.o.timeoutMs} ms`)));
      req.on("error", (err) => finish(null, err instanceof NetworkPolicyError ? err.message : err.message.slice(0, 300)));
      req.on("close", () => clearTimeout(deadline));
      req.end(doc.body);
    });
  }
}
