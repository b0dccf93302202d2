/**
 * The idle section (issue 28): one key's due runs of `bench.keyed` (at most
 * one at a time per key) drained behind 0, 1,000 and 10,000 other keys of
 * the same tenant and workflow, each holding one run due tomorrow. Each
 * scenario has a database of its own (the not-due runs stay queued); the
 * worker is started and ready before the key's runs are admitted, and the
 * figure is the key's first admission to its last finish, Postgres clock.
 * A key not drained by the deadline is reported as such, not failed: that is
 * the finding. The goal: the same time whatever waits beside it.
 */
import { createPool, type Sql } from "../db/pool.ts";
import { DAY, delay } from "../core/time.ts";
import { type BenchContext, check, log } from "./run_context.ts";
import { createDb } from "./scenario_support.ts";
import { admitAll, benchKernel, insertTenants, readyWorker } from "./queue_shape_support.ts";

const TENANT = "idle";

/** Every round of the idle section. */
export async function idleGroupsSection(ctx: BenchContext, admin: Sql) {
  const shape = ctx.cfg.shape;
  const counts = [0, ...shape.idleGroups.filter((n) => n !== 0)];
  for (let round = 1; round <= ctx.cfg.rounds; round++) {
    for (const idle of counts) {
      const name = `poimen_bench_${ctx.stamp}_idle${idle}_${round}`;
      const { url, sql } = await createDb(ctx, admin, name);
      try {
        const figure = await idleRound(ctx, sql, url, idle);
        ctx.shape.drains.push({ round, idle, ...figure });
        log(
          `idle round ${round}, ${idle} not-due groups: ${
            figure.seconds === undefined
              ? `${figure.done} of ${figure.of} after ${shape.drainDeadlineSecs} s`
              : `${figure.seconds.toFixed(2)} s`
          }`,
        );
      } finally {
        await sql.end();
        await admin.unsafe(`drop database if exists ${name} with (force)`);
      }
    }
  }
}

/** One scenario: `idle` keys due tomorrow, then the key's runs; its drain time. */
async function idleRound(ctx: BenchContext, sql: Sql, url: string, idle: number) {
  const shape = ctx.cfg.shape;
  await insertTenants(sql, [TENANT]);
  const kernelSql = createPool({ url, max: 4, applicationName: "bench-admit" });
  const kernel = benchKernel(kernelSql);
  const tomorrow = new Date(Date.now() + DAY).toISOString();
  try {
    await admitAll(kernel, idle, (i) => ({
      tenant: TENANT,
      req: { workflow_ref: "bench.keyed", input: { k: i + 1, n: i }, run_after: tomorrow },
    }));
    const worker = await readyWorker(url, "keyed_workflows.ts");
    try {
      // Key 0's runs, due now, admitted while the worker is ready and idle.
      await admitAll(kernel, shape.keyRuns, (i) => ({
        tenant: TENANT,
        req: { workflow_ref: "bench.keyed", input: { k: 0, n: i } },
      }));
      const deadline = Date.now() + shape.drainDeadlineSecs * 1000;
      let done = 0;
      while (Date.now() < deadline && !worker.exited) {
        done = await finished(sql);
        if (done >= shape.keyRuns) break;
        await delay(100);
      }
      if (worker.exited) throw new Error(`idle: worker exited:\n${worker.logs().join("\n")}`);
      done = await finished(sql);
      if (done < shape.keyRuns) return { done, of: shape.keyRuns };
    } finally {
      await worker.stop();
    }
    const [c] = await sql<{ n: number; once: number; s: number; later: number }[]>`
      select count(*)::int as n,
             count(*) filter (where attempts = 1 and status = 'succeeded')::int as once,
             extract(epoch from max(finished_at) - min(created_at))::float8 as s,
             (select count(*)::int from runs
               where tenant_id = ${TENANT} and status <> 'queued'
                 and input->>'k' <> '0') as later
        from runs where tenant_id = ${TENANT} and input->>'k' = '0'`;
    check(
      c.n === shape.keyRuns && c.once === shape.keyRuns,
      `idle ${idle}: ${c.once} of ${c.n} runs of the key succeeded on their first attempt`,
    );
    check(c.later === 0, `idle ${idle}: ${c.later} runs due tomorrow were started`);
    return { seconds: c.s, done: c.n, of: shape.keyRuns };
  } finally {
    await kernelSql.end();
  }
}

/** The key's succeeded runs. */
async function finished(sql: Sql): Promise<number> {
  const [r] = await sql<{ n: number }[]>`
    select count(*)::int as n from runs
     where tenant_id = ${TENANT} and status = 'succeeded' and input->>'k' = '0'`;
  return r.n;
}
