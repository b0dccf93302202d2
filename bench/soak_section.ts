/**
 * The soak (issue 28): N runs (`--soak-runs`) passing through a Postgres
 * the bench starts itself with autovacuum ON (the shared server runs with
 * it off), retention on. The bench admits through the kernel, keeping a
 * few thousand queued over 100 tenants; one worker process (concurrency 16)
 * executes; the bench stands in for the outbox without Kafka (the outbox's
 * own claim-and-mark statements, db/outbox.ts, publishing nowhere) and runs
 * the retention purge (db/retention.ts) with a short retention, so finished
 * runs leave as they would in production, only sooner. Every window it
 * records claim latency (probe claims of db/claims.ts in rolled-back
 * transactions, beside the worker's), table and index sizes, and how often
 * autovacuum and autoanalyze ran on `runs`.
 */
import { createPool, type Sql } from "../db/pool.ts";
import { claimRuns } from "../db/claims.ts";
import { claimPendingEvents, markPublished, OUTBOX_SHARDS } from "../db/outbox.ts";
import { purgeFinishedRuns } from "../db/retention.ts";
import { delay, SECOND } from "../core/time.ts";
import { type BenchContext, check, log, type SoakSample } from "./run_context.ts";
import { createDb } from "./scenario_support.ts";
import { startOwnPostgres } from "./own_postgres.ts";

const ALL_SHARDS = Array.from({ length: OUTBOX_SHARDS }, (_, i) => i);
import {
  admitAll,
  benchKernel,
  insertTenants,
  quantile,
  readyWorker,
} from "./queue_shape_support.ts";

const TENANTS = 100;
/** Finished runs are purged this long after they finished. */
const RETENTION_MS = 30 * SECOND;
const PURGE_EVERY_MS = 2 * SECOND;
const PURGE_BATCH = 500;
/** Queued runs the feeder keeps ahead of the worker. */
const BACKLOG = 4_000;
const WINDOW_MS = 10 * SECOND;
const PROBE_EVERY_MS = 250;

/** The own server's settings: autovacuum on, its defaults but a shorter nap. */
const SOAK_SETTINGS = {
  autovacuum: "on",
  autovacuum_naptime: "'10s'",
  track_counts: "on",
};

/** Rolls a probe claim back. */
class Rollback extends Error {}

