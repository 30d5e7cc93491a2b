import test, { type ExecutionContext } from "ava";
import { existsSync, readdirSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { chmod, cp, mkdir, open, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { spawnSync } from "node:child_process";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { bashThen } from "../helpers/agent-configs.js";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Objm, type ObjectStore } from "@nats-io/obj";
import type { NatsConnection } from "@nats-io/transport-node";
import { CheckpointConflictError, CheckpointError, CheckpointNoRoomError, CheckpointUnrestorableError, EXTRACTED_BYTES_METADATA, extractedBytesOf, WorkspaceCheckpoints } from "../../actors/checkpoints.js";
import { connectNats } from "../../src/nats.js";
import { objectChunkReader } from "../../src/object-read.js";
import { systemClock } from "../../src/clock.js";
import { BlobKeyring } from "../../src/blob-crypto.js";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";

/**
 * POSTs as a client would right after a node restarted: a retryable 503 (runtime_unavailable:
 * the new node does not own the run's partition yet, as when the old node's lease release
 * timed out under load and the lease must expire) is asked again with the same
 * Idempotency-Key, for up to 30 s. Seen once in a full run: the post right after a restart
 * answered 503 after the router's 5 s of retries.
 */
async function postOnceServing(api: Api, url: string, body: unknown): Promise<{ status: number; body: any }> {
  const key = `k-${Math.random().toString(36).slice(2)}`;
  const until = Date.now() + 30_000;
  for (let i = 0; ; i++) {
    const res = await api.post(url, body, key);
    if (res.status !== 503 || res.body?.error?.retryable !== true || Date.now() > until || i >= 30) return res;
    await new Promise((resolve) => setTimeout(resolve, 1_000));
  }
}

/**
 * A node that held a run before keeps its workspace directory after losing the run. When
 * the run comes back to it, the directory is used only if it is still the run's latest
 * checkpoint: otherwise what another node saved since would be overwritten by the old
 * directory at the next save. Real service, store, object store and sandbox; a restart
 * on the same data folder stands in for the run coming back.
 */
test("checkpoints - a workspace a node kept from before is replaced by the run's newer checkpoint; a current one is used as it is", async (t) => {
  const servers = await startTestServers();
  const dataDir = path.join(servers.dir, "node-a");
  const env = { RUNS_DATA_DIR: dataDir, RUNS_WAIT_TIMEOUT_MS: "20000" };
  let service: RunningService | undefined;
  try {
    service = await startTestService(servers, env);
    const ws = await newWorkspace(service);
    let api = ws.api;
    const deployBash = async (agent: string, command: string) => {
      const d = await api.deploy(agent, { model: "faux/scripted", tools: ["bash"], script: bashThen(command, "done") });
      await api.waitDeployment(agent, d.version);
    };
    const turn = async (runId: string) => {
      const res = await postOnceServing(api, "/api/v1/runs", { run_id: runId, input: "go" });
      t.is(res.body.turn?.status, "completed", JSON.stringify(res.body));
      const evs = (await api.get(`/api/v1/runs/${runId}/events?limit=1000`)).body.data as any[];
      const end = evs.filter((e) => e.type === "tool_execution_end").at(-1);
      return end.data.result.content[0].text.trim() as string;
    };

    const agent = await api.agentWith({ model: "faux/scripted", tools: ["bash"], script: bashThen("echo one > note.txt", "one") });
    const first = await api.post("/api/v1/runs", { agent, input: "go" });
    t.is(first.body.turn?.status, "completed", JSON.stringify(first.body));
    const runId = first.body.id as string;
    const dir = path.join(dataDir, "workspaces", runId);
    // What the node keeps when another node takes the run over: the directory and its marker.
    const kept = path.join(servers.dir, "kept");
    await cp(dir, kept, { recursive: true });
    await cp(`${dir}.checkpoint`, `${kept}.checkpoint`);
    t.true(existsSync(`${kept}.checkpoint`), "the directory's marker names the checkpoint it was saved as");

    // The run's next turn, saved to the checkpoint (on the other node, in the story).
    await deployBash(agent, "echo two > note.txt");
    await turn(runId);

    // The run comes back to this node, which finds its old directory.
    await service.close();
    await rm(dir, { recursive: true, force: true });
    await rename(kept, dir);
    await rename(`${kept}.checkpoint`, `${dir}.checkpoint`);
    t.true(existsSync(path.join(dir, "note.txt")));
    service = await startTestService(servers, env);
    api = new Api(service.url!, api.key);
    await deployBash(agent, "cat note.txt");
    t.is(await turn(runId), "two", "the newer checkpoint replaced the kept directory");

    // A kept directory that is the latest checkpoint is used as it is (no restore): a file
    // added to it after its save is still there after the next restart.
    await writeFile(path.join(dir, "extra.txt"), "kept as it is\n");
    await service.close();
    service = await startTestService(servers, env);
    api = new Api(service.url!, api.key);
    await deployBash(agent, "cat extra.txt note.txt");
    t.is(await turn(runId), "kept as it is\ntwo");
  } finally {
    await service?.close();
    await servers.stop();
  }
});

/**
 * A save replaces only the checkpoint its actor knows (JetStream's expected last subject
 * sequence on the object's metadata): a stale owner, paused while the run moved, cannot
 * overwrite what the new owner saved, nor bring back a deleted run's workspace. Real
 * object store (the service's bucket settings do not matter here), real tar.
 */
/** Real servers and an object store bucket of its own for `body`'s checkpoints; all closed after it. */
const JS_TIMEOUT_MS = 30_000;

async function withCheckpoints(name: string, body: (c: { servers: TestServers; nc: NatsConnection; bucket: ObjectStore; checkpoints: WorkspaceCheckpoints; sealed: WorkspaceCheckpoints }) => Promise<void>): Promise<void> {
  const servers = await startTestServers();
  let nc: NatsConnection | undefined;
  try {
    // In the try: a connection that fails (an authentication timeout on a loaded machine) still stops the servers, or the file's worker never exits.
    nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: `checkpoint-${name}-test` });
    // JetStream answers within 30 s, not the client's default 5 s: this file's tests each run
    // their own servers at once, beside the rest of the suite, and a save or a look-up that
    // waited longer failed them (a TimeoutError from `put` or `info`, seen in full runs).
    const bucket = await new Objm(jetstream(nc, { timeout: JS_TIMEOUT_MS })).create(`checkpoint_${name}_test`);
    const chunks = objectChunkReader(nc, await jetstreamManager(nc, { timeout: JS_TIMEOUT_MS }), systemClock, `checkpoint_${name}_test`, bucket);
    const keys = new BlobKeyring(Buffer.alloc(32, 7).toString("base64"));
    await body({ servers, nc, bucket, checkpoints: new WorkspaceCheckpoints(bucket, chunks), sealed: new WorkspaceCheckpoints(bucket, chunks, keys) });
  } finally {
    await nc?.close();
    await servers.stop();
  }
}

