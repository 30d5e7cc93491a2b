/**
 * The shared floor (docs/architecture.md): what `gateway/`, `actors/` and `node/` may
 * import, and the only file of `src/` they import from. Nothing here imports a folder
 * above it.
 */

// The domain and its pure decisions.
export * from "./domain.js";
export * from "./usage.js";
export * from "./usage-ledger.js";
export * from "./webhook-signing.js";
export * from "./webhooks.js";
export * from "./errors.js";
export * from "./turn-errors.js";
export * from "./turn-state.js";
export * from "./approval.js";
export * from "./scopes.js";
export * from "./agent-config.js";
export * from "./request-schemas.js";
export * from "./run-request.js";
export * from "./run-list.js";
export * from "./cursors.js";
export * from "./event-ids.js";
export * from "./event-sanitize.js";
export * from "./history-status.js";
export * from "./json-depth.js";
export * from "./partition.js";
export * from "./models.js";
export * from "./render.js";
export * from "./final-notice.js";
export * from "./commands.js";
export * from "./documents.js";
export * from "./contracts.js";
export * from "./deployments.js";

// Configuration, time, ids, secrets.
export * from "./config.js";
export * from "./clock.js";
export * from "./ids.js";
export * from "./api-keys.js";
export * from "./cursor-key.js";
export * from "./event-crypto.js";
export { secretboxBackend, secretboxReady } from "./secretbox-open.js";
export * from "./blob-crypto.js";
export * from "./address-guard.js";
export * from "./transient.js";
export * from "./object-read.js";

// Adapters: MongoDB and NATS JetStream.
export * from "./mongo-guard.js";
export * from "./api-key-store.js";
export * from "./mongo-store.js";
export * from "./insert-batcher.js";
export * from "./bounded-work.js";
export * from "./object-chunks.js";
export * from "./nats.js";
export * from "./js-publisher.js";
export * from "./event-types.js";
export * from "./event-envelope.js";
export * from "./event-log.js";
export * from "./byte-streams.js";
export * from "./upload-decisions.js";
export * from "./file-store.js";
export * from "./env-values.js";
