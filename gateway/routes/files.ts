import { createHash } from "node:crypto";
import type { Readable } from "node:stream";
import type { FastifyInstance, FastifyRequest } from "fastify";
import { z } from "zod";
import multipart from "@fastify/multipart";
import { ApiError, type Clock, FILENAME_PATTERN, FILENAME_RULE, hasLoneSurrogate, MAX_FILENAME_CHARS, MAX_MEDIA_TYPE_CHARS, MEDIA_TYPE_PATTERN, decideUpload, decisionError, type FileDoc, invalid, type ReceivedObject, StoreUnavailableError, unixSeconds, uploadFingerprint, type UploadLimits, type UploadSession, UploadSourceError, UploadState } from "../../src/index.js";
import { authOf, MULTIPART_ONLY, sendError, type GatewayContext } from "../context.js";
import { idempotencyKeyOf } from "../idempotency.js";
import type { UploadSlot } from "../upload-slots.js";
import { retryAfterSeconds } from "../unavailable.js";
import { type Operation, route, fileId } from "../operation.js";
import { FileSchema, FileUploadRequestSchema } from "../schemas.js";

/**
 * POST /api/v1/files and GET /api/v1/files/{fileId} (decisions §6).
 *
 * The body is multipart/form-data: optional `filename` and `media_type` fields, then
 * one part named `file` (it is a file part whether or not it carries a filename). The
 * fields must come before the file part, because the key's fingerprint (filename and
 * media type) is settled when the file part begins; a part after it is 400 naming it.
 * Without the fields, the file part's own filename and Content-Type are used.
 *
 * Idempotency (spec POST /api/v1/files): see `decideUpload` in src/file-store.ts.
 */

export function renderFile(file: FileDoc) {
  return {
    id: file._id,
    object: "file" as const,
    filename: file.filename,
    media_type: file.media_type,
    bytes: file.bytes,
    sha256: file.sha256,
    created_at: unixSeconds(file.created_at),
  };
}

function checkFilename(value: string, param: string): string {
  if (value.length === 0 || value.length > MAX_FILENAME_CHARS || !FILENAME_PATTERN.test(value) || hasLoneSurrogate(value)) throw invalid(param, `${param} must be ${FILENAME_RULE}.`);
  return value;
}

function checkMediaType(value: string, param: string): string {
  const trimmed = value.trim();
  if (trimmed.length > MAX_MEDIA_TYPE_CHARS || !MEDIA_TYPE_PATTERN.test(trimmed)) throw invalid(param, `${param} must be a media type such as text/plain.`);
  return trimmed;
}

/** The sha256 and size of a repeated upload's body, read and dropped within `timeLimitMs`. */
async function digestOf(source: Readable, timeLimitMs: number, clock: Clock): Promise<{ sha256: string; bytes: number }> {
  const hash = createHash("sha256");
  let bytes = 0;
  const timer = clock.after(timeLimitMs, () => source.destroy(new ApiError("request_timeout")));
  try {
    for await (const chunk of source) {
      hash.update(chunk as Buffer);
      bytes += (chunk as Buffer).length;
    }
  } finally {
    timer.cancel();
  }
  return { sha256: hash.digest("hex"), bytes };
}

const MAX_BOUNDARY_CHARS = 70;

