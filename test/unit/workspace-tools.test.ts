import test from "ava";
import { chmod, mkdtemp, mkdir, readFile, rm, symlink, writeFile, access } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import type { AgentTool } from "@mariozechner/pi-agent-core";
import { BUILTIN_TOOLS } from "../../src/domain.js";
import { createWorkspaceTools, MAX_OUTPUT_BYTES, Workspace } from "../../actors/workspace-tools.js";
import type { Sandbox } from "../../actors/sandbox.js";
import { testSandbox } from "../helpers/sandbox.js";
import { execFileSync } from "node:child_process";

let sandbox: Sandbox;
test.before(async () => {
  sandbox = await testSandbox();
});

interface Dirs {
  base: string;
  workspace: string;
  outside: string;
}

async function dirs(): Promise<Dirs> {
  const base = await mkdtemp(path.join(tmpdir(), "ws-tools-"));
  await chmod(base, 0o711);
  const workspace = path.join(base, "ws");
  const outside = path.join(base, "outside");
  await mkdir(workspace);
  await mkdir(outside);
  await writeFile(path.join(outside, "secret.txt"), "secret");
  await sandbox.prepareWorkspace(workspace);
  return { base, workspace, outside };
}

/** The tools over `dir`; files the test wrote there first are handed to the sandbox's user. */
function tools(dir: string, commandTimeoutMs?: number): Record<string, AgentTool<any>> {
  const all = createWorkspaceTools(dir, BUILTIN_TOOLS, { sandbox, commandTimeoutMs });
  const prepared = (tool: AgentTool<any>): AgentTool<any> => ({
    ...tool,
    execute: async (...args: Parameters<AgentTool<any>["execute"]>) => {
      await sandbox.prepareWorkspace(dir);
      return tool.execute(...args);
    },
  });
  return Object.fromEntries(all.map((tool) => [tool.name, prepared(tool)]));
}

function text(result: { content: { type: string; text?: string }[] }): string {
  return result.content.map((c) => c.text ?? "").join("");
}

async function exists(p: string): Promise<boolean> {
  return access(p).then(
    () => true,
    () => false,
  );
}

test("workspace-tools - creates the named tools in order", async (t) => {
  const d = await dirs();
  t.deepEqual(
    createWorkspaceTools(d.workspace, ["ls", "bash"], { sandbox }).map((tool) => tool.name),
    ["ls", "bash"],
  );
  await rm(d.base, { recursive: true });
});

test("workspace-tools - bash runs in the workspace and returns output", async (t) => {
  const d = await dirs();
  const result = await tools(d.workspace).bash.execute("c1", { command: "pwd && echo hi > a.txt && echo done" });
  t.regex(text(result), /done/);
  t.regex(text(result), /^\/workspace$/m, "the workspace is seen at /workspace");
  t.is(await readFile(path.join(d.workspace, "a.txt"), "utf8"), "hi\n");
  t.is(result.details.exitCode, 0);
  await rm(d.base, { recursive: true });
});

test("workspace-tools - bash nonzero exit throws with exit code and output", async (t) => {
  const d = await dirs();
  const error = await t.throwsAsync(tools(d.workspace).bash.execute("c1", { command: "echo oops >&2; exit 3" }));
  t.regex(error!.message, /exited with code 3/);
  t.regex(error!.message, /oops/);
  await rm(d.base, { recursive: true });
});

test("workspace-tools - bash returns stdout and stderr as one stream, in the order written", async (t) => {
  const d = await dirs();
  const result = await tools(d.workspace).bash.execute("c1", { command: "echo one; echo two >&2; echo three; echo four 1>&2" });
  t.is(text(result).trim(), "one\ntwo\nthree\nfour");
  // A syntax error is the shell's own stderr: it reaches the output too.
  const error = await t.throwsAsync(tools(d.workspace).bash.execute("c1", { command: "if then fi" }));
  t.regex(error!.message, /syntax error/);
  // The command sees the same shell arguments as a plain `bash -c`.
  const args = await tools(d.workspace).bash.execute("c1", { command: 'echo "[$#]"' });
  t.is(text(args).trim(), "[0]");
  await rm(d.base, { recursive: true });
});

