import anyTest, { type TestFn } from "ava";
import pino from "pino";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { ACTIVE_TURNS_BUCKET, connectNats, provisionNats } from "../../src/nats.js";
import { ActiveTurns } from "../../actors/active-turns.js";
import { systemClock } from "../../src/clock.js";
import { startTestServers, type TestServers } from "../helpers/servers.js";

const test = anyTest as TestFn<{ servers: TestServers; connections: NatsConnection[] }>;
const log = pino({ level: "silent" });
const retention = { runS: { solo: 3600, business: 3600 }, eventS: { solo: 3600, business: 3600 } };

test.before(async (t) => {
  const servers = await startTestServers();
  const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "active-turns-provision" });
  await provisionNats(nc, retention);
  t.context = { servers, connections: [nc] };
});

test.after.always(async (t) => {
  for (const nc of t.context.connections ?? []) await nc.close().catch(() => undefined);
  await t.context.servers?.stop();
});

/** A node's view of the active turns, on its own connection. */
async function node(t: { context: { servers: TestServers; connections: NatsConnection[] } }, id: string, ttlMs = 10_000) {
  const nc = await connectNats({ url: t.context.servers.natsUrl, user: "runs", password: t.context.servers.servicePassword, name: id });
  t.context.connections.push(nc);
  const kv = await new Kvm(nc).open(ACTIVE_TURNS_BUCKET);
  const turns = new ActiveTurns(kv, id, systemClock, log, ttlMs);
  turns.start();
  return { nc, turns };
}

/** Polls `read` until it returns `want` (bounded), and returns the last value read. */
async function eventually(read: () => number, want: number, ms = 3_000): Promise<number> {
  const deadline = Date.now() + ms;
  let value = read();
  while (value !== want && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 20));
    value = read();
  }
  return value;
}

test("active-turns - each node counts its own at once and the others' as they announce them", async (t) => {
  const a = await node(t, "node-a");
  const b = await node(t, "node.b"); // a dot in a node id must not split the key
  const ws = "ws_counted";
  a.turns.started(ws, "turn_1");
  a.turns.started(ws, "turn_1"); // counted once
  a.turns.started(ws, "turn_2");
  t.is(a.turns.count(ws), 2, "a node's own turns count at once");
  b.turns.started(ws, "turn_3");
  t.is(await eventually(() => b.turns.count(ws), 3), 3);
  t.is(await eventually(() => a.turns.count(ws), 3), 3);
  t.is(a.turns.count("ws_other"), 0, "workspaces are counted apart");

  a.turns.ended(ws, "turn_1");
  a.turns.ended(ws, "turn_1"); // ending twice changes nothing
  t.is(a.turns.count(ws), 2);
  t.is(await eventually(() => b.turns.count(ws), 2), 2);
  a.turns.ended(ws, "turn_2");
  t.is(await eventually(() => b.turns.count(ws), 1), 1, "a node with none left withdraws its announcement");

  // Many quick changes end at the latest number (one write in flight per workspace).
  for (let i = 0; i < 100; i++) a.turns.started(ws, `burst_${i}`);
  for (let i = 0; i < 60; i++) a.turns.ended(ws, `burst_${i}`);
  t.is(await eventually(() => b.turns.count(ws), 41), 41);

  await a.turns.stop();
  t.is(await eventually(() => b.turns.count(ws), 1), 1, "a node that stops withdraws what it announced");
  await b.turns.stop();
});

test("active-turns - a crashed node's announcement stops counting once it expires; a live one is refreshed", async (t) => {
  const ttlMs = 600;
  const live = await node(t, "node-live", ttlMs);
  const crashing = await node(t, "node-crash", ttlMs);
  const observer = await node(t, "node-observer", ttlMs);
  const ws = "ws_expiry";
  live.turns.started(ws, "turn_live");
  crashing.turns.started(ws, "turn_crash");
  t.is(await eventually(() => observer.turns.count(ws), 2), 2);
  // The crashing node's connection dies without withdrawing anything.
  await crashing.nc.close();
  t.is(await eventually(() => observer.turns.count(ws), 1, 3 * ttlMs), 1, "the dead node's turn stopped counting");
  // Well past several TTLs the live node's turn still counts: its announcement is refreshed.
  await new Promise((resolve) => setTimeout(resolve, 3 * ttlMs));
  t.is(observer.turns.count(ws), 1);
  await live.turns.stop();
  await observer.turns.stop();
  await crashing.turns.stop();
});

test("active-turns - stopping while announcements are being written leaves none behind", async (t) => {
  const observer = await node(t, "node-watch");
  const ws = "ws_stopping";
  for (let round = 0; round < 5; round++) {
    const busy = await node(t, `node-busy-${round}`);
    for (let i = 0; i < 50; i++) busy.turns.started(ws, `turn_${round}_${i}`);
    await busy.turns.stop(); // writes are in flight when the stop begins
  }
  t.is(await eventually(() => observer.turns.count(ws), 0), 0);
  await new Promise((resolve) => setTimeout(resolve, 300));
  t.is(observer.turns.count(ws), 0, "no late write brought an announcement back");
  await observer.turns.stop();
});