test("checkpoints - a save expecting an older revision is refused and stores nothing; the current one stays readable", (t) =>
  withCheckpoints("cas", async ({ servers, nc, checkpoints }) => {
    const runId = "run_checkpointcas00000001";
    const dirOf = async (name: string, text: string) => {
      const dir = path.join(servers.dir, name, runId);
      await mkdir(dir, { recursive: true });
      await writeFile(path.join(dir, "note.txt"), text);
      return dir;
    };
    const stale = await dirOf("stale", "stale owner's");
    const owner = await dirOf("owner", "new owner's");

    // Both owners found no checkpoint (revision 0); the new owner saves first.
    const saved = (await checkpoints.save(runId, owner, false, "ws_x", 0))!;
    t.true(saved > 0);
    const refused = await t.throwsAsync(checkpoints.save(runId, stale, false, "ws_x", 0), { instanceOf: CheckpointConflictError });
    t.is(refused!.current, saved, "the conflict names the revision stored now");
    t.is(await checkpoints.revision(runId), saved, "nothing was stored by the refused save");

    const restoredDir = path.join(servers.dir, "third", runId);
    t.is(await checkpoints.restore(runId, restoredDir, "ws_x"), saved);
    t.is(await readFile(path.join(restoredDir, "note.txt"), "utf8"), "new owner's");
    // The refused put left no chunks behind: the stream holds the object's chunk and its metadata only.
    const stream = await (await jetstreamManager(nc)).streams.info("OBJ_checkpoint_cas_test");
    t.is(stream.state.messages, 2);

    // The owner saves on from its own revision; a check of a kept directory reports the revision to expect.
    await writeFile(path.join(owner, "note.txt"), "new owner's, later");
    const next = (await checkpoints.save(runId, owner, true, "ws_x", saved))!;
    t.true(next > saved);
    t.deepEqual(await checkpoints.matches(runId, owner), { current: true, revision: next });
    t.deepEqual(await checkpoints.matches(runId, stale), { current: false, revision: next });

    // A deleted run's checkpoint is not brought back by a save that read it before the delete.
    await checkpoints.remove(runId);
    await t.throwsAsync(checkpoints.save(runId, stale, true, "ws_x", next), { instanceOf: CheckpointConflictError });
    t.is(await checkpoints.restore(runId, path.join(servers.dir, "fourth", runId), "ws_x"), null);
    // Removing it again, or a run's that never had one, is nothing to do; a removal that cannot
    // reach the object store fails (the run's removal tries again later), never passes for done.
    await checkpoints.remove(runId);
    await checkpoints.remove("run_checkpointnever0000001");
    await nc.close();
    await t.throwsAsync(checkpoints.remove(runId), { instanceOf: CheckpointError });
  }));

