/**
 * The address guard: which destinations a tenant may make the service connect to.
 * Used by the egress proxy of sandboxes with a network allow list, for webhook
 * deliveries and for the model endpoint of `openai-compatible` deployments. Pure apart
 * from the injected DNS lookup.
 *
 * Refused: loopback, private (RFC 1918), CGNAT, link-local (which holds the cloud
 * metadata address 169.254.169.254), unique-local IPv6 (which holds fd00:ec2::254),
 * multicast, unspecified, documentation, benchmarking and reserved ranges, and IPv6
 * forms that embed an IPv4 address (mapped, compatible, NAT64, 6to4) whenever the
 * embedded address is refused; IPv4-translated addresses and the local-use NAT64 prefix,
 * whose embedded address this guard cannot place, whatever they carry; and the addresses
 * of this host's own interfaces, a public one included (it reaches whatever the host
 * listens on, the service's own servers too). A name is refused
 * when ANY of its addresses is: the caller connects to an address that was checked (the
 * one {@link resolveAllowed} answers, or the ones {@link guardedLookup} hands the socket),
 * never to the name again, so a second DNS answer cannot swap a public address for a
 * private one.
 */
import { lookup as dnsLookup } from "node:dns/promises";
import net, { type LookupFunction } from "node:net";
import { networkInterfaces } from "node:os";

/**
 * What makes `value` unfit as the address of a destination a tenant names (a webhook, a
 * model endpoint): not a URL, a scheme other than http and https, a user name or password
 * in it (a credential shown to everyone who may read the resource), or a host no
 * connection can reach (a name that is not a DNS name, port 0); undefined when fit. Where
 * its host's addresses lead is judged where the service connects ({@link resolveAllowed}).
 */
export function destinationUrlProblem(value: string): "not-url" | "scheme" | "credentials" | "host" | undefined {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    return "not-url";
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return "scheme";
  if (url.username || url.password) return "credentials";
  return url.port === "0" || !reachableHostName(url.hostname) ? "host" : undefined;
}

/** DNS labels (letters, digits, `-`, `_`; 1–63 each, 253 in all; one trailing dot). */
const DNS_NAME = /^(?=.{1,253}$)[a-z0-9_-]{1,63}(?:\.[a-z0-9_-]{1,63})*$/;

/**
 * Whether a WHATWG URL's hostname (lower-cased, IDNA-encoded, IPv4 normalized) could be
 * connected to: an IP address, or a name DNS can hold (not `.`, `a..b` or `a!b`).
 */
function reachableHostName(hostname: string): boolean {
  if (hostname.startsWith("[") || net.isIPv4(hostname)) return true;
  return DNS_NAME.test(hostname.endsWith(".") ? hostname.slice(0, -1) : hostname);
}

export class NetworkPolicyError extends Error {
  readonly code = "network_policy_denied";
  constructor(
    readonly host: string,
    readonly reason: string,
  ) {
    super(`Network policy denied ${host}: ${reason}`);
    this.name = "NetworkPolicyError";
  }
}

type Range = readonly [cidr: string, prefix: number, reason: string];

const V4_RANGES: readonly Range[] = [
  ["0.0.0.0", 8, "unspecified"],
  ["10.0.0.0", 8, "private"],
  ["100.64.0.0", 10, "shared"],
  ["127.0.0.0", 8, "loopback"],
  ["169.254.169.254", 32, "metadata"],
  ["169.254.0.0", 16, "link-local"],
  ["172.16.0.0", 12, "private"],
  ["192.0.0.0", 24, "reserved"],
  ["192.0.2.0", 24, "documentation"],
  ["192.88.99.0", 24, "reserved"],
  ["192.168.0.0", 16, "private"],
  ["198.18.0.0", 15, "benchmarking"],
  ["198.51.100.0", 24, "documentation"],
  ["203.0.113.0", 24, "documentation"],
  ["224.0.0.0", 4, "multicast"],
  ["240.0.0.0", 4, "reserved"],
];

