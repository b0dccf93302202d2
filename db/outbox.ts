/**
 * The outbox publisher's statements over `work_events`: claim a batch of
 * pending events, mark the shipped ones published, report the backlog, and
 * purge what was published long enough ago.
 *
 * Claiming takes row locks (`FOR UPDATE SKIP LOCKED`) that the caller holds,
 * in its transaction, while it publishes: another publisher process skips them,
 * so in normal operation no row is shipped twice. See `claimPendingEvents`
 * for how per-run order survives several processes.
 */
import type { Sql, TransactionSql } from "./pool.ts";

/** One pending event, as the publisher ships it. */
export interface PendingEvent {
  tenant_id: string;
  run_id: string;
  seq: number;
  /** int8: postgres.js returns it as text. */
  event_id: string;
  type: string;
  goal_id: string | null;
  dispatch_key: string | null;
  /**
   * The payload as JSON text, as Postgres prints jsonb: shipped as it is,
   * never parsed, so a batch of large run results costs their size and not
   * the tens of times more their parsed objects would take.
   */
  payload: string;
  at: Date;
  /** The run's W3C trace, sent as the event's `traceparent` header; null without one. */
  traceparent?: string | null;
}

/** A claimed event; `parked_seq` is set when an earlier event of its run is parked. */
export interface ClaimedEvent extends PendingEvent {
  /**
   * The lowest parked seq of this event's run below this batch's highest
   * seq of the run, or null. An event after it must not be shipped (it would
   * overtake the parked one): the publisher parks it too.
   */
  parked_seq: number | null;
  /** The batch was full (by rows or by bytes): more may be pending. */
  more: boolean;
}

/**
 * Locks up to `limit` pending (unpublished, not parked) events, oldest
 * first, skipping rows another process holds; returns those it may handle
 * now, ordered by (tenant, run, seq), of at most about `maxBytes` of
 * payload: the oldest event always, then no more than keeps the sum under
 * it (the rest stay locked by this transaction and come back next batch).
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
 * events of one run inserted out of id order too. Parked rows do not count
 * as pending; instead each row reports its run's parked seq, if any.
 */
export async function claimPendingEvents(
  tx: TransactionSql,
  limit: number,
  maxBytes: number,
): Promise<ClaimedEvent[]> {
  return await tx<ClaimedEvent[]>`
    with locked as (
      select tenant_id, run_id, seq, event_id, type, goal_id, dispatch_key,
             payload::text as payload, at
        from work_events
       where published_at is null and parked_at is null
       order by event_id
       limit ${limit}
       for update skip locked
    ),
    -- The bytes bound: payload bytes before each row, in claim order.
    sized as (
      select l.*,
             coalesce(sum(octet_length(l.payload)) over (order by l.event_id
                        rows between unbounded preceding and 1 preceding), 0) as before,
             count(*) over () as locked_n
        from locked l
    ),
    kept as (
      select * from sized s where s.before = 0 or s.before + octet_length(s.payload) <= ${maxBytes}
    ),
    -- A window rather than a join back to the CTE: the planner cannot
    -- estimate a CTE's rows and would nest-loop 500 x 500.
    held as (
      select k.*, max(k.seq) over run as last_seq, count(*) over run as n,
             count(*) over () as kept_n
        from kept k
      window run as (partition by k.tenant_id, k.run_id)
    )
    select h.tenant_id, h.run_id, h.seq, h.event_id, h.type, h.goal_id, h.dispatch_key,
           h.payload, h.at, c.parked_seq, (h.locked_n >= ${limit} or h.kept_n < h.locked_n) as more,
           (select r.traceparent from runs r
             where r.tenant_id = h.tenant_id and r.run_id = h.run_id) as traceparent
      from held h
     -- Unpublished as a FILTER, not a WHERE: a WHERE would imply the pending
     -- index's predicate, and the planner could scan that whole index for
     -- each row instead of probing the primary key.
     cross join lateral (
       select count(*) filter (where w.published_at is null and w.parked_at is null) as pending,
              min(w.seq) filter (where w.published_at is null and w.parked_at is not null)
                as parked_seq
         from work_events w
        where w.tenant_id = h.tenant_id and w.run_id = h.run_id and w.seq <= h.last_seq) c
     where c.pending = h.n
     order by h.tenant_id, h.run_id, h.seq`;
}