/** The soak: its own server, a worker, the feeder, the outbox stand-in, the purge, the sampler. */
export async function soakSection(ctx: BenchContext) {
  const n = ctx.cfg.shape.soakRuns;
  const pg = await startOwnPostgres(SOAK_SETTINGS);
  let stopping = false;
  try {
    const admin = createPool({ url: pg.adminUrl, max: 2, applicationName: "bench" });
    const { url, sql } = await createDb(ctx, admin, `poimen_bench_${ctx.stamp}_soak`, pg.adminUrl);
    const kernelSql = createPool({ url, max: 4, applicationName: "bench-admit" });
    const kernel = benchKernel(kernelSql);
    const ids = Array.from({ length: TENANTS }, (_, i) => `soak${i}`);
    await insertTenants(sql, ids);
    const worker = await readyWorker(url);
    const started = performance.now();
    let admitted = 0;
    let purged = 0;
    const probes: number[] = [];
    const loops: Promise<void>[] = [];
    try {
      log(`soak: ${n} runs through a Postgres with autovacuum on`);
      // The outbox stand-in: ships (nowhere) what the worker's events add.
      loops.push((async () => {
        while (!stopping) {
          const shipped = await sql.begin(async (tx) => {
            // Every shard, on this transaction's session: the only publisher.
            const [{ pid }] = await tx<{ pid: number }[]>`select pg_backend_pid() as pid`;
            const events = await claimPendingEvents(tx, 500, 1024 * 1024, {
              shards: ALL_SHARDS,
              pid,
            });
            return await markPublished(tx, events);
          });
          if (shipped === 0) await delay(200);
        }
      })());
      // The retention purge, as the outbox's purger runs it.
      loops.push((async () => {
        while (!stopping) {
          for (;;) {
            const r = await purgeFinishedRuns(sql, RETENTION_MS, PURGE_BATCH);
            purged += r.runs;
            if (r.runs < PURGE_BATCH || stopping) break;
          }
          await delay(PURGE_EVERY_MS);
        }
      })());
      // Probe claims beside the worker's.
      loops.push((async () => {
        while (!stopping) {
          await sql.begin(async (tx) => {
            const t0 = performance.now();
            await claimRuns(tx as unknown as Sql, "bench-probe", 16, 30 * SECOND, {
              names: ["echo"],
              versions: [1],
            });
            probes.push(performance.now() - t0);
            throw new Rollback();
          }).catch((e) => {
            if (!(e instanceof Rollback)) throw e;
          });
          await delay(PROBE_EVERY_MS);
        }
      })());
      let windowEnd = performance.now() + WINDOW_MS;
      for (;;) {
        const remaining = await busy(sql);
        if (admitted >= n && remaining === 0) break;
        if (worker.exited) throw new Error(`soak: worker exited:\n${worker.logs().join("\n")}`);
        if (admitted < n && remaining < BACKLOG) {
          const batch = Math.min(2000, n - admitted);
          const from = admitted;
          await admitAll(kernel, batch, (i) => ({
            tenant: ids[(from + i) % TENANTS],
            req: { workflow_ref: "echo", input: { n: from + i } },
          }));
          admitted += batch;
        } else await delay(50);
        if (performance.now() >= windowEnd) {
          const s = await sampleWindow(sql, started, admitted - remaining, remaining, probes);
          s.purged = purged;
          ctx.shape.soak.push(s);
          probes.length = 0;
          windowEnd += WINDOW_MS;
          log(
            `soak ${s.at.toFixed(0)} s: ${s.finished} finished, claim p99 ${
              s.claimP99.toFixed(1)
            } ms, runs indexes ${s.runsIndexMb.toFixed(1)} MB, ${s.autovacuums} autovacuums`,
          );
        }
      }
      const last = await sampleWindow(sql, started, admitted, 0, probes);
      last.purged = purged;
      ctx.shape.soak.push(last);
      const seconds = (performance.now() - started) / 1000;
      ctx.shape.soakSetup = { runs: n, seconds, settings: pg.settings, rate: n / seconds };
    } finally {
      stopping = true;
      await worker.stop();
      await Promise.allSettled(loops);
    }
    // Every run admitted either purged or still there, once, succeeded on its first attempt.
    const [c] = await sql<{ n: number; bad: number }[]>`
      select count(*)::int as n,
             count(*) filter (where status <> 'succeeded' or attempts <> 1)::int as bad from runs`;
    check(
      c.bad === 0 && c.n + purged === admitted,
      `soak: ${c.n} runs left + ${purged} purged for ${admitted} admitted, ${c.bad} not succeeded once`,
    );
    await kernelSql.end();
    await sql.end();
    await admin.end();
  } finally {
    stopping = true;
    await pg.stop();
  }
}

/** Runs queued or running. */
async function busy(sql: Sql): Promise<number> {
  const [r] = await sql<{ n: number }[]>`
    select (select count(*) from runs where status = 'queued')::int
         + (select count(*) from runs where status = 'running')::int as n`;
  return r.n;
}

/** One window's sample: the probes' latency, the sizes, vacuum's runs so far. */
async function sampleWindow(
  sql: Sql,
  started: number,
  finished: number,
  queued: number,
  probes: number[],
): Promise<SoakSample> {
  const [r] = await sql<
    { runs: number; runs_idx: number; events: number; vac: number; an: number }[]
  >`
    select pg_relation_size('runs')::float8 / 1048576 as runs,
           pg_indexes_size('runs')::float8 / 1048576 as runs_idx,
           pg_total_relation_size('work_events')::float8 / 1048576 as events,
           (select autovacuum_count from pg_stat_user_tables where relname = 'runs')::int as vac,
           (select autoanalyze_count from pg_stat_user_tables where relname = 'runs')::int as an`;
  return {
    at: (performance.now() - started) / 1000,
    finished,
    queued,
    claimP50: quantile(probes, 0.5),
    claimP99: quantile(probes, 0.99),
    runsMb: r.runs,
    runsIndexMb: r.runs_idx,
    eventsMb: r.events,
    autovacuums: r.vac,
    autoanalyzes: r.an,
    purged: 0,
  };
}
