import { ApiError, invalid } from "./errors.js";
import type { InputPart } from "./domain.js";
import { OnBusy } from "./commands.js";

/**
 * Pure validation of `POST /api/v1/runs` bodies (spec rules 1–15, decisions §4).
 * Returns the normalized request or throws an ApiError naming the parameter.
 */

export const MAX_TAGS = 20;
export const MAX_TAG_LENGTH = 64;
export const MAX_INLINE_FILE_BYTES = 4 * 1024 * 1024;
/** Parts of one turn's input. */
export const MAX_INPUT_PARTS = 32;
/** UTF-8 bytes of all text parts of one turn's input together. */
export const MAX_TURN_TEXT_BYTES = 4 * 1024 * 1024;
/** Decoded bytes of all inline files of one turn's input together. */
export const MAX_TURN_INLINE_BYTES = 4 * 1024 * 1024;
/**
 * Bytes of files (inline and uploaded) one turn hands to the model, in input order; a
 * file past this budget is described to the model instead. With the inline cap it
 * keeps a turn's stored input and transcript well inside a 16 MiB document.
 */
export const MAX_TURN_FILE_BYTES = 6 * 1024 * 1024;

export type StartRequest = {
  kind: "start";
  agent: string;
  version: number | undefined;
  input: InputPart[];
  tags: string[];
  background: boolean;
  stream: boolean;
};

export type ContinueRequest = {
  kind: "continue";
  run_id: string;
  input: InputPart[];
  on_busy: OnBusy;
  background: boolean;
  stream: boolean;
};

export type RunRequest = StartRequest | ContinueRequest;

const KNOWN_FIELDS = new Set(["agent", "run_id", "version", "input", "background", "stream", "on_busy", "tags"]);

// Control characters (C0, DEL, C1) and the Unicode line/paragraph separators.
const CONTROL = /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/;

/** Why a string is not a valid tag, or undefined. Tags are never trimmed or interpreted. */
export function tagProblem(tag: unknown): string | undefined {
  if (typeof tag !== "string") return "a tag must be a string";
  const length = [...tag].length;
  if (length < 1 || length > MAX_TAG_LENGTH) return `a tag must be 1 to ${MAX_TAG_LENGTH} characters`;
  if (tag.trim() === "") return "a tag must not be whitespace only";
  if (CONTROL.test(tag)) return "a tag must not contain control characters";
  return undefined;
}

/** Validates a tag list for `param`; returns the distinct tags, sorted. */
export function parseTags(value: unknown, param: string, max = MAX_TAGS): string[] {
  if (!Array.isArray(value)) throw invalid(param, `${param} must be an array of strings`);
  for (const tag of value) {
    const problem = tagProblem(tag);
    if (problem) throw invalid(param, `${problem}: ${JSON.stringify(tag)}`);
  }
  const distinct = [...new Set(value as string[])].sort();
  if (distinct.length > max) throw invalid(param, `at most ${max} distinct tags are allowed`);
  return distinct;
}

function base64DecodedBytes(data: string): number | undefined {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(data) || data.length % 4 === 1) return undefined;
  const padding = data.endsWith("==") ? 2 : data.endsWith("=") ? 1 : 0;
  return Math.floor((data.length * 3) / 4) - padding;
}

function checkTextBytes(bytes: number): void {
  if (bytes > MAX_TURN_TEXT_BYTES) {
    throw new ApiError("payload_too_large", { param: "input", message: "The text of one input may hold at most 4 MiB; upload larger texts as files with POST /api/v1/files." });
  }
}

