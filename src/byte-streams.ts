/** Web streams of bytes and async iterables of bytes, each as the other (files and checkpoints). */

/** A web stream as an async iterable (read to its end or until the consumer stops). */
export async function* fromStream(stream: ReadableStream<Uint8Array>): AsyncGenerator<Uint8Array> {
  const reader = stream.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      yield value;
    }
  } finally {
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
