import anyTest, { type TestFn } from "ava";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { writeChatStream } from "../helpers/chat-stream.js";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";

const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; provider: Server; baseUrl: string; seen: string[] }>;

/** A local OpenAI-compatible endpoint that streams one short answer and records the key it was sent. */
function fakeProvider(seen: string[]): Server {
  return createServer((req, res) => {
    seen.push(req.headers.authorization ?? "");
    req.resume();
    req.on("end", () => writeChatStream(res, ["Hello from ", "the provider"]));
  });
}

test.before(async (t) => {
  // The operator's own provider credentials: the service removes them from its environment at start.
  process.env.ANTHROPIC_API_KEY = "sk-ant-operator-before-start";
  process.env.AWS_SECRET_ACCESS_KEY = "operator-aws-secret";
  const servers = await startTestServers();
  // The provider servers of these tests listen on loopback, which operators must allow explicitly.
  const service = await startTestService(servers, { RUNS_ALLOW_PRIVATE_MODEL_ENDPOINTS: "1" });
  const seen: string[] = [];
  const provider = fakeProvider(seen);
  await new Promise<void>((resolve) => provider.listen(0, "127.0.0.1", resolve));
  const baseUrl = `http://127.0.0.1:${(provider.address() as AddressInfo).port}/v1`;
  t.context = { servers, service, provider, baseUrl, seen };
});

test.after.always(async (t) => {
  t.context.provider?.close();
  await t.context.service?.close();
  await t.context.servers?.stop();
});

async function providerAgent(api: Api, baseUrl: string, keyEnv?: string): Promise<string> {
  return api.agentWith({ model: { provider: "openai-compatible", base_url: baseUrl, model: "m", ...(keyEnv ? { api_key_env: keyEnv } : {}) }, tools: [] });
}

test.serial("credentials - a workspace's environment value reaches its provider; another workspace's turn does not get it", async (t) => {
  const { service, baseUrl, seen } = t.context;
  const owner = await newWorkspace(service);
  const stranger = await newWorkspace(service);
  const put = await owner.api.request("PUT", "/api/v1/environment-values/MY_ENDPOINT_KEY", { body: { value: "sk-owner-123" } });
  t.is(put.status, 200);

  const run = await owner.api.post("/api/v1/runs", { agent: await providerAgent(owner.api, baseUrl, "MY_ENDPOINT_KEY"), input: "hi" });
  t.is(run.status, 200);
  t.is(run.body.turn.status, "completed", JSON.stringify(run.body.turn.error));
  t.deepEqual(run.body.turn.output, [{ type: "output_text", text: "Hello from the provider" }]);
  t.is(seen.at(-1), "Bearer sk-owner-123");

  const other = await stranger.api.post("/api/v1/runs", { agent: await providerAgent(stranger.api, baseUrl), input: "hi" });
  t.is(other.body.turn.status, "completed");
  t.is(seen.at(-1), "Bearer none", "without its own value the workspace sends only the placeholder");
});

test.serial("credentials - a custom endpoint never gets the workspace's provider keys or the service's own without api_key_env", async (t) => {
  const { service, baseUrl, seen } = t.context;
  const ws = await newWorkspace(service);
  for (const name of ["OPENAI_API_KEY", "OPENAI_COMPATIBLE_API_KEY"]) {
    t.is((await ws.api.request("PUT", `/api/v1/environment-values/${name}`, { body: { value: `sk-${name.toLowerCase()}-secret` } })).status, 200);
  }
  // Set in the service's process after its start, as an operator's variables would be.
  process.env.OPENAI_API_KEY = "sk-operator-openai-secret";
  try {
    const run = await ws.api.post("/api/v1/runs", { agent: await providerAgent(ws.api, baseUrl), input: "hi" });
    t.is(run.body.turn.status, "completed", JSON.stringify(run.body.turn.error));
    t.is(seen.at(-1), "Bearer none", "only the placeholder is sent");
  } finally {
    delete process.env.OPENAI_API_KEY;
  }
  t.is(process.env.ANTHROPIC_API_KEY, undefined, "the operator's provider variables were removed at start");
  t.is(process.env.AWS_SECRET_ACCESS_KEY, undefined);
});

test.serial("credentials - api_key_env naming a value the workspace lacks fails the turn before anything is sent", async (t) => {
  const { service, baseUrl, seen } = t.context;
  const ws = await newWorkspace(service);
  const before = seen.length;
  const run = await ws.api.post("/api/v1/runs", { agent: await providerAgent(ws.api, baseUrl, "NOT_SET_HERE"), input: "hi" });
  t.is(run.body.turn.status, "failed");
  t.is(run.body.turn.error.code, "agent_configuration_invalid");
  t.regex(run.body.turn.error.message, /NOT_SET_HERE/);
  t.is(seen.length, before, "the endpoint was not called");
  const bad = await ws.api.post("/api/v1/agents", { name: "x" });
  const deploy = await ws.api.post(`/api/v1/agents/${bad.body.id}/deployments`, { config: { model: { provider: "openai-compatible", base_url: baseUrl, model: "m", api_key_env: "lower-case" } } }, "bad-key-env");
  t.is(deploy.status, 400);
  t.is(deploy.body.error.param, "config.model.api_key_env");
});

test.serial("credentials - a custom endpoint's error body is summarised, never echoed into the turn", async (t) => {
  const { service } = t.context;
  const hostile = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      res.writeHead(401, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { message: "stolen: AKIAEXAMPLESECRET0001 and your prompt, echoed back to the tenant" } }));
    });
  });
  await new Promise<void>((resolve) => hostile.listen(0, "127.0.0.1", resolve));
  try {
    const ws = await newWorkspace(service);
    const url = `http://127.0.0.1:${(hostile.address() as AddressInfo).port}/v1`;
    const run = await ws.api.post("/api/v1/runs", { agent: await providerAgent(ws.api, url), input: "hi" });
    t.is(run.body.turn.status, "failed");
    t.is(run.body.turn.error.code, "provider_authentication_failed");
    t.is(run.body.turn.error.message, "The model endpoint answered HTTP 401.");
    t.notRegex(JSON.stringify(run.body), /AKIAEXAMPLE|stolen|echoed/);
  } finally {
    hostile.close();
  }
});

test.serial("credentials - providers that use the service's ambient credentials are not offered unless the operator enables them", async (t) => {
  const { service } = t.context;
  const ws = await newWorkspace(service);
  const models = await ws.api.get("/api/v1/models");
  const providers = new Set(models.body.data.map((m: { provider: string }) => m.provider));
  for (const ambient of ["amazon-bedrock", "google-vertex", "azure-openai-responses"]) t.false(providers.has(ambient), ambient);
  t.true(providers.has("openai"));
  const agent = await ws.api.post("/api/v1/agents", { name: "bedrock" });
  const deploy = await ws.api.post(`/api/v1/agents/${agent.body.id}/deployments`, { config: { model: "amazon-bedrock/anthropic.claude-3-haiku-20240307-v1:0" } }, "bedrock-1");
  t.is(deploy.status, 400);
  t.is(deploy.body.error.param, "config.model");
  t.regex(deploy.body.error.message, /RUNS_AMBIENT_PROVIDERS/);
});
