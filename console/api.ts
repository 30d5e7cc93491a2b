/**
 * The console's only way to the service: the public API, with the key the person gave
 * (kept in this tab's sessionStorage, sent only as the Authorization header, never in a URL).
 */
const KEY_ITEM = "runs.console.key";

export function storedKey(): string {
  return sessionStorage.getItem(KEY_ITEM) ?? "";
}

export function storeKey(key: string): void {
  if (key) sessionStorage.setItem(KEY_ITEM, key);
  else sessionStorage.removeItem(KEY_ITEM);
}

/** An answer that was not 2xx: the contract's error body when there is one. */
export class ApiFailure extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly param: string | null = null,
  ) {
    super(message);
  }
}

export interface Answer<T> {
  status: number;
  body: T;
}

type Query = Record<string, string | number | boolean | string[] | undefined>;

export function withQuery(path: string, query: Query = {}): string {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    if (value === undefined || value === "") continue;
    for (const one of Array.isArray(value) ? value : [value]) params.append(name, String(one));
  }
  const text = params.toString();
  return text ? `${path}?${text}` : path;
}

function headers(extra: Record<string, string> = {}): Record<string, string> {
  return { authorization: `Bearer ${storedKey()}`, ...extra };
}

async function failureOf(res: Response): Promise<ApiFailure> {
  const text = await res.text().catch(() => "");
  try {
    const { error } = JSON.parse(text) as { error: { code: string; message: string; param?: string | null } };
    return new ApiFailure(res.status, error.code, error.message, error.param ?? null);
  } catch {
    return new ApiFailure(res.status, `http_${res.status}`, text.slice(0, 200) || res.statusText);
  }
}

/** One API call; a non-2xx answer throws its ApiFailure. */
export async function call<T>(method: string, path: string, body?: unknown, idempotent = method !== "GET"): Promise<Answer<T>> {
  const extra: Record<string, string> = {};
  if (body !== undefined) extra["content-type"] = "application/json";
  if (idempotent) extra["idempotency-key"] = `console-${crypto.randomUUID()}`;
  const res = await fetch(path, { method, headers: headers(extra), body: body === undefined ? undefined : JSON.stringify(body) });
  if (!res.ok) throw await failureOf(res);
  const text = await res.text();
  return { status: res.status, body: (text ? JSON.parse(text) : undefined) as T };
}

export interface StreamFrame {
  id?: string;
  event: string;
  data: string;
}

/**
 * Reads a Server-Sent Events answer with fetch (an EventSource cannot send the
 * Authorization header). `lastEventId` resumes after that event. Resolves when the
 * stream ends: at a turn's end, at 204 (nothing more), or when `signal` aborts.
 */
export async function stream(path: string, lastEventId: string | undefined, onFrame: (frame: StreamFrame) => void, signal: AbortSignal): Promise<void> {
  const res = await fetch(path, { headers: headers({ accept: "text/event-stream", ...(lastEventId ? { "last-event-id": lastEventId } : {}) }), signal });
  if (res.status === 204) return;
  if (!res.ok) throw await failureOf(res);
  if (!res.body) return;
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end: number;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const frame: StreamFrame = { event: "message", data: "" };
      const data: string[] = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "id") frame.id = text;
        else if (field === "event") frame.event = text;
        else if (field === "data") data.push(text);
      }
      frame.data = data.join("\n");
      if (frame.data) onFrame(frame);
    }
  }
}

/** Unix seconds as local date and time. */
export function when(seconds: number | null | undefined): string {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "—";
}

/** Shows an error of an API call (or of the page) to the person. */
export type Report = (err: unknown) => void;
