import test from "ava";
import { spawn, execFile, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { mkdtemp, readdir, readFile, readlink, rm, stat } from "node:fs/promises";
import { MongoClient } from "mongodb";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { freePort, portIsFree, PROJECT_ROOT, startNatsServer } from "../../node/servers.js";
import net from "node:net";
import { Api, startTestServers } from "../helpers/servers.js";
import { SCOPES } from "../../src/index.js";

const exec = promisify(execFile);

/** Starts `node/main.ts` as `npm start` does (bootstrap already done by the test command). */
function startMain(env: NodeJS.ProcessEnv): { child: ChildProcess; output: () => string; serving: Promise<string> } {
  // Its own process group, like a program started from a terminal.
  const child = spawn(process.execPath, ["--import", "tsx", "node/main.ts"], { cwd: PROJECT_ROOT, env, stdio: ["ignore", "pipe", "pipe"], detached: true });
  let out = "";
  child.stdout!.on("data", (d) => (out += d));
  child.stderr!.on("data", (d) => (out += d));
  const serving = new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`not serving after 60 s:\n${out}`)), 60_000);
    child.stdout!.on("data", () => {
      const m = /runs is serving on (\S+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`exited ${code}:\n${out}`));
    });
  });
  return { child, output: () => out, serving };
}

/** Ctrl-C as a terminal sends it: SIGINT to the whole foreground process group. */
async function stopMain(child: ChildProcess): Promise<{ code: number | null; ms: number }> {
  if (child.exitCode !== null) return { code: child.exitCode, ms: 0 };
  const started = Date.now();
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  process.kill(-child.pid!, "SIGINT");
  const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
  const code = await exited;
  clearTimeout(timer);
  return { code, ms: Date.now() - started };
}

test("embedded - npm start runs local servers, prints a development key once, serves the API and stops everything on Ctrl-C", async (t) => {
  t.timeout(180_000);
  const dataDir = await mkdtemp(path.join(os.tmpdir(), "runs-embedded-"));
  const [port, natsPort, mongoPort] = [await freePort(), await freePort(), await freePort()];
  const env = {
    ...process.env,
    PORT: String(port),
    RUNS_DATA_DIR: dataDir,
    RUNS_EMBEDDED_NATS_PORT: String(natsPort),
    RUNS_EMBEDDED_MONGO_PORT: String(mongoPort),
    NATS_URL: "",
    MONGODB_URI: "",
    LOG_LEVEL: "warn",
  };
  delete (env as Record<string, string | undefined>).NATS_URL;
  delete (env as Record<string, string | undefined>).MONGODB_URI;
  const first = startMain(env);
  try {
    const url = await first.serving;
    t.is(url, `http://127.0.0.1:${port}`);
    const key = /\n {2}(rk_live_\S+)\n/.exec(first.output())?.[1];
    t.truthy(key, "the development key is printed");
    // The banner names what is actually in use, once, apart from the log lines.
    const out = first.output();
    t.is(out.split("runs is serving on").length, 2, "printed once");
    t.true(out.includes(`  API        ${url}/api/v1 `), out);
    t.regex(out, /  workspace  ws_\S+ \("development", plan business\), created by this start\n/);
    t.true(out.includes(`  live tap   nats://127.0.0.1:${natsPort}, user tap, password: "nats_tap_password" in ${dataDir}/secrets.json`), out);
    t.true(out.includes(`  data       ${dataDir}\n`), out);
    const api = new Api(url, key);
    t.is((await api.get("/readyz")).status, 200);

    // The README's walk-through: agent, deployment, run.
    const agent = await api.agentWith({ model: "faux/scripted" });
    const run = await api.post("/api/v1/runs", { agent, input: "hello from the readme" });
    t.is(run.status, 200);
    t.is(run.body.turn.status, "completed");
    t.deepEqual(run.body.turn.output, [{ type: "output_text", text: "hello from the readme" }]);

    // The admin command finds the running embedded store through RUNS_DATA_DIR.
    const admin = await exec(process.execPath, ["bin/runs.js", "admin", "create-workspace", "--plan", "solo", "--name", "second"], {
      cwd: PROJECT_ROOT,
      env,
    });
    const created = JSON.parse(admin.stdout);
    t.is(created.workspace.plan, "solo");
    t.deepEqual([...created.api_key.scopes].sort(), [...SCOPES].sort(), "an all-scopes key: every scope, the webhook ones included");
    const second = new Api(url, created.api_key.key);
    t.is((await second.get("/api/v1/agents")).status, 200, "the new key works against the running service");

    // Defence in depth: what a sandbox escape would look for is closed to others.
    const mode = async (p: string) => (await stat(p)).mode & 0o777;
    t.is(await mode(dataDir), 0o711, "the data folder: searchable (sandbox workspaces below), not listable");
    t.is(await mode(path.join(dataDir, "secrets.json")), 0o600);
    t.is(await mode(path.join(dataDir, "ferretdb")), 0o700, "the store's folder is the service user's alone");
    const info = JSON.parse(await readFile(path.join(dataDir, "embedded.json"), "utf8")) as { mongo_uri: string; server_pids: number[] };
    const socket = path.join(dataDir, "ferretdb", "ferretdb.sock");
    t.is(info.mongo_uri, `mongodb://${encodeURIComponent(socket)}/`);
    t.true((await stat(socket)).isSocket());
    const client = await MongoClient.connect(info.mongo_uri, { serverSelectionTimeoutMS: 5_000 });
    try {
      t.is((await client.db("admin").command({ ping: 1 })).ok, 1, "the real driver reaches the store over its socket");
    } finally {
      await client.close();
    }
    t.true(await portIsFree(mongoPort), "nothing listens on the old store port");
    t.deepEqual(await tcpListeners(info.server_pids[1]!), [], "FerretDB listens on no TCP port");
  } finally {
    const stopped = await stopMain(first.child);
    t.is(stopped.code, 0, first.output());
    t.true(stopped.ms < 10_000, `stopped in ${stopped.ms} ms`);
  }
  t.true(await portIsFree(natsPort), "nats-server stopped");
  t.true(await portIsFree(mongoPort), "FerretDB stopped");

  // A second start on the same data dir keeps the data and prints no new key.
  const again = startMain(env);
  try {
    await again.serving;
    t.notRegex(again.output(), /rk_live_/);
    t.regex(again.output(), /  API key    shown by the start that created the workspace/);
  } finally {
    t.is((await stopMain(again.child)).code, 0, again.output());
  }
  await rm(dataDir, { recursive: true, force: true });
});

