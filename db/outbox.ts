/**
 * The outbox relay's statements over `work_events`: claim a batch of
 * pending events, mark the shipped ones published, report the backlog, and
 * purge what was published long enough ago.
 *
 * Claiming takes row locks (`FOR UPDATE SKIP LOCKED`) that the caller holds,
 * in its transaction, while it publishes: another relay process skips them,
 * so in normal operation no row is shipped twice. See `claimPendingEvents`
 * for how per-run order survives several processes.
 */
import type { Sql, TransactionSql } from "./pool.ts";

/** One pending event, as the relay ships it. */
export interface PendingEvent {
  tenant_id: string;
  run_id: string;
  seq: number;
  /** int8: postgres.js returns it as text. */
  event_id: string;
  type: string;
  goal_id: string | null;
  dispatch_key: string | null;
  payload: unknown;
  at: Date;
}

/**
 * Locks up to `limit` pending events, oldest first, skipping rows another
 * process holds; returns those it may ship now, ordered by (tenant, run, seq).
 *
 * Per-run order with several processes: a run's locked rows are returned
 * only when they are ALL of its pending rows up to the highest seq locked —
 * i.e. nobody else holds (or has yet to ship) an earlier or interleaved seq
 * of that run. Otherwise the whole run is left out of this batch (its rows
 * stay locked until the transaction ends, so the other holder is not raced;
 * they come back in a later batch). The check runs on the statement's
 * snapshot, where a row published concurrently still looks pending: that
 * only ever leaves a run out, never lets a later seq overtake an earlier one.
 * Ordering relies on counts rather than on event_id order, so it holds for
 * events of one run inserted out of id order too.
 */
export async function claimPendingEvents(
  tx: TransactionSql,
  limit: number,
): Promise<PendingEvent[]> {
  return await tx<PendingEvent[]>`
    with locked as (
      select tenant_id, run_id, seq, event_id, type, goal_id, dispatch_key, payload, at
        from work_events
       where published_at is null
       order by event_id
       limit ${limit}
       for update skip locked
    ),
    -- A window rather than a join back to the CTE: the planner cannot
    -- estimate a CTE's rows and would nest-loop 500 x 500.
    held as (
      select l.*, max(l.seq) over run as last_seq, count(*) over run as n
        from locked l
      window run as (partition by l.tenant_id, l.run_id)
    )
    select h.tenant_id, h.run_id, h.seq, h.event_id, h.type, h.goal_id, h.dispatch_key,
           h.payload, h.at
      from held h
     where (select count(*) from work_events w
             where w.tenant_id = h.tenant_id and w.run_id = h.run_id
               and w.published_at is null and w.seq <= h.last_seq) = h.n
     order by h.tenant_id, h.run_id, h.seq`;
}

/** Sets `published_at = now()` on these events (by tenant and event id); returns how many. */
export async function markPublished(
  tx: TransactionSql,
  events: Pick<PendingEvent, "tenant_id" | "event_id">[],
): Promise<number> {
  if (events.length === 0) return 0;
  const result = await tx`
    update work_events w
       set published_at = now()
      from unnest(${events.map((e) => e.tenant_id)}::text[],
                  ${events.map((e) => e.event_id)}::bigint[]) as p(tenant_id, event_id)
     where w.tenant_id = p.tenant_id and w.event_id = p.event_id
       and w.published_at is null`;
  return result.count;
}

/** The outbox backlog: pending rows and the age of the oldest, in seconds (0 when none). */
export interface OutboxStats {
  pending: number;
  oldestAgeSeconds: number;
}

/** Counts pending events (over the partial pending index) and the age of the oldest. */
export async function outboxStats(sql: Sql): Promise<OutboxStats> {
  const [row] = await sql<{ pending: number; oldest_age: number }[]>`
    select count(*)::float8 as pending,
           coalesce(extract(epoch from now() - min(at)), 0)::float8 as oldest_age
      from work_events
     where published_at is null`;
  return { pending: row.pending, oldestAgeSeconds: Math.max(0, row.oldest_age) };
}

/**
 * Deletes up to `limit` events published more than `retentionMs` ago;
 * returns how many. Pending rows are never touched (`published_at` is null).
 * SKIP LOCKED lets several relay processes purge at once without queueing
 * behind each other.
 */
export async function purgePublished(
  sql: Sql,
  retentionMs: number,
  limit: number,
): Promise<number> {
  const result = await sql`
    with doomed as (
      select tenant_id, run_id, seq
        from work_events
       where published_at < now() - ${retentionMs}::float8 * interval '1 millisecond'
       order by published_at
       limit ${limit}
       for update skip locked
    )
    delete from work_events w
     using doomed d
     where w.tenant_id = d.tenant_id and w.run_id = d.run_id and w.seq = d.seq`;
  return result.count;
}
