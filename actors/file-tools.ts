/**
 * The file tools (`read`, `write`, `edit`, `ls`): small shell scripts run in the run's
 * sandbox like any command, so a FIFO, a device, a huge file or a link swapped between
 * check and open can only block or mislead the sandboxed process (see workspace-tools.ts).
 */
import type { AgentTool } from "@mariozechner/pi-agent-core";
import { Type, type Static } from "@mariozechner/pi-ai";
import { describeLimit, formatBytes } from "./sandbox-limits.js";
import { Exit, fileError, requireExit, textResult, type ToolRunner } from "./tool-runner.js";

const DEFAULT_READ_LINES = 2000;
const MAX_LS_ENTRIES = 1000;
/** `edit` works on files up to this size (it reads the whole file). */
const MAX_EDIT_BYTES = 8 * 1024 * 1024;
/** `ls` reads at most this much of a directory listing. */
const MAX_LS_BYTES = 1024 * 1024;

// ---------------------------------------------------------------------------------
// read

const readParameters = Type.Object({
  path: Type.String({ description: "File path, relative to the workspace." }),
  offset: Type.Optional(Type.Integer({ minimum: 1, description: "First line to return (1-based). Default 1." })),
  limit: Type.Optional(
    Type.Integer({ minimum: 1, description: `Number of lines to return. Default ${DEFAULT_READ_LINES}.` }),
  ),
});

/**
 * Prints the file's newline count on the first line, then up to `$3` lines from
 * line `$2`, at most `$4` bytes. Refuses anything but a readable regular text file
 * (checked in the sandbox; a file swapped for a FIFO afterwards only blocks the
 * sandbox until the command time limit or a cancel).
 */
const READ_SCRIPT = `exec 2>/dev/null; f=$1
[ -e "$f" ] || exit ${Exit.missing}
[ -d "$f" ] && exit ${Exit.directory}
[ -f "$f" ] || exit ${Exit.special}
[ -r "$f" ] || exit ${Exit.unreadable}
n=$(head -c 8192 -- "$f" | tr -dc '\\000' | wc -c)
[ "$n" -eq 0 ] || { stat -c %s -- "$f"; exit ${Exit.binary}; }
wc -l < "$f" || exit 13
tail -n "+$2" -- "$f" | head -n "$3" | head -c "$4"`;

export function readTool(runner: ToolRunner): AgentTool<typeof readParameters> {
  return {
    name: "read",
    label: "Read file",
    description:
      `Read a text file from the workspace. Returns up to ${DEFAULT_READ_LINES} lines ` +
      `(${formatBytes(runner.limits.outputBytes)}) from \`offset\`; use offset and limit for the rest.`,
    parameters: readParameters,
    async execute(_id, params: Static<typeof readParameters>, signal) {
      const rel = await runner.path(params.path);
      const offset = params.offset ?? 1;
      const limit = params.limit ?? DEFAULT_READ_LINES;
      const maxBytes = runner.limits.outputBytes;
      // One byte over the cap tells a cut from an exact fit.
      const outcome = await runner.run(["/bin/sh", "-c", READ_SCRIPT, "sh", rel, String(offset), String(limit), String(maxBytes + 1)], {
        signal,
        outputBytes: maxBytes + 64,
      });
      const code = requireExit(outcome, runner, `Reading ${params.path}`);
      const out = outcome.output.toString("utf8");
      if (code === Exit.binary) throw new Error(`${params.path} is a binary file (${out.trim()} bytes)`);
      if (code !== 0) throw fileError(code, params.path, outcome);
      const newline = out.indexOf("\n");
      const lines = Number(out.slice(0, newline)) + 1;
      let body = out.slice(newline + 1);
      if (offset > lines && !(offset === 1 && lines === 1)) {
        throw new Error(`Offset ${offset} is past the end of ${params.path} (${lines} lines)`);
      }
      let truncatedBytes = false;
      if (Buffer.byteLength(body) > maxBytes) {
        // Keep whole lines only.
        body = body.slice(0, Math.max(0, body.lastIndexOf("\n", maxBytes)));
        truncatedBytes = true;
      }
      // `tail | head -n` keeps a final newline that split() would count as an empty line.
      let selected = body.split("\n");
      if (!truncatedBytes && body.endsWith("\n") && offset - 1 + selected.length > lines) selected = selected.slice(0, -1);
      if (selected.length > limit) selected = selected.slice(0, limit);
      let text = selected.join("\n");
      const last = offset - 1 + selected.length;
      if (last < lines || truncatedBytes) {
        text += `\n[showing lines ${offset}-${last} of ${lines}; continue with offset ${last + 1}]`;
      }
      return textResult(text, { lines });
    },
  };
}

