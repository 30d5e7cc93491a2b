import { z } from "zod";
import type { InputPart } from "./domain.js";
import { OnBusy } from "./commands.js";
import { jsonBody, parseWith, refuse } from "./request-schemas.js";

/**
 * `POST /api/v1/runs` bodies (spec rules 1–15, decisions §4): the schema the route
 * declares (validation and the OpenAPI document), and the normalized request the
 * runtime takes.
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

/**
 * A file's name as a tenant gives it, an upload's or an inline file's: at most this long,
 * no control characters (C0, DEL, C1) and no lone surrogates (which no UTF-8 can carry:
 * the name would read back as U+FFFD), as tags.
 */
export const MAX_FILENAME_CHARS = 255;
// Written as code-unit ranges (no u flag), so the OpenAPI pattern reads the same in any
// regex dialect; lone surrogates are refused apart ({@link hasLoneSurrogate}).
// eslint-disable-next-line no-control-regex
export const FILENAME_PATTERN = /^[^\u0000-\u001f\u007f-\u009f]*$/;
export const FILENAME_RULE = `1 to ${MAX_FILENAME_CHARS} characters without control characters or lone surrogates`;

/** Whether `text` holds a UTF-16 surrogate without its pair (no UTF-8 carries it: it reads back as U+FFFD). */
export function hasLoneSurrogate(text: string): boolean {
  return LONE_SURROGATE.test(text);
}

/**
 * A media type as a tenant gives it (an upload's, an inline file's): type/subtype and
 * parameters, a quoted value without control characters, at most 255 characters.
 */
