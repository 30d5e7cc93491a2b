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
import { Agent, type AgentEvent, type AgentMessage, type AgentTool, type BeforeToolCallContext, type BeforeToolCallResult, type StreamFn } from "@mariozechner/pi-agent-core";
import { approvalRequired, type AgentConfig, type TurnOutcome, assertNever, BUILTIN_TOOLS, READ_ONLY_TOOLS, checkModelEndpoint, type InputPart, type Lookup, NetworkPolicyError, newReference, type OutputPart, providerOffered, type RuntimeEvent, type TurnError, turnError, TurnErrorCode, type TurnUsage, turnUsage, hasPrices } from "../src/index.js";
import { createAssistantMessageEventStream, streamSimple, type AssistantMessage, type AssistantMessageEventStream, type TextContent, type ToolResultMessage, type UserMessage } from "@mariozechner/pi-ai";
import { OPENAI_COMPATIBLE, PLACEHOLDER_API_KEY, resolveModel } from "./model-resolution.js";
import { toRuntimeEvent } from "./agent-events.js";
import { providerFailure, sanitizeErrorText } from "./provider-failures.js";
import { guardModelCalls, type ModelEgressGuard } from "./model-egress.js";
import { buildUserMessage, inputText } from "./user-message.js";
import { createWorkspaceTools, DEFAULT_COMMAND_TIMEOUT_MS, Workspace } from "./workspace-tools.js";
import type { Sandbox, SandboxFailure } from "./sandbox.js";
import { limitsOf } from "./sandbox-limits.js";

export interface TurnRunRequest {
  /** The deployment's agent configuration. */
  config: AgentConfig;
  /** The run's workspace directory; must exist. Tools are confined to it. */
  workspaceDir: string;
  /** The node's sandbox: every tool runs in it. */
  sandbox: Sandbox;
  /** The run's workspace: its commands share one workspace's part of the node's processes. */
  tenant?: string;
  /** Operator setting: openai-compatible endpoints may be private or loopback addresses. */
  allowPrivateModelEndpoints?: boolean;
  /** TEST ONLY: how an openai-compatible endpoint's name resolves, for its checks (model-egress.ts). */
  modelEndpointLookup?: Lookup;
  /** TEST ONLY: endpoint host names the guarded model calls connect to a loopback server (model-egress.ts). */
  modelEndpointTestHosts?: ReadonlyMap<string, { host: string; port: number }>;
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
  /**
   * Resume a turn that waited for a person's decision instead of starting one: `input`
   * is ignored, the loop goes on from the call that asked (see {@link TurnResume}).
   */
  resume?: TurnResume;
  /**
   * Awaited before a call of a tool that acts (not a read-only one) runs, after its
   * `tool_execution_start` was reported: the caller stores that event, so a new owner of a
   * turn cut short knows an action may have run (worker_action_interrupted). False when it
   * could not be stored: the call does not run (its result says why). Must not reject.
   */
  beforeAction?: () => Promise<boolean>;
}

/**
 * Where a turn that waited for a decision goes on. The assistant message that asked is
 * replayed from the transcript, never asked of the model again; results of its calls
 * that ran before the gated one are replayed too; the decided call runs (approve) or
 * returns `denial` as its error result (deny); the loop then goes on as usual.
 */
export interface TurnResume {
  /** What the turn added before it waited (its stored transcript). */
  transcript: AgentMessage[];
  /** Index in `transcript` of the assistant message that asked. */
  assistantIndex: number;
  toolCallId: string;
  decision: "approve" | "deny";
  /** The tool's error text for a denial. */
  denial: string;
  /** Steering input that arrived while the turn waited: delivered after the decided call's batch. */
  steers: string[];
}

/** Where a turn stopped to wait for a person: the gated call, and what it needs to go on. */
export interface TurnPause {
  toolCallId: string;
  tool: string;
  arguments: Record<string, unknown>;
  /** Index in the result's transcript of the assistant message that asked. */
  assistantIndex: number;
  /** Steering input accepted but not yet delivered to the model. */
  steers: string[];
}