test("checkpoints - a workspace holding a path a restore cannot create (past PATH_MAX) is not saved, so its last checkpoint stays the one a new owner restores; a name just under the bound (a UTF-8 character in it) saves and restores", (t) =>
  withCheckpoints("deep", async ({ servers, checkpoints }) => {
    const runId = "run_checkpointdeep00000001";
    const dir = path.join(servers.dir, "deep", runId);
    await mkdir(dir, { recursive: true });
    // Node's rm stops at PATH_MAX: rm(1) removes these trees before the servers' folder goes.
    try {
      await deepSaves(t, servers, checkpoints, runId, dir);
    } finally {
      spawnSync("rm", ["-rf", ...["deep", "fits", "restored"].map((name) => path.join(servers.dir, name))]);
    }
  }));

async function deepSaves(t: ExecutionContext, servers: TestServers, checkpoints: WorkspaceCheckpoints, runId: string, dir: string): Promise<void> {
  await writeFile(path.join(dir, "note.txt"), "before");
  const first = (await checkpoints.save(runId, dir, false, "ws_x", 0))!;
  // ./ and 4,093 bytes: the longest name tar extracts (4,095 bytes with its NUL).
  const nested = (top: string, bytes: number, last: string) =>
    spawnSync("python3", ["-c", `
import os, sys
top, bytes, last = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
os.mkdir(top); cur = os.open(top, os.O_RDONLY); rel = len(top)
while rel + 1 + 200 + 1 + len(last) < bytes:
    os.mkdir("d" * 200, dir_fd=cur); cur = os.open("d" * 200, os.O_RDONLY, dir_fd=cur); rel += 201
name = b"f" * (bytes - rel - 1 - len(last)) + last
os.close(os.open(name, os.O_CREAT | os.O_WRONLY, dir_fd=cur))
`, top, String(bytes), last], { cwd: dir, encoding: "utf8" });
  t.is(nested("fits", 4_093, "é").status, 0);
  const fits = (await checkpoints.save(runId, dir, true, "ws_x", first))!;
  t.true(fits > first);
  t.is(await checkpoints.restore(runId, path.join(servers.dir, "fits", runId), "ws_x"), fits, "a name of 4,093 bytes (and a UTF-8 character) restores");
  t.is(nested("too-deep", 4_094, "").status, 0);
  await writeFile(path.join(dir, "note.txt"), "after");
  const refused = await t.throwsAsync(checkpoints.save(runId, dir, true, "ws_x", fits), { instanceOf: CheckpointUnrestorableError });
  t.regex(refused!.message, /^The workspace holds a path of 4094 bytes or more, longer than a checkpoint can restore \(at most 4093\), below "too-deep\/d{31}": it was not saved, and its last checkpoint is kept\. Shorten or remove that path: until then every turn with tools ends so\.$/);
  t.is(await checkpoints.revision(runId), fits, "nothing replaced the restorable checkpoint");
  const restored = path.join(servers.dir, "restored", runId);
  t.is(await checkpoints.restore(runId, restored, "ws_x"), fits);
  t.is(await readFile(path.join(restored, "note.txt"), "utf8"), "before");
}

