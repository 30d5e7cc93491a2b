/**
 * Runs ONE turn of a run with pi-agent-core's `Agent`: builds the model, tools and
 * user message from the deployment config and the turn input, reports every agent
 * event as a {@link RuntimeEvent}, delivers steering, and maps the end of the agent
 * loop to a turn outcome.
 *
 * Decisions (the failure codes themselves are the catalogue in src/turn-errors.ts):
 * - Events (decisions §5): every AgentEvent becomes one RuntimeEvent with the same
 *   `type`, except `message_update`, which takes its inner assistant event's type
 *   (text_delta, toolcall_delta, …). `data` is the rest of the event's fields, never
 *   the `partial` message of update events. `agent_end` carries `{messageCount}`
 *   instead of the messages: each of them was already reported by its message_end.
 *   Data may share objects with the agent's state: serialise it inside `onEvent`.
 * - Tools: `config.tools` absent means all built-in tools; `[]` means none. A message's
 *   tool calls run one after another (they share one workspace).
 * - A missing API key fails the turn before the model is called with
 *   `agent_configuration_invalid`: no credentials reached the provider, so nothing was
 *   rejected; the fix is an environment value. `openai-compatible` endpoints may need
 *   no key (local servers); they get a placeholder key when none is configured, and a
 *   server that wants one answers 401 → provider_authentication_failed.
 * - A failed assistant message is translated to a turn error code in one function,
 *   {@link providerFailure}; an exception thrown by the loop is agent_execution_failed.
 *   Tool failures are error tool results for the model, never turn failures.
 * - Steering: steer messages are delivered at the agent's next step boundary. A steer
 *   still queued when the loop ends gets one more step (`agent.continue()`), so an
 *   accepted steer is never silently dropped; once the turn has ended (or is being
 *   aborted) `steer` throws {@link SteeringTargetEndedError} instead of accepting.
 *   Steers the agent never saw (the turn failed or was aborted first) are appended to
 *   the transcript, so the run's history keeps what the user said.
 */
import { Agent, type AgentEvent, type AgentMessage, type StreamFn } from "@mariozechner/pi-agent-core";
import { type AgentConfig, type TurnOutcome, assertNever, BUILTIN_TOOLS, checkModelEndpoint, type InputPart, type ModelRef, NetworkPolicyError, newReference, type OutputPart, providerErrorCode, providerOffered, type RuntimeEvent, SCRIPTED_MODEL, type TurnError, turnError, TurnErrorCode } from "../src/index.js";
import {
  getModels,
  getProviders,
  type AssistantMessage,
  type ImageContent,
  type KnownProvider,
  type Model,
  type TextContent,
  type UserMessage,
} from "@mariozechner/pi-ai";
import {
  createScriptedStreamFn,
  scriptedErrorStatus,
  scriptedModel,
  type ScriptedModelOptions,
} from "./scripted-model.js";
import { createWorkspaceTools, DEFAULT_COMMAND_TIMEOUT_MS } from "./workspace-tools.js";
import type { Sandbox, SandboxFailure } from "./sandbox.js";
import { limitsOf } from "./sandbox-limits.js";

export interface TurnRunRequest {
  /** The deployment's agent configuration. */
  config: AgentConfig;
  /** The run's workspace directory; must exist. Tools are confined to it. */
  workspaceDir: string;
  /** The node's sandbox: every tool runs in it. */
  sandbox: Sandbox;
  /** Operator setting: openai-compatible endpoints may be private or loopback addresses. */
  allowPrivateModelEndpoints?: boolean;
  /** Operator setting: providers with ambient credentials tenants may use (actors/credentials.ts). */
  ambientProviders?: ReadonlySet<string>;
  /** Transcript of earlier turns (their transcript segments, concatenated). */
  history: AgentMessage[];
  /** The turn's input; `input_file` parts must carry `file_data` (uploads resolved by the caller). */
  input: InputPart[];
  /** Aborting it is the same as {@link RunningTurn.abort}. */
  signal?: AbortSignal;
  /**
   * Called synchronously, in order, for every agent event. Must not throw: an
   * exception from it is handled like one thrown by the agent loop (the turn fails
   * with agent_execution_failed).
   */
  onEvent: (event: RuntimeEvent) => void;
  /** API key per provider. Without it, pi-ai's environment lookup (e.g. OPENAI_API_KEY) applies. */
  getApiKey?: (provider: string) => string | undefined;
  /** Model resolution, replaceable in tests. Default {@link resolveModel}. */
  resolveModel?: typeof resolveModel;
  /** Support reference generation for turn errors. Default {@link newReference}. */
  newReference?: () => string;
}


