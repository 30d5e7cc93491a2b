/**
 * Escape attempts against the tool sandbox, through the real API, one test per
 * attempt: a `faux/scripted` agent makes the tool calls an attacker would, and every
 * test checks both what the tools answered (the run's stored `tool_execution_end`
 * events) and the host (files, processes, what the loopback servers saw). Each
 * attempt succeeds on a node without the sandbox, so each test fails there.
 *
 * Network: nothing here leaves loopback. The allowed egress destination is a local
 * server mapped by RUNS_EGRESS_TEST_HOSTS, refused names are refused by the proxy
 * before any lookup, and name resolution is tried only for `localhost` (answered by
 * /etc/hosts on a host without the sandbox, by nothing inside it). Loops are bounded
 * in count and time, the fork bomb included.
 *
 * The contract's sandbox failure codes (capacity, start retries, checkpoint restore)
 * are in failures.test.ts.
 */
import anyTest, { type ExecutionContext, type TestFn } from "ava";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { chmod, mkdir, readdir, readFile, stat, writeFile } from "node:fs/promises";
import http from "node:http";
import { spawnSync } from "node:child_process";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import { holdingBomb, hostProcesses, settledCount } from "../helpers/sandbox.js";
import type { RunningService } from "../../node/service.js";
import { describeLimit, limitsOf } from "../../actors/sandbox-limits.js";

/** A loopback HTTP server that records what reached it. */
interface Probe {
  server: http.Server;
  port: number;
  connections: number;
  urls: string[];
}

interface Ctx {
  servers: TestServers;
  service: RunningService;
  /** The main node's data folder: `workspaces/<run_id>` live here. */
  dataDir: string;
  /** A value in a file the node keeps in its data folder (0600); no tool may read it. */
  secret: string;
  api: Api;
  other: Api;
  /** Every request URL the main node's HTTP server received. */
  apiUrls: string[];
  /** The allowed egress destination, `allowed.test`. */
  egressTarget: Probe;
  /** Stands in for an OpenAI-compatible endpoint on loopback. */
  provider: Probe;
}

const test = anyTest as TestFn<Ctx>;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const unique = () => randomBytes(5).toString("hex");

async function startProbe(answer: (req: http.IncomingMessage) => string): Promise<Probe> {
  const probe: Probe = { server: http.createServer(), port: 0, connections: 0, urls: [] };
  probe.server.on("connection", () => probe.connections++);
  probe.server.on("request", (req: http.IncomingMessage, res: http.ServerResponse) => {
    probe.urls.push(req.url ?? "");
    req.resume();
    req.on("end", () => res.end(answer(req)));
  });
  await new Promise<void>((resolve) => probe.server.listen(0, "127.0.0.1", resolve));
  probe.port = (probe.server.address() as AddressInfo).port;
  return probe;
}

test.before(async (t) => {
  t.timeout(120_000);
  const [servers, egressTarget, provider] = await Promise.all([
    startTestServers(),
    startProbe((req) => `egress-ok ${req.url}`),
    startProbe(() => "{}"),
  ]);
  const dataDir = path.join(servers.dir, "node-main");
  const service = await startTestService(servers, {
    RUNS_DATA_DIR: dataDir,
    RUNS_ACTIVE_TURNS_SOLO: "1000",
    RUNS_EGRESS_TEST_HOSTS: `allowed.test=127.0.0.1:${egressTarget.port}`,
    // Model endpoints on loopback are refused (the default), which one test relies on.
    RUNS_ALLOW_PRIVATE_MODEL_ENDPOINTS: "0",
    // escape-rlimit.test.ts runs every attempt again with the limits of a host without cgroups (containers).
    RUNS_SANDBOX_LIMITS: process.env.RUNS_TEST_SANDBOX_LIMITS ?? "auto",
  });
  const apiUrls: string[] = [];
  service.app!.server.on("request", (req: http.IncomingMessage) => apiUrls.push(req.url ?? ""));
  const secret = `node-secret-${unique()}`;
  await writeFile(path.join(dataDir, "secrets.json"), JSON.stringify({ master_key: secret }), { mode: 0o600 });
  const ws = await newWorkspace(service);
  const other = await newWorkspace(service);
  t.context = {
    servers,
    service,
    dataDir,
    secret,
    api: ws.api,
    other: other.api,
    apiUrls,
    egressTarget,
    provider,
  };
  if (process.env.RUNS_TEST_SANDBOX_LIMITS === "rlimit") {
    const ready = (await (await fetch(`${service.url}/readyz`)).json()) as { sandbox?: { limits?: string; cpu?: string } };
    if (ready.sandbox?.limits !== "rlimit") throw new Error(`the node's sandbox limits by ${ready.sandbox?.limits}, not rlimits`);
    if (ready.sandbox?.cpu !== "nice") throw new Error(`the node's sandboxes' CPU is kept by ${ready.sandbox?.cpu}, not nice`);
  }
});

test.after.always(async (t) => {
  const c = t.context;
  await c.service?.close().catch(() => undefined);
  c.egressTarget?.server.close();
  c.provider?.server.close();
  await c.servers?.stop();
});

// ---- helpers -------------------------------------------------------------------------

type Step = { tool_call: { name: string; arguments: Record<string, unknown> } };
const bash = (command: string): Step => ({ tool_call: { name: "bash", arguments: { command } } });
const tool = (name: string, args: Record<string, unknown>): Step => ({ tool_call: { name, arguments: args } });

interface ToolResult {
  name: string;
  text: string;
  isError: boolean;
}

interface Outcome {
  runId: string;
  turnId: string;
  turn: any;
  results: ToolResult[];
  events: any[];
}

/** A scripted agent that makes `steps`, then answers "done". */
function scripted(steps: Step[], extra: Record<string, unknown> = {}) {
  return { model: "faux/scripted", script: [...steps, { text: "done" }], ...extra };
}

