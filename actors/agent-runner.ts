/**
 * Runs ONE turn of a run with pi-agent-core's `Agent`: builds the model
 * (model-resolution.ts), tools and user message (user-message.ts) from the deployment
 * config and the turn input, reports every agent event as a {@link RuntimeEvent}
 * (agent-events.ts), delivers steering, and maps the end of the agent loop to a turn
 * outcome (provider-failures.ts for a failed model call).
 *
 * Decisions (the failure codes themselves are the catalogue in src/turn-errors.ts):
 * - Tools: `config.tools` absent means all built-in tools; `[]` means none. A message's
 *   tool calls run one after another (they share one workspace).
 * - A missing API key fails the turn before the model is called with
 *   `agent_configuration_invalid`: no credentials reached the provider, so nothing was
 *   rejected; the fix is an environment value. `openai-compatible` endpoints may need
 *   no key (local servers); they get a placeholder key when none is configured, and a
 *   server that wants one answers 401 → provider_authentication_failed.
 * - An exception thrown by the loop is agent_execution_failed. Tool failures are error
 *   tool results for the model, never turn failures.
 * - Steering: steer messages are delivered at the agent's next step boundary. A steer
 *   still queued when the loop ends gets one more step (`agent.continue()`), so an
 *   accepted steer is never silently dropped; once the turn has ended (or is being
 *   aborted) `steer` throws {@link SteeringTargetEndedError} instead of accepting.
 *   Steers the agent never saw (the turn failed or was aborted first) are appended to
 *   the transcript, so the run's history keeps what the user said.
 */
import { Agent, type AgentEvent, type AgentMessage } from "@mariozechner/pi-agent-core";
import { type AgentConfig, type TurnOutcome, assertNever, BUILTIN_TOOLS, checkModelEndpoint, type InputPart, NetworkPolicyError, newReference, type OutputPart, providerOffered, type RuntimeEvent, type TurnError, turnError, TurnErrorCode, type TurnUsage, turnUsage, hasPrices } from "../src/index.js";
import type { AssistantMessage, TextContent, UserMessage } from "@mariozechner/pi-ai";
import { OPENAI_COMPATIBLE, PLACEHOLDER_API_KEY, resolveModel } from "./model-resolution.js";
import { toRuntimeEvent } from "./agent-events.js";
import { providerFailure, sanitizeErrorText } from "./provider-failures.js";
import { buildUserMessage, inputText } from "./user-message.js";
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
  /** What the turn's model calls used; absent when no model was called. */
  usage?: TurnUsage;
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
    // Every model call of the turn counts, also the partial one of a cancelled or failed turn.
    return { ...this.conclude(turnMessages, transcript, thrown), usage: turnUsage(turnMessages, hasPrices(model.cost)) };
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