test("workspace-tools - bash command timeout kills the process group", async (t) => {
  const d = await dirs();
  const started = Date.now();
  const error = await t.throwsAsync(
    tools(d.workspace, 300).bash.execute("c1", { command: "(sleep 3; touch late.txt) & sleep 5; touch after.txt" }),
  );
  t.regex(error!.message, /timed out after 0\.3 s/);
  t.true(Date.now() - started < 2500);
  await new Promise((resolve) => setTimeout(resolve, 3300));
  t.false(await exists(path.join(d.workspace, "late.txt")), "background child was killed too");
  t.false(await exists(path.join(d.workspace, "after.txt")));
  await rm(d.base, { recursive: true });
});

test("workspace-tools - bash abort signal kills the command", async (t) => {
  const d = await dirs();
  const controller = new AbortController();
  setTimeout(() => controller.abort(), 200);
  const started = Date.now();
  const error = await t.throwsAsync(
    tools(d.workspace).bash.execute("c1", { command: "sleep 5; touch after.txt" }, controller.signal),
  );
  t.regex(error!.message, /cancelled/);
  t.true(Date.now() - started < 2000);
  await rm(d.base, { recursive: true });
});

test("workspace-tools - bash keeps the last 64 KiB of output", async (t) => {
  const d = await dirs();
  const result = await tools(d.workspace).bash.execute("c1", {
    command: "head -c 200000 /dev/zero | tr '\\0' 'a'; echo; echo END",
  });
  const out = text(result);
  t.true(result.details.truncated);
  t.is(out.split("\n")[0], "[output truncated: last 65536 of 200005 bytes]");
  t.true(out.endsWith("END\n"));
  t.true(Buffer.byteLength(out) < MAX_OUTPUT_BYTES + 100);
  await rm(d.base, { recursive: true });
});

test("workspace-tools - bash does not pass the service's secrets", async (t) => {
  const d = await dirs();
  process.env.RUNS_MASTER_KEY = "do-not-leak";
  try {
    const result = await tools(d.workspace).bash.execute("c1", { command: 'echo "key=${RUNS_MASTER_KEY:-unset}"' });
    t.regex(text(result), /key=unset/);
  } finally {
    delete process.env.RUNS_MASTER_KEY;
    await rm(d.base, { recursive: true });
  }
});

test("workspace-tools - write creates parent directories, read returns lines", async (t) => {
  const d = await dirs();
  const all = tools(d.workspace);
  await all.write.execute("c1", { path: "deep/dir/f.txt", content: "one\ntwo\nthree" });
  t.is(await readFile(path.join(d.workspace, "deep/dir/f.txt"), "utf8"), "one\ntwo\nthree");
  t.is(text(await all.read.execute("c2", { path: "deep/dir/f.txt" })), "one\ntwo\nthree");
  const slice = text(await all.read.execute("c3", { path: "deep/dir/f.txt", offset: 2, limit: 1 }));
  t.true(slice.startsWith("two\n"));
  t.regex(slice, /continue with offset 3/);
  await rm(d.base, { recursive: true });
});

test("workspace-tools - edit replaces one exact unique match", async (t) => {
  const d = await dirs();
  const all = tools(d.workspace);
  await writeFile(path.join(d.workspace, "e.txt"), "alpha beta alpha gamma");
  await t.throwsAsync(all.edit.execute("c1", { path: "e.txt", old_text: "alpha", new_text: "x" }), {
    message: /occurs 2 times/,
  });
  await t.throwsAsync(all.edit.execute("c2", { path: "e.txt", old_text: "delta", new_text: "x" }), {
    message: /not found/,
  });
  await all.edit.execute("c3", { path: "e.txt", old_text: "beta", new_text: "$& $1" });
  t.is(await readFile(path.join(d.workspace, "e.txt"), "utf8"), "alpha $& $1 alpha gamma");
  await rm(d.base, { recursive: true });
});

