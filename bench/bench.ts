/**
 * `deno task bench [-- --quick] [-- --only http,growth,worker,…]`: poimen side by side with a minimal
 * endpoint, pgbench, pg-boss and graphile-worker, in one run on this
 * machine, written to bench/REPORT.md. Not a test: it asserts nothing about
 * durations; it fails only when a count is wrong (every key exactly once).
 *
 * - HTTP, load from wrk (bench/wrk/admit.lua) at 16 and 64 connections,
 *   rounds alternating A B A B: the minimal endpoint (bench/minimal_server.ts)
 *   and poimen's POST /v1/runs with new keys, replays and no key;
 * - pgbench on the minimal endpoint's statement, same connections;
 * - pg-boss `send` with singletonKey and graphile-worker `addJob` with jobKey,
 *   new and duplicate keys, same number of concurrent callers (Node 22,
 *   bench/queues.mjs);
 * - admission at 0, 100,000 and 1,000,000 existing runs, never analyzed;
 * - worker execution: one poimen worker (concurrency 16) and one
 *   graphile-worker runner (concurrency 16), the same number of queued jobs;
 * - waiting for results: 2,000 callers on `Prefer: wait=30` while their
 *   runs finish over a few seconds, the delay from each run's end to its
 *   answer, and the API's CPU and RSS meanwhile;
 * - the inbox relay's drain rate, and publish→run and publish→event latency
 *   at a fixed 1,000 messages/s (needs the Kafka broker: `deno task kafka start`);
 * - peak RSS and CPU of every process, Postgres wait events during admission;
 * - the queue's cost against what waits beside the due work (issue 28):
 *   worker runs/s over 1 to 10,000 tenants and 3 and 30 hosted versions
 *   (spread_section.ts), one key's due runs behind 1,000 and 10,000 not-due
 *   groups (idle_groups_section.ts), claim latency and buffers at 1M queued
 *   (claim_cost_section.ts) and a soak with autovacuum on (soak_section.ts),
 *   the last two on a Postgres the bench starts itself (own_postgres.ts);
 * - durable runs (issue 30): runs of ten steps beside plain runs, and the
 *   delay from a signal to the step after the wait beside admission to the
 *   end of a plain run (durable_section.ts).
 *
 * Each section has its module (http_admission.ts with pgbench_insert.ts and
 * queue_competitors.ts, growth_section.ts, worker_section.ts,
 * wait_section.ts with wait_clients.ts, relay_section.ts); they add to one BenchContext (run_context.ts), from
 * which report_writer.ts writes the report.
 */
import { createPool } from "../db/pool.ts";
import { type CommandSpec, type Output, usageError } from "../core/command_line.ts";
import { PROJECT_ROOT } from "../dev/tasks.ts";
import { ensureQueueDeps, ensureWrk, findPgbench, loadAvg } from "./tools.ts";
import { adminUrl, BenchEnv, parseBenchCommandLine } from "./bench_command_line.ts";
import { BenchContext, log, type Section, SECTIONS } from "./run_context.ts";
import { versions } from "./machine_facts.ts";
import { httpSection } from "./http_admission.ts";
import { growthSection } from "./growth_section.ts";
import { workerSection } from "./worker_section.ts";
import { relaySection } from "./relay_section.ts";
import { waitSection } from "./wait_section.ts";
import { spreadSection } from "./spread_section.ts";
import { idleGroupsSection } from "./idle_groups_section.ts";
import { claimCostSection } from "./claim_cost_section.ts";
import { soakSection } from "./soak_section.ts";
import { durableSection } from "./durable_section.ts";
import { SHAPE_SECTIONS, type ShapeConfig } from "./run_context.ts";
import { report } from "./report_writer.ts";