test("checkpoints - files with holes are saved and restored with their holes: a command's truncate-made files cost neither the archive nor the restoring node's disk their length", (t) =>
  withCheckpoints("sparse", async ({ servers, bucket, checkpoints }) => {
    const runId = "run_checkpointsparse000001";
    const dir = path.join(servers.dir, "sparse", runId);
    await mkdir(dir, { recursive: true });
    // Sixteen files of 32 MiB each with a few bytes of data in the middle: 512 MiB long, nearly nothing on disk.
    const made = spawnSync("bash", ["-c", 'for i in $(seq 16); do truncate -s 32M "hole$i"; printf "data $i" | dd of="hole$i" bs=1 seek=16777216 conv=notrunc status=none; done', "bash"], { cwd: dir, encoding: "utf8", timeout: 30_000 });
    t.is(made.status, 0, made.stderr);
    const revision = (await checkpoints.save(runId, dir, false, "ws_x", 0))!;
    const stored = (await bucket.info(runId))!;
    t.true(stored.size < 64 * 1024, `archive of ${stored.size} bytes`);
    // Nor the room a restore asks for: holes take nothing extracted.
    const kept = Number(stored.metadata?.[EXTRACTED_BYTES_METADATA]);
    t.true(kept > 0 && kept < 1024 * 1024, `kept ${stored.metadata?.[EXTRACTED_BYTES_METADATA]}`);
    const restored = path.join(servers.dir, "restored", runId);
    t.is(await checkpoints.restore(runId, restored, "ws_x"), revision);
    for (let i = 1; i <= 16; i++) {
      const file = path.join(restored, `hole${i}`);
      const st = await stat(file);
      t.is(st.size, 32 * 1024 * 1024);
      t.true(st.blocks * 512 <= 64 * 1024, `hole${i} takes ${st.blocks * 512} bytes on disk`);
      const handle = await open(file);
      const buf = Buffer.alloc(16);
      await handle.read(buf, 0, 16, 16 * 1024 * 1024);
      await handle.close();
      t.is(buf.toString("utf8").replace(/\0+$/, ""), `data ${i}`);
    }
  }));

/** Whether {@link saveWithoutCapabilities} can run here: it needs root and setpriv. */
const CAPLESS_ROOT = process.getuid?.() === 0 && spawnSync("setpriv", ["--version"]).status === 0;

/**
 * Saves `dir` as `runId` into `bucketName` from a child process run as root without its
 * capabilities, which reads only what modes allow, as a service sharing the sandboxes' uid
 * does. `answer` is its last line of output, `{"revision": n}` or `{"error": name, "message": …}`.
 */
