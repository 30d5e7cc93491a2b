import anyTest, { type TestFn } from "ava";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../src/service.js";

const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; provider: Server; baseUrl: string; seen: string[] }>;

/** A local OpenAI-compatible endpoint that streams one short answer and records the key it was sent. */
function fakeProvider(seen: string[]): Server {
  return createServer((req, res) => {
    seen.push(req.headers.authorization ?? "");
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      const chunk = (delta: Record<string, unknown>, finish: string | null) =>
        `data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", created: 0, model: "m", choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
      res.write(chunk({ role: "assistant", content: "Hello from " }, null));
      res.write(chunk({ content: "the provider" }, null));
      res.write(chunk({}, "stop"));
      res.end("data: [DONE]\n\n");
    });
  });
}

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers);
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

async function providerAgent(api: Api, baseUrl: string): Promise<string> {
  return api.agentWith({ model: { provider: "openai-compatible", base_url: baseUrl, model: "m" }, tools: [] });
}

test("credentials - a workspace's environment value reaches its provider; another workspace's turn does not get it", async (t) => {
  const { service, baseUrl, seen } = t.context;
  const owner = await newWorkspace(service);
  const stranger = await newWorkspace(service);
  const put = await owner.api.request("PUT", "/api/v1/environment-values/OPENAI_COMPATIBLE_API_KEY", { body: { value: "sk-owner-123" } });
  t.is(put.status, 200);

  const run = await owner.api.post("/api/v1/runs", { agent: await providerAgent(owner.api, baseUrl), input: "hi" });
  t.is(run.status, 200);
  t.is(run.body.turn.status, "completed", JSON.stringify(run.body.turn.error));
  t.deepEqual(run.body.turn.output, [{ type: "output_text", text: "Hello from the provider" }]);
  t.is(seen.at(-1), "Bearer sk-owner-123");

  const other = await stranger.api.post("/api/v1/runs", { agent: await providerAgent(stranger.api, baseUrl), input: "hi" });
  t.is(other.body.turn.status, "completed");
  t.is(seen.at(-1), "Bearer none", "without its own value the workspace sends only the placeholder");
});