export interface TurnRunResult {
  outcome: TurnOutcome;
  /**
   * Text of the turn's final assistant message as output_text parts (one per text
   * block). For failed and aborted turns: the text of the last assistant message that
   * produced any (partial output).
   */
  output: OutputPart[];
  /** Messages this turn added: user input, assistant messages, tool results, steering messages. */
  transcript: AgentMessage[];
  /** Set when the outcome is failed. */
  error?: TurnError;
}

export interface RunningTurn {
  /**
   * Adds user text to the running turn, delivered at the agent's next step boundary.
   * Throws {@link SteeringTargetEndedError} when the turn has ended or is being aborted.
   */
  steer(text: string): void;
  /** Cancels the turn: the running command is killed, the model stream stopped. Idempotent. */
  abort(): void;
  /** Settles once the turn has ended; never rejects. */
  result: Promise<TurnRunResult>;
}

/** The turn can no longer take steering input: it ended or is being aborted. */
export class SteeringTargetEndedError extends Error {
  readonly code = "steering_target_ended";
  constructor() {
    super("The turn has ended or is being cancelled; the input was not added.");
    this.name = "SteeringTargetEndedError";
  }
}

/**
 * Starts the turn and returns its handle. The agent starts on the next microtask, so
 * `onEvent` is never called before startTurn has returned; steers and aborts are
 * accepted at once.
 */
export function startTurn(req: TurnRunRequest): RunningTurn {
  const turn = new TurnExecution(req);
  const result = turn.run().catch((error: unknown) => turn.crashed(error));
  return { steer: (text) => turn.steer(text), abort: () => turn.abort(), result };
}

// ---------------------------------------------------------------------------------
// Models

export type ResolvedModel = { model: Model<any>; streamFn?: StreamFn } | { error: string };

/**
 * Resolves a config model reference: `faux/scripted` (with a fresh scripted stream
 * function built from `scripted`; one per turn), `<provider>/<model-id>` from pi-ai's
 * registry (the model id may itself contain `/`), or an `openai-compatible` endpoint.
 * An unknown model answers `{error}` naming it.
 */
export function resolveModel(ref: ModelRef, scripted: ScriptedModelOptions = {}): ResolvedModel {
  if (typeof ref !== "string") {
    if (ref.provider !== "openai-compatible") return { error: `Unknown model provider "${String(ref.provider)}"` };
    if (!ref.model) return { error: "An openai-compatible model needs a model name" };
    try {
      new URL(ref.base_url);
    } catch {
      return { error: `The base_url "${ref.base_url}" of the openai-compatible model is not a URL` };
    }
    const model: Model<"openai-completions"> = {
      id: ref.model,
      name: ref.model,
      api: "openai-completions",
      provider: OPENAI_COMPATIBLE,
      baseUrl: ref.base_url,
      reasoning: false,
      input: ["text"],
      cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 },
      contextWindow: 128_000,
      maxTokens: 16_384,
    };
    return { model };
  }
  if (ref === SCRIPTED_MODEL) return { model: scriptedModel, streamFn: createScriptedStreamFn(scripted) };
  const slash = ref.indexOf("/");
  if (slash <= 0 || slash === ref.length - 1) {
    return { error: `Unknown model "${ref}": expected "<provider>/<model-id>"` };
  }
  const provider = ref.slice(0, slash);
  const modelId = ref.slice(slash + 1);
  if (!(getProviders() as string[]).includes(provider)) {
    return { error: `Unknown model "${ref}": no registry holds provider "${provider}"` };
  }
  const model = getModels(provider as KnownProvider).find((candidate) => candidate.id === modelId);
  if (!model) return { error: `Unknown model "${ref}": provider "${provider}" has no model "${modelId}"` };
  return { model };
}

