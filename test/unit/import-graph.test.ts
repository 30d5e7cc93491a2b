/**
 * The layering rules of docs/architecture.md, checked over the real tree: imports
 * point down (node → gateway, actors → src; client apart), only to another folder's
 * index.ts, and no file reaches itself through its imports.
 */
import test from "ava";
import { PROJECT_ROOT } from "../../node/servers.js";
import { cycles, layerViolations, readGraph, specifiersOf, type ImportGraph } from "../helpers/import-graph.js";

const graph = (edges: Record<string, string[]>): ImportGraph => new Map(Object.entries(edges));

test("import graph - the tree has no deep import, no upward import and no cycle", (t) => {
  const tree = readGraph(PROJECT_ROOT);
  t.true(tree.size > 50, `read ${tree.size} files`);
  for (const layer of ["node", "gateway", "actors", "src", "client"]) {
    t.true([...tree.keys()].some((file) => file.startsWith(`${layer}/`)), `${layer}/ was read`);
  }
  t.deepEqual(layerViolations(tree), []);
  t.deepEqual(cycles(tree), []);
});

test("import graph - a deep import, an upward import and a sideways import are each caught", (t) => {
  const found = layerViolations(
    graph({
      "gateway/routes/runs.ts": ["src/mongo-store.ts", "src/index.ts", "gateway/context.ts"],
      "src/config.ts": ["gateway/index.ts"],
      "gateway/router.ts": ["actors/index.ts"],
      "client/client.ts": ["src/index.ts"],
      "node/main.ts": ["gateway/index.ts", "actors/index.ts", "src/index.ts", "client/index.ts"],
      "actors/run-actor.ts": ["test/helpers/servers.ts"],
    }),
  );
  t.deepEqual(found, [
    "gateway/routes/runs.ts imports src/mongo-store.ts: import src/index.ts, not its internals",
    "src/config.ts imports gateway/index.ts: src/ may not import gateway/",
    "gateway/router.ts imports actors/index.ts: gateway/ may not import actors/",
    "client/client.ts imports src/index.ts: client/ may not import src/",
    "actors/run-actor.ts imports test/helpers/servers.ts, outside the layers",
  ]);
});

test("import graph - cycles are found whatever their length; a chain is not one", (t) => {
  t.deepEqual(
    cycles(
      graph({
        "gateway/app.ts": ["gateway/routes/runs.ts"],
        "gateway/routes/runs.ts": ["gateway/app.ts", "gateway/loaders.ts"],
        "gateway/loaders.ts": ["gateway/context.ts"],
        "gateway/context.ts": [],
        "src/a.ts": ["src/b.ts"],
        "src/b.ts": ["src/c.ts"],
        "src/c.ts": ["src/a.ts"],
        "src/self.ts": ["src/self.ts"],
      }),
    ).sort((x, y) => x[0]!.localeCompare(y[0]!)),
    [["gateway/app.ts", "gateway/routes/runs.ts"], ["src/a.ts", "src/b.ts", "src/c.ts"], ["src/self.ts"]],
  );
  t.deepEqual(cycles(graph({ "a.ts": ["b.ts"], "b.ts": ["c.ts"], "c.ts": [] })), []);
});

test("import graph - specifiers of static, type-only, re-export, side-effect and dynamic imports", (t) => {
  const text = [
    'import { a } from "./a.js";',
    'import type { B } from "../src/index.js";',
    "import {\n  c,\n  type D,\n} from './c.js';",
    'export { e } from "./e.js";',
    'export * from "./f.js";',
    'import "./side.js";',
    'const g = await import("./g.js");',
    'import pino from "pino";',
  ].join("\n");
  t.deepEqual(specifiersOf(text), ["./a.js", "../src/index.js", "./c.js", "./e.js", "./f.js", "./g.js", "./side.js"].sort((x, y) => text.indexOf(x) - text.indexOf(y)));
});
