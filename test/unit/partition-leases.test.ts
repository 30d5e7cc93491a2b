import test from "ava";
import pino from "pino";
import type { KV, KvEntry } from "@nats-io/kv";
import { MAX_DOUBT_MS, PartitionLeases } from "../../actors/partition-leases.js";
import { TestClock } from "../helpers/actor-fakes.js";

/**
 * Lease ownership through a KV that can fail as JetStream does while a stream elects a
 * leader (every request refused for seconds) or answer from a replica behind the last
 * write. One holder per partition must hold; a holder alive through an outage must keep
 * its partitions (no turn interrupted), and hold its event writes only while the lease
 * may have lapsed.
 */

const log = pino({ level: "silent" });
const TTL = 3_000;
const PARTITIONS = 8;

/** A JetStream KV bucket in memory: revisions from one counter, compare-and-set updates. */
class FakeKv {
  down = false;
  /** Reads answer this revision of a key instead of the latest (a replica behind). */
  readonly behind = new Map<string, Entry>();
  private seq = 0;
  private readonly entries = new Map<string, Entry>();

  private check(): void {
    if (this.down) throw new Error("503 no responders (stream leader election)");
  }
  private write(key: string, value: string | null): number {
    const entry: Entry = { revision: ++this.seq, value, operation: value === null ? "DEL" : "PUT" };
    this.entries.set(key, entry);
    return entry.revision;
  }
  /** Another writer (a node not under test) sets the key. */
  force(key: string, value: object): number {
    return this.write(key, JSON.stringify(value));
  }
  latest(key: string): Entry | undefined {
    return this.entries.get(key);
  }
  async create(key: string, value: string): Promise<number> {
    this.check();
    if (this.entries.get(key)?.operation === "PUT") throw new Error("wrong last sequence: key exists");
    return this.write(key, value);
  }
  async update(key: string, value: string, revision: number): Promise<number> {
    this.check();
    if ((this.entries.get(key)?.revision ?? 0) !== revision) throw new Error("wrong last sequence");
    return this.write(key, value);
  }
  async put(key: string, value: string): Promise<number> {
    this.check();
    return this.write(key, value);
  }
  async get(key: string): Promise<KvEntry | null> {
    this.check();
    const entry = this.behind.get(key) ?? this.entries.get(key);
    if (!entry) return null;
    return { key, revision: entry.revision, operation: entry.operation, json: () => JSON.parse(entry.value!) } as unknown as KvEntry;
  }
  async delete(key: string, options?: { previousSeq?: number }): Promise<void> {
    this.check();
    if (options?.previousSeq !== undefined && (this.entries.get(key)?.revision ?? 0) !== options.previousSeq) throw new Error("wrong last sequence");
    this.write(key, null);
  }
  async keys(): Promise<AsyncIterable<string>> {
    this.check();
    const live = [...this.entries].filter(([, e]) => e.operation === "PUT").map(([k]) => k);
    return (async function* () {
      yield* live;
    })();
  }
}
interface Entry {
  revision: number;
  value: string | null;
  operation: "PUT" | "DEL";
}

interface Node {
  leases: PartitionLeases;
  held: Map<number, number>;
  calls: string[];
}

function node(id: string, clock: TestClock, kv: { leases: FakeKv; nodes: FakeKv }): Node {
  const held = new Map<number, number>();
  const calls: string[] = [];
  const leases = new PartitionLeases(kv.leases as unknown as KV, kv.nodes as unknown as KV, id, PARTITIONS, TTL, clock, {
    gained: (p, epoch) => {
      calls.push(`gained ${p}`);
      held.set(p, epoch);
    },
    lost: (p) => {
      calls.push(`lost ${p}`);
      held.delete(p);
    },
    isIdle: () => false,
    doubt: (p) => void calls.push(`doubt ${p}`),
    confirmed: (p) => void calls.push(`confirmed ${p}`),
  }, log);
  return { leases, held, calls };
}

