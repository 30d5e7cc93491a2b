/** `runs agents …` and `runs deploy`: agents, and a deployment of a configuration awaited until it is ready. */
import { readFile } from "node:fs/promises";
import { exactly, oneOf, parseArgs, str, UsageError } from "./cli-args.js";
import type { Output } from "./cli-output.js";
import type { RunsClient } from "./client.js";

export async function agents(client: () => RunsClient, args: string[], out: Output): Promise<number> {
  const [sub = "list", ...rest] = args[0]?.startsWith("--") ? ["list", ...args] : args;
  if (sub === "list") {
    const p = parseArgs(rest, {});
    exactly(p, 0, "");
    const c = client();
    const all = [];
    for await (const agent of c.paginate((after) => c.listAgents({ limit: 100, after }))) all.push(agent);
    if (out.json(p)) out.document({ object: "list", data: all, has_more: false, next_cursor: null });
    else for (const a of all) out.line(`${a.id}  ${a.name}  ${a.active_version === null ? "no active version" : `v${a.active_version}`}`);
    return 0;
  }
  if (sub === "create") {
    const p = parseArgs(rest, { description: "string" });
    const [name] = exactly(p, 1, "NAME");
    const agent = await client().createAgent({ name, description: str(p, "description") });
    out.json(p) ? out.document(agent) : out.line(`${agent.id}  ${agent.name}`);
    return 0;
  }
  if (sub === "get") {
    const p = parseArgs(rest, {});
    const [agentId] = exactly(p, 1, "AGENT_ID");
    const agent = await client().getAgent(agentId);
    out.json(p) ? out.document(agent) : out.line(`${agent.id}  ${agent.name}  ${agent.active_version === null ? "no active version" : `v${agent.active_version}`}`);
    return 0;
  }
  throw new UsageError(`unknown command: agents ${sub}`);
}

export async function deploy(client: RunsClient, args: string[], out: Output): Promise<number> {
  const p = parseArgs(args, { model: "string", config: "string", "config-file": "string", "no-activate": "boolean", "upgrade-policy": "string", "no-wait": "boolean", "idempotency-key": "string" });
  const [agentId] = exactly(p, 1, "AGENT_ID");
  const sources = ["model", "config", "config-file"].filter((f) => p.flags[f] !== undefined);
  if (sources.length !== 1) throw new UsageError("deploy needs exactly one of --model, --config, --config-file");
  let config: unknown;
  try {
    if (str(p, "model")) config = { model: str(p, "model") };
    else config = JSON.parse(str(p, "config") ?? (await readFile(str(p, "config-file")!, "utf8")));
  } catch (err) {
    throw new UsageError(`the config is not valid JSON: ${err instanceof Error ? err.message : String(err)}`);
  }
  let deployment = await client.createDeployment(
    agentId,
    {
      config: config as never,
      activate: p.flags["no-activate"] ? false : undefined,
      upgrade_policy: oneOf(str(p, "upgrade-policy"), ["automatic", "new_run_only"] as const, "upgrade-policy"),
    },
    { idempotencyKey: str(p, "idempotency-key") },
  );
  if (!p.flags["no-wait"]) {
    const progress = out.progress(`building v${deployment.version}`);
    try {
      deployment = await client.waitForDeployment(agentId, deployment.version);
    } finally {
      progress.stop();
    }
  }
  if (out.json(p)) out.document(deployment);
  else out.line(`${deployment.agent_id} v${deployment.version} ${deployment.status}${deployment.error ? `  ${JSON.stringify(deployment.error)}` : ""}`);
  return deployment.status === "failed" ? 1 : 0;
}
