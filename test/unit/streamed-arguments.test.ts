import test from "ava";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { complete } from "@mariozechner/pi-ai";
import { resolveModel } from "../../actors/model-resolution.js";

/**
 * pi-ai parsed a streamed tool call's whole argument text again at every delta: quadratic.
 * A tenant's own endpoint streaming 100,000 one-character deltas froze a node for minutes
 * (found by a probe). scripts/patch-pi-ai.mjs (run after every npm install) makes the
 * streaming parse geometric; the parse at the call's end is whole.
 */
test("streamed tool arguments - the installed pi-ai providers carry the geometric parse", (t) => {
  for (const file of ["openai-completions.js", "anthropic.js", "openai-responses-shared.js"]) {
    const text = readFileSync(new URL(`../../node_modules/@mariozechner/pi-ai/dist/providers/${file}`, import.meta.url), "utf8");
    t.true(text.includes("/* runs: geometric streaming parse */"), `${file}: run node scripts/patch-pi-ai.mjs (npm install does)`);
  }
});

test("streamed tool arguments - an endpoint streaming a call's arguments a character at a time (40,000 deltas) is read in linear time, and the call gets its whole arguments", async (t) => {
  t.timeout(60_000);
  const content = "x".repeat(40_000);
  const args = JSON.stringify({ path: "a.txt", content });
  const chunk = (body: Record<string, unknown>) => `data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", created: 0, model: "m", ...body })}\n\n`;
  const server = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      let out = chunk({ choices: [{ index: 0, delta: { role: "assistant", tool_calls: [{ index: 0, id: "call_1", type: "function", function: { name: "write", arguments: "" } }] }, finish_reason: null }] });
      for (const character of args) out += chunk({ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: character } }] }, finish_reason: null }] });
      out += chunk({ choices: [{ index: 0, delta: {}, finish_reason: "tool_calls" }] });
      res.end(`${out}data: [DONE]\n\n`);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    const resolved = resolveModel({ provider: "openai-compatible", base_url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, model: "m" });
    if (!("model" in resolved)) return t.fail(resolved.error);
    const started = process.hrtime.bigint();
    const message = await complete(resolved.model, { messages: [{ role: "user", content: "write it", timestamp: 0 }] }, { apiKey: "none" });
    const ms = Number(process.hrtime.bigint() - started) / 1e6;
    // Quadratic, this took ~50 s (the probe's measurement); linear, well under a second of parsing.
    t.true(ms < 10_000, `${ms} ms`);
    const call = message.content.find((part) => part.type === "toolCall");
    t.deepEqual(call && "arguments" in call ? call.arguments : undefined, { path: "a.txt", content });
  } finally {
    server.close();
  }
});