// ---------------------------------------------------------------------------------
// write

const writeParameters = Type.Object({
  path: Type.String({ description: "File path, relative to the workspace. Parent directories are created." }),
  content: Type.String({ description: "The complete new content of the file." }),
});

/** Writes standard input to `$1`, creating parent directories. */
const WRITE_SCRIPT = `exec 2>&1; f=$1
case "$f" in */*) mkdir -p -- "\${f%/*}" || exit ${Exit.writeFailed};; esac
[ -d "$f" ] && exit ${Exit.directory}
cat > "$f" || exit ${Exit.writeFailed}`;

export function writeTool(runner: ToolRunner): AgentTool<typeof writeParameters> {
  return {
    name: "write",
    label: "Write file",
    description: "Create or overwrite a file in the workspace with the given content.",
    parameters: writeParameters,
    async execute(_id, params: Static<typeof writeParameters>, signal) {
      await runner.refuseWhenOverDisk();
      const rel = await runner.path(params.path);
      if (rel === ".") throw new Error(`${params.path} is the workspace directory`);
      const content = Buffer.from(params.content, "utf8");
      await writeFile(runner, rel, params.path, content, signal);
      return textResult(`Wrote ${content.length} bytes to ${params.path}`, { bytes: content.length });
    },
  };
}

async function writeFile(runner: ToolRunner, rel: string, shown: string, content: Buffer, signal: AbortSignal | undefined): Promise<void> {
  const outcome = await runner.run(["/bin/sh", "-c", WRITE_SCRIPT, "sh", rel], { signal, stdin: content });
  const code = requireExit(outcome, runner, `Writing ${shown}`);
  if (code !== 0) {
    const note = runner.limitNotes(outcome);
    const error = fileError(code, shown, outcome);
    throw note ? new Error(`${error.message}\n${note.trim()}`) : error;
  }
  const over = outcome.limits.find((hit) => hit === "disk" || hit === "files" || hit === "host_disk");
  if (over) throw new Error(`Wrote ${shown}, but ${describeLimit(over, runner.limits)}`);
}

// ---------------------------------------------------------------------------------
// edit

const editParameters = Type.Object({
  path: Type.String({ description: "File path, relative to the workspace." }),
  old_text: Type.String({ description: "Exact text to replace; must occur exactly once in the file." }),
  new_text: Type.String({ description: "Replacement text." }),
});

/** Prints the whole of a readable regular file `$1`, refusing anything bigger than `$2` bytes. */
const CAT_SCRIPT = `exec 2>/dev/null; f=$1
[ -e "$f" ] || exit ${Exit.missing}
[ -d "$f" ] && exit ${Exit.directory}
[ -f "$f" ] || exit ${Exit.special}
[ -r "$f" ] || exit ${Exit.unreadable}
[ "$(stat -c %s -- "$f")" -le "$2" ] || exit ${Exit.tooLarge}
cat -- "$f"`;

export function editTool(runner: ToolRunner): AgentTool<typeof editParameters> {
  return {
    name: "edit",
    label: "Edit file",
    description:
      "Replace one exact occurrence of old_text with new_text in a workspace file. " +
      "old_text must match exactly once; include surrounding lines to make it unique.",
    parameters: editParameters,
    async execute(_id, params: Static<typeof editParameters>, signal) {
      if (params.old_text.length === 0) throw new Error("old_text must not be empty");
      await runner.refuseWhenOverDisk();
      const rel = await runner.path(params.path);
      const read = await runner.run(["/bin/sh", "-c", CAT_SCRIPT, "sh", rel, String(MAX_EDIT_BYTES)], {
        signal,
        outputBytes: MAX_EDIT_BYTES + 1,
      });
      const code = requireExit(read, runner, `Reading ${params.path}`);
      if (code === Exit.tooLarge) throw new Error(`${params.path} is larger than ${formatBytes(MAX_EDIT_BYTES)}; edit it with bash`);
      if (code !== 0) throw fileError(code, params.path, read);
      const content = read.output.toString("utf8");
      const { first, occurrences } = findOccurrences(content, params.old_text);
      if (first < 0) throw new Error(`old_text was not found in ${params.path}`);
      if (occurrences > 1) {
        throw new Error(
          `old_text occurs ${occurrences} times in ${params.path}; include more context to make it unique`,
        );
      }
      // Slicing, not String.replace, so `$` in new_text stays literal.
      const updated = content.slice(0, first) + params.new_text + content.slice(first + params.old_text.length);
      await writeFile(runner, rel, params.path, Buffer.from(updated, "utf8"), signal);
      return textResult(`Edited ${params.path}`, { path: params.path });
    },
  };
}

