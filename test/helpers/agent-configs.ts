/**
 * An agent config whose bash calls starting with `echo` wait for a person's decision
 * (config.approval); `script` is the faux model's, `approval` adds to the policy.
 */
export function gatedBashConfig(script: unknown[], approval: Record<string, unknown> = {}): Record<string, unknown> {
  return { model: "faux/scripted", tools: ["bash"], approval: { rules: [{ tool: "bash", command_prefix: "echo" }], ...approval }, script };
}

/** A faux script: one bash command, then a text. */
export function bashThen(command: string, then: string): unknown[] {
  return [{ tool_call: { name: "bash", arguments: { command } } }, { text: then }];
}