test("workspace-tools - ls lists entries, directories with a slash", async (t) => {
  const d = await dirs();
  await mkdir(path.join(d.workspace, "sub"));
  await writeFile(path.join(d.workspace, "b.txt"), "");
  const all = tools(d.workspace);
  t.is(text(await all.ls.execute("c1", {})), "b.txt\nsub/");
  t.is(text(await all.ls.execute("c2", { path: "sub" })), "(empty directory)");
  await rm(d.base, { recursive: true });
});

test("workspace-tools - paths escaping the workspace are rejected", async (t) => {
  const d = await dirs();
  const all = tools(d.workspace);
  await symlink(d.outside, path.join(d.workspace, "link-out"));
  await symlink(path.join(d.outside, "secret.txt"), path.join(d.workspace, "secret-link"));
  await symlink(path.join(d.outside, "missing.txt"), path.join(d.workspace, "dangling"));

  const attempts: Array<[string, Record<string, unknown>]> = [
    ["read", { path: "../outside/secret.txt" }],
    ["read", { path: path.join(d.outside, "secret.txt") }],
    ["read", { path: "secret-link" }],
    ["read", { path: "link-out/secret.txt" }],
    ["write", { path: "../outside/new.txt", content: "x" }],
    ["write", { path: "link-out/new.txt", content: "x" }],
    ["write", { path: "link-out/deeper/new.txt", content: "x" }],
    ["write", { path: "dangling", content: "x" }],
    ["edit", { path: "secret-link", old_text: "secret", new_text: "x" }],
    ["ls", { path: ".." }],
    ["ls", { path: "link-out" }],
  ];
  for (const [name, args] of attempts) {
    await t.throwsAsync(all[name].execute("c", args), undefined, `${name} ${JSON.stringify(args)}`);
  }
  t.is(await readFile(path.join(d.outside, "secret.txt"), "utf8"), "secret");
  t.false(await exists(path.join(d.outside, "new.txt")));
  t.false(await exists(path.join(d.outside, "missing.txt")));
  t.false(await exists(path.join(d.outside, "deeper")));
  await rm(d.base, { recursive: true });
});

test("workspace-tools - links and absolute paths inside the workspace are allowed", async (t) => {
  const d = await dirs();
  await mkdir(path.join(d.workspace, "real"));
  await writeFile(path.join(d.workspace, "real/f.txt"), "inside");
  await symlink("real", path.join(d.workspace, "alias"));
  await symlink("/workspace/real", path.join(d.workspace, "absolute-alias"));
  const all = tools(d.workspace);
  t.is(text(await all.read.execute("c1", { path: "alias/f.txt" })), "inside");
  t.is(text(await all.read.execute("c1b", { path: "absolute-alias/f.txt" })), "inside");
  t.is(text(await all.read.execute("c2", { path: path.join(d.workspace, "real/f.txt") })), "inside");
  t.is(text(await all.read.execute("c2b", { path: "/workspace/real/f.txt" })), "inside");
  t.is(text(await all.read.execute("c3", { path: "real/../real/f.txt" })), "inside");
  await rm(d.base, { recursive: true });
});

test("workspace-tools - Workspace maps tool paths to workspace-relative ones", async (t) => {
  const d = await dirs();
  const ws = new Workspace(d.workspace, "/workspace");
  t.is(ws.relative("."), ".");
  t.is(ws.relative("/workspace"), ".");
  t.is(ws.relative("/workspace/a/b/"), "./a/b");
  t.is(ws.relative(path.join(d.workspace, "x")), "./x");
  t.is(ws.relative("a/../b"), "./b");
  for (const bad of ["..", "a/../../x", "/etc/passwd", "/workspace/../etc", "/workspacex/y"]) {
    t.throws(() => ws.relative(bad), { message: /outside the workspace/ }, bad);
  }
  t.throws(() => ws.relative("a\0b"), { message: /Invalid path/ });
  t.is(await ws.resolveOnHost("."), await import("node:fs/promises").then((fs) => fs.realpath(d.workspace)));
  await t.throwsAsync(ws.resolveOnHost("a/../../x"), { message: /outside the workspace/ });
  await rm(d.base, { recursive: true });
});

