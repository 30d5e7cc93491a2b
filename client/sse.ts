/**
 * Server-Sent Events framing for the client (decisions §5): `id:`, `event:`, `data:` lines,
 * a blank line ends a frame, lines starting with `:` are comments (pings) and are ignored.
 * A frame still open when the body ends (a cut mid-frame) is discarded, as the SSE
 * specification says, so a reconnect resumes from the last *complete* frame.
 */

export interface SseFrame {
  /** The frame's `id:`; undefined when the frame had none (for example `event: error`). */
  id?: string;
  /** The frame's `event:`; `message` when absent. */
  event: string;
  /** The `data:` lines joined with line breaks. */
  data: string;
}

/** Incremental parser: feed text with {@link push}, collect complete frames. */
export class SseParser {
  private buffer = "";
  private id: string | undefined;
  private event: string | undefined;
  private data: string[] = [];
  private hasField = false;

  /** Adds decoded text; returns the frames it completed. */
  push(text: string): SseFrame[] {
    this.buffer += text;
    const frames: SseFrame[] = [];
    for (;;) {
      const match = /\r\n|\r|\n/.exec(this.buffer);
      if (!match) break;
      // A lone \r at the very end may be the first half of \r\n: wait for more text.
      if (match[0] === "\r" && match.index === this.buffer.length - 1) break;
      const line = this.buffer.slice(0, match.index);
      this.buffer = this.buffer.slice(match.index + match[0].length);
      const frame = this.line(line);
      if (frame) frames.push(frame);
    }
    return frames;
  }

  private line(line: string): SseFrame | undefined {
    if (line === "") {
      if (!this.hasField) return undefined;
      const frame: SseFrame = { event: this.event ?? "message", data: this.data.join("\n") };
      if (this.id !== undefined) frame.id = this.id;
      this.id = undefined;
      this.event = undefined;
      this.data = [];
      this.hasField = false;
      return frame;
    }
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "id":
        this.id = value;
        break;
      case "event":
        this.event = value;
        break;
      case "data":
        this.data.push(value);
        break;
      default:
        // `retry:` and unknown fields are ignored.
        return undefined;
    }
    this.hasField = true;
    return undefined;
  }
}

/**
 * The frames of an SSE body. Ends when the body ends cleanly (an unfinished last frame is
 * dropped); rethrows when reading the body fails (a cut connection).
 */
export async function* sseFrames(body: AsyncIterable<Uint8Array>): AsyncGenerator<SseFrame> {
  const decoder = new TextDecoder();
  const parser = new SseParser();
  for await (const chunk of body) {
    for (const frame of parser.push(decoder.decode(chunk, { stream: true }))) yield frame;
  }
  for (const frame of parser.push(decoder.decode())) yield frame;
}