/** Every stored event of a run (one page of 1000 is plenty for these runs). */
async function eventsOf(api: Api, runId: string): Promise<any[]> {
  const res = await api.get(`/api/v1/runs/${runId}/events?limit=1000`);
  if (res.status !== 200) throw new Error(`events: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body.data;
}

function toolResultsOf(events: any[]): ToolResult[] {
  return events
    .filter((e) => e.type === "tool_execution_end")
    .map((e) => ({
      name: e.data.toolName,
      text: (e.data.result?.content ?? []).filter((c: any) => c.type === "text").map((c: any) => c.text).join(""),
      isError: e.data.isError === true,
    }));
}

async function startRun(api: Api, agent: string, input = "go"): Promise<{ runId: string; turnId: string }> {
  const res = await api.post("/api/v1/runs", { agent, input, background: true });
  if (res.status !== 202) throw new Error(`start failed: ${res.status} ${JSON.stringify(res.body)}`);
  return { runId: res.body.id, turnId: res.body.turn.id };
}

async function finish(api: Api, runId: string, turnId: string, timeoutMs: number): Promise<Outcome> {
  const final = await api.waitTurn(runId, turnId, timeoutMs);
  const events = await eventsOf(api, runId);
  return { runId, turnId, turn: final.turn, results: toolResultsOf(events), events };
}

/** Runs the steps in a new run of a new agent and returns its final turn and tool results. */
async function attempt(api: Api, steps: Step[], extra: Record<string, unknown> = {}, timeoutMs = 30_000): Promise<Outcome> {
  const agent = await api.agentWith(scripted(steps, extra));
  const { runId, turnId } = await startRun(api, agent);
  return finish(api, runId, turnId, timeoutMs);
}

/** Polls `check` every 50 ms until it holds or `timeoutMs` passed; returns its last value. */
async function until<T>(check: () => Promise<T> | T, ok: (value: T) => boolean, timeoutMs: number): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let value = await check();
  while (!ok(value) && Date.now() < deadline) {
    await sleep(50);
    value = await check();
  }
  return value;
}


function shown(outcome: Outcome): string {
  return JSON.stringify({ status: outcome.turn.status, error: outcome.turn.error, results: outcome.results }, null, 1);
}

/** Every step ran and the turn completed (a tool error is the agent's, not the turn's). */
function ranAll(t: ExecutionContext<Ctx>, outcome: Outcome, steps: number): void {
  t.is(outcome.turn.status, "completed", shown(outcome));
  t.is(outcome.results.length, steps, shown(outcome));
}

function neverShows(t: ExecutionContext<Ctx>, outcome: Outcome, secret: string): void {
  for (const [i, r] of outcome.results.entries()) t.false(r.text.includes(secret), `tool result ${i} (${r.name}) shows ${secret}: ${r.text}`);
}

// ---- the node's own files and processes -----------------------------------------------

test("sandbox - a tool cannot read the node's data folder or the secrets file in it (host path, ../.., read tool, symlink)", async (t) => {
  const { api, dataDir, secret } = t.context;
  const secrets = path.join(dataDir, "secrets.json");
  const steps = [
    bash(`cat ${secrets}`),
    bash(`ls -la ${dataDir}`),
    bash("cat ../../secrets.json"),
    bash("ls -la ../.."),
    tool("read", { path: "../../secrets.json" }),
    tool("read", { path: secrets }),
    bash(`ln -s ${dataDir} hostdata && ls hostdata/`),
    tool("read", { path: "hostdata/secrets.json" }),
  ];
  const outcome = await attempt(api, steps);
  ranAll(t, outcome, steps.length);
  neverShows(t, outcome, secret);
  const [catHost, lsHost, catUp, lsUp, readUp, readHost, viaLink, readLink] = outcome.results;
  t.true(catHost!.isError, catHost!.text);
  t.regex(catHost!.text, /No such file or directory/);
  t.true(lsHost!.isError, lsHost!.text);
  t.true(catUp!.isError, catUp!.text);
  t.false(lsUp!.text.includes("secrets.json"), lsUp!.text);
  t.false(lsUp!.text.includes("workspaces"), lsUp!.text);
  t.true(readUp!.isError, readUp!.text);
  t.regex(readUp!.text, /outside the workspace/);
  t.true(readHost!.isError, readHost!.text);
  t.true(viaLink!.isError, viaLink!.text);
  t.true(readLink!.isError, readLink!.text);
  // The host: the paths named are real, and ../.. from the run's workspace is the data folder.
  t.true(existsSync(path.join(dataDir, "workspaces", outcome.runId)));
  t.is(path.resolve(dataDir, "workspaces", outcome.runId, "../.."), dataDir);
  t.is(JSON.parse(await readFile(secrets, "utf8")).master_key, secret);
  t.is((await stat(secrets)).mode & 0o777, 0o600);
});

test("sandbox - a tool cannot see the node's process: /proc/<node pid>/environ, ps and ls /proc show none of the host's processes", async (t) => {
  const { api, servers } = t.context;
  const nodePid = process.pid;
  const natsPid = servers.nats.child?.pid;
  const steps = [
    bash(`cat /proc/${nodePid}/environ`),
    bash(`cat /proc/${nodePid}/cmdline`),
    bash("ps -e -o pid=,args="),
    bash("ls /proc | grep -E '^[0-9]+$'"),
  ];
  const outcome = await attempt(api, steps);
  ranAll(t, outcome, steps.length);
  const [environ, cmdline, ps, procs] = outcome.results;
  t.true(environ!.isError, environ!.text);
  t.regex(environ!.text, /No such file or directory/);
  t.true(cmdline!.isError, cmdline!.text);
  const hostEnviron = await readFile(`/proc/${nodePid}/environ`, "utf8");
  t.true(hostEnviron.includes("PATH="), "the host can read it: the path is real");
  t.false(environ!.text.includes("PATH="), environ!.text);
  t.false(ps!.isError, ps!.text);
  t.notRegex(ps!.text, /\bnode\b|nats-server|ferretdb/, ps!.text);
  const pids = procs!.text.split("\n").filter((l) => /^\d+$/.test(l)).map(Number);
  t.true(pids.length > 0 && pids.length < 20, `pids inside: ${pids.join(" ")}`);
  t.false(pids.includes(nodePid), `the node's pid ${nodePid} is visible`);
  if (natsPid !== undefined) t.false(pids.includes(natsPid), `nats-server's pid ${natsPid} is visible`);
});