const V6_RANGES: readonly Range[] = [
  ["::", 128, "unspecified"],
  ["::1", 128, "loopback"],
  ["fd00:ec2::254", 128, "metadata"],
  ["fc00::", 7, "unique-local"],
  ["fe80::", 10, "link-local"],
  ["fec0::", 10, "reserved"],
  ["ff00::", 8, "multicast"],
  ["2001:db8::", 32, "documentation"],
  ["100::", 64, "reserved"],
  ["2001::", 23, "reserved"],
  // IPv4-translated addresses (RFC 2765: ::ffff:0:a.b.c.d) and local-use IPv4/IPv6
  // translation (RFC 8215), whose gateway could take them to any IPv4 address, private
  // ones too. Where the local-use prefix carries the IPv4 address is the network's choice
  // (RFC 6052), so this guard cannot judge it: the whole /48 is refused, and a network
  // that reaches IPv4 hosts only through it reaches none of them from here.
  ["::ffff:0:0:0", 96, "reserved"],
  ["64:ff9b:1::", 48, "reserved"],
];

/** First match wins, so more specific ranges come first in each table. */
const lists = (() => {
  const make = (ranges: readonly Range[], family: "ipv4" | "ipv6") =>
    ranges.map(([address, prefix, reason]) => {
      const list = new net.BlockList();
      list.addSubnet(address, prefix, family);
      return { list, reason, family };
    });
  return { v4: make(V4_RANGES, "ipv4"), v6: make(V6_RANGES, "ipv6") };
})();

/**
 * Why `ip` may not be connected to, or undefined for a public unicast address. A
 * string that is not an IP address is refused ("invalid").
 */
export function refusedAddressReason(ip: string): string | undefined {
  const family = net.isIP(ip);
  if (family === 4) return lists.v4.find((r) => r.list.check(ip, "ipv4"))?.reason;
  if (family !== 6) return "invalid";
  const embedded = embeddedV4(ip);
  if (embedded !== undefined) return refusedAddressReason(embedded) ?? undefined;
  return lists.v6.find((r) => r.list.check(ip, "ipv6"))?.reason;
}

/** The IPv4 address an IPv6 address carries (mapped, compatible, NAT64, 6to4), if any. */
function embeddedV4(ip: string): string | undefined {
  const words = expandV6(ip);
  if (!words) return undefined;
  const v4 = (hi: number, lo: number) => `${hi >> 8}.${hi & 0xff}.${lo >> 8}.${lo & 0xff}`;
  const zero = (from: number, to: number) => words.slice(from, to).every((w) => w === 0);
  // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (compatible; not :: and ::1 themselves)
  if (zero(0, 5) && words[5] === 0xffff) return v4(words[6]!, words[7]!);
  if (zero(0, 6) && (words[6] !== 0 || words[7]! > 1)) return v4(words[6]!, words[7]!);
  // 64:ff9b::/96 (NAT64)
  if (words[0] === 0x64 && words[1] === 0xff9b && zero(2, 6)) return v4(words[6]!, words[7]!);
  // 2002::/16 (6to4): the IPv4 address in the next 32 bits
  if (words[0] === 0x2002) return v4(words[1]!, words[2]!);
  return undefined;
}

