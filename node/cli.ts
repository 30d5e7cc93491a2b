import { existsSync } from "node:fs";
import path from "node:path";
import type { MongoStore, Plan } from "../src/index.js";
import type { ServerProcess } from "./servers.js";
import { describeClientError, endQuietlyWhenReaderCloses, parseArgs, runCli, UsageError } from "../client/index.js";

// The admin command's modules (store driver, server processes) load only for `admin`:
// the API commands start about twice as fast without them.
const adminModules = async () => {
  const [floor, embedded, servers, workspaces] = await Promise.all([
    import("../src/index.js"),
    import("./embedded.js"),
    import("./servers.js"),
    import("./workspaces.js"),
  ]);
  return { ...floor, ...embedded, ...servers, ...workspaces };
};

const ADMIN_USAGE = `usage:
  runs admin create-workspace --plan solo|business [--name NAME] [--create]
  runs admin set-plan WORKSPACE_ID --plan solo|business   (applies to runs created afterwards)
  runs admin set-budget WORKSPACE_ID [--cost USD] [--tokens N] [--remove]
                                   (monthly; other nodes apply it within 2 s)

The store is MONGODB_URI when set, otherwise the embedded default's store under
RUNS_DATA_DIR (default .runs/), whether or not \`npm start\` is running. The command says
which store it uses. It never makes a new, empty store unless --create is given (the first
workspace of a new deployment): a wrong RUNS_DATA_DIR or MONGODB_URI is refused instead of
answered with a key the running service would not know.`;

/** Bad usage of an admin command: answered with the admin usage text. */
class AdminUsageError extends UsageError {}

/** The store is not the one the service uses, or not there yet: said plainly, exit 2. */
class NoStoreError extends Error {}

/** A MongoDB URI as it may be shown: host and database, never its credentials. */
function withoutCredentials(uri: string): string {
  return uri.replace(/\/\/[^@/]*@/, "//***@");
}

/**
 * Opens the store the service would use (a private FerretDB on the data folder when the
 * service is not running), says which on stderr, and refuses an empty or missing one
 * unless `create`.
 */
async function openStore(create: boolean): Promise<{ store: MongoStore; close: () => Promise<void> }> {
  const { loadConfig, runningEmbedded, freePort, startFerretDb, MongoStore } = await adminModules();
  const config = loadConfig();
  let uri = config.mongoUri;
  let where: string;
  let ferret: ServerProcess | undefined;
  if (uri) {
    where = `MONGODB_URI ${withoutCredentials(uri)}, database ${config.mongoDb}`;
  } else {
    const running = await runningEmbedded(config.dataDir);
    if (running) {
      uri = running.mongo_uri;
      where = `the running service's embedded store in ${config.dataDir}`;
    } else {
      const storeDir = path.join(config.dataDir, "ferretdb");
      if (!existsSync(storeDir) && !create) {
        throw new NoStoreError(`no store in ${config.dataDir} (RUNS_DATA_DIR): is that the folder npm start uses? Run from the service's folder or set RUNS_DATA_DIR; --create makes a new store there.`);
      }
      const port = await freePort();
      ferret = await startFerretDb({ port, dataDir: storeDir, logFile: path.join(config.dataDir, "logs", "ferretdb-admin.log") });
      uri = `mongodb://127.0.0.1:${port}/`;
      where = `the embedded store in ${config.dataDir} (the service is not running)`;
    }
  }
  process.stderr.write(`runs: store: ${where}\n`);
  const store = await MongoStore.connect(uri, config.mongoDb);
  const close = async () => {
    await store.close();
    await ferret?.stop();
  };
  try {
    if (!create && (await store.countWorkspaces()) === 0) {
      throw new NoStoreError(`the store (${where}) has no workspace: not the service's store? --create makes its first workspace there.`);
    }
    await store.provision();
  } catch (err) {
    await close();
    throw err;
  }
  return { store, close };
}

/** Checked without loading src/ (whose Plan has the same two values). */
const isPlan = (value: string | undefined): value is Plan => value === "solo" || value === "business";

