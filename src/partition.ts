import { createHash } from "node:crypto";

/**
 * Partition hashing (DESIGN §3): which partition a run belongs to, and which live node
 * owns a partition. Pure, shared by the gateway (to address a command) and the actors
 * (to claim partitions).
 */

/** A stable partition for a run id. */
export function partitionOf(runId: string, partitions: number): number {
  const digest = createHash("sha1").update(runId).digest();
  return digest.readUInt32BE(0) % partitions;
}

/** Rendezvous (highest random weight) owner of a partition among live nodes. */
export function rendezvousOwner(partition: number, nodes: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestScore = -1n;
  for (const node of nodes) {
    const score = createHash("sha1").update(`${node}\u0000${partition}`).digest().readBigUInt64BE(0);
    if (score > bestScore || (score === bestScore && best !== undefined && node < best)) {
      best = node;
      bestScore = score;
    }
  }
  return best;
}
