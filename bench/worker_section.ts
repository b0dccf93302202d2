/**
 * The worker section, in each round: runs admitted through the kernel, then
 * one poimen worker process (concurrency 16) timed until all succeeded; the
 * same with the runs limited to one at a time per key over 1,000 keys
 * (bench/keyed_workflows.ts); then graphile-worker's runner on the same
 * number of jobs.
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
import { keyed } from "./keyed_workflows.ts";
import { PROJECT_ROOT } from "../dev/tasks.ts";

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
        new StaticCatalog(builtinRegistry().register(keyed).catalogVersions()),
        {
          maxBatch: 500,
          maxConcurrent: 2,
        },
      );
      const plain = await workerRound(ctx, sql, url, kernel, `w${round}`, "echo", []);
      ctx.figures.push({
        group: "worker",
        scenario: "poimen worker, concurrency 16, echo runs",
        conns: 16,
        round,
        ...plain,
      });
      log(`poimen worker round ${round}: ${plain.rate.toFixed(0)}/s`);
      // The same runs, limited to one at a time per key, over 1,000 keys.
      const limited = await workerRound(ctx, sql, url, kernel, `k${round}`, "bench.keyed", [
        "--workflows",
        `${PROJECT_ROOT}bench/keyed_workflows.ts`,
      ]);
      ctx.figures.push({
        group: "worker",
        scenario: `limited: ${KEYS.toLocaleString("en")} keys at concurrency limit 1, ` +
          "poimen worker, concurrency 16",
        conns: 16,
        round,
        ...limited,
      });
      log(`poimen worker, ${KEYS} keys at limit 1, round ${round}: ${limited.rate.toFixed(0)}/s`);
      await kernelSql.end();

      // graphile-worker: the same number of no-op jobs, one runner process.
      await graphileWorkRound(ctx, url, round);
    }
  } finally {
    await sql.end();
  }
}

/** How many concurrency keys the limited case spreads its runs over. */
const KEYS = 1000;

/**
 * Admits `ctx.cfg.workerJobs` runs of `workflow` for `tenant` through the
 * kernel (keys `n % KEYS` for the limited one), then times one worker
 * process (concurrency 16, `args`) until all succeeded, each on its first
 * attempt.
 */
async function workerRound(
  ctx: BenchContext,
  sql: Sql,
  url: string,
  kernel: Admission,
  tenant: string,
  workflow: string,
  args: string[],
): Promise<{ rate: number; p50: number; p99: number; cores: number }> {
  await insertTenant(sql, tenant);
  const jobs = ctx.cfg.workerJobs;
  for (let i = 0; i < jobs; i += 2000) {
    await Promise.all(
      Array.from(
        { length: Math.min(2000, jobs - i) },
        (_, j) =>
          kernel.admit({
            workflow_ref: workflow,
            input: workflow === "echo" ? { n: i + j } : { k: (i + j) % KEYS, n: i + j },
          }, { tenantId: tenant, source: "bench", entry: "http" }),
      ),
    );
  }
  const worker = new PoimenProcess("worker", {
    DATABASE_URL: url,
    WORKER_CONCURRENCY: "16",
    LOG_LEVEL: "error",
  }, args);
  const { value: seconds, cores } = await ctx.stats("worker").during(worker.pid, async () => {
    const deadline = Date.now() + 600 * SECOND;
    for (;;) {
      const [r] = await sql<{ n: number }[]>`
        select count(*)::int as n from runs where tenant_id = ${tenant} and status = 'succeeded'`;
      if (r.n >= jobs) break;
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
    select count(*)::int as n,
           count(*) filter (where attempts = 1 and status = 'succeeded')::int as once
      from runs where tenant_id = ${tenant}`;
  check(
    c.n === jobs && c.once === jobs,
    `worker ${tenant}: ${c.once} of ${c.n} runs succeeded on their first attempt`,
  );
  return { rate: jobs / seconds, p50: 0, p99: 0, cores };
}
