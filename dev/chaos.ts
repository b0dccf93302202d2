/**
 * `deno task chaos [--quick]`: the proof that no process crash, broker
 * crash, database outage, redelivery or poison message loses, duplicates or
 * stalls anything.
 *
 * On a cluster of its own (dev/chaos/cluster.ts: its own broker on free
 * ports, its own database, the real processes: one API, two relays in one
 * group, two workers, an outbox), it publishes N dispatch messages over two
 * tenants (about 20 % redeliveries, about 1 % poison on the first tenant),
 * while HTTP callers race some of the same keys over `POST /v1/runs` and a
 * fault loop SIGKILLs processes, crashes the broker (SIGKILL, restart) and
 * kills every Postgres connection of the database (or, with --pg-restart,
 * restarts the Postgres cluster). Then it waits until drained (polling, with
 * a deadline) and checks, from Postgres and the topics read back, the
 * invariants of dev/chaos/verdict.ts. Prints
 *
 *   chaos: N msgs, K keys, F faults | lost=0 dup=0 stuck=0 unparked=0 …
 *
 * as its last line; exits 1 on any violation, 2 when the harness itself failed.
 *
 * Flags: --quick (500 messages, 7 faults, ~1 minute), --messages N,
 * --faults F, --seconds S (how long publishing and faults last), --seed N,
 * --pg-restart, --keep (keep the run's directory and database).
 */
import { z } from "zod";
import { databaseEnv, processEnv, readEnv } from "../core/config.ts";
import { ConfigError } from "../core/errors.ts";
import { runChaos } from "./chaos/run.ts";

const USAGE =
  "usage: deno task chaos [--quick] [--messages N] [--faults N] [--seconds N] [--seed N] [--pg-restart] [--keep]";

interface Flags {
  quick: boolean;
  messages?: number;
  faults?: number;
  seconds?: number;
  seed?: number;
  pgRestart: boolean;
  keep: boolean;
}

function parseFlags(args: string[]): Flags | string {
  const flags: Flags = { quick: false, pgRestart: false, keep: false };
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    const number = (): number | string => {
      const v = Number(args[++i]);
      return Number.isInteger(v) && v >= 0 ? v : `${arg} needs a whole number`;
    };
    let n: number | string;
    switch (arg) {
      case "--quick":
        flags.quick = true;
        continue;
      case "--pg-restart":
        flags.pgRestart = true;
        continue;
      case "--keep":
        flags.keep = true;
        continue;
      case "--messages":
      case "--faults":
      case "--seconds":
      case "--seed":
        n = number();
        if (typeof n === "string") return n;
        flags[arg.slice(2) as "messages" | "faults" | "seconds" | "seed"] = n;
        continue;
      default:
        return `unknown argument ${arg}`;
    }
  }
  if (flags.messages !== undefined && flags.messages < 100) return "--messages must be ≥ 100";
  if (flags.seconds !== undefined && flags.seconds < 5) return "--seconds must be ≥ 5";
  return flags;
}

if (import.meta.main) {
  const flags = parseFlags(Deno.args);
  if (typeof flags === "string") {
    console.error(`chaos: ${flags}\n${USAGE}`);
    Deno.exit(2);
  }
  let databaseUrl: string;
  try {
    // Only to find the Postgres server: the chaos database is created next to it.
    databaseUrl = readEnv(z.object({ DATABASE_URL: databaseEnv.DATABASE_URL }), processEnv())
      .DATABASE_URL;
  } catch (error) {
    if (!(error instanceof ConfigError)) throw error;
    console.error(error.message);
    Deno.exit(2);
  }
  const quick = flags.quick;
  const code = await runChaos({
    messages: flags.messages ?? (quick ? 500 : 5000),
    faults: flags.faults ?? (quick ? 7 : 120),
    seconds: flags.seconds ?? (quick ? 30 : 300),
    seed: flags.seed ?? Math.floor(Math.random() * 2 ** 31),
    pgRestart: flags.pgRestart,
    keep: flags.keep,
    drainSeconds: quick ? 90 : 240,
    stallSeconds: quick ? 25 : 60,
    databaseUrl,
  });
  Deno.exit(code);
}
