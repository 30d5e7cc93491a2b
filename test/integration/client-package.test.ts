import anyTest, { type TestFn } from "ava";
import { execFile } from "node:child_process";
import { cp, mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import ts from "typescript";
import { newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { PROJECT_ROOT } from "../../node/servers.js";

/** The client as a user gets it: built, packed, installed into an empty folder, run by plain node. */
const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; dir: string }>;
const exec = promisify(execFile);

test.before(async (t) => {
  const servers = await startTestServers();
  t.context = { servers, service: await startTestService(servers), dir: await mkdtemp(path.join(os.tmpdir(), "runs-client-pack-")) };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
  if (t.context.dir) await rm(t.context.dir, { recursive: true, force: true });
});

test("client package - npm pack, install the tarball into an empty folder, start, wait and stream through plain node; types and the runs command come with it", async (t) => {
  t.timeout(180_000);
  const { dir, service } = t.context;
  // What `npm run build:client` does, into a staging copy of the package (the tree stays clean).
  const staging = path.join(dir, "staging");
  await mkdir(staging);
  await cp(path.join(PROJECT_ROOT, "client/package.json"), path.join(staging, "package.json"));
  await cp(path.join(PROJECT_ROOT, "client/README.md"), path.join(staging, "README.md"));
  await exec(process.execPath, [path.join(PROJECT_ROOT, "node_modules/typescript/bin/tsc"), "-p", path.join(PROJECT_ROOT, "client/tsconfig.json"), "--outDir", path.join(staging, "dist")], { timeout: 120_000 });
  const packed = await exec("npm", ["pack", "--silent", "--pack-destination", dir], { cwd: staging, timeout: 60_000 });
  const tarball = path.join(dir, packed.stdout.trim().split("\n").at(-1)!);
  t.regex(path.basename(tarball), /^runs-client-0\.1\.0\.tgz$/);

  const consumer = path.join(dir, "consumer");
  await mkdir(consumer);
  await writeFile(path.join(consumer, "package.json"), JSON.stringify({ name: "consumer", private: true, type: "module" }));
  await exec("npm", ["install", "--offline", "--no-audit", "--no-fund", tarball], { cwd: consumer, timeout: 60_000 });
  t.deepEqual((await readdir(path.join(consumer, "node_modules"))).filter((n) => !n.startsWith(".")), ["runs-client"], "no runtime dependencies");

  const ws = await newWorkspace(service, "business");
  const agent = await ws.api.agentWith({ model: "faux/scripted" });
  await writeFile(
    path.join(consumer, "app.mjs"),
    `import { RunsClient } from "runs-client";
const runs = new RunsClient({ baseUrl: process.env.RUNS_URL, apiKey: process.env.RUNS_API_KEY });
const started = await runs.startRun({ agent: process.env.AGENT, input: "packed hello", background: true });
const done = await runs.waitForTurn(started.id, started.turn.id);
const types = [];
for await (const event of runs.streamEvents(started.id, { turnId: started.turn.id })) types.push(event.type);
console.log(JSON.stringify({ runId: started.id, status: done.turn.status, output: done.turn.output, types }));
`,
  );
  const env = { ...process.env, RUNS_URL: service.url, RUNS_API_KEY: ws.key, AGENT: agent };
  // Plain node: no tsx, no loader; the package is JavaScript with declarations.
  const ran = await exec(process.execPath, ["app.mjs"], { cwd: consumer, env, timeout: 60_000 });
  const result = JSON.parse(ran.stdout) as { runId: string; status: string; output: unknown; types: string[] };
  t.is(result.status, "completed");
  t.deepEqual(result.output, [{ type: "output_text", text: "packed hello" }]);
  t.true(result.types.includes("turn.started"), result.types.join(","));
  t.is(result.types.at(-1), "turn.completed");

  // The installed command line.
  const bin = path.join(consumer, "node_modules/.bin/runs");
  t.is((await exec(bin, ["--version"], { env, timeout: 30_000 })).stdout, "0.1.0\n");
  const got = JSON.parse((await exec(bin, ["get", result.runId, "--json"], { env, timeout: 30_000 })).stdout);
  t.is(got.turn.status, "completed");

  // Its declarations type a user's TypeScript through the package's exports.
  await writeFile(
    path.join(consumer, "use.ts"),
    `import { RunsClient, type Run } from "runs-client";\nconst runs = new RunsClient({ baseUrl: "http://x" });\nexport const status: Promise<Run["turn"]["status"]> = runs.getRun("run_1").then((run) => run.turn.status);\nexport const wrong: number = (await runs.getRun("run_1")).turn.status;\n`,
  );
  const program = ts.createProgram([path.join(consumer, "use.ts")], { strict: true, noEmit: true, target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.NodeNext, moduleResolution: ts.ModuleResolutionKind.NodeNext, types: [] });
  const messages = ts.getPreEmitDiagnostics(program).map((d) => `${d.start !== undefined ? d.file?.getLineAndCharacterOfPosition(d.start).line : "?"}: ${ts.flattenDiagnosticMessageText(d.messageText, " ")}`);
  t.is(messages.length, 1, messages.join("\n"));
  t.regex(messages[0]!, /^3: Type '.*' is not assignable to type 'number'/, "only the deliberate mistake: the types are the package's, resolved through exports");
});
