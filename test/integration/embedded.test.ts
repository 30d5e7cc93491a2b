import test from "ava";
import { spawn, execFile, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { freePort, portIsFree, PROJECT_ROOT } from "../../src/servers.js";
import { Api } from "../helpers/servers.js";

const exec = promisify(execFile);

/** Starts `src/main.ts` as `npm start` does (bootstrap already done by the test command). */
function startMain(env: NodeJS.ProcessEnv): { child: ChildProcess; output: () => string; serving: Promise<string> } {
  // Its own process group, like a program started from a terminal.
  const child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], { cwd: PROJECT_ROOT, env, stdio: ["ignore", "pipe", "pipe"], detached: true });
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
    t.is(created.api_key.scopes.length, 11);
    const second = new Api(url, created.api_key.key);
    t.is((await second.get("/api/v1/agents")).status, 200, "the new key works against the running service");
  } finally {
    const stopped = await stopMain(first.child);
    t.is(stopped.code, 0);
    t.true(stopped.ms < 10_000, `stopped in ${stopped.ms} ms`);
  }
  t.true(await portIsFree(natsPort), "nats-server stopped");
  t.true(await portIsFree(mongoPort), "FerretDB stopped");

  // A second start on the same data dir keeps the data and prints no new key.
  const again = startMain(env);
  try {
    await again.serving;
    t.notRegex(again.output(), /rk_live_/);
  } finally {
    t.is((await stopMain(again.child)).code, 0);
  }
  await rm(dataDir, { recursive: true, force: true });
});

test("cli - admin create-workspace rejects a bad plan with usage and exit 2", async (t) => {
  const err = await t.throwsAsync(exec(process.execPath, ["bin/runs.js", "admin", "create-workspace", "--plan", "gold"], { cwd: PROJECT_ROOT }));
  const e = err as unknown as { code: number; stderr: string };
  t.is(e.code, 2);
  t.regex(e.stderr, /--plan must be solo or business/);
  t.notRegex(e.stderr, /at .*\.ts:\d+/, "no stack trace");
});
