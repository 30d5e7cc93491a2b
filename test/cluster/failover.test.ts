import { existsSync, mkdirSync, readdirSync, readFileSync, utimesSync, writeFileSync } from "node:fs";
import path from "node:path";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import anyTest, { type TestFn } from "ava";
import { randomUUID } from "node:crypto";
import { readFile } from "node:fs/promises";
import {
  allEvents,
  getWithRetry,
  median,
  nodeApi,
  postWithRetry,
  restoreCluster,
  runOwnedBy,
  sleep,
  startTestCluster,
  until,
  waitFinal,
  type Answer,
  type Cluster,
} from "../helpers/cluster.js";
import { openRawDb, type RawDb } from "../helpers/raw-db.js";
import { jetstreamManager } from "@nats-io/jetstream";
import { LEASES_BUCKET } from "../../src/nats.js";

/**
 * Fault tests against a real local cluster: 3 NATS servers (JetStream R3), FerretDB
 * and 3 runtime nodes as child processes with a 3 s lease. One cluster serves the
 * file; the tests are serial and each leaves every server and node running again.
 */
const test = anyTest as TestFn<{ cluster: Cluster; echo: string; raw: RawDb }>;

const LEASE_TTL_MS = 3000;

/** Live host processes running exactly `sleep <seconds>`. */
function sleepers(seconds: string): number[] {
  return readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry))
    .filter((entry) => {
      try {
        return readFileSync(`/proc/${entry}/cmdline`, "utf8") === `sleep\0${seconds}\0` && !/\)\s+Z\s/.test(readFileSync(`/proc/${entry}/stat`, "utf8"));
      } catch {
        return false;
      }
    })
    .map(Number);
}

const sleepConfig = (seconds: number, then: Array<Record<string, unknown>> = [{ text: "x" }]) => ({
  model: "faux/scripted",
  tools: ["bash"],
  script: [{ tool_call: { name: "bash", arguments: { command: `sleep ${seconds}` } } }, ...then],
});

test.before(async (t) => {
  t.timeout(120_000);
  const started = Date.now();
  // Webhooks reach the test's receiver on 127.0.0.1; their retry waits are shrunk 50 times.
  // The sweep runs every second (it also removes workspace directories kept for runs a node no longer holds).
  const cluster = await startTestCluster({ env: { RUNS_WEBHOOK_ALLOW_PRIVATE: "1", RUNS_WEBHOOK_RETRY_SCALE: "0.02", RUNS_SWEEP_INTERVAL_MS: "1000" } });
  t.context.cluster = cluster;
  t.context.raw = await openRawDb(cluster.mongoUri, cluster.mongoDb);
  t.context.echo = await nodeApi(cluster, 0).agentWith({ model: "faux/scripted" }, "echo");
  t.log(`cluster up in ${Date.now() - started} ms (${cluster.dir})`);
});

test.afterEach.always(async (t) => {
  if (t.context.cluster) await restoreCluster(t.context.cluster);
});

test.after.always(async (t) => {
  await t.context.raw?.close();
  await t.context.cluster?.stop();
});

/** Final events and starts of each turn in a run's event history. */
async function turnEventCounts(cluster: Cluster, runId: string) {
  const counts = new Map<string, { started: number; final: number }>();
  for (const event of await allEvents(cluster, runId)) {
    if (!event.turn_id) continue;
    const entry = counts.get(event.turn_id) ?? { started: 0, final: 0 };
    if (event.type === "turn.started") entry.started++;
    if (["turn.completed", "turn.failed", "turn.cancelled", "turn.incomplete"].includes(event.type)) entry.final++;
    counts.set(event.turn_id, entry);
  }
  return counts;
}

async function cancelQuietly(cluster: Cluster, runId: string): Promise<void> {
  await postWithRetry(cluster, 0, `/api/v1/runs/${runId}/cancel`, {}, `cancel-${runId}`, { maxAttempts: 3, timeoutMs: 10_000 });
}

