import test from "ava";
import { ferretDbEnv } from "../../node/servers.js";

test("ferretdb env - GOGC 400, a 1 GiB soft memory limit and the cores but one, unless the environment says otherwise", (t) => {
  const env = ferretDbEnv({ PATH: "/usr/bin" }, 2);
  t.like(env, { PATH: "/usr/bin", GOGC: "400", GOMEMLIMIT: "1GiB", GOMAXPROCS: "1" });
  t.is(ferretDbEnv({}, 1).GOMAXPROCS, "1", "at least one");
  t.is(ferretDbEnv({}, 8).GOMAXPROCS, "7");
  t.like(ferretDbEnv({ GOGC: "off", GOMEMLIMIT: "256MiB", GOMAXPROCS: "4" }, 2), { GOGC: "off", GOMEMLIMIT: "256MiB", GOMAXPROCS: "4" });
});
