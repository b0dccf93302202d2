/**
 * The statements of the concurrency slot reconciler (worker/slot_reconciler.ts):
 * walk `concurrency_slots` a few groups at a time, and set a group's
 * `running` and `queued` back to the runs they count when they drifted.
 *
 * The counts are kept by the statements that move runs (migration 011), in
 * the same statement as the runs; a bug in one of them, or an operator's
 * hand edit, would otherwise go unnoticed: a count too high holds a group
 * back for good, one too low lets it run over its limit. This is the check.
 *
 * A correction is computed under the group's row lock: `lockSlot` takes it
 * (skipping a group a claim holds: it comes round again), then, in the same
 * transaction but a later statement — so on a snapshot taken after the lock
 * was granted — `correctSlot` counts the group's runs and writes the counts
 * only if they differ. Every statement that moves a group's runs also
 * updates its row, so while the lock is held no change to its runs can
 * commit unseen: one that is still open is invisible to the count and
 * applies its own increment after ours, on the corrected row.
 */
import type { Sql, TransactionSql } from "./pool.ts";

/** A concurrency group's key: the primary key of `concurrency_slots`. */
export interface SlotGroup {
  tenant_id: string;
  workflow_name: string;
  concurrency_key: string;
}

/**
 * The next `limit` groups after `after` in primary key order (from the
 * first when `after` is undefined): one range of `concurrency_slots_pkey`.
 * Fewer than `limit` means the walk reached the end.
 */
export async function selectSlotGroups(
  sql: Sql,
  after: SlotGroup | undefined,
  limit: number,
): Promise<SlotGroup[]> {
  // A row comparison is one index condition; the start is '' for a fresh walk
  // ('' sorts first in every collation).
  const a = after ?? { tenant_id: "", workflow_name: "", concurrency_key: "" };
  const inclusive = after === undefined;
  return await sql<SlotGroup[]>`
    select tenant_id, workflow_name, concurrency_key
      from concurrency_slots
     where (tenant_id, workflow_name, concurrency_key)
           ${
    inclusive ? sql`>=` : sql`>`
  } (${a.tenant_id}, ${a.workflow_name}, ${a.concurrency_key})
     order by tenant_id, workflow_name, concurrency_key
     limit ${limit}`;
}

/** A group's counts as stored. */
export interface SlotCounts {
  running: number;
  queued: number;
}

/**
 * Locks the group's row for the rest of the transaction and returns its
 * counts; undefined when another transaction holds it (or it is gone).
 */
export async function lockSlot(
  tx: TransactionSql,
  group: SlotGroup,
): Promise<SlotCounts | undefined> {
  const [row] = await tx<SlotCounts[]>`
    select running, queued from concurrency_slots
     where tenant_id = ${group.tenant_id} and workflow_name = ${group.workflow_name}
       and concurrency_key = ${group.concurrency_key}
       for update skip locked`;
  return row;
}

/** A correction made: the counts before and after. */
export interface SlotCorrection extends SlotGroup {
  was: SlotCounts;
  now: SlotCounts;
}

/**
 * Counts the group's running and queued runs and, when they differ from its
 * row, writes them; returns the counts found. Run it after `lockSlot`, in
 * the same transaction. Queued runs are one range of `runs_queued_key_idx`
 * (a group's backlog, counted in the index); running ones are read among the
 * tenant's running runs (a range of `runs_running_tenant_idx`), as many as
 * the fleet runs at once, at most.
 */
export async function correctSlot(
  tx: TransactionSql,
  group: SlotGroup,
): Promise<{ counts: SlotCounts; corrected: boolean }> {
  const [row] = await tx<(SlotCounts & { corrected: boolean })[]>`
    with counted as (
      select
        (select count(*)::int from runs r
          where r.tenant_id collate "C" = ${group.tenant_id}
            and r.workflow_name = ${group.workflow_name}
            and r.concurrency_key = ${group.concurrency_key}
            and r.status = 'queued') as queued,
        -- A claim sets a running run's lease, and the reclaimer finds running
        -- runs by it: the running index's predicate, whatever the statistics.
        (select count(*)::int from runs r
          where r.tenant_id collate "C" = ${group.tenant_id}
            and r.status = 'running' and r.lease_expires_at is not null
            and r.workflow_name = ${group.workflow_name}
            and r.concurrency_key = ${group.concurrency_key}) as running
    ),
    fixed as (
      update concurrency_slots s
         set running = c.running, queued = c.queued
        from counted c
       where s.tenant_id = ${group.tenant_id} and s.workflow_name = ${group.workflow_name}
         and s.concurrency_key = ${group.concurrency_key}
         and (s.running, s.queued) is distinct from (c.running, c.queued)
      returning 1
    )
    select c.running, c.queued, exists (select 1 from fixed) as corrected from counted c`;
  return { counts: { running: row.running, queued: row.queued }, corrected: row.corrected };
}
