import test from "ava";
import net from "node:net";
import { freePort, unusedPort } from "../../node/servers.js";

/**
 * The kernel may hand a port that was just probed and closed to the next probe again,
 * before its first taker binds it: freePort never hands out the same port twice within
 * a minute. (Ports below 1024 here are the probe stand-in's: a real probe never answers them.)
 */
test("free port - a port the probe finds again within a minute is skipped; after a minute it may be handed out again", async (t) => {
  let now = 1_000_000;
  const answers = [101, 101, 101, 102];
  const probe = async () => answers.shift()!;
  t.is(await unusedPort(probe, () => now), 101);
  t.is(await unusedPort(probe, () => now), 102, "the same port twice in a row: the second is skipped");
  now += 60_001;
  t.is(await unusedPort(async () => 101, () => now), 101, "handed out over a minute ago");
  await t.throwsAsync(unusedPort(async () => 101, () => now), { message: /no free loopback port/ }, "a probe that only ever finds a handed-out port ends, bounded");
});

test("free port - ports handed out together are distinct and bindable", async (t) => {
  const ports = await Promise.all(Array.from({ length: 50 }, () => freePort()));
  t.is(new Set(ports).size, ports.length);
  const servers = await Promise.all(
    ports.map((port) => new Promise<net.Server>((resolve, reject) => {
      const server = net.createServer().once("error", reject);
      server.listen(port, "127.0.0.1", () => resolve(server));
    })),
  );
  await Promise.all(servers.map((server) => new Promise((resolve) => server.close(resolve))));
  t.pass();
});
