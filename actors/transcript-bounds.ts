/**
 * A turn's transcript is stored in its turn document, which must stay under the store's
 * 16 MiB document limit together with the turn's input and output. A transcript over
 * its room is compacted (images and long texts of user messages and tool results
 * become notes); one that still does not fit is not stored, and the turn fails
 * instead of leaving the run busy (README, "Runs and turns").
 */
import type { AgentMessage } from "@mariozechner/pi-agent-core";

/** Bytes a turn document may hold in input, output and transcript together. */
export const MAX_TURN_DOCUMENT_BYTES = 15 * 1024 * 1024;

/** Text blocks of user messages and tool results longer than this are cut when compacting. */
const COMPACT_TEXT_CHARS = 16 * 1024;

export function jsonBytes(value: unknown): number {
  return Buffer.byteLength(JSON.stringify(value ?? null));
}

export type BoundedTranscript = { fits: true; transcript: AgentMessage[]; compacted: boolean } | { fits: false; bytes: number };

/** `transcript` as stored within `roomBytes`: as it is, compacted, or not at all. */
export function boundTranscript(transcript: AgentMessage[], roomBytes: number): BoundedTranscript {
  if (jsonBytes(transcript) <= roomBytes) return { fits: true, transcript, compacted: false };
  const compacted = transcript.map(compactMessage);
  const bytes = jsonBytes(compacted);
  if (bytes <= roomBytes) return { fits: true, transcript: compacted, compacted: true };
  return { fits: false, bytes };
}

/**
 * What of a finished turn its document can hold: the transcript as it is, compacted,
 * or dropped with the reason the turn then fails for (`failure`); the output is dropped
 * too only when input and output alone are over the limit.
 */
export function fitTurnDocument<O>(
  input: unknown,
  output: O[],
  transcript: AgentMessage[],
): { output: O[]; transcript: AgentMessage[]; compacted: boolean; failure?: string } {
  const bounded = boundTranscript(transcript, MAX_TURN_DOCUMENT_BYTES - jsonBytes(input) - jsonBytes(output));
  if (bounded.fits) return { output, transcript: bounded.transcript, compacted: bounded.compacted };
  const mib = (MAX_TURN_DOCUMENT_BYTES / 1024 / 1024).toFixed(0);
  return {
    output: jsonBytes(input) + jsonBytes(output) > MAX_TURN_DOCUMENT_BYTES ? [] : output,
    transcript: [],
    compacted: false,
    failure: `The turn's transcript (${bounded.bytes} bytes) does not fit the ${mib} MiB a turn may store, and was not kept.`,
  };
}

type Block = { type: string; text?: string; data?: string; mimeType?: string };

function compactMessage(message: AgentMessage): AgentMessage {
  const m = message as { role?: string; content?: unknown };
  if ((m.role !== "user" && m.role !== "toolResult") || !Array.isArray(m.content)) return message;
  return { ...message, content: (m.content as Block[]).map(compactBlock) } as AgentMessage;
}

function compactBlock(block: Block): Block {
  if (block.type === "image" && typeof block.data === "string") {
    const bytes = Math.floor((block.data.length * 3) / 4);
    return { type: "text", text: `[image (${block.mimeType ?? "unknown type"}, about ${bytes} bytes) not kept in the run's history: the turn's transcript was too large]` };
  }
  if (block.type === "text" && typeof block.text === "string" && block.text.length > COMPACT_TEXT_CHARS) {
    return { type: "text", text: `${block.text.slice(0, COMPACT_TEXT_CHARS)}\n[${block.text.length - COMPACT_TEXT_CHARS} more characters not kept in the run's history: the turn's transcript was too large]` };
  }
  return block;
}
