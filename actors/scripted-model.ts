/**
 * The built-in `faux/scripted` model (decisions §3): a pi-agent-core stream function
 * that answers the Nth model call of a turn with step N of the deployment's script,
 * and echoes the latest user message past the last step or without a script.
 *
 * It speaks pi-ai's assistant message event protocol exactly like a real provider
 * (text and tool-call deltas, a final `done` or `error`), so turns using it run
 * through the real agent loop: tools execute, steering and abort behave as with a
 * real model.
 */
import { randomUUID } from "node:crypto";
import type { StreamFn } from "@mariozechner/pi-agent-core";
import {
  createAssistantMessageEventStream,
  type AssistantMessage,
  type AssistantMessageEventStream,
  type Context,
  type Model,
  type ToolCall,
  type Usage,
} from "@mariozechner/pi-ai";
import { SCRIPTED_LISTING, type ScriptStep, type ScriptUsage } from "../src/index.js";

export const SCRIPTED_API = "faux-scripted";
export const SCRIPTED_PROVIDER = SCRIPTED_LISTING.provider;
export const SCRIPTED_MODEL_ID = "scripted";

/** The pi-ai model description of `faux/scripted`. Only usable with {@link createScriptedStreamFn}. */
export const scriptedModel: Model<typeof SCRIPTED_API> = {
  id: SCRIPTED_MODEL_ID,
  name: SCRIPTED_LISTING.name,
  api: SCRIPTED_API,
  provider: SCRIPTED_PROVIDER,
  baseUrl: "http://localhost:0",
  reasoning: false,
  input: [...SCRIPTED_LISTING.input],
  cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 },
  contextWindow: 128_000,
  maxTokens: 16_384,
};

export interface ScriptedModelOptions {
  script?: readonly ScriptStep[];
  /** Paces streaming; without it chunks follow each other as fast as the event loop allows. */
  tokensPerSecond?: number;
  /** Echoed when the context holds no user message with text. */
  inputText?: string;
  /** The step of the first call answered (a turn resumed after a decision made calls before). */
  firstStep?: number;
}

const EMPTY_USAGE: Usage = {
  input: 0,
  output: 0,
  cacheRead: 0,
  cacheWrite: 0,
  totalTokens: 0,
  cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 },
};

/** A step's `usage` as pi-ai reports a call's usage (no prices: faux/scripted costs nothing). */
function scriptedUsage(usage: ScriptUsage): Usage {
  const input = usage.input ?? 0;
  const output = usage.output ?? 0;
  const cacheRead = usage.cache_read ?? 0;
  const cacheWrite = usage.cache_write ?? 0;
  return { input, output, cacheRead, cacheWrite, totalTokens: input + output + cacheRead + cacheWrite, cost: { ...EMPTY_USAGE.cost } };
}

// Chunks of 3–5 "tokens" of 4 characters, like pi-ai's faux provider.
const MIN_CHUNK_TOKENS = 3;
const MAX_CHUNK_TOKENS = 5;
const CHARS_PER_TOKEN = 4;

/**
 * The HTTP status an `{error: {status}}` step carried, keyed by the final assistant
 * message the stream ended with (the same object the agent loop stores and emits
 * in `message_end`). Read it with {@link scriptedErrorStatus}.
 */
const errorStatuses = new WeakMap<AssistantMessage, number>();

/** The status of a scripted provider failure, if `message` is one that carried a status. */
export function scriptedErrorStatus(message: AssistantMessage): number | undefined {
  return errorStatuses.get(message);
}

/**
 * Creates the stream function for ONE turn: it counts the model calls it answers,
 * so a new instance must be created for every turn. Honours the abort signal
 * between chunks (final message with stopReason "aborted" and the partial content).
 */
export function createScriptedStreamFn(options: ScriptedModelOptions = {}): StreamFn {
  const script = options.script ?? [];
  let calls = options.firstStep ?? 0;
  return (model, context, streamOptions) => {
    const step = script[calls];
    calls += 1;
    const stream = createAssistantMessageEventStream();
    const signal = streamOptions?.signal;
    const base: AssistantMessage = {
      role: "assistant",
      content: [],
      api: model.api,
      provider: model.provider,
      model: model.id,
      usage: step?.usage ? scriptedUsage(step.usage) : EMPTY_USAGE,
      stopReason: "stop",
      timestamp: Date.now(),
    };
    void play(stream, base, step ?? { text: latestUserText(context) ?? options.inputText ?? "" }, {
      tokensPerSecond: options.tokensPerSecond,
      signal,
    });
    return stream;
  };
}

interface PlayOptions {
  tokensPerSecond?: number;
  signal?: AbortSignal;
}

