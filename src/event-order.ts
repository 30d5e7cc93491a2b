/**
 * Putting a run's stored events back in run sequence order.
 *
 * The appender publishes a run's events in sequence order without waiting for each ack
 * (src/event-appender.ts). When a NATS server dies with a publish in its socket, that
 * publish is lost while the client reconnects within milliseconds and the next events are
 * stored; the lost one is re-sent after its ack timeout and is stored after them. The
 * stream then holds e.g. `…18, 20, 21, 19, 22…`. Readers scan a run's messages in stream
 * order and pass them through a {@link SequenceOrder}, which holds an event that came
 * early until the ones before it arrive.
 *
 * A missing event that never arrives (its publish failed for good) must not hold the
 * rest forever: a re-sent event is stored at most {@link MAX_PUBLISH_SPAN_MS} after the
 * one that overtook it was sent, so once events are held for longer than the horizon,
 * the missing ones are given up and the held ones released.
 *
 * Where to resume reading after an event: see {@link FLOOR_HEADER}.
 */
import { MAX_PUBLISH_SPAN_MS } from "./js-publisher.js";

/**
 * How long held events wait for a missing one, measured on stored times (the NATS
 * server's clock), or against the reader's clock at the end of what is stored: twice
 * the publisher's longest span, which leaves room for clocks that differ.
 */
export const ORDER_HORIZON_MS = 2 * MAX_PUBLISH_SPAN_MS;

/**
 * The appender sends an event only when every event numbered this many before it is
 * stored (src/event-appender.ts). So once a reader meets event `s` in stream order, an
 * event numbered `s - MAX_EVENTS_AHEAD` or below that it has not met is not stored after
 * this point: it is given up at once, which bounds what a reader holds.
 */
export const MAX_EVENTS_AHEAD = 256;

/**
 * Header of every stored event: the highest stream sequence of this event's stream that
 * the publishing node had seen acknowledged before it first sent the event. Every event
 * numbered after it was sent later, so is stored after that position: a reader resuming
 * after this event starts at `floor + 1` and sees them all, even those stored before the
 * event itself. Absent when the node knew no position yet (between its start and the
 * first answer of the stream's state or an ack): the reader then resumes after the event's
 * own position, as it does for events stored before this header existed.
 */
export const FLOOR_HEADER = "Runs-Floor";

/**
 * Header of every stored event: the run sequence below which every event of its run was
 * stored (acknowledged) when the event was first sent. A reader that meets it and has not
 * met an event below it will not meet that event later in the stream: it is gone (expired),
 * so the reader does not wait for it.
 */
export const STORED_BELOW_HEADER = "Runs-Stored-Below";

/** Where to start scanning for the events after the event stored at `streamSeq` with header `floor`. */
export function resumePosition(streamSeq: number, floorHeader: string | undefined): number {
  const floor = floorHeader === undefined || floorHeader === "" ? NaN : Number(floorHeader);
  return Number.isSafeInteger(floor) && floor >= 0 && floor < streamSeq ? floor + 1 : streamSeq + 1;
}

/** What a reader knows of a stored event beyond its sequence (read only when it matters). */
export interface StoredInfo {
  /** When the NATS server stored it, in Unix ms. */
  storedMs: number;
  /** Its {@link STORED_BELOW_HEADER} (0: absent). */
  storedBelow: number;
}

interface Held<T> {
  item: T;
  storedMs: number;
}

/**
 * Emits items in run sequence order from `next` on, whatever order they are pushed in.
 * Sequences below `next` (already emitted, or repeated) are dropped. A missing sequence is
 * given up when a later event says it was stored before (and so was read already, or is
 * gone: expired), when an event {@link MAX_EVENTS_AHEAD} past it is met, or after the
 * horizon. So at most MAX_EVENTS_AHEAD items are held.
 */
export class SequenceOrder<T> {
  private readonly held = new Map<number, Held<T>>();
  /** Stored time of the earliest held item (they wait together for the one missing). */
  private heldSinceMs = Infinity;

  constructor(
    private next: number,
    private readonly horizonMs = ORDER_HORIZON_MS,
  ) {}

  /** The sequence the next emitted item will have, unless it is given up. */
  get expected(): number {
    return this.next;
  }

  /** True while items wait for an earlier one. */
  get holding(): boolean {
    return this.held.size > 0;
  }

  /**
   * True when `sequence` is the next one and nothing is held: it is taken as emitted, and
   * the caller emits it (no array, no item: what readers meet nearly always). Else false,
   * and nothing changed: {@link push} it.
   */
  takeNext(sequence: number): boolean {
    if (sequence !== this.next || this.held.size !== 0) return false;
    this.next++;
    return true;
  }

  /** Adds the item with run sequence `sequence`; returns what can now be emitted, in order. */
  push(sequence: number, item: T, info: () => StoredInfo): readonly T[] {
    if (sequence < this.next) return NONE;
    if (sequence === this.next && this.held.size === 0) {
      this.next++;
      return [item];
    }
    const { storedMs, storedBelow } = info();
    // Every event below `storedBelow` was stored before this one: not met by now, it is gone.
    // It is at most the event's own number (it was not stored when sent): a larger one is
    // not ours, and must not hide the events it claims.
    const out = storedBelow > this.next && storedBelow <= sequence ? this.skipTo(storedBelow) : [];
    if (sequence < this.next) return out;
    if (sequence === this.next) {
      this.next++;
      out.push(item);
      return this.drain(out);
    }
    if (!this.held.has(sequence)) this.held.set(sequence, { item, storedMs });
    if (storedMs < this.heldSinceMs) this.heldSinceMs = storedMs;
    // Too far ahead: what is missing that far back was stored before, or never.
    if (sequence - MAX_EVENTS_AHEAD >= this.next) return [...out, ...this.skipTo(sequence - MAX_EVENTS_AHEAD + 1)];
    // A later store far past the first held one: what is missing would have come by now.
    return this.giveUpBefore(storedMs, out);
  }

  /**
   * At the end of what is stored: releases held items that have waited past the horizon
   * by the reader's clock (the missing ones are not coming).
   */
  release(nowMs: number): readonly T[] {
    return this.held.size > 0 ? this.giveUpBefore(nowMs, []) : NONE;
  }

  /** Gives up each missing sequence that held items have waited for past the horizon at `nowMs`. */
  private giveUpBefore(nowMs: number, out: T[]): T[] {
    for (let gaps = 0; this.held.size > 0 && nowMs - this.heldSinceMs > this.horizonMs && gaps <= MAX_EVENTS_AHEAD; gaps++) {
      out.push(...this.skipTo(Math.min(...this.held.keys())));
    }
    return out;
  }

  /** Gives up the missing sequences below `sequence`: emits the held ones below it, then from it on. */
  private skipTo(sequence: number): T[] {
    const out: T[] = [];
    for (const below of [...this.held.keys()].filter((held) => held < sequence).sort((a, b) => a - b)) {
      out.push(this.held.get(below)!.item);
      this.held.delete(below);
    }
    this.next = sequence;
    return this.drain(out);
  }

  private drain(out: T[]): T[] {
    for (let h = this.held.get(this.next); h !== undefined; h = this.held.get(this.next)) {
      this.held.delete(this.next);
      this.next++;
      out.push(h.item);
    }
    this.heldSinceMs = Infinity;
    for (const h of this.held.values()) if (h.storedMs < this.heldSinceMs) this.heldSinceMs = h.storedMs;
    return out;
  }
}

const NONE: readonly never[] = [];
