import type { MsgHdrs } from "@nats-io/transport-node";
import { type AsyncPublisher, PublishError, type StoredAck } from "../../src/js-publisher.js";

/**
 * `publisher`, except that the publish of run event `late` waits until every event after it
 * up to `lateUntil` is acknowledged (as one lost with a dying NATS server and sent again
 * after its ack timeout), then goes out, or with `fail` fails for good.
 */
export function latePublisher(publisher: AsyncPublisher, late: number, lateUntil: number, fail = false) {
  const acked = new Set<number>();
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  return {
    floor: (stream: string) => publisher.floor(stream),
    publish: async (subject: string, payload: Uint8Array, msgId: string, headers: MsgHdrs): Promise<StoredAck> => {
      const seq = Number(msgId.split(":")[1]);
      if (seq === late) {
        await released;
        if (fail) throw new PublishError("no ack from JetStream in time", true);
      }
      const ack = await publisher.publish(subject, payload, msgId, headers);
      acked.add(seq);
      if (Array.from({ length: lateUntil - late }, (_, i) => late + 1 + i).every((s) => acked.has(s))) release();
      return ack;
    },
  };
}
