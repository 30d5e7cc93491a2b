import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import type { FastifyRequest } from "fastify";
import { ApiError, type ApiKeyDoc, type ApiKeyStore, type Clock, hashSecret, keyIsUsable, type MongoStore, Subjects, type WorkspaceDoc } from "../src/index.js";

/** What authentication reads: a key by its hash (and records its use), and its workspace. */
export type AuthStore = Pick<MongoStore, "getWorkspace"> & { keys: Pick<ApiKeyStore, "findByHash" | "recordUse"> };

/** Who is calling: the key's workspace and scopes. */
export interface AuthContext {
  workspace: WorkspaceDoc;
  keyId: string;
  scopes: ReadonlySet<string>;
  /** When the key stops working as it was read (a rotation's grace, a revocation to come), or null. */
  usableUntilMs: number | null;
  /** The {@link Authenticator.generation} it was read at: a later one means keys changed since. */
  generation: number;
}

interface CacheEntry {
  key: ApiKeyDoc | null;
  workspace: WorkspaceDoc | null;
  fetchedMs: number;
}

const LAST_USED_EVERY_MS = 60_000;

/**
 * Bearer-key authentication with a short cache. Revocations are published on NATS so
 * every node drops the cached key at once; the cache lifetime bounds the rest. When an
 * entry is due, one lookup serves every request waiting for it (64 concurrent requests
 * of one key used to look it up 64 times each time the entry expired).
 */
export class Authenticator {
  private readonly cache = new Map<string, CacheEntry>();
  /** Lookups in flight by key hash; dropped on invalidation so later requests read afresh. */
  private readonly loading = new Map<string, Promise<CacheEntry>>();
  /** Bumped by every invalidation: a lookup begun before it does not fill the cache. */
  private generationCount = 0;

  /** How many changes of keys (revocations, rotations) this node has heard of. */
  get generation(): number {
    return this.generationCount;
  }
  private readonly lastUsedWrites = new Map<string, number>();
  private sub: Subscription | undefined;
  /** Called at every invalidation, here or on another node, with the key it names (open event streams check theirs again). */
  private readonly invalidationListeners = new Set<(keyId: string | undefined) => void>();

  constructor(
    private readonly store: AuthStore,
    private readonly clock: Clock,
    private readonly cacheMs: number,
    private readonly nc?: NatsConnection,
  ) {
    this.sub = nc?.subscribe(Subjects.authInvalidate, {
      callback: (_err, msg) => this.forget(msg?.string() || undefined),
    });
  }

  close(): void {
    this.sub?.unsubscribe();
  }

  /** Tells every node that a key changed (revoked or rotated): `keyId` names it, for those that care about one key. */
  invalidate(keyId?: string): void {
    this.forget(keyId);
    this.nc?.publish(Subjects.authInvalidate, keyId ?? "");
  }

  /** `listener` is called after every invalidation from now on (with the key it names, if any), until the returned function is called. */
  onInvalidated(listener: (keyId: string | undefined) => void): () => void {
    this.invalidationListeners.add(listener);
    return () => this.invalidationListeners.delete(listener);
  }

  private forget(keyId?: string): void {
    this.generationCount++;
    this.cache.clear();
    this.loading.clear();
    for (const listener of this.invalidationListeners) listener(keyId);
  }

  async authenticate(request: FastifyRequest): Promise<AuthContext> {
    const header = request.headers.authorization;
    const match = typeof header === "string" ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
    if (!match) {
      // A key sent without its scheme is told so, not that none was sent (found by a probe).
      const message = header === undefined ? "Missing API key: send Authorization: Bearer <API_KEY>." : "The Authorization header must be Bearer <API_KEY>.";
      throw new ApiError("unauthorized", { message });
    }
    const hash = hashSecret(match[1]!);
    const now = this.clock.nowMs();
    // Taken before the read: a change heard while it reads makes the answer's generation old.
    const generation = this.generationCount;
    let entry = this.cache.get(hash);
    if (!entry || now - entry.fetchedMs > this.cacheMs) entry = await this.lookup(hash, now);
    const { key, workspace } = entry;
    if (!key || !workspace || !keyIsUsable(key, now)) {
      throw new ApiError("unauthorized", { message: "Invalid or revoked API key." });
    }
    this.touch(key, now);
    const ends = [key.revoked_at, key.revokes_at].filter((at): at is number => at !== null);
    return { workspace, keyId: key._id, scopes: new Set(key.scopes), usableUntilMs: ends.length ? Math.min(...ends) : null, generation };
  }

  private lookup(hash: string, now: number): Promise<CacheEntry> {
    const inFlight = this.loading.get(hash);
    if (inFlight) return inFlight;
    const generation = this.generation;
    const loaded = (async () => {
      const key = await this.store.keys.findByHash(hash);
      const workspace = key ? await this.store.getWorkspace(key.workspace_id) : null;
      const entry: CacheEntry = { key, workspace, fetchedMs: now };
      if (generation === this.generation) {
        if (this.cache.size > 10_000) this.cache.clear();
        this.cache.set(hash, entry);
      }
      return entry;
    })();
    this.loading.set(hash, loaded);
    const done = () => {
      if (this.loading.get(hash) === loaded) this.loading.delete(hash);
    };
    loaded.then(done, done);
    return loaded;
  }

  /** `last_used_at` is written at most once a minute per key, never on the request path. */
  private touch(key: ApiKeyDoc, now: number): void {
    const last = this.lastUsedWrites.get(key._id) ?? key.last_used_at ?? 0;
    if (now - last < LAST_USED_EVERY_MS) return;
    this.lastUsedWrites.set(key._id, now);
    void this.store.keys.recordUse(key._id, now).catch(() => undefined);
  }
}

/**
 * 403 unless the key holds `scope`. `because`: why a request needs it beyond its route's
 * scope (what it would send, and where), told in the message, and the field that asks it.
 */
export function requireScope(auth: AuthContext, scope: string, because?: { why: string; param?: string }): void {
  if (!auth.scopes.has(scope)) {
    throw new ApiError("permission_denied", { param: because?.param ?? null, message: `This API key lacks the scope ${scope}${because ? `: ${because.why}` : ""}.` });
  }
}
