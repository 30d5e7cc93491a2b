import test from "ava";
import type { MsgHdrs } from "@nats-io/transport-node";
import { JetStreamAppender } from "../../src/event-appender.js";
import { FLOOR_HEADER, MAX_EVENTS_AHEAD, STORED_BELOW_HEADER } from "../../src/event-order.js";
import type { StoredAck } from "../../src/js-publisher.js";
import { PublishError } from "../../src/js-publisher.js";

/**
 * The appender's window: an event is sent only when every event MAX_EVENTS_AHEAD numbers
 * before it is stored (readers rely on it to put events back in order), and each event
 * carries the publisher's floor at its first send.
 */
function world() {
  const sent: Array<{ seq: number; floor: string | undefined; storedBelow?: string }> = [];
  const pending = new Map<number, { resolve: (ack: StoredAck) => void; reject: (err: Error) => void }>();
  let stored = 0;
  let floor: number | undefined;
  const storedBelowOf = new Map<number, string>();
  const publisher = {
    publish: (_subject: string, _payload: Uint8Array, msgId: string, headers: MsgHdrs): Promise<StoredAck> => {
      const seq = Number(msgId.split(":")[1]);
      sent.push({ seq, floor: headers.has(FLOOR_HEADER) ? headers.get(FLOOR_HEADER) : undefined });
      storedBelowOf.set(seq, headers.get(STORED_BELOW_HEADER));
      return new Promise((resolve, reject) => pending.set(seq, { resolve, reject }));
    },
    floor: () => floor,
  };
  const appender = new JetStreamAppender(publisher, new Uint8Array(32), { id: "run_1", workspace_id: "ws_1", plan: "solo" }, 1, {});
  const ack = (seq: number) => {
    pending.get(seq)!.resolve({ stream: "EVENTS_SOLO", seq: ++stored, duplicate: false });
    pending.delete(seq);
  };
  return { sent, pending, appender, ack, storedBelowOf, setFloor: (f: number | undefined) => (floor = f) };
}

const tick = () => new Promise((resolve) => setImmediate(resolve));

test("event appender - one event unacknowledged holds back the event MAX_EVENTS_AHEAD after it, not the ones before", async (t) => {
  const { sent, appender, ack } = world();
  const total = MAX_EVENTS_AHEAD + 10;
  for (let i = 0; i < total; i++) appender.append("turn_1", "runtime", "text_delta", { delta: String(i) }, 0);
  await tick();
  t.is(sent.length, MAX_EVENTS_AHEAD, "events 1..MAX_EVENTS_AHEAD sent without waiting");
  // Every event but the first is stored: the window does not move past 1.
  for (let seq = 2; seq <= MAX_EVENTS_AHEAD; seq++) ack(seq);
  await tick();
  t.is(sent.length, MAX_EVENTS_AHEAD, `event ${MAX_EVENTS_AHEAD + 1} waits for event 1`);
  ack(1);
  await tick();
  t.is(sent.length, total, "event 1 stored: the rest go out");
  t.deepEqual(
    sent.map((s) => s.seq),
    Array.from({ length: total }, (_, i) => i + 1),
    "sent in sequence order",
  );
  for (let seq = MAX_EVENTS_AHEAD + 1; seq <= total; seq++) ack(seq);
  await appender.flush();
  t.pass();
});

test("event appender - a failed event never lets events MAX_EVENTS_AHEAD after it out; flush reports it", async (t) => {
  const { sent, pending, appender, ack } = world();
  for (let i = 0; i < MAX_EVENTS_AHEAD + 5; i++) appender.append("turn_1", "runtime", "text_delta", { delta: String(i) }, 0);
  await tick();
  pending.get(3)!.reject(new PublishError("no ack from JetStream in time", true));
  pending.delete(3);
  // Acks let the events up to 3's window out (1 and 2 are stored), and no further.
  for (let round = 0; round < 10 && pending.size > 0; round++) {
    for (const seq of [...pending.keys()]) ack(seq);
    await tick();
  }
  await t.throwsAsync(appender.flush(), { message: /Event 3 could not be stored/ });
  t.is(Math.max(...sent.map((s) => s.seq)), 3 + MAX_EVENTS_AHEAD - 1, "nothing sent past the failed event's window");
});

test("event appender - each event carries the publisher's floor at its first send, none while it knows none", async (t) => {
  const { sent, appender, ack, setFloor } = world();
  appender.append(null, "platform", "run.created", {}, 0);
  setFloor(0);
  appender.append(null, "platform", "run.queued", {}, 0);
  setFloor(41);
  appender.append("turn_1", "platform", "turn.started", {}, 0);
  setFloor(57);
  appender.append("turn_1", "runtime", "text_delta", { delta: "a" }, 0);
  await tick();
  t.deepEqual(sent, [
    { seq: 1, floor: undefined },
    { seq: 2, floor: "0" },
    { seq: 3, floor: "41" },
    { seq: 4, floor: "57" },
  ]);
  for (const seq of [1, 2, 3, 4]) ack(seq);
  await appender.flush();
});

test("event appender - resumed after a failure, later events are sent again, numbered on, each saying every event below the first of them is stored or gone (readers do not wait for the lost ones)", async (t) => {
  const { sent, pending, appender, ack, storedBelowOf } = world();
  for (let i = 0; i < 4; i++) appender.append("turn_1", "runtime", "text_delta", { delta: String(i) }, 0);
  await tick();
  ack(1);
  pending.get(2)!.reject(new PublishError("no ack from JetStream in time", true));
  pending.delete(2);
  ack(3);
  ack(4);
  for (let i = 0; i < 5 && !appender.failure; i++) await tick();
  t.truthy(appender.failure);
  t.is(appender.append("turn_1", "runtime", "text_delta", { delta: "dropped" }, 0), 5, "numbered, not sent");
  await t.throwsAsync(appender.flush(), { message: /Event 2 could not be stored/ });
  appender.resume();
  t.is(appender.failure, null);
  t.is(appender.append("turn_1", "platform", "turn.failed", {}, 0), 6);
  t.is(appender.append(null, "platform", "run.tags_changed", {}, 0), 7);
  await tick();
  t.deepEqual(sent.map((s) => s.seq), [1, 2, 3, 4, 6, 7], "5 stays dropped; 6 and 7 go out");
  t.is(storedBelowOf.get(6), "6");
  ack(6);
  ack(7);
  await appender.flush();
  t.is(appender.nextSequence, 8);
});