/** A string becomes one input_text part; arrays are checked part by part. */
export function parseInput(value: unknown): InputPart[] {
  if (value === undefined || value === null) throw invalid("input", "input is required");
  if (typeof value === "string") {
    checkTextBytes(Buffer.byteLength(value));
    return [{ type: "input_text", text: value }];
  }
  if (!Array.isArray(value)) throw invalid("input", "input must be a string or an array of input parts");
  if (value.length === 0) throw invalid("input", "input must hold at least one part");
  if (value.length > MAX_INPUT_PARTS) throw invalid("input", `input may hold at most ${MAX_INPUT_PARTS} parts`);
  let inlineBytes = 0;
  let textBytes = 0;
  return value.map((part, i): InputPart => {
    const where = `input[${i}]`;
    if (typeof part !== "object" || part === null || Array.isArray(part)) throw invalid("input", `${where} must be an object`);
    const p = part as Record<string, unknown>;
    if (p.type === "input_text") {
      if (typeof p.text !== "string") throw invalid("input", `${where}.text must be a string`);
      textBytes += Buffer.byteLength(p.text);
      checkTextBytes(textBytes);
      return { type: "input_text", text: p.text };
    }
    if (p.type === "input_file") {
      if (p.file_id !== undefined) {
        if (typeof p.file_id !== "string" || !p.file_id.startsWith("file_")) throw invalid("input", `${where}.file_id must be a file id`);
        return { type: "input_file", file_id: p.file_id };
      }
      if (typeof p.filename !== "string" || p.filename.length === 0 || p.filename.length > 255) {
        throw invalid("input", `${where} needs file_id, or filename with file_data`);
      }
      if (typeof p.file_data !== "string") throw invalid("input", `${where}.file_data must be base64`);
      const bytes = base64DecodedBytes(p.file_data);
      if (bytes === undefined) throw invalid("input", `${where}.file_data is not valid base64`);
      if (bytes > MAX_INLINE_FILE_BYTES) {
        throw new ApiError("payload_too_large", { param: "input", message: `An inline file may hold at most 4 MiB; upload larger files with POST /api/v1/files.` });
      }
      inlineBytes += bytes;
      if (inlineBytes > MAX_TURN_INLINE_BYTES) {
        throw new ApiError("payload_too_large", { param: "input", message: `The inline files of one input may hold at most 4 MiB together; upload larger files with POST /api/v1/files.` });
      }
      const out: InputPart = { type: "input_file", filename: p.filename, file_data: p.file_data };
      if (typeof p.media_type === "string") out.media_type = p.media_type;
      return out;
    }
    throw invalid("input", `${where}.type must be input_text or input_file`);
  });
}

function optionalBoolean(body: Record<string, unknown>, name: string): boolean {
  const value = body[name];
  if (value === undefined || value === null) return false;
  if (typeof value !== "boolean") throw invalid(name, `${name} must be a boolean`);
  return value;
}

export function parseRunRequest(raw: unknown): RunRequest {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw invalid(null, "The body must be a JSON object.");
  const body = raw as Record<string, unknown>;
  for (const field of Object.keys(body)) {
    if (!KNOWN_FIELDS.has(field)) throw invalid(field, `Unknown field ${field}.`);
  }
  const hasAgent = body.agent !== undefined && body.agent !== null;
  const hasRun = body.run_id !== undefined && body.run_id !== null;
  if (!hasAgent && !hasRun) throw invalid("agent", "Give agent to start a run or run_id to continue one.");
  if (hasAgent && hasRun) throw invalid("run_id", "Give either agent or run_id, not both.");
  const background = optionalBoolean(body, "background");
  const stream = optionalBoolean(body, "stream");
  if (background && stream) throw invalid("stream", "background and stream cannot both be true.");

  if (hasRun) {
    if (typeof body.run_id !== "string" || body.run_id.length === 0) throw invalid("run_id", "run_id must be a run id.");
    if (body.version !== undefined) throw invalid("version", "version applies only when starting a run with agent.");
    if (body.tags !== undefined) throw invalid("tags", "tags apply only when starting a run; use POST /api/v1/runs/{runId}/tags.");
    let onBusy: OnBusy = OnBusy.queue;
    if (body.on_busy !== undefined && body.on_busy !== null) {
      if (typeof body.on_busy !== "string" || !(body.on_busy in OnBusy)) throw invalid("on_busy", "on_busy must be queue, steer or reject.");
      onBusy = body.on_busy as OnBusy;
    }
    return { kind: "continue", run_id: body.run_id, input: parseInput(body.input), on_busy: onBusy, background, stream };
  }

  if (typeof body.agent !== "string" || body.agent.length === 0) throw invalid("agent", "agent must be an agent id.");
  if (body.on_busy !== undefined) throw invalid("on_busy", "on_busy applies only when continuing a run.");
  let version: number | undefined;
  if (body.version !== undefined) {
    if (typeof body.version !== "number" || !Number.isSafeInteger(body.version) || body.version < 1) {
      throw invalid("version", "version must be a positive whole number.");
    }
    version = body.version;
  }
  const tags = body.tags === undefined ? [] : parseTags(body.tags, "tags");
  return { kind: "start", agent: body.agent, version, input: parseInput(body.input), tags, background, stream };
}

/** The idempotency fingerprint: the normalized request without delivery flags. */
export function runRequestFingerprint(request: RunRequest): unknown {
  if (request.kind === "start") {
    return { kind: "start", agent: request.agent, version: request.version ?? null, input: request.input, tags: request.tags };
  }
  return { kind: "continue", run_id: request.run_id, input: request.input, on_busy: request.on_busy };
}