const OPENAI_COMPATIBLE = "openai-compatible";
/** Sent to openai-compatible endpoints when no key is configured (local servers ignore it). */
const PLACEHOLDER_API_KEY = "none";

// ---------------------------------------------------------------------------------
// Events

/** One agent event as a runtime event (decisions §5); see the module comment. */
export function toRuntimeEvent(event: AgentEvent): RuntimeEvent {
  switch (event.type) {
    case "agent_start":
    case "turn_start":
      return { type: event.type, data: {} };
    case "agent_end":
      return { type: event.type, data: { messageCount: event.messages.length } };
    case "turn_end":
      return { type: event.type, data: { message: event.message, toolResults: event.toolResults } };
    case "message_start":
      // Providers keep filling the object they announced here; report it as it was.
      return { type: event.type, data: { message: structuredClone(event.message) } };
    case "message_end":
      return { type: event.type, data: { message: event.message } };
    case "message_update": {
      const { type, ...rest } = event.assistantMessageEvent as { type: string; partial?: unknown };
      delete rest.partial;
      return { type, data: rest };
    }
    case "tool_execution_start":
      return { type: event.type, data: { toolCallId: event.toolCallId, toolName: event.toolName, args: event.args } };
    case "tool_execution_update":
      return {
        type: event.type,
        data: {
          toolCallId: event.toolCallId,
          toolName: event.toolName,
          args: event.args,
          partialResult: event.partialResult,
        },
      };
    case "tool_execution_end":
      return {
        type: event.type,
        data: { toolCallId: event.toolCallId, toolName: event.toolName, result: event.result, isError: event.isError },
      };
    default:
      return assertNever(event);
  }
}

// ---------------------------------------------------------------------------------
// Failures

const STATUS_PATTERNS = [
  /^\s*(\d{3})\b/, // OpenAI and Anthropic SDKs: "429 Rate limit reached…"
  /\bstatus(?:\s*code)?\s*[:=]?\s*(\d{3})\b/i, // "got status: 503", "status code 401"
  /"code"\s*:\s*(\d{3})\b/, // JSON error bodies (Google)
  /\bHTTP(?:\/[\d.]+)?\s+(\d{3})\b/i,
];
const TRANSPORT_PATTERN =
  /ECONNRESET|ECONNREFUSED|ETIMEDOUT|ENOTFOUND|EAI_AGAIN|EPIPE|UND_ERR|socket hang up|fetch failed|connection error|network error|other side closed|request timed out/i;

/**
 * The one translation of a failed assistant message (stopReason "error") into a
 * turn error code and message: the scripted model's status, else an HTTP status
 * parsed from the provider's error message, else a transport failure, else
 * provider_failure.
 */
export function providerFailure(message: AssistantMessage): { code: TurnErrorCode; message: string } {
  const text = sanitizeErrorText(message.errorMessage ?? "");
  const scripted = scriptedErrorStatus(message);
  if (scripted !== undefined) return { code: providerErrorCode(scripted), message: text };
  const status = parseStatus(message.errorMessage ?? "");
  // A tenant's own endpoint: its answer is summarised, never echoed (it could carry
  // whatever the endpoint wants stored and shown, or reflect what it was sent).
  if (message.provider === OPENAI_COMPATIBLE) {
    if (status !== undefined) return { code: providerErrorCode(status), message: `The model endpoint answered HTTP ${status}.` };
    if (TRANSPORT_PATTERN.test(message.errorMessage ?? "")) return { code: TurnErrorCode.provider_transport_failed, message: "The model endpoint could not be reached." };
    return { code: TurnErrorCode.provider_failure, message: "The model endpoint's answer could not be used." };
  }
  if (status !== undefined) return { code: providerErrorCode(status), message: withProvider(message, text) };
  if (TRANSPORT_PATTERN.test(message.errorMessage ?? "")) {
    return { code: TurnErrorCode.provider_transport_failed, message: withProvider(message, text) };
  }
  return { code: TurnErrorCode.provider_failure, message: withProvider(message, text) };
}

function withProvider(message: AssistantMessage, text: string): string {
  return text ? `${message.provider}: ${text}` : "";
}

