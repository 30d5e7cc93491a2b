import test from "ava";
import { deleteRunOnce } from "../../gateway/routes/runs.js";
import { ApiError } from "../../src/errors.js";

/**
 * The work of one DELETE (its idempotency is around it): a run gone between the read and
 * the command, deleted as its tombstone says, answers deleted; found by the chaos run (a
 * node paused with the first attempt of a key, the second attempt taking over, both
 * reaching the owner: the late one's 404 released the key, and a repeat then answered 404).
 */
const WS = "ws_1";
const RUN = "run_1";

function ctx(options: { run: boolean; tombstone: "deleted" | "expired" | null; sendFails?: ApiError }) {
  const sent: unknown[] = [];
  const fake = {
    clock: { nowMs: () => 1_000 },
    config: { turnLimitMs: 60_000 },
    store: {
      getRun: async () => (options.run ? { _id: RUN, workspace_id: WS, expires_at: 10_000 } : null),
      getTombstone: async () => (options.tombstone ? { _id: RUN, workspace_id: WS, reason: options.tombstone } : null),
    },
    router: {
      send: async (command: unknown) => {
        sent.push(command);
        if (options.sendFails) throw options.sendFails;
        return { ok: true };
      },
    },
  };
  return { ctx: fake as never, sent };
}

const notFound = () => new ApiError("run_not_found", { param: "runId" });

test("delete - a run deleted between the read and the command (its tombstone says deleted) answers deleted, first claim or repeat", async (t) => {
  for (const firstClaim of [true, false]) {
    const { ctx: c, sent } = ctx({ run: true, tombstone: "deleted", sendFails: notFound() });
    t.deepEqual(await deleteRunOnce(c, WS, RUN, firstClaim), { run_id: RUN, deleted: true });
    t.is(sent.length, 1);
  }
});

test("delete - the command's run_not_found without a deleted tombstone stays 404", async (t) => {
  for (const tombstone of [null, "expired"] as const) {
    const { ctx: c } = ctx({ run: true, tombstone, sendFails: notFound() });
    const err = await t.throwsAsync(deleteRunOnce(c, WS, RUN, false));
    t.is((err as ApiError).code, "run_not_found");
  }
});

test("delete - a run already gone when read: a repeat of the key answers deleted from the tombstone, a first claim is 404", async (t) => {
  const repeat = ctx({ run: false, tombstone: "deleted" });
  t.deepEqual(await deleteRunOnce(repeat.ctx, WS, RUN, false), { run_id: RUN, deleted: true });
  t.is(repeat.sent.length, 0, "no command for a run already gone");
  const first = ctx({ run: false, tombstone: "deleted" });
  t.is(((await t.throwsAsync(deleteRunOnce(first.ctx, WS, RUN, true))) as ApiError).code, "run_not_found");
});

test("delete - other failures of the command pass through (a 503 keeps the key for a retry)", async (t) => {
  const { ctx: c } = ctx({ run: true, tombstone: "deleted", sendFails: new ApiError("runtime_unavailable", { retryAfterS: 1 }) });
  t.is(((await t.throwsAsync(deleteRunOnce(c, WS, RUN, false))) as ApiError).code, "runtime_unavailable");
  const ok = ctx({ run: true, tombstone: null });
  t.deepEqual(await deleteRunOnce(ok.ctx, WS, RUN, true), { run_id: RUN, deleted: true });
});
