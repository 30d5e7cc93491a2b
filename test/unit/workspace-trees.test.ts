import test, { type ExecutionContext } from "ava";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { chmod, chown, link, lstat, mkdir, mkdtemp, rm, stat, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { chownTree, clearSetIdBits, closedToOthers, liveTreeUsage, removeTree, treeUsage } from "../../actors/sandbox-host.js";

/**
 * Makes, below `base`, a tree deeper than a path can name (25 folders of 200-character
 * names: ~5,000 bytes) holding `bytes` at its bottom, beside links to `outside`'s file and
 * folder (what a hostile command plants for the service's walks to follow).
 */
function deepTree(base: string, bytes: number, outside: Outside): void {
  const made = spawnSync("bash", ["-c", `cd "$1" && for i in $(seq 25); do mkdir "$(printf %0200d $i)" && cd "$_" || exit 1; done && head -c ${bytes} /dev/urandom > hidden && ln -s "$2" file-link && ln -s "$3" folder-link`, "bash", base, outside.file, outside.folder], { encoding: "utf8", timeout: 30_000 });
  if (made.status !== 0) throw new Error(`could not make the deep tree: ${made.stderr}`);
}

/** Whether a child can be run as root without its capabilities (setpriv), which reads only what modes allow, as a service sharing the sandboxes' uid does. */
const CAPLESS_ROOT = process.getuid?.() === 0 && spawnSync("setpriv", ["--version"]).status === 0;

/** Runs `body` with a fresh folder below the system's temporary one, removed after whatever the body left (closed folders, paths past PATH_MAX). */
async function inTempBase(body: (base: string) => Promise<void>): Promise<void> {
  const base = await mkdtemp(path.join(os.tmpdir(), "runs-trees-"));
  try {
    await body(base);
  } finally {
    spawnSync("chmod", ["-R", "u+rwX", base]);
    spawnSync("rm", ["-rf", base]);
  }
}

/** `base/workspace` holding {@link deepTree} (with `bytes` at its bottom), and the outside its links point at. */
async function deepWorkspace(base: string, bytes: number): Promise<{ dir: string; outside: Outside }> {
  const dir = path.join(base, "workspace");
  await mkdir(dir);
  const outside = await outsideOf(base);
  deepTree(dir, bytes, outside);
  return { dir, outside };
}

const unbounded = { bytes: Infinity, entries: Infinity };

interface Outside {
  file: string;
  folder: string;
}

/** A 16 MiB file (mode 0640) and a folder holding one, outside the tree, for links to point at. */
async function outsideOf(base: string): Promise<Outside> {
  const folder = path.join(base, "outside");
  await mkdir(folder);
  const file = path.join(folder, "host-file");
  await writeFile(file, Buffer.alloc(16 * 1024 * 1024, 7), { mode: 0o640 });
  await chmod(file, 0o640);
  return { file, folder };
}

/** The outside file and folder are as they were: not counted, chmodded, chowned nor removed through the links. */
async function untouched(t: ExecutionContext, outside: Outside): Promise<void> {
  const st = await stat(outside.file);
  t.is(st.mode & 0o777, 0o640);
  t.is(st.uid, process.getuid?.() ?? st.uid);
  t.is(st.size, 16 * 1024 * 1024);
  t.true(existsSync(outside.folder));
}

test("workspace trees - a tree deeper than PATH_MAX is measured whole (du) and removed (rm), where Node's own walk and rm stop at the path's length", async (t) => {
  await inTempBase(async (base) => {
    const { dir, outside } = await deepWorkspace(base, 4 * 1024 * 1024);
    const { bytes, entries } = await treeUsage(dir, { bytes: 64 * 1024 * 1024, entries: Infinity });
    t.is(entries, 28, "25 folders, a file and two links, counted by du");
    t.true(bytes >= 4 * 1024 * 1024 && bytes < 8 * 1024 * 1024, `${bytes} bytes`);
    // Node's rm cannot remove it (the reason removeTree falls back to rm(1)).
    const direct = await rm(dir, { recursive: true, force: true }).then(() => "removed", (err: NodeJS.ErrnoException) => err.code);
    if (direct === "removed") t.log(`this Node (${process.version}) removes trees past PATH_MAX itself`);
    else t.is(direct, "ENAMETOOLONG");
    if (existsSync(dir)) await removeTree(dir);
    t.false(existsSync(dir));
    await removeTree(dir); // gone already: nothing to do
    await untouched(t, outside);
  });
});

test("workspace trees - sizes as du(1) gives them: folders with their blocks (a folder of many long names is not free where folders take blocks), files by blocks not length, a file of several links once; a missing tree is 0; counting stops past stopAt", async (t) => {
  const du = (dir: string) => Number(spawnSync("du", ["-s", "-B1", dir], { encoding: "utf8" }).stdout.split(/\s/)[0]);
  await inTempBase(async (base) => {
    const names = path.join(base, "names");
    await mkdir(names);
    for (let i = 0; i < 2_000; i++) await writeFile(path.join(names, `${String(i).padStart(240, "x")}`), "");
    const folder = (await treeUsage(names, unbounded)).bytes;
    t.is(folder, du(names));
    t.log(`a folder of 2,000 names of 240 characters: ${folder} bytes (folders take no blocks on some filesystems, tmpfs and btrfs)`);
    const files = path.join(base, "files");
    await mkdir(files);
    await writeFile(path.join(files, "data"), Buffer.alloc(1024 * 1024, 1));
    for (let i = 0; i < 5; i++) spawnSync("ln", [path.join(files, "data"), path.join(files, `link${i}`)]);
    spawnSync("truncate", ["-s", "512M", path.join(files, "hole")]);
    const counted = (await treeUsage(files, unbounded)).bytes;
    t.is(counted, du(files));
    t.true(counted >= 1024 * 1024 && counted < 2 * 1024 * 1024, `${counted}`);
    t.deepEqual(await treeUsage(path.join(base, "missing"), { bytes: 100, entries: 100 }), { bytes: 0, entries: 0 });
    const stopped = (await treeUsage(base, { bytes: 1, entries: Infinity })).bytes;
    t.true(stopped > 1 && stopped < du(base), `${stopped}`);
  });
});

test("workspace trees - entries are counted whatever their size (10,000 empty files take no block), each name of a linked file once; counting stops past the entries' stopAt", async (t) => {
  await inTempBase(async (base) => {
    const empty = path.join(base, "empty");
    await mkdir(empty);
    await mkdir(path.join(empty, "sub"));
    for (let i = 0; i < 10_000; i++) await writeFile(path.join(empty, i % 2 ? "sub" : "", `f${i}`), "");
    spawnSync("ln", [path.join(empty, "f0"), path.join(empty, "f0-again")]);
    const whole = await treeUsage(empty, unbounded);
    t.is(whole.entries, 10_002, "10,000 files, a folder and a second name");
    t.true(whole.bytes < 2 * 1024 * 1024, `${whole.bytes} bytes: the folders' blocks only`);
    const stopped = await treeUsage(empty, { bytes: Infinity, entries: 100 });
    t.is(stopped.entries, 101, "stopped at the first entry past the bound");
  });
});

test("workspace trees - names that are not UTF-8 are measured and chowned by their bytes (a U+FFFD stand-in names nothing); set-user-ID and set-group-ID bits are cleared, links left alone", async (t) => {
  await inTempBase(async (base) => {
    const dir = path.join(base, "workspace");
    await mkdir(dir);
    const bad = Buffer.concat([Buffer.from(`${dir}/bad`), Buffer.from([0xff])]);
    await mkdir(bad);
    const inner = Buffer.concat([bad, Buffer.from("/data\xfe", "latin1")]);
    await writeFile(inner, Buffer.alloc(64 * 1024, 1));
    const usage = await treeUsage(dir, unbounded);
    t.is(usage.entries, 2);
    t.true(usage.bytes >= 64 * 1024, `${usage.bytes}`);
    if (process.getuid?.() !== 0) return;
    const setuid = path.join(dir, "sh");
    await writeFile(setuid, "#!/bin/sh\n", { mode: 0o755 });
    await chmod(setuid, 0o4755);
    await chmod(bad, 0o2775);
    const outside = await outsideOf(base);
    await chmod(outside.file, 0o4640);
    await symlink(outside.file, path.join(dir, "link"));
    await chownTree(dir, 65534, 65534);
    t.is((await lstat(inner)).uid, 65534, "the file below a name that is not UTF-8");
    t.is((await lstat(bad)).uid, 65534);
    t.is((await lstat(setuid)).mode & 0o7777, 0o755, "set-user-ID cleared");
    t.is((await lstat(bad)).mode & 0o7777, 0o775, "set-group-ID cleared");
    t.is((await lstat(outside.file)).mode & 0o7777, 0o4640, "a link's target is not touched");
  });
});

test("workspace trees - a service sharing the sandboxes' uid clears set-ID bits (links left alone) without chowning, and never throws", async (t) => {
  await inTempBase(async (base) => {
    const dir = path.join(base, "workspace");
    await mkdir(path.join(dir, "sub"), { recursive: true });
    const file = path.join(dir, "sub", "tool");
    await writeFile(file, "#!/bin/sh\n");
    await chmod(file, 0o6755);
    const outside = await outsideOf(base);
    await chmod(outside.file, 0o4640);
    await symlink(outside.file, path.join(dir, "link"));
    t.is(await clearSetIdBits(dir), undefined);
    t.is((await stat(file)).mode & 0o7777, 0o755);
    t.is((await stat(outside.file)).mode & 0o7777, 0o4640);
    t.is(await clearSetIdBits(path.join(base, "missing")), undefined, "nothing there: nothing to do, nothing thrown");
  });
});

test("workspace trees - a service sharing the sandboxes' uid (here root without its capabilities) clears set-ID bits below a folder a command closed (chmod 000), and leaves another uid's file as it is, saying so instead of throwing", async (t) => {
  if (!CAPLESS_ROOT) return t.pass("needs root and setpriv (to run as root without its capabilities)");
  await inTempBase(async (base) => {
    const dir = path.join(base, "workspace");
    await mkdir(path.join(dir, "closed", "inner"), { recursive: true });
    const hidden = path.join(dir, "closed", "inner", "tool");
    await writeFile(hidden, "#!/bin/sh\n");
    await chmod(hidden, 0o6755);
    await chmod(path.join(dir, "closed"), 0o000);
    // Another uid's file (a checkpoint restored as root keeps its owners): not the service's to change.
    const foreign = path.join(dir, "foreign");
    await writeFile(foreign, "#!/bin/sh\n");
    await chown(foreign, 12345, 12345);
    await chmod(foreign, 0o4755);
    const module = pathToFileURL(path.resolve("actors/sandbox-host.ts")).href;
    const script = `const { clearSetIdBits } = await import(${JSON.stringify(module)}); const err = await clearSetIdBits(${JSON.stringify(dir)}); console.log(JSON.stringify({ error: err ? err.message : null }));`;
    const child = spawnSync("setpriv", ["--bounding-set=-all", "--inh-caps=-all", process.execPath, "--import", "tsx", "--input-type=module", "-e", script], { encoding: "utf8", timeout: 60_000 });
    t.is(child.status, 0, child.stderr);
    const { error } = JSON.parse(child.stdout.trim().split("\n").at(-1)!);
    t.regex(String(error), /foreign/, "what it could not change is told, not thrown");
    t.is((await stat(hidden)).mode & 0o7777, 0o755, "the closed folder was opened and its file's bits cleared");
    t.is((await stat(foreign)).mode & 0o7777, 0o4755);
  });
});

test("workspace trees - set-ID bits below a path longer than PATH_MAX are cleared too (chmod -R takes over from the walk)", async (t) => {
  await inTempBase(async (base) => {
    const { dir } = await deepWorkspace(base, 1024);
    const inDeep = (command: string) => spawnSync("bash", ["-c", `cd "$1" && for i in $(seq 25); do cd "$(printf %0200d $i)" || exit 1; done && ${command}`, "bash", dir], { encoding: "utf8" });
    t.is(inDeep("chmod 4755 hidden").status, 0);
    t.is(inDeep("stat -c %a hidden").stdout, "4755\n");
    t.is(await clearSetIdBits(dir), undefined);
    t.is(inDeep("stat -c %a hidden").stdout, "755\n");
  });
});

test("workspace trees - the workspaces' folder is closed to others: 0710 with the sandboxes' group where the service owns it, 0700 where the sandboxes' uid does (a service sharing it), left alone when already so", async (t) => {
  await inTempBase(async (base) => {
    const own = { uid: process.getuid!(), gid: process.getgid!() };
    const shared = path.join(base, "shared");
    await mkdir(shared, { mode: 0o755 });
    await chmod(shared, 0o755);
    t.true(await closedToOthers(shared, own), "the sandboxes' uid owns it");
    t.is((await stat(shared)).mode & 0o777, 0o700);
    t.true(await closedToOthers(shared, own));
    if (own.uid !== 0) return;
    const served = path.join(base, "served");
    await mkdir(served);
    await chmod(served, 0o710);
    // As an earlier version left it: the right mode and group, but an operator's uid (which would keep its access).
    await chown(served, 4242, 65534);
    t.true(await closedToOthers(served, { uid: 65534, gid: 65534 }));
    const info = await stat(served);
    t.is(info.mode & 0o777, 0o710);
    t.is(info.uid, 0, "the service keeps it");
    t.is(info.gid, 65534);
  });
});

test("workspace trees - a tree deeper than PATH_MAX is chowned whole (chown), where Node's walk stops at the path's length", async (t) => {
  if (process.getuid?.() !== 0) return t.pass("only root chowns a workspace");
  await inTempBase(async (base) => {
    const { dir, outside } = await deepWorkspace(base, 1024);
    await chownTree(dir, 65534, 65534);
    const owners = spawnSync("bash", ["-c", 'cd "$1" && for i in $(seq 25); do cd "$(printf %0200d $i)" || exit 1; done && stat -c %u hidden . && cd "$1" && stat -c %u .', "bash", dir], { encoding: "utf8" });
    t.is(owners.stdout, "65534\n65534\n65534\n", owners.stderr);
    await untouched(t, outside);
  });
});

test("workspace trees - a flood of hard links counts a name each, alike while a command runs (du) and after it (the walk), and a file's blocks once", async (t) => {
  await inTempBase(async (base) => {
    const dir = path.join(base, "workspace");
    await mkdir(dir);
    await writeFile(path.join(dir, "file"), Buffer.alloc(256 * 1024, 1));
    for (let i = 0; i < 300; i++) await link(path.join(dir, "file"), path.join(dir, `link-${i}`));
    const live = await liveTreeUsage(dir);
    const exact = await treeUsage(dir, unbounded);
    t.is(exact.entries, 301, "the file and its 300 other names");
    t.is(live.entries, exact.entries);
    t.true(live.bytes < 512 * 1024 && exact.bytes < 512 * 1024, `${live.bytes} / ${exact.bytes}: the file's blocks once`);
  });
});

test("workspace trees - measured while a command runs (liveTreeUsage, du by descriptors), a tree past PATH_MAX is counted whole and what a folder made unreadable holds is left out, nothing is changed to read it; a missing tree or a stopped measurement rejects", async (t) => {
  await inTempBase(async (base) => {
    const { dir, outside } = await deepWorkspace(base, 4 * 1024 * 1024);
    await writeFile(path.join(dir, "seen"), Buffer.alloc(1024 * 1024, 1));
    const live = await liveTreeUsage(dir);
    const exact = await treeUsage(dir, unbounded);
    t.is(live.entries, exact.entries, "25 folders, two files and two links");
    t.true(live.bytes >= 5 * 1024 * 1024 && live.bytes < 8 * 1024 * 1024, `${live.bytes}`);
    await t.throwsAsync(liveTreeUsage(path.join(base, "missing")));
    await t.throwsAsync(liveTreeUsage(dir, AbortSignal.abort()));
    await untouched(t, outside);
    if (!CAPLESS_ROOT) return;
    const closed = path.join(base, "closed-tree");
    await mkdir(path.join(closed, "closed"), { recursive: true });
    await writeFile(path.join(closed, "closed", "data"), Buffer.alloc(2 * 1024 * 1024, 1));
    await chmod(path.join(closed, "closed"), 0o000);
    // du's complaints about 1,500 more (over 64 KiB of them) do not cost the measurement.
    for (let i = 0; i < 1_500; i++) await mkdir(path.join(closed, `closed-${"x".repeat(40)}-${i}`), { mode: 0 });
    await writeFile(path.join(closed, "open"), Buffer.alloc(1024 * 1024, 1));
    const module = pathToFileURL(path.resolve("actors/sandbox-host.ts")).href;
    const script = `const { liveTreeUsage } = await import(${JSON.stringify(module)}); console.log(JSON.stringify(await liveTreeUsage(${JSON.stringify(closed)})));`;
    // Root without capabilities reads only what its modes allow, as any other uid.
    const child = spawnSync("setpriv", ["--bounding-set=-all", "--inh-caps=-all", process.execPath, "--import", "tsx", "--input-type=module", "-e", script], { encoding: "utf8", timeout: 60_000 });
    t.is(child.status, 0, child.stderr);
    const unreadable = JSON.parse(child.stdout.trim().split("\n").at(-1)!);
    t.is(unreadable.entries, 1 + 1_500 + 1, "the closed folders themselves and the open file, not what they hold");
    // The open file and the folders' own blocks (none on tmpfs), not the closed folder's 2 MiB.
    t.true(unreadable.bytes >= 1024 * 1024 && unreadable.bytes < 1024 * 1024 + 1_502 * 4096 + 512 * 1024, `${unreadable.bytes}`);
    t.is((await stat(path.join(closed, "closed"))).mode & 0o777, 0, "left as the command made it");
  });
});

test("workspace trees - a folder its owner made unreadable (chmod 000) is measured and removed all the same, as a service that shares the sandboxes' uid (here root without its capabilities) must", async (t) => {
  if (!CAPLESS_ROOT) return t.pass("needs root and setpriv (to run as root without its capabilities)");
  await inTempBase(async (base) => {
    const dir = path.join(base, "workspace");
    await mkdir(path.join(dir, "closed", "inner"), { recursive: true });
    await writeFile(path.join(dir, "closed", "inner", "data"), Buffer.alloc(2 * 1024 * 1024, 1));
    const outside = await outsideOf(base);
    await symlink(outside.file, path.join(dir, "closed", "inner", "file-link"));
    await symlink(outside.folder, path.join(dir, "closed", "folder-link"));
    await chmod(path.join(dir, "closed"), 0o000);
    const module = pathToFileURL(path.resolve("actors/sandbox-host.ts")).href;
    const script = `const { treeUsage, removeTree } = await import(${JSON.stringify(module)}); const dir = ${JSON.stringify(dir)}; const { bytes } = await treeUsage(dir, { bytes: 1 << 30, entries: Infinity }); await removeTree(dir); console.log(JSON.stringify({ bytes }));`;
    // Root without capabilities reads and removes only what its modes allow, as any other uid.
    const child = spawnSync("setpriv", ["--bounding-set=-all", "--inh-caps=-all", process.execPath, "--import", "tsx", "--input-type=module", "-e", script], { encoding: "utf8", timeout: 60_000 });
    t.is(child.status, 0, child.stderr);
    const { bytes } = JSON.parse(child.stdout.trim().split("\n").at(-1)!);
    t.true(bytes >= 2 * 1024 * 1024 && bytes < 3 * 1024 * 1024, `${bytes}`);
    t.false(existsSync(dir));
    await untouched(t, outside);
  });
});
