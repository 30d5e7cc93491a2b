import test from "ava";
import { startupBanner } from "../../node/banner.js";

test("banner - a first embedded start: addresses in use, the key once, the tap with where its password is, the data folder", (t) => {
  const text = startupBanner({
    url: "http://127.0.0.1:8081",
    console: true,
    docs: true,
    dataDir: "/srv/runs/.runs",
    embeddedNatsUrl: "nats://127.0.0.1:4399",
    created: { workspaceId: "ws_1", plan: "business", key: "rk_live_abc" },
  });
  t.is(
    text,
    [
      "",
      "runs is serving on http://127.0.0.1:8081",
      "  API        http://127.0.0.1:8081/api/v1   (document: http://127.0.0.1:8081/api/v1/openapi.json, reference: http://127.0.0.1:8081/docs)",
      "  console    http://127.0.0.1:8081/",
      '  workspace  ws_1 ("development", plan business), created by this start',
      "  API key    all scopes, shown only this once:",
      "",
      "  rk_live_abc",
      "",
      '  live tap   nats://127.0.0.1:4399, user tap, password: "nats_tap_password" in /srv/runs/.runs/secrets.json (subjects runs.live.>)',
      "  data       /srv/runs/.runs",
      "",
    ].join("\n"),
  );
});

test("banner - a later start prints no key; external servers and a gateway-less node say so; no console or docs line when they are not served", (t) => {
  const later = startupBanner({ url: "http://127.0.0.1:8080", console: false, docs: false, dataDir: "/d", embeddedNatsUrl: "nats://127.0.0.1:4322" });
  t.notRegex(later, /rk_live_|console|reference:/);
  t.regex(later, /API key {4}shown by the start that created the workspace/);
  const external = startupBanner({ url: "http://10.0.0.5:8080", console: true, docs: false, dataDir: "/d" });
  t.regex(external, /live tap {3}subjects runs\.live\.> on your NATS servers/);
  const actorsOnly = startupBanner({ console: false, docs: false, dataDir: "/d" });
  t.regex(actorsOnly, /without the gateway role/);
  t.notRegex(actorsOnly, /serving on/);
});
