/**
 * The relay's HTTP client options, side by side (issue 18, point 10): each
 * client of `POST /v1/runs` in a process of its own (bench/http_client_probe.ts),
 * against the relay section's API, with no Kafka in the way, rounds
 * alternating. What one admission costs the client is what the relay spends
 * per message on HTTP, on the cores the API and Postgres also need.
 */
import type { Sql } from "../db/pool.ts";
import { PROJECT_ROOT } from "../dev/tasks.ts";
import { type BenchContext, check, log } from "./run_context.ts";
import { countWhere } from "./scenario_support.ts";

const CLIENTS = ["fetch", "node-http", "undici", "undici-pipelined"] as const;
const IN_FLIGHT = 64;

interface Probe {
  client: string;
  prefix: string;
  rate: number;
  cpuUsPerRequest: number;
  peakRssMb: number;
  refused: number;
}

async function probe(
  apiUrl: string,
  token: string,
  tenant: string,
  client: string,
  n: number,
): Promise<Probe> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--no-prompt",
      "--allow-net",
      "--allow-env",
      "--allow-read=node_modules",
      "bench/http_client_probe.ts",
      apiUrl,
      token,
      tenant,
      client,
      String(n),
      String(IN_FLIGHT),
    ],
    cwd: PROJECT_ROOT,
    stdin: "null",
  }).output();
  const text = new TextDecoder().decode(out.stdout).trim();
  if (!out.success) {
    throw new Error(`http client probe ${client}: ${new TextDecoder().decode(out.stderr)}`);
  }
  return JSON.parse(text) as Probe;
}

/** Measures every client, `rounds` times each, alternating; adds figures and a note. */
export async function relayHttpClients(
  ctx: BenchContext,
  sql: Sql,
  apiUrl: string,
  token: string,
  tenant: string,
  n: number,
  rounds: number,
): Promise<void> {
  const seen = new Map<string, Probe[]>();
  for (let round = 1; round <= rounds; round++) {
    for (const client of CLIENTS) {
      const p = await probe(apiUrl, token, tenant, client, n);
      const made = await countWhere(sql, "runs", p.prefix);
      check(
        made.n === n && made.d === n && p.refused === 0,
        `http client ${client}: ${made.n} runs for ${n} admissions (${p.refused} refused)`,
      );
      ctx.figures.push({
        group: "relay",
        scenario: `relay's HTTP client alone, ${IN_FLIGHT} in flight, no Kafka: ${client}`,
        conns: IN_FLIGHT,
        round,
        rate: p.rate,
        p50: 0,
        p99: 0,
        usPerOp: p.cpuUsPerRequest,
      });
      seen.set(client, [...(seen.get(client) ?? []), p]);
      log(`http client ${client}: ${p.rate.toFixed(0)}/s, ${p.cpuUsPerRequest.toFixed(0)} µs/req`);
    }
  }
  const median = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b);
    return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
  };
  const line = CLIENTS.map((c) => {
    const ps = seen.get(c) ?? [];
    return `${c} ${median(ps.map((p) => p.rate)).toFixed(0)}/s, ${
      median(ps.map((p) => p.cpuUsPerRequest)).toFixed(0)
    } µs CPU/request, peak RSS ${Math.max(...ps.map((p) => p.peakRssMb)).toFixed(0)} MB`;
  }).join("; ");
  ctx.notes.push(
    `The relay's HTTP client options (POST /v1/runs alone, ${IN_FLIGHT} in flight, each in a ` +
      `process of its own, median of ${rounds}): ${line}.`,
  );
}