/** Translates what can go wrong while reading the form into the API's answer. */
function uploadError(err: unknown, request: FastifyRequest): unknown {
  if (err instanceof ApiError) return err;
  if (err instanceof StoreUnavailableError) {
    request.log.warn({ err: err.cause }, "store unavailable during upload");
    return new ApiError("runtime_unavailable", { retryAfterS: retryAfterSeconds() });
  }
  const source = err instanceof UploadSourceError ? err.cause : err;
  const e = source as { code?: string; statusCode?: number; message?: string };
  // Before the interruption check: past a limit the body is not read on, which looks like one.
  if (e?.code === "FST_PARTS_LIMIT" || e?.code === "FST_FILES_LIMIT" || e?.code === "FST_FIELDS_LIMIT") {
    return invalid("file", "Send one file part named file and at most the fields filename and media_type.");
  }
  if (e?.code === "FST_MP_PREMATURE_CLOSE" || request.raw.destroyed) {
    return invalid("file", "The upload was interrupted before the file ended.");
  }
  // busboy's own parse errors ("Multipart: Boundary not found", "Malformed part header", …) are plain Errors.
  const parseError = typeof e?.message === "string" && /^(Multipart: |Malformed |Unexpected end of )/.test(e.message);
  if (parseError || err instanceof UploadSourceError || (typeof e?.statusCode === "number" && e.statusCode >= 400 && e.statusCode < 500)) {
    return invalid("file", "The multipart body is malformed.");
  }
  return err;
}

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const FILE_OPERATIONS = {
  uploadFile: {
    method: "post",
    path: "/api/v1/files",
    operationId: "uploadFile",
    summary: "Upload a file for input_file",
    description:
      "A repeat after a finished upload returns the file unchanged; while the first still runs: 503 upload_in_progress with Retry-After; 409 conflict when the key was used for another file or its upload expired. At most 20 minutes (408 request_timeout) and 512 MiB (413).",
    tag: "files",
    scope: "files:write",
    rate: "expensive",
    idempotencyKey: true,
    body: { schema: FileUploadRequestSchema, required: true, multipart: true },
    success: { 201: { description: "The stored file.", json: FileSchema } },
    errors: { 408: ["request_timeout"], 409: ["conflict"], 503: ["upload_in_progress"] },
  },
  getFile: {
    method: "get",
    path: "/api/v1/files/{fileId}",
    operationId: "getFile",
    summary: "Retrieve a file's metadata",
    tag: "files",
    scope: "files:read",
    params: z.object(fileId),
    success: { 200: { description: "The file.", json: FileSchema } },
    errors: { 404: ["not_found"] },
  },
} satisfies Record<string, Operation>;

