import test from "ava";
import type { AgentMessage } from "@mariozechner/pi-agent-core";
import { boundTranscript, jsonBytes } from "../../actors/transcript-bounds.js";

const user = (content: unknown[]) => ({ role: "user", content, timestamp: 1 }) as unknown as AgentMessage;
const assistant = (text: string) => ({ role: "assistant", content: [{ type: "text", text }], timestamp: 1 }) as unknown as AgentMessage;

test("transcript-bounds - a transcript within its room is kept as it is", (t) => {
  const transcript = [user([{ type: "text", text: "hi" }]), assistant("hello")];
  const bounded = boundTranscript(transcript, jsonBytes(transcript));
  t.deepEqual(bounded, { fits: true, transcript, compacted: false });
});

test("transcript-bounds - images and long texts of user messages and tool results become notes", (t) => {
  const image = { type: "image", data: "A".repeat(400_000), mimeType: "image/png" };
  const long = "x".repeat(100_000);
  const transcript = [
    user([{ type: "text", text: "look" }, image]),
    assistant("ok"),
    { role: "toolResult", toolCallId: "c1", toolName: "bash", content: [{ type: "text", text: long }], isError: false, timestamp: 1 } as unknown as AgentMessage,
  ];
  const bounded = boundTranscript(transcript, 100_000);
  if (!bounded.fits) return t.fail("should fit once compacted");
  t.true(bounded.compacted);
  t.true(jsonBytes(bounded.transcript) <= 100_000);
  const [u, a, r] = bounded.transcript as unknown as Array<{ content: Array<{ type: string; text: string }> }>;
  t.is(u!.content[0]!.text, "look");
  t.is(u!.content[1]!.type, "text");
  t.regex(u!.content[1]!.text, /image \(image\/png, about 300000 bytes\) not kept/);
  t.deepEqual(a, transcript[1] as unknown);
  t.true(r!.content[0]!.text.startsWith("x".repeat(1000)));
  t.regex(r!.content[0]!.text, /83616 more characters not kept/);
});

test("transcript-bounds - assistant text is never cut: a transcript still too large does not fit", (t) => {
  const transcript = [user([{ type: "text", text: "q" }]), assistant("y".repeat(200_000))];
  const bounded = boundTranscript(transcript, 100_000);
  t.false(bounded.fits);
  if (!bounded.fits) t.true(bounded.bytes > 200_000);
});

test("transcript-bounds - a negative room (input and output alone too large) never fits", (t) => {
  t.false(boundTranscript([], -1).fits);
});