test("embedded - npm start killed with SIGKILL: its nats-server and FerretDB end too, and a new start on the same data folder serves", async (t) => {
  t.timeout(180_000);
  const dataDir = await mkdtemp(path.join(os.tmpdir(), "runs-embedded-kill-"));
  const [port, natsPort] = [await freePort(), await freePort()];
  const env: NodeJS.ProcessEnv = { ...process.env, PORT: String(port), RUNS_DATA_DIR: dataDir, RUNS_EMBEDDED_NATS_PORT: String(natsPort), LOG_LEVEL: "warn" };
  delete env.NATS_URL;
  delete env.MONGODB_URI;
  const first = startMain(env);
  let serverPids: number[] = [];
  try {
    const url = await first.serving;
    const key = /\n {2}(rk_live_\S+)\n/.exec(first.output())?.[1];
    const agent = await new Api(url, key).agentWith({ model: "faux/scripted" });
    serverPids = (JSON.parse(await readFile(path.join(dataDir, "embedded.json"), "utf8")) as { server_pids: number[] }).server_pids;
    t.is(serverPids.length, 2);
    for (const pid of serverPids) t.regex(await readFile(`/proc/${pid}/cmdline`, "utf8"), /nats-server|ferretdb/, "the pids are the servers themselves");
    // However the service dies, its servers go with it.
    first.child.kill("SIGKILL");
    const gone = async () => {
      for (let i = 0; i < 100; i++) {
        if (serverPids.every((pid) => !alive(pid))) return true;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      return false;
    };
    t.true(await gone(), `servers still running 10 s after the kill: ${serverPids.filter(alive)}`);
    t.true(await portIsFree(natsPort), "the NATS port is free again");

    const again = startMain(env);
    try {
      const url2 = await again.serving;
      const api = new Api(url2, key);
      // The dead node's partition leases lapse first (RUNS_LEASE_TTL_MS): until then 503, retried as a client would.
      let run = await api.post("/api/v1/runs", { agent, input: "after the kill" }, "after-kill");
      for (let i = 0; i < 60 && run.status === 503; i++) {
        await new Promise((resolve) => setTimeout(resolve, 500));
        run = await api.post("/api/v1/runs", { agent, input: "after the kill" }, "after-kill");
      }
      t.is(run.status, 200, JSON.stringify(run.body));
      t.is(run.body.turn.status, "completed");
    } finally {
      t.is((await stopMain(again.child)).code, 0, again.output());
    }
  } finally {
    for (const pid of serverPids) if (alive(pid)) process.kill(pid, "SIGKILL");
    await rm(dataDir, { recursive: true, force: true });
  }
});

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return !/\)\s+Z\s/.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
}

/** Inodes of the TCP sockets in LISTEN state that process `pid` holds. */
async function tcpListeners(pid: number): Promise<string[]> {
  const inodes = new Set<string>();
  for (const fd of await readdir(`/proc/${pid}/fd`)) {
    const link = await readlink(`/proc/${pid}/fd/${fd}`).catch(() => "");
    const match = /^socket:\[(\d+)\]$/.exec(link);
    if (match) inodes.add(match[1]!);
  }
  const listening: string[] = [];
  for (const table of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    const lines = (await readFile(table, "utf8").catch(() => "")).split("\n").slice(1);
    for (const line of lines) {
      const cols = line.trim().split(/\s+/);
      if (cols[3] === "0A" && inodes.has(cols[9]!)) listening.push(cols[1]!);
    }
  }
  return listening;
}

