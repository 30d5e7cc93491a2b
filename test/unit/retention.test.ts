import test from "ava";
import { busyGraceMs, runExpired } from "../../src/domain.js";

/** runExpired: every state against the moments that decide it. */
test("retention - an idle run expires at its expires_at; a busy one only once the turn limit and a minute have passed beyond it too", (t) => {
  const limit = 12 * 3600_000;
  const at = 1_000_000_000;
  const cases: Array<[state: "idle" | "busy", now: number, expired: boolean]> = [
    ["idle", at - 1, false],
    ["idle", at, true],
    ["idle", at + 1, true],
    ["busy", at, false],
    ["busy", at + limit, false],
    ["busy", at + busyGraceMs(limit) - 1, false],
    ["busy", at + busyGraceMs(limit), true],
  ];
  for (const [state, now, expired] of cases) t.is(runExpired({ state, expires_at: at }, now, limit), expired, `${state} at ${now - at} ms`);
  t.is(busyGraceMs(limit), limit + 60_000);
});
