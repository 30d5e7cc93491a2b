import test from "ava";
import { CommandReplies } from "../../actors/command-replies.js";
import type { CommandReply } from "../../src/commands.js";

/** A command's work, counted, finishing when the test says. */
function work(answer: CommandReply | Error) {
  const state = { runs: 0, finish: () => {} };
  const run = () => {
    state.runs++;
    return new Promise<CommandReply>((resolve, reject) => {
      state.finish = () => (answer instanceof Error ? reject(answer) : resolve(answer));
    });
  };
  return { state, run };
}

const okReply: CommandReply = { ok: true, run_id: "run_1", turn_id: "turn_1" };

test("a resend while the command runs waits for the same answer; the work runs once", async (t) => {
  const replies = new CommandReplies(() => 0);
  const { state, run } = work(okReply);
  const first = replies.answer("c1", run);
  const resend = replies.answer("c1", run);
  state.finish();
  t.deepEqual(await first, okReply);
  t.deepEqual(await resend, okReply);
  t.is(state.runs, 1);
});

test("a resend after the answer gets the remembered answer until the memory ends", async (t) => {
  let now = 0;
  const replies = new CommandReplies(() => now, 1_000);
  const refused: CommandReply = { ok: false, code: "run_busy", message: "The run is busy." };
  const { state, run } = work(refused);
  const first = replies.answer("c1", run);
  state.finish();
  await first;
  now = 999;
  t.deepEqual(await replies.answer("c1", run), refused);
  t.is(state.runs, 1);
  now = 1_000;
  const again = replies.answer("c1", run);
  state.finish();
  await again;
  t.is(state.runs, 2, "a resend past the memory runs again");
});

test("not-owner, in-doubt, temporary failures and thrown errors are not remembered: a resend runs again", async (t) => {
  const replies = new CommandReplies(() => 0);
  for (const answer of [{ ok: false, not_owner: true } as CommandReply, { ok: false, in_doubt: true } as CommandReply, { ok: false, code: "runtime_unavailable" } as CommandReply, new Error("store down")]) {
    const { state, run } = work(answer);
    const first = replies.answer("c", run);
    state.finish();
    await first.catch(() => undefined);
    const second = replies.answer("c", run);
    state.finish();
    await second.catch(() => undefined);
    t.is(state.runs, 2, JSON.stringify(String(answer)));
  }
  t.is(replies.size, 0);
});

test("commands without an id are never joined or remembered", async (t) => {
  const replies = new CommandReplies(() => 0);
  let runs = 0;
  const run = async () => (runs++, okReply);
  await Promise.all([replies.answer(undefined, run), replies.answer(undefined, run)]);
  t.is(runs, 2);
  t.is(replies.size, 0);
});

test("the memory holds at most its bound of answers, dropping the oldest", async (t) => {
  let now = 0;
  const replies = new CommandReplies(() => now, 60_000, 100);
  for (let i = 0; i < 250; i++) {
    now = i;
    await replies.answer(`c${i}`, async () => okReply);
  }
  t.is(replies.size, 100);
  let runs = 0;
  await replies.answer("c249", async () => (runs++, okReply));
  t.is(runs, 0, "the newest is remembered");
  await replies.answer("c0", async () => (runs++, okReply));
  t.is(runs, 1, "the oldest was dropped");
});

test("a resend is answered from what is known before anything else: known() gives the running or remembered answer", async (t) => {
  const replies = new CommandReplies(() => 0);
  t.is(replies.known("c1"), undefined);
  t.is(replies.known(undefined), undefined);
  const { state, run } = work(okReply);
  const first = replies.answer("c1", run);
  const joined = replies.known("c1");
  t.truthy(joined);
  state.finish();
  t.deepEqual(await joined, okReply);
  await first;
  t.deepEqual(await replies.known("c1"), okReply);
});

test("remembered answers are kept small: the rendered Run is dropped, an answer still over 4 KiB is not kept", async (t) => {
  const replies = new CommandReplies(() => 0);
  const withRun: CommandReply = { ok: true, run_id: "run_1", turn_id: "turn_1", run: { id: "run_1", input: "x".repeat(100_000) } };
  await replies.answer("c1", async () => withRun);
  t.deepEqual(await replies.known("c1"), { ok: true, run_id: "run_1", turn_id: "turn_1", run: undefined });
  const large: CommandReply = { ok: true, run_id: "run_1", action: { arguments: "y".repeat(10_000) } };
  await replies.answer("c2", async () => large);
  t.is(replies.known("c2"), undefined);
  t.is(replies.size, 1);
});
