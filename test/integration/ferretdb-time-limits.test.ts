import { withStoreClients } from "../helpers/store-clients.js";

/**
 * FerretDB's write queue (deploy/tools/ferretdb/write-queue.patch) and commands with time
 * limits, on a FerretDB of their own. FerretDB ends a command's context on find's and
 * findAndModify's maxTimeMS, and its SQLite driver interrupts the statement running then.
 * The driver FerretDB 1.24.2 names (modernc.org/sqlite v1.32.0) did that wrongly: a query
 * cut right after its first row left that statement open on its pooled connection, which
 * then read from an old snapshot (rows written later were missing) and failed other
 * commands with "interrupted (9)" until FerretDB restarted; and an interrupt could land
 * late, in another command's statement. deploy/tools/ferretdb pins a driver with both
 * fixed (see deploy/tools/README.md). The service sets no time limits; an operator's tool
 * (Compass, mongosh) might, and the service's commands share FerretDB's pool with it.
 */

const test = withStoreClients();

/** Reads of `_id` from every client, enough to take most of FerretDB's pooled connections. */
async function everyConnectionReads(
  coll: (i: number) => { findOne(filter: { _id: string }): Promise<unknown> },
  id: string,
): Promise<string[]> {
  const reads = await Promise.all(
    Array.from({ length: 192 }, (_, i) => coll(i).findOne({ _id: id }).then((doc) => (doc ? "found" : "missing"), (err: unknown) => String(err).slice(0, 80))),
  );
  return [...new Set(reads)];
}

test.serial("finds cut by their time limit leave no pooled connection behind: every read sees the row written just before", async (t) => {
  const { clients, servers } = t.context;
  if (!servers.ferret.pid) return t.pass("an external store (RUNS_TEST_MONGODB_URI): its driver is not FerretDB's");
  const coll = (i: number) => clients[i % 3]!.db(`${servers.dbName}_reads`).collection<{ _id: string; n: number }>("limited");
  await coll(0).insertMany(Array.from({ length: 2000 }, (_, i) => ({ _id: `d${i}`, n: i })));
  // Each find scans the rows for its last five, so limits of 1 to 10 ms cut most of them
  // while they run, some right after their first row, where the old driver left the
  // statement open (its connection answered from before that moment ever after: every
  // read after some round missed the new row). The reads reach such a connection only
  // when the pool hands it to them: this detects the old driver (it failed three runs of
  // three), it does not prove every connection clean. First in the file: run after the
  // next test, the old driver passed it (its finds were cut at other moments).
  let cut = 0;
  const otherErrors: string[] = [];
  for (let round = 0; round < 8; round++) {
    const limited = Array.from({ length: 150 }, (_, i) =>
      coll(i)
        .find({ n: { $gte: 1995 } }, { maxTimeMS: 1 + (i % 10) })
        .toArray()
        .then(
          () => 0,
          (err: { code?: unknown }) => {
            if (err.code === 50) return 1; // MaxTimeMSExpired
            otherErrors.push(String(err).slice(0, 120));
            return 0;
          },
        ),
    );
    cut += (await Promise.all(limited)).reduce((a: number, b) => a + b, 0);
    await coll(round).insertOne({ _id: `fresh${round}`, n: -1 });
    t.deepEqual(await everyConnectionReads(coll, `fresh${round}`), ["found"], `round ${round}`);
  }
  t.log(`${cut} of 1,200 limited finds cut by their limit; other errors: ${otherErrors.length ? [...new Set(otherErrors)].join("; ") : "none"}`);
  t.true(cut >= 120, "fewer than a tenth of the finds were cut: the test no longer shows what it is for");
  t.deepEqual(otherErrors, []);
  t.is(await coll(0).countDocuments({ n: -1 }), 8);
});

test.serial("commands whose time limit ends while they wait or write fail alone; writes after them land", async (t) => {
  const { clients, servers } = t.context;
  const coll = (i: number) => clients[i % 3]!.db(`${servers.dbName}_writes`).collection<{ _id: string; n: number }>("limited");
  await coll(0).insertMany(Array.from({ length: 100 }, (_, i) => ({ _id: `d${i}`, n: 0 })));
  // Limits of 1 to 20 ms end some commands in the queue, some inside their transaction
  // (an earlier version of the patch lost its writers' connection then, for good), and
  // let others finish. 12 rounds, each followed by a write from every client and reads
  // of it. Nothing is tried again: a write or read failing after a round fails the test.
  let finished = 0;
  for (let round = 0; round < 12; round++) {
    const limited = Array.from({ length: 150 }, (_, i) =>
      coll(i).findOneAndUpdate({ _id: `d${i % 100}` }, { $inc: { n: 1 } }, { maxTimeMS: 1 + (i % 20) }).then(() => 1, () => 0),
    );
    finished += (await Promise.all(limited)).reduce((a: number, b) => a + b, 0);
    for (let c = 0; c < 3; c++) t.is((await coll(c).updateOne({ _id: `d${c}` }, { $set: { round } })).matchedCount, 1, `round ${round}`);
    await coll(round).insertOne({ _id: `after${round}`, n: round });
    t.deepEqual(await everyConnectionReads(coll, `after${round}`), ["found"], `round ${round}`);
  }
  t.log(`${finished} of 1,800 limited commands finished`);
});
