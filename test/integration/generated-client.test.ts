import anyTest, { type TestFn } from "ava";
import { copyFile, mkdir, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { once } from "node:events";
import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";
import openapiTS, { astToString } from "openapi-typescript";
import { newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { PROJECT_ROOT } from "../../node/servers.js";

const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; dir: string }>;

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers);
  // Inside the project (git-ignored), so the generated code resolves openapi-fetch from node_modules.
  const dir = path.join(PROJECT_ROOT, ".test-data", `generated-client-${process.pid}`);
  await mkdir(dir, { recursive: true });
  t.context = { servers, service, dir };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
  if (t.context.dir) await rm(t.context.dir, { recursive: true, force: true });
});

/**
 * tsc's verdict on `files`, strict, as a user's project would compile them. In a worker
 * thread: a program with lib.dom takes seconds of CPU, and the service under test shares
 * this process's event loop (held that long, its partition leases fall in doubt and a
 * start is answered 503).
 */
async function typeErrors(files: string[]): Promise<string[]> {
  const worker = new Worker(
    `const { workerData, parentPort } = require("node:worker_threads");
    const ts = require(workerData.typescript);
    const program = ts.createProgram(workerData.files, {
      strict: true,
      noEmit: true,
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      skipLibCheck: true,
      types: [],
      lib: ["lib.es2022.d.ts", "lib.dom.d.ts"],
    });
    parentPort.postMessage(ts.getPreEmitDiagnostics(program).map((d) => ts.flattenDiagnosticMessageText(d.messageText, "\\n")));`,
    { eval: true, workerData: { files, typescript: createRequire(import.meta.url).resolve("typescript") } },
  );
  try {
    // A worker that ends without an answer (exit, not error) must not leave the test waiting.
    const exited = once(worker, "exit").then(([code]) => Promise.reject(new Error(`the type-check worker exited (${code}) without an answer`)));
    const [messages] = (await Promise.race([once(worker, "message"), exited])) as [string[]];
    return messages;
  } finally {
    await worker.terminate();
  }
}

test("generated client - openapi-typescript types from the served document type-check a start, a list and an events call, and they work", async (t) => {
  t.timeout(120_000);
  const { service, dir } = t.context;
  const served = await fetch(`${service.url}/api/v1/openapi.json`);
  t.is(served.status, 200);
  const schema = astToString(await openapiTS(await served.json()));
  await writeFile(path.join(dir, "schema.d.ts"), schema);
  await writeFile(path.join(dir, "package.json"), JSON.stringify({ type: "module" }));
  const calls = path.join(dir, "calls.ts");
  await copyFile(path.join(PROJECT_ROOT, "test/fixtures/generated-client-calls.ts"), calls);

  t.deepEqual(await typeErrors([calls]), [], "the calls type-check against the generated types");
  // The check has teeth: a field the answer does not have is refused.
  const wrong = path.join(dir, "wrong.ts");
  await writeFile(
    wrong,
    `import createClient from "openapi-fetch";\nimport type { paths } from "./schema.js";\nconst c = createClient<paths>({ baseUrl: "http://x" });\nconst r = await c.POST("/api/v1/runs", { params: { header: { "Idempotency-Key": "k" } }, body: { agent: "a", input: "i" } });\nexport const x: string | undefined = r.data?.turn.no_such_field;\n`,
  );
  const refused = await typeErrors([wrong]);
  t.true(refused.some((m) => m.includes("no_such_field")), refused.join("\n"));

  const ws = await newWorkspace(service, "business");
  const agent = await ws.api.agentWith({ model: "faux/scripted" });
  // Typed by hand: importing the fixture's type would compile it outside its generated folder.
  const { exercise } = (await import(pathToFileURL(calls).href)) as {
    exercise(baseUrl: string, key: string, agent: string): Promise<{ runId: string; status: string; listedIds: string[]; history: string | null; types: string[]; frames: string; missingCode?: string; streamedStatus: number }>;
  };
  const result = await exercise(service.url!, ws.key, agent);
  t.is(result.status, "completed");
  t.deepEqual(result.listedIds, [result.runId]);
  t.is(result.history, "complete");
  t.true(result.types.includes("turn.started"), result.types.join(","));
  t.is(result.types.at(-1), "turn.completed");
  t.is(result.streamedStatus, 200);
  t.regex(result.frames, /\nevent: turn\.completed\n/);
  t.is(result.missingCode, "run_not_found");
});
