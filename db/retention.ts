/**
 * Retention's statements, which the outbox process's `RunPurger`
 * (retention/run_purger.ts) runs in small batches, each one statement (one
 * short transaction): finished runs past their retention, with their events
 * (never a queued or running run), and idle concurrency groups.
 */
import type { Sql } from "./pool.ts";

/** What one purge statement deleted. */
export interface PurgeResult {
  runs: number;
  events: number;
}

// The purge statement ($1: retention in ms, $2: batch size). Sent
// unprepared (see `purgeFinishedRuns`).
const PURGE_FINISHED_RUNS = `
  with doomed as (
    select r.ctid as row_ctid, r.tenant_id, r.run_id
      from runs r
     where r.status in ('succeeded', 'failed', 'cancelled')
       and r.finished_at < now() - $1::float8 * interval '1 millisecond'
       and (select 1 from work_events e
             where e.tenant_id = r.tenant_id and e.run_id = r.run_id
               and coalesce(e.published_at, e.parked_at) is null
             limit 1) is null
       -- A child run (migration 024) stays while its root does: a tree is
       -- purged root first, its children in the batches after (one probe
       -- of the primary key per child).
       and (r.root_run_id is null
            or (select 1 from runs p
                 where p.tenant_id = r.tenant_id and p.run_id = r.root_run_id
                 limit 1) is null)
     order by r.finished_at
     limit $2::int
     for update of r skip locked
  ),
  events as (
    delete from work_events
     where ctid = any (array(
             select e.ctid from doomed d
              cross join lateral (
                    select w.ctid from work_events w
                     where w.tenant_id = d.tenant_id and w.run_id = d.run_id) e))
    returning 1
  ),
  -- The run's durable calls and signals (migration 021) go with it. Each
  -- run's rows are a correlated subquery, one probe of the primary key per
  -- run: a lateral join would be flattened, and then hashed over a scan of
  -- the table when it looks small.
  steps as (
    delete from run_steps
     where ctid = any (array(
             select unnest(array(select w.ctid from run_steps w
                                  where w.tenant_id = d.tenant_id and w.run_id = d.run_id))
               from doomed d))
  ),
  signals as (
    delete from run_signals
     where ctid = any (array(
             select unnest(array(select w.ctid from run_signals w
                                  where w.tenant_id = d.tenant_id and w.run_id = d.run_id))
               from doomed d))
  ),
  -- The dispatch keys of the requests that joined it (migration 032).
  joins as (
    delete from debounce_joins
     where ctid = any (array(
             select unnest(array(select w.ctid from debounce_joins w
                                  where w.tenant_id = d.tenant_id and w.run_id = d.run_id))
               from doomed d))
  ),
  gone as (
    delete from runs where ctid = any (array(select row_ctid from doomed))
    returning 1
  )
  select (select count(*) from gone)::int as runs, (select count(*) from events)::int as events`;

/**
 * Deletes up to `limit` runs that finished (`succeeded`, `failed`,
 * `cancelled`) more than `retentionMs` ago, oldest first, with all their
 * `work_events`, `run_steps`, `run_signals` and `debounce_joins`. A run with an event still to ship (unpublished and not
 * parked) is kept until the outbox shipped it: an event is never dropped
 * unpublished. A child run is kept while its root run exists (whatever its
 * own age): the root goes first, once past its own retention, and its
 * finished descendants in the next batches, so no tree is left with a root
 * and no children shown, nor children of a purged root kept for long. A
 * root waiting long on many finished children makes each batch read past
 * them in `runs_finished_idx`: a bounded cost of maintenance, off every
 * run's path. Parked events go with their run (an operator had the whole
 * retention to un-park them). Rows another purger holds are skipped (`FOR
 * UPDATE SKIP LOCKED`), so purgers never queue behind each other, and no
 * lock is taken on a queued or running run.
 *
 * The candidates come from one range of `runs_finished_idx` (no other index
 * holds finished runs in finish order); each one's pending events are probed
 * by the primary key of `work_events` (the pending test is written as
 * `coalesce(…) is null`, which the pending index's predicate cannot match,
 * so that index, led by the event id, is never picked for a per-run probe);
 * and both deletes find their rows by `ctid`, stable because the candidates
 * are locked by this statement and a finished run's events change no more.
 *
 * Sent unprepared, so planned afresh on every call: a TID scan costs more
 * than a sequential scan of a table of a few pages, and a prepared
 * statement would keep the plan it got on a young table (sequential scans
 * of both) as the tables grew. Planning a maintenance statement once a
 * batch costs nothing worth saving.
 */
export async function purgeFinishedRuns(
  sql: Sql,
  retentionMs: number,
  limit: number,
): Promise<PurgeResult> {
  const [row] = await sql.unsafe<PurgeResult[]>(PURGE_FINISHED_RUNS, [retentionMs, limit], {
    prepare: false,
  });
  return row;
}

/**
 * Deletes up to `limit` concurrency groups (migration 011) that have nothing
 * queued or running and that no claim looked at for `idleMs` (`served_at`;
 * a group no claim ever looked at, its runs all cancelled while queued, at
 * once), so `concurrency_slots` holds the keys in use, not every key ever
 * seen. Safe against the statements that move the counts: a group is
 * deleted only while its locked row still says idle (a run admitted
 * meanwhile makes it busy, and the delete skips it), and an admission after
 * the delete makes the group again from its first run. Rows others hold are
 * skipped. No index serves it: a scan of the table that stops at `limit`
 * idle groups, a maintenance statement off every run's path.
 */
export async function purgeIdleConcurrencyGroups(
  sql: Sql,
  idleMs: number,
  limit: number,
): Promise<number> {
  const [row] = await sql<{ n: number }[]>`
    with idle as (
      select tenant_id, workflow_name, concurrency_key from concurrency_slots
       where queued = 0 and running = 0
         and served_at < now() - ${idleMs}::float8 * interval '1 millisecond'
       limit ${limit}
         for update skip locked
    ),
    gone as (
      delete from concurrency_slots s
       using idle i
       where s.tenant_id = i.tenant_id and s.workflow_name = i.workflow_name
         and s.concurrency_key = i.concurrency_key
         and s.queued = 0 and s.running = 0
      returning 1
    )
    select count(*)::int as n from gone`;
  return row.n;
}