/** The eight 16-bit words of an IPv6 address (with an optional dotted IPv4 tail). */
function expandV6(ip: string): number[] | undefined {
  let text = ip.toLowerCase();
  const zone = text.indexOf("%");
  if (zone >= 0) text = text.slice(0, zone);
  const tail: number[] = [];
  const lastColon = text.lastIndexOf(":");
  const last = text.slice(lastColon + 1);
  if (last.includes(".")) {
    const parts = last.split(".").map(Number);
    if (parts.length !== 4 || parts.some((p) => !Number.isInteger(p) || p < 0 || p > 255)) return undefined;
    tail.push((parts[0]! << 8) | parts[1]!, (parts[2]! << 8) | parts[3]!);
    text = text.slice(0, lastColon + 1) + "0";
    // "0" stands in for the last word; it is dropped below and replaced by the tail.
  }
  const [head, rest] = text.includes("::") ? text.split("::") : [text, undefined];
  const parse = (s: string | undefined) => (s ? s.split(":").map((w) => parseInt(w, 16)) : []);
  const a = parse(head);
  const b = parse(rest);
  if (tail.length) {
    if (b.length) b.pop();
    else a.pop();
  }
  const fill = 8 - tail.length - a.length - b.length;
  if (rest === undefined && fill !== 0) return undefined;
  if (fill < 0) return undefined;
  const words = [...a, ...new Array<number>(rest === undefined ? 0 : fill).fill(0), ...b, ...tail];
  return words.length === 8 && words.every((w) => Number.isInteger(w) && w >= 0 && w <= 0xffff) ? words : undefined;
}

/** The addresses of this host's interfaces, as the kernel lists them when asked (interfaces come and go). */
export type OwnAddresses = () => Iterable<string>;

const interfaceAddresses: OwnAddresses = () => Object.values(networkInterfaces()).flatMap((infos) => (infos ?? []).map((info) => info.address));

/** Whether `ip` is one of `own`: IPv6 compared by its words, an IPv4 address also in the IPv6 forms that carry it. */
function isOwnAddress(ip: string, own: Iterable<string>): boolean {
  const key = addressKey(ip);
  for (const address of own) if (addressKey(address) === key) return true;
  return false;
}

function addressKey(ip: string): string {
  if (net.isIP(ip) !== 6) return ip;
  const v4 = embeddedV4(ip);
  if (v4 !== undefined) return v4;
  return expandV6(ip)?.join(":") ?? ip;
}

/** Lower case, one trailing dot and IPv6 brackets removed. */
function normalHost(host: string): string {
  let h = host.trim().toLowerCase();
  if (h.startsWith("[") && h.endsWith("]")) h = h.slice(1, -1);
  if (h.endsWith(".")) h = h.slice(0, -1);
  return h;
}

/**
 * Whether `host` matches one of the patterns: an exact name, or `*.suffix` for any
 * subdomain of suffix at any depth (not the suffix itself). An IP literal matches
 * only an identical literal entry.
 */
export function hostAllowed(host: string, allow: readonly string[]): boolean {
  const h = normalHost(host);
  if (!h || h.split(".").some((label) => label.length === 0)) return false;
  const isIp = net.isIP(h) !== 0;
  for (const raw of allow) {
    const pattern = normalHost(raw);
    if (pattern.startsWith("*.")) {
      if (!isIp && h.endsWith(pattern.slice(1)) && h.length > pattern.length - 1) return true;
    } else if (pattern === h) {
      return true;
    }
  }
  return false;
}

const LABEL = /^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$/i;

