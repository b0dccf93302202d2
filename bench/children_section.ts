/**
 * Child runs in the durable section (issue 31), on one worker process
 * (concurrency 16) hosting bench/hosted/durable.ts:
 *
 * - Children admitted per second through `ctx.map`: one `bench.fanout` run
 *   of N children (10,000; 1,000 with --quick), from the parent's first
 *   start to its last child's admission (Postgres clock), the children
 *   admitted by the map's batches while the worker also runs them.
 * - Parent wake latency: parents of five children each, admitted one every
 *   50 ms; per parent, from its last child's end (the statement that wakes
 *   it) to the end of the parent (a claim, the replay of its map, its
 *   completion).
 */
import { Admission } from "../admission/admit.ts";
import { delay } from "../core/time.ts";
import { notifyChannels, QUEUE_CHANNEL } from "../db/notify.ts";
import type { Sql } from "../db/pool.ts";
import { type BenchContext, check } from "./run_context.ts";
import { quantile, readyWorker, untilOrStalled } from "./queue_shape_support.ts";

/** The children's scenarios, in report order. */
export const CHILDREN_SCENARIOS = {
  admitted: "ctx.map: children admitted per second (one parent)",
  wake: "last child's end → its parent's end",
} as const;

const MODULE = "hosted/durable.ts";
const WAKE_CHILDREN = 5;

/** One round: both figures, pushed into `ctx.figures` under `group`. */
export async function childrenRound(
  ctx: BenchContext,
  sql: Sql,
  url: string,
  kernel: Admission,
  tenant: string,
  group: string,
  round: number,
): Promise<{ perSecond: number; wake: number[] }> {
  const n = ctx.quick ? 1_000 : 10_000;
  const parents = ctx.quick ? 20 : 200;
  const stamp = `c${round}-${ctx.stamp}`;
  const worker = await readyWorker(url, MODULE);
  try {
    const admit = (tag: string, children: number) =>
      kernel.admit(
        { workflow_ref: "bench.fanout", input: { n: children, tag }, dispatch_key: tag },
        { tenantId: tenant, source: "bench", entry: "http" },
      );
    const big = (await admit(`${stamp}-big`, n)).run.run_id;
    await notifyChannels(sql, [QUEUE_CHANNEL]);
    await untilOrStalled(
      worker,
      () => succeeded(sql, tenant, [big]),
      "the fan-out parent",
      600_000,
    );
    const [span] = await sql<{ s: number; kids: number }[]>`
      select extract(epoch from max(c.created_at) - p.started_at)::float8 as s,
             count(c.*)::int as kids
        from runs p join runs c on c.tenant_id = p.tenant_id and c.parent_run_id = p.run_id
       where p.tenant_id = ${tenant} and p.run_id = ${big}
       group by p.started_at`;
    check(span.kids === n, `children: ${span.kids} of ${n} children admitted`);
    const perSecond = n / span.s;

    const ids: string[] = [];
    for (let i = 0; i < parents; i++) {
      ids.push((await admit(`${stamp}-p${i}`, WAKE_CHILDREN)).run.run_id);
      await notifyChannels(sql, [QUEUE_CHANNEL]);
      await delay(50);
    }
    await untilOrStalled(worker, () => succeeded(sql, tenant, ids), "the small parents", 600_000);
    const wake = (await sql<{ ms: number }[]>`
      select extract(epoch from p.finished_at - max(c.finished_at))::float8 * 1000 as ms
        from runs p join runs c on c.tenant_id = p.tenant_id and c.parent_run_id = p.run_id
       where p.tenant_id = ${tenant} and p.run_id = any(${ids}::uuid[])
       group by p.run_id, p.finished_at`).map((r) => r.ms);
    check(wake.length === parents, `children: ${wake.length} of ${parents} parents woken`);
    const p = [quantile(wake, 0.5), quantile(wake, 0.99)];
    ctx.figures.push({
      group,
      scenario: CHILDREN_SCENARIOS.admitted,
      conns: 16,
      round,
      rate: perSecond,
      p50: 0,
      p99: 0,
    });
    ctx.figures.push({
      group,
      scenario: CHILDREN_SCENARIOS.wake,
      conns: 16,
      round,
      rate: 0,
      p50: p[0],
      p99: p[1],
    });
    return { perSecond, wake: p };
  } finally {
    await worker.stop();
  }
}

async function succeeded(sql: Sql, tenant: string, ids: string[]): Promise<boolean> {
  const [r] = await sql<{ n: number }[]>`
    select count(*)::int as n from runs
     where tenant_id = ${tenant} and run_id = any(${ids}::uuid[]) and status = 'succeeded'`;
  return r.n === ids.length;
}
