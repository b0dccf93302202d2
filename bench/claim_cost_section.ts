/**
 * The claim section (issue 28): claim latency p50/p99 and shared buffers
 * touched per claim at 1,000,000 queued runs (most not due, or of versions
 * the claimer does not host), 10,000 running, 10,000 tenants, all admitted
 * and claimed through the product's own statements (admission kernel,
 * db/claims.ts), on a Postgres the bench starts itself with
 * pg_stat_statements loaded (the shared server has no preload and must not
 * be reconfigured) and autovacuum off, as on the shared one.
 *
 * Each sample is one call of a claim function of db/claims.ts in its own
 * transaction, rolled back, so every sample sees the same queue: its time
 * is the call's, its buffers the pg_stat_statements delta of everything the
 * call ran (whatever statements a claim is made of), read after the
 * rollback. Sampled with no statistics (as loaded), then after ANALYZE.
 */
import { createPool, type Sql } from "../db/pool.ts";
import { claimLimitedRuns, claimRuns, type HostedVersions } from "../db/claims.ts";
import { DAY, SECOND } from "../core/time.ts";
import { type BenchContext, check, type ClaimFigure, log } from "./run_context.ts";
import { createDb } from "./scenario_support.ts";
import { startOwnPostgres } from "./own_postgres.ts";
import { admitAll, benchKernel, insertTenants, quantile } from "./queue_shape_support.ts";

const ECHO: HostedVersions = { names: ["echo"], versions: [1] };
const KEYED: HostedVersions = { names: ["bench.keyed"], versions: [1] };
/** A claim as the worker asks for one: up to its concurrency, with its lease. */
const CLAIM_LIMIT = 16;
const LEASE_MS = 30 * SECOND;

/** Rolls a sample's transaction back. */
class Rollback extends Error {}

/** The claim section: its own server, the queue loaded, then the samples. */
export async function claimCostSection(ctx: BenchContext) {
  const pg = await startOwnPostgres({
    autovacuum: "off",
    shared_preload_libraries: "'pg_stat_statements'",
    "pg_stat_statements.max": "1000",
  });
  try {
    const admin = createPool({ url: pg.adminUrl, max: 2, applicationName: "bench" });
    const name = `poimen_bench_${ctx.stamp}_claim`;
    const { url, sql } = await createDb(ctx, admin, name, pg.adminUrl);
    try {
      await sql`create extension if not exists pg_stat_statements`;
      const queued = ctx.cfg.shape.claimQueued;
      const tenants = Math.max(1, Math.min(10_000, Math.floor(queued / 100)));
      const running = Math.max(1, Math.min(10_000, Math.floor(queued / 100)));
      await load(sql, url, queued, tenants, running);
      ctx.shape.claimSetup = { queued, running, tenants };
      for (const state of ["no statistics", "analyzed"]) {
        if (state === "analyzed") await sql`analyze`;
        for (const [statement, fn] of CLAIMS) {
          const f = await sample(sql, statement, state, ctx.cfg.shape.claimSamples, fn);
          ctx.shape.claims.push(f);
          log(
            `claim ${statement}, ${state}: p50 ${f.p50.toFixed(2)} ms, p99 ${
              f.p99.toFixed(2)
            } ms, ${f.buffersP50} buffers (p99 ${f.buffersP99}), ${f.claimed} claimed`,
          );
        }
      }
    } finally {
      await sql.end();
      await admin.end();
    }
  } finally {
    await pg.stop();
  }
}

/** The claim statements sampled, as the worker calls them. */
const CLAIMS: [string, (sql: Sql) => Promise<unknown[]>][] = [
  ["claimRuns (echo@1)", (sql) => claimRuns(sql, "bench-probe", CLAIM_LIMIT, LEASE_MS, ECHO)],
  [
    "claimLimitedRuns (bench.keyed@1, limit 1 per key)",
    (sql) => claimLimitedRuns(sql, "bench-probe", CLAIM_LIMIT, LEASE_MS, KEYED),
  ],
];