/**
 * Where `needle` first occurs in `haystack` (-1: nowhere) and how many times, not
 * overlapping: one Knuth-Morris-Pratt pass, linear in both. The model writes the needle and
 * the workspace holds the file (up to 8 MiB): String.indexOf took 5 s on a 1 MiB file for a
 * 10,000-character `a…ab a…a`, and minutes at the largest sizes (found by an audit).
 */
export function findOccurrences(haystack: string, needle: string): { first: number; occurrences: number } {
  const m = needle.length;
  if (m === 0 || m > haystack.length) return { first: -1, occurrences: 0 };
  // fallback[i]: the length of the longest proper prefix of needle[0..i] that is also its suffix.
  const fallback = new Int32Array(m);
  for (let i = 1, k = 0; i < m; i++) {
    while (k > 0 && needle.charCodeAt(i) !== needle.charCodeAt(k)) k = fallback[k - 1]!;
    if (needle.charCodeAt(i) === needle.charCodeAt(k)) k++;
    fallback[i] = k;
  }
  let first = -1;
  let occurrences = 0;
  for (let i = 0, k = 0; i < haystack.length; i++) {
    while (k > 0 && haystack.charCodeAt(i) !== needle.charCodeAt(k)) k = fallback[k - 1]!;
    if (haystack.charCodeAt(i) === needle.charCodeAt(k)) k++;
    if (k === m) {
      if (first < 0) first = i - m + 1;
      occurrences++;
      k = 0; // not overlapping
    }
  }
  return { first, occurrences };
}

// ---------------------------------------------------------------------------------
// ls

const lsParameters = Type.Object({
  path: Type.Optional(Type.String({ description: 'Directory, relative to the workspace. Default ".".' })),
});

/** NUL-separated entries of directory `$1`, each its type letter (find's %y) then its name. */
const LS_SCRIPT = `exec 2>/dev/null; d=$1
[ -e "$d" ] || exit ${Exit.missing}
[ -d "$d" ] || exit ${Exit.notDirectory}
find "$d/" -mindepth 1 -maxdepth 1 -printf '%y%f\\0' | head -c "$2"`;

export function lsTool(runner: ToolRunner): AgentTool<typeof lsParameters> {
  return {
    name: "ls",
    label: "List directory",
    description: "List a workspace directory: one entry per line, directories end with /, links with @.",
    parameters: lsParameters,
    async execute(_id, params: Static<typeof lsParameters>, signal) {
      const target = params.path ?? ".";
      const rel = await runner.path(target);
      const outcome = await runner.run(["/bin/sh", "-c", LS_SCRIPT, "sh", rel, String(MAX_LS_BYTES)], {
        signal,
        outputBytes: MAX_LS_BYTES,
      });
      const code = requireExit(outcome, runner, `Listing ${target}`);
      if (code !== 0) throw fileError(code, target, outcome);
      const raw = outcome.output.toString("utf8").split("\0");
      const complete = raw.pop() === "";
      const names = raw
        .filter((entry) => entry.length > 1)
        .map((entry) => entry.slice(1) + (entry[0] === "d" ? "/" : entry[0] === "l" ? "@" : ""))
        .sort((a, b) => a.localeCompare(b));
      const shown = names.slice(0, MAX_LS_ENTRIES);
      let text = shown.length > 0 ? shown.join("\n") : "(empty directory)";
      if (names.length > shown.length || !complete) {
        text += `\n[${complete ? names.length - shown.length : "more than " + (names.length - shown.length)} more entries not shown]`;
      }
      return textResult(text, { entries: names.length });
    },
  };
}
