import test from "ava";
import { actionArguments, approvalRequired, BUILTIN_TOOLS, decide, MAX_ACTION_ARGUMENTS_BYTES, MAX_GLOB_STEPS, denialText, expire, globMatches, newAction, type ActionDoc, type ApprovalPolicy, workspacePath } from "../../src/index.js";
import { closeToolCalls } from "../../actors/agent-runner.js";

const T0 = 1_700_000_000_000;

test("approval - a rule's tool matches that tool only; * matches every tool; no policy gates nothing", (t) => {
  for (const ruleTool of ["*", ...BUILTIN_TOOLS] as const) {
    for (const tool of [...BUILTIN_TOOLS, "unknown"]) {
      const policy: ApprovalPolicy = { rules: [{ tool: ruleTool }] };
      t.is(approvalRequired(policy, tool, {}), ruleTool === "*" || ruleTool === tool, `${ruleTool} × ${tool}`);
    }
  }
  t.false(approvalRequired(undefined, "bash", { command: "rm -rf /" }));
});

test("approval - command_prefix: leading blanks ignored; only calls that carry a string command; a prefix is not a boundary", (t) => {
  const policy: ApprovalPolicy = { rules: [{ tool: "bash", command_prefix: "rm " }] };
  const cases: Array<[unknown, boolean]> = [
    [{ command: "rm -rf x" }, true],
    [{ command: "   \trm x" }, true],
    [{ command: "rmdir x" }, false],
    [{ command: "true; rm -rf x" }, false],
    [{ command: 7 }, false],
    [{}, false],
    [null, false],
    ["rm x", false],
  ];
  for (const [args, gated] of cases) t.is(approvalRequired(policy, "bash", args), gated, JSON.stringify(args));
});

test("approval - path_glob matches the workspace-relative path; ls without a path is the workspace", (t) => {
  const policy: ApprovalPolicy = { rules: [{ tool: "write", path_glob: "**/*.sh" }, { tool: "ls", path_glob: "." }, { tool: "read", path_glob: "secrets/*" }] };
  const cases: Array<[string, unknown, boolean]> = [
    ["write", { path: "run.sh" }, true],
    ["write", { path: "a/b/run.sh" }, true],
    ["write", { path: "/workspace/a/run.sh" }, true],
    ["write", { path: "./a//run.sh" }, true],
    ["write", { path: "run.shx" }, false],
    ["write", { path: "a/../run.sh" }, true],
    ["write", {}, true],
    ["write", { path: 2024 }, true],
    ["ls", { path: null }, true],
    ["ls", {}, true],
    ["ls", { path: "/workspace" }, true],
    ["ls", { path: "sub" }, false],
    ["read", { path: "secrets/key" }, true],
    ["read", { path: "secrets/deep/key" }, false],
    ["read", { path: "other/secrets/key" }, false],
  ];
  for (const [tool, args, gated] of cases) t.is(approvalRequired(policy, tool, args), gated, `${tool} ${JSON.stringify(args)}`);
});

test("approval - glob syntax: * within a directory, ** across, **/ also none, ? one character, the rest literal", (t) => {
  const cases: Array<[string, string, boolean]> = [
    ["*.md", "a.md", true],
    ["*.md", "d/a.md", false],
    ["**/*.md", "a.md", true],
    ["**/*.md", "d/e/a.md", true],
    ["d/**", "d/e/f", true],
    ["d/**", "e/f", false],
    ["?.txt", "a.txt", true],
    ["?.txt", "ab.txt", false],
    ["?.txt", "/.txt", false],
    ["a.b", "axb", false],
    ["(x)+[y]", "(x)+[y]", true],
    ["$^{}|\\", "$^{}|\\", true],
    ["*", "", true],
    ["a*", "a\nb", true],
  ];
  for (const [glob, path, matches] of cases) t.is(globMatches(glob, path), matches, `${glob} ~ ${JSON.stringify(path)}`);
});

test("approval - workspacePath normalizes the forms a tool accepts", (t) => {
  const cases: Array<[string, string]> = [
    ["a/b", "a/b"],
    ["./a//b/", "a/b"],
    ["/workspace/a", "a"],
    ["/workspace", "."],
    ["/workspaces/a", "workspaces/a"],
    [".", "."],
    ["a/../b", "b"],
    ["../x", "../x"],
    ["a/../../x", "../x"],
  ];
  for (const [input, expected] of cases) t.is(workspacePath(input), expected, input);
});