test.serial("cluster - kill -9 of the owner mid-turn: the active turn, killed in its bash call, ends incomplete worker_action_interrupted (not retryable: the call may have acted), the queued turn completes on another node, nothing runs twice", async (t) => {
  t.timeout(120_000);
  const { cluster } = t.context;
  const victim = 2;
  const api = nodeApi(cluster, 0);
  // 29 s: a duration no other test sleeps, so the host's process table shows only this one.
  const agent = await api.agentWith(sleepConfig(29), "sleeper-29");
  const run = await runOwnedBy(cluster, victim, agent, 0);
  // Cancel the other sleeping runs the search started, so they do not hold partitions busy.
  const others = await t.context.raw.runs.find({ agent_id: agent, _id: { $ne: run.id } }).toArray();
  await Promise.all(others.map((r) => cancelQuietly(cluster, r._id)));

  // Version 2 answers at once (automatic upgrade): the queued turn does not sleep 30 s again.
  const v2 = await api.deploy(agent, { model: "faux/scripted" });
  await api.waitDeployment(agent, v2.version);
  const queued = await api.post("/api/v1/runs", { run_id: run.id, input: "after the crash", background: true, on_busy: "queue" });
  t.is(queued.status, 202, JSON.stringify(queued.body));
  t.is(queued.body.disposition, "queued");
  const admitted = [run.turn.id, queued.body.turn.id];

  // The bash tool is running on the victim when it dies.
  await until("sleep started", async () => ((await allEvents(cluster, run.id)).some((e) => e.type === "tool_execution_start") ? true : undefined), 15_000).catch(() => sleep(1_000));
  t.is(await cluster.ownerOf(run.id), victim);
  // The event is published before the sandbox has started the command (bwrap, then the shell): under load that
  // takes a while, so the test waits for the process itself rather than reading the table once.
  await until("the sandboxed sleep runs on the host", async () => (sleepers("29").length > 0 ? true : undefined), 15_000).catch(() => undefined);
  t.true(sleepers("29").length > 0, "the sandboxed sleep runs on the host before the kill");
  const killedAt = Date.now();
  await cluster.killNode(victim);
  // Its sandbox dies with it (bwrap --die-with-parent ends the PID namespace).
  await until("the dead node's sandbox is gone", async () => (sleepers("29").length === 0 ? true : undefined), 10_000).catch(() => undefined);
  t.deepEqual(sleepers("29"), [], "no process of the killed node's turn outlives it");

  const first = await waitFinal(cluster, run.id, run.turn.id, 30_000);
  const recoveredMs = Date.now() - killedAt;
  t.is(first.turn.status, "incomplete");
  t.is(first.turn.error?.code, "worker_action_interrupted");
  t.false(first.turn.error?.retryable);
  const second = await waitFinal(cluster, run.id, queued.body.turn.id, 30_000);
  t.is(second.turn.status, "completed", JSON.stringify(second.turn.error));
  t.deepEqual(second.turn.output, [{ type: "output_text", text: "after the crash" }]);
  t.is(second.turn.agent_version, v2.version);
  t.true(second.turn.started_at >= first.turn.completed_at);
  const newOwner = await cluster.ownerOf(run.id);
  t.true(newOwner !== undefined && newOwner !== victim, `new owner ${newOwner}`);

  // Every admitted turn is accounted for, once.
  const turns = await getWithRetry(cluster, `/api/v1/runs/${run.id}/turns`);
  t.deepEqual(
    turns.body.data.map((turn: any) => [turn.id, turn.status]),
    [
      [admitted[0], "incomplete"],
      [admitted[1], "completed"],
    ],
  );
  const counts = await turnEventCounts(cluster, run.id);
  for (const id of admitted) t.deepEqual(counts.get(id), { started: 1, final: 1 }, `events of turn ${id}`);
  const run_ = await getWithRetry(cluster, `/api/v1/runs/${run.id}`);
  t.is(run_.body.state, "idle");
  t.log(`active turn final ${recoveredMs} ms after the kill; the queued turn ran on node-${(newOwner ?? -1) + 1}`);
});

