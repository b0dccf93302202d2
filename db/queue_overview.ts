/**
 * One tenant's queue at a glance, for the console: how many runs wait and
 * run, how long the oldest due run has waited, and admissions per minute.
 * Each statement is written so that only a bounded index range can serve it
 * (the console is polled while the queue is at its busiest):
 *
 * - counts are capped (`COUNT_CAP`), so a backlog of millions costs a
 *   bounded scan; the console shows "100000+";
 * - the tenant is compared in collation "C", as the queue index keys it
 *   (migration 003): the primary key cannot serve those clauses, so a
 *   tenant's queued runs are never found by walking all its runs;
 * - the oldest due run is the oldest of each catalog version's head (one
 *   probe per version: the queue index is keyed by version, migration 008);
 * - running runs are read through the lease index (every running run holds
 *   a lease), which is as small as the workers' concurrency;
 * - admissions per minute walk the primary key from the first UUIDv7 run id
 *   of the window: run ids are admission-time ordered;
 * - the versions the tenant's queued runs wait on with no live worker are
 *   counted per catalog version not hosted, one capped range each.
 */
import type { Sql } from "./pool.ts";
import { UNHOSTED_VERSIONS } from "./catalog.ts";

/** Counts stop here: beyond it, "at least this many" is what matters. */
export const COUNT_CAP = 100_000;

export interface TenantQueue {
  /** Queued runs, due or not (at most `COUNT_CAP`). */
  queued: number;
  /** Queued runs whose run_after has come (at most `COUNT_CAP`). */
  due: number;
  /** Running runs. */
  running: number;
  /** Seconds the oldest due queued run has waited since it became due; 0 when none. */
  oldestDueSeconds: number;
}

/** The tenant's queued, due and running counts and its oldest due run's wait. */
export async function selectTenantQueue(sql: Sql, tenantId: string): Promise<TenantQueue> {
  const [r] = await sql<
    { queued: number; due: number; running: number; oldest: number | null }[]
  >`
    select
      (select count(*) from (select 1 from runs
        where tenant_id collate "C" = ${tenantId}
          and status = 'queued'
        limit ${COUNT_CAP}) q)::int as queued,
      (select count(*) from (select 1 from runs
        where tenant_id collate "C" = ${tenantId}
          and status = 'queued' and run_after <= now()
        limit ${COUNT_CAP}) d)::int as due,
      (select count(*) from runs
        where tenant_id collate "C" = ${tenantId}
          and status = 'running' and lease_expires_at is not null)::int as running,
      (select extract(epoch from now() - min(h.run_after))
         from workflow_versions v
        cross join lateral (
              select r.run_after from runs r
               where r.tenant_id collate "C" = ${tenantId} and r.status = 'queued'
                 and r.workflow_name = v.name and r.workflow_version = v.version
                 and r.run_after <= now()
               order by r.run_after limit 1) h)::float8 as oldest`;
  return {
    queued: r.queued,
    due: r.due,
    running: r.running,
    oldestDueSeconds: Math.max(0, r.oldest ?? 0),
  };
}

/** One workflow version the tenant's queued runs wait on, which no live worker hosts. */
export interface WaitingVersion {
  /** `name@version`. */
  workflow: string;
  /** The tenant's queued runs of it (at most `COUNT_CAP`). */
  runs: number;
}

/**
 * The catalog's versions that no live worker hosts and of which the tenant
 * has queued runs, with how many (capped), by workflow. The catalog and the
 * live workers are small; each unhosted version is one range of the queue
 * index (tenant in collation "C", name, version), stopped at `COUNT_CAP`.
 */
export async function selectTenantWaitingVersions(
  sql: Sql,
  tenantId: string,
): Promise<WaitingVersion[]> {
  return await sql<WaitingVersion[]>`
    with ${sql.unsafe(UNHOSTED_VERSIONS)}
    select u.workflow, q.runs
      from unhosted u
     cross join lateral (
           select count(*)::int as runs
             from (select 1 from runs r
                    where r.tenant_id collate "C" = ${tenantId} and r.status = 'queued'
                      and r.workflow_name = u.name and r.workflow_version = u.version
                    limit ${COUNT_CAP}) l) q
     where q.runs > 0
     order by u.name, u.version`;
}

/** Runs admitted in one minute. */
export interface MinuteCount {
  minute: Date;
  runs: number;
}

/**
 * The tenant's admissions per minute since `since` (minutes with none are
 * absent). `firstRunId` is the smallest UUIDv7 of `since`'s millisecond
 * (`uuidv7Floor`), which bounds the primary-key range.
 */
export async function selectAdmissionsPerMinute(
  sql: Sql,
  tenantId: string,
  since: Date,
  firstRunId: string,
): Promise<MinuteCount[]> {
  return await sql<MinuteCount[]>`
    select date_trunc('minute', created_at) as minute, count(*)::int as runs
      from runs
     where tenant_id = ${tenantId} and run_id >= ${firstRunId} and created_at >= ${since}
     group by 1
     order by 1`;
}
