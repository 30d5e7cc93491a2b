/** The value of one series of a Prometheus text exposition whose labels include `labels`; undefined when none. */
export function sample(text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  const wanted = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    const labelText = line.slice(name.length).match(/^\{([^}]*)\}/)?.[1] ?? "";
    if (wanted.every((w) => labelText.split(",").includes(w))) return Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return undefined;
}
