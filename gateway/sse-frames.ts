import type { StreamedEvent } from "../src/index.js";

/** The first chunk's size, and the bounds of later ones (sized by what the last write carried). */
const MIN_CHUNK = 1024;
const MAX_CHUNK = 128 * 1024;
const EMPTY = Buffer.alloc(0);

/**
 * Server-Sent Events frames gathered as bytes for one socket write. An event's frame is
 * written from its stored JSON bytes (no text decoding and encoding per event: see
 * docs/performance.md, "SSE delivery"):
 *
 *     id: <id>\nevent: <type>\ndata: {"id":"<id>",<the event's other members>}\n\n
 *
 * `take` hands the gathered bytes over and keeps nothing: an idle stream holds no buffer.
 * The next chunk is sized by the last one taken, so a replay writes into one chunk per
 * write and a live stream into small pooled ones.
 */
export class FrameBuffer {
  private chunk: Buffer = EMPTY;
  private at = 0;
  private nextChunk = MIN_CHUNK;

  /** Bytes gathered and not yet taken. */
  get size(): number {
    return this.at;
  }

  /** Adds the frame of a streamed event. */
  event(event: StreamedEvent): void {
    // Event ids are `evt_` and base64url (src/event-ids.ts), so they need no JSON escaping
    // and are ASCII; a type is one line.
    const head = `id: ${event.id}\nevent: ${oneLine(event.type)}\ndata: {"id":"${event.id}"`;
    const { json } = event;
    this.reserve(head.length * 3 + json.length + 3);
    this.at += this.chunk.write(head, this.at);
    // json is `{…}`: its members follow the id, so it is copied whole and its brace becomes
    // the comma (no view of it made per event); an object without members adds its brace.
    if (json.length > 2) {
      this.chunk.set(json, this.at);
      this.chunk[this.at] = 0x2c; // ,
      this.at += json.length;
    } else this.chunk[this.at++] = 0x7d; // }
    this.chunk[this.at++] = 0x0a;
    this.chunk[this.at++] = 0x0a;
  }

  /** Adds text as it is (comments, error frames, frames built elsewhere). */
  text(text: string): void {
    this.reserve(text.length * 3);
    this.at += this.chunk.write(text, this.at);
  }

  /** The gathered bytes (null when none); the buffer starts empty again. */
  take(): Buffer | null {
    if (this.at === 0) return null;
    const out = this.chunk.subarray(0, this.at);
    this.nextChunk = Math.min(MAX_CHUNK, Math.max(MIN_CHUNK, this.at + (this.at >> 2)));
    this.chunk = EMPTY;
    this.at = 0;
    return out;
  }

  /** Room for `bytes` more. */
  private reserve(bytes: number): void {
    if (this.at + bytes <= this.chunk.length) return;
    const next = Buffer.allocUnsafe(Math.max(this.nextChunk, this.at * 2, this.at + bytes));
    this.chunk.copy(next, 0, 0, this.at);
    this.chunk = next;
  }
}

/** An event type on its `event:` line: a line break in it would end the frame early. */
export function oneLine(type: string): string {
  return type.includes("\n") || type.includes("\r") ? type.replace(/[\r\n]/g, " ") : type;
}