/**
 * Background starts from `clients` concurrent clients, `perClient` each, `gapMs` apart,
 * each with its own Idempotency-Key and the patient reference client.
 */
async function load(cluster: Cluster, agent: string, clients: number, perClient: number, gapMs: number, stop?: () => boolean) {
  const prefix = randomUUID().slice(0, 8);
  const answers: Array<Answer & { key: string }> = [];
  await Promise.all(
    Array.from({ length: clients }, async (_, c) => {
      for (let n = 0; n < perClient && !stop?.(); n++) {
        const key = `load-${prefix}-${c}-${n}`;
        const answer = await postWithRetry(cluster, (c + n) % cluster.nodes.length, "/api/v1/runs", { agent, input: key, background: true }, key, {
          maxAttempts: 20,
          timeoutMs: 60_000,
        });
        answers.push({ ...answer, key });
        await sleep(gapMs);
      }
    }),
  );
  return answers;
}

/** Checks every admitted start: one run per key, its turn final. Returns the final statuses. */
async function checkAdmitted(t: { is: Function; true: Function; context: { raw: RawDb } }, cluster: Cluster, answers: Array<Answer & { key: string }>) {
  const admitted = answers.filter((a) => a.status === 202 || a.status === 200);
  const statuses = new Map<string, number>();
  for (const answer of admitted) {
    const final = await waitFinal(cluster, answer.body.id, answer.body.turn.id, 60_000);
    const outcome = final.turn.error ? `${final.turn.status}/${final.turn.error.code}` : final.turn.status;
    statuses.set(outcome, (statuses.get(outcome) ?? 0) + 1);
  }
  // No key admitted twice: each key's input is in exactly one run's turns.
  const keys = admitted.map((a) => a.key);
  const stored = await t.context.raw.turns.find({ index: 0, "input.text": { $in: keys } }, { projection: { run_id: 1, input: 1 } }).toArray();
  t.is(stored.length, keys.length, "one stored first turn per admitted key");
  t.is(new Set(admitted.map((a) => a.body.id)).size, admitted.length, "distinct runs");
  return statuses;
}

test.serial("cluster - one NATS server of three killed during a load of background starts: every admitted turn becomes final", async (t) => {
  t.timeout(180_000);
  const { cluster, echo } = t.context;
  const victim = 0;
  const started = Date.now();
  const killer = sleep(3_000).then(() => {
    cluster.killNats(victim);
    return Date.now() - started;
  });
  const answers = await load(cluster, echo, 4, 25, 400);
  const killedAtMs = await killer;
  const loadMs = Date.now() - started;
  await cluster.startNats(victim);

  const admitted = answers.filter((a) => a.status === 202 || a.status === 200);
  const statuses = await checkAdmitted(t, cluster, answers);
  t.is(answers.length, 100);
  // Every admitted turn read final (waitFinal above), and completed: only an owner's
  // death interrupts a turn. A renewal the KV does not answer keeps the lease (in doubt
  // past its TTL, event writes held); event writes retry through a leader election.
  const otherwise = [...statuses].filter(([outcome]) => outcome !== "completed");
  t.deepEqual(otherwise, [], "every admitted turn completes");
  // Not admitted is allowed only as a temporary failure the client was told to retry.
  const refused = answers.filter((a) => a.status !== 202 && a.status !== 200);
  t.deepEqual(refused.filter((a) => a.status !== 503), [], "a start is admitted or answered 503, never 4xx or 500");
  const unavailable = answers.reduce((n, a) => n + a.unavailable, 0);
  const retried = answers.filter((a) => a.attempts > 1).length;
  t.log(
    `nats-${victim + 1} killed at ${killedAtMs} ms; 100 starts in ${loadMs} ms; ${admitted.length} admitted, ` +
      `${retried} after a retry (${unavailable} 503/refused answers retried); not admitted: ${JSON.stringify(refused.map((a) => [a.status, a.body?.error?.code]))}; ` +
      `final: ${JSON.stringify([...statuses])}`,
  );
  t.true(admitted.length >= 90, `${admitted.length} of 100 admitted`);
});

