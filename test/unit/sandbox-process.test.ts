import test from "ava";
import { OutputTail, spawnAndWait, type SpawnRequest } from "../../actors/sandbox-process.js";

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

test("sandbox-process - OutputTail keeps the last limit bytes whatever the reads' sizes, as a whole copy would, and a burst after 70,000 one-byte reads is one cheap push (found by an audit: ~1 s per push)", (t) => {
  const reference = (reads: Buffer[], limit: number) => {
    const all = Buffer.concat(reads);
    return all.subarray(Math.max(0, all.length - limit));
  };
  let seed = 11;
  const next = (n: number) => (seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648) % n;
  for (let round = 0; round < 200; round++) {
    const limit = 1 + next(5_000);
    const tail = new OutputTail(limit);
    const reads: Buffer[] = [];
    for (let i = next(12_000); i > 0; i--) {
      const read = Buffer.alloc(next(3) === 0 ? next(3 * limit) : next(4), next(256));
      reads.push(read);
      tail.push(read);
    }
    const { output, totalBytes } = tail.result();
    t.true(output.equals(reference(reads, limit)), `round ${round}`);
    t.is(totalBytes, reads.reduce((sum, read) => sum + read.length, 0));
  }
  const limit = 64 * 1024;
  const tail = new OutputTail(limit);
  for (let i = 0; i < 70_000; i++) tail.push(Buffer.from([i & 0xff]));
  const started = process.hrtime.bigint();
  tail.push(Buffer.alloc(limit, 7));
  const ms = Number(process.hrtime.bigint() - started) / 1e6;
  t.true(ms < 100, `${ms} ms`);
  t.true(tail.result().output.equals(Buffer.alloc(limit, 7)));
  t.is(tail.result().totalBytes, 70_000 + limit);
  // Dropped reads are let go at once: 4,000 reads of 64 KiB keep about the limit, not 250 MiB (found by a review).
  const big = new OutputTail(limit);
  const held = new Set<Buffer>();
  let kept = 0;
  for (let i = 0; i < 4_000; i++) {
    big.push(Buffer.alloc(64 * 1024, i & 0xff));
  }
  for (const chunk of (big as unknown as { chunks: Buffer[] }).chunks) if (chunk.length > 0) held.add(chunk);
  for (const chunk of held) kept += chunk.length;
  t.true(kept <= 2 * limit, `${kept} bytes still referenced`);
});
