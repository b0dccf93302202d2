/**
 * Per-tenant quotas (migration 012): the most queued runs a tenant may have
 * and the rate it may admit at, null meaning unlimited. Written by
 * `deno task tenant`, read by the API's quota gate (admission/quota.ts).
 */
import type { Sql } from "./pool.ts";

/** A tenant's quotas; null: unlimited. */
export interface TenantQuota {
  tenant_id: string;
  /** Most queued runs (due or not). */
  max_queued: number | null;
  /** Runs admitted per second. */
  admission_rate: number | null;
}

/** What `setTenantQuota` changes: an absent field is left as it is, null removes the limit. */
export interface QuotaChange {
  max_queued?: number | null;
  admission_rate?: number | null;
}

/**
 * Sets the tenant's quotas, creating the tenant when it does not exist (as
 * `deno task token` does); returns them as they now are. One statement, so
 * two operators changing different quotas at once both keep their change.
 */
export async function setTenantQuota(
  sql: Sql,
  tenantId: string,
  change: QuotaChange,
): Promise<TenantQuota> {
  const setQueued = change.max_queued !== undefined;
  const setRate = change.admission_rate !== undefined;
  const [row] = await sql<TenantQuota[]>`
    insert into tenants (tenant_id, max_queued, admission_rate)
    values (${tenantId}, ${change.max_queued ?? null}, ${change.admission_rate ?? null})
    on conflict (tenant_id) do update set
      max_queued = case when ${setQueued} then excluded.max_queued else tenants.max_queued end,
      admission_rate = case when ${setRate} then excluded.admission_rate
                            else tenants.admission_rate end
    returning tenant_id, max_queued, admission_rate`;
  return row;
}

/** The tenant's quotas, or undefined when there is no such tenant. */
export async function selectTenantQuota(
  sql: Sql,
  tenantId: string,
): Promise<TenantQuota | undefined> {
  const [row] = await sql<TenantQuota[]>`
    select tenant_id, max_queued, admission_rate from tenants where tenant_id = ${tenantId}`;
  return row;
}

/**
 * Every tenant with at least one quota: what the API's gate caches. A small
 * table (one row per tenant), read whole every QUOTA_REFRESH_MS.
 */
export async function selectTenantQuotas(sql: Sql): Promise<TenantQuota[]> {
  return await sql<TenantQuota[]>`
    select tenant_id, max_queued, admission_rate from tenants
     where max_queued is not null or admission_rate is not null`;
}

/**
 * The tenant's queued work, counted up to `cap` (the gate asks for its
 * max_queued plus one: beyond that, "full" is all it needs to know): its
 * queued runs and its waiting ones (suspended sleeps and signal waits,
 * migration 021), so a tenant cannot park runs past its quota. The tenant
 * compared in collation "C" and the status make each one range of a partial
 * index, runs_queued_workflow_idx and runs_waiting_tenant_idx (migrations
 * 003, 008 and 022: no other index can serve that clause), stopped after
 * `cap` entries in all, so its cost is bounded by the cap, not by the queue.
 */
export async function countQueuedRuns(sql: Sql, tenantId: string, cap: number): Promise<number> {
  const [row] = await sql<{ n: number }[]>`
    with queued as (
      select count(*)::int as n
        from (select 1 from runs
               where tenant_id collate "C" = ${tenantId} and status = 'queued'
               limit ${cap}) q
    )
    select q.n + (select count(*)::int
                    from (select 1 from runs
                           where tenant_id collate "C" = ${tenantId} and status = 'waiting'
                           limit greatest(${cap} - q.n, 0)) w) as n
      from queued q`;
  return row.n;
}