async function main(args: string[]): Promise<void> {
  if (args[0] === "admin" && args[1] === "create-workspace") {
    const p = adminArgs(args.slice(2), { plan: "string", name: "string", create: "boolean" });
    const plan = p.flags.plan as string | undefined;
    if (!isPlan(plan)) throw new AdminUsageError("--plan must be solo or business");
    if (p.positionals.length) throw new AdminUsageError(`unexpected argument: ${p.positionals[0]}`);
    const { store, close } = await openStore(p.flags.create === true);
    const { createWorkspace } = await adminModules();
    try {
      const created = await createWorkspace(store, { plan, name: p.flags.name as string | undefined, nowMs: Date.now() });
      process.stdout.write(`${JSON.stringify(created, null, 2)}\n`);
    } finally {
      await close();
    }
    return;
  }
  if (args[0] === "admin" && args[1] === "set-plan") {
    const p = adminArgs(args.slice(2), { plan: "string" });
    const workspaceId = p.positionals[0];
    if (!workspaceId) throw new AdminUsageError("set-plan needs a workspace id");
    const plan = p.flags.plan as string | undefined;
    if (!isPlan(plan)) throw new AdminUsageError("--plan must be solo or business");
    const { store, close } = await openStore(false);
    const { setWorkspacePlan } = await adminModules();
    try {
      const workspace = await setWorkspacePlan(store, workspaceId, plan);
      if (!workspace) throw new AdminUsageError(`no workspace ${workspaceId}`);
      process.stdout.write(`${JSON.stringify({ workspace }, null, 2)}\n`);
    } finally {
      await close();
    }
    return;
  }
  if (args[0] === "admin" && args[1] === "set-budget") {
    const p = adminArgs(args.slice(2), { cost: "string", tokens: "string", remove: "boolean" });
    const workspaceId = p.positionals[0];
    if (!workspaceId) throw new AdminUsageError("set-budget needs a workspace id");
    const cost = p.flags.cost as string | undefined;
    const tokens = p.flags.tokens as string | undefined;
    if (cost !== undefined && !(/^\d+(\.\d+)?$/.test(cost) && Number(cost) > 0)) throw new AdminUsageError("--cost must be a positive number of US dollars");
    if (tokens !== undefined && !(/^[1-9]\d*$/.test(tokens) && Number.isSafeInteger(Number(tokens)))) throw new AdminUsageError("--tokens must be a positive whole number");
    const remove = p.flags.remove === true;
    if (remove === (cost !== undefined || tokens !== undefined)) throw new AdminUsageError("set-budget needs --cost and/or --tokens, or --remove alone");
    const { store, close } = await openStore(false);
    const { setWorkspaceBudget, systemClock } = await adminModules();
    try {
      const budget = { monthly_cost_usd: cost === undefined ? null : Number(cost), monthly_tokens: tokens === undefined ? null : Number(tokens) };
      const answer = await setWorkspaceBudget(store, workspaceId, budget, systemClock);
      if (!answer) throw new AdminUsageError(`no workspace ${workspaceId}`);
      process.stdout.write(`${JSON.stringify(answer, null, 2)}\n`);
    } finally {
      await close();
    }
    return;
  }
  if (args[0] === "admin") {
    if (args.includes("--help") || args.includes("-h") || args.length === 1) {
      process.stdout.write(`${ADMIN_USAGE}\n`);
      return;
    }
    throw new AdminUsageError(`unknown command: ${args.join(" ")}`);
  }
  process.exitCode = await runCli(args, { stdout: process.stdout, stderr: process.stderr, stdin: process.stdin, env: process.env });
}

/** The admin commands' options, parsed like every command's; their mistakes answered with the admin usage. */
function adminArgs(args: string[], spec: Parameters<typeof parseArgs>[1]) {
  if (args.includes("--help") || args.includes("-h")) throw new AdminHelp();
  try {
    return parseArgs(args, spec);
  } catch (err) {
    throw err instanceof UsageError && !(err instanceof AdminUsageError) ? new AdminUsageError(err.message) : err;
  }
}

class AdminHelp extends Error {}

endQuietlyWhenReaderCloses(process.stdout);
main(process.argv.slice(2)).catch(async (err) => {
  if (err instanceof AdminHelp) {
    process.stdout.write(`${ADMIN_USAGE}\n`);
    return;
  }
  if (err instanceof AdminUsageError) {
    process.stderr.write(`runs: ${err.message}\n\n${ADMIN_USAGE}\n`);
    process.exit(2);
  }
  if (err instanceof NoStoreError) {
    process.stderr.write(`runs: ${err.message}\n`);
    process.exit(2);
  }
  const apiError = describeClientError(err);
  if (apiError) {
    process.stderr.write(`runs: ${apiError}\n`);
    process.exit(1);
  }
  if (err instanceof (await adminModules()).MissingToolError) {
    process.stderr.write(`runs: ${err.message}\n`);
    process.exit(3);
  }
  process.stderr.write(`runs: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
