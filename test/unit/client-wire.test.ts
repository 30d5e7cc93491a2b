import test from "ava";
import { readFile } from "node:fs/promises";
import { clientWireSource, WIRE_FILE } from "../../scripts/gen-client-wire.js";

test("client wire types - client/wire.ts is what the current OpenAPI document generates (regenerate: npm run gen:client)", async (t) => {
  t.timeout(30_000);
  const committed = await readFile(WIRE_FILE, "utf8");
  const current = await clientWireSource();
  t.true(committed === current, "client/wire.ts is stale: run npm run gen:client");
});
