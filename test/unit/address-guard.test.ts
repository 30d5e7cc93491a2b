import test from "ava";
import { spawnSync } from "node:child_process";
import type { LookupAddress } from "node:dns";
import {
  checkModelEndpoint,
  destinationUrlProblem,
  guardedLookup,
  hostAllowed,
  NetworkPolicyError,
  refusedAddressReason,
  resolveAllowed,
  validateAllowPattern,
  type Lookup,
} from "../../src/address-guard.js";
import { parseAuthority, parseTestHosts } from "../../actors/egress-proxy.js";

const refused: Array<[string, string]> = [
  ["0.0.0.0", "unspecified"],
  ["0.255.255.255", "unspecified"],
  ["10.0.0.0", "private"],
  ["10.255.255.255", "private"],
  ["100.64.0.0", "shared"],
  ["100.127.255.255", "shared"],
  ["127.0.0.1", "loopback"],
  ["127.255.255.254", "loopback"],
  ["169.254.169.254", "metadata"],
  ["169.254.0.1", "link-local"],
  ["169.254.255.255", "link-local"],
  ["172.16.0.0", "private"],
  ["172.31.255.255", "private"],
  ["192.0.0.8", "reserved"],
  ["192.0.2.1", "documentation"],
  ["192.88.99.1", "reserved"],
  ["192.168.0.1", "private"],
  ["192.168.255.255", "private"],
  ["198.18.0.1", "benchmarking"],
  ["198.19.255.255", "benchmarking"],
  ["198.51.100.7", "documentation"],
  ["203.0.113.9", "documentation"],
  ["224.0.0.1", "multicast"],
  ["239.255.255.255", "multicast"],
  ["240.0.0.1", "reserved"],
  ["255.255.255.255", "reserved"],
  ["::", "unspecified"],
  ["::1", "loopback"],
  ["fd00:ec2::254", "metadata"],
  ["fc00::1", "unique-local"],
  ["fdff:ffff::1", "unique-local"],
  ["fe80::1", "link-local"],
  ["febf:ffff::1", "link-local"],
  ["ff02::1", "multicast"],
  ["2001:db8::1", "documentation"],
  ["100::1", "reserved"],
  // IPv6 forms that carry an IPv4 address are judged by it.
  ["::ffff:127.0.0.1", "loopback"],
  ["::ffff:7f00:1", "loopback"],
  ["::ffff:169.254.169.254", "metadata"],
  ["::10.0.0.1", "private"],
  ["64:ff9b::192.168.1.1", "private"],
  ["64:ff9b::a9fe:a9fe", "metadata"],
  ["2002:7f00:1::", "loopback"],
  ["2002:c0a8:101::1", "private"],
  // Translated forms whose IPv4 address is not judged (found by an adversarial probe: 201 for a webhook to each).
  ["::ffff:0:7f00:1", "reserved"],
  ["::ffff:0:808:808", "reserved"],
  ["::ffff:0:ffff:ffff", "reserved"],
  ["64:ff9b:1::7f00:1", "reserved"],
  ["64:ff9b:1:ffff:ffff:ffff:ffff:ffff", "reserved"],
  ["not-an-ip", "invalid"],
  ["", "invalid"],
];

const allowed = [
  "1.1.1.1",
  "9.255.255.255",
  "11.0.0.0",
  "100.63.255.255",
  "100.128.0.0",
  "126.255.255.255",
  "128.0.0.0",
  "169.253.255.255",
  "169.255.0.0",
  "172.15.255.255",
  "172.32.0.0",
  "192.167.255.255",
  "192.169.0.0",
  "198.17.255.255",
  "198.20.0.0",
  "223.255.255.255",
  "93.184.216.34",
  "2606:4700:4700::1111",
  "2a00:1450:4001:80b::200e",
  "::ffff:93.184.216.34",
  "64:ff9b::5db8:d822",
  "2002:5db8:d822::1",
  // Neighbours of the translated ranges.
  "::ffff:1:0:0",
  "::fffe:ffff:ffff:ffff",
  "64:ff9b:2::1",
  "64:ff9a:ffff::1",
];

test("address-guard - every refused range is refused with its reason, at its edges", (t) => {
  for (const [ip, reason] of refused) t.is(refusedAddressReason(ip), reason, ip);
});

