/**
 * Real poimen processes for integration tests: the generic parts live in
 * dev/processes.ts (shared with `deno task chaos`); here, what only tests
 * need (an API process that waits until ready, a metrics sample parser).
 */
import assert from "node:assert/strict";
import { waitFor } from "./db.ts";
import { freePort, PoimenProcess, runCommand } from "../../dev/processes.ts";

export { freePort, PoimenProcess, runCommand, runFlags } from "../../dev/processes.ts";

/** A running API process on a free port. */
export class ApiProcess extends PoimenProcess {
  readonly url: string;
  constructor(env: Record<string, string>) {
    const port = freePort();
    super("api", { PORT: String(port), HOST: "127.0.0.1", LOG_LEVEL: "warn", ...env });
    this.url = `http://127.0.0.1:${port}`;
  }

  /** Waits until /readyz answers 200. */
  async ready(timeoutMs = 30_000): Promise<this> {
    await waitFor(`api ${this.url} ready`, async () => {
      if (this.exited) throw new Error(`api exited:\n${this.logs().join("\n")}`);
      const res = await fetch(`${this.url}/readyz`);
      await res.body?.cancel();
      return res.status === 200;
    }, timeoutMs);
    return this;
  }

  /**
   * Parses one Prometheus sample of the API's metrics listener (0 when
   * absent): every series, the per-tenant ones too.
   */
  async metric(name: string, labels: Record<string, string> = {}): Promise<number> {
    const text = await (await fetch(`${this.metricsUrl}/metrics`)).text();
    return sampleValue(text, name, labels);
  }
}

/** Sums the samples of `name` whose labels include `labels` in Prometheus text. */
export function sampleValue(text: string, name: string, labels: Record<string, string>): number {
  let sum = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith(name)) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const have = new Map(
      [...(m[3] ?? "").matchAll(/([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"/g)].map((x) => [x[1], x[2]]),
    );
    if (Object.entries(labels).every(([k, v]) => have.get(k) === v)) sum += Number(m[4]);
  }
  return sum;
}

/** A new token from `deno task token <args>` (a tenant, or `--service <name>`), against `databaseUrl`. */
export async function newToken(databaseUrl: string, ...args: string[]): Promise<string> {
  const out = await runCommand("token", args, { DATABASE_URL: databaseUrl, LOG_LEVEL: "warn" });
  assert.equal(out.code, 0, out.stderr);
  return out.stdout.trim();
}