function saveWithoutCapabilities(servers: TestServers, bucketName: string, runId: string, dir: string) {
  const modules = Object.fromEntries(["actors/checkpoints.ts", "src/nats.ts"].map((file) => [file, pathToFileURL(path.resolve(file)).href]));
  const script = [
    `const { WorkspaceCheckpoints } = await import(${JSON.stringify(modules["actors/checkpoints.ts"])});`,
    `const { connectNats } = await import(${JSON.stringify(modules["src/nats.ts"])});`,
    `const { jetstream } = await import("@nats-io/jetstream");`,
    `const { Objm } = await import("@nats-io/obj");`,
    `const nc = await connectNats({ url: ${JSON.stringify(servers.natsUrl)}, user: "runs", password: ${JSON.stringify(servers.servicePassword)}, name: "checkpoint-capless-child" });`,
    `const bucket = await new Objm(jetstream(nc, { timeout: ${JS_TIMEOUT_MS} })).open(${JSON.stringify(bucketName)});`,
    // Saves only: restores, which read chunks, are not asked of it.
    `const noReads = () => { throw new Error("not read here"); };`,
    `try {`,
    `  const revision = await new WorkspaceCheckpoints(bucket, noReads).save(${JSON.stringify(runId)}, ${JSON.stringify(dir)}, false, "ws_x", 0);`,
    `  console.log(JSON.stringify({ revision }));`,
    `} catch (err) {`,
    `  console.log(JSON.stringify({ error: err.name, message: err.message }));`,
    `} finally {`,
    `  await nc.close();`,
    `}`,
  ].join("\n");
  const child = spawnSync("setpriv", ["--bounding-set=-all", "--inh-caps=-all", process.execPath, "--import", "tsx", "--input-type=module", "-e", script], { encoding: "utf8", timeout: 60_000 });
  // Its answer, when it printed one (a child that failed has none: its status and stderr tell).
  const last = child.stdout?.trim().split("\n").at(-1);
  let answer: { revision?: number; error?: string; message?: string } = {};
  try {
    if (last) answer = JSON.parse(last);
  } catch {
    // Not an answer: the assertions on it fail with the child's output.
  }
  return { status: child.status, stdout: child.stdout, stderr: child.stderr, answer };
}

test("checkpoints - a file and a folder a command made unreadable (chmod 000) are saved all the same by a service that shares the sandboxes' uid (here root without its capabilities), and restored with their data", (t) =>
  withCheckpoints("closed", async ({ servers, checkpoints }) => {
    if (!CAPLESS_ROOT) {
      t.pass("needs root and setpriv (to run as root without its capabilities)");
      return;
    }
    const runId = "run_checkpointclosed000001";
    const dir = path.join(servers.dir, "closed", runId);
    await mkdir(path.join(dir, "folder", "inner"), { recursive: true });
    await writeFile(path.join(dir, "file.txt"), "closed file\n");
    await writeFile(path.join(dir, "folder", "inner", "deep.txt"), "closed folder\n");
    await chmod(path.join(dir, "file.txt"), 0o000);
    await chmod(path.join(dir, "folder"), 0o000);
    // Root without capabilities reads only what modes allow, as any other uid: tar alone fails on both.
    const child = saveWithoutCapabilities(servers, "checkpoint_closed_test", runId, dir);
    t.is(child.status, 0, child.stderr);
    const revision = child.answer.revision!;
    t.true(revision > 0, child.stdout);
    const restored = path.join(servers.dir, "restored", runId);
    t.is(await checkpoints.restore(runId, restored, "ws_x"), revision);
    t.is(await readFile(path.join(restored, "file.txt"), "utf8"), "closed file\n");
    t.is(await readFile(path.join(restored, "folder", "inner", "deep.txt"), "utf8"), "closed folder\n");
  }));