test("address-guard - public unicast addresses, including the neighbours of refused ranges, pass", (t) => {
  for (const ip of allowed) t.is(refusedAddressReason(ip), undefined, ip);
});

test("address-guard - allow patterns: exact names and *.suffix for subdomains only", (t) => {
  const allow = ["pypi.org", "*.githubusercontent.com", "Files.Example.COM.", "93.184.216.34"];
  const yes = ["pypi.org", "PYPI.org", "pypi.org.", "raw.githubusercontent.com", "a.b.githubusercontent.com", "files.example.com", "93.184.216.34"];
  const no = ["githubusercontent.com", "evilgithubusercontent.com", "pypi.org.evil.com", "sub.pypi.org", "example.com", "", ".", "a..pypi.org", "93.184.216.35", "[::1]"];
  for (const host of yes) t.true(hostAllowed(host, allow), host);
  for (const host of no) t.false(hostAllowed(host, allow), host);
  t.false(hostAllowed("pypi.org", []));
});

test("address-guard - malformed allow patterns are named", (t) => {
  for (const good of ["pypi.org", "*.githubusercontent.com", "localhost", "a-b.c_d.io", "93.184.216.34"]) {
    t.is(validateAllowPattern(good), undefined, good);
  }
  const bad = ["", " pypi.org", "https://pypi.org", "pypi.org/simple", "pypi.org:443", "user@pypi.org", "*", "*.com", "a.*.com", "py*.org", "-bad.org", "x".repeat(254)];
  for (const pattern of bad) t.truthy(validateAllowPattern(pattern), JSON.stringify(pattern));
});

test("address-guard - a name is refused when any of its addresses is; the address returned is one that was checked", async (t) => {
  const answers: Record<string, { address: string; family: number }[]> = {
    "public.test": [
      { address: "93.184.216.34", family: 4 },
      { address: "2606:2800:220:1:248:1893:25c8:1946", family: 6 },
    ],
    "mixed.test": [
      { address: "93.184.216.34", family: 4 },
      { address: "10.1.2.3", family: 4 },
    ],
    "metadata.test": [{ address: "169.254.169.254", family: 4 }],
    "empty.test": [],
  };
  const lookups: string[] = [];
  const lookup: Lookup = async (host) => {
    lookups.push(host);
    return answers[host] ?? Promise.reject(Object.assign(new Error("ENOTFOUND"), { code: "ENOTFOUND" }));
  };
  t.deepEqual(await resolveAllowed("public.test", { lookup }), { address: "93.184.216.34", family: 4 });
  const mixed = await t.throwsAsync(resolveAllowed("mixed.test", { lookup }));
  t.true(mixed instanceof NetworkPolicyError);
  t.regex(mixed!.message, /private address 10\.1\.2\.3/);
  await t.throwsAsync(resolveAllowed("metadata.test", { lookup }), { instanceOf: NetworkPolicyError, message: /metadata/ });
  t.deepEqual(await resolveAllowed("mixed.test", { lookup, allowPrivate: true }), { address: "93.184.216.34", family: 4 });
  await t.throwsAsync(resolveAllowed("nowhere.test", { lookup }), { message: /ENOTFOUND/ });
  await t.throwsAsync(resolveAllowed("empty.test", { lookup }), { message: /no address/ });
  // Literals need no lookup.
  const before = lookups.length;
  await t.throwsAsync(resolveAllowed("127.0.0.1", { lookup }), { instanceOf: NetworkPolicyError, message: /loopback/ });
  await t.throwsAsync(resolveAllowed("[::1]", { lookup }), { instanceOf: NetworkPolicyError });
  t.is(lookups.length, before);
});

