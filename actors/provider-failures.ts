/**
 * A failed assistant message translated to a turn error code, in one function
 * ({@link providerFailure}), and error text made safe to store and show. A tenant's own
 * `openai-compatible` endpoint is summarised, never echoed.
 */
import type { AssistantMessage } from "@mariozechner/pi-ai";
import { providerErrorCode, scriptedErrorCode, TurnErrorCode } from "../src/index.js";
import { OPENAI_COMPATIBLE } from "./model-resolution.js";
import { scriptedErrorStatus } from "./scripted-model.js";

const STATUS_PATTERNS = [
  /^\s*(\d{3})\b/, // OpenAI and Anthropic SDKs: "429 Rate limit reached…"
  // Each run of blanks belongs to one group only: three optional runs over the same blanks
  // had made "status" and 50,000 spaces take seconds (a script's or endpoint's message).
  /\bstatus(?:\s*code)?(?:\s*[:=])?\s*(\d{3})\b/i, // "got status: 503", "status code 401"
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
  if (scripted !== undefined) return { code: scriptedErrorCode(scripted), message: text };
  // A status or a transport failure is named near the start; the rest (up to whatever size
  // a script or a tenant's endpoint sends) is not searched.
  const head = (message.errorMessage ?? "").slice(0, MAX_SEARCHED_CHARS);
  const status = parseStatus(head);
  // A tenant's own endpoint: its answer is summarised, never echoed (it could carry
  // whatever the endpoint wants stored and shown, or reflect what it was sent).
  if (message.provider === OPENAI_COMPATIBLE) {
    if (status !== undefined) return { code: providerErrorCode(status), message: `The model endpoint answered HTTP ${status}.` };
    if (TRANSPORT_PATTERN.test(head)) return { code: TurnErrorCode.provider_transport_failed, message: "The model endpoint could not be reached, or its answer broke off." };
    return { code: TurnErrorCode.provider_failure, message: "The model endpoint's answer could not be used." };
  }
  if (status !== undefined) return { code: providerErrorCode(status), message: withProvider(message, text) };
  if (TRANSPORT_PATTERN.test(head)) {
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
const MAX_SEARCHED_CHARS = 4096;

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
