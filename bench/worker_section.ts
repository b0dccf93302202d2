/**
 * The worker section, in each round: runs admitted through the kernel, then
 * one poimen worker process (concurrency 16) timed until all succeeded; then
 * graphile-worker's runner on the same number of jobs.
 */
import { createPool, type Sql } from "../db/pool.ts";
import { insertTenant } from "../db/auth.ts";
import { Admission } from "../admission/admit.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { StaticCatalog } from "../admission/catalog.ts";
import { PoimenProcess } from "../dev/processes.ts";
import { delay, SECOND } from "../core/time.ts";
import { type BenchContext, check, log } from "./run_context.ts";
import { createDb } from "./scenario_support.ts";
import { graphileWorkRound } from "./queue_competitors.ts";

/** Every round of the worker section. */
export async function workerSection(ctx: BenchContext, admin: Sql) {
  const { url, sql } = await createDb(ctx, admin, `poimen_bench_${ctx.stamp}_w`);
  await insertTenant(sql, "bench");
  try {
    for (let round = 1; round <= ctx.cfg.rounds; round++) {
      // poimen: runs admitted through the kernel, then one worker process.
      const kernelSql = createPool({ url, max: 4, applicationName: "bench-admit" });
      const kernel = new Admission(
        kernelSql,
        new StaticCatalog(builtinRegistry().catalogVersions()),
        {
          maxBatch: 500,
          maxConcurrent: 2,
        },
      );
      const tenant = `w${round}`;
      await insertTenant(sql, tenant);
      for (let i = 0; i < ctx.cfg.workerJobs; i += 2000) {
        await Promise.all(
          Array.from(
            { length: Math.min(2000, ctx.cfg.workerJobs - i) },
            (_, j) =>
              kernel.admit({ workflow_ref: "echo", input: { n: i + j } }, {
                tenantId: tenant,
                source: "bench",
                entry: "http",
              }),
          ),
        );
      }
      await kernelSql.end();
      const worker = new PoimenProcess("worker", {
        DATABASE_URL: url,
        WORKER_CONCURRENCY: "16",
        LOG_LEVEL: "error",
      });
      const { value: seconds, cores } = await ctx.stats("worker").during(worker.pid, async () => {
        const deadline = Date.now() + 600 * SECOND;
        for (;;) {
          const [r] = await sql<{ n: number }[]>`
            select count(*)::int as n from runs where tenant_id = ${tenant} and status = 'succeeded'`;
          if (r.n >= ctx.cfg.workerJobs) break;
          if (worker.exited || Date.now() > deadline) {
            throw new Error(`worker stalled at ${r.n}:\n${worker.logs().join("\n")}`);
          }
          await delay(100);
        }
        const [t] = await sql<{ s: number }[]>`
          select extract(epoch from max(finished_at) - min(started_at))::float8 as s
            from runs where tenant_id = ${tenant}`;
        return t.s;
      });
      await worker.stop();
      const [c] = await sql<{ n: number; once: number }[]>`
        select count(*)::int as n, count(*) filter (where attempts = 1 and status = 'succeeded')::int as once
          from runs where tenant_id = ${tenant}`;
      check(
        c.n === ctx.cfg.workerJobs && c.once === ctx.cfg.workerJobs,
        `worker round ${round}: ${c.once} of ${c.n} runs succeeded on their first attempt`,
      );
      ctx.figures.push({
        group: "worker",
        scenario: "poimen worker, concurrency 16, echo runs",
        conns: 16,
        round,
        rate: ctx.cfg.workerJobs / seconds,
        p50: 0,
        p99: 0,
        cores,
      });
      log(`poimen worker round ${round}: ${(ctx.cfg.workerJobs / seconds).toFixed(0)}/s`);

      // graphile-worker: the same number of no-op jobs, one runner process.
      await graphileWorkRound(ctx, url, round);
    }
  } finally {
    await sql.end();
  }
}
