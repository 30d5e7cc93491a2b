import test from "ava";
import { historyStatus, HistoryStatus } from "../../src/history-status.js";

test("history status - nothing ever recorded is empty, whatever else is said", (t) => {
  for (const forTurn of [false, true]) {
    t.is(historyStatus({ recorded: false, forTurn }), HistoryStatus.empty);
    t.is(historyStatus({ recorded: false, forTurn, first: { sequence: 1, turnFirstSequence: 1 } }), HistoryStatus.empty);
  }
});

test("history status - recorded but nothing of the selection retained is expired (run and turn)", (t) => {
  t.is(historyStatus({ recorded: true, forTurn: false }), HistoryStatus.expired);
  t.is(historyStatus({ recorded: true, forTurn: true }), HistoryStatus.expired);
});

test("history status - a run's history is complete from sequence 1, partial from any later one", (t) => {
  t.is(historyStatus({ recorded: true, forTurn: false, first: { sequence: 1, turnFirstSequence: 1 } }), HistoryStatus.complete);
  t.is(historyStatus({ recorded: true, forTurn: false, first: { sequence: 1 } }), HistoryStatus.complete);
  for (const sequence of [2, 3, 1000]) {
    t.is(historyStatus({ recorded: true, forTurn: false, first: { sequence, turnFirstSequence: sequence } }), HistoryStatus.partial, `from ${sequence}`);
  }
});

test("history status - a turn's history is complete from the turn's first event, partial otherwise", (t) => {
  t.is(historyStatus({ recorded: true, forTurn: true, first: { sequence: 7, turnFirstSequence: 7 } }), HistoryStatus.complete);
  t.is(historyStatus({ recorded: true, forTurn: true, first: { sequence: 8, turnFirstSequence: 7 } }), HistoryStatus.partial);
  t.is(historyStatus({ recorded: true, forTurn: true, first: { sequence: 1, turnFirstSequence: 1 } }), HistoryStatus.complete);
  t.is(historyStatus({ recorded: true, forTurn: true, first: { sequence: 7 } }), HistoryStatus.partial, "an event of no turn does not begin one");
});
