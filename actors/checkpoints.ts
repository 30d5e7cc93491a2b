import { spawn } from "node:child_process";
import { mkdir, readdir } from "node:fs/promises";
import type { ObjectStore } from "@nats-io/obj";

/** A workspace checkpoint could not be written or read. */
export class CheckpointError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "CheckpointError";
  }
}

/** Runs `tar` with `args`, feeding `input` or collecting its output. */
function tar(args: string[], input?: Uint8Array): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const child = spawn("tar", args, { stdio: ["pipe", "pipe", "pipe"] });
    const out: Buffer[] = [];
    let err = "";
    child.stdout.on("data", (d: Buffer) => out.push(d));
    child.stderr.on("data", (d: Buffer) => (err += d.toString()));
    child.on("error", reject);
    child.on("close", (code) => (code === 0 ? resolve(Buffer.concat(out)) : reject(new CheckpointError(`tar exited ${code}: ${err.trim()}`))));
    child.stdin.end(input ? Buffer.from(input) : undefined);
  });
}

/**
 * Run workspaces saved to a JetStream object store after every turn (DESIGN §4), and
 * restored on the node that takes a run over. The object is named by run id.
 */
export class WorkspaceCheckpoints {
  constructor(private readonly store: ObjectStore) {}

  /**
   * Saves the directory. An empty workspace of a run never saved before is skipped;
   * returns whether a checkpoint exists afterwards.
   */
  async save(runId: string, dir: string, savedBefore: boolean): Promise<boolean> {
    let entries: string[];
    try {
      entries = await readdir(dir);
    } catch {
      entries = [];
    }
    if (entries.length === 0 && !savedBefore) return false;
    try {
      const archive = await tar(["-czf", "-", "-C", dir, "."]);
      await this.store.putBlob({ name: runId }, archive);
      return true;
    } catch (err) {
      if (err instanceof CheckpointError) throw err;
      throw new CheckpointError(`could not save the workspace of ${runId}`, { cause: err });
    }
  }

  /** Restores the latest checkpoint into `dir`; false when the run has none. */
  async restore(runId: string, dir: string): Promise<boolean> {
    let archive: Uint8Array | null;
    try {
      archive = await this.store.getBlob(runId);
    } catch (err) {
      throw new CheckpointError(`could not read the workspace of ${runId}`, { cause: err });
    }
    if (!archive) return false;
    await mkdir(dir, { recursive: true });
    await tar(["-xzf", "-", "-C", dir], archive);
    return true;
  }

  async remove(runId: string): Promise<void> {
    try {
      await this.store.delete(runId);
    } catch {
      // absent already
    }
  }
}