function parseStatus(text: string): number | undefined {
  for (const pattern of STATUS_PATTERNS) {
    const match = pattern.exec(text);
    if (!match) continue;
    const status = Number(match[1]);
    if (status >= 400 && status <= 599) return status;
  }
  return undefined;
}

const MAX_ERROR_MESSAGE_CHARS = 1000;

/** Error text safe to store and show: likely secrets redacted, control characters removed, length capped. */
export function sanitizeErrorText(text: string): string {
  const cleaned = text
    .replace(/\b(?:sk|rk|pk|xai|gsk)[-_][A-Za-z0-9_-]{12,}/g, "[redacted]")
    .replace(/\bAIza[0-9A-Za-z_-]{20,}/g, "[redacted]")
    .replace(/(Bearer\s+)[^\s"']+/gi, "$1[redacted]")
    .replace(/((?:api[-_]?key|token|secret|password)["']?\s*[:=]\s*["']?)[^\s"',}]+/gi, "$1[redacted]")
    .replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, "")
    .trim();
  return cleaned.length > MAX_ERROR_MESSAGE_CHARS ? `${cleaned.slice(0, MAX_ERROR_MESSAGE_CHARS)}…` : cleaned;
}

// ---------------------------------------------------------------------------------
// Input

const IMAGE_MEDIA_TYPES: ReadonlySet<string> = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
const IMAGE_EXTENSIONS: Readonly<Record<string, string>> = {
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  gif: "image/gif",
  webp: "image/webp",
};
const TEXT_EXTENSIONS: ReadonlySet<string> = new Set(
  (
    "txt text md markdown rst adoc tex log csv tsv json jsonl ndjson yaml yml toml ini cfg conf env properties " +
    "xml html htm css scss sass less svg js mjs cjs jsx ts mts cts tsx vue svelte py rb go rs java kt kts scala " +
    "swift c h cc cpp cxx hpp cs php pl lua r sh bash zsh fish ps1 sql graphql gql proto diff patch dockerfile " +
    "makefile gitignore editorconfig"
  ).split(" "),
);
const TEXT_MEDIA_TYPE =
  /^text\/|[/+](?:json|xml|yaml|x-yaml|toml|csv)$|^application\/(?:javascript|ecmascript|typescript|x-typescript|x-sh|x-shellscript|sql|graphql|x-ndjson|ndjson|x-python|x-ruby|x-perl|x-httpd-php)$/;

type FileKind = { kind: "text"; text: string } | { kind: "image"; mimeType: string } | { kind: "binary" };

/**
 * What an inline file is. Text: a text-like media type (text/*, JSON, XML, YAML…),
 * or a text file extension, or — when the media type is absent or
 * application/octet-stream — content that decodes as UTF-8 without NUL bytes.
 * Images: png, jpeg, gif, webp by media type, or by extension when the media type
 * is absent or generic. Everything else is binary and described, not included.
 */
export function classifyFile(bytes: Buffer, mediaType: string | undefined, filename: string | undefined): FileKind {
  const type = mediaType?.split(";")[0].trim().toLowerCase() || undefined;
  const extension = fileExtension(filename);
  const generic = type === undefined || type === "application/octet-stream";
  if (type && IMAGE_MEDIA_TYPES.has(type)) return { kind: "image", mimeType: type };
  const decoded = decodeUtf8(bytes);
  if (type && TEXT_MEDIA_TYPE.test(type)) return { kind: "text", text: decoded ?? bytes.toString("utf8") };
  if (generic && extension && IMAGE_EXTENSIONS[extension]) return { kind: "image", mimeType: IMAGE_EXTENSIONS[extension] };
  if (extension && TEXT_EXTENSIONS.has(extension) && decoded !== undefined) return { kind: "text", text: decoded };
  if (generic && decoded !== undefined) return { kind: "text", text: decoded };
  return { kind: "binary" };
}

function fileExtension(filename: string | undefined): string | undefined {
  if (!filename) return undefined;
  const base = filename.split(/[\\/]/).pop()!.toLowerCase();
  const dot = base.lastIndexOf(".");
  return dot >= 0 ? base.slice(dot + 1) : base; // "Makefile", "Dockerfile" name themselves
}

function decodeUtf8(bytes: Buffer): string | undefined {
  if (bytes.includes(0)) return undefined;
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    return undefined;
  }
}

