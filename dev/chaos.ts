/**
 * `deno task chaos [--quick]`: the proof that no process crash, broker
 * crash, database outage, redelivery or poison message loses, duplicates or
 * stalls anything.
 *
 * On a cluster of its own (dev/chaos/cluster.ts: its own broker on free
 * ports, its own database, the real processes: one API, two relays in one
 * group, two workers hosting dev/chaos/workflows.ts, an outbox), it
 * publishes N dispatch messages over two tenants (about 20 % redeliveries,
 * about 1 % poison on the first tenant, about a quarter of the keys runs of
 * `chaos.keyed`, limited to 2 running per group over 8 groups, about a tenth
 * runs of `chaos.durable`, steps around a sleep that suspends), while HTTP
 * callers race some of the same keys over `POST /v1/runs`, a sampler reads
 * the concurrency groups every 100 ms, and a fault loop SIGKILLs processes, crashes the broker (SIGKILL, restart) and
 * kills every Postgres connection of the database (or, with --pg-restart,
 * restarts the Postgres cluster). Then it waits until drained (polling, with
 * a deadline) and checks, from Postgres and the topics read back, the
 * invariants of dev/chaos/verdict.ts. Prints
 *
 *   chaos: N msgs, K keys, F faults | lost=0 dup=0 … slotdrift=0 steps_dup=0 … tenant_b=0 …
 *
 * as its last line; exits 1 on any violation, 2 when the harness itself failed.
 */
import { z } from "zod";
import { databaseEnv, processEnv, readEnv } from "../core/config.ts";
import { ConfigError } from "../core/errors.ts";
import { type CommandSpec, parseCommandLine, usageError } from "../core/command_line.ts";
import { runChaos } from "./chaos/run.ts";

const ChaosEnv = z.object({
  // Only to find the Postgres server: the chaos database is created next to it.
  DATABASE_URL: databaseEnv.DATABASE_URL,
});

const COMMAND = {
  name: "chaos",
  synopsis:
    "[--quick] [--messages N] [--faults N] [--seconds N] [--seed N] [--pg-restart] [--keep]",
  description: `
Publishes dispatch messages (about 20 % redeliveries, about 1 % poison, about
a quarter runs of a workflow limited per key, about a tenth durable runs whose
sleep suspends them) to a cluster of its own (own broker, own database, real
processes) while HTTP callers race the same keys and faults fly, drains, and
checks that nothing was lost, duplicated, stuck or unpublished, that no key
ever had more runs running than its limit, and that no durable step ran again
once stored and every suspended run was woken. Last line: the summary; exit 1
on any violation.`,
  flags: {
    quick: { type: "boolean", description: "500 messages, 7 faults, about a minute (CI)" },
    messages: { type: "string", valueName: "N", description: "dispatch messages (default 5000)" },
    faults: { type: "string", valueName: "N", description: "faults injected (default 120)" },
    seconds: {
      type: "string",
      valueName: "N",
      description: "how long publishing and faults last (default 300)",
    },
    seed: { type: "string", valueName: "N", description: "the workload's seed (default random)" },
    "pg-restart": {
      type: "boolean",
      description: "restart the whole Postgres cluster instead of killing connections",
    },
    keep: { type: "boolean", description: "keep the run's directory, broker and database" },
  },
  env: ChaosEnv,
} satisfies CommandSpec;

async function main(argv: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, argv);
  if (typeof line === "number") return line;
  const { flags } = line;
  const numbers: Record<string, number | undefined> = {};
  for (
    const [name, min] of [["messages", 100], ["faults", 0], ["seconds", 5], ["seed", 0]] as const
  ) {
    const text = flags[name];
    if (text === undefined) continue;
    const n = Number(text);
    if (!Number.isInteger(n) || n < min) {
      return usageError(COMMAND, `--${name} must be a whole number ≥ ${min}`);
    }
    numbers[name] = n;
  }
  const { DATABASE_URL } = readEnv(ChaosEnv, processEnv());
  const quick = flags.quick ?? false;
  return await runChaos({
    messages: numbers.messages ?? (quick ? 500 : 5000),
    faults: numbers.faults ?? (quick ? 7 : 120),
    seconds: numbers.seconds ?? (quick ? 30 : 300),
    seed: numbers.seed ?? Math.floor(Math.random() * 2 ** 31),
    pgRestart: flags["pg-restart"] ?? false,
    keep: flags.keep ?? false,
    drainSeconds: quick ? 90 : 240,
    stallSeconds: quick ? 45 : 60,
    databaseUrl: DATABASE_URL,
  });
}

if (import.meta.main) {
  try {
    Deno.exit(await main(Deno.args));
  } catch (error) {
    if (!(error instanceof ConfigError)) throw error;
    console.error(error.message);
    Deno.exit(2);
  }
}