test("sandbox - a tool cannot connect to the NATS, store and HTTP ports on 127.0.0.1, and those servers see nothing", async (t) => {
  const { api, servers, service, apiUrls } = t.context;
  const marker = `escape-${unique()}`;
  // Its own listener: the egress test's server takes connections meanwhile.
  const listener = await startProbe(() => "listener");
  t.teardown(() => listener.server.close());
  const storePort = servers.ferret.port || Number(new URL(servers.mongoUri).port);
  const httpPort = Number(new URL(service.url!).port);
  const ports = { nats: servers.nats.port, store: storePort, http: httpPort, listener: listener.port };
  // Connects, sends a request naming the marker, reads for at most 2 s.
  const probe = (port: number) =>
    bash(
      `if exec 3<>/dev/tcp/127.0.0.1/${port}; then printf 'GET /${marker} HTTP/1.0\\r\\n\\r\\n' >&3; echo "port ${port}: CONNECTED"; timeout 2 head -c 300 <&3; else echo "port ${port}: refused"; fi`,
    );
  const steps = Object.values(ports).map(probe);
  const outcome = await attempt(api, steps);
  ranAll(t, outcome, steps.length);
  for (const [i, [name, port]] of Object.entries(ports).entries()) {
    const r = outcome.results[i]!;
    t.regex(r.text, new RegExp(`port ${port}: refused`), `${name}: ${r.text}`);
    t.notRegex(r.text, /CONNECTED|INFO \{|HTTP\/1\.[01]/, `${name}: ${r.text}`);
  }
  // The host: the servers it can watch saw nothing.
  t.false(apiUrls.some((u) => u.includes(marker)), "the node's HTTP server got the sandbox's request");
  t.is(listener.connections, 0, "the loopback listener saw a connection");
});

// ---- other runs' workspaces ------------------------------------------------------------

test("sandbox - a tool cannot read another run's workspace, in its own or another workspace (host path, .., ls ..)", async (t) => {
  const { api, other, dataDir } = t.context;
  const echo = { model: "faux/scripted" };
  const sibling = await api.post("/api/v1/runs", { agent: await api.agentWith(echo), input: "sibling" });
  const stranger = await other.post("/api/v1/runs", { agent: await other.agentWith(echo), input: "stranger" });
  t.is(sibling.body.turn?.status, "completed", JSON.stringify(sibling.body));
  t.is(stranger.body.turn?.status, "completed", JSON.stringify(stranger.body));
  const victims = [
    { runId: sibling.body.id as string, content: `sibling-secret-${unique()}` },
    { runId: stranger.body.id as string, content: `stranger-secret-${unique()}` },
  ];
  for (const v of victims) {
    const dir = path.join(dataDir, "workspaces", v.runId);
    t.true(existsSync(dir), `victim workspace ${dir}`);
    await writeFile(path.join(dir, "planted.txt"), v.content);
  }
  const steps = victims.flatMap((v) => {
    const host = path.join(dataDir, "workspaces", v.runId);
    return [
      bash(`cat ${host}/planted.txt`),
      bash(`cat ../${v.runId}/planted.txt`),
      tool("read", { path: `../${v.runId}/planted.txt` }),
      tool("read", { path: `${host}/planted.txt` }),
      tool("ls", { path: host }),
    ];
  });
  steps.push(bash("ls -a .."), bash("ls -a ../.."), tool("ls", { path: ".." }));
  const outcome = await attempt(api, steps);
  ranAll(t, outcome, steps.length);
  for (const v of victims) neverShows(t, outcome, v.content);
  for (const r of outcome.results.slice(0, victims.length * 5)) t.true(r.isError, `${r.name}: ${r.text}`);
  const [lsUp, lsUpUp, lsTool] = outcome.results.slice(-3);
  for (const listing of [lsUp!, lsUpUp!]) {
    for (const v of victims) t.false(listing.text.includes(v.runId), `listing shows ${v.runId}: ${listing.text}`);
    t.false(listing.text.includes(outcome.runId), `listing shows the workspaces folder: ${listing.text}`);
  }
  t.true(lsTool!.isError, lsTool!.text);
  // The host: the planted files are where the attempts looked.
  for (const v of victims) t.is(await readFile(path.join(dataDir, "workspaces", v.runId, "planted.txt"), "utf8"), v.content);
});

test("sandbox - a tool cannot write outside the workspace: /etc, /usr, .., a symlink to a host folder, write to ../x; /tmp is private", async (t) => {
  const { api, dataDir } = t.context;
  const m = unique();
  const name = `escape-${m}`;
  const steps = [
    bash(`echo pwned > /etc/${name}`),
    bash(`echo pwned > /usr/${name}`),
    bash(`echo pwned > ../${name}`),
    bash(`echo pwned > ../../${name}`),
    bash(`ln -s ${dataDir} hostlink && echo pwned > hostlink/${name}`),
    bash(`echo private > /tmp/${name} && cat /tmp/${name}`),
    tool("write", { path: `../${name}`, content: "pwned" }),
    tool("write", { path: `/etc/${name}`, content: "pwned" }),
    tool("write", { path: `hostlink/${name}-w`, content: "pwned" }),
    tool("write", { path: `inside-${m}.txt`, content: "inside" }),
  ];
  const outcome = await attempt(api, steps);
  ranAll(t, outcome, steps.length);
  const r = outcome.results;
  for (const i of [0, 1, 2, 3, 4, 6, 7, 8]) t.true(r[i]!.isError, `step ${i} (${r[i]!.name}) succeeded: ${r[i]!.text}`);
  t.false(r[5]!.isError, r[5]!.text);
  t.regex(r[5]!.text, /private/);
  t.false(r[9]!.isError, r[9]!.text);
  // The host: nothing appeared outside; the write inside did land in the run's workspace.
  const workspace = path.join(dataDir, "workspaces", outcome.runId);
  const outside = [
    `/etc/${name}`,
    `/usr/${name}`,
    path.join(dataDir, "workspaces", name),
    path.join(dataDir, name),
    path.join(dataDir, `${name}-w`),
    path.join("/tmp", name),
  ];
  for (const p of outside) t.false(existsSync(p), `${p} was written from the sandbox`);
  t.is(await readFile(path.join(workspace, `inside-${m}.txt`), "utf8"), "inside");
});

test("sandbox - commands run as a non-root uid, and files a run creates are owned by a non-root host uid", async (t) => {
  const { api, dataDir } = t.context;
  const steps = [bash("id -u; id -g"), bash("echo made > made.txt && mkdir -p sub && touch sub/inner")];
  const outcome = await attempt(api, steps);
  ranAll(t, outcome, steps.length);
  const ids = outcome.results[0]!.text.trim().split("\n");
  t.is(ids.length, 2, outcome.results[0]!.text);
  t.not(ids[0], "0", "uid 0 inside the sandbox");
  t.not(ids[1], "0", "gid 0 inside the sandbox");
  const workspace = path.join(dataDir, "workspaces", outcome.runId);
  for (const p of ["made.txt", "sub", "sub/inner"]) {
    const info = await stat(path.join(workspace, p));
    t.not(info.uid, 0, `${p} is owned by root on the host`);
    t.not(info.gid, 0, `${p} has group root on the host`);
  }
});

// ---- limits and teardown (timing matters: serial) --------------------------------------

/** An agent whose single bash step echoes, timed from the request to its final turn. */
async function timedEcho(api: Api): Promise<{ ms: number; outcome: Outcome }> {
  const agent = await api.agentWith(scripted([bash("echo alive")]));
  const started = Date.now();
  const { runId, turnId } = await startRun(api, agent);
  const outcome = await finish(api, runId, turnId, 30_000);
  return { ms: Date.now() - started, outcome };
}

/** Waits (bounded) until a run's first tool call has started. */
async function toolStarted(api: Api, runId: string, timeoutMs = 10_000): Promise<boolean> {
  const events = await until(() => eventsOf(api, runId), (ev) => ev.some((e) => e.type === "tool_execution_start"), timeoutMs);
  return events.some((e) => e.type === "tool_execution_start");
}

test.serial("sandbox - a fork bomb is held at limits.processes: its tool error names the limit, and a concurrent run's echo completes within seconds", async (t) => {
  const { api } = t.context;
  const config = { limits: { processes: 16, command_timeout_s: 5 } };
  // Bounded even unconfined: a binary tree of depth 7 (at most 255 shells and 128 sleeps of 3 s).
  const bomb = "b(){ if [ $1 -eq 0 ]; then sleep 3; return; fi; b $(($1-1)) & b $(($1-1)) & wait; }; b 7";
  const agent = await api.agentWith(scripted([bash(bomb)], config));
  const { runId, turnId } = await startRun(api, agent);
  t.true(await toolStarted(api, runId), "the bomb's command never started");
  await sleep(500);
  const echo = await timedEcho(api);
  t.is(echo.outcome.turn.status, "completed", shown(echo.outcome));
  t.is(echo.outcome.results[0]?.text, "alive\n");
  t.true(echo.ms < 5_000, `the concurrent echo took ${echo.ms} ms`);
  const outcome = await finish(api, runId, turnId, 30_000);
  ranAll(t, outcome, 1);
  const result = outcome.results[0]!;
  t.true(result.isError, result.text);
  t.true(result.text.includes(describeLimit("processes", limitsOf(config))), result.text);
});

test.serial("sandbox - a tenant's fork bomb holding its whole process limit does not keep another workspace's command with the same limit from starting or forking", async (t) => {
  const { api, other, dataDir } = t.context;
  const config = { limits: { processes: 16, command_timeout_s: 40 } };
  const marker = `bomb-${unique()}`;
  // Made first, so the other command starts while the bomb surely holds its processes.
  const victim = await other.agentWith(scripted([bash("for i in 1 2 3 4; do sleep 0.1 & done; wait; echo alive")], config));
  // Holds every process its limit allows until `release` appears in its workspace (bounded: 30 s).
  const agent = await api.agentWith(scripted([bash(holdingBomb(marker, 60))], config));
  const { runId, turnId } = await startRun(api, agent);
  // Its 16 on the host (with rlimits bwrap's own process outside the namespace too).
  const held = await settledCount(marker, 16);
  t.true(held >= 16, `${held} of the bomb's processes run`);
  // Its sandbox runs as the same host uid as the bomb's (without cgroups, RLIMIT_NPROC counts per uid and namespace).
  const { runId: echoRun, turnId: echoTurn } = await startRun(other, victim);
  const echo = await finish(other, echoRun, echoTurn, 30_000);
  t.is(echo.turn.status, "completed", shown(echo));
  t.false(echo.results[0]?.isError, shown(echo));
  t.is(echo.results[0]?.text, "alive\n");
  t.true((await hostProcesses(marker)).length >= 16, "the bomb held its processes while the other command ran");
  await writeFile(path.join(dataDir, "workspaces", runId, "release"), "");
  const outcome = await finish(api, runId, turnId, 30_000);
  ranAll(t, outcome, 1);
  // Its forks past the limit were refused (it tried 60).
  const forked = Number(/forked (\d+)\nheld/.exec(outcome.results[0]!.text)?.[1]);
  t.true(forked >= 13 && forked < 16, outcome.results[0]!.text);
});

test.serial("sandbox - a workspace's commands share a quarter of the node's sandbox processes: while one of its runs holds a command of 4,096, another of its runs forks only a few, and its tool result names the limit it ran with", async (t) => {
  const { api, dataDir } = t.context;
  const marker = `share-${unique()}`;
  // The default RUNS_SANDBOX_PROCESSES (16,384): a workspace's share is 4,096, all held by this command's limit.
  const holder = await api.agentWith(scripted([bash(holdingBomb(marker, 20))], { limits: { processes: 4096, command_timeout_s: 40 } }));
  const { runId, turnId } = await startRun(api, holder);
  await settledCount(marker, 20);
  const forker = "perl -e 'my $n = 0; for (1..40) { my $p = fork; last unless defined $p; if (!$p) { sleep 2; exit 0 } $n++ } print \"forked $n\\n\"; 1 while wait != -1'";
  const second = await api.agentWith(scripted([bash(forker)], { limits: { processes: 256, command_timeout_s: 30 } }));
  const { runId: run2, turnId: turn2 } = await startRun(api, second);
  const squeezed = await finish(api, run2, turn2, 30_000);
  await writeFile(path.join(dataDir, "workspaces", runId, "release"), "");
  ranAll(t, squeezed, 1);
  const text = squeezed.results[0]!.text;
  const forked = Number(/forked (\d+)/.exec(text)?.[1]);
  t.true(forked > 0 && forked < 16, text);
  // A cgroup counts the forks it refused; rlimits leave no trace of a fork perl did not report.
  const byRlimits = process.env.RUNS_TEST_SANDBOX_LIMITS === "rlimit";
  const note = describeLimit("processes", { ...limitsOf({ limits: { processes: 256 } }), processes: 16 });
  if (!byRlimits) t.true(text.includes(note), text);
  ranAll(t, await finish(api, runId, turnId, 30_000), 1);
});

test.serial("sandbox - a memory hog is held at limits.memory_mb: its tool error names the limit, and a concurrent run's echo completes within seconds", async (t) => {
  const { api } = t.context;
  const config = { limits: { memory_mb: 32, command_timeout_s: 30 } };
  // Five tries at a 200 MB string, each killed at the limit (bounded even unconfined).
  const hog = "for i in 1 2 3 4 5; do x=$(head -c 200000000 /dev/zero | tr '\\0' a); done";
  const agent = await api.agentWith(scripted([bash(hog)], config));
  const { runId, turnId } = await startRun(api, agent);
  t.true(await toolStarted(api, runId), "the hog's command never started");
  await sleep(300);
  const echo = await timedEcho(api);
  t.is(echo.outcome.turn.status, "completed", shown(echo.outcome));
  t.true(echo.ms < 5_000, `the concurrent echo took ${echo.ms} ms`);
  const outcome = await finish(api, runId, turnId, 40_000);
  ranAll(t, outcome, 1);
  const result = outcome.results[0]!;
  t.true(result.isError, result.text);
  t.true(result.text.includes(describeLimit("memory", limitsOf(config))), result.text);
});

test.serial("sandbox - a command runs Node.js and Python under the default limits (with rlimits too: memory_mb bounds what a process writes, not the address space it reserves)", async (t) => {
  const { api } = t.context;
  const agent = await api.agentWith(scripted([bash("node -e 'console.log(\"node\", 6 * 7)'; python3 -c 'print(\"python\", 6 * 7)'")]));
  const { runId, turnId } = await startRun(api, agent);
  const outcome = await finish(api, runId, turnId, 60_000);
  ranAll(t, outcome, 1);
  const result = outcome.results[0]!;
  t.false(result.isError, result.text);
  t.is(result.text, "node 42\npython 42\n");
});

test.serial("sandbox - memory outside every limit through the sandbox's own mounts: /dev is read-only, /dev/shm and /tmp each hold at most tmp_mb", async (t) => {
  const { api } = t.context;
  // bwrap's /dev is a tmpfs of half the host's memory: writable, it held what no limit counted (without cgroups, nothing at all).
  // POSIX semaphores (Python's multiprocessing locks) still work: they live in /dev/shm.
  const command =
    "python3 -c 'import multiprocessing; multiprocessing.Lock(); print(\"semaphore-ok\")' 2>&1 | tail -n 1; " +
    "touch /dev/fill; mkdir /dev/dir; echo kept > /dev/null && echo null-ok; " +
    "for d in /dev/shm /tmp; do head -c 33554432 /dev/zero > $d/fill; echo \"$d $(stat -c %s $d/fill)\"; done";
  const agent = await api.agentWith(scripted([bash(command)], { limits: { tmp_mb: 8 } }));
  const { runId, turnId } = await startRun(api, agent);
  const outcome = await finish(api, runId, turnId, 60_000);
  ranAll(t, outcome, 1);
  const text = outcome.results[0]!.text;
  t.regex(text, /cannot touch '\/dev\/fill': Read-only file system/, text);
  t.regex(text, /cannot create directory .\/dev\/dir.: Read-only file system/, text);
  t.regex(text, /^null-ok$/m, text);
  t.regex(text, /^semaphore-ok$/m, text);
  for (const dir of ["/dev/shm", "/tmp"]) {
    const size = Number(new RegExp(`^${dir} (\\d+)$`, "m").exec(text)?.[1]);
    t.true(size > 0 && size <= 8 * 1024 * 1024, `${dir}: ${size} bytes of 32 MiB written (${text})`);
  }
  t.regex(text, /No space left on device/, text);
});

test.serial("sandbox - a process killed by SIGBUS for writing through a mapping into a full /dev/shm is told so, naming tmp_mb", async (t) => {
  const { api } = t.context;
  // POSIX shared memory as programs make it: a file in /dev/shm grown past the tmpfs, mapped, written.
  const script = [
    "import mmap, os",
    "fd = os.open('/dev/shm/segment', os.O_CREAT | os.O_RDWR)",
    "os.ftruncate(fd, 16 << 20)",
    "m = mmap.mmap(fd, 16 << 20)",
    "print('mapped', flush=True)",
    "m[:] = b'x' * (16 << 20)",
    "print('written')",
  ].join("\n");
  const agent = await api.agentWith(scripted([bash(`python3 - <<'EOF'\n${script}\nEOF`)], { limits: { tmp_mb: 8 } }));
  const { runId, turnId } = await startRun(api, agent);
  const outcome = await finish(api, runId, turnId, 60_000);
  ranAll(t, outcome, 1);
  const result = outcome.results[0]!;
  t.true(result.isError, result.text);
  t.regex(result.text, /^mapped$/m, result.text);
  t.notRegex(result.text, /^written$/m, result.text);
  t.true(result.text.includes(describeLimit("tmp", limitsOf({ limits: { tmp_mb: 8 } }))), result.text);
});

test.serial("sandbox - system calls no tool needs, and any numbered past the last known one, are refused with ENOSYS; personality cannot turn off address randomisation (EPERM); without a memory cgroup also System V IPC and memfd, so shared memory cannot outgrow memory_mb", async (t) => {
  const { api, service } = t.context;
  // The kernel's numbers, written out here apart from the filter's table: glibc wraps none of these.
  const numbers = { x64: { keyctl: 250, bpf: 321, userfaultfd: 323, perf_event_open: 298, io_uring_setup: 425, getpid: 39 }, arm64: { keyctl: 219, bpf: 280, userfaultfd: 282, perf_event_open: 241, io_uring_setup: 425, getpid: 172 } }[process.arch as "x64" | "arm64"];
  if (!numbers) return t.pass(`no seccomp filter on ${process.arch}`);
  const ready = (await (await fetch(`${service.url}/readyz`)).json()) as { sandbox?: { limits?: string; seccomp?: boolean } };
  t.true(ready.sandbox?.seccomp, JSON.stringify(ready.sandbox));
  const withoutMemoryCgroup = ready.sandbox?.limits === "rlimit";
  const script = [
    "import ctypes, os",
    "libc = ctypes.CDLL(None, use_errno=True)",
    "def show(name, result):",
    "    print(name, 'ok' if result >= 0 else os.strerror(ctypes.get_errno()))",
    `for name, nr, args in [${Object.entries(numbers).map(([name, nr]) => `('${name}', ${nr}, ${name === "io_uring_setup" ? "(1, 0)" : "(0, 0, 0, 0, 0)"})`).join(", ")}]:`,
    "    show(name, libc.syscall(nr, *args))",
    // No call has 470 on Linux 6.18 (ENOSYS either way there); on a newer kernel the filter still refuses it.
    "show('unknown_470', libc.syscall(470, 0, 0, 0, 0, 0))",
    // ADDR_NO_RANDOMIZE (what `setarch -R` sets) is refused; asking (0xffffffff) and PER_LINUX are not.
    "libc.personality.restype = ctypes.c_int",
    "show('personality_query', libc.personality(0xffffffff))",
    "show('personality_linux', libc.personality(0))",
    "show('personality_no_randomize', libc.personality(0x0040000))",
    // 1 GiB of System V shared memory, touched: at memory_mb 64 only a cgroup holds it (it kills the command).
    "shm = libc.shmget(0, 1 << 30, 0o1600)",
    "show('shmget', shm)",
    "show('msgget', libc.msgget(0, 0o1600))",
    "show('semget', libc.semget(0, 1, 0o1600))",
    "try:",
    "    os.memfd_create('x'); print('memfd_create ok')",
    "except OSError as e:",
    "    print('memfd_create', e.strerror)",
    "print('seccomp', open('/proc/self/status').read().split('Seccomp:')[1].split()[0], flush=True)",
    "if shm >= 0:",
    "    libc.shmat.restype = ctypes.c_void_p",
    "    at = libc.shmat(shm, None, 0)",
    "    ctypes.memset(at, 1, 1 << 30)",
    "    print('held 1 GiB')",
  ].join("\n");
  const agent = await api.agentWith(scripted([bash(`python3 - 2>&1 <<'EOF'\n${script}\nEOF\necho "exit $?"`)], { limits: { memory_mb: 64 } }));
  const { runId, turnId } = await startRun(api, agent);
  const outcome = await finish(api, runId, turnId, 60_000);
  ranAll(t, outcome, 1);
  const text = outcome.results[0]!.text;
  for (const name of ["keyctl", "bpf", "userfaultfd", "perf_event_open", "io_uring_setup"]) t.regex(text, new RegExp(`^${name} Function not implemented$`, "m"), text);
  t.regex(text, /^getpid ok$/m, text);
  t.regex(text, /^unknown_470 Function not implemented$/m, text);
  t.regex(text, /^personality_query ok$/m, text);
  t.regex(text, /^personality_linux ok$/m, text);
  t.regex(text, /^personality_no_randomize Operation not permitted$/m, text);
  t.regex(text, /^seccomp 2$/m, text);
  for (const name of ["shmget", "msgget", "semget", "memfd_create"]) {
    t.regex(text, new RegExp(`^${name} ${withoutMemoryCgroup ? "Function not implemented" : "ok"}$`, "m"), text);
  }
  // Without a cgroup nothing would have stopped the segment; with one, the command is killed at its limit.
  t.notRegex(text, /^held 1 GiB$/m, text);
  if (!withoutMemoryCgroup) t.regex(text, /^exit 137$/m, text);
});

test.serial("sandbox - fallocate fails as on a filesystem without it, so no command takes disk blocks faster than it can write them (found by a probe: 4 GiB in 10 ms past disk_mb); posix_fallocate still works, by writing", async (t) => {
  const { api } = t.context;
  const script = [
    // The probe's command: four files of 1023 MiB (each under the file size limit), reserved at once.
    "for i in 1 2 3 4; do fallocate -l 1023M f$i; echo \"fallocate $?\"; done",
    "du -sk . | cut -f1",
    "python3 - <<'EOF'",
    "import os",
    "fd = os.open('small', os.O_CREAT | os.O_WRONLY)",
    "os.posix_fallocate(fd, 0, 1 << 20)",
    "print('posix_fallocate', os.fstat(fd).st_size, os.fstat(fd).st_blocks * 512 >= 1 << 20)",
    // The ioctls the kernel serves as a fallocate (found by a review): FS_IOC_RESVSP, RESVSP64, ZERO_RANGE, 1 GiB each.
    "import fcntl, struct",
    "resv = struct.pack('<hh4xqqiI16x', 0, 0, 0, 1 << 30, 0, 0)",
    "for name, request in [('resvsp', 0x40305828), ('resvsp64', 0x4030582a), ('zero_range', 0x40305839)]:",
    "    big = os.open(name, os.O_CREAT | os.O_WRONLY)",
    "    try:",
    "        fcntl.ioctl(big, request, resv); print(name, 'reserved', os.fstat(big).st_blocks * 512)",
    "    except OSError as e:",
    "        print(name, e.strerror)",
    "print('after', sum(os.stat(n).st_blocks * 512 for n in os.listdir('.')) < 16 << 20)",
    "EOF",
  ].join("\n");
  const agent = await api.agentWith(scripted([bash(`{\n${script}\n} 2>&1`)], { limits: { disk_mb: 1024 } }));
  const { runId, turnId } = await startRun(api, agent);
  const outcome = await finish(api, runId, turnId, 60_000);
  ranAll(t, outcome, 1);
  const text = outcome.results[0]!.text;
  t.is(text.match(/fallocate failed: Operation not supported/g)?.length, 4, text);
  t.is(text.match(/^fallocate 1$/gm)?.length, 4, text);
  // Nothing was reserved: the folder holds a few KiB, not 4 GiB.
  const kib = Number(text.match(/^(\d+)$/m)?.[1]);
  t.true(kib < 1024, text);
  t.regex(text, /^posix_fallocate 1048576 True$/m, text);
  for (const name of ["resvsp", "resvsp64", "zero_range"]) t.regex(text, new RegExp(`^${name} Operation not supported$`, "m"), text);
  t.regex(text, /^after True$/m, text);
});

test.serial("sandbox - files hidden below a path longer than PATH_MAX still count against disk_mb (writes refuse), the turn fails saying the workspace cannot be checkpointed (its last checkpoint kept), and the run's deletion removes them from the host", async (t) => {
  const { api, dataDir } = t.context;
  // 12 MiB in two files (each under the 8 MiB file size limit) at the bottom of 25 folders of 200-character names.
  const hide = 'for i in $(seq 25); do mkdir "$(printf %0200d $i)" && cd "$_" || exit 1; done; head -c 6291456 /dev/zero > a; head -c 6291456 /dev/zero > b; echo hidden';
  const agent = await api.agentWith(scripted([bash(hide), tool("write", { path: "more.txt", content: "more" })], { limits: { disk_mb: 8 } }));
  const { runId, turnId } = await startRun(api, agent);
  const outcome = await finish(api, runId, turnId, 60_000);
  t.is(outcome.results.length, 2, shown(outcome));
  t.is(outcome.turn.status, "failed", shown(outcome));
  t.is(outcome.turn.error.code, "workspace_checkpoint_failed");
  t.is(outcome.turn.error.source, "extension", "the tree its tool commands made, not the platform's failure");
  t.regex(outcome.turn.error.message, /longer than a checkpoint can restore .*: it was not saved, and its last checkpoint is kept\. Shorten or remove that path: until then every turn with tools ends so\./);
  const [made, write] = outcome.results;
  t.regex(made!.text, /^hidden$/m, made!.text);
  t.regex(made!.text, /the workspace is over its disk limit \(8 MiB\)/, made!.text);
  t.true(write!.isError, write!.text);
  t.regex(write!.text, /Not written: the workspace is over its disk limit/, write!.text);
  const workspace = path.join(dataDir, "workspaces", runId);
  t.true(existsSync(workspace));
  t.is((await api.request("DELETE", `/api/v1/runs/${runId}`, { idempotencyKey: `del-${runId}` })).status, 200);
  const gone = await until(() => existsSync(workspace), (present) => !present, 20_000);
  t.false(gone, `${workspace} is still on the host`);
});

test.serial("sandbox - empty files, which take an inode and no block, are bounded too: past one file or folder per 4 KiB of disk_mb the command is told, and writes refuse", async (t) => {
  const { api } = t.context;
  // disk_mb 1: at most 256 files and folders; 2,000 empty files take next to no bytes.
  const flood = "mkdir d && cd d && for i in $(seq 2000); do : > f$i; done; echo made";
  const agent = await api.agentWith(scripted([bash(flood), tool("write", { path: "more.txt", content: "more" })], { limits: { disk_mb: 1 } }));
  const { runId, turnId } = await startRun(api, agent);
  const outcome = await finish(api, runId, turnId, 60_000);
  ranAll(t, outcome, 2);
  const [made, write] = outcome.results;
  t.regex(made!.text, /^made$/m, made!.text);
  t.regex(made!.text, /the workspace holds more than 256 files and folders \(one per 4 KiB of its disk limit, at most 1000000\)/, made!.text);
  t.true(write!.isError, write!.text);
  t.regex(write!.text, /Not written: the workspace holds more than 256 files and folders/, write!.text);
});

test.serial("sandbox - a command that keeps writing is stopped while it runs once its workspace is past disk_mb (in bytes, or in files and folders), long before its timeout; the tool says so, and writes refuse", async (t) => {
  const { api, dataDir } = t.context;
  // disk_mb 8: 8 MiB and 2,048 files and folders. Each loop would take 20 s and more and
  // write 12 times the limit, ~5 MB a second (a 256 KiB file is within the file size limit,
  // and the pace spares the other tests' disk); the command may run 60 s.
  const bytes = "for i in $(seq 400); do head -c 262144 /dev/zero > big$i || exit 3; sleep 0.05; done; echo wrote all";
  const files = "mkdir d && for i in $(seq 400); do for j in $(seq 50); do : > d/f$i-$j; done; sleep 0.05; done; echo made all";
  // Hard links: a name each, and no inode or block.
  const links = ": > f && mkdir l && for i in $(seq 400); do for j in $(seq 50); do ln f l/$i-$j; done; sleep 0.05; done; echo linked all";
  const steps = [bash(bytes), bash("rm -f big*; echo cleared"), bash(files), tool("write", { path: "more.txt", content: "more" }), bash('echo "$(ls d | wc -l) files"; rm -rf d; echo cleared'), bash(links)];
  const agent = await api.agentWith(scripted(steps, { limits: { disk_mb: 8, command_timeout_s: 60 } }));
  const { runId, turnId } = await startRun(api, agent);
  const outcome = await finish(api, runId, turnId, 180_000);
  ranAll(t, outcome, 6);
  const [wrote, cleared, made, write, clearedAgain, linked] = outcome.results;
  t.true(wrote!.isError, wrote!.text);
  t.regex(wrote!.text, /^Command was terminated by signal SIGKILL\n\[sandbox: the workspace is over its disk limit \(8 MiB\): delete files before writing more\]/, wrote!.text);
  t.notRegex(wrote!.text, /wrote all|timed out/, wrote!.text);
  t.regex(cleared!.text, /^cleared$/m, cleared!.text);
  t.regex(made!.text, /^Command was terminated by signal SIGKILL\n\[sandbox: the workspace holds more than 2048 files and folders/, made!.text);
  t.notRegex(made!.text, /made all|timed out/, made!.text);
  t.regex(write!.text, /Not written: the workspace holds more than 2048 files and folders/, write!.text);
  t.regex(clearedAgain!.text, /^cleared$/m, clearedAgain!.text);
  // Stopped within a few of the command's seconds, not at the end of its loop.
  const madeFiles = Number(/^(\d+) files$/m.exec(clearedAgain!.text)?.[1]);
  t.true(madeFiles > 2048 && madeFiles < 10_000, `${madeFiles} of the loop's 20,000 files`);
  t.regex(linked!.text, /^Command was terminated by signal SIGKILL\n\[sandbox: the workspace holds more than 2048 files and folders/, linked!.text);
  t.notRegex(linked!.text, /linked all|timed out/, linked!.text);
  const names = await readdir(path.join(dataDir, "workspaces", runId, "l"));
  t.true(names.length < 10_000, `${names.length} of the loop's 20,000 links`);
});

test.serial("sandbox - a set-user-ID copy of a shell and an opened-up workspace (chmod 755) give no other host user a way in: the workspaces' folder is passable by the sandboxes' group alone, and the next turn clears the bit", async (t) => {
  if (process.getuid?.() !== 0) return t.pass("only a service running as root gives sandboxes a uid of their own");
  if (spawnSync("setpriv", ["--version"]).status !== 0) return t.pass("no setpriv here");
  const { api, dataDir } = t.context;
  // The first turn plants; the next one (the same script) shows what its preparation left.
  const plant = "if [ -e planted ]; then echo \"found $(stat -c %a planted)\"; else cp /bin/sh planted && chmod 4755 planted && chmod 755 /workspace && stat -c %a planted; fi";
  const agent = await api.agentWith(scripted([bash(plant)]));
  const { runId, turnId } = await startRun(api, agent);
  const outcome = await finish(api, runId, turnId, 30_000);
  ranAll(t, outcome, 1);
  t.regex(outcome.results[0]!.text, /^4755$/m, "the command could set the bit inside");
  const folder = path.join(dataDir, "workspaces");
  const info = await stat(folder);
  t.is(info.mode & 0o777, 0o710);
  t.is(info.gid, 65534);
  // Another host user (uid and gid 4242, no groups) can neither list the workspace nor run what was planted.
  const asOther = (command: string) => spawnSync("setpriv", ["--reuid=4242", "--regid=4242", "--clear-groups", "sh", "-c", command], { encoding: "utf8", timeout: 10_000 });
  const listed = asOther(`ls ${path.join(folder, runId)}`);
  t.not(listed.status, 0, listed.stdout);
  t.regex(listed.stderr, /Permission denied/);
  const ran = asOther(`${path.join(folder, runId, "planted")} -p -c id`);
  t.not(ran.status, 0, ran.stdout);
  // The next turn's preparation clears the bit on the host.
  const next = await api.post("/api/v1/runs", { run_id: runId, input: "again" });
  t.is(next.status, 200, JSON.stringify(next.body));
  t.is((await stat(path.join(folder, runId, "planted"))).mode & 0o7777, 0o755);
  const seen = toolResultsOf(await eventsOf(api, runId)).at(-1)!;
  t.regex(seen.text, /^found 755$/m, seen.text);
});

test.serial("sandbox - setsid and double-forked children are gone from the host's process table once the turn is final", async (t) => {
  const { api } = t.context;
  // A unique duration names the processes; bounded (under 100 s) even unconfined.
  const duration = `97.${Math.floor(100000 + Math.random() * 899999)}`;
  const hostMarker = `sleep ${duration}`;
  const command =
    `setsid sleep ${duration} >/dev/null 2>&1 </dev/null & (sleep ${duration} >/dev/null 2>&1 </dev/null &); ` +
    `sleep 0.3; echo "running: $(ps -e -o args= | grep -c '^sleep ${duration}')"; sleep 3`;
  const agent = await api.agentWith(scripted([bash(command)]));
  const { runId, turnId } = await startRun(api, agent);
  // The host sees them while the command runs (so the scan below would find them).
  t.true(await toolStarted(api, runId, 20_000), "the command never started");
  const seen = await until(() => hostProcesses(hostMarker), (pids) => pids.length >= 2, 10_000);
  t.true(seen.length >= 2, `the host never saw both sleeps: ${JSON.stringify(seen)}`);
  const outcome = await finish(api, runId, turnId, 30_000);
  ranAll(t, outcome, 1);
  t.regex(outcome.results[0]!.text, /running: 2/);
  t.deepEqual(await hostProcesses(hostMarker), [], "left on the host after the turn was final");
});

test.serial("sandbox - read of a FIFO answers a tool error at once", async (t) => {
  const { api } = t.context;
  const fifo = `fifo-${unique()}`;
  const steps = [bash(`mkfifo ${fifo}`), tool("read", { path: fifo })];
  const started = Date.now();
  const outcome = await attempt(api, steps, { limits: { command_timeout_s: 60 } });
  const ms = Date.now() - started;
  ranAll(t, outcome, steps.length);
  const read = outcome.results[1]!;
  t.true(read.isError, read.text);
  t.regex(read.text, /not a regular file/);
  t.true(ms < 10_000, `the turn took ${ms} ms`);
  t.deepEqual(await hostProcesses(fifo), []);
});

test.serial("sandbox - a bash command blocked on a FIFO is cancelled and the turn settles cancelled within seconds", async (t) => {
  const { api } = t.context;
  const fifo = `fifo-${unique()}`;
  const agent = await api.agentWith(scripted([bash(`mkfifo ${fifo} && cat ${fifo}`)], { limits: { command_timeout_s: 120 } }));
  const { runId, turnId } = await startRun(api, agent);
  const blocked = await until(() => hostProcesses(fifo), (pids) => pids.length > 0, 10_000);
  t.true(blocked.length > 0, "the blocked cat never showed up on the host");
  const started = Date.now();
  const cancel = await api.post(`/api/v1/runs/${runId}/cancel`, {});
  t.is(cancel.status, 202, JSON.stringify(cancel.body));
  const final = await api.waitTurn(runId, turnId, 10_000);
  const ms = Date.now() - started;
  t.is(final.turn.status, "cancelled", JSON.stringify(final.turn));
  t.true(ms < 5_000, `settled after ${ms} ms`);
  t.deepEqual(await hostProcesses(fifo), [], "the blocked command outlived the cancel");
});

// ---- network -----------------------------------------------------------------------------

test("sandbox - no network by default: only lo in /proc/net/dev, no name resolves, 127.0.0.1 of the host is refused", async (t) => {
  const { api, servers } = t.context;
  const steps = [
    bash("cat /proc/net/dev"),
    bash('getent hosts localhost; echo "getent rc=$?"'),
    bash(`if exec 3<>/dev/tcp/127.0.0.1/${servers.nats.port}; then echo CONNECTED; timeout 2 head -c 200 <&3; else echo refused; fi`),
  ];
  const outcome = await attempt(api, steps);
  ranAll(t, outcome, steps.length);
  const [dev, getent, nats] = outcome.results;
  const interfaces = dev!.text
    .split("\n")
    .filter((l) => l.includes(":") && !/^\s*(Inter-|face)/.test(l))
    .map((l) => l.split(":")[0]!.trim());
  t.deepEqual(interfaces, ["lo"], dev!.text);
  t.regex(getent!.text, /getent rc=[1-9]/, getent!.text);
  t.false(getent!.text.includes("127.0.0.1"), getent!.text);
  t.regex(nats!.text, /refused/);
  t.notRegex(nats!.text, /CONNECTED|INFO/);
});

test("sandbox - with network.allow an allowed host is reached through the proxy; a host off the list is refused and recorded as sandbox.network_denied", async (t) => {
  const { api, egressTarget } = t.context;
  const m = unique();
  const port = egressTarget.port;
  const before = egressTarget.urls.length;
  const steps = [
    bash("command -v curl"),
    bash(`curl -sS --max-time 10 http://allowed.test:${port}/allowed-${m}`),
    bash(`curl -sS -f --max-time 10 http://denied.test:${port}/denied-${m}`),
    bash(`curl -sS -f --max-time 10 http://127.0.0.1:${port}/loopback-${m}`),
    bash(`curl -sS --max-time 5 --noproxy '*' http://127.0.0.1:${port}/direct-${m}`),
  ];
  const outcome = await attempt(api, steps, { network: { allow: ["allowed.test"] } }, 60_000);
  ranAll(t, outcome, steps.length);
  const [which, allowed, denied, loopback, direct] = outcome.results;
  t.is(which!.text.trim(), "/usr/bin/curl");
  t.false(allowed!.isError, allowed!.text);
  t.is(allowed!.text, `egress-ok /allowed-${m}`);
  for (const r of [denied!, loopback!, direct!]) {
    t.true(r.isError, r.text);
    t.false(r.text.includes("egress-ok"), r.text);
  }
  const denials = outcome.events.filter((e) => e.type === "sandbox.network_denied").map((e) => e.data);
  t.true(
    denials.some((d) => d.host === "denied.test" && d.port === port && d.policy === "config.network.allow"),
    JSON.stringify(denials),
  );
  t.true(denials.some((d) => d.host === "127.0.0.1"), JSON.stringify(denials));
  // The host: the server got the allowed request, and only that one.
  t.deepEqual(egressTarget.urls.slice(before), [`/allowed-${m}`]);
});

test("sandbox - an openai-compatible base_url on 127.0.0.1 fails the turn network_policy_denied (configuration) and sends nothing", async (t) => {
  const { api, provider } = t.context;
  const before = { connections: provider.connections, requests: provider.urls.length };
  const agent = await api.agentWith({
    model: { provider: "openai-compatible", base_url: `http://127.0.0.1:${provider.port}/v1`, model: "m" },
    tools: [],
  });
  const { runId, turnId } = await startRun(api, agent);
  const final = await api.waitTurn(runId, turnId, 30_000);
  t.is(final.turn.status, "failed", JSON.stringify(final.turn));
  t.is(final.turn.error?.code, "network_policy_denied");
  t.is(final.turn.error?.source, "configuration");
  await sleep(200);
  t.is(provider.urls.length, before.requests, "the endpoint received a request");
  t.is(provider.connections, before.connections, "the endpoint received a connection");
});

test("sandbox - a deployment's network allow list is validated: a URL is 400 naming the entry", async (t) => {
  const agent = await t.context.api.post("/api/v1/agents", { name: "bad-network" });
  const res = await t.context.api.post(`/api/v1/agents/${agent.body.id}/deployments`, {
    config: { model: "faux/scripted", network: { allow: ["allowed.test", "https://allowed.test/path"] } },
  });
  t.is(res.status, 400);
  t.is(res.body.error.param, "config.network.allow.1");
});
