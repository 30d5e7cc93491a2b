import anyTest, { type TestFn } from "ava";
import type { NatsConnection } from "@nats-io/transport-node";
import { connectNats, encodeFinalNotice, renderRun, Subjects, systemClock, TurnStatus, type RunDoc, type TurnDoc } from "../../src/index.js";
import { turnNotices } from "../../gateway/turn-notices.js";
import { startTestServers, type TestServers } from "../helpers/servers.js";

/** What a default-wait request hears of a turn, over a real nats-server. */
const test = anyTest as TestFn<{ servers: TestServers; nc: NatsConnection }>;

test.before(async (t) => {
  const servers = await startTestServers();
  const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "turn-notices-test" });
  t.context = { servers, nc };
});

test.after.always(async (t) => {
  await t.context.nc?.close();
  await t.context.servers?.stop();
});

const run = (id: string, turnId: string): RunDoc => ({
  _id: id, workspace_id: "ws_1", agent_id: "agt_1", agent_version: 1, versions: [1], partition: 0, state: "idle", tags: [], plan: "solo",
  retention_s: 60, event_retention_s: 60, created_at: 1_000, last_activity_at: 2_000, expires_at: 9e12, epoch: 1, turn_count: 1,
  latest_turn_id: turnId, active_turn_id: null, queued_turn_id: null, event_seq: 3,
});
const turn = (id: string, runId: string): TurnDoc => ({
  _id: id, run_id: runId, workspace_id: "ws_1", index: 0, status: TurnStatus.completed, agent_version: 1, input: [{ type: "input_text", text: "hi" }],
  output: [{ type: "output_text", text: "hi" }], error: null, created_at: 1_000, started_at: 1_000, completed_at: 2_000, duration_ms: 1_000,
  transcript: [], disposition: "created", steer_ids: [], first_event_seq: 1, epoch: 1,
});

test("a waiting notice prompts one re-read and does not end the wait: the final notice still comes, with its view", async (t) => {
  const { nc } = t.context;
  const notices = turnNotices({ nc, clock: systemClock }, "run_N1", "turn_N1");
  try {
    await nc.flush(); // the subscription is registered before anything is published
    t.is(await notices.next(50), "timeout");
    nc.publish(Subjects.turnWaiting("turn_N1"), "");
    t.is(await notices.next(5_000), "waiting");
    // Heard once: the next call waits again (a decision may have let the turn go on).
    t.is(await notices.next(50), "timeout");
    nc.publish(Subjects.turnWaiting("turn_N1"), ""); // a second gated call
    t.is(await notices.next(5_000), "waiting");
    t.is(notices.view(), undefined);
    const view = renderRun(run("run_N1", "turn_N1"), turn("turn_N1", "run_N1"));
    nc.publish(Subjects.turnFinal("turn_N1"), encodeFinalNotice(view));
    t.is(await notices.next(5_000), "final");
    t.deepEqual(notices.view(), JSON.parse(JSON.stringify(view)));
    // Final for good: later calls answer at once, whatever else is published.
    nc.publish(Subjects.turnWaiting("turn_N1"), "");
    t.is(await notices.next(5_000), "final");
  } finally {
    notices.sub.unsubscribe();
  }
});

test("another turn's notices are not heard; a final notice without a view (too large) or with another run's view ends the wait without one", async (t) => {
  const { nc } = t.context;
  const notices = turnNotices({ nc, clock: systemClock }, "run_N2", "turn_N2");
  const other = turnNotices({ nc, clock: systemClock }, "run_N2", "turn_N3");
  try {
    await nc.flush();
    nc.publish(Subjects.turnFinal("turn_OTHER"), "");
    nc.publish(Subjects.turnWaiting("turn_OTHER"), "");
    t.is(await notices.next(200), "timeout");
    nc.publish(Subjects.turnFinal("turn_N2"), "");
    t.is(await notices.next(5_000), "final");
    t.is(notices.view(), undefined, "an empty notice: the store is read");
    nc.publish(Subjects.turnFinal("turn_N3"), encodeFinalNotice(renderRun(run("run_ELSE", "turn_N3"), turn("turn_N3", "run_ELSE"))));
    t.is(await other.next(5_000), "final");
    t.is(other.view(), undefined, "a view of another run is not taken");
  } finally {
    notices.sub.unsubscribe();
    other.sub.unsubscribe();
  }
});