test.serial("cluster - the leases bucket without quorum for two lease TTLs (its leader and one more NATS server killed) while turns sleep on every node: no turn is interrupted, no partition moves", async (t) => {
  t.timeout(180_000);
  const { cluster } = t.context;
  const api = nodeApi(cluster, 0);
  const agent = await api.agentWith(sleepConfig(16, [{ text: "slept" }]), "sleeper-16");
  // Turns on every node (runOwnedBy bounds its attempts).
  const runs = [];
  for (const owner of [0, 1, 2]) for (let k = 0; k < 2; k++) runs.push(await runOwnedBy(cluster, owner, agent, owner));
  const epochs = new Map((await t.context.raw.runs.find({ _id: { $in: runs.map((r) => r.id) } }).toArray()).map((r) => [r._id, r.epoch]));
  const owners = new Map(await Promise.all(runs.map(async (r) => [r.id, await cluster.ownerOf(r.id)] as const)));
  await sleep(1_000); // the turns are in their bash step
  const jsm = await jetstreamManager(cluster.nc);
  const leader = (await jsm.streams.info(`KV_${LEASES_BUCKET}`)).cluster?.leader;
  const first = cluster.nats.findIndex((n) => n.name === leader);
  t.true(first >= 0, `leases leader ${leader} among ${cluster.nats.map((n) => n.name).join(", ")}`);
  const second = (first + 1) % cluster.nats.length;
  // Two of three servers gone: no stream has a quorum, renewals and heartbeats fail, every
  // lease runs out on paper. The holders are alive and must keep their partitions.
  cluster.killNats(first);
  cluster.killNats(second);
  await sleep(6_000);
  await cluster.startNats(first);
  const finals = await Promise.all(runs.map((r) => waitFinal(cluster, r.id, r.turn.id, 90_000)));
  await cluster.startNats(second);
  t.deepEqual(finals.map((f) => f.turn.status), runs.map(() => "completed"), JSON.stringify(finals.map((f) => [f.turn.status, f.turn.error?.code])));
  const after = await t.context.raw.runs.find({ _id: { $in: runs.map((r) => r.id) } }).toArray();
  for (const run of after) t.is<number | undefined, number | undefined>(run.epoch, epochs.get(run._id), `run ${run._id} kept its owner's epoch`);
  for (const r of runs) t.is(await cluster.ownerOf(r.id), owners.get(r.id), `run ${r.id} kept its owner`);
  t.log(`killed ${leader} (the leases leader) and ${cluster.nats[second]!.name} for 6 s; ${runs.length} turns completed on their owners`);
});

