import path from "node:path";
import type { MongoStore, Plan } from "../src/index.js";
import type { ServerProcess } from "./servers.js";
import { CLIENT_USAGE, describeClientError, runClientCommand, UsageError } from "../client/index.js";

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
  runs admin create-workspace --plan solo|business [--name NAME]
  runs admin set-plan WORKSPACE_ID --plan solo|business   (applies to runs created afterwards)

The store is MONGODB_URI when set, otherwise the embedded default's store under
RUNS_DATA_DIR (default .runs/), whether or not \`npm start\` is running.`;

/** Bad usage of an admin command: answered with the admin usage text. */
class AdminUsageError extends UsageError {}

function flag(args: string[], name: string): string | undefined {
  const i = args.indexOf(`--${name}`);
  if (i === -1) return undefined;
  const value = args[i + 1];
  if (value === undefined || value.startsWith("--")) throw new AdminUsageError(`--${name} needs a value`);
  return value;
}

/** Opens the store the service would use; starts a private FerretDB on the data dir when needed. */
async function openStore(): Promise<{ store: MongoStore; close: () => Promise<void> }> {
  const { loadConfig, runningEmbedded, freePort, startFerretDb, MongoStore } = await adminModules();
  const config = loadConfig();
  let uri = config.mongoUri;
  let ferret: ServerProcess | undefined;
  if (!uri) {
    const running = await runningEmbedded(config.dataDir);
    if (running) uri = running.mongo_uri;
    else {
      const port = await freePort();
      ferret = await startFerretDb({
        port,
        dataDir: path.join(config.dataDir, "ferretdb"),
        logFile: path.join(config.dataDir, "logs", "ferretdb-admin.log"),
      });
      uri = `mongodb://127.0.0.1:${port}/`;
    }
  }
  const store = await MongoStore.connect(uri, config.mongoDb);
  await store.provision();
  return {
    store,
    close: async () => {
      await store.close();
      await ferret?.stop();
    },
  };
}

/** Checked without loading src/ (whose Plan has the same two values). */
const isPlan = (value: string | undefined): value is Plan => value === "solo" || value === "business";

async function main(args: string[]): Promise<void> {
  if (args[0] === "admin" && args[1] === "create-workspace") {
    const plan = flag(args, "plan");
    if (!isPlan(plan)) throw new AdminUsageError("--plan must be solo or business");
    const name = flag(args, "name");
    const { store, close } = await openStore();
    const { createWorkspace } = await adminModules();
    try {
      const created = await createWorkspace(store, { plan, name, nowMs: Date.now() });
      process.stdout.write(`${JSON.stringify(created, null, 2)}\n`);
    } finally {
      await close();
    }
    return;
  }
  if (args[0] === "admin" && args[1] === "set-plan") {
    const workspaceId = args[2];
    if (!workspaceId || workspaceId.startsWith("--")) throw new AdminUsageError("set-plan needs a workspace id");
    const plan = flag(args, "plan");
    if (!isPlan(plan)) throw new AdminUsageError("--plan must be solo or business");
    const { store, close } = await openStore();
    const { setWorkspacePlan } = await adminModules();
    try {
      const workspace = await setWorkspacePlan(store, workspaceId, plan);
      if (!workspace) throw new AdminUsageError(`no workspace ${workspaceId}`);
      process.stdout.write(`${JSON.stringify({ workspace }, null, 2)}
`);
    } finally {
      await close();
    }
    return;
  }
  if (args[0] === "admin") throw new AdminUsageError(`unknown command: ${args.join(" ")}`);
  if (args.length === 0) throw new UsageError("no command given");
  if (args[0] === "help" || args[0] === "--help" || args[0] === "-h") {
    process.stdout.write(`${CLIENT_USAGE}\n`);
    return;
  }
  process.exitCode = await runClientCommand(args, { stdout: process.stdout, stderr: process.stderr, stdin: process.stdin, env: process.env });
}

main(process.argv.slice(2)).catch(async (err) => {
  if (err instanceof UsageError) {
    process.stderr.write(`runs: ${err.message}\n\n${err instanceof AdminUsageError ? ADMIN_USAGE : CLIENT_USAGE}\n`);
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