// eslint-disable-next-line no-control-regex
export const MEDIA_TYPE_PATTERN = /^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}\/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}([ \t]*;[ \t]*[A-Za-z0-9!#$&^_.+-]+=("[^"\u0000-\u001f\u007f-\u009f\ud800-\udfff]*"|[A-Za-z0-9!#$&^_.+-]+))*$/;
export const MAX_MEDIA_TYPE_CHARS = 255;

/** A UTF-16 surrogate without its pair (without the u flag, the regex sees code units). */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

const TAG_PATTERN = "^(?=[\\s\\S]*\\S)[^\\u0000-\\u001F\\u007F-\\u009F\\u2028\\u2029]+$";

/** A tag: 1 to 64 characters (code points), not whitespace only, no control characters (C0, DEL, C1, U+2028/9); never trimmed or interpreted. */
export const TagSchema = z
  .string({ error: "a tag must be a string." })
  .min(1, `a tag must be 1 to ${MAX_TAG_LENGTH} characters.`)
  .max(MAX_TAG_LENGTH, `a tag must be 1 to ${MAX_TAG_LENGTH} characters.`)
  .regex(new RegExp(TAG_PATTERN, "u"), "a tag must not be whitespace only nor contain control characters.")
  // A lone surrogate cannot be stored as sent (the store keeps UTF-8, which has no such
  // character: it reads back as U+FFFD, and two such tags as one repeated).
  .refine((tag) => !hasLoneSurrogate(tag), "must be well-formed Unicode: a lone surrogate cannot be stored as sent.")
  .describe("1 to 64 characters, stored exactly as sent, case-sensitive; not whitespace-only, no control characters, no lone surrogates.");

function base64DecodedBytes(data: string): number | undefined {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(data) || data.length % 4 === 1) return undefined;
  const padding = data.endsWith("==") ? 2 : data.endsWith("=") ? 1 : 0;
  return Math.floor((data.length * 3) / 4) - padding;
}

const TEXT_TOO_LARGE = "The text of one input may hold at most 4 MiB; upload larger texts as files with POST /api/v1/files.";

// Parts may carry other fields (ignored and not stored).
const InputTextRequestSchema = z.looseObject({ type: z.literal("input_text"), text: z.string({ error: "must be a string." }) });

const InputFileRequestSchema = z
  .looseObject({
    type: z.literal("input_file"),
    file_id: z.string({ error: "must be a file id." }).regex(/^file_/, "must be a file id.").optional().describe("Id of an uploaded file (POST /api/v1/files)."),
    // As an upload's name (POST /api/v1/files).
    filename: z
      .string({ error: "must be a string." })
      .min(1, `must be ${FILENAME_RULE}.`)
      .max(MAX_FILENAME_CHARS, `must be ${FILENAME_RULE}.`)
      .regex(FILENAME_PATTERN, `must be ${FILENAME_RULE}.`)
      .refine((name) => !hasLoneSurrogate(name), `must be ${FILENAME_RULE}.`)
      .optional(),
    file_data: z.string({ error: "must be base64." }).optional().describe(`Base64 file content, at most ${MAX_INLINE_FILE_BYTES} bytes decoded (larger: 413 payload_too_large).`),
    media_type: z
      .string({ error: "must be a media type such as text/plain." })
      .trim()
      .max(MAX_MEDIA_TYPE_CHARS, "must be a media type such as text/plain.")
      .regex(MEDIA_TYPE_PATTERN, "must be a media type such as text/plain.")
      .optional(),
  })
  .superRefine((part, ctx) => {
    if (part.file_id !== undefined) return;
    if (part.filename === undefined || part.file_data === undefined) {
      ctx.addIssue({ code: "custom", message: "needs file_id, or filename with file_data.", path: [] });
    } else if (base64DecodedBytes(part.file_data) === undefined) {
      ctx.addIssue({ code: "custom", message: "must be base64 alone: for a data: URL, send what follows its comma, and its media type as media_type.", path: ["file_data"] });
    }
  })
  .describe("An uploaded file by file_id, or an inline file: filename and file_data (media_type optional).");

const InputPartRequestSchema = z.discriminatedUnion("type", [InputTextRequestSchema, InputFileRequestSchema], {
  error: (issue) => (typeof issue.input !== "object" || issue.input === null || Array.isArray(issue.input) ? "must be an object." : "must be input_text or input_file."),
});

/** A turn's input as sent: a string (one input_text part) or up to 32 parts, with byte budgets across them. */
export const InputSchema = z
  .union(
    [
      z.string().superRefine((text, ctx) => {
        if (Buffer.byteLength(text) > MAX_TURN_TEXT_BYTES) refuse(ctx, "input", TEXT_TOO_LARGE, "payload_too_large");
      }),
      z
        .array(InputPartRequestSchema)
        .min(1, "must hold at least one part.")
        .max(MAX_INPUT_PARTS, `may hold at most ${MAX_INPUT_PARTS} parts.`)
        .superRefine((parts, ctx) => {
          let textBytes = 0;
          let inlineBytes = 0;
          for (const part of parts) {
            if (part.type === "input_text") textBytes += Buffer.byteLength(part.text);
            else if (part.file_id === undefined) {
              // A part refused for its own fields is still counted here (zod runs this check
              // anyway): without base64 data it adds nothing; its own refusal is the answer.
              const bytes = part.file_data === undefined ? undefined : base64DecodedBytes(part.file_data);
              if (bytes === undefined) continue;
              if (bytes > MAX_INLINE_FILE_BYTES) {
                return refuse(ctx, "input", "An inline file may hold at most 4 MiB; upload larger files with POST /api/v1/files.", "payload_too_large");
              }
              inlineBytes += bytes;
            }
          }
          if (textBytes > MAX_TURN_TEXT_BYTES) return refuse(ctx, "input", TEXT_TOO_LARGE, "payload_too_large");
          if (inlineBytes > MAX_TURN_INLINE_BYTES) {
            refuse(ctx, "input", "The inline files of one input may hold at most 4 MiB together; upload larger files with POST /api/v1/files.", "payload_too_large");
          }
        }),
    ],
    { error: (issue) => (issue.input === undefined ? "is required." : "must be a string or an array of input parts.") },
  )
  .describe(
    "A string (one input_text part) or an array of InputPart objects: input_text {text}, input_file {file_id} or inline input_file {filename, file_data, media_type?}. At most 32 parts (400 past that), 4 MiB of text and 4 MiB of inline files (decoded) in all (413 payload_too_large past those).",
  );

/** Normalizes a validated input: a string becomes one input_text part; only known fields are kept. */
export function inputParts(input: z.output<typeof InputSchema>): InputPart[] {
  if (typeof input === "string") return [{ type: "input_text", text: input }];
  return input.map((part): InputPart => {
    if (part.type === "input_text") return { type: "input_text", text: part.text };
    if (part.file_id !== undefined) return { type: "input_file", file_id: part.file_id };
    const out: InputPart = { type: "input_file", filename: part.filename!, file_data: part.file_data! };
    if (part.media_type !== undefined) out.media_type = part.media_type;
    return out;
  });
}

const flag = (what: string) => z.boolean({ error: "must be a boolean." }).nullable().optional().describe(what);

/** `POST /api/v1/runs` body (spec rules 1–15, decisions §4): validated by the route, normalized by {@link toRunRequest}. */
export const RunRequestBodySchema = jsonBody({
  agent: z
    .string({ error: "must be an agent id." })
    .min(1, "must be an agent id.")
    .nullable()
    .optional()
    .describe("Starts a new run on this agent. Exactly one of agent and run_id (neither: 400 param agent; both: 400 param run_id)."),
  run_id: z.string({ error: "must be a run id." }).min(1, "must be a run id.").nullable().optional().describe("Continues this run."),
  version: z
    .int({ error: "must be a positive whole number." })
    .min(1, "must be a positive whole number.")
    .optional()
    .describe("Only with agent: start on exactly this deployment version without activating it."),
  input: InputSchema,
  background: flag("Answer 202 as soon as the turn is admitted."),
  stream: flag("Answer with a Server-Sent Events stream. Not together with background (400 param stream)."),
  on_busy: z.enum(OnBusy, { error: "must be queue, steer or reject." }).nullable().optional().describe("Only with run_id; default queue."),
  tags: z.array(TagSchema, { error: "must be an array of strings." }).optional().describe(`Only with agent; at most ${MAX_TAGS} distinct tags.`),
}).superRefine((body, ctx) => {
  const hasAgent = body.agent !== undefined && body.agent !== null;
  const hasRun = body.run_id !== undefined && body.run_id !== null;
  if (!hasAgent && !hasRun) return refuse(ctx, "agent", "Give agent to start a run or run_id to continue one.");
  if (hasAgent && hasRun) return refuse(ctx, "run_id", "Give either agent or run_id, not both.");
  if (body.background && body.stream) return refuse(ctx, "stream", "background and stream cannot both be true.");
  if (hasRun) {
    if (body.version !== undefined) return refuse(ctx, "version", "version applies only when starting a run with agent.");
    if (body.tags !== undefined) return refuse(ctx, "tags", "tags apply only when starting a run; use POST /api/v1/runs/{runId}/tags.");
  } else {
    if (body.on_busy !== undefined) return refuse(ctx, "on_busy", "on_busy applies only when continuing a run.");
    if (new Set(body.tags).size > MAX_TAGS) refuse(ctx, "tags", `tags may hold at most ${MAX_TAGS} distinct tags.`);
  }
});

/** A validated body as the runtime takes it: start or continue, input as parts, tags distinct and sorted, defaults applied. */
export function toRunRequest(body: z.output<typeof RunRequestBodySchema>): RunRequest {
  const background = body.background ?? false;
  const stream = body.stream ?? false;
  const input = inputParts(body.input);
  if (body.run_id !== undefined && body.run_id !== null) {
    return { kind: "continue", run_id: body.run_id, input, on_busy: body.on_busy ?? OnBusy.queue, background, stream };
  }
  const tags = [...new Set(body.tags ?? [])].sort();
  return { kind: "start", agent: body.agent!, version: body.version, input, tags, background, stream };
}

/** Validates and normalizes a `POST /api/v1/runs` body (for callers outside a route). */
export function parseRunRequest(raw: unknown): RunRequest {
  if (raw === undefined) raw = null;
  return toRunRequest(parseWith(RunRequestBodySchema, raw));
}

/** The idempotency fingerprint: the normalized request without delivery flags. */
export function runRequestFingerprint(request: RunRequest): unknown {
  if (request.kind === "start") {
    return { kind: "start", agent: request.agent, version: request.version ?? null, input: request.input, tags: request.tags };
  }
  return { kind: "continue", run_id: request.run_id, input: request.input, on_busy: request.on_busy };
}
