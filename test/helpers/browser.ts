/**
 * A real Chromium for tests: Debian's `chromium` driven by playwright-core (no browser
 * download). Tests that need one skip, saying why, where it is absent.
 */
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { chromium, type BrowserContext } from "playwright-core";
import { PROJECT_ROOT } from "../../node/servers.js";

export const CHROMIUM = process.env.RUNS_TEST_CHROMIUM ?? "/usr/bin/chromium";

/** Why browser tests cannot run here, or undefined when they can. */
export function browserMissing(): string | undefined {
  return existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (Debian package chromium; .ci/run installs it where it can; RUNS_TEST_CHROMIUM names another)`;
}

/** Headless Chromium with a fresh profile; closed (and its profile removed) by the returned stop. */
export async function launchBrowser(): Promise<{ context: BrowserContext; stop: () => Promise<void> }> {
  const profile = await mkdtemp(path.join(os.tmpdir(), "runs-chromium-"));
  // Flags: no background traffic (this machine's network is closed), no GPU, root-safe.
  const args = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"];
  const context = await chromium.launchPersistentContext(profile, { executablePath: CHROMIUM, headless: true, args, timeout: 30_000 });
  return {
    context,
    stop: async () => {
      await context.close().catch(() => undefined);
      await rm(profile, { recursive: true, force: true });
    },
  };
}

/** Where tests leave screenshots for a person to look at (git-ignored). */
export async function artifactPath(name: string): Promise<string> {
  const dir = path.join(PROJECT_ROOT, ".test-artifacts");
  await mkdir(dir, { recursive: true });
  return path.join(dir, name);
}