/** Ticks the nodes in order every TTL/3 for `ms` of test time. */
async function run(clock: TestClock, nodes: Node[], ms: number): Promise<void> {
  for (let t = 0; t < ms; t += TTL / 3) {
    clock.now += TTL / 3;
    for (const n of nodes) await n.leases.tick();
  }
}

function setup() {
  const clock = new TestClock();
  const kv = { leases: new FakeKv(), nodes: new FakeKv() };
  const a = node("node-a", clock, kv);
  const b = node("node-b", clock, kv);
  return { clock, kv, a, b };
}

async function settled(clock: TestClock, a: Node, b: Node): Promise<void> {
  await a.leases.tick();
  await b.leases.tick();
  await run(clock, [a, b], 4 * TTL);
  // Placement is settled: each partition held once, all of them held.
  for (let p = 0; p < PARTITIONS; p++) if (a.held.has(p) === b.held.has(p)) throw new Error(`partition ${p} held by ${a.held.has(p) ? "both" : "neither"}`);
}

test("leases - a KV outage three times the TTL: no partition is lost or taken, writes are held only past the TTL and go on after", async (t) => {
  const { clock, kv, a, b } = setup();
  await settled(clock, a, b);
  const before = { a: new Map(a.held), b: new Map(b.held) };
  a.calls.length = 0;
  b.calls.length = 0;

  kv.leases.down = kv.nodes.down = true;
  await run(clock, [a, b], TTL / 2);
  t.deepEqual([...a.calls, ...b.calls], [], "within the TTL nothing happens");
  await run(clock, [a, b], 3 * TTL);
  t.deepEqual(a.calls.sort(), [...before.a.keys()].map((p) => `doubt ${p}`).sort(), "past the TTL: in doubt, not lost");
  t.true(b.calls.every((c) => c.startsWith("doubt")));

  kv.leases.down = kv.nodes.down = false;
  // b ticks first: it sees a's heartbeat and leases run out, and must still not take them.
  await run(clock, [b, a], 3 * TTL);
  t.deepEqual(a.held, before.a, "a keeps its partitions with their epochs");
  t.deepEqual(b.held, before.b, "b keeps its own and took none of a's");
  t.false([...a.calls, ...b.calls].some((c) => c.startsWith("lost") || c.startsWith("gained")), [...a.calls, ...b.calls].join(", "));
  t.true(a.calls.filter((c) => c.startsWith("confirmed")).length === before.a.size, "every doubt ends confirmed");
});

test("leases - a read from a replica behind the renewals, with renewals refused, is not a loss", async (t) => {
  const { clock, kv, a, b } = setup();
  await settled(clock, a, b);
  const [p, epoch] = [...a.held][0]!;
  const old = kv.leases.latest(`p${p}`)!;
  await run(clock, [a, b], TTL / 3); // a renews: the replica keeps the revision before
  kv.leases.behind.set(`p${p}`, old);
  kv.leases.force("unrelated", {}); // moves the counter, the lease's revision is unchanged
  const down = kv.leases.update.bind(kv.leases);
  kv.leases.update = async () => {
    throw new Error("timeout");
  };
  await run(clock, [a, b], TTL / 2);
  t.is(a.held.get(p), epoch);
  t.false(a.calls.includes(`lost ${p}`));
  kv.leases.update = down;
  kv.leases.behind.clear();
  await run(clock, [a, b], TTL);
  t.is(a.held.get(p), epoch);
});

