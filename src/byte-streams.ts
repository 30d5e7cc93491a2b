/** Web streams of bytes and async iterables of bytes, each as the other (files and checkpoints); writing with back-pressure. */
import type { Writable } from "node:stream";

/** A web stream as an async iterable (read to its end or until the consumer stops, which cancels the stream). */
export async function* fromStream(stream: ReadableStream<Uint8Array>): AsyncGenerator<Uint8Array> {
  const reader = stream.getReader();
  let ended = false;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        ended = true;
        return;
      }
      yield value;
    }
  } finally {
    // A consumer that stopped early stops the stream's source too (an object store's read goes on otherwise).
    if (!ended) await reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}

/** An async iterable of bytes as a web stream, pulled as the consumer reads. */
export function toStream(source: AsyncIterable<Uint8Array>): ReadableStream<Uint8Array> {
  const it = source[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const { done, value } = await it.next();
      if (done) controller.close();
      else controller.enqueue(value);
    },
    async cancel(reason) {
      await it.throw?.(reason).catch(() => undefined);
    },
  });
}

/**
 * Resolves when `stream` can take more, or will take nothing more: closed (its reader
 * gone), or `signal` aborted. Waiting for `drain` alone would wait forever on a stream
 * whose reader went away with writes still queued.
 */
export function drained(stream: Writable, signal?: AbortSignal): Promise<void> {
  if (signal?.aborted || stream.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      stream.off("drain", done);
      stream.off("close", done);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    stream.on("drain", done);
    stream.on("close", done);
    signal?.addEventListener("abort", done, { once: true });
  });
}
