/**
 * The contract's sandbox failure codes, through the real API: a node at its maximum of
 * concurrent sandboxes, a sandbox that will not start, and a workspace checkpoint that
 * cannot be restored on the node that takes a run over.
 */
import test from "ava";
import { chmod, mkdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { connect } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";
import { Objm } from "@nats-io/obj";
import { CHECKPOINTS_BUCKET } from "../../src/nats.js";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";

let servers: TestServers;
test.before(async () => {
  servers = await startTestServers();
});
test.after.always(async () => {
  await servers?.stop();
});

const bashScript = (command: string) => [{ tool_call: { name: "bash", arguments: { command } } }, { text: "done" }];

async function startOn(api: Api, agent: string, extra: Record<string, unknown> = {}) {
  const res = await api.post("/api/v1/runs", { agent, input: "go", background: true, ...extra });
  if (res.status !== 202) throw new Error(`start: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body as { id: string; turn: { id: string } };
}

test.serial("sandbox failures - a node at its maximum of sandboxes ends a turn with sandbox_capacity_exceeded (retryable)", async (t) => {
  const service = await startTestService(servers, { RUNS_SANDBOX_MAX: "1" });
  try {
    const { api } = await newWorkspace(service, "business");
    const sleeper = await api.agentWith({ model: "faux/scripted", script: bashScript("sleep 4; echo slept") });
    const echo = await api.agentWith({ model: "faux/scripted", script: bashScript("echo hi") });
    const busy = await startOn(api, sleeper);
    // Wait until the sleeper's command holds the node's one sandbox.
    for (let i = 0; i < 100; i++) {
      const events = await api.get(`/api/v1/runs/${busy.id}/events?limit=100`);
      if (events.body.data.some((e: any) => e.type === "tool_execution_start")) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    const second = await startOn(api, echo);
    const failed = await api.waitTurn(second.id, second.turn.id);
    t.is(failed.turn.status, "failed");
    t.like(failed.turn.error, { code: "sandbox_capacity_exceeded", retryable: true, source: "platform" });
    const slept = await api.waitTurn(busy.id, busy.turn.id);
    t.is(slept.turn.status, "completed", "the running sandbox was not disturbed");
    // Capacity is back: the same input again succeeds.
    const again = await startOn(api, echo);
    t.is((await api.waitTurn(again.id, again.turn.id)).turn.status, "completed");
  } finally {
    await service.close();
  }
});

test.serial("sandbox failures - a sandbox that does not start after three tries ends the turn sandbox_start_retries_exhausted (retryable)", async (t) => {
  const bin = path.join(servers.dir, "fake-bwrap");
  await mkdir(bin, { mode: 0o755 });
  await chmod(bin, 0o755);
  const fake = path.join(bin, "bwrap");
  // The node's start-up probe passes through to the real bwrap; commands with the marker fail to start.
  await writeFile(fake, `#!/bin/sh\ncase "$*" in *SANDBOX_WILL_NOT_START*) echo "bwrap: simulated: cannot create namespaces" >&2; exit 1;; esac\nexec bwrap "$@"\n`, { mode: 0o755 });
  const service = await startTestService(servers, { RUNS_SANDBOX_BWRAP: fake });
  try {
    const { api } = await newWorkspace(service, "business");
    const agent = await api.agentWith({ model: "faux/scripted", script: bashScript("echo SANDBOX_WILL_NOT_START") });
    const run = await startOn(api, agent);
    const failed = await api.waitTurn(run.id, run.turn.id);
    t.is(failed.turn.status, "failed");
    t.like(failed.turn.error, { code: "sandbox_start_retries_exhausted", retryable: true, source: "platform" });
    t.regex(failed.turn.error.message, /did not start after 3 tries/);
    // Other commands on the same node still run.
    const fine = await api.agentWith({ model: "faux/scripted", script: bashScript("echo fine") });
    const ok = await startOn(api, fine);
    t.is((await api.waitTurn(ok.id, ok.turn.id)).turn.status, "completed");
  } finally {
    await service.close();
  }
});

test.serial("sandbox failures - a run taken over without its checkpoint fails sandbox_snapshot_unavailable; an unreadable store, sandbox_snapshot_activation_failed", async (t) => {
  const first = await startTestService(servers);
  const { api, key } = await newWorkspace(first, "business");
  const agent = await api.agentWith({ model: "faux/scripted", script: bashScript("echo kept > state.txt") });
  const gone = await startOn(api, agent);
  t.is((await api.waitTurn(gone.id, gone.turn.id)).turn.status, "completed");
  const unreadable = await startOn(api, agent);
  t.is((await api.waitTurn(unreadable.id, unreadable.turn.id)).turn.status, "completed");
  const corrupt = await startOn(api, agent);
  t.is((await api.waitTurn(corrupt.id, corrupt.turn.id)).turn.status, "completed");
  const kept = await startOn(api, agent);
  t.is((await api.waitTurn(kept.id, kept.turn.id)).turn.status, "completed");
  const tampered = await startOn(api, agent);
  t.is((await api.waitTurn(tampered.id, tampered.turn.id)).turn.status, "completed");
  await first.close();

  const nc = await connect({ servers: servers.natsUrl, user: "runs", pass: servers.servicePassword });
  try {
    const objm = new Objm(jetstream(nc));
    const bucket = await objm.open(CHECKPOINTS_BUCKET);
    t.truthy(await bucket.info(gone.id), "the first node checkpointed the workspace");
    await bucket.delete(gone.id);
    await bucket.putBlob({ name: corrupt.id }, new TextEncoder().encode("not a tar archive"));
    // Checkpoints are sealed per workspace; one byte changed in the middle and it does not open.
    const sealed = Buffer.from((await bucket.getBlob(tampered.id))!);
    t.is(sealed.subarray(0, 3).toString(), "RBX", "the checkpoint is stored encrypted");
    sealed[Math.floor(sealed.length / 2)] ^= 0x01;
    await bucket.putBlob({ name: tampered.id }, sealed);

    // A new node (its own data folder: no local copy of any workspace) takes the runs over.
    const second = await startTestService(servers);
    try {
      const api2 = new Api(second.url!, key);
      const next = await api2.post("/api/v1/runs", { run_id: gone.id, input: "again", background: true });
      t.is(next.status, 202, JSON.stringify(next.body));
      const failed = await api2.waitTurn(gone.id, next.body.turn.id, 60_000);
      t.is(failed.turn.status, "failed");
      t.like(failed.turn.error, { code: "sandbox_snapshot_unavailable", retryable: false });

      // A checkpoint that is there but cannot be extracted will not come back either.
      const broken = await api2.post("/api/v1/runs", { run_id: corrupt.id, input: "again", background: true });
      t.is(broken.status, 202, JSON.stringify(broken.body));
      const failedBroken = await api2.waitTurn(corrupt.id, broken.body.turn.id, 60_000);
      t.like(failedBroken.turn.error, { code: "sandbox_snapshot_unavailable", retryable: false });

      const edited = await api2.post("/api/v1/runs", { run_id: tampered.id, input: "again", background: true });
      t.like((await api2.waitTurn(tampered.id, edited.body.turn.id, 60_000)).turn.error, { code: "sandbox_snapshot_unavailable", retryable: false });

      // An intact checkpoint is decrypted and restored on the new node: the file is there.
      // (Version 2 of the agent reads it; the run upgrades to it automatically.)
      const v2 = await api2.deploy(agent, { model: "faux/scripted", script: bashScript("cat state.txt") });
      await api2.waitDeployment(agent, v2.version);
      const restored = await api2.post("/api/v1/runs", { run_id: kept.id, input: "read", background: true });
      t.is(restored.status, 202, JSON.stringify(restored.body));
      const readBack = await api2.waitTurn(kept.id, restored.body.turn.id, 60_000);
      t.is(readBack.turn.status, "completed", JSON.stringify(readBack.turn.error));
      const events = (await api2.get(`/api/v1/runs/${kept.id}/events?turn_id=${restored.body.turn.id}&limit=1000`)).body.data as Array<{ type: string; data: unknown }>;
      const result = events.find((e) => e.type === "tool_execution_end");
      t.regex(JSON.stringify(result?.data), /kept/, "the restored workspace holds the file the first node wrote");

      // The checkpoint store itself unreadable (its stream gone) while the node runs.
      await bucket.destroy();
      const later = await api2.post("/api/v1/runs", { run_id: unreadable.id, input: "again", background: true });
      t.is(later.status, 202, JSON.stringify(later.body));
      const failedToo = await api2.waitTurn(unreadable.id, later.body.turn.id, 60_000);
      t.is(failedToo.turn.status, "failed");
      t.like(failedToo.turn.error, { code: "sandbox_snapshot_activation_failed", retryable: true });
    } finally {
      await second.close();
    }
  } finally {
    await nc.close();
  }
});
