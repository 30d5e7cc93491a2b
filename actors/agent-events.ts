/**
 * Agent events as runtime events (decisions §5): every AgentEvent becomes one
 * RuntimeEvent with the same `type`, except `message_update`, which takes its inner
 * assistant event's type (text_delta, toolcall_delta, …). `data` is the rest of the
 * event's fields, never the `partial` message of update events. `agent_end` carries
 * `{messageCount}` instead of the messages: each of them was already reported by its
 * message_end. Data may share objects with the agent's state: serialise it inside
 * `onEvent`.
 */
import type { AgentEvent } from "@mariozechner/pi-agent-core";
import { assertNever, type RuntimeEvent } from "../src/index.js";

/** One agent event as a runtime event; see the module comment. */
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