/** The files routes, with the upload limits of `ctx.config.files` (RUNS_MAX_FILE_BYTES …). */
export function fileRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    const limits: UploadLimits = ctx.config.files;
    const files = ctx.files;

    // Scoped to this plugin. The multipart parser does not read the body itself, so the
    // app's 16 MiB bodyLimit does not apply; the file's size is capped by `receive`
    // (busboy is told one byte more, so an over-size file is seen, not silently cut).
    await app.register(multipart, {
      limits: { fileSize: limits.maxFileBytes + 1, files: 1, fields: 4, parts: 5, fieldSize: 4096, headerPairs: 50 },
      throwFileSizeLimit: false,
      isPartAFile: (fieldName) => fieldName === "file",
    });

    route(app, FILE_OPERATIONS.uploadFile, async (request, reply) => {
      const auth = authOf(request);
      const key = idempotencyKeyOf(request)!;
      if (!request.isMultipart()) throw invalid("file", MULTIPART_ONLY);
      // RFC 2046 bounds a boundary at 70 characters; the parser fails (a 500) past 252.
      const boundary = /;\s*boundary=(?:"([^"]*)"|([^;\s]*))/i.exec(request.headers["content-type"] ?? "");
      if ((boundary?.[1] ?? boundary?.[2] ?? "").length > MAX_BOUNDARY_CHARS) {
        throw invalid("file", `The multipart boundary may be at most ${MAX_BOUNDARY_CHARS} characters long (RFC 2046).`);
      }
      const workspaceId = auth.workspace._id;

      // Refusals that need no fingerprint are answered before reading the body.
      const early = decideUpload(await files.getUpload(files.uploadId(workspaceId, key)), undefined, ctx.clock.nowMs(), limits.takeoverMs);
      // Answered before the body is read, without closing the connection: closed under a
      // client still sending, it failed the client's write (EPIPE, "fetch failed") before
      // the answer was read (found by a probe; seen in a CI run). Node reads and drops the
      // rest; the body deadline (gateway/app.ts, watchBodyArrival) ends one still short then.
      if (early.kind === "in_progress" || early.kind === "conflict") return sendError(reply, decisionError(early)!);

      const fields: { filename?: string; media_type?: string } = {};
      let meta: { filename: string; media_type: string } | undefined;
      let session: UploadSession | undefined;
      let received: ReceivedObject | undefined;
      let replayed: FileDoc | undefined;
      let slot: UploadSlot | undefined;
      try {
        for await (const part of request.parts()) {
          if (part.type === "field") {
            if (replayed) continue;
            if (meta) throw invalid(part.fieldname, "Send filename and media_type before the file part.");
            if (!part.fieldname) throw invalid(null, "A form field has no name; send file, filename and media_type.");
            if (part.fieldname !== "filename" && part.fieldname !== "media_type") {
              throw invalid(part.fieldname, `Unknown form field ${part.fieldname}; expected file, filename and media_type.`);
            }
            if (part.valueTruncated || typeof part.value !== "string") throw invalid(part.fieldname, `${part.fieldname} is too long.`);
            if (fields[part.fieldname] !== undefined) throw invalid(part.fieldname, `${part.fieldname} is given twice; send it once.`);
            fields[part.fieldname] = part.fieldname === "filename" ? checkFilename(part.value, "filename") : checkMediaType(part.value, "media_type");
            continue;
          }
          const filename = fields.filename ?? part.filename;
          if (filename === undefined || filename === "") throw invalid("filename", "Give a filename field or a filename on the file part.");
          meta = {
            filename: checkFilename(filename, "filename"),
            media_type: fields.media_type ?? checkMediaType(part.mimetype || "application/octet-stream", "media_type"),
          };
          const claim = await files.claim(workspaceId, key, uploadFingerprint(meta), limits.takeoverMs);
          if (claim.kind === "replay") {
            // The first upload finished: the new body is hashed and dropped, never stored;
            // other content under the same key is a different file (spec: 409 conflict).
            const repeat = await digestOf(part.file, limits.timeLimitMs, ctx.clock);
            if (repeat.sha256 !== claim.file.sha256 || repeat.bytes !== claim.file.bytes) {
              throw new ApiError("conflict", { param: "Idempotency-Key", message: "This Idempotency-Key was used for a different file; upload again with a new key." });
            }
            replayed = claim.file;
            continue;
          }
          session = claim.session;
          // Concurrent uploads per workspace are capped (decisions §7), across nodes: an
          // upload runs in one of the workspace's slots, taken once the key is this
          // request's (a replay is not an upload; a repeat refused by the claim takes none).
          const cap = ctx.config.uploadConcurrency[auth.workspace.plan];
          slot = await ctx.uploadSlots.take(workspaceId, cap, session.fileId).catch((err: unknown) => {
            throw new StoreUnavailableError(err);
          });
          if (!slot) {
            throw new ApiError("rate_limited", {
              retryAfterS: 1,
              message: `The workspace already runs ${cap} uploads at once; retry when one finishes.`,
            });
          }
          const held = slot;
          // The slot is held while bytes arrive, as the upload record's heartbeat is. An
          // upload silent past the hold may find its slot taken by another upload when its
          // bytes come again: it stops, so the workspace never runs more than its cap.
          received = await files.receive(session, part.file, limits, async () => {
            if (await held.refresh().catch(() => true)) return;
            throw new ApiError("rate_limited", {
              retryAfterS: 1,
              message: `The upload sent nothing for ${Math.round(limits.takeoverMs / 1000)} s and another took its place among the workspace's ${cap} concurrent uploads; upload again.`,
            });
          });
        }
        if (replayed) return reply.status(201).send(renderFile(replayed));
        if (!session || !received || !meta) throw invalid("file", "The form has no part named file.");
        const retentionMs = ctx.config.retention.fileS[auth.workspace.plan] * 1000;
        return reply.status(201).send(renderFile(await files.finish(session, meta, received, retentionMs)));
      } catch (err) {
        if (session && !replayed) {
          const timedOut = err instanceof ApiError && err.code === "request_timeout";
          await files.abandon(session, timedOut ? UploadState.expired : UploadState.failed);
        }
        const answer = uploadError(err, request);
        if (answer instanceof ApiError) return sendError(reply, answer);
        throw answer;
      } finally {
        await slot?.release();
      }
    });

    route(app, FILE_OPERATIONS.getFile, async (request) => {
      const auth = authOf(request);
      const file = await files.get(auth.workspace._id, request.params.fileId);
      if (!file) throw new ApiError("not_found", { param: "fileId", message: `No file ${request.params.fileId}.` });
      return renderFile(file);
    });
  };
}
