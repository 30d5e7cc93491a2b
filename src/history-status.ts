/**
 * What a first page of a run's (or a turn's) event history says about its
 * completeness (runs-api.md, "Event history"; decisions §6). Pure: the event log
 * reads the stream and hands over the facts.
 */

export const HistoryStatus = { complete: "complete", partial: "partial", expired: "expired", empty: "empty" } as const;
export type HistoryStatus = (typeof HistoryStatus)[keyof typeof HistoryStatus];

export interface HistoryFacts {
  /** The run ever recorded an event (its stream holds one, or its counter moved, or it is older than retention). */
  recorded: boolean;
  /**
   * The first retained event of the selection, if any: its run sequence, and the first
   * sequence of its turn (absent for an event of no turn).
   */
  first?: { sequence: number; turnFirstSequence?: number };
  /** The read selects one turn's events. */
  forTurn: boolean;
}

/**
 * `empty` when nothing was ever recorded; `expired` when events were recorded but none of
 * the selection is retained (for a turn this also covers a turn with no event yet: the
 * caller answers event_boundary_pending for an admitted turn whose first event is not
 * recorded before reading); `complete` when the selection starts at its own beginning
 * (sequence 1 for the run, the turn's first event for a turn); `partial` otherwise.
 */
export function historyStatus(facts: HistoryFacts): HistoryStatus {
  if (!facts.recorded) return HistoryStatus.empty;
  if (!facts.first) return HistoryStatus.expired;
  const beginning = facts.forTurn ? facts.first.turnFirstSequence : 1;
  return facts.first.sequence === beginning ? HistoryStatus.complete : HistoryStatus.partial;
}