function action(overrides: Partial<ActionDoc> = {}): ActionDoc {
  return { ...newAction({ rules: [{ tool: "bash" }], timeout_s: 60 }, { id: "act_1", toolCallId: "call_1", tool: "bash", arguments: { command: "ls" }, assistantIndex: 1 }, T0), ...overrides };
}

test("approval - a new action expires after timeout_s (default 1 h) and defaults to deny", (t) => {
  const a = newAction({ rules: [{ tool: "*" }] }, { id: "act_1", toolCallId: "c", tool: "ls", arguments: {}, assistantIndex: 0 }, T0);
  t.is(a.expires_at - a.requested_at, 3600_000);
  t.is(a.on_timeout, "deny");
  t.is(a.decision, null);
  t.is(action().expires_at, T0 + 60_000);
  t.is(newAction({ rules: [{ tool: "*" }], on_timeout: "approve" }, { id: "a", toolCallId: "c", tool: "ls", arguments: {}, assistantIndex: 0 }, T0).on_timeout, "approve");
});

test("approval - decide: every decision × before, at and after expiry × undecided or decided", (t) => {
  for (const decision of ["approve", "deny"] as const) {
    for (const [at, expired] of [
      [T0 + 59_999, false],
      [T0 + 60_000, true],
      [T0 + 90_000, true],
    ] as const) {
      for (const onTimeout of ["approve", "deny"] as const) {
        const undecided = action({ on_timeout: onTimeout });
        const outcome = decide(undecided, decision, "why", at);
        if (!expired) {
          t.is(outcome.kind, "decided");
          t.like(outcome.action, { decision, reason: "why", decided_by: "person", decided_at: at });
        } else {
          t.deepEqual(outcome.kind === "already_decided" && outcome.expiredNow, true);
          t.like(outcome.action, { decision: onTimeout, decided_by: "timeout", decided_at: at });
          t.regex(outcome.action.reason!, /No decision within 60 s/);
        }
        const decided = action({ decision: "deny", reason: "no", decided_at: T0 + 1, decided_by: "person" });
        const again = decide(decided, decision, null, at);
        t.is(again.kind, "already_decided");
        t.is(again.action, decided, "the earlier decision stands unchanged");
      }
    }
  }
});

test("approval - expire never changes a decided action and never dates a decision before expires_at", (t) => {
  const decided = action({ decision: "approve", decided_at: T0 + 5, decided_by: "person", reason: null });
  t.is(expire(decided, T0 + 100_000), decided);
  t.is(expire(action(), T0).decided_at, T0 + 60_000);
});

test("approval - what the model is told on a denial", (t) => {
  t.is(denialText(action({ decision: "deny", decided_by: "person", reason: null })), "The call was denied by a person.");
  t.is(denialText(action({ decision: "deny", decided_by: "person", reason: "too risky" })), "The call was denied by a person: too risky");
  t.regex(denialText(expire(action(), T0 + 60_000)), /^The call was not approved: No decision within 60 s/);
});

test("approval - closeToolCalls answers every unanswered call of the last assistant message, once", (t) => {
  const asking = {
    role: "assistant",
    content: [
      { type: "toolCall", id: "c1", name: "bash", arguments: {} },
      { type: "text", text: "and" },
      { type: "toolCall", id: "c2", name: "ls", arguments: {} },
    ],
  };
  const answered = { role: "toolResult", toolCallId: "c1", toolName: "bash", content: [{ type: "text", text: "ok" }], isError: false };
  const closed = closeToolCalls([{ role: "user", content: "go" }, asking, answered] as any, "did not run") as any[];
  t.is(closed.length, 4);
  t.like(closed[3], { role: "toolResult", toolCallId: "c2", toolName: "ls", isError: true, content: [{ type: "text", text: "did not run" }] });
  t.deepEqual(closeToolCalls(closed, "again"), closed.map((m) => m), "closing twice adds nothing");
  t.deepEqual(closeToolCalls([{ role: "user", content: "x" }] as any, "n"), [{ role: "user", content: "x" }]);
});