test("workspace-tools - read refuses a FIFO, a device link and a directory at once, without blocking", async (t) => {
  const d = await dirs();
  execFileSync("mkfifo", [path.join(d.workspace, "pipe")]);
  await symlink("/dev/zero", path.join(d.workspace, "zero"));
  await mkdir(path.join(d.workspace, "dir"));
  const all = tools(d.workspace, 20_000);
  const started = Date.now();
  await t.throwsAsync(all.read.execute("c1", { path: "pipe" }), { message: /not a regular file/ });
  await t.throwsAsync(all.read.execute("c2", { path: "zero" }), { message: /not a regular file/ });
  await t.throwsAsync(all.read.execute("c3", { path: "dir" }), { message: /is a directory/ });
  await t.throwsAsync(all.edit.execute("c4", { path: "pipe", old_text: "a", new_text: "b" }), { message: /not a regular file/ });
  t.true(Date.now() - started < 10_000, "no read waited for a writer");
  await rm(d.base, { recursive: true });
});

test("workspace-tools - a read blocked inside the sandbox ends with the abort signal", async (t) => {
  const d = await dirs();
  execFileSync("mkfifo", [path.join(d.workspace, "pipe")]);
  const all = tools(d.workspace, 60_000);
  const controller = new AbortController();
  setTimeout(() => controller.abort(), 300);
  const started = Date.now();
  // `bash` can block on the FIFO as any command can; the cancel ends its sandbox.
  await t.throwsAsync(all.bash.execute("c1", { command: "cat pipe" }, controller.signal), { message: /cancelled/ });
  t.true(Date.now() - started < 5_000);
  await rm(d.base, { recursive: true });
});

test("workspace tools - arguments that are not one object, or hold over 1,000 members and items, are refused before validation in a short message: the validator quotes refused arguments pretty-printed, and 2 MB of nested arrays became ~140 MB of error text (found by a probe); small extra keys pass", async (t) => {
  const { boundedArguments } = await import("../../actors/workspace-tools.js");
  const extra = { command: "ls", timeout: 5, extra: null, $weird: { "a.b": [1, { c: 2 }] } };
  t.is(boundedArguments(extra), extra, "extra keys of any shape, within the bound, pass as sent (a gated call shows them)");
  let nested: unknown = Array.from({ length: 100_000 }, () => 0);
  for (let i = 0; i < 57; i++) nested = { a: nested };
  for (const [args, message] of [
    [{ command: nested }, /at most 1000 members and items/],
    [{ command: "ls", rows: Array.from({ length: 1_000 }, () => 0) }, /at most 1000 members and items/],
    [[1, 2, 3], /must be a JSON object/],
    ["ls", /must be a JSON object/],
    [null, /must be a JSON object/],
  ] as const) {
    const error = t.throws(() => boundedArguments(args));
    t.regex(error!.message, message);
    t.true(error!.message.length < 200, error!.message);
  }
  t.notThrows(() => boundedArguments({ command: "ls", rows: Array.from({ length: 998 }, () => 0) }), "1,000 members and items in all");
  // Every tool the service builds bounds them so.
  const dir = await mkdtemp(path.join(tmpdir(), "bounded-"));
  try {
    for (const tool of createWorkspaceTools(dir, BUILTIN_TOOLS, { sandbox: testSandbox() } as never)) t.is(tool.prepareArguments, boundedArguments, tool.name);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
