/**
 * The CPU each process spends per request of the floor routes (bench/noop-server.ts):
 * for each route, 500 requests at 64 clients to warm up, then two rounds of 3,000, with
 * the CPU time of the floor server, FerretDB, nats-server and this load generator read
 * from /proc, per request, after the ends written past the answer are done.
 *
 *   node --import tsx bench/trace-floor.ts
 *
 * The counterpart of bench/trace-admission.ts (ours); used for the per-process table in
 * docs/performance.md; not part of `npm run bench`.
 */
import { startTestServers } from "../test/helpers/servers.js";
import { bareClients } from "./baselines.js";
import { cpuSecondsOf, load, request, sleep } from "./lib.js";
import { startNoopServer } from "./service.js";

const servers = await startTestServers();
const db = `trace_floor_${Date.now()}`;
// The baselines' stream, which the floor routes publish to.
const clients = await bareClients(servers.natsUrl, servers.servicePassword, servers.mongoUri, db);
const noop = await startNoopServer(servers, db);
const cpu = cpuSecondsOf;
const pids = { node: noop.proc.pid!, ferret: servers.ferret.pid, nats: servers.nats.pid, bench: process.pid };
/** Until the server has written every end it owes (at most 60 s). */
async function tailsDone(): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if ((await request(noop.url, "GET", "/floor/tails")).body?.pending === 0) return;
    await sleep(5);
  }
  console.log("ends still being written after 60 s");
}
try {
  for (const path of ["/floor/admit", "/floor/background", "/floor/background-batched", "/floor/turn"]) {
    const status = path === "/floor/turn" ? 200 : 202;
    const post = async () => (await request(noop.url, "POST", path, { body: { input: "hello" } })).status === status;
    await load(64, 500, 20_000, post);
    await tailsDone();
    for (let round = 0; round < 2; round++) {
      const before = Object.fromEntries(Object.entries(pids).map(([k, p]) => [k, cpu(p)]));
      const r = await load(64, 3000, 20_000, post);
      await tailsDone();
      const after = Object.fromEntries(Object.entries(pids).map(([k, p]) => [k, cpu(p)]));
      const perRequest = Object.keys(pids).map((k) => `${k} ${(((after[k]! - before[k]!) / r.ops) * 1000).toFixed(2)} ms`);
      console.log(`${path} ${r.rate.toFixed(0)}/s, errors ${r.errors}: ${perRequest.join(", ")}`);
    }
  }
} finally {
  await noop.stop();
  await clients.close();
  await servers.stop();
}
