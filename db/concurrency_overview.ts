/**
 * Runs held back by a concurrency limit (migration 011), for operators: per
 * tenant for the console, per tenant and workflow for metrics. Every number
 * comes from `concurrency_slots`, whose counts are exact (each statement
 * that moves a limited run moves them) — never from counting runs: a group
 * at its limit may hold a backlog of millions. That table has one row per
 * concurrency group (tenant, workflow, key) that ever had a run: its size
 * follows the number of groups, not the number of runs.
 */
import type { Sql } from "./pool.ts";
import { COUNT_CAP } from "./queue_overview.ts";

/** `COUNT_CAP` as SQL text. */
const CAP = String(COUNT_CAP);

/** How many of a tenant's waiting groups the console lists. */
export const WAITING_GROUPS_SHOWN = 20;

/** A concurrency group at its limit with runs waiting. */
export interface WaitingGroup {
  /** The workflow's name (a limit is per workflow, whatever the version). */
  workflow: string;
  /** The group's key: the input's value at the version's key pointer; '' without a key. */
  key: string;
  /** The group's limit, as the newest admitted run's version declared it. */
  limit: number;
  /** Its runs running now (at least `limit`: a lowered limit leaves more running). */
  running: number;
  /** Its queued runs, due or not, waiting for one of them to end. */
  queued: number;
}

/**
 * The tenant's groups at their limit (running >= max_running) with queued
 * runs, most queued first, at most `limit`: one range of
 * concurrency_slots_waiting_idx (migration 013), read in its order and
 * stopped at `limit`, however many groups the tenant has. The tenant is
 * compared in collation "C", as that index keys it: the primary key cannot
 * serve the clause, so the tenant's idle groups are never walked.
 */
export async function selectTenantWaitingGroups(
  sql: Sql,
  tenantId: string,
  limit = WAITING_GROUPS_SHOWN,
): Promise<WaitingGroup[]> {
  return await sql<WaitingGroup[]>`
    select workflow_name as workflow, concurrency_key as key, max_running as limit,
           running, queued
      from concurrency_slots
     where tenant_id collate "C" = ${tenantId} and queued > 0 and running >= max_running
     order by tenant_id collate "C", queued desc, workflow_name, concurrency_key
     limit ${limit}`;
}

/** A tenant's totals of runs held back by concurrency limits. */
export interface WaitingTotals {
  /** Groups at their limit with queued runs (at most `COUNT_CAP`). */
  groups: number;
  /** Queued runs of those groups (at most `COUNT_CAP`). */
  runs: number;
}

/**
 * How many of the tenant's groups are at their limit with queued runs, and
 * their queued runs: the same range of concurrency_slots_waiting_idx,
 * stopped at `COUNT_CAP` groups. Each such group has a queued run, so when
 * the groups reach the cap the runs do too, and both read "100000+".
 */
export async function selectTenantWaitingTotals(
  sql: Sql,
  tenantId: string,
): Promise<WaitingTotals> {
  // The cap is in the text, not a parameter: a generic plan guesses that a
  // LIMIT $n keeps a tenth of the rows, and a sequential scan that stops
  // early then looks cheaper than the index.
  const [r] = await sql<WaitingTotals[]>`
    select count(*)::int as groups, least(coalesce(sum(queued), 0), ${sql.unsafe(CAP)})::int as runs
      from (select queued from concurrency_slots
             where tenant_id collate "C" = ${tenantId} and queued > 0
               and running >= max_running
             limit ${sql.unsafe(CAP)}) g`;
  return r;
}

/** One tenant's limited workflow, for metrics. */
export interface LimitedWorkflowStats {
  tenant: string;
  workflow: string;
  /** Queued runs (due or not) of its groups at their limit. */
  waiting: number;
  /** Running runs of its groups. */
  running: number;
}

/**
 * Per tenant and limited workflow, the queued runs of its groups at their
 * limit and its running runs, for a scrape: one aggregate over all of
 * `concurrency_slots` (a sequential scan, read once per scrape). That is
 * one row per group that ever had a run, not per run, and never `runs`;
 * workflows with nothing running or waiting are absent.
 */
export async function selectLimitedWorkflowStats(sql: Sql): Promise<LimitedWorkflowStats[]> {
  return await sql<LimitedWorkflowStats[]>`
    select tenant_id as tenant, workflow_name as workflow,
           coalesce(sum(queued) filter (where running >= max_running), 0)::int as waiting,
           sum(running)::int as running
      from concurrency_slots
     where running > 0 or queued > 0
     group by tenant_id, workflow_name
    having sum(running) > 0 or sum(queued) filter (where running >= max_running) > 0
     order by tenant_id, workflow_name`;
}
