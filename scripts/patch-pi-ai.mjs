#!/usr/bin/env node
/**
 * Run after every npm install (package.json's postinstall; the image copies this file before
 * its `npm ci`). pi-ai's providers parse a streamed tool call's whole argument text again at
 * every delta, so a call's cost grows with the square of its length: a tenant's own
 * openai-compatible endpoint streaming 100,000 one-character deltas froze a node for
 * minutes, and an ordinary model writing a 64 KiB file in small tokens cost ~24 s of CPU
 * (found by a probe). This makes each delta's parse geometric (only once the text has
 * doubled since the last parse: linear in all); the parse at the call's end, which the
 * tool runs with, is untouched. Idempotent; it says what it did and fails when a provider
 * no longer has the line it rewrites (a new pi-ai: look again).
 */
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const MARK = "/* runs: geometric streaming parse */";
const HELPER = `${MARK}
const __runsParsedAt = new WeakMap();
function __runsStreamingParse(block, text) {
    const at = __runsParsedAt.get(block) ?? 0;
    if (text.length < 2 * at) return block.arguments;
    __runsParsedAt.set(block, text.length);
    return parseStreamingJson(text);
}
`;

/**
 * Each provider's delta lines: the append to a block's argument text, then the parse of all
 * of it (`$2` the block, `$3` its text), which becomes the geometric parse.
 */
const DELTA = (append) => new RegExp(`(${append}\\s*\\n\\s*)(block|currentBlock)\\.arguments = parseStreamingJson\\(\\2\\.(partialArgs|partialJson)\\);`);
const DELTAS = {
  "openai-completions.js": DELTA(String.raw`block\.partialArgs = \(block\.partialArgs \?\? ""\) \+ toolCall\.function\.arguments;`),
  "anthropic.js": DELTA(String.raw`block\.partialJson \+= event\.delta\.partial_json;`),
  "openai-responses-shared.js": DELTA(String.raw`currentBlock\.partialJson \+= event\.delta;`),
};

const root = fileURLToPath(new URL("../node_modules/@mariozechner/pi-ai/", import.meta.url));
if (!existsSync(root)) {
  console.log("patch-pi-ai: @mariozechner/pi-ai is not installed; nothing to patch");
  process.exit(0);
}
let failed = false;
for (const [file, pattern] of Object.entries(DELTAS)) {
  const target = path.join(root, "dist", "providers", file);
  let text = readFileSync(target, "utf8");
  if (text.includes(MARK)) continue;
  if (!pattern.test(text)) {
    console.error(`patch-pi-ai: ${file} no longer holds the line this rewrites`);
    failed = true;
    continue;
  }
  text = text.replace(pattern, "$1$2.arguments = __runsStreamingParse($2, $2.$3);");
  // After the imports: the helper uses the module's own parseStreamingJson.
  const lastImport = text.lastIndexOf("\nimport ");
  const insertAt = text.indexOf("\n", text.indexOf(";", lastImport)) + 1;
  text = `${text.slice(0, insertAt)}${HELPER}${text.slice(insertAt)}`;
  writeFileSync(target, text);
  console.log(`patch-pi-ai: ${file}: a streamed tool call's arguments are parsed geometrically`);
}
process.exit(failed ? 1 : 0);