/**
 * The user message for a turn's input. `input_text` parts become text; inline files
 * become `<file name="…">…</file>` text, image content (when the model accepts
 * images) or a short note saying what was left out.
 */
export function buildUserMessage(input: readonly InputPart[], acceptsImages: boolean, timestamp: number): UserMessage {
  const content: (TextContent | ImageContent)[] = [];
  for (const part of input) {
    if (part.type === "input_text") {
      content.push({ type: "text", text: part.text });
      continue;
    }
    const name = part.filename ?? part.file_id ?? "file";
    if (part.file_data === undefined) {
      content.push({ type: "text", text: `[file ${name} was not provided inline and is not included]` });
      continue;
    }
    let data = part.file_data;
    let mediaType = part.media_type;
    const dataUrl = /^data:([^;,]*)(?:;[^,]*)?,/.exec(data);
    if (dataUrl) {
      data = data.slice(dataUrl[0].length);
      mediaType ??= dataUrl[1] || undefined;
    }
    const bytes = Buffer.from(data, "base64");
    const file = classifyFile(bytes, mediaType, part.filename);
    switch (file.kind) {
      case "text":
        content.push({ type: "text", text: `<file name="${escapeAttribute(name)}">\n${file.text}\n</file>` });
        break;
      case "image":
        if (acceptsImages) content.push({ type: "image", data: bytes.toString("base64"), mimeType: file.mimeType });
        else {
          content.push({
            type: "text",
            text: `[image ${name} (${file.mimeType}, ${bytes.length} bytes) omitted: the model does not accept images]`,
          });
        }
        break;
      case "binary":
        content.push({
          type: "text",
          text: `[file ${name} (${mediaType ?? "unknown type"}, ${bytes.length} bytes) is binary and is not included]`,
        });
        break;
      default:
        assertNever(file);
    }
  }
  if (content.length === 0) content.push({ type: "text", text: "" });
  return { role: "user", content, timestamp };
}

