/**
 * `deno task bench:growth`: admission rate as the runs table grows, never
 * analyzed (our Postgres runs with autovacuum off; production tables are in
 * that state after a new deployment, a TRUNCATE or a restore).
 *
 * For each size, a database of its own: the admission kernel in process
 * (16 concurrent callers, group commit as the API runs it) admits new keys,
 * then replays of existing keys, for BENCH_SECONDS each. Two pools per size:
 * - "young": its connections prepared their statements while the table held
 *   400 runs, as a young deployment's do, and then the table grew (a
 *   prepared statement keeps its generic plan while the table grows). On
 *   main before migration 003, 300 to 600 runs of one tenant, never
 *   analyzed, is where the planner costs runs_status_idx the same as the
 *   unique index for admission's replay probe (tests/db_plans_test.ts sweeps
 *   such sizes for every hot statement);
 * - "fresh": a new pool, its statements first planned at the final size.
 *
 * Usage: deno task bench:growth [--sizes 0,100000,1000000] [--out FILE]
 * Prints a markdown table; with --out also writes it to FILE. Asserts
 * nothing about durations.
 */
import { z } from "zod";
import type { CommandSpec } from "../core/command_line.ts";
import { createPool, type Sql } from "../db/pool.ts";
import { insertTenant } from "../db/auth.ts";
import { loadMigrations, migrate } from "../db/migrate.ts";
import { silentLogger } from "../core/log.ts";
import { Admission } from "../admission/admit.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { StaticCatalog } from "../admission/catalog.ts";
import { SECOND } from "../core/time.ts";
import { adminUrl, benchCommandLine, BenchEnv, exitUsage } from "./bench_command_line.ts";

const CLIENTS = 16;
const DURATION = Number(Deno.env.get("BENCH_SECONDS") ?? 5) * SECOND;
const WARMUP = 1 * SECOND;
const YOUNG = 400;
const ADMIN_URL = adminUrl();
const TENANT = "bench";

interface Row {
  size: number;
  pool: "young" | "fresh";
  newPerSecond: number;
  replayPerSecond: number;
  /** Index entries of runs read per admission (both phases), by index: what the probes cost. */
  readsPerAdmission: Record<string, number>;
}

/** Index entries read so far, per index of runs (the statistics collector's counters). */
async function indexReads(sql: Sql): Promise<Record<string, number>> {
  // The counters are flushed by each backend at the end of its transaction
  // (at most once a second): wait for them to settle.
  await new Promise((r) => setTimeout(r, 1500));
  const rows = await sql<{ index: string; reads: number }[]>`
    select indexrelname as index, idx_tup_read::float8 as reads
      from pg_stat_user_indexes where relname = 'runs'`;
  return Object.fromEntries(rows.map((r) => [r.index, r.reads]));
}

/** CLIENTS closed-loop callers of `call` for DURATION after a warm-up; admissions per second. */
async function rate(call: (client: number, i: number) => Promise<unknown>): Promise<number> {
  let count = 0;
  const from = performance.now() + WARMUP;
  const end = from + DURATION;
  await Promise.all(Array.from({ length: CLIENTS }, async (_, client) => {
    for (let i = 0; performance.now() < end; i++) {
      const t0 = performance.now();
      await call(client, i);
      if (t0 >= from) count++;
    }
  }));
  return count / ((performance.now() - from) / 1000);
}

/** `from`..`to` finished runs of the tenant, each with a dispatch key, inserted in one statement. */
async function grow(sql: Sql, from: number, to: number): Promise<void> {
  if (to < from) return;
  await sql`
    insert into runs (tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input,
                      dispatch_key, source, status, attempts, max_attempts, started_at,
                      finished_at, result, event_seq)
    select ${TENANT}, gen_random_uuid(), 'echo', 'echo', 1, '{"n":1}', 'grown-' || g, 'bench',
           'succeeded', 1, 3, now(), now(), '{"n":1}', 3
      from generate_series(${from}::int, ${to}::int) g`;
}

function kernel(sql: Sql) {
  const admission = new Admission(sql, new StaticCatalog(builtinRegistry().catalogVersions()), {
    maxBatch: 128,
    maxConcurrent: 2,
  });
  return (key: string) =>
    admission.admit({ workflow_ref: "echo", input: { n: 1 }, dispatch_key: key }, {
      tenantId: TENANT,
      source: "bench",
      entry: "http",
    });
}