test.serial("cluster - a node paused past its lease: its partitions move, its late writes are fenced off and its actors stop", async (t) => {
  t.timeout(120_000);
  const { cluster } = t.context;
  const victim = 1;
  const api = nodeApi(cluster, 0);
  // The bash step outlives the pause, so the paused node still has a turn to finish when it wakes up.
  // Long enough to outlast the set-up below on a loaded machine.
  const agent = await api.agentWith(sleepConfig(6, [{ text: "late" }]), "sleeper-6");
  const run = await runOwnedBy(cluster, victim, agent, 0);
  const others = await t.context.raw.runs.find({ agent_id: agent, _id: { $ne: run.id } }).toArray();
  await Promise.all(others.map((r) => cancelQuietly(cluster, r._id)));
  const v2 = await api.deploy(agent, { model: "faux/scripted" });
  await api.waitDeployment(agent, v2.version);
  const queued = await api.post("/api/v1/runs", { run_id: run.id, input: "on the new owner", background: true });
  t.is(queued.status, 202);
  const before = await t.context.raw.runs.findOne({ _id: run.id });

  // Only the node process stops: its bash tool finishes meanwhile, so the agent's
  // result is waiting for the node when it resumes.
  cluster.pauseNode(victim, { processOnly: true });
  const pausedAt = Date.now();
  const newOwner = await until("partition moved", async () => {
    const owner = await cluster.ownerOf(run.id);
    return owner !== undefined && owner !== victim ? owner : undefined;
  }, 30_000);
  const movedMs = Date.now() - pausedAt;
  const first = await waitFinal(cluster, run.id, run.turn.id, 30_000);
  t.is(first.turn.status, "incomplete");
  // Paused in its bash call (its end never reported by the paused node): the call may have acted.
  t.is(first.turn.error?.code, "worker_action_interrupted");
  const second = await waitFinal(cluster, run.id, queued.body.turn.id, 30_000);
  t.is(second.turn.status, "completed");
  const afterTakeover = await t.context.raw.runs.findOne({ _id: run.id });
  t.true(afterTakeover!.epoch > before!.epoch, `epoch ${before!.epoch} → ${afterTakeover!.epoch}`);
  const turnsAtTakeover = await t.context.raw.turns.find({ run_id: run.id }).sort({ index: 1 }).toArray();
  // Past the lease and past the bash step.
  await sleep(Math.max(0, LEASE_TTL_MS * 2 + 1_000 - (Date.now() - pausedAt)));

  cluster.resumeNode(victim);
  const resumedAt = Date.now();
  // Let the resumed node find out: a lease tick (ttl/3) plus the agent's late result.
  await sleep(LEASE_TTL_MS * 2);
  const log = await readFile(cluster.nodes[victim].logFile, "utf8");
  const sincePause = log
    .split("\n")
    .filter(Boolean)
    .map((line) => {
      try {
        return JSON.parse(line);
      } catch {
        return {};
      }
    })
    .filter((entry) => entry.time >= pausedAt);
  const stopped = sincePause.filter((e) => e.msg === "run actor stopped" && e.run_id === run.id);
  t.true(stopped.length >= 1, "the resumed node stopped the run's actor");
  t.log(`resumed node: ${stopped.map((e) => e.reason).join(", ")}; lease messages: ${sincePause.filter((e) => e.msg === "lease lost").length}`);

  // Nothing the resumed node did after the takeover changed the run or its turns.
  const afterResume = await t.context.raw.runs.findOne({ _id: run.id });
  const turnsAfterResume = await t.context.raw.turns.find({ run_id: run.id }).sort({ index: 1 }).toArray();
  t.is(afterResume!.epoch, afterTakeover!.epoch);
  t.deepEqual(turnsAfterResume, turnsAtTakeover);
  t.is(afterResume!.state, "idle");
  // The API agrees, through the resumed node's own gateway too.
  const viaVictim = await nodeApi(cluster, victim).get(`/api/v1/runs/${run.id}?turn_id=${run.turn.id}`);
  t.is(viaVictim.body.turn.status, "incomplete");
  t.log(`partition moved to node-${newOwner + 1} ${movedMs} ms after the pause began; resumed node checked ${Date.now() - resumedAt} ms after SIGCONT`);

  // The event history is the new owner's alone after the takeover: each turn started
  // and ended once, nothing of the first turn after its final event, no gaps or repeats.
  const events = await allEvents(cluster, run.id);
  const sequences = events.map((e) => e.sequence);
  t.deepEqual(sequences, Array.from({ length: sequences.length }, (_, i) => i + 1), "sequences 1..n");
  const counts = await turnEventCounts(cluster, run.id);
  t.deepEqual(counts.get(run.turn.id), { started: 1, final: 1 });
  t.deepEqual(counts.get(queued.body.turn.id), { started: 1, final: 1 });
  const firstFinal = events.findIndex((e) => e.turn_id === run.turn.id && e.type === "turn.incomplete");
  t.deepEqual(
    events.slice(firstFinal + 1).filter((e) => e.turn_id === run.turn.id).map((e) => e.type),
    [],
    "no event of the interrupted turn after its final event",
  );
});

