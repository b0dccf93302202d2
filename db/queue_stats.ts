/**
 * The queue's size, the age of its oldest due run, the queued runs no live
 * worker can take and the runs of limited workflows, for the workers'
 * metrics (per tenant, for the console: db/queue_overview.ts and
 * db/concurrency_overview.ts).
 */
import type { Sql } from "./pool.ts";
import { selectUnhostedQueues, type UnhostedQueue } from "./catalog.ts";
import { COUNT_CAP } from "./queue_overview.ts";
import { type LimitedWorkflowStats, selectLimitedWorkflowStats } from "./concurrency_overview.ts";
import { CATALOG_VERSIONS, QUEUED_TENANTS, tenantScan } from "./queue_sql.ts";

// The tenants with waiting runs: a loose scan of runs_waiting_tenant_idx.
const WAITING_TENANT_SCAN = tenantScan("waiting_tenants", "runs", "status = 'waiting'");

/**
 * Most queued (and most running) runs a scrape counts: beyond it the gauge
 * says "at least this many" (`capped`), so a scrape reads at most this many
 * index entries however long the queue is.
 */
export const QUEUE_GAUGE_CAP = 100_000;

/** The queue at a glance, for metrics. */
export interface QueueStats {
  /**
   * Runs queued, being executed and waiting (suspended: a long sleep or a
   * signal wait), all tenants, each at most the cap.
   */
  byStatus: { queued: number; running: number; waiting: number };
  /** Whether a count reached the cap: there are at least that many, maybe more. */
  capped: { queued: boolean; running: boolean; waiting: boolean };
  /** The waiting runs by what they wait for (each at most the cap). */
  waitingByReason: { sleep: number; signal: number; children: number };
  /** Seconds since the oldest due queued run became due; 0 when none is due. */
  oldestQueuedAgeSeconds: number;
  /**
   * Per version no live worker hosts, its queued runs (at most `COUNT_CAP`);
   * versions without queued runs are absent.
   */
  waitingForWorker: UnhostedQueue[];
  /**
   * Per tenant and workflow with a concurrency limit, its runs waiting on a
   * full group and its runs running; workflows with neither are absent.
   */
  limited: LimitedWorkflowStats[];
}

/**
 * Counts queued and running runs, each up to `cap`, and measures the age of
 * the oldest due queued run. Each reads a partial index, so the cost follows
 * the live queue, not the table, and stops at `cap` entries: finished runs
 * pile up by the million and are counted by the workers' completion
 * counters instead. A run is running exactly while it holds a lease (a
 * check constraint says so); the oldest due run is the oldest of the
 * tenants' heads, one probe per tenant with queued runs.
 */
export async function queueCounts(sql: Sql, cap = QUEUE_GAUGE_CAP): Promise<
  Omit<QueueStats, "waitingForWorker" | "limited">
> {
  const [r] = await sql<
    {
      queued: number;
      running: number;
      sleep: number;
      signal: number;
      children: number;
      oldest: number | null;
    }[]
  >`
    with recursive ${sql.unsafe(CATALOG_VERSIONS)}, ${sql.unsafe(QUEUED_TENANTS)},
    ${sql.unsafe(WAITING_TENANT_SCAN)},
    -- Waiting runs, up to the cap in all, per tenant of the loose scan as the
    -- queued ones are (so no sequential scan can serve it, whatever the
    -- statistics); runs_waiting_tenant_idx holds the reason (migration 022),
    -- so the count by reason reads the index alone.
    waiting as (
      select count(*) filter (where w.wait_reason = 'sleep')::int as sleep,
             count(*) filter (where w.wait_reason = 'signal')::int as signal,
             count(*) filter (where w.wait_reason = 'children')::int as children
        from (select r.wait_reason from waiting_tenants t
               cross join lateral (select r.wait_reason from runs r
                                    where r.tenant_id collate "C" = t.tenant_id
                                      and r.status = 'waiting'
                                    limit ${cap}) r
               where t.tenant_id is not null
               limit ${cap}) w
    )
    -- Counted per tenant of the loose scan, up to the cap in all (the scan
    -- stops there): each count is a range of the queued index, naming its
    -- tenant in collation "C" so no other index or a sequential scan can
    -- serve it, whatever the statistics.
    select (select count(*) from (
              select 1 from queued_tenants t
               cross join lateral (select 1 from runs r
                                    where r.tenant_id collate "C" = t.tenant_id
                                      and r.status = 'queued'
                                    limit ${cap}) q
               where t.tenant_id is not null
               limit ${cap}) c)::int as queued,
           (select count(*) from (
              select 1 from runs
               where status = 'running' and lease_expires_at is not null
               limit ${cap}) c)::int as running,
           (select sleep from waiting) as sleep,
           (select signal from waiting) as signal,
           (select children from waiting) as children,
           (select extract(epoch from now() - min(run_after)) from heads)::float8 as oldest`;
  const waiting = Math.min(cap, r.sleep + r.signal + r.children);
  return {
    byStatus: { queued: r.queued, running: r.running, waiting },
    capped: { queued: r.queued >= cap, running: r.running >= cap, waiting: waiting >= cap },
    waitingByReason: { sleep: r.sleep, signal: r.signal, children: r.children },
    oldestQueuedAgeSeconds: Math.max(0, r.oldest ?? 0),
  };
}

/**
 * `queueCounts`, the unhosted versions' queued runs (`selectUnhostedQueues`)
 * and the limited workflows' counts (`selectLimitedWorkflowStats`), all at
 * once: what one scrape reads.
 */
export async function queueStats(sql: Sql, cap = QUEUE_GAUGE_CAP): Promise<QueueStats> {
  const [counts, waitingForWorker, limited] = await Promise.all([
    queueCounts(sql, cap),
    selectUnhostedQueues(sql, COUNT_CAP),
    selectLimitedWorkflowStats(sql),
  ]);
  return { ...counts, waitingForWorker, limited };
}