async function measureSize(size: number): Promise<Row[]> {
  const dbName = `poimen_growth_${Date.now()}`;
  const admin = createPool({ url: ADMIN_URL, max: 1, applicationName: "bench-growth" });
  await admin.unsafe(`create database ${dbName}`);
  const url = new URL(ADMIN_URL);
  url.pathname = `/${dbName}`;
  const sql = createPool({ url: url.href, max: 4, applicationName: "bench-growth" });
  const rows: Row[] = [];
  try {
    await migrate(sql, loadMigrations(), silentLogger);
    await insertTenant(sql, TENANT);
    const young = createPool({ url: url.href, max: 10, applicationName: "bench-young" });
    if (size > 0) {
      // Young: its connections plan every statement at 400 to 560 runs.
      await grow(sql, 1, YOUNG);
      const admit = kernel(young);
      await Promise.all(Array.from({ length: CLIENTS }, async (_, c) => {
        for (let i = 0; i < 10; i++) await admit(`young-${c}-${i}`);
      }));
      await grow(sql, YOUNG + 1, size);
    }
    const pools: [Row["pool"], Sql][] = size > 0
      ? [["young", young], [
        "fresh",
        createPool({ url: url.href, max: 10, applicationName: "bench-fresh" }),
      ]]
      : [["fresh", young]];
    for (const [name, pool] of pools) {
      await sql`checkpoint`;
      const admit = kernel(pool);
      const before = await indexReads(sql);
      let admissions = 0;
      const counted = (key: string) => {
        admissions++;
        return admit(key);
      };
      const newPerSecond = await rate((c, i) => counted(`${name}-${c}-${i}`));
      // Replays of keys the table holds since it grew (or from just now, when empty).
      const replayPerSecond = await rate((c, i) =>
        counted(
          size > 0 ? `grown-${1 + ((c * 7919 + i * 104729) % size)}` : `${name}-${c}-${i % 50}`,
        )
      );
      const after = await indexReads(sql);
      const readsPerAdmission = Object.fromEntries(
        Object.entries(after)
          .map(([k, v]) => [k, (v - (before[k] ?? 0)) / admissions] as const)
          .filter(([, v]) => v >= 0.01),
      );
      rows.push({ size, pool: name, newPerSecond, replayPerSecond, readsPerAdmission });
      await pool.end();
    }
    const [stats] = await sql<{ reltuples: number }[]>`
      select reltuples::float8 from pg_class where relname = 'runs'`;
    if (stats.reltuples !== -1) throw new Error("runs was analyzed: the figures would not apply");
  } finally {
    await sql.end();
    await admin.unsafe(`drop database if exists ${dbName} with (force)`);
    await admin.end();
  }
  return rows;
}

const COMMAND = {
  name: "bench:growth",
  synopsis: "[--sizes 0,100000,1000000] [--out FILE]",
  description: `
The admission rate as the runs table grows, never analyzed: for each size, a
database of its own, the admission kernel in process (${CLIENTS} concurrent
callers) admitting new keys, then replays of existing keys, for BENCH_SECONDS
each, once through a pool whose statements were planned while the table was
young and once through a fresh pool. Prints a markdown table; asserts nothing
about durations.`,
  flags: {
    sizes: {
      type: "string",
      valueName: "LIST",
      description:
        `existing runs per database, comma-separated: 0 or above ${YOUNG} (default 0,100000)`,
    },
    out: { type: "string", valueName: "FILE", description: "also write the table to FILE" },
  },
  env: BenchEnv.extend({ BENCH_SECONDS: z.string().default("5") }),
} satisfies CommandSpec;

async function main() {
  const { flags } = benchCommandLine(COMMAND, Deno.args);
  const values = { sizes: flags.sizes ?? "0,100000", out: flags.out };
  const sizes = values.sizes.split(",").map((s) => Number(s.trim()));
  if (sizes.some((s) => !Number.isInteger(s) || s < 0 || (s > 0 && s <= YOUNG))) {
    exitUsage(COMMAND, `--sizes: 0 or whole numbers above ${YOUNG}, comma-separated`);
  }
  const rows: Row[] = [];
  for (const size of sizes) rows.push(...await measureSize(size));
  const empty = rows.find((r) => r.size === 0);
  const ratio = (v: number) => empty ? (v / empty.newPerSecond).toFixed(2) : "–";
  const table = [
    `${new Date().toISOString()} · Deno ${Deno.version.deno} · ${navigator.hardwareConcurrency} ` +
    `cores · ${CLIENTS} callers · ${DURATION / SECOND} s per figure after ${WARMUP / SECOND} s ` +
    `warm-up · runs never analyzed`,
    ``,
    `| existing runs | pool | new keys / s | × empty | replays / s | index entries read per admission |`,
    `|---:|---|---:|---:|---:|---|`,
    ...rows.map((r) =>
      `| ${r.size.toLocaleString("en")} | ${r.pool} | ${r.newPerSecond.toFixed(0)} | ${
        ratio(r.newPerSecond)
      } | ${r.replayPerSecond.toFixed(0)} | ${
        Object.entries(r.readsPerAdmission).map(([k, v]) => `${k} ${v.toFixed(1)}`).join(", ")
      } |`
    ),
    ``,
  ].join("\n");
  console.log(table);
  if (values.out) await Deno.writeTextFile(values.out, table);
}

if (import.meta.main) await main();
