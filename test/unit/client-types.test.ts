import test from "ava";
import { TurnStatus as ClientTurnStatus, isFinalTurnStatus } from "../../client/index.js";
import { FINAL_TURN_STATUSES, TurnStatus } from "../../src/domain.js";

test("client types - the client's turn statuses and final set are the server's", (t) => {
  t.deepEqual(ClientTurnStatus, TurnStatus);
  for (const status of Object.values(TurnStatus)) t.is(isFinalTurnStatus(status), FINAL_TURN_STATUSES.has(status), status);
});
