import test from "ava";
import type { FastifyRequest } from "fastify";
import { Authenticator, type AuthStore } from "../../gateway/auth.js";
import { systemClock } from "../../src/clock.js";
import { hashSecret } from "../../src/api-keys.js";
import { ApiError } from "../../src/errors.js";
import type { ApiKeyDoc, WorkspaceDoc } from "../../src/documents.js";

const SECRET = "sk_test_secret";
const workspace: WorkspaceDoc = { _id: "ws_1", name: "w", plan: "solo", created_at: 0 };

/** The two store reads the authenticator makes, counted; `release` lets a held lookup finish. */
function fakeStore() {
  const key: ApiKeyDoc = {
    _id: "key_1", workspace_id: "ws_1", hash: hashSecret(SECRET), key_prefix: "sk_test", label: null, scopes: ["run:read"],
    mode: "test", created_at: 0, updated_at: 0, last_used_at: Date.now(), revoked_at: null, revokes_at: null,
  };
  const state = { lookups: 0, hold: false, waiting: [] as Array<() => void>, key };
  const store: AuthStore = {
    keys: {
      async findByHash(hash: string) {
        state.lookups++;
        const snapshot = { ...state.key };
        if (state.hold) await new Promise<void>((resolve) => state.waiting.push(resolve));
        return hash === state.key.hash ? snapshot : null;
      },
      async recordUse() {},
    },
    async getWorkspace() {
      return workspace;
    },
  };
  return { state, store, release: () => state.waiting.splice(0).forEach((r) => r()) };
}

const request = { headers: { authorization: `Bearer ${SECRET}` } } as FastifyRequest;
const clock = systemClock;

test("auth-cache - concurrent requests of one key share one lookup when the entry is due", async (t) => {
  const { state, store } = fakeStore();
  const auth = new Authenticator(store, clock, 60_000);
  const results = await Promise.all(Array.from({ length: 64 }, () => auth.authenticate(request)));
  t.is(state.lookups, 1);
  t.true(results.every((r) => r.keyId === "key_1" && r.workspace._id === "ws_1"));
  await auth.authenticate(request);
  t.is(state.lookups, 1, "then served from the cache");
});

test("auth-cache - a lookup begun before an invalidation neither fills the cache nor serves later requests", async (t) => {
  const { state, store, release } = fakeStore();
  const auth = new Authenticator(store, clock, 60_000);
  state.hold = true;
  const early = auth.authenticate(request); // reads the key before it is revoked
  await new Promise((resolve) => setImmediate(resolve));
  state.key.revoked_at = Date.now() - 1;
  auth.invalidate();
  const late = auth.authenticate(request); // after the revocation: a lookup of its own
  await new Promise((resolve) => setImmediate(resolve));
  t.is(state.lookups, 2);
  release();
  const answered = await early;
  t.is(answered.keyId, "key_1", "the request that began before the revocation is answered as it was read");
  t.true(answered.generation < auth.generation, "and says it was read before a change of keys (a waiting POST reads it again: review)");
  await t.throwsAsync(late, { instanceOf: ApiError, message: /revoked/ });
  state.hold = false;
  await t.throwsAsync(auth.authenticate(request), { instanceOf: ApiError });
  t.is(state.lookups, 2, "the revoked answer is what the cache holds now");
});