test("address-guard - this host's own addresses are refused, a public one too, in every form that names it; allowPrivate lets them through", async (t) => {
  const own = () => ["127.0.0.1", "::1", "93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"];
  const lookup: Lookup = async (host) => [{ address: host === "v6.test" ? "2606:2800:220:1:248:1893:25c8:1946" : "93.184.216.34", family: host === "v6.test" ? 6 : 4 }];
  for (const host of ["93.184.216.34", "[::ffff:93.184.216.34]", "[::ffff:5db8:d822]", "[2002:5db8:d822::1]", "[2606:2800:0220:0001:0248:1893:25c8:1946]", "own.test", "v6.test"]) {
    const err = await t.throwsAsync(resolveAllowed(host, { lookup, ownAddresses: own }), { instanceOf: NetworkPolicyError }, host);
    t.regex(err!.message, /this node's own address/, host);
  }
  t.deepEqual(await resolveAllowed("own.test", { lookup, ownAddresses: own, allowPrivate: true }), { address: "93.184.216.34", family: 4 });
  t.deepEqual(await resolveAllowed("93.184.216.35", { ownAddresses: own }), { address: "93.184.216.35", family: 4 });
  t.deepEqual(await resolveAllowed("[2606:2800:220:1:248:1893:25c8:1947]", { ownAddresses: own }), { address: "2606:2800:220:1:248:1893:25c8:1947", family: 6 });
});

// The real interface list: a network namespace of its own whose loopback interface also holds a public address (root only).
const canNamespace = process.getuid?.() === 0 && spawnSync("unshare", ["-n", "ip", "addr", "add", "198.51.99.7/32", "dev", "lo"]).status === 0;
(canNamespace ? test : test.skip)("address-guard - a public address on one of the host's interfaces is refused (read from the kernel, in a network namespace of its own)", (t) => {
  const script = `import('${new URL("../../src/address-guard.ts", import.meta.url).pathname}').then(async (g) => {
    const out = [];
    for (const host of ["198.51.99.7", "198.51.99.8"]) out.push(await g.resolveAllowed(host).then(() => "allowed", (e) => e.message));
    console.log(JSON.stringify(out));
  })`;
  const shell = `ip link set lo up && ip addr add 198.51.99.7/32 dev lo && exec "${process.execPath}" --import tsx -e "${script.replace(/"/g, '\\"')}"`;
  const run = spawnSync("unshare", ["-n", "sh", "-c", shell], { encoding: "utf8", timeout: 30_000 });
  t.is(run.status, 0, run.stderr);
  t.deepEqual(JSON.parse(run.stdout.trim().split("\n").pop()!), ["Network policy denied 198.51.99.7: this node's own address 198.51.99.7", "allowed"]);
});

test("address-guard - guardedLookup hands a socket every allowed address (or those of the family asked), and refuses a name with any refused one", async (t) => {
  const answers: Record<string, { address: string; family: number }[]> = {
    "dual.test": [
      { address: "2606:4700::1111", family: 6 },
      { address: "93.184.216.34", family: 4 },
      { address: "93.184.216.35", family: 4 },
    ],
    "mixed.test": [
      { address: "93.184.216.34", family: 4 },
      { address: "10.1.2.3", family: 4 },
    ],
  };
  const guarded = guardedLookup({ lookup: async (host) => answers[host] ?? [] });
  const ask = (host: string, options: { all?: boolean; family?: number }) =>
    new Promise<{ err: NodeJS.ErrnoException | null; address: string | LookupAddress[]; family?: number }>((resolve) =>
      guarded(host, options as never, (err, address, family) => resolve({ err, address, family })),
    );
  t.deepEqual((await ask("dual.test", { all: true })).address, answers["dual.test"]);
  t.deepEqual(await ask("dual.test", {}), { err: null, address: "2606:4700::1111", family: 6 });
  t.deepEqual(await ask("dual.test", { family: 4 }), { err: null, address: "93.184.216.34", family: 4 });
  t.deepEqual((await ask("dual.test", { all: true, family: 4 })).address, answers["dual.test"]!.slice(1));
  const mixed = await ask("mixed.test", { all: true });
  t.true(mixed.err instanceof NetworkPolicyError);
  t.regex(mixed.err?.message ?? "", /private address 10\.1\.2\.3/);
  t.is((mixed.err as NetworkPolicyError).host, "mixed.test");
  t.truthy((await ask("none.test", {})).err);
});

test("address-guard - model endpoints on refused addresses are refused before anything is sent", async (t) => {
  const lookup: Lookup = async (host) => (host === "localhost" ? [{ address: "127.0.0.1", family: 4 }] : [{ address: "93.184.216.34", family: 4 }]);
  for (const url of [
    "http://127.0.0.1:11434/v1",
    "http://[::1]/v1",
    "http://localhost:8000/v1",
    "http://169.254.169.254/latest/meta-data",
    "http://[::ffff:10.0.0.1]/v1",
    "http://0.0.0.0:80/",
  ]) {
    await t.throwsAsync(checkModelEndpoint(url, { allowPrivate: false, lookup }), { instanceOf: NetworkPolicyError }, url);
  }
  await t.throwsAsync(checkModelEndpoint("ftp://models.example/v1", { allowPrivate: false, lookup }), { message: /scheme/ });
  // A deployment stored before base_url was checked at creation: named, not by an empty host.
  await t.throwsAsync(checkModelEndpoint("file:///etc/passwd", { allowPrivate: false, lookup }), { message: /^Network policy denied a file: URL: scheme file:$/ });
  await t.notThrowsAsync(checkModelEndpoint("https://93.184.216.34/v1", { allowPrivate: false, lookup }));
  await t.notThrowsAsync(checkModelEndpoint("https://api.example/v1", { allowPrivate: false, lookup }));
  await t.notThrowsAsync(checkModelEndpoint("http://127.0.0.1:11434/v1", { allowPrivate: true, lookup }));
});

test("address-guard - a destination's URL (webhook, model endpoint): http or https, without a user name or password, to a reachable host", (t) => {
  const fits = [
    "https://api.example/v1",
    "http://203.0.113.7:8000/v1",
    "https://[2606:4700::1111]/",
    "https://api.example./v1", // a fully qualified name
    "https://bücher.example/", // IDNA-encoded by the URL parser
    "https://my_host.example:65535/",
    `https://${"a".repeat(63)}.example/`,
    `https://${Array.from({ length: 4 }, () => "a".repeat(62)).join(".")}/`, // 251 characters
    "http://0x7f.1/", // normalized to 127.0.0.1 (refused where the service connects)
  ];
  for (const fit of fits) t.is(destinationUrlProblem(fit), undefined, fit);
  const unreachable = [
    "http://./",
    "http://../",
    "http://a..b/",
    "http://.a/",
    "http://a!b/",
    "http://a$b.example/",
    "http://a*b/",
    `https://${"a".repeat(64)}.example/`,
    `https://${Array.from({ length: 4 }, () => "a".repeat(63)).join(".")}/`, // 255 characters
    "http://api.example:0/",
    "http://[2606:4700::1111]:0/",
    "http://203.0.113.7:0/",
  ];
  for (const host of unreachable) t.is(destinationUrlProblem(host), "host", host);
  for (const notUrl of ["not a url", "", "//api.example/v1", "http://"]) t.is(destinationUrlProblem(notUrl), "not-url", notUrl);
  for (const scheme of ["ftp://api.example/", "file:///etc/passwd", "javascript:alert(1)", "gopher://api.example:70/", "ws://api.example/"]) t.is(destinationUrlProblem(scheme), "scheme", scheme);
  for (const credentials of ["https://user@api.example/", "https://:secret@api.example/", "http://u:p@203.0.113.7/v1"]) t.is(destinationUrlProblem(credentials), "credentials", credentials);
});

test("egress-proxy - CONNECT authorities and the test host map are parsed strictly", (t) => {
  t.deepEqual(parseAuthority("pypi.org:443"), { host: "pypi.org", port: 443 });
  t.deepEqual(parseAuthority("[2606:4700::1111]:443"), { host: "2606:4700::1111", port: 443 });
  for (const bad of ["pypi.org", "pypi.org:0", "pypi.org:65536", "http://pypi.org:443", "a b:1", ":443", "pypi.org:44a"]) {
    t.is(parseAuthority(bad), undefined, bad);
  }
  t.deepEqual([...parseTestHosts("allowed.test=127.0.0.1:8080, Other.Test=[::1]:9")], [
    ["allowed.test", { host: "127.0.0.1", port: 8080 }],
    ["other.test", { host: "::1", port: 9 }],
  ]);
  t.is(parseTestHosts(undefined).size, 0);
  t.throws(() => parseTestHosts("x.test=10.0.0.1:80"), { message: /not a loopback address/ });
  t.throws(() => parseTestHosts("x.test"), { message: /name=host:port/ });
});
