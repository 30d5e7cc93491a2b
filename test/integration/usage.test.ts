import anyTest, { type TestFn } from "ava";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";

/** Usage on turns and runs (issue 16, part 2): from the scripted model and from an OpenAI-compatible endpoint. */
const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; provider: Server; baseUrl: string }>;

/** An OpenAI-compatible endpoint that answers and reports usage in its last chunk, as OpenAI does with include_usage. */
function fakeProvider(): Server {
  return createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      const chunk = (body: Record<string, unknown>) => `data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", created: 0, model: "m", ...body })}\n\n`;
      res.write(chunk({ choices: [{ index: 0, delta: { role: "assistant", content: "counted" }, finish_reason: null }] }));
      res.write(chunk({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }] }));
      res.write(chunk({ choices: [], usage: { prompt_tokens: 42, completion_tokens: 7, prompt_tokens_details: { cached_tokens: 2 } } }));
      res.end("data: [DONE]\n\n");
    });
  });
}

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers, { RUNS_ALLOW_PRIVATE_MODEL_ENDPOINTS: "1" });
  const provider = fakeProvider();
  await new Promise<void>((resolve) => provider.listen(0, "127.0.0.1", resolve));
  t.context = { servers, service, provider, baseUrl: `http://127.0.0.1:${(provider.address() as AddressInfo).port}/v1` };
});

test.after.always(async (t) => {
  t.context.provider?.close();
  await t.context.service?.close();
  await t.context.servers?.stop();
});

const ZERO = { input_tokens: 0, output_tokens: 0, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: null };

test("usage - a turn sums its model calls; the run sums its turns, in GET run, the list, the turn history and the final event", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const agent = await ws.api.agentWith({
    model: "faux/scripted",
    tools: ["bash"],
    script: [
      { tool_call: { name: "bash", arguments: { command: "true" } }, usage: { input: 100, output: 20, cache_read: 50 } },
      { text: "done", usage: { input: 130, output: 10, cache_write: 5 } },
    ],
  });
  const first = await ws.api.post("/api/v1/runs", { agent, input: "go" });
  t.is(first.status, 200, JSON.stringify(first.body));
  const turnUsage = { input_tokens: 230, output_tokens: 30, cache_read_tokens: 50, cache_write_tokens: 5, cost_usd: null };
  t.deepEqual(first.body.turn.usage, turnUsage);
  t.deepEqual(first.body.usage, turnUsage);

  // A second turn (the script starts again for each turn): the run has both.
  const second = await ws.api.post("/api/v1/runs", { run_id: first.body.id, input: "again" });
  t.deepEqual(second.body.turn.usage, turnUsage);
  const both = { input_tokens: 460, output_tokens: 60, cache_read_tokens: 100, cache_write_tokens: 10, cost_usd: null };
  t.deepEqual(second.body.usage, both);
  t.deepEqual((await ws.api.get(`/api/v1/runs/${first.body.id}`)).body.usage, both);
  t.deepEqual((await ws.api.get(`/api/v1/runs/${first.body.id}?turn_id=${first.body.turn.id}`)).body.turn.usage, turnUsage);
  t.deepEqual((await ws.api.get("/api/v1/runs")).body.data.find((r: { id: string }) => r.id === first.body.id).usage, both);
  const turns = (await ws.api.get(`/api/v1/runs/${first.body.id}/turns`)).body.data;
  t.deepEqual(turns.map((turn: { usage: unknown }) => turn.usage), [turnUsage, turnUsage]);
  const events = (await ws.api.get(`/api/v1/runs/${first.body.id}/events?turn_id=${second.body.turn.id}`)).body.data;
  t.deepEqual(events.at(-1).data.run.usage, both, "the final event's run carries the sum including its turn");
  // Per-call usage stays on message_end events.
  const ends = events.filter((e: { type: string; data: { message: { role: string } } }) => e.type === "message_end" && e.data.message.role === "assistant");
  t.deepEqual(ends.map((e: { data: { message: { usage: { input: number } } } }) => e.data.message.usage.input), [100, 130]);
});

test("usage - a run with no finished turn has zero usage; a turn in progress has none yet", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const agent = await ws.api.agentWith({ model: "faux/scripted", tools: ["bash"], script: [{ tool_call: { name: "bash", arguments: { command: "sleep 30" } } }, { text: "late" }] });
  const started = await ws.api.post("/api/v1/runs", { agent, input: "x", background: true });
  t.is(started.status, 202);
  t.is(started.body.turn.usage, null);
  t.deepEqual(started.body.usage, ZERO);
  const cancelled = await ws.api.post(`/api/v1/runs/${started.body.id}/cancel`, {});
  t.true(cancelled.status === 202 || cancelled.status === 200);
  const settled = await ws.api.waitTurn(started.body.id, started.body.turn.id);
  t.is(settled.turn.status, "cancelled");
  t.deepEqual(settled.turn.usage, ZERO, "the cancelled turn's one call reported nothing");
});

test("usage - an OpenAI-compatible endpoint's reported usage is the turn's; no prices, so no cost", async (t) => {
  const ws = await newWorkspace(t.context.service);
  const agent = await ws.api.agentWith({ model: { provider: "openai-compatible", base_url: t.context.baseUrl, model: "m" }, tools: [] });
  const run = await ws.api.post("/api/v1/runs", { agent, input: "count me" });
  t.is(run.body.turn.status, "completed", JSON.stringify(run.body.turn.error));
  t.deepEqual(run.body.turn.output, [{ type: "output_text", text: "counted" }]);
  t.deepEqual(run.body.turn.usage, { input_tokens: 40, output_tokens: 7, cache_read_tokens: 2, cache_write_tokens: 0, cost_usd: null });
  t.deepEqual(run.body.usage, run.body.turn.usage);
});
