import test from "ava";
import { ferretDbEnv, usableMemory } from "../../node/servers.js";

const GiB = 1024 ** 3;

test("ferretdb env - GOGC 400, a soft memory limit of an eighth of the memory (64 MiB to 1 GiB) and the cores but one, unless the environment says otherwise", (t) => {
  t.like(ferretDbEnv({ PATH: "/usr/bin" }, 2, 24 * GiB), { PATH: "/usr/bin", GOGC: "400", GOMEMLIMIT: "1024MiB", GOMAXPROCS: "1" });
  t.is(ferretDbEnv({}, 2, 2 * GiB).GOMEMLIMIT, "256MiB", "a small machine or container");
  t.is(ferretDbEnv({}, 2, 256 * 1024 ** 2).GOMEMLIMIT, "64MiB", "never below 64 MiB");
  t.is(ferretDbEnv({}, 1, GiB).GOMAXPROCS, "1", "at least one core");
  t.is(ferretDbEnv({}, 8, GiB).GOMAXPROCS, "7");
  t.like(ferretDbEnv({ GOGC: "off", GOMEMLIMIT: "256MiB", GOMAXPROCS: "4" }, 2, GiB), { GOGC: "off", GOMEMLIMIT: "256MiB", GOMAXPROCS: "4" });
});

test("ferretdb env - the memory is the container's limit when it is below the machine's, else the machine's", (t) => {
  t.is(usableMemory(2 * GiB, 24 * GiB), 2 * GiB);
  t.is(usableMemory(undefined, 24 * GiB), 24 * GiB, "no answer");
  t.is(usableMemory(0, 24 * GiB), 24 * GiB, "limit unknown");
  t.is(usableMemory(2 ** 64, 24 * GiB), 24 * GiB, "no limit");
});
