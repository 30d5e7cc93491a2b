import test from "ava";
import type { StreamFn } from "@mariozechner/pi-agent-core";
import type { AssistantMessage, AssistantMessageEvent, Context } from "@mariozechner/pi-ai";
import { createScriptedStreamFn, scriptedErrorStatus, scriptedModel } from "../../actors/scripted-model.js";

function context(text: string): Context {
  return { messages: [{ role: "user", content: [{ type: "text", text }], timestamp: 0 }] };
}

async function call(
  fn: StreamFn,
  ctx: Context,
  signal?: AbortSignal,
): Promise<{ events: AssistantMessageEvent[]; message: AssistantMessage }> {
  const stream = await fn(scriptedModel, ctx, { signal });
  const events: AssistantMessageEvent[] = [];
  for await (const event of stream) events.push(event);
  return { events, message: await stream.result() };
}

function deltas(events: AssistantMessageEvent[]): string {
  return events.map((e) => (e.type === "text_delta" ? e.delta : "")).join("");
}

test("scripted-model - the Nth call of one instance answers with step N, then echoes", async (t) => {
  const fn = createScriptedStreamFn({
    script: [{ tool_call: { name: "bash", arguments: { command: "ls" } } }, { text: "second" }],
  });
  const first = await call(fn, context("hello"));
  t.is(first.message.stopReason, "toolUse");
  const toolCall = first.message.content[0];
  t.is(toolCall.type, "toolCall");
  if (toolCall.type === "toolCall") {
    t.is(toolCall.name, "bash");
    t.deepEqual(toolCall.arguments, { command: "ls" });
    t.regex(toolCall.id, /^call_/);
  }
  t.true(first.events.some((e) => e.type === "toolcall_delta"));
  t.is(first.events.at(-1)?.type, "done");

  const second = await call(fn, context("hello"));
  t.deepEqual(second.message.content, [{ type: "text", text: "second" }]);
  t.is(second.message.stopReason, "stop");

  const third = await call(fn, context("echo me"));
  t.deepEqual(third.message.content, [{ type: "text", text: "echo me" }]);
});

test("scripted-model - a new instance starts again at step 1", async (t) => {
  const script = [{ text: "one" }];
  await call(createScriptedStreamFn({ script }), context("x"));
  const again = await call(createScriptedStreamFn({ script }), context("x"));
  t.deepEqual(again.message.content, [{ type: "text", text: "one" }]);
});

test("scripted-model - text streams in several deltas that add up to the step", async (t) => {
  const text = "The quick brown fox jumps over the lazy dog. ".repeat(5);
  const { events, message } = await call(createScriptedStreamFn({ script: [{ text }] }), context("x"));
  const textDeltas = events.filter((e) => e.type === "text_delta");
  t.true(textDeltas.length > 1);
  t.is(deltas(events), text);
  t.deepEqual(
    events.map((e) => e.type).filter((type) => !type.endsWith("_delta")),
    ["start", "text_start", "text_end", "done"],
  );
  t.is(message.api, scriptedModel.api);
});

test("scripted-model - without a script it echoes the latest user message", async (t) => {
  const ctx: Context = {
    messages: [
      { role: "user", content: "first", timestamp: 0 },
      { role: "user", content: [{ type: "text", text: "latest" }], timestamp: 1 },
    ],
  };
  const { message } = await call(createScriptedStreamFn(), ctx);
  t.deepEqual(message.content, [{ type: "text", text: "latest" }]);
});

test("scripted-model - an error step ends with stopReason error and carries its status", async (t) => {
  const fn = createScriptedStreamFn({ script: [{ error: { message: "slow down", status: 429 } }] });
  const { events, message } = await call(fn, context("x"));
  t.is(message.stopReason, "error");
  t.is(message.errorMessage, "slow down");
  t.is(scriptedErrorStatus(message), 429);
  t.is(events.at(-1)?.type, "error");
});

test("scripted-model - an error step without status has none", async (t) => {
  const { message } = await call(createScriptedStreamFn({ script: [{ error: { message: "x" } }] }), context("x"));
  t.is(scriptedErrorStatus(message), undefined);
});

test("scripted-model - abort mid-stream ends with stopReason aborted and the partial text", async (t) => {
  const controller = new AbortController();
  const text = "word ".repeat(200);
  // 40 tokens/s: about 100 ms per chunk; the whole text would take seconds.
  const fn = createScriptedStreamFn({ script: [{ text }], tokensPerSecond: 40 });
  const stream = await fn(scriptedModel, context("x"), { signal: controller.signal });
  const started = Date.now();
  const seen: AssistantMessageEvent[] = [];
  for await (const event of stream) {
    seen.push(event);
    if (event.type === "text_delta" && !controller.signal.aborted) controller.abort();
  }
  const message = await stream.result();
  t.is(message.stopReason, "aborted");
  t.true(Date.now() - started < 1000);
  const partial = message.content[0];
  t.true(partial?.type === "text" && partial.text.length > 0 && partial.text.length < text.length);
});

test("scripted-model - abort without pacing still lands between chunks", async (t) => {
  const controller = new AbortController();
  const fn = createScriptedStreamFn({ script: [{ text: "x".repeat(200_000) }] });
  const stream = await fn(scriptedModel, context("x"), { signal: controller.signal });
  setTimeout(() => controller.abort(), 5);
  for await (const _ of stream) {
    // drain
  }
  const message = await stream.result();
  t.is(message.stopReason, "aborted");
});

test("scripted-model - tokens_per_second paces streaming", async (t) => {
  const text = "abcd".repeat(40); // 40 tokens
  const started = Date.now();
  await call(createScriptedStreamFn({ script: [{ text }], tokensPerSecond: 200 }), context("x"));
  const elapsed = Date.now() - started;
  t.true(elapsed >= 150, `took ${elapsed} ms`); // 40 tokens at 200/s = 200 ms
});

test("scripted-model - the model accepts text and images", (t) => {
  t.deepEqual(scriptedModel.input, ["text", "image"]);
});