async function play(
  stream: AssistantMessageEventStream,
  base: AssistantMessage,
  step: ScriptStep,
  options: PlayOptions,
): Promise<void> {
  const partial: AssistantMessage = { ...base, content: [] };
  const abortIfRequested = (): boolean => {
    if (!options.signal?.aborted) return false;
    const aborted: AssistantMessage = {
      ...partial,
      content: structuredClone(partial.content),
      stopReason: "aborted",
      errorMessage: "Request was aborted",
      timestamp: Date.now(),
    };
    stream.push({ type: "error", reason: "aborted", error: aborted });
    stream.end(aborted);
    return true;
  };
  try {
    await yieldToEventLoop();
    if (abortIfRequested()) return;

    if ("error" in step) {
      const failed: AssistantMessage = { ...base, stopReason: "error", errorMessage: step.error.message };
      if (step.error.status !== undefined) errorStatuses.set(failed, step.error.status);
      stream.push({ type: "error", reason: "error", error: failed });
      stream.end(failed);
      return;
    }

    stream.push({ type: "start", partial: snapshot(partial) });

    if ("text" in step) {
      const block = { type: "text" as const, text: "" };
      partial.content.push(block);
      const contentIndex = partial.content.length - 1;
      stream.push({ type: "text_start", contentIndex, partial: snapshot(partial) });
      for (const chunk of chunks(step.text)) {
        await pace(chunk, options);
        if (abortIfRequested()) return;
        block.text += chunk;
        stream.push({ type: "text_delta", contentIndex, delta: chunk, partial: snapshot(partial) });
      }
      stream.push({ type: "text_end", contentIndex, content: block.text, partial: snapshot(partial) });
      finish(stream, partial, "stop");
      return;
    }

    const toolCall: ToolCall = {
      type: "toolCall",
      id: `call_${randomUUID().replaceAll("-", "")}`,
      name: step.tool_call.name,
      arguments: {},
    };
    partial.content.push(toolCall);
    const contentIndex = partial.content.length - 1;
    stream.push({ type: "toolcall_start", contentIndex, partial: snapshot(partial) });
    for (const chunk of chunks(JSON.stringify(step.tool_call.arguments ?? {}))) {
      await pace(chunk, options);
      if (abortIfRequested()) return;
      stream.push({ type: "toolcall_delta", contentIndex, delta: chunk, partial: snapshot(partial) });
    }
    toolCall.arguments = structuredClone(step.tool_call.arguments ?? {});
    stream.push({ type: "toolcall_end", contentIndex, toolCall: { ...toolCall }, partial: snapshot(partial) });
    finish(stream, partial, "toolUse");
  } catch (error) {
    // The StreamFn contract: failures are encoded in the stream, never thrown.
    const failed: AssistantMessage = {
      ...base,
      stopReason: "error",
      errorMessage: error instanceof Error ? error.message : String(error),
    };
    stream.push({ type: "error", reason: "error", error: failed });
    stream.end(failed);
  }
}

function finish(stream: AssistantMessageEventStream, partial: AssistantMessage, reason: "stop" | "toolUse"): void {
  const message: AssistantMessage = {
    ...partial,
    content: structuredClone(partial.content),
    stopReason: reason,
    timestamp: Date.now(),
  };
  stream.push({ type: "done", reason, message });
  stream.end(message);
}

function snapshot(partial: AssistantMessage): AssistantMessage {
  return { ...partial, content: partial.content.map((block) => ({ ...block })) };
}

function chunks(text: string): string[] {
  const result: string[] = [];
  let index = 0;
  while (index < text.length) {
    const tokens = MIN_CHUNK_TOKENS + Math.floor(Math.random() * (MAX_CHUNK_TOKENS - MIN_CHUNK_TOKENS + 1));
    const size = tokens * CHARS_PER_TOKEN;
    result.push(text.slice(index, index + size));
    index += size;
  }
  return result.length > 0 ? result : [""];
}

/** Waits as long as streaming `chunk` takes at the configured pace; wakes early on abort. */
function pace(chunk: string, options: PlayOptions): Promise<void> {
  const tokensPerSecond = options.tokensPerSecond;
  if (!tokensPerSecond || tokensPerSecond <= 0) return yieldToEventLoop();
  const delayMs = (Math.ceil(chunk.length / CHARS_PER_TOKEN) / tokensPerSecond) * 1000;
  return new Promise((resolve) => {
    const signal = options.signal;
    const onAbort = () => {
      clearTimeout(timer);
      resolve();
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, delayMs);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A macrotask turn (not a microtask), so timers and I/O such as an abort get to run. */
function yieldToEventLoop(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/** The text of the latest user message in the context, or undefined when it has none. */
function latestUserText(context: Context): string | undefined {
  for (let i = context.messages.length - 1; i >= 0; i--) {
    const message = context.messages[i];
    if (message.role !== "user") continue;
    const text =
      typeof message.content === "string"
        ? message.content
        : message.content
            .filter((part) => part.type === "text")
            .map((part) => part.text)
            .join("\n");
    return text.length > 0 ? text : undefined;
  }
  return undefined;
}