/**
 * `queued` runs over `tenants` tenants through the kernel, each tenant's
 * tenth: 7 echo due tomorrow, 1 bench.keyed (a key of its own; the
 * tenant's first one due now, the rest tomorrow), 1 sleep due now (not
 * hosted by the claimer), 1 echo due now; then `running` of the due echo
 * runs claimed by a holder whose lease outlives the section.
 */
async function load(sql: Sql, url: string, queued: number, tenants: number, running: number) {
  const ids = Array.from({ length: tenants }, (_, i) => `c${i}`);
  await insertTenants(sql, ids);
  const kernelSql = createPool({ url, max: 4, applicationName: "bench-admit" });
  const kernel = benchKernel(kernelSql);
  const tomorrow = new Date(Date.now() + DAY).toISOString();
  const t0 = performance.now();
  log(`claim: admitting ${queued} runs over ${tenants} tenants`);
  try {
    await admitAll(kernel, queued, (i) => {
      const tenant = ids[i % tenants];
      const j = Math.floor(i / tenants);
      switch (j % 10) {
        case 7:
          return {
            tenant,
            req: {
              workflow_ref: "bench.keyed",
              input: { k: j, n: i },
              ...(j === 7 ? {} : { run_after: tomorrow }),
            },
          };
        case 8:
          return { tenant, req: { workflow_ref: "sleep", input: { ms: 1 } } };
        case 9:
          return { tenant, req: { workflow_ref: "echo", input: { n: i } } };
        default:
          return { tenant, req: { workflow_ref: "echo", input: { n: i }, run_after: tomorrow } };
      }
    });
  } finally {
    await kernelSql.end();
  }
  log(`claim: admitted in ${((performance.now() - t0) / 1000).toFixed(0)} s; claiming ${running}`);
  let held = 0;
  while (held < running) {
    const got = await claimRuns(sql, "bench-holder", Math.min(1000, running - held), DAY, ECHO);
    if (got.length === 0) break;
    held += got.length;
  }
  const [c] = await sql<{ queued: number; running: number }[]>`
    select count(*) filter (where status = 'queued')::int as queued,
           count(*) filter (where status = 'running')::int as running from runs`;
  check(
    c.running === running && c.queued === queued - running,
    `claim: ${c.queued} queued and ${c.running} running after admitting ${queued} and holding ${running}`,
  );
}

/** Shared buffers hit or read so far in this database, all statements but this one's own. */
async function buffers(sql: Sql): Promise<number> {
  const [r] = await sql<{ b: number }[]>`
    select coalesce(sum(shared_blks_hit + shared_blks_read), 0)::float8 as b
      from pg_stat_statements
     where dbid = (select oid from pg_database where datname = current_database())
       and query not like '%pg_stat_statements%'`;
  return r.b;
}

/** `samples` rolled-back calls of `fn`: their time and buffers. */
async function sample(
  sql: Sql,
  statement: string,
  state: string,
  samples: number,
  fn: (sql: Sql) => Promise<unknown[]>,
): Promise<ClaimFigure> {
  const ms: number[] = [];
  const blocks: number[] = [];
  const claimed: number[] = [];
  // One warm-up call: the statement prepared, its first plan made.
  for (let i = 0; i <= samples; i++) {
    const before = await buffers(sql);
    let took = 0;
    let n = 0;
    await sql.begin(async (tx) => {
      const t0 = performance.now();
      n = (await fn(tx as unknown as Sql)).length;
      took = performance.now() - t0;
      throw new Rollback();
    }).catch((e) => {
      if (!(e instanceof Rollback)) throw e;
    });
    const after = await buffers(sql);
    if (i === 0) continue;
    ms.push(took);
    blocks.push(after - before);
    claimed.push(n);
  }
  return {
    statement,
    state,
    samples,
    p50: quantile(ms, 0.5),
    p99: quantile(ms, 0.99),
    buffersP50: quantile(blocks, 0.5),
    buffersP99: quantile(blocks, 0.99),
    claimed: quantile(claimed, 0.5),
  };
}