const COMMAND = {
  name: "bench",
  synopsis: "[--quick] [--only SECTIONS] [--soak-runs N] [--spread-runs N] [--tenants LIST] " +
    "[--idle-groups LIST] [--claim-queued N]",
  description: `
poimen side by side with a minimal hono + postgres.js endpoint, pgbench on the
same INSERT, pg-boss and graphile-worker, in one run on this machine: HTTP
admission at 16 and 64 connections (load from wrk, installed with apt-get when
missing and running as root), enqueue with keys, admission as a never-analyzed
table grows, worker execution, callers waiting for results (Prefer: wait),
the inbox relay (needs the Kafka broker: deno task kafka start), and the
queue's cost against what waits beside the due work: worker runs/s over
tenants and hosted versions (spread), one key's due runs behind not-due
groups (idle), claim latency and buffers at a large queue (claim) and a soak
with autovacuum on (soak), the last two on a Postgres the bench starts
itself (initdb into a temporary directory; as root, run as postgres). Writes
bench/REPORT.md and prints it. Asserts nothing about durations; exits non-zero
when a count is wrong (every key exactly once, every waiter answered final). pg-boss, graphile-worker and Node 22 are installed into bench/.deps on
first use.`,
  flags: {
    quick: {
      type: "boolean",
      description: "a smoke run (2 s per figure, one round, small queue-shape sizes)",
    },
    only: {
      type: "string",
      valueName: "SECTIONS",
      description: `only these, comma-separated: ${SECTIONS.join(", ")} (REPORT.md left alone)`,
    },
    "soak-runs": {
      type: "string",
      valueName: "N",
      description:
        "runs through the soak (default 200000, at most about 5 minutes here; the issue's 10000000)",
    },
    "spread-runs": {
      type: "string",
      valueName: "N",
      description: "runs each spread scenario drains (default 20000)",
    },
    tenants: {
      type: "string",
      valueName: "LIST",
      description: "tenant counts of the spread section (default 1,200,2000,10000; 1 always)",
    },
    "idle-groups": {
      type: "string",
      valueName: "LIST",
      description: "not-due groups of the idle section (default 0,1000,10000; 0 always)",
    },
    "claim-queued": {
      type: "string",
      valueName: "N",
      description:
        "queued runs of the claim section (default 1000000; tenants and running 1% each)",
    },
  },
  env: BenchEnv,
} satisfies CommandSpec;

async function main({ quick, only, shape }: BenchArgs) {
  const started = { at: new Date(), load: loadAvg() };
  log(`${quick ? "quick" : "full"} run; load average ${started.load}`);
  // The queue-shape sections alone need none of the competitors' tools.
  const tools = !only || [...only].some((s) => !(SHAPE_SECTIONS as readonly string[]).includes(s));
  const wrk = tools ? await ensureWrk() : "";
  const pgbench = tools ? await findPgbench() : "";
  const nodeVersion = tools ? await ensureQueueDeps() : "";
  const ctx = new BenchContext({ quick, only, adminUrl: adminUrl(), wrk, pgbench, shape });
  const admin = createPool({ url: ctx.adminUrl, max: 2, applicationName: "bench" });
  const facts = tools
    ? await versions(admin, { wrk, pgbench, nodeVersion })
    : { Deno: Deno.version.deno };
  const dbs = () =>
    admin<{ datname: string }[]>`
      select datname from pg_database where datname like ${`poimen_bench_${ctx.stamp}%`}`;
  try {
    if (ctx.wanted("http")) {
      log("HTTP, pgbench and enqueue rounds");
      await httpSection(ctx, admin);
    }
    if (ctx.wanted("growth")) {
      log("admission as the table grows");
      await growthSection(ctx, admin);
    }
    if (ctx.wanted("worker")) {
      log("worker execution");
      await workerSection(ctx, admin);
    }
    if (ctx.wanted("spread")) {
      log("worker runs/s over tenants and hosted versions");
      await spreadSection(ctx, admin);
    }
    if (ctx.wanted("idle")) {
      log("one key's due runs behind not-due groups");
      await idleGroupsSection(ctx, admin);
    }
    if (ctx.wanted("claim")) {
      log("claim latency and buffers at a large queue (own Postgres)");
      await claimCostSection(ctx);
    }
    if (ctx.wanted("wait")) {
      log("callers waiting for results");
      await waitSection(ctx, admin);
    }
    if (ctx.wanted("relay")) {
      log("relay");
      await relaySection(ctx, admin);
    }
    if (ctx.wanted("durable")) {
      log("durable runs: steps and resume latency");
      await durableSection(ctx, admin);
    }
    if (ctx.wanted("soak")) {
      log("soak with autovacuum on (own Postgres)");
      await soakSection(ctx);
    }
    const text = await report(ctx, started, facts);
    // With --only the figures are not one run's: the report keeps the last full run.
    if (!ctx.only) await Deno.writeTextFile(`${PROJECT_ROOT}bench/REPORT.md`, text);
    console.log(text);
  } finally {
    for (const { datname } of await dbs()) {
      await admin.unsafe(`drop database if exists ${datname} with (force)`);
    }
    await admin.end();
  }
}