test("external servers - two npm starts at once on an empty store make one development workspace, whose key one of them prints and both accept; a start that finds the making claimed makes none and says what to do; the image's entry point makes none", async (t) => {
  t.timeout(180_000);
  const servers = await startTestServers();
  t.teardown(() => servers.stop());
  const base = {
    ...process.env,
    NATS_URL: servers.natsUrl,
    NATS_USER: "runs",
    NATS_PASSWORD: servers.servicePassword,
    MONGODB_URI: servers.mongoUri,
    MONGODB_DB: servers.dbName,
    RUNS_MASTER_KEY: Buffer.alloc(32, 9).toString("base64"),
    RUNS_PARTITIONS: "8",
    LOG_LEVEL: "info",
    // As `npm start` sets it (startMain runs node/main.ts itself).
    RUNS_DEV_WORKSPACE: "1",
  };
  const starts = [0, 1].map((i) => startMain({ ...base, PORT: "0", RUNS_NODE_ID: `external-${i}`, RUNS_DATA_DIR: path.join(servers.dir, `external-${i}`) }));
  try {
    const urls = await Promise.all(starts.map((start) => start.serving));
    const keys = starts.map((start) => /\n {2}(rk_live_\S+)\n/.exec(start.output())?.[1]).filter((key): key is string => key !== undefined);
    t.is(keys.length, 1, starts.map((start) => start.output()).join("\n----\n"));
    const raw = (await servers.raw()).db;
    t.is(await raw.collection("workspaces").countDocuments({}), 1);
    for (const url of urls) t.is((await new Api(url, keys[0]).get("/api/v1/agents")).status, 200, url);
  } finally {
    for (const start of starts) await stopMain(start.child);
  }
  // A start that finds the making claimed (by a start that lost its way before making it)
  // makes none and says what to do.
  const claimed = `${servers.dbName}_claimed`;
  const client = await new MongoClient(servers.mongoUri).connect();
  try {
    await client.db(claimed).collection("bootstrap").insertOne({ _id: "development_workspace", at: Date.now() } as any);
  } finally {
    await client.close();
  }
  const late = startMain({ ...base, MONGODB_DB: claimed, PORT: "0", RUNS_NODE_ID: "external-late", RUNS_DATA_DIR: path.join(servers.dir, "external-late") });
  try {
    await late.serving;
    // The log line may follow the banner (the logger writes asynchronously).
    for (let i = 0; i < 100 && !late.output().includes("another start is making the development workspace"); i++) await new Promise((r) => setTimeout(r, 100));
    t.notRegex(late.output(), /rk_live_/);
    t.regex(late.output(), /another start is making the development workspace and prints its key \(if none appears, make one with `npx runs admin create-workspace --plan business --create`\)/);
  } finally {
    await stopMain(late.child);
  }
  // The image's entry point (no RUNS_DEV_WORKSPACE) makes none and prints no key.
  const image = startMain({ ...base, RUNS_DEV_WORKSPACE: "", MONGODB_DB: `${servers.dbName}_image`, PORT: "0", RUNS_NODE_ID: "external-image", RUNS_DATA_DIR: path.join(servers.dir, "external-image") });
  try {
    await image.serving;
    t.notRegex(image.output(), /rk_live_/);
    const client = await new MongoClient(servers.mongoUri).connect();
    try {
      t.is(await client.db(`${servers.dbName}_image`).collection("workspaces").countDocuments({}), 0);
    } finally {
      await client.close();
    }
  } finally {
    await stopMain(image.child);
  }
});

test("cli - admin create-workspace rejects a bad plan with usage and exit 2", async (t) => {
  const err = await t.throwsAsync(exec(process.execPath, ["bin/runs.js", "admin", "create-workspace", "--plan", "gold"], { cwd: PROJECT_ROOT }));
  const e = err as unknown as { code: number; stderr: string };
  t.is(e.code, 2);
  t.regex(e.stderr, /--plan must be solo or business/);
  t.notRegex(e.stderr, /at .*\.ts:\d+/, "no stack trace");
});

test("servers - a port another program holds is not taken for nats-server's: the start fails with the reason from its log", async (t) => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "runs-port-held-"));
  // Something else listens (and greets) on the port first.
  const squatter = net.createServer((socket) => socket.end("HELLO\r\n"));
  await new Promise<void>((resolve) => squatter.listen(0, "127.0.0.1", () => resolve()));
  const port = (squatter.address() as net.AddressInfo).port;
  try {
    const error = await t.throwsAsync(
      startNatsServer({ port, storeDir: path.join(dir, "store"), logFile: path.join(dir, "nats.log"), servicePassword: "s", tapPassword: "t" }),
    );
    t.regex(error!.message, /nats-server exited with code 1 while starting \(its log: ".*address already in use/);
  } finally {
    squatter.close();
    await rm(dir, { recursive: true, force: true });
  }
});
