import test from "ava";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { removeTree, treeBytes } from "../../actors/sandbox-host.js";

/** Makes, below `base`, a tree deeper than a path can name (25 folders of 200-character names: ~5,000 bytes) holding `bytes` at its bottom. */
function deepTree(base: string, bytes: number): void {
  const made = spawnSync("bash", ["-c", `cd "$1" && for i in $(seq 25); do mkdir "$(printf %0200d $i)" && cd "$_" || exit 1; done && head -c ${bytes} /dev/urandom > hidden`, "bash", base], { encoding: "utf8", timeout: 30_000 });
  if (made.status !== 0) throw new Error(`could not make the deep tree: ${made.stderr}`);
}

test("workspace trees - a tree deeper than PATH_MAX is measured whole (du) and removed (rm), where Node's own walk and rm stop at the path's length", async (t) => {
  const base = await mkdtemp(path.join(os.tmpdir(), "runs-trees-"));
  try {
    const dir = path.join(base, "workspace");
    await mkdir(dir);
    deepTree(dir, 4 * 1024 * 1024);
    const bytes = await treeBytes(dir, 64 * 1024 * 1024);
    t.true(bytes >= 4 * 1024 * 1024 && bytes < 8 * 1024 * 1024, `${bytes} bytes`);
    // Node's rm cannot remove it (the reason removeTree falls back to rm(1)).
    const direct = await rm(dir, { recursive: true, force: true }).then(() => "removed", (err: NodeJS.ErrnoException) => err.code);
    if (direct === "removed") t.log(`this Node (${process.version}) removes trees past PATH_MAX itself`);
    else t.is(direct, "ENAMETOOLONG");
    if (existsSync(dir)) await removeTree(dir);
    t.false(existsSync(dir));
    await removeTree(dir); // gone already: nothing to do
  } finally {
    spawnSync("rm", ["-rf", base]);
  }
});

test("workspace trees - folders count with their blocks (a folder of many long names is not free), files by blocks not length; a missing tree is 0; counting stops past stopAt", async (t) => {
  const base = await mkdtemp(path.join(os.tmpdir(), "runs-trees-"));
  try {
    const names = path.join(base, "names");
    await mkdir(names);
    for (let i = 0; i < 2_000; i++) await writeFile(path.join(names, `${String(i).padStart(240, "x")}`), "");
    const folderOnly = await treeBytes(names, Infinity);
    const du = Number(spawnSync("du", ["-s", "-B1", names], { encoding: "utf8" }).stdout.split(/\s/)[0]);
    t.true(folderOnly >= 64 * 1024, `2,000 empty files of 240-character names: ${folderOnly} bytes`);
    t.true(folderOnly <= du, `${folderOnly} within du's ${du}`);
    const sparse = path.join(base, "sparse");
    await mkdir(sparse);
    spawnSync("truncate", ["-s", "512M", path.join(sparse, "hole")]);
    t.true((await treeBytes(sparse, Infinity)) < 1024 * 1024);
    t.is(await treeBytes(path.join(base, "missing"), 100), 0);
    const stopped = await treeBytes(base, 1);
    t.true(stopped > 1 && stopped <= folderOnly + (await treeBytes(sparse, Infinity)) + 64 * 1024, `${stopped}`);
  } finally {
    await rm(base, { recursive: true, force: true });
  }
});
