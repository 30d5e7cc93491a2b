import { createHash } from "node:crypto";
import type { FastifyRequest } from "fastify";
import type { Logger } from "pino";
import { ApiError, type Clock, type IdempotencyDoc, invalid, type MongoStore } from "../src/index.js";

const KEEP_MS = 48 * 3600_000;
const KEY_PATTERN = /^[\x20-\x7e]{1,255}$/;

/** The Idempotency-Key header: required, 1–255 printable ASCII characters. */
export function idempotencyKeyOf(request: FastifyRequest, required = true): string | undefined {
  const value = request.headers["idempotency-key"];
  if (value === undefined || value === "") {
    if (required) throw invalid("Idempotency-Key", "This request needs an Idempotency-Key header.");
    return undefined;
  }
  if (typeof value !== "string" || !KEY_PATTERN.test(value)) {
    throw invalid("Idempotency-Key", "Idempotency-Key must be 1 to 255 printable ASCII characters.");
  }
  return value;
}

/** Stable JSON: object keys sorted, so equal requests hash equally. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (value && typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

export type Claim<T> =
  /** This request owns the key: do the work, then `complete`. */
  | { kind: "new"; id: string; result: T }
  /** An earlier request with this key finished (or was left pending long enough to re-drive). */
  | { kind: "replay"; id: string; result: T; done: boolean };

/**
 * Idempotency records per (workspace, operation, key). The first request stores its
 * pre-allocated answer identity as pending; a retry with another fingerprint is 409;
 * a retry while the first is pending waits for it, and after `staleMs` re-drives the
 * same ids (the actor's admission is idempotent on them).
 */
export class IdempotencyRecords {
  /** Late completions being written (`lateCompletion`); `settled` waits for them. */
  private readonly completing = new Set<Promise<void>>();

  constructor(
    private readonly store: MongoStore,
    private readonly clock: Clock,
    private readonly staleMs = 5_000,
    private readonly log?: Logger,
  ) {}

  private async claim<T extends Record<string, unknown>>(
    workspaceId: string,
    operation: string,
    key: string,
    fingerprint: unknown,
    fresh: () => T,
  ): Promise<Claim<T>> {
    const id = createHash("sha256").update(`${workspaceId}\u0000${operation}\u0000${key}`).digest("hex");
    const print = createHash("sha256").update(canonicalJson(fingerprint)).digest("hex");
    const now = this.clock.nowMs();
    const result = fresh();
    const doc: IdempotencyDoc = {
      _id: id,
      workspace_id: workspaceId,
      operation,
      fingerprint: print,
      state: "pending",
      result,
      created_at: now,
      expires_at: now + KEEP_MS,
    };
    let existing = await this.store.claimIdempotencyKey(doc);
    if (!existing) return { kind: "new", id, result };
    if (existing.fingerprint !== print) {
      throw new ApiError("idempotency_conflict", {
        param: "Idempotency-Key",
        message: "This Idempotency-Key was already used for a different request.",
      });
    }
    // Wait for the first request's answer; bounded, then take over with its ids.
    for (let i = 0; i < 100 && existing.state === "pending" && this.clock.nowMs() - existing.created_at < this.staleMs; i++) {
      await this.clock.sleep(50);
      existing = (await this.store.getIdempotency(id)) ?? existing;
    }
    return { kind: "replay", id, result: existing.result as T, done: existing.state === "done" };
  }

  /**
   * The one sequence of an idempotent operation: claims (workspace, operation, key);
   * unless an earlier request with the key finished, runs `work` with the claim's
   * identity (`fresh` allocated it, or the pending first request did) and records
   * `record(result)` as done. For a result `lateCompletion` accepts, that write is not
   * awaited (the answer does not wait for it): only for work that a re-drive of the same
   * identity finds done (an admitted turn: the actor's admission is idempotent on the run
   * and turn ids; not a recorded refusal, which a re-drive could turn into work), since until
   * the record is written (or when writing it fails: logged) a retry finds the claim
   * pending, waits for it up to `staleMs` from the claim, then re-drives the work.
   * A failure that `releaseOn` accepts (default: a refusal
   * without effect, an API error below 500) frees the key for a retry. If freeing it
   * fails (the store is away), that failure is answered (503), unless `quietRelease`:
   * then the original failure is, and the pending claim is re-driven by a retry after
   * `staleMs`.
   */
  async once<T extends Record<string, unknown>>(
    claim: { workspaceId: string; operation: string; key: string; fingerprint: unknown; fresh: () => T },
    work: (identity: T, firstClaim: boolean) => Promise<T>,
    options: { record?: (result: T) => Record<string, unknown>; releaseOn?: (err: unknown) => boolean; quietRelease?: boolean; lateCompletion?: (result: T) => boolean } = {},
  ): Promise<{ result: T; replayed: boolean }> {
    const claimed = await this.claim(claim.workspaceId, claim.operation, claim.key, claim.fingerprint, claim.fresh);
    if (claimed.kind === "replay" && claimed.done) return { result: claimed.result, replayed: true };
    let result: T;
    try {
      result = await work(claimed.result, claimed.kind === "new");
    } catch (err) {
      const release = options.releaseOn ?? ((e: unknown) => e instanceof ApiError && e.status < 500);
      if (release(err)) {
        if (options.quietRelease) await this.release(claimed.id).catch(() => undefined);
        else await this.release(claimed.id);
      }
      throw err;
    }
    const record = options.record ? options.record(result) : result;
    if (options.lateCompletion?.(result)) this.completeLate(claimed.id, record);
    else await this.store.completeIdempotency(claimed.id, record);
    return { result, replayed: false };
  }

  /** Waits for the late completions still being written, also those begun meanwhile (at close, before the store closes). */
  async settled(): Promise<void> {
    for (let i = 0; i < 1_000 && this.completing.size > 0; i++) await Promise.all([...this.completing]);
  }

  private completeLate(id: string, result: Record<string, unknown>): void {
    const write = this.store
      .completeIdempotency(id, result)
      .then(
        () => undefined,
        (err: unknown) => this.log?.warn({ err, idempotency_id: id }, "completing an idempotency record failed; a retry with its key re-drives the request"),
      )
      .finally(() => this.completing.delete(write));
    this.completing.add(write);
  }

  /** Forgets a pending claim whose request failed before doing anything. */
  private release(id: string): Promise<unknown> {
    return this.store.releaseIdempotency(id);
  }
}
