import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import path from "node:path";

/**
 * The import graph of the production folders, and the two rules docs/architecture.md
 * states: imports point down the layers, only to another folder's `index.ts`, and no
 * file reaches itself through its imports.
 */

/** Which top folders each layer may import (besides itself). */
export const LAYERS: Record<string, readonly string[]> = {
  node: ["gateway", "actors", "src", "client"],
  gateway: ["src"],
  actors: ["src"],
  src: [],
  client: [],
  // Browser code: it reaches the service over HTTP only.
  console: [],
};

/** file (relative to the root, with `/`) → files it imports (relative, resolved to `.ts`). */
export type ImportGraph = Map<string, string[]>;

const IMPORT = /(?:^|\n)\s*(?:import|export)\s[^"';]*?from\s*["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)|(?:^|\n)\s*import\s*["']([^"']+)["']/g;

/** Relative specifiers of one source text, in order (type-only imports included: they couple too). */
export function specifiersOf(text: string): string[] {
  const out: string[] = [];
  for (const m of text.matchAll(IMPORT)) {
    const spec = m[1] ?? m[2] ?? m[3];
    if (spec && spec.startsWith(".")) out.push(spec);
  }
  return out;
}

function tsFiles(dir: string): string[] {
  const out: string[] = [];
  for (const name of readdirSync(dir)) {
    const full = path.join(dir, name);
    if (statSync(full).isDirectory()) out.push(...tsFiles(full));
    else if ((name.endsWith(".ts") || name.endsWith(".tsx")) && !name.endsWith(".d.ts")) out.push(full);
  }
  return out;
}

/** Reads every `.ts` file under the layer folders of `root`. */
export function readGraph(root: string): ImportGraph {
  const graph: ImportGraph = new Map();
  for (const layer of Object.keys(LAYERS)) {
    const dir = path.join(root, layer);
    let files: string[];
    try {
      files = tsFiles(dir);
    } catch {
      continue;
    }
    for (const file of files) {
      const from = path.relative(root, file).split(path.sep).join("/");
      const targets = specifiersOf(readFileSync(file, "utf8")).map((spec) => {
        const target = path.posix.normalize(path.posix.join(path.posix.dirname(from), spec)).replace(/\.js$/, ".ts");
        // A `.js` specifier names a `.ts` file, or a `.tsx` one where that is what exists.
        return existsSync(path.join(root, target)) || !existsSync(path.join(root, `${target}x`)) ? target : `${target}x`;
      });
      graph.set(from, targets);
    }
  }
  return graph;
}

const layerOf = (file: string) => file.split("/")[0]!;

/** Imports that point up or sideways, or into another folder's internals. */
export function layerViolations(graph: ImportGraph): string[] {
  const out: string[] = [];
  for (const [from, targets] of graph) {
    const own = layerOf(from);
    for (const to of targets) {
      const other = layerOf(to);
      if (other === own) continue;
      if (!(other in LAYERS)) {
        out.push(`${from} imports ${to}, outside the layers`);
      } else if (!LAYERS[own]!.includes(other)) {
        out.push(`${from} imports ${to}: ${own}/ may not import ${other}/`);
      } else if (to !== `${other}/index.ts`) {
        out.push(`${from} imports ${to}: import ${other}/index.ts, not its internals`);
      }
    }
  }
  return out;
}

/** Every cycle, each as the files around it (Tarjan's strongly connected components). */
export function cycles(graph: ImportGraph): string[][] {
  let next = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const out: string[][] = [];
  const visit = (v: string) => {
    index.set(v, next);
    low.set(v, next);
    next++;
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue;
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) {
        low.set(v, Math.min(low.get(v)!, index.get(w)!));
      }
    }
    if (low.get(v) === index.get(v)) {
      const component: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        component.push(w);
      } while (w !== v);
      const selfLoop = (graph.get(v) ?? []).includes(v);
      if (component.length > 1 || selfLoop) out.push(component.sort());
    }
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return out;
}