test("checkpoints - a path a restore cannot create, below a folder a command made unreadable (chmod 000), is found all the same by a service that shares the sandboxes' uid (here root without its capabilities): the workspace is not saved", (t) =>
  withCheckpoints("closeddeep", async ({ servers, bucket }) => {
    if (!CAPLESS_ROOT) {
      t.pass("needs root and setpriv (to run as root without its capabilities)");
      return;
    }
    const runId = "run_checkpointcloseddeep01";
    const dir = path.join(servers.dir, "closeddeep", runId);
    await mkdir(path.join(dir, "closed"), { recursive: true });
    await writeFile(path.join(dir, "note.txt"), "kept");
    // 21 folders of 200 bytes and a file: past the 4,093 bytes a restore can create.
    const made = spawnSync("bash", ["-c", 'cd closed && for i in $(seq 21); do mkdir "$(printf %0200d $i)" && cd "$_" || exit 1; done && echo deep > "$(printf %0100d 0)"'], { cwd: dir, encoding: "utf8" });
    t.is(made.status, 0, made.stderr);
    await chmod(path.join(dir, "closed"), 0o000);
    try {
      const child = saveWithoutCapabilities(servers, "checkpoint_closeddeep_test", runId, dir);
      t.is(child.status, 0, child.stderr);
      const { answer } = child;
      t.is(answer.error, "CheckpointUnrestorableError", child.stdout);
      t.regex(String(answer.message), /below "closed\/0{20}/);
      t.is(await bucket.info(runId), null, "nothing was saved");
    } finally {
      // Node's rm stops at PATH_MAX: rm(1) removes the tree before the servers' folder goes.
      spawnSync("chmod", ["-R", "u+rwX", dir]);
      spawnSync("rm", ["-rf", dir]);
    }
  }));

/**
 * A restore takes disk the node may not have: one begun while the node is below its
 * reserve (RUNS_DISK_RESERVE_MB) is not begun, and the turn fails retryably
 * (sandbox_capacity_exceeded), not as an environment that is gone; the checkpoint is
 * untouched, and a node with room restores it. Real service, store, object store, tar.
 */
test("checkpoints - a node below its disk reserve does not restore a run's workspace: the turn fails retryably (sandbox_capacity_exceeded) and a node with room restores it", async (t) => {
  const servers = await startTestServers();
  let service = await startTestService(servers, { RUNS_WAIT_TIMEOUT_MS: "20000" });
  try {
    const ws = await newWorkspace(service);
    let api = ws.api;
    const agent = await api.agentWith({ model: "faux/scripted", tools: ["bash"], script: bashThen("echo one > note.txt", "one") });
    const first = await api.post("/api/v1/runs", { agent, input: "go" });
    t.is(first.body.turn?.status, "completed", JSON.stringify(first.body));
    const runId = first.body.id as string;
    const d = await api.deploy(agent, { model: "faux/scripted", tools: ["bash"], script: bashThen("cat note.txt", "done") });
    await api.waitDeployment(agent, d.version);

    // Another node (its own data folder: nothing kept) whose disk has less free than it keeps.
    await service.close();
    service = await startTestService(servers, { RUNS_WAIT_TIMEOUT_MS: "20000", RUNS_DISK_RESERVE_MB: String(2 ** 40) });
    api = new Api(service.url!, api.key);
    const short = await postOnceServing(api, "/api/v1/runs", { run_id: runId, input: "go" });
    t.is(short.body.turn?.status, "failed", JSON.stringify(short.body));
    t.like(short.body.turn.error, { code: "sandbox_capacity_exceeded", retryable: true, source: "platform" });

    // A node with room: the checkpoint is as it was.
    await service.close();
    service = await startTestService(servers, { RUNS_WAIT_TIMEOUT_MS: "20000" });
    api = new Api(service.url!, api.key);
    const after = await postOnceServing(api, "/api/v1/runs", { run_id: runId, input: "go" });
    t.is(after.body.turn?.status, "completed", JSON.stringify(after.body));
    const evs = (await api.get(`/api/v1/runs/${runId}/events?limit=1000`)).body.data as any[];
    t.is(evs.filter((e) => e.type === "tool_execution_end").at(-1).data.result.content[0].text.trim(), "one");
  } finally {
    await service.close();
    await servers.stop();
  }
});

/** A workspace of `mib` MiB that gzip cannot shrink, in four files. */
async function incompressible(dir: string, mib: number): Promise<void> {
  await mkdir(dir, { recursive: true });
  for (let i = 0; i < 4; i++) await writeFile(path.join(dir, `part-${i}.bin`), randomBytes((mib * 1024 * 1024) / 4));
}

test("checkpoints - a checkpoint keeps what it takes once extracted: one that compresses to little asks the restoring node for room for all of it, and a node with room for the archive but not for that does not restore it", (t) =>
  withCheckpoints("extracted", async ({ servers, bucket, checkpoints, sealed }) => {
    const runId = "run_checkpointextracted01";
    const dir = path.join(servers.dir, "saved", runId);
    await mkdir(dir, { recursive: true });
    // 24 MiB of zeros (gzip makes ~24 KiB of them) and a small file beside.
    await writeFile(path.join(dir, "zeros.bin"), Buffer.alloc(24 * 1024 * 1024));
    await writeFile(path.join(dir, "note.txt"), "kept");
    await checkpoints.save(runId, dir, false, "ws_x", 0);
    const stored = (await bucket.info(runId))!;
    t.true(stored.size < 256 * 1024, `archive of ${stored.size} bytes`);
    const kept = Number(stored.metadata?.[EXTRACTED_BYTES_METADATA]);
    t.true(kept >= 24 * 1024 * 1024 && kept < 25 * 1024 * 1024, `kept ${stored.metadata?.[EXTRACTED_BYTES_METADATA]}`);
    t.is(extractedBytesOf(stored), kept);

    // Room for the archive many times over, not for what it extracts.
    const asked: number[] = [];
    const fits = (room: number) => async (bytes: number) => (asked.push(bytes), bytes <= room);
    const target = path.join(servers.dir, "restored", runId);
    await t.throwsAsync(checkpoints.restore(runId, target, "ws_x", { fits: fits(stored.size * 10) }), { instanceOf: CheckpointNoRoomError });
    t.deepEqual(asked, [kept]);
    t.false(existsSync(target), "nothing of it was begun");
    t.is(await checkpoints.restore(runId, target, "ws_x", { fits: fits(kept) }), stored.revision);
    t.is(await readFile(path.join(target, "note.txt"), "utf8"), "kept");
    t.is((await stat(path.join(target, "zeros.bin"))).size, 24 * 1024 * 1024);

    // Saved again (a revision of its own), the figure is the new archive's.
    await rm(path.join(target, "zeros.bin"));
    await checkpoints.save(runId, target, true, "ws_x", stored.revision);
    const resaved = (await bucket.info(runId))!;
    const small = Number(resaved.metadata?.[EXTRACTED_BYTES_METADATA]);
    t.true(small > 0 && small < 64 * 1024, `kept ${resaved.metadata?.[EXTRACTED_BYTES_METADATA]}`);

    // Sealed (as the service saves them), the figure is the archive's, not the sealed object's.
    const sealedId = "run_checkpointextracted02";
    await sealed.save(sealedId, dir, false, "ws_x", 0);
    const sealedInfo = (await bucket.info(sealedId))!;
    t.is(Number(sealedInfo.metadata?.[EXTRACTED_BYTES_METADATA]), kept, "the same tree, the same figure");
    asked.length = 0;
    await t.throwsAsync(sealed.restore(sealedId, path.join(servers.dir, "restored", sealedId), "ws_x", { fits: fits(sealedInfo.size * 10) }), { instanceOf: CheckpointNoRoomError });
    t.deepEqual(asked, [kept]);
  }));

test("checkpoints - a restore stopped for want of disk kills tar, stops reading the object and leaves nothing of the workspace, before tar starts or while it writes", (t) =>
  withCheckpoints("noroom", async ({ servers, nc, checkpoints }) => {
    // A large checkpoint for the read that stops, a smaller one for the rest.
    const largeId = "run_checkpointnoroomlarge1";
    const large = path.join(servers.dir, "saved", largeId);
    await incompressible(large, 16);
    await checkpoints.save(largeId, large, false, "ws_x", 0);
    const runId = "run_checkpointnoroom000001";
    const dir = path.join(servers.dir, "saved", runId);
    await incompressible(dir, 8);
    await checkpoints.save(runId, dir, false, "ws_x", 0);

    const before = path.join(servers.dir, "before", largeId);
    const received = nc.stats().inBytes;
    await t.throwsAsync(checkpoints.restore(largeId, before, "ws_x", { stop: AbortSignal.abort() }), { instanceOf: CheckpointNoRoomError });
    t.false(existsSync(before), "nothing of the workspace is left");
    // The read stopped with the restore: its consumer is gone, and the rest of the object was not sent.
    t.deepEqual(await (await jetstreamManager(nc)).consumers.list("OBJ_checkpoint_noroom_test").next(), []);
    await new Promise((resolve) => setTimeout(resolve, 500));
    const read = nc.stats().inBytes - received;
    t.true(read < 4 * 1024 * 1024, `${read} bytes of the 16 MiB checkpoint came though the restore stopped at its first piece`);

    // Stopped once tar has written a file of it.
    const during = path.join(servers.dir, "during", runId);
    const stop = new AbortController();
    let sawFile = false;
    const poll = setInterval(() => {
      if (existsSync(during) && readdirSync(during).length > 0) {
        sawFile = true;
        stop.abort();
      }
    }, 1);
    try {
      await t.throwsAsync(checkpoints.restore(runId, during, "ws_x", { stop: stop.signal }), { instanceOf: CheckpointNoRoomError });
    } finally {
      clearInterval(poll);
    }
    t.true(sawFile, "tar had begun writing when it was stopped");
    t.false(existsSync(during), "nothing of the workspace is left");

    // The checkpoint itself is untouched.
    const whole = path.join(servers.dir, "whole", runId);
    t.true((await checkpoints.restore(runId, whole, "ws_x")) !== null);
    t.deepEqual(await readFile(path.join(whole, "part-3.bin")), await readFile(path.join(dir, "part-3.bin")));
  }));

test("checkpoints - an archive tar cannot extract stays a checkpoint that cannot be extracted, though a file of it is named like the full disk's message", (t) =>
  withCheckpoints("named", async ({ servers, bucket, checkpoints }) => {
    const runId = "run_checkpointnamedfull001";
    const src = path.join(servers.dir, "named");
    await incompressible(src, 1);
    // tar names it in a warning as it extracts it (its time is in the future).
    await writeFile(path.join(src, "No space left on device"), "x");
    const made = spawnSync("bash", ["-c", 'touch -d 2099-01-01 "No space left on device" && tar -czf ../named.tgz "No space left on device" part-0.bin part-1.bin', "bash"], { cwd: src, encoding: "utf8" });
    t.is(made.status, 0, made.stderr);
    // Cut short: tar fails at its end, after the warning.
    const whole = await readFile(path.join(servers.dir, "named.tgz"));
    await bucket.put({ name: runId }, new Blob([whole.subarray(0, Math.floor(whole.length * 0.7))]).stream());
    const target = path.join(servers.dir, "restored", runId);
    const error = await t.throwsAsync(checkpoints.restore(runId, target, "ws_x"));
    t.is(error?.name, "CheckpointCorruptError", error?.message);
    t.regex(String((error?.cause as Error)?.message), /No space left on device: time stamp/, "tar named the file in its warning");
  }));

// A full disk, made as a 1 MiB tmpfs (mounting needs root; CI runs as root).
(process.getuid?.() === 0 ? test : test.skip)("checkpoints - a restore onto a full disk fails as no room (retryable elsewhere), not as a checkpoint that cannot be extracted, and leaves nothing", (t) =>
  withCheckpoints("full", async ({ servers, checkpoints }) => {
    const runId = "run_checkpointfulldisk0001";
    const dir = path.join(servers.dir, "saved", runId);
    await incompressible(dir, 4);
    await checkpoints.save(runId, dir, false, "ws_x", 0);
    const small = path.join(servers.dir, "small");
    await mkdir(small);
    const mounted = spawnSync("mount", ["-t", "tmpfs", "-o", "size=1m", "runs-test-full", small], { encoding: "utf8" });
    t.is(mounted.status, 0, mounted.stderr);
    try {
      const target = path.join(small, runId);
      const error = await t.throwsAsync(checkpoints.restore(runId, target, "ws_x"), { instanceOf: CheckpointNoRoomError });
      t.regex(String((error!.cause as Error).message), /No space left on device/);
      t.false(existsSync(target), "nothing of the workspace is left");
    } finally {
      spawnSync("umount", ["-l", small]);
    }
  }));