test.serial("cluster - rolling restart of every node under a light load of background starts: nothing admitted is lost", async (t) => {
  t.timeout(240_000);
  const { cluster } = t.context;
  const api = nodeApi(cluster, 0);
  // One-second turns, so some are running while a node drains (RUNS_DRAIN_MS 2 s).
  const agent = await api.agentWith(sleepConfig(1, [{ text: "done" }]), "sleeper-1");
  let done = false;
  const loader = load(cluster, agent, 2, 200, 500, () => done);
  const restarts: number[] = [];
  for (let i = 0; i < cluster.nodes.length; i++) {
    await sleep(1_000);
    const began = Date.now();
    await cluster.stopNode(i);
    await cluster.startNode(i);
    restarts.push(Date.now() - began);
  }
  await sleep(1_000);
  done = true;
  const answers = await loader;
  const admitted = answers.filter((a) => a.status === 202 || a.status === 200);
  const statuses = await checkAdmitted(t, cluster, answers);
  t.true(answers.length >= 20, `${answers.length} starts`);
  t.is(admitted.length, answers.length, `answers not admitted: ${JSON.stringify(answers.filter((a) => a.status !== 202).map((a) => [a.status, a.body?.error?.code]))}`);
  const bad = [...statuses].filter(([outcome]) => outcome !== "completed" && outcome !== "incomplete/worker_execution_interrupted" && outcome !== "incomplete/worker_action_interrupted");
  t.deepEqual(bad, [], "admitted turns end completed, or incomplete when a drain interrupted them (in a tool call or not)");
  const unavailable = answers.reduce((n, a) => n + a.unavailable, 0);
  t.log(`${answers.length} starts during restarts of ${restarts.join(", ")} ms; ${unavailable} 5xx/refused answers retried; final: ${JSON.stringify([...statuses])}`);
});

test.serial("cluster - failover time: from SIGKILL of a run's owner to the first accepted continuation through another node", async (t) => {
  t.timeout(240_000);
  const { cluster, echo } = t.context;
  const samples: number[] = [];
  for (let k = 0; k < 3; k++) {
    const victim = k % cluster.nodes.length;
    const via = (victim + 1) % cluster.nodes.length;
    const run = await runOwnedBy(cluster, victim, echo, via);
    await waitFinal(cluster, run.id, run.turn.id, 20_000);
    const killedAt = Date.now();
    await cluster.killNode(victim);
    const key = `failover-${run.id}`;
    let accepted: number | undefined;
    for (let attempt = 0; attempt < 200 && Date.now() - killedAt < 60_000; attempt++) {
      const res = await nodeApi(cluster, via).request("POST", "/api/v1/runs", {
        body: { run_id: run.id, input: `after kill ${k}`, background: true },
        idempotencyKey: key,
      });
      if (res.status === 202 || res.status === 200) {
        accepted = Date.now() - killedAt;
        break;
      }
      t.is(res.status, 503, JSON.stringify(res.body));
      await sleep(50);
    }
    t.truthy(accepted, `continuation ${k} accepted`);
    samples.push(accepted!);
    await cluster.startNode(victim);
  }
  const med = median(samples);
  t.log(`failover (SIGKILL → accepted continuation, lease ttl ${LEASE_TTL_MS} ms): samples ${samples.join(", ")} ms; median ${med} ms`);
  t.true(med < LEASE_TTL_MS * 5, `median ${med} ms`);
});

