import type { Collection, Db } from "mongodb";
import type { Clock } from "./clock.js";
import { ApiError, invalid } from "./errors.js";
import { deriveLabelledKey, KEY_BYTES, open, seal } from "./event-crypto.js";
import { guard } from "./mongo-guard.js";

/**
 * Environment values (decisions §3): named secrets of a workspace, encrypted at rest with
 * tweetnacl secretbox under a per-workspace key derived from `RUNS_MASTER_KEY`, and the
 * way provider credentials reach agents (`resolveAll`).
 */

export const ENV_VALUES_COLLECTION = "env_values";
/** Names: an upper-case letter or underscore, then up to 127 of A–Z, 0–9, _. */
export const ENV_NAME_PATTERN = /^[A-Z_][A-Z0-9_]{0,127}$/;
/** Largest value, in UTF-8 bytes. */
export const MAX_ENV_VALUE_BYTES = 64 * 1024;

export interface EnvValueDoc {
  /** `${workspace_id}:${name}` */
  _id: string;
  workspace_id: string;
  name: string;
  /** base64 of `nonce || secretbox(JSON {n: name, v: value})`. */
  sealed: string;
  /** Unix milliseconds. */
  created_at: number;
  updated_at: number;
}

/** What callers see of a value: its name and times (Unix milliseconds), plus the value when asked. */
export interface EnvValueEntry {
  name: string;
  created_at: number;
  updated_at: number;
  value?: string;
}

/** The stored value could not be opened (wrong master key, or the document was changed). */
export class EnvValueDecryptError extends Error {
  constructor(readonly valueName: string) {
    super(`The environment value ${valueName} could not be decrypted.`);
    this.name = "EnvValueDecryptError";
  }
}

/**
 * Per-workspace key for environment values: HMAC-SHA256(master, "runs-env:" + workspaceId).
 * A label distinct from the event keys', so an event key never opens a value and back.
 */
export function deriveEnvKey(master: Uint8Array, workspaceId: string): Uint8Array {
  return deriveLabelledKey(master, "env", workspaceId);
}

/** 400 param `name` unless `name` matches {@link ENV_NAME_PATTERN}. */
export function checkEnvName(name: string): string {
  if (!ENV_NAME_PATTERN.test(name)) {
    throw invalid("name", "name must start with A-Z or _ and hold only A-Z, 0-9 and _ (at most 128 characters).");
  }
  return name;
}

/** 400 param `value` unless `value` is a string of at most 64 KiB. */
export function checkEnvValue(value: unknown): string {
  if (typeof value !== "string") throw invalid("value", "value must be a string.");
  if (Buffer.byteLength(value, "utf8") > MAX_ENV_VALUE_BYTES) throw invalid("value", "value must be at most 64 KiB.");
  if (!isHeaderSafe(value)) {
    throw invalid("value", "value must not hold control characters (a line break, NUL, …; a tab is allowed): it is sent as a credential in an HTTP header.");
  }
  return value;
}

/**
 * Whether a value can be sent in an HTTP header field (RFC 9110: no control character but
 * horizontal tab). A value is how a provider credential reaches the agent (decisions §3),
 * always as a header. One with a line break or NUL made the HTTP client refuse the request
 * with a message quoting the whole header, value included, which the turn's error, its
 * events and webhooks then carried to anyone with run:read (found by a probe).
 */
export function isHeaderSafe(value: string): boolean {
  return !/[\u0000-\u0008\u000a-\u001f\u007f]/.test(value);
}

/** How long a node reuses a workspace's decrypted values for new turns. */
export const RESOLVE_CACHE_MS = 2_000;

/** Environment values of every workspace, over the `env_values` collection. */
export class EnvValues {
  private readonly collection: Collection<EnvValueDoc>;
  private readonly master: Buffer;
  private readonly keys = new Map<string, Uint8Array>();
  private readonly resolved = new Map<string, { values: Record<string, string>; atMs: number }>();

  /** `masterKeyBase64` is `RUNS_MASTER_KEY`: 32 bytes of base64. */
  constructor(
    db: Db,
    masterKeyBase64: string,
    private readonly clock: Clock,
  ) {
    const master = Buffer.from(masterKeyBase64, "base64");
    if (master.length !== KEY_BYTES) throw new Error(`The master key must be ${KEY_BYTES} bytes of base64.`);
    this.master = master;
    this.collection = db.collection<EnvValueDoc>(ENV_VALUES_COLLECTION);
  }

  /** Creates the list index; safe on every start. */
  async provision(): Promise<void> {
    await guard(() => this.collection.createIndex({ workspace_id: 1, name: 1 }, { name: "ws_name" }));
  }

