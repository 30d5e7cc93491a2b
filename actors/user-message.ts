/**
 * The user message of a turn: input text, and inline files as text, image content (when
 * the model accepts images) or a note saying what was left out.
 */
import type { ImageContent, TextContent, UserMessage } from "@mariozechner/pi-ai";
import { assertNever, type InputPart } from "../src/index.js";

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
    // Base64 alone: a request's file_data is checked so (src/run-request.ts).
    const mediaType = part.media_type;
    const bytes = Buffer.from(part.file_data, "base64");
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

/** The text parts of an input, joined. */
export function inputText(input: readonly InputPart[]): string {
  return input
    .filter((part): part is Extract<InputPart, { type: "input_text" }> => part.type === "input_text")
    .map((part) => part.text)
    .join("\n");
}