test("approval - a path rule reads the path as the tool will: every spelling of a guarded file is gated; a path the tool refuses is gated", (t) => {
  const policy: ApprovalPolicy = { rules: [{ tool: "write", path_glob: "secrets/**" }] };
  for (const path of ["secrets/x", "/workspace/../workspace/secrets/x", "./secrets/../secrets/x", "/workspace//secrets/x"]) {
    t.true(approvalRequired(policy, "write", { path }), path);
  }
  // The tools' own mapping (here: a host root) is what decides; a refusal gates.
  const hostRoot = (p: string) => {
    if (p.startsWith("/srv/ws/")) return `./${p.slice("/srv/ws/".length)}`;
    if (p.startsWith("/")) throw new Error("outside the workspace");
    return p;
  };
  t.true(approvalRequired(policy, "write", { path: "/srv/ws/secrets/x" }, hostRoot));
  t.false(approvalRequired(policy, "write", { path: "/srv/ws/public/x" }, hostRoot));
  t.true(approvalRequired(policy, "write", { path: "/etc/passwd" }, hostRoot));
});

test("approval - an action keeps arguments up to 64 KiB whole, a preview past that", (t) => {
  const small = { command: "ls" };
  t.is(actionArguments(small), small);
  const big = { path: "a", content: "x".repeat(MAX_ACTION_ARGUMENTS_BYTES) };
  const kept = actionArguments(big);
  t.is(kept.truncated, true);
  t.is(kept.bytes, Buffer.byteLength(JSON.stringify(big)));
  t.is(Buffer.byteLength(String(kept.preview)), MAX_ACTION_ARGUMENTS_BYTES);
});

test("approval - a decision carries the id of the request that made it", (t) => {
  const outcome = decide(action(), "approve", null, T0 + 1, "dec-1");
  t.is(outcome.kind === "decided" && outcome.action.decision_id, "dec-1");
});

test("approval - abuse: a tenant's glob and a model's path cannot stall the node; an over-long path is gated", (t) => {
  t.timeout(10_000);
  // A backtracking regex takes exponential time on these; the matcher walks the path once per token.
  const evil = `${"*a".repeat(400)}b`;
  t.false(globMatches(evil, "a".repeat(4_000)));
  t.false(globMatches(`${"**a".repeat(300)}b`, `${"a/".repeat(2_000)}`));
  t.true(globMatches(`${"*a".repeat(400)}`, "a".repeat(4_000)));
  const policy: ApprovalPolicy = { rules: [{ tool: "write", path_glob: "never/**" }] };
  t.false(approvalRequired(policy, "write", { path: "a".repeat(4_096) }));
  t.true(approvalRequired(policy, "write", { path: "a".repeat(4_097) }), "past 4096 characters a path rule gates (fails closed)");
});

test("approval - abuse: one call's glob matching is bounded across all rules; past the bound a path rule gates (fails closed), and ordinary rules stay far inside it", (t) => {
  // 50 rules of 1,000-token globs against a 4,096-character path had taken ~5 s per call (found by an audit).
  const evil: ApprovalPolicy = { rules: Array.from({ length: 50 }, () => ({ tool: "write" as const, path_glob: `${"*a".repeat(499)}b` })) };
  const started = process.hrtime.bigint();
  t.true(approvalRequired(evil, "write", { path: "a".repeat(4_096) }), "over the bound: gated");
  const ms = Number(process.hrtime.bigint() - started) / 1e6;
  t.true(ms < 300, `${ms} ms`);
  // A 199-token glob against the longest path a rule matches still fits, and is matched in full.
  const long = `${"*a".repeat(99)}b`;
  t.true(199 * 4_097 <= MAX_GLOB_STEPS);
  t.false(approvalRequired({ rules: [{ tool: "write", path_glob: long }] }, "write", { path: "a".repeat(4_096) }), "matched, and it does not match");
  t.true(approvalRequired({ rules: [{ tool: "write", path_glob: long }] }, "write", { path: `${"a".repeat(4_095)}b` }));
  // 50 ordinary rules against an ordinary path: matched in full, well inside the bound.
  const ordinary: ApprovalPolicy = { rules: Array.from({ length: 50 }, (_, i) => ({ tool: "write" as const, path_glob: `dir${i}/**/*.sh` })) };
  t.true(50 * 13 * 41 < MAX_GLOB_STEPS / 10);
  t.false(approvalRequired(ordinary, "write", { path: "src/some/deeper/folder/and/a/file.ts" }));
  t.true(approvalRequired(ordinary, "write", { path: "dir49/some/deeper/folder/run.sh" }));
});