  /** Creates or replaces a value; `created_at` is kept on replace. Validates name and value. */
  async put(workspaceId: string, name: string, value: unknown): Promise<EnvValueEntry> {
    checkEnvName(name);
    const plain = checkEnvValue(value);
    const now = this.clock.nowMs();
    this.resolved.delete(workspaceId);
    const sealed = Buffer.from(seal(this.keyFor(workspaceId), Buffer.from(JSON.stringify({ n: name, v: plain }), "utf8"))).toString("base64");
    const doc = await guard(() =>
      this.collection.findOneAndUpdate(
        { _id: `${workspaceId}:${name}` },
        { $set: { sealed, updated_at: now }, $setOnInsert: { workspace_id: workspaceId, name, created_at: now } },
        { upsert: true, returnDocument: "after" },
      ),
    );
    if (!doc) throw new Error("upsert returned no document");
    return entryOf(doc);
  }

  /**
   * Names and times of a workspace's values, by name ascending; `after` is the last name
   * of the previous page. Asks for `limit` documents (pass page size + 1 to learn has_more).
   */
  async list(workspaceId: string, limit: number, after?: string): Promise<EnvValueEntry[]> {
    // A string bound on name (also on the first page) lets the embedded store order the page from its index.
    const filter = { workspace_id: workspaceId, name: after === undefined ? { $gte: "" } : { $gt: after } };
    const docs = await guard(() =>
      this.collection.find(filter, { projection: { sealed: 0 } }).sort({ name: 1 }).limit(limit).toArray(),
    );
    return docs.map(entryOf);
  }

  /** One value's entry, with `value` decrypted only when `reveal`; null when absent. */
  async get(workspaceId: string, name: string, reveal = false): Promise<EnvValueEntry | null> {
    if (!ENV_NAME_PATTERN.test(name)) return null;
    const doc = await guard(() => this.collection.findOne({ _id: `${workspaceId}:${name}`, workspace_id: workspaceId }));
    if (!doc) return null;
    const entry = entryOf(doc);
    if (reveal) entry.value = this.openDoc(doc);
    return entry;
  }

  /** Deletes a value; false when there was none. */
  async delete(workspaceId: string, name: string): Promise<boolean> {
    if (!ENV_NAME_PATTERN.test(name)) return false;
    this.resolved.delete(workspaceId);
    const result = await guard(() => this.collection.deleteOne({ _id: `${workspaceId}:${name}`, workspace_id: workspaceId }));
    return result.deletedCount > 0;
  }

  /**
   * Every value of the workspace, decrypted: name → value. For the agent runner (provider
   * credentials). Throws {@link EnvValueDecryptError} if a stored value cannot be opened.
   */
  /** Every value of a workspace, decrypted, read from the store now. */
  async resolveAll(workspaceId: string): Promise<Record<string, string>> {
    const docs = await guard(() => this.collection.find({ workspace_id: workspaceId }).toArray());
    const out: Record<string, string> = {};
    for (const doc of docs) out[doc.name] = this.openDoc(doc);
    return out;
  }

  /**
   * `resolveAll` for starting turns, cached for `RESOLVE_CACHE_MS` per workspace on
   * this node: a changed credential reaches turns that start at most that much later
   * (at once on the node that changed it).
   */
  async resolveForTurn(workspaceId: string): Promise<Record<string, string>> {
    const now = this.clock.nowMs();
    const hit = this.resolved.get(workspaceId);
    if (hit && now - hit.atMs < RESOLVE_CACHE_MS) return hit.values;
    const values = await this.resolveAll(workspaceId);
    if (this.resolved.size > 10_000) this.resolved.clear();
    this.resolved.set(workspaceId, { values, atMs: now });
    return values;
  }

  private keyFor(workspaceId: string): Uint8Array {
    let key = this.keys.get(workspaceId);
    if (!key) {
      key = deriveEnvKey(this.master, workspaceId);
      this.keys.set(workspaceId, key);
    }
    return key;
  }

  // The plaintext carries the name, so a sealed value moved to another name's document
  // (secretbox has no associated data) fails to open instead of answering for it.
  private openDoc(doc: EnvValueDoc): string {
    try {
      const plain = JSON.parse(Buffer.from(open(this.keyFor(doc.workspace_id), Buffer.from(doc.sealed, "base64"))).toString("utf8")) as {
        n?: unknown;
        v?: unknown;
      };
      if (plain.n !== doc.name || typeof plain.v !== "string") throw new Error("mismatch");
      return plain.v;
    } catch {
      throw new EnvValueDecryptError(doc.name);
    }
  }
}

function entryOf(doc: Pick<EnvValueDoc, "name" | "created_at" | "updated_at">): EnvValueEntry {
  return { name: doc.name, created_at: doc.created_at, updated_at: doc.updated_at };
}

/** 404 not_found for an unknown environment value. */
export function envValueNotFound(name: string): ApiError {
  return new ApiError("not_found", { param: "name", message: `No environment value named ${name}.` });
}