export interface TurnRunResult {
  /** `paused`: a gated tool call waits for a person ({@link TurnRunResult.pause}); nothing of it ran. */
  outcome: TurnOutcome | "paused";
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
  /** Set when the outcome is paused. */
  pause?: TurnPause;
  /** Aborted while a tool call ran: the call may have done what it does (worker_action_interrupted). */
  actionInterrupted?: boolean;
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
  const result = turn
    .run()
    .catch((error: unknown) => turn.crashed(error))
    .then((result) => (turn.actionInterrupted ? { ...result, actionInterrupted: true } : result));
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
  /** The gated call the loop stopped at: from then on nothing is reported, run or asked of the model. */
  private pause?: { toolCallId: string; tool: string; arguments: Record<string, unknown>; assistantIndex: number; transcript: AgentMessage[] };
  /** Resuming: the replayed part (up to the decided call's start) was reported before. */
  private replaying = false;
  /** Steers that waited with the turn, for the end of the decided call's batch. */
  private heldSteers: UserMessage[] = [];
  /** Results of the asking message's calls that ran before the turn waited, by call id. */
  private readonly replayed = new Map<string, ToolResultMessage>();
  private historyLength = 0;
  /** Resuming: the asking message's batch has ended (its stored results answer nothing more). */
  private askingBatchDone = false;
  /** Tool calls let run and not yet ended, by id. */
  private readonly acting = new Set<string>();
  /** The turn was aborted while a tool call ran. */
  actionInterrupted = false;
  /** Tool paths as the tools themselves read them (for config.approval's path globs). */
  private readonly workspace: Workspace;
  /** A tenant's model endpoint: the address guard held at each connection of its calls. */
  private egress?: ModelEgressGuard;
  /** The first connection of a model call the guard refused. */
  private egressRefusal?: NetworkPolicyError;

  constructor(private readonly req: TurnRunRequest) {
    this.reference = req.newReference ?? newReference;
    this.workspace = new Workspace(req.workspaceDir, req.sandbox.workspaceRoot);
  }

  steer(text: string): void {
    if (this.closed || this.aborted || !this.agent) throw new SteeringTargetEndedError();
    const message = steerMessage(text);
    this.steers.push(message);
    // While the part before the decision is replayed, the loop's first poll would put the
    // input before the message that asked: it waits with the held steers instead.
    // Behind held ones too, so steers reach the model in the order they were taken.
    if (this.replaying || this.heldSteers.length > 0) this.heldSteers.push(message);
    else this.agent.steer(message);
  }

  abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    if (this.acting.size > 0) this.actionInterrupted = true;
    this.agent?.abort();
  }

  /** The sandbox cannot run the turn's tools: stop the loop; the turn fails with the sandbox's code. */
  private sandboxFailed(failure: SandboxFailure): void {
    this.sandboxFailure ??= turnError(failure.code, { message: failure.message, reference: this.reference() });
    this.agent?.abort();
  }

  async run(): Promise<TurnRunResult> {
    const { req } = this;
    const resume = req.resume;
    const resolved = (req.resolveModel ?? resolveModel)(req.config.model, {
      script: req.config.script,
      tokensPerSecond: req.config.tokens_per_second,
      inputText: inputText(req.input),
      // The scripted model answers the turn's next step: the calls before the wait were made.
      firstStep: resume ? resume.transcript.slice(0, resume.assistantIndex + 1).filter((m) => m.role === "assistant").length : 0,
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
        await checkModelEndpoint(req.config.model.base_url, { allowPrivate: req.allowPrivateModelEndpoints === true, lookup: req.modelEndpointLookup });
      } catch (err) {
        if (!(err instanceof NetworkPolicyError)) throw err;
        const message = endpointRefused(err);
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

    if (resume) {
      for (const message of resume.transcript.slice(resume.assistantIndex + 1)) {
        if (message.role === "toolResult") this.replayed.set(message.toolCallId, message);
      }
    }
    const agent = new Agent({
      initialState: {
        systemPrompt: req.config.instructions ?? "",
        model,
        messages: resume ? [...req.history, ...resume.transcript.slice(0, resume.assistantIndex)] : req.history,
        tools: this.withReplay(createWorkspaceTools(req.workspaceDir, req.config.tools ?? BUILTIN_TOOLS, {
          sandbox: req.sandbox,
          tenant: req.tenant,
          commandTimeoutMs: (req.config.limits?.command_timeout_s ?? DEFAULT_COMMAND_TIMEOUT_MS / 1000) * 1000,
          limits: limitsOf(req.config),
          networkAllow: req.config.network?.allow,
          onNetworkDenied: (denial) =>
            this.req.onEvent({
              type: "sandbox.network_denied",
              data: { host: denial.host, port: denial.port, reason: denial.reason, policy: "config.network.allow" },
            }),
          onSandboxFailure: (failure) => this.sandboxFailed(failure),
        })),
      },
      streamFn: this.streamWith(streamFn),
      beforeToolCall: (context) => this.beforeToolCall(context),
      getApiKey: (provider) => (provider === model.provider ? apiKey : this.apiKeyFor(provider)),
      // Commands share one workspace: run a message's tool calls one after another.
      toolExecution: "sequential",
      // Every steer queued at a step boundary reaches the model at that boundary.
      steeringMode: "all",
    });
    agent.subscribe((event) => this.observe(event));
    this.agent = agent;

    // A resumed turn's messages include what it added before it waited.
    const historyLength = req.history.length;
    this.historyLength = historyLength;
    if (resume) {
      this.replaying = true;
      this.heldSteers = resume.steers.map(steerMessage);
      this.steers.push(...this.heldSteers);
    }
    req.signal?.addEventListener("abort", this.onAbortSignal, { once: true });
    if (req.signal?.aborted) this.abort();
    // Let startTurn return before the first event, so onEvent may use its handle.
    await Promise.resolve();
    if (this.aborted) {
      this.closed = true;
      req.signal?.removeEventListener("abort", this.onAbortSignal);
      return { outcome: "aborted", output: [], transcript: [...this.before(userMessage, "The turn was cancelled before the call ran."), ...this.steers] };
    }
    let thrown: unknown;
    // A tenant's endpoint is checked again at every connection: its name may answer
    // otherwise then, or it may redirect. Closed in the finally below.
    if (typeof req.config.model === "object" && req.allowPrivateModelEndpoints !== true) {
      this.egress = guardModelCalls({
        lookup: req.modelEndpointLookup,
        testHosts: req.modelEndpointTestHosts,
        onRefused: (err) => (this.egressRefusal ??= err),
        // A retry that got an answer: whatever fails the call now is not the refusal.
        onResponse: () => (this.egressRefusal = undefined),
      });
    }
    try {
      if (resume) await agent.continue();
      else await agent.prompt(userMessage);
      for (let round = 0; round < MAX_STEER_CONTINUATIONS; round++) {
        if (this.aborted || this.pause || !agent.hasQueuedMessages() || !this.lastStepSucceeded(agent)) break;
        await agent.continue();
      }
    } catch (error) {
      thrown = error;
    } finally {
      // Synchronously after the last check: from here on steer() refuses.
      this.closed = true;
      req.signal?.removeEventListener("abort", this.onAbortSignal);
      this.egress?.close().catch(() => undefined);
    }
    agent.clearAllQueues();

    const undelivered = this.steers.filter((message) => !this.ended.has(message));
    const pause = this.pause;
    if (pause && !this.aborted) {
      // Nothing of the gated call ran; the turn waits with what it added up to it.
      const { transcript: added, ...at } = pause;
      return { outcome: "paused", output: [], transcript: added, pause: { ...at, steers: undelivered.map(messageText) }, usage: turnUsage(added, hasPrices(model.cost)) };
    }
    if (pause) {
      // Aborted as it came to wait (cancel, time limit): the call never ran.
      const added = closeToolCalls(pause.transcript, "The call did not run: the turn was cancelled.");
      const output = textParts([...added].reverse().find((m): m is AssistantMessage => m.role === "assistant" && textParts(m).length > 0));
      return { outcome: "aborted", output, transcript: [...added, ...undelivered], usage: turnUsage(added, hasPrices(model.cost)) };
    }
    const turnMessages = agent.state.messages.slice(historyLength);
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
    if (event.type === "tool_execution_end") this.acting.delete(event.toolCallId);
    // Once the turn waits, what the loop does to wind down is neither the turn's nor reported.
    if (this.pause) return;
    if (event.type === "message_end") this.ended.add(event.message);
    if (event.type === "agent_end") {
      for (const message of event.messages) {
        if (message.role === "assistant" && !this.ended.has(message)) this.loopFailure = message;
      }
    }
    if (this.replaying) {
      // Reported before the turn waited, up to and including the decided call's start.
      if (event.type === "tool_execution_start" && event.toolCallId === this.req.resume?.toolCallId) this.replaying = false;
      return;
    }
    if (event.type === "turn_end") this.askingBatchDone = true;
    if (event.type === "turn_end" && this.heldSteers.length > 0) {
      // After the decided call's batch: the loop takes them before its next model call.
      for (const message of this.heldSteers) this.agent?.steer(message);
      this.heldSteers = [];
    }
    this.req.onEvent(toRuntimeEvent(event));
  }

  /**
   * Gates tool calls by `config.approval`: the first call that needs a person stops the
   * turn before it runs (the loop winds down without running or asking anything more).
   * Resuming, the decided call runs or is denied and replayed calls return their results.
   */
  private async beforeToolCall({ toolCall, assistantMessage, args }: BeforeToolCallContext): Promise<BeforeToolCallResult | undefined> {
    if (this.pause) return { block: true, reason: "The turn waits for a decision." };
    const resume = this.req.resume;
    // Only the calls of the message that asked are replayed or decided: a later message may
    // reuse an id (providers number calls per message), and must be gated on its own.
    if (resume && assistantMessage === this.asking()) {
      if (this.replayed.has(toolCall.id)) return undefined;
      if (toolCall.id === resume.toolCallId) return resume.decision === "approve" ? this.acts(toolCall.id, toolCall.name) : { block: true, reason: resume.denial };
    }
    // The arguments as the tool will run with them (validated, coerced), not as the model wrote them.
    const called = (args && typeof args === "object" ? args : toolCall.arguments) as Record<string, unknown>;
    if (this.aborted || !approvalRequired(this.req.config.approval, toolCall.name, called, (p) => this.workspace.relative(p))) return this.acts(toolCall.id, toolCall.name);
    const ids = assistantMessage.content.flatMap((block) => (block.type === "toolCall" ? [block.id] : []));
    if (!toolCall.id || ids.filter((id) => id === toolCall.id).length > 1) {
      // A decision names its call by id: without a unique one it could reach another call.
      return { block: true, reason: "This call needs a person's approval, but the model gave it no unique id; it was not run." };
    }
    const transcript = this.agent!.state.messages.slice(this.historyLength);
    const assistantIndex = transcript.lastIndexOf(assistantMessage);
    if (assistantIndex < 0) throw new Error("the assistant message that asked is not in the transcript");
    this.pause = { toolCallId: toolCall.id, tool: toolCall.name, arguments: called, assistantIndex, transcript };
    return { block: true, reason: "The turn waits for a decision." };
  }

  /**
   * The call may run. One of a tool that acts runs once its start is stored
   * ({@link TurnRunRequest.beforeAction}; if it cannot be, the call is refused), and until its
   * end an abort is an action interrupted.
   */
  private async acts(toolCallId: string, tool: string): Promise<BeforeToolCallResult | undefined> {
    if (READ_ONLY_TOOLS.has(tool)) return undefined;
    if (this.req.beforeAction && !(await this.req.beforeAction())) {
      return { block: true, reason: "The call did not run: the service could not record that it was starting. Try again shortly." };
    }
    this.acting.add(toolCallId);
    return undefined;
  }

  /** The model's stream: the asking message replayed first when resuming; nothing once the turn waits. */
  private streamWith(streamFn: StreamFn | undefined): StreamFn {
    const call = streamFn ?? streamSimple;
    const resume = this.req.resume;
    let replay = resume ? (resume.transcript[resume.assistantIndex] as AssistantMessage) : undefined;
    return (model, context, options) => {
      if (this.pause) {
        return endedStream({ role: "assistant", content: [], api: model.api, provider: model.provider, model: model.id, usage: NO_MODEL_USAGE, stopReason: "aborted", timestamp: Date.now() });
      }
      if (replay) {
        const message = replay;
        replay = undefined;
        return endedStream(message);
      }
      // The model's request is aborted with the turn, or once it asks for too many calls.
      const controller = new AbortController();
      const signal = options?.signal ? AbortSignal.any([options.signal, controller.signal]) : controller.signal;
      if (this.egress) {
        // A refusal names this call's failure, not a later one's.
        this.egressRefusal = undefined;
        model = { ...model, headers: { ...model.headers, ...this.egress.headers } };
      }
      // A stream function that throws, or whose promise rejects, fails the turn as before.
      const source = call(model, context, { ...options, signal });
      return source instanceof Promise ? source.then((stream) => boundedToolCalls(model, stream, controller)) : boundedToolCalls(model, source, controller);
    };
  }

  /** Tools that return the stored result of a call that ran before the turn waited. */
  /** The assistant message that asked, when resuming. */
  private asking(): AssistantMessage | undefined {
    const resume = this.req.resume;
    return resume ? (resume.transcript[resume.assistantIndex] as AssistantMessage) : undefined;
  }

  private withReplay(tools: AgentTool<any>[]): AgentTool<any>[] {
    if (this.replayed.size === 0) return tools;
    return tools.map((tool) => ({
      ...tool,
      execute: async (id, params, signal, onUpdate) => {
        // Stored results answer the asking message's batch only (see beforeToolCall).
        const stored = this.askingBatchDone ? undefined : this.replayed.get(id);
        if (!stored) return tool.execute(id, params, signal, onUpdate);
        if (stored.isError) throw new Error(messageText(stored));
        return { content: stored.content, details: stored.details };
      },
    }));
  }

  private lastStepSucceeded(agent: Agent): boolean {
    const last = agent.state.messages[agent.state.messages.length - 1];
    return !(last?.role === "assistant" && (last.stopReason === "error" || last.stopReason === "aborted"));
  }

  /**
   * What the turn holds before this execution adds anything: its user message, or, when
   * resuming, what it added before it waited, the waiting calls answered with `unanswered`.
   */
  private before(userMessage: UserMessage, unanswered: string): AgentMessage[] {
    const resume = this.req.resume;
    return resume ? closeToolCalls(resume.transcript, unanswered) : [userMessage];
  }

  private failEarly(userMessage: UserMessage, message: string, error?: TurnError): TurnRunResult {
    this.closed = true;
    return {
      outcome: "failed",
      output: [],
      transcript: this.before(userMessage, "The call did not run: the turn failed first."),
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
        if (this.egressRefusal) {
          const message = endpointRefused(this.egressRefusal);
          return { outcome: "failed", output: partialOutput(), transcript, error: turnError(TurnErrorCode.network_policy_denied, { message, reference: this.reference(), source: "configuration" }) };
        }
        if (OVER_TOOL_CALL_LIMIT.has(last)) {
          // Named as it is, for any provider (a tenant's endpoint's own errors are only summarised).
          return { outcome: "failed", output: partialOutput(), transcript, error: turnError(TurnErrorCode.agent_execution_failed, { message: last.errorMessage, reference: this.reference() }) };
        }
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

function endpointRefused(err: NetworkPolicyError): string {
  return `The model endpoint ${err.host} is refused by the network policy (${err.reason}): model endpoints must be public addresses.`;
}

const NO_MODEL_USAGE = { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0, cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } };

function steerMessage(text: string): UserMessage {
  return { role: "user", content: [{ type: "text", text }], timestamp: Date.now() };
}

/**
 * Tool calls one model message may ask for. Past it the message ends in an error and its
 * request is aborted: a tenant's endpoint answering 30,000 calls in one message made some
 * 200,000 events, appended in one burst that held a node's event loop for 11 s (model probe).
 */
export const MAX_TOOL_CALLS_PER_MESSAGE = 256;

/** Messages {@link boundedToolCalls} ended: their turn fails naming the limit, not as a provider's error. */
const OVER_TOOL_CALL_LIMIT = new WeakSet<AssistantMessage>();

/** `source`'s events, ended with an error once its message asks for more than {@link MAX_TOOL_CALLS_PER_MESSAGE} calls. */
function boundedToolCalls(model: Parameters<StreamFn>[0], stream: AssistantMessageEventStream, controller: AbortController): AssistantMessageEventStream {
  const out = createAssistantMessageEventStream();
  void (async () => {
    let calls = 0;
    for await (const event of stream) {
      if (event.type === "toolcall_start" && ++calls > MAX_TOOL_CALLS_PER_MESSAGE) {
        controller.abort();
        // The calls asked for are dropped with the message: none of them runs.
        const message: AssistantMessage = {
          ...event.partial,
          content: event.partial.content.filter((block) => block.type !== "toolCall"),
          stopReason: "error",
          errorMessage: `The model asked for more than ${MAX_TOOL_CALLS_PER_MESSAGE} tool calls in one message; none of them ran.`,
        };
        OVER_TOOL_CALL_LIMIT.add(message);
        out.push({ type: "error", reason: "error", error: message });
        out.end(message);
        return;
      }
      out.push(event);
    }
    out.end(await stream.result());
  })().catch((err: unknown) => {
    // Its stream failed outside its protocol (which ends in an error event).
    const message: AssistantMessage = { role: "assistant", content: [], api: model.api, provider: model.provider, model: model.id, usage: NO_MODEL_USAGE, stopReason: "error", errorMessage: err instanceof Error ? err.message : String(err), timestamp: Date.now() };
    out.push({ type: "error", reason: "error", error: message });
    out.end(message);
  });
  return out;
}

/** A stream that answers `message` at once, as a provider's last event would. */
function endedStream(message: AssistantMessage) {
  const stream = createAssistantMessageEventStream();
  if (message.stopReason === "error" || message.stopReason === "aborted") stream.push({ type: "error", reason: message.stopReason, error: message });
  else stream.push({ type: "done", reason: message.stopReason, message });
  stream.end(message);
  return stream;
}

/** The text of a user or tool-result message. */
function messageText(message: { content: string | readonly { type: string; text?: string }[] }): string {
  if (typeof message.content === "string") return message.content;
  return message.content.map((block) => (block.type === "text" ? (block.text ?? "") : "")).join("");
}

/**
 * `transcript` with an error result for every call of its last assistant message that
 * has none: a session never holds a call without its result (providers refuse one).
 */
export function closeToolCalls(transcript: readonly AgentMessage[], text: string): AgentMessage[] {
  const out = [...transcript];
  const lastAssistant = out.map((m) => m.role).lastIndexOf("assistant");
  if (lastAssistant < 0) return out;
  const asking = out[lastAssistant] as AssistantMessage;
  const answered = new Set(out.slice(lastAssistant + 1).flatMap((m) => (m.role === "toolResult" ? [m.toolCallId] : [])));
  for (const block of asking.content) {
    if (block.type !== "toolCall" || answered.has(block.id)) continue;
    const result: ToolResultMessage = { role: "toolResult", toolCallId: block.id, toolName: block.name, content: [{ type: "text", text }], details: {}, isError: true, timestamp: Date.now() };
    out.push(result);
  }
  return out;
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
