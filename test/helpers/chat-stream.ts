/**
 * What an OpenAI-compatible endpoint streams for a chat completion, for the tests' own
 * loopback endpoints: one chunk per text piece, the stop chunk, an optional usage chunk
 * (as OpenAI sends with include_usage), then `[DONE]`.
 */
import type { ServerResponse } from "node:http";

export function writeChatStream(res: ServerResponse, pieces: string[], usage?: Record<string, unknown>): void {
  res.writeHead(200, { "content-type": "text/event-stream" });
  const chunk = (body: Record<string, unknown>) => `data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", created: 0, model: "m", ...body })}\n\n`;
  pieces.forEach((content, i) => res.write(chunk({ choices: [{ index: 0, delta: i === 0 ? { role: "assistant", content } : { content }, finish_reason: null }] })));
  res.write(chunk({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }] }));
  if (usage) res.write(chunk({ choices: [], usage }));
  res.end("data: [DONE]\n\n");
}
