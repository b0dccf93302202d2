/**
 * The spread section (issue 28): the same number of `echo` runs, admitted
 * through the kernel, spread over 1, 200, 2,000 and 10,000 tenants, and on
 * one tenant with a worker hosting 3 and 30 versions (bench/hosted/); one
 * worker process (concurrency 16) timed from its first start to its last
 * finish (Postgres clock) in each. Scenarios alternate within each round;
 * the report sets each beside the one-tenant figure (goal: ≥ 0.9 at 10,000).
 */
import { createPool, type Sql } from "../db/pool.ts";
import { delay } from "../core/time.ts";
import { type BenchContext, check, log } from "./run_context.ts";
import { createDb } from "./scenario_support.ts";
import { admitAll, benchKernel, insertTenants, readyWorker } from "./queue_shape_support.ts";

/** The spread section's group of figures, and its scenarios' names. */
export const SPREAD_GROUP = "spread";
/** A spread scenario's name: over `tenants` tenants, or on one hosting `versions`. */
export function spreadScenario(tenants: number, versions = 1): string {
  return versions > 1
    ? `1 tenant, worker hosting ${versions} versions`
    : `${tenants.toLocaleString("en")} tenant${tenants === 1 ? "" : "s"}, worker hosting 1 version`;
}

/** Every round of the spread section. */
export async function spreadSection(ctx: BenchContext, admin: Sql) {
  const shape = ctx.cfg.shape;
  const { url, sql } = await createDb(ctx, admin, `poimen_bench_${ctx.stamp}_spread`);
  const kernelSql = createPool({ url, max: 4, applicationName: "bench-admit" });
  const kernel = benchKernel(kernelSql);
  const tenantCounts = [1, ...shape.tenants.filter((n) => n !== 1)];
  const scenarios = [
    ...tenantCounts.map((tenants) => ({ tenants, versions: 1 })),
    ...shape.hostedVersions.map((versions) => ({ tenants: 1, versions })),
  ];
  try {
    for (let round = 1; round <= ctx.cfg.rounds; round++) {
      for (const { tenants, versions } of scenarios) {
        const prefix = `s${round}-${tenants}-${versions}-`;
        const ids = Array.from({ length: tenants }, (_, i) => `${prefix}${i}`);
        await insertTenants(sql, ids);
        const runs = shape.spreadRuns;
        await admitAll(kernel, runs, (i) => ({
          tenant: ids[i % tenants],
          req: { workflow_ref: "echo", input: { n: i } },
        }));
        const rate = await drain(ctx, sql, url, prefix, runs, versions);
        ctx.figures.push({
          group: SPREAD_GROUP,
          scenario: spreadScenario(tenants, versions),
          conns: 16,
          round,
          rate,
          p50: 0,
          p99: 0,
        });
        log(`spread round ${round}: ${spreadScenario(tenants, versions)}: ${rate.toFixed(0)}/s`);
      }
    }
  } finally {
    await kernelSql.end();
    await sql.end();
  }
}

/**
 * Starts a worker (hosting `versions`), waits until no run is queued or
 * running, and returns the runs of tenants `prefix…` per second from their
 * first start to their last finish; fails the bench unless each succeeded
 * on its first attempt.
 */
async function drain(
  ctx: BenchContext,
  sql: Sql,
  url: string,
  prefix: string,
  runs: number,
  versions: number,
): Promise<number> {
  const worker = await readyWorker(
    url,
    versions > 1 ? `hosted/versions_${versions}.ts` : undefined,
  );
  const deadline = Date.now() + 900_000;
  try {
    await ctx.stats("worker").during(worker.pid, async () => {
      for (;;) {
        // Every earlier scenario drained: anything queued or running is this one's.
        const [r] = await sql<{ busy: boolean }[]>`
          select exists (select 1 from runs where status = 'queued')
              or exists (select 1 from runs where status = 'running') as busy`;
        if (!r.busy) return;
        if (worker.exited || Date.now() > deadline) {
          throw new Error(`spread ${prefix}: worker stalled:\n${worker.logs().join("\n")}`);
        }
        await delay(250);
      }
    });
  } finally {
    await worker.stop();
  }
  const [c] = await sql<{ n: number; once: number; s: number }[]>`
    select count(*)::int as n,
           count(*) filter (where attempts = 1 and status = 'succeeded')::int as once,
           extract(epoch from max(finished_at) - min(started_at))::float8 as s
      from runs where tenant_id like ${prefix + "%"}`;
  check(
    c.n === runs && c.once === runs,
    `spread ${prefix}: ${c.once} of ${c.n} runs (${runs} admitted) succeeded on their first attempt`,
  );
  return runs / c.s;
}
