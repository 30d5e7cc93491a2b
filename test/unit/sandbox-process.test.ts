import test from "ava";
import { spawnAndWait, type SpawnRequest } from "../../actors/sandbox-process.js";

const request = (script: string, limitSignal: AbortSignal): SpawnRequest => ({
  file: "/bin/sh",
  args: ["-c", script],
  cwd: "/",
  env: { PATH: "/usr/bin:/bin" },
  extraFds: [],
  timeoutMs: 20_000,
  limitSignal,
  outputBytes: 1024,
  captureStderr: false,
});

test("sandbox-process - a limit's stop kills a running command, which settles as killed by it (limited); one that comes after the command exited changes nothing", async (t) => {
  const running = new AbortController();
  const stopped = spawnAndWait(request("sleep 20", running.signal));
  setTimeout(() => running.abort(), 300);
  const outcome = await stopped;
  t.is(outcome.kind, "signalled");
  t.true(outcome.kind === "signalled" && outcome.limited);
  // The shell exits at once; a child it left holds the output open a while (the moment a
  // stop can still come). A stop that came before the exit (a slow start) is tried again.
  for (let attempt = 1; attempt <= 5; attempt++) {
    const late = new AbortController();
    const exited = spawnAndWait(request("sleep 3 & exit 0", late.signal));
    setTimeout(() => late.abort(), 100);
    const after = await exited;
    if (after.kind === "signalled") continue;
    t.is(after.kind, "exited");
    t.true(after.kind === "exited" && after.exitCode === 0);
    t.false("limited" in after);
    return;
  }
  t.fail("the stop came before the shell's exit five times");
});