test.serial("cluster - webhooks: the node retrying a delivery is killed while the receiver is down; another node delivers it once the receiver is back, once", async (t) => {
  t.timeout(120_000);
  const { cluster, echo } = t.context;
  const victim = 1;
  let up = false;
  const received: Array<{ id: string; status: number }> = [];
  const receiver = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      const status = up ? 200 : 503;
      received.push({ id: String(req.headers["webhook-id"]), status });
      res.writeHead(status).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, "127.0.0.1", resolve));
  t.teardown(() => receiver.close());
  const api = nodeApi(cluster, 0);
  const hook = await api.post("/api/v1/webhooks", { url: `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/`, event_types: ["turn.completed"], agent_id: echo });
  t.is(hook.status, 201, JSON.stringify(hook.body));
  t.teardown(() => api.request("DELETE", `/api/v1/webhooks/${hook.body.id}`).then(() => undefined));
  // Another node learns of the webhook within 2 s.
  await sleep(2_100);
  const run = await runOwnedBy(cluster, victim, echo, 0, "deliver me");
  await waitFinal(cluster, run.id, run.turn.id);
  const deliveries = async () => (await getWithRetry(cluster, `/api/v1/webhooks/${hook.body.id}/deliveries?limit=100`)).body.data as any[];
  const mine = await until("the run's delivery is recorded", async () => (await deliveries()).find((d) => d.run_id === run.id));
  await until("the owner tried it twice", async () => (received.filter((r) => r.id === mine.message_id).length >= 2 ? true : undefined), 20_000);
  t.is(await cluster.ownerOf(run.id), victim);
  await cluster.killNode(victim);
  up = true;
  await until("delivered by another node", async () => (received.some((r) => r.id === mine.message_id && r.status === 200) ? true : undefined), 45_000);
  await sleep(1_000);
  t.is(received.filter((r) => r.id === mine.message_id && r.status === 200).length, 1, "accepted once");
  const after = await until("the log says delivered", async () => (await deliveries()).find((d) => d.id === mine.id && d.status === "delivered"), 10_000);
  t.true(after.attempts >= 3, `attempts ${after.attempts}`);
  // Every run the search started was delivered too (some on other nodes), each once.
  const all = await deliveries();
  await until("every delivery done", async () => ((await deliveries()).every((d) => d.status === "delivered") ? true : undefined), 30_000);
  for (const d of all) t.is(received.filter((r) => r.id === d.message_id && r.status === 200).length <= 1, true, d.id);
});

test.serial("cluster - approvals: kill -9 of the owner while an action waits; approved through another node, the call runs once and the model call that asked is not made again", async (t) => {
  t.timeout(120_000);
  const { cluster } = t.context;
  const victim = 1;
  const api = nodeApi(cluster, 0);
  const agent = await api.agentWith(
    {
      model: "faux/scripted",
      tools: ["bash"],
      approval: { rules: [{ tool: "bash" }] },
      script: [
        { tool_call: { name: "bash", arguments: { command: "echo ran >> count.txt; wc -l < count.txt" } }, usage: { input: 100 } },
        { text: "done", usage: { input: 10 } },
      ],
    },
    "gated",
  );
  const run = await runOwnedBy(cluster, victim, agent, 0);
  const others = await t.context.raw.runs.find({ agent_id: agent, _id: { $ne: run.id } }).toArray();
  await Promise.all(others.map((r) => cancelQuietly(cluster, r._id)));
  const waiting = await until("the turn waits for a decision", async () => (await getWithRetry(cluster, `/api/v1/runs/${run.id}`)).body?.turn?.pending_action ?? undefined, 20_000);
  t.is(await cluster.ownerOf(run.id), victim);

  const killedAt = Date.now();
  await cluster.killNode(victim);
  // Through a node other than the victim; it routes to whichever node owns the run by then.
  const decided = await postWithRetry(cluster, 2, `/api/v1/runs/${run.id}/actions/${waiting.id}`, { decision: "approve" }, `approve-${run.id}`);
  t.is(decided.status, 200, JSON.stringify(decided.body));
  t.like(decided.body, { id: waiting.id, decision: "approve", decided_by: "person" });
  const final = await waitFinal(cluster, run.id, run.turn.id, 30_000);
  t.is(final.turn.status, "completed", JSON.stringify(final.turn.error));
  t.deepEqual(final.turn.output, [{ type: "output_text", text: "done" }]);
  t.is(final.turn.usage.input_tokens, 110, "two model calls: the asking one was not repeated");
  const newOwner = await cluster.ownerOf(run.id);
  t.true(newOwner !== undefined && newOwner !== victim, `new owner ${newOwner}`);

  const events = await allEvents(cluster, run.id);
  const count = (type: string) => events.filter((e) => e.type === type).length;
  t.is(count("tool.approval_requested"), 1);
  t.is(count("tool.approval_decided"), 1);
  t.is(events.filter((e) => e.type === "message_end" && e.data.message.role === "assistant").length, 2);
  const ends = events.filter((e) => e.type === "tool_execution_end");
  t.is(ends.length, 1);
  t.is(ends[0].data.result.content[0].text.trim(), "1", "the command ran once");
  const counts = await turnEventCounts(cluster, run.id);
  t.deepEqual(counts.get(run.turn.id), { started: 1, final: 1 });
  t.deepEqual(events.map((e) => e.sequence), events.map((_, i) => i + 1), "no gap or repeat in the run's events");
  t.log(`decided ${decided.attempts} attempt(s) after the kill; final ${Date.now() - killedAt} ms after it on node-${(newOwner ?? -1) + 1}`);
});