function escapeAttribute(value: string): string {
  return value.replace(/&/g, "&amp;").replace(/"/g, "&quot;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

function inputText(input: readonly InputPart[]): string {
  return input
    .filter((part): part is Extract<InputPart, { type: "input_text" }> => part.type === "input_text")
    .map((part) => part.text)
    .join("\n");
}

// ---------------------------------------------------------------------------------
// The turn

/** Continuations for steers that arrive as the loop ends; each one needs a new steer call. */
const MAX_STEER_CONTINUATIONS = 100;

class TurnExecution {
  private agent?: Agent;
  private closed = false;
  private aborted = false;
  private readonly steers: UserMessage[] = [];
  /** Messages the loop reported at message_end (the ones it really processed). */
  private readonly ended = new WeakSet<object>();
  /** The failure message pi's Agent makes when the loop itself threw. */
  private loopFailure?: AssistantMessage;
  /** The sandbox failed (capacity, start): the turn ends failed with this error. */
  private sandboxFailure?: TurnError;
  private readonly reference: () => string;
  private readonly onAbortSignal = () => this.abort();

  constructor(private readonly req: TurnRunRequest) {
    this.reference = req.newReference ?? newReference;
  }

  steer(text: string): void {
    if (this.closed || this.aborted || !this.agent) throw new SteeringTargetEndedError();
    const message: UserMessage = { role: "user", content: [{ type: "text", text }], timestamp: Date.now() };
    this.steers.push(message);
    this.agent.steer(message);
  }

  abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    this.agent?.abort();
  }

  /** The sandbox cannot run the turn's tools: stop the loop; the turn fails with the sandbox's code. */
  private sandboxFailed(failure: SandboxFailure): void {
    this.sandboxFailure ??= turnError(failure.code, { message: failure.message, reference: this.reference() });
    this.agent?.abort();
  }

  async run(): Promise<TurnRunResult> {
    const { req } = this;
    const resolved = (req.resolveModel ?? resolveModel)(req.config.model, {
      script: req.config.script,
      tokensPerSecond: req.config.tokens_per_second,
      inputText: inputText(req.input),
    });
    if ("error" in resolved) {
      return this.failEarly(buildUserMessage(req.input, false, Date.now()), resolved.error);
    }
    const { model, streamFn } = resolved;
    const userMessage = buildUserMessage(req.input, model.input.includes("image"), Date.now());
    if (typeof req.config.model === "object") {
      // A tenant's endpoint must not point the node at itself, its neighbours or a
      // metadata service: nothing is sent to a refused address.
      try {
        await checkModelEndpoint(req.config.model.base_url, { allowPrivate: req.allowPrivateModelEndpoints === true });
      } catch (err) {
        if (!(err instanceof NetworkPolicyError)) throw err;
        const message = `The model endpoint ${err.host} is refused by the network policy (${err.reason}): model endpoints must be public addresses.`;
        const error = turnError(TurnErrorCode.network_policy_denied, { message, reference: this.reference(), source: "configuration" });
        return this.failEarly(userMessage, message, error);
      }
    }
    if (!providerOffered(model.provider, req.ambientProviders ?? new Set())) {
      return this.failEarly(userMessage, `Model provider "${model.provider}" authenticates with the service's own credentials and is not enabled on this service.`);
    }
    const keyName = typeof req.config.model === "object" ? req.config.model.api_key_env : undefined;
    const apiKey = streamFn ? undefined : this.apiKeyFor(model.provider);
    if (keyName && apiKey === PLACEHOLDER_API_KEY) {
      return this.failEarly(userMessage, `The environment value ${keyName} named by config.model.api_key_env does not exist in this workspace.`);
    }
    if (!streamFn && apiKey === undefined) {
      return this.failEarly(
        userMessage,
        `No API key is configured for model provider "${model.provider}". Add it as an environment value.`,
      );
    }

    const agent = new Agent({
      initialState: {
        systemPrompt: req.config.instructions ?? "",
        model,
        messages: req.history,
        tools: createWorkspaceTools(req.workspaceDir, req.config.tools ?? BUILTIN_TOOLS, {
          sandbox: req.sandbox,
          commandTimeoutMs: (req.config.limits?.command_timeout_s ?? DEFAULT_COMMAND_TIMEOUT_MS / 1000) * 1000,
          limits: limitsOf(req.config),
          networkAllow: req.config.network?.allow,
          onNetworkDenied: (denial) =>
            this.req.onEvent({
              type: "sandbox.network_denied",
              data: { host: denial.host, port: denial.port, reason: denial.reason, policy: "config.network.allow" },
            }),
          onSandboxFailure: (failure) => this.sandboxFailed(failure),
        }),
      },
      streamFn,
      getApiKey: (provider) => (provider === model.provider ? apiKey : this.apiKeyFor(provider)),
      // Commands share one workspace: run a message's tool calls one after another.
      toolExecution: "sequential",
      // Every steer queued at a step boundary reaches the model at that boundary.
      steeringMode: "all",
    });
    agent.subscribe((event) => this.observe(event));
    this.agent = agent;

    const historyLength = agent.state.messages.length;
    req.signal?.addEventListener("abort", this.onAbortSignal, { once: true });
    if (req.signal?.aborted) this.abort();
    // Let startTurn return before the first event, so onEvent may use its handle.
    await Promise.resolve();
    if (this.aborted) {
      this.closed = true;
      req.signal?.removeEventListener("abort", this.onAbortSignal);
      return { outcome: "aborted", output: [], transcript: [userMessage, ...this.steers] };
    }
    let thrown: unknown;
    try {
      await agent.prompt(userMessage);
      for (let round = 0; round < MAX_STEER_CONTINUATIONS; round++) {
        if (this.aborted || !agent.hasQueuedMessages() || !this.lastStepSucceeded(agent)) break;
        await agent.continue();
      }
    } catch (error) {
      thrown = error;
    } finally {
      // Synchronously after the last check: from here on steer() refuses.
      this.closed = true;
      req.signal?.removeEventListener("abort", this.onAbortSignal);
    }
    agent.clearAllQueues();

    const turnMessages = agent.state.messages.slice(historyLength);
    const undelivered = this.steers.filter((message) => !this.ended.has(message));
    const transcript = [...turnMessages, ...undelivered];
    return this.conclude(turnMessages, transcript, thrown);
  }

  /** The result when preparing the turn itself threw (a bug, or an injected resolver failing). */
  crashed(error: unknown): TurnRunResult {
    this.closed = true;
    const message = `The agent failed: ${sanitizeErrorText(errorText(error)) || "unknown error"}`;
    return {
      outcome: "failed",
      output: [],
      transcript: [],
      error: turnError(TurnErrorCode.agent_execution_failed, { message, reference: this.reference() }),
    };
  }

  /** Only what the workspace holds: never the service's environment (pi-ai's getEnvApiKey). */
  private apiKeyFor(provider: string): string | undefined {
    const key = this.req.getApiKey?.(provider);
    if (key) return key;
    return provider === OPENAI_COMPATIBLE ? PLACEHOLDER_API_KEY : undefined;
  }

  private observe(event: AgentEvent): void {
    if (event.type === "message_end") this.ended.add(event.message);
    if (event.type === "agent_end") {
      for (const message of event.messages) {
        if (message.role === "assistant" && !this.ended.has(message)) this.loopFailure = message;
      }
    }
    this.req.onEvent(toRuntimeEvent(event));
  }

  private lastStepSucceeded(agent: Agent): boolean {
    const last = agent.state.messages[agent.state.messages.length - 1];
    return !(last?.role === "assistant" && (last.stopReason === "error" || last.stopReason === "aborted"));
  }

  private failEarly(userMessage: UserMessage, message: string, error?: TurnError): TurnRunResult {
    this.closed = true;
    return {
      outcome: "failed",
      output: [],
      transcript: [userMessage],
      error: error ?? turnError(TurnErrorCode.agent_configuration_invalid, { message, reference: this.reference() }),
    };
  }

  private conclude(turnMessages: AgentMessage[], transcript: AgentMessage[], thrown: unknown): TurnRunResult {
    const assistants = turnMessages.filter((m): m is AssistantMessage => m.role === "assistant");
    const partialOutput = () => textParts([...assistants].reverse().find((m) => textParts(m).length > 0));

    if (this.sandboxFailure && !this.aborted) {
      return { outcome: "failed", output: partialOutput(), transcript, error: this.sandboxFailure };
    }

    if (thrown !== undefined || this.loopFailure) {
      if (this.aborted) return { outcome: "aborted", output: partialOutput(), transcript };
      const detail = thrown !== undefined ? errorText(thrown) : (this.loopFailure?.errorMessage ?? "");
      const message = `The agent failed: ${sanitizeErrorText(detail) || "unknown error"}`;
      return {
        outcome: "failed",
        output: partialOutput(),
        transcript,
        error: turnError(TurnErrorCode.agent_execution_failed, { message, reference: this.reference() }),
      };
    }

    const last = assistants[assistants.length - 1];
    if (!last) {
      if (this.aborted) return { outcome: "aborted", output: [], transcript };
      return {
        outcome: "failed",
        output: [],
        transcript,
        error: turnError(TurnErrorCode.agent_execution_failed, {
          message: "The agent ended without an answer.",
          reference: this.reference(),
        }),
      };
    }
    switch (last.stopReason) {
      case "stop":
      case "length":
      case "toolUse":
        // An abort that came after the work finished does not undo it.
        return { outcome: "completed", output: textParts(last), transcript };
      case "aborted":
        return { outcome: "aborted", output: partialOutput(), transcript };
      case "error": {
        // Cancellation wins over a provider error it may have caused.
        if (this.aborted) return { outcome: "aborted", output: partialOutput(), transcript };
        const failure = providerFailure(last);
        return {
          outcome: "failed",
          output: partialOutput(),
          transcript,
          error: turnError(failure.code, { message: failure.message || undefined, reference: this.reference() }),
        };
      }
      default:
        return assertNever(last.stopReason);
    }
  }
}

function textParts(message: AssistantMessage | undefined): OutputPart[] {
  if (!message) return [];
  return message.content
    .filter((block): block is TextContent => block.type === "text" && block.text.length > 0)
    .map((block) => ({ type: "output_text", text: block.text }));
}

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