test("leases - renewals refused while reads still show the last one: not confirmed by that read, in doubt past the TTL, confirmed when a renewal lands", async (t) => {
  const { clock, kv, a, b } = setup();
  await settled(clock, a, b);
  a.calls.length = 0;
  const update = kv.leases.update.bind(kv.leases);
  kv.leases.update = async () => {
    throw new Error("503 no responders (no quorum; a replica still answers reads)");
  };
  await run(clock, [a], 2 * TTL);
  t.deepEqual(a.calls.sort(), [...a.held.keys()].map((p) => `doubt ${p}`).sort(), a.calls.join(", "));
  kv.leases.update = update;
  await run(clock, [a], TTL / 3);
  t.deepEqual(a.calls.filter((c) => c.startsWith("confirmed")).length, a.held.size);
  t.false(a.calls.some((c) => c.startsWith("lost")));
});

test("leases - a lease another node took is lost at the next renewal", async (t) => {
  const { clock, kv, a, b } = setup();
  await settled(clock, a, b);
  const [p] = [...a.held][0]!;
  kv.leases.force(`p${p}`, { node: "node-c", expires_at: clock.now + TTL });
  await run(clock, [a], TTL / 3);
  t.false(a.held.has(p));
  t.true(a.calls.includes(`lost ${p}`));
});

test("leases - a dead holder's partitions move within the TTL and two ticks when the claimant's KV is healthy", async (t) => {
  const { clock, a, b } = setup();
  await settled(clock, a, b);
  const moving = [...a.held.keys()];
  const epochs = new Map(a.held);
  const from = clock.now;
  // a is dead: it ticks no more.
  for (let i = 0; i < 30 && moving.some((p) => !b.held.has(p)); i++) await run(clock, [b], TTL / 3);
  t.true(moving.every((p) => b.held.has(p)));
  t.true(moving.every((p) => b.held.get(p)! > epochs.get(p)!), "each with a higher epoch");
  t.true(clock.now - from <= TTL + 2 * (TTL / 3) + TTL / 3, `moved after ${clock.now - from} ms`);
});

test("leases - a lease in doubt longer than the bound is given up", async (t) => {
  const { clock, kv, a, b } = setup();
  await settled(clock, a, b);
  const mine = [...a.held.keys()];
  kv.leases.down = kv.nodes.down = true;
  await run(clock, [a], MAX_DOUBT_MS + 2 * TTL);
  t.deepEqual(a.held.size, 0);
  t.deepEqual(a.calls.filter((c) => c.startsWith("lost")).sort(), mine.map((p) => `lost ${p}`).sort());
});

/** One node's view of a bucket: its requests can hang (no answer at all) while others' work. */
function view(kv: FakeKv, control: { hang: boolean }): FakeKv {
  return new Proxy(kv, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver);
      if (typeof value !== "function") return value;
      return (...args: unknown[]) => (control.hang ? new Promise(() => undefined) : value.apply(target, args));
    },
  });
}

test("leases - a holder whose KV requests hang is in doubt (its writes held) by its lease's end, before any other node can take a partition", async (t) => {
  const clock = new TestClock();
  const kv = { leases: new FakeKv(), nodes: new FakeKv() };
  const cut = { hang: false };
  const a = node("node-a", clock, { leases: view(kv.leases, cut), nodes: view(kv.nodes, cut) });
  const b = node("node-b", clock, kv);
  await settled(clock, a, b);
  const mine = [...a.held.keys()];
  a.calls.length = 0;
  cut.hang = true;
  void a.leases.tick(); // hangs until its timeouts fire
  // Step time in small slices; at every step, a partition b holds is one a writes no more to.
  for (let step = 0; step < 200; step++) {
    clock.advance(50);
    await b.leases.tick();
    for (const p of mine) {
      if (b.held.has(p)) t.true(a.leases.checkDoubt(p) || !a.held.has(p), `at +${step * 50} ms b holds ${p} while a may still write to it`);
    }
    if (mine.every((p) => b.held.has(p))) break;
  }
  t.true(mine.every((p) => b.held.has(p)), "b took a's partitions (a is cut off, b's KV is healthy)");
  t.true(mine.every((p) => a.calls.includes(`doubt ${p}`) || a.calls.includes(`lost ${p}`)));
});
