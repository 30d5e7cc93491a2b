import test from "ava";
import { Webhook } from "standardwebhooks";
import { newWebhookSecret, nextAttemptAt, signWebhook, WEBHOOK_EVENT_TYPES, wantsEvent } from "../../src/webhook-signing.js";
import { MAX_WEBHOOK_RUN_BYTES, webhookData } from "../../actors/turn-execution.js";

test("webhooks - our signature is the Standard Webhooks library's, for each secret; a changed byte fails", (t) => {
  const [a, b] = [newWebhookSecret(), newWebhookSecret()];
  t.regex(a, /^whsec_[A-Za-z0-9+/]{43}=$/);
  t.not(a, b);
  const body = JSON.stringify({ type: "turn.completed", data: { text: "héllo" } });
  const ts = Math.floor(Date.now() / 1000);
  t.is(signWebhook([a], "msg_1", ts, body), new Webhook(a).sign("msg_1", new Date(ts * 1000), body));
  const both = signWebhook([a, b], "msg_1", ts, body);
  t.is(both.split(" ").length, 2);
  const headers = { "webhook-id": "msg_1", "webhook-timestamp": String(ts), "webhook-signature": both };
  for (const secret of [a, b]) t.notThrows(() => new Webhook(secret).verify(body, headers));
  t.throws(() => new Webhook(a).verify(body.replace("héllo", "hello"), headers));
  t.throws(() => new Webhook(a).verify(body, { ...headers, "webhook-id": "msg_2" }));
  t.throws(() => signWebhook(["not-a-secret"], "msg_1", ts, body));
});

test("webhooks - which endpoint wants which event: every type × wildcard, agent filter, enabled", (t) => {
  for (const type of WEBHOOK_EVENT_TYPES) {
    for (const agentFilter of [null, "agt_a", "agt_b"]) {
      for (const enabled of [true, false]) {
        for (const subscribed of [["*"], [type], WEBHOOK_EVENT_TYPES.filter((x) => x !== type)]) {
          const expected = enabled && (agentFilter === null || agentFilter === "agt_a") && (subscribed.includes("*") || subscribed.includes(type));
          t.is(wantsEvent({ enabled, agent_id: agentFilter, event_types: subscribed }, type, "agt_a"), expected, JSON.stringify([type, agentFilter, enabled, subscribed]));
        }
      }
    }
  }
});

test("webhooks - retries: 5 s, 30 s, 2 min, … ±20%, then every 4 h, never past the horizon", (t) => {
  const day = 86_400_000;
  const expected = [5_000, 30_000, 120_000, 600_000, 1_800_000, 3_600_000, 7_200_000, 14_400_000, 14_400_000];
  expected.forEach((base, i) => {
    for (const random of [0, 0.5, 0.999]) {
      const wait = nextAttemptAt(i + 1, 1_000_000, 1_000_000, day, random)! - 1_000_000;
      t.true(wait >= base * 0.8 && wait <= base * 1.2, `attempt ${i + 1}: ${wait}`);
    }
  });
  t.is(nextAttemptAt(3, day - 60_000, 0, day, 0.5), null, "past the horizon: failed for good");
  t.is(nextAttemptAt(1, 0, 0, day, 0.5, 0.01), 50, "scaled for tests");
});

test("webhooks - a Run too large for a body is sent without its turn's input and output, flagged", (t) => {
  const view = { id: "run_1", turn: { id: "turn_1", input: [{ type: "input_text", text: "in" }], output: [{ type: "output_text", text: "out" }] } } as never;
  t.deepEqual(webhookData(view), { run: view });
  const big = { id: "run_1", turn: { id: "turn_1", input: [], output: [{ type: "output_text", text: "x".repeat(MAX_WEBHOOK_RUN_BYTES) }] } } as never;
  const data = webhookData(big) as { run: { id: string; turn: { output: unknown[] } }; truncated?: true };
  t.true(data.truncated);
  t.deepEqual(data.run.turn.output, []);
  t.is(data.run.id, "run_1");
});
