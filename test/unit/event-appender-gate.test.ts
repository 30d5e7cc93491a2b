import test from "ava";
import type { MsgHdrs } from "@nats-io/transport-node";
import { JetStreamAppender } from "../../src/event-appender.js";
import type { StoredAck } from "../../src/js-publisher.js";

/**
 * While the owner's lease is in doubt its event writes wait at the gate: nothing is
 * published, then everything in order once the lease is confirmed; if the lease is
 * lost, nothing held is published and flush reports the failure.
 */

function world() {
  const published: string[] = [];
  const publisher = {
    publish: async (_subject: string, _payload: Uint8Array, msgId: string, _headers: MsgHdrs): Promise<StoredAck> => {
      published.push(msgId);
      return { stream: "EVENTS", seq: published.length, duplicate: false };
    },
    floor: () => undefined,
  };
  let gate: Promise<void> | undefined;
  const appender = new JetStreamAppender(publisher, new Uint8Array(32), { id: "run_1", workspace_id: "ws_1", plan: "solo" }, 1, { gate: () => gate });
  return { published, appender, setGate: (g: Promise<void> | undefined) => (gate = g) };
}

const tick = () => new Promise((resolve) => setImmediate(resolve));

test("event gate - writes wait while the lease is in doubt and go out in order when it is confirmed", async (t) => {
  const { published, appender, setGate } = world();
  appender.append(null, "platform", "run.created", {}, 0);
  await appender.flush();
  let confirm!: () => void;
  setGate(new Promise<void>((resolve) => (confirm = resolve)));
  for (let i = 0; i < 5; i++) appender.append("turn_1", "runtime", "text_delta", { delta: String(i) }, 0);
  await tick();
  t.deepEqual(published, ["run_1:1"], "nothing published while in doubt");
  setGate(undefined);
  confirm();
  await appender.flush();
  t.deepEqual(published, ["run_1:1", "run_1:2", "run_1:3", "run_1:4", "run_1:5", "run_1:6"]);
});

test("event gate - a lease lost while in doubt publishes nothing held, and flush fails", async (t) => {
  const { published, appender, setGate } = world();
  let lose!: (err: Error) => void;
  const held = new Promise<void>((_, reject) => (lose = reject));
  held.catch(() => undefined);
  setGate(held);
  appender.append(null, "platform", "run.created", {}, 0);
  appender.append("turn_1", "platform", "turn.started", {}, 0);
  lose(new Error("partition lost"));
  await t.throwsAsync(appender.flush(), { message: /Event 1 could not be stored: partition lost/ });
  t.deepEqual(published, []);
});