test.serial("cluster - a node's sweep removes the workspace directories it kept for runs another node holds, once old; those of runs it holds stay", async (t) => {
  const { cluster } = t.context;
  /** Run ids (never started) whose partitions node `owner` holds now. */
  const idsOwnedBy = async (owner: number, count: number) => {
    const ids: string[] = [];
    for (let i = 0; i < 2_000 && ids.length < count; i++) {
      const id = `run_sweep${randomUUID().replace(/-/g, "").slice(0, 16)}`;
      if ((await cluster.ownerOf(id)) === owner) ids.push(id);
    }
    return ids;
  };
  // Ids still theirs a lease TTL later: the placement has settled (the tests before this one
  // stop and start nodes, and partitions may still be moving; then ids are picked again).
  let other: string[] = [];
  let own: string[] = [];
  for (let attempt = 1; ; attempt++) {
    other = await idsOwnedBy(1, 2);
    own = await idsOwnedBy(0, 2);
    await sleep(3_500);
    const owners = await Promise.all([...other, ...own].map((id) => cluster.ownerOf(id)));
    if (owners.every((owner, i) => owner === (i < other.length ? 1 : 0))) break;
    if (attempt === 5) return t.fail(`placement did not settle in five lease TTLs: ${JSON.stringify(owners)}`);
  }
  // Kept directories on node 0, last used seven hours ago (the sweep keeps them six).
  const workspaces = path.join(cluster.dir, cluster.nodes[0].id, "workspaces");
  const old = new Date(Date.now() - 7 * 3_600_000);
  for (const id of [...other, ...own]) {
    const dir = path.join(workspaces, id);
    mkdirSync(dir, { recursive: true });
    writeFileSync(path.join(dir, "kept.txt"), id);
    writeFileSync(`${dir}.checkpoint`, "nuid");
    utimesSync(dir, old, old);
    utimesSync(`${dir}.checkpoint`, old, old);
  }
  await until("node 0's sweep removed the directories of runs node 1 holds", async () => (other.every((id) => !existsSync(path.join(workspaces, id)) && !existsSync(path.join(workspaces, `${id}.checkpoint`))) ? true : undefined), 20_000);
  // Two sweeps later, what node 0 holds is still there.
  await sleep(2_500);
  for (const id of own) {
    t.is(await cluster.ownerOf(id), 0);
    t.is(readFileSync(path.join(workspaces, id, "kept.txt"), "utf8"), id);
  }
  t.false(readdirSync(workspaces).includes(".trash"));
});