/** Why an allow-list pattern is malformed, or undefined when it is fine. */
export function validateAllowPattern(pattern: string): string | undefined {
  if (pattern.length === 0) return "must not be empty";
  if (pattern.length > 253) return "is longer than 253 characters";
  if (/[\s/:@?#]/.test(pattern.replace(/^\[.*\]$/, ""))) {
    return "must be a host name such as pypi.org or *.githubusercontent.com (no scheme, port or path)";
  }
  if (net.isIP(normalHost(pattern))) return undefined;
  const labels = normalHost(pattern).split(".");
  const first = labels[0] === "*" ? labels.slice(1) : labels;
  if (labels.slice(1).includes("*") || first.some((l) => l.includes("*"))) return "may use * only as its whole first label (*.example.com)";
  if (first.length === 0 || first.some((l) => !LABEL.test(l))) return "is not a valid host name";
  if (labels[0] === "*" && first.length < 2) return "needs at least two labels after *. (*.example.com)";
  return undefined;
}

export type Lookup = (host: string) => Promise<{ address: string; family: number }[]>;

/** `allowPrivate`: the operator lets tenants reach private addresses and this host (tests, a trusted network). */
export type GuardOptions = { allowPrivate?: boolean; lookup?: Lookup; ownAddresses?: OwnAddresses };

const defaultLookup: Lookup = (host) => dnsLookup(host, { all: true, verbatim: true });

/**
 * Resolves `host` and returns the address to connect to. Throws
 * {@link NetworkPolicyError} when any address is refused (unless `allowPrivate`); a
 * failed lookup throws the lookup's own error.
 */
export async function resolveAllowed(host: string, options: GuardOptions = {}): Promise<{ address: string; family: 4 | 6 }> {
  return (await allowedAddresses(host, options))[0]!;
}

/** Every address of `host`, in the resolver's order; refused as {@link resolveAllowed} refuses. */
export async function allowedAddresses(host: string, options: GuardOptions = {}): Promise<{ address: string; family: 4 | 6 }[]> {
  const h = normalHost(host);
  const literal = net.isIP(h);
  const addresses = literal ? [{ address: h, family: literal }] : await (options.lookup ?? defaultLookup)(h);
  if (addresses.length === 0) throw new Error(`${host} has no address`);
  if (!options.allowPrivate) {
    let own: string[] | undefined;
    for (const { address } of addresses) {
      const reason = refusedAddressReason(address);
      if (reason) throw new NetworkPolicyError(h, `${reason} address ${address}`);
      own ??= [...(options.ownAddresses ?? interfaceAddresses)()];
      if (isOwnAddress(address, own)) throw new NetworkPolicyError(h, `this node's own address ${address}`);
    }
  }
  return addresses.map(({ address, family }) => ({ address, family: family === 6 ? 6 : 4 }));
}

/**
 * A `lookup` for `net.connect` / `tls.connect` (and the HTTP clients built on them) that
 * answers only allowed addresses, all of them (so the socket may try each, as it would
 * with the system's), or fails with {@link NetworkPolicyError}. Sockets skip `lookup` for
 * an address literal: check those with {@link resolveAllowed} first.
 */
export function guardedLookup(options: { allowPrivate?: boolean; lookup?: Lookup }): LookupFunction {
  return (hostname, lookupOptions, callback) => {
    allowedAddresses(hostname, options).then(
      (addresses) => {
        const wanted = lookupOptions.family === 4 || lookupOptions.family === 6 ? addresses.filter((a) => a.family === lookupOptions.family) : addresses;
        if (wanted.length === 0) return callback(Object.assign(new Error(`${hostname} has no IPv${lookupOptions.family} address`), { code: "ENOTFOUND" }), "", 4);
        if (lookupOptions.all) callback(null, wanted);
        else callback(null, wanted[0]!.address, wanted[0]!.family);
      },
      (err: Error) => callback(err as NodeJS.ErrnoException, "", 4),
    );
  };
}

/** Throws {@link NetworkPolicyError} when a model endpoint URL may not be called. */
export async function checkModelEndpoint(baseUrl: string, options: { allowPrivate: boolean; lookup?: Lookup }): Promise<void> {
  let url: URL;
  try {
    url = new URL(baseUrl);
  } catch {
    throw new NetworkPolicyError(baseUrl, "not a URL");
  }
  // A URL without a host (file:, javascript:) is named by its scheme: its path is the deployment's to show.
  if (url.protocol !== "http:" && url.protocol !== "https:") throw new NetworkPolicyError(url.host || `a ${url.protocol} URL`, `scheme ${url.protocol}`);
  if (options.allowPrivate) return;
  try {
    await resolveAllowed(url.hostname, options);
  } catch (err) {
    if (err instanceof NetworkPolicyError) throw err;
    // A name that does not resolve fails the request later as a transport failure.
  }
}