/** What a run was asked for on the command line. */
export interface BenchArgs {
  quick: boolean;
  /** `--only`'s sections; undefined: every section, and the report is written. */
  only?: ReadonlySet<Section>;
  /** The queue-shape sizes set on the command line (the rest: the run's defaults). */
  shape: Partial<ShapeConfig>;
}

/** A whole number ≥ `min` from flag `name`'s value, or a usage message. */
function wholeNumber(name: string, value: string, min: number): number | string {
  const n = Number(value);
  return /^\d+$/.test(value) && n >= min ? n : `--${name} must be a whole number ≥ ${min}`;
}

/** Comma-separated whole numbers ≥ `min`, ascending, or a usage message. */
function wholeNumbers(name: string, value: string, min: number): number[] | string {
  const list = value.split(",").map((v) => wholeNumber(name, v.trim(), min));
  if (list.some((v) => typeof v === "string")) {
    return `--${name}: whole numbers ≥ ${min}, comma-separated`;
  }
  const ns = list as number[];
  return ns.every((n, i) => i === 0 || n > ns[i - 1]) ? ns : `--${name}: ascending, each once`;
}

/**
 * `--quick` and `--only` from the task's arguments, or the exit code once
 * the help (0) or a usage mistake (2) is printed.
 */
export function benchArgs(argv: string[], output?: Output): BenchArgs | number {
  const line = parseBenchCommandLine(COMMAND, argv, output);
  if (typeof line === "number") return line;
  const only = line.flags.only?.split(",");
  const unknown = only?.find((name) => !(SECTIONS as readonly string[]).includes(name));
  if (unknown !== undefined) {
    return usageError(
      COMMAND,
      `--only: no section '${unknown}' (sections: ${SECTIONS.join(", ")})`,
      output,
    );
  }
  const shape: Partial<ShapeConfig> = {};
  const f = line.flags;
  const parsed: [
    keyof ShapeConfig,
    string | undefined,
    (v: string) => number | number[] | string,
  ][] = [
    ["soakRuns", f["soak-runs"], (v) => wholeNumber("soak-runs", v, 1)],
    ["spreadRuns", f["spread-runs"], (v) => wholeNumber("spread-runs", v, 1)],
    ["tenants", f.tenants, (v) => wholeNumbers("tenants", v, 1)],
    ["idleGroups", f["idle-groups"], (v) => wholeNumbers("idle-groups", v, 0)],
    ["claimQueued", f["claim-queued"], (v) => wholeNumber("claim-queued", v, 100)],
  ];
  for (const [key, value, read] of parsed) {
    if (value === undefined) continue;
    const v = read(value);
    if (typeof v === "string") return usageError(COMMAND, v, output);
    Object.assign(shape, { [key]: v });
  }
  return { quick: line.flags.quick ?? false, only: only && new Set(only as Section[]), shape };
}

if (import.meta.main) {
  const args = benchArgs(Deno.args);
  if (typeof args === "number") Deno.exit(args);
  await main(args);
}
