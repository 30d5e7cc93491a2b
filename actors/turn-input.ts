/**
 * A turn's input as the agent gets it: uploaded files inlined within the turn's file
 * budget, steering text from input parts, and the short retries around reading them.
 */
import { type Clock, type FileStore, type InputPart, isTransientFailure, MAX_TURN_FILE_BYTES } from "../src/index.js";

/**
 * Uploaded files named by `file_id` become inline parts for the agent (the stored
 * input keeps the id), in input order while they fit the turn's file budget (what
 * inline files left of it); a file past the budget becomes a short note. Sizes come
 * from the file records (read by id), so a file past the budget is never read.
 */
export async function resolveFiles(files: Pick<FileStore, "getMany" | "read">, workspaceId: string, input: InputPart[]): Promise<InputPart[]> {
  const ids = input.flatMap((part) => (part.type === "input_file" && part.file_id ? [part.file_id] : []));
  if (ids.length === 0) return input;
  const docs = new Map((await files.getMany(workspaceId, ids)).map((doc) => [doc._id, doc]));
  let budget = MAX_TURN_FILE_BYTES - input.reduce((n, part) => n + (part.type === "input_file" && part.file_data ? Math.floor((part.file_data.length * 3) / 4) : 0), 0);
  const out: InputPart[] = [];
  for (const part of input) {
    if (part.type !== "input_file" || !part.file_id) {
      out.push(part);
      continue;
    }
    const doc = docs.get(part.file_id);
    if (!doc) {
      out.push({ type: "input_text", text: `[file ${part.file_id} is not available]` });
      continue;
    }
    if (doc.bytes > budget) {
      out.push({ type: "input_text", text: `[file ${doc.filename} (${doc.media_type}, ${doc.bytes} bytes) is too large to include: a turn hands the model at most ${MAX_TURN_FILE_BYTES / 1024 / 1024} MiB of files]` });
      continue;
    }
    const file = await files.read(workspaceId, part.file_id);
    if (!file) {
      out.push({ type: "input_text", text: `[file ${part.file_id} is not available]` });
      continue;
    }
    budget -= file.bytes;
    out.push({ type: "input_file", filename: file.filename, media_type: file.media_type, file_data: file.data.toString("base64") });
  }
  return out;
}

/** The text of input parts, as a steer hands it to the running agent. */
export function inputText(input: InputPart[]): string {
  return input
    .map((part) => (part.type === "input_text" ? part.text : `[file ${part.filename ?? part.file_id ?? ""}]`))
    .join("\n");
}

/**
 * Runs `work`, again while it fails for a moment (`transient`, by default the store or NATS
 * away): `attempts` in all (4 by default), pausing 0.2, 0.4, 0.8, 1.6 s… between them; any
 * other failure, or the last, is thrown.
 */
export async function withRetries<T>(
  clock: Pick<Clock, "sleep">,
  work: () => Promise<T>,
  { attempts = 4, transient = isTransientFailure }: { attempts?: number; transient?: (err: unknown) => boolean } = {},
): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await work();
    } catch (err) {
      if (attempt >= attempts || !transient(err)) throw err;
      await clock.sleep(200 * 2 ** (attempt - 1));
    }
  }
}