/**
 * The batch's ids and tenants again, as arrays the pending index's scan can
 * take as its conditions: the batch's rows are probed (however many events
 * are pending, whatever the statistics, never a hash join over the whole
 * index), and the scan names its tenants, so with work_events partitioned
 * by tenant it reads only theirs. The join to the batch keeps each pair exact.
 */
function BATCH_PROBE(tx: TransactionSql, tenants: string[], ids: string[]) {
  return tx`and w.event_id = any(${ids}::bigint[]) and w.tenant_id = any(${tenants}::text[])`;
}

/** Sets `published_at = now()` on these events (by tenant and event id); returns how many. */
export async function markPublished(
  tx: TransactionSql,
  events: Pick<PendingEvent, "tenant_id" | "event_id">[],
): Promise<number> {
  if (events.length === 0) return 0;
  const tenants = events.map((e) => e.tenant_id);
  const ids = events.map((e) => e.event_id);
  const result = await tx`
    update work_events w
       set published_at = now()
      from unnest(${tenants}::text[], ${ids}::bigint[]) as p(tenant_id, event_id)
     where w.tenant_id = p.tenant_id and w.event_id = p.event_id
       ${BATCH_PROBE(tx, tenants, ids)}
       and w.published_at is null and w.parked_at is null`;
  return result.count;
}

/** One event to park and why. */
export interface ParkedEvent {
  tenant_id: string;
  event_id: string;
  reason: string;
}

/**
 * Parks these events (by tenant and event id): sets `parked_at = now()` and
 * `parked_reason`, which takes them out of the pending index for good (until
 * an operator clears `parked_at`). Returns how many were parked.
 */
export async function parkEvents(tx: TransactionSql, events: ParkedEvent[]): Promise<number> {
  if (events.length === 0) return 0;
  const tenants = events.map((e) => e.tenant_id);
  const ids = events.map((e) => e.event_id);
  const result = await tx`
    update work_events w
       set parked_at = now(), parked_reason = p.reason
      from unnest(${tenants}::text[], ${ids}::bigint[],
                  ${events.map((e) => e.reason)}::text[]) as p(tenant_id, event_id, reason)
     where w.tenant_id = p.tenant_id and w.event_id = p.event_id
       ${BATCH_PROBE(tx, tenants, ids)}
       and w.published_at is null and w.parked_at is null`;
  return result.count;
}

/**
 * The outbox backlog: pending rows (not parked), the age of the oldest, in
 * seconds (0 when none), and parked rows.
 */
export interface OutboxStats {
  pending: number;
  oldestAgeSeconds: number;
  parked: number;
}

/** Counts pending events and parked ones (each over its partial index) and the oldest's age. */
export async function outboxStats(sql: Sql): Promise<OutboxStats> {
  const [row] = await sql<{ pending: number; oldest_age: number; parked: number }[]>`
    select p.pending, p.oldest_age,
           (select count(*)::float8 from work_events
             where published_at is null and parked_at is not null) as parked
      from (select count(*)::float8 as pending,
                   coalesce(extract(epoch from now() - min(at)), 0)::float8 as oldest_age
              from work_events
             where published_at is null and parked_at is null) p`;
  return {
    pending: row.pending,
    oldestAgeSeconds: Math.max(0, row.oldest_age),
    parked: row.parked,
  };
}

/**
 * Deletes the oldest `limit` or so events published more than `retentionMs`
 * ago (more when several share the last one's `published_at`); returns how
 * many. Pending rows are never touched (`published_at` is null).
 *
 * One range of `work_events_published_idx`, from the oldest published event
 * to the `limit`-th oldest one due for purging, rather than a join of the
 * chosen rows back to the table: the planner may hash such a join over a
 * sequential scan when the table looks small, and a prepared statement keeps
 * that plan as the table grows. Bounded on both sides by values it cannot
 * know, the range is estimated small with or without statistics. Several
 * purgers at once only wait for each other's rows, then find them gone.
 */
export async function purgePublished(
  sql: Sql,
  retentionMs: number,
  limit: number,
): Promise<number> {
  const result = await sql`
    delete from work_events
     where published_at >= (select min(published_at) from work_events)
       and published_at <= (
             select max(published_at) from (
               select published_at from work_events
                where published_at < now() - ${retentionMs}::float8 * interval '1 millisecond'
                order by published_at
                -- A subquery, so no plan depends on the batch size: given
                -- 500 on a small table, the planner sorted a sequential scan.
                limit (select ${limit}::int)) oldest)`;
  return result.count;
}
