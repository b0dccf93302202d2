/**
 * The outbox publisher's statements over `work_events`: claim a batch of
 * pending events, mark the shipped ones published, report the backlog, and
 * purge what was published long enough ago; and the advisory locks by which
 * several publisher processes split the work.
 *
 * No statement here is held open across a Kafka send: a claim is one
 * autocommit statement, and so is each mark. What keeps two publisher
 * processes from shipping one run at once is the shard lock: every run
 * belongs to one of `OUTBOX_SHARDS` shards (a hash of tenant and run), and a
 * process claims only the runs of the shards whose session-level advisory
 * lock it holds, on a connection of its own (`ShardLocks`,
 * outbox/shard_locks.ts). A session lock, unlike an open transaction or its
 * row locks, holds back no vacuum: it pins no snapshot and writes no xid.
 */
import type { Sql, TransactionSql } from "./pool.ts";

/** A statement's target: the pool, a reserved connection or a transaction. */
type Db = Sql | TransactionSql;

/**
 * How many shards the runs' events are split into among publisher
 * processes; a power of two (the shard is a hash masked by it).
 */
export const OUTBOX_SHARDS = 32;

/**
 * The first key of every outbox advisory lock (`pg_advisory_lock(int4, int4)`),
 * "poob": the second is the shard, or `PUBLISHERS_KEY` for the lock every
 * publisher holds shared while it runs, which is how they count each other.
 * Two-int keys are apart from the migrator's one-bigint key.
 */
const OUTBOX_LOCK_CLASS = 0x706f6f62;
const PUBLISHERS_KEY = OUTBOX_SHARDS;

/** The shards a claim may take, and the session that must be holding their locks. */
export interface ShardScope {
  shards: number[];
  /** `pg_backend_pid()` of the session holding the shards' locks. */
  pid: number;
}

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
 * Reads up to `limit` pending (unpublished, not parked) events of the runs
 * of `scope`'s shards, oldest first, and returns those it may ship now,
 * ordered by (tenant, run, seq), of at most about `maxBytes` of payload: the
 * oldest event always, then no more than keeps the sum under it (the rest
 * come back next batch). It takes no lock and leaves no transaction open:
 * run it on the session holding the shards' locks (`scope.pid`; on any other
 * session, one that reconnected and lost them, it returns nothing).
 *
 * Per-run order: a run's rows are returned only when they are ALL of its
 * pending rows up to the highest seq read — so a batch cut by `limit` or by
 * bytes never ships a later seq of a run without the earlier ones. The check
 * runs on the statement's snapshot, where a row published concurrently
 * still looks pending: that only ever leaves a run out, never lets a later
 * seq overtake an earlier one. It relies on counts rather than on event_id
 * order, so it holds for events of one run inserted out of id order too.
 * Parked rows do not count as pending; instead each row reports its run's
 * parked seq, if any.
 */
export async function claimPendingEvents(
  sql: Db,
  limit: number,
  maxBytes: number,
  scope: ShardScope,
): Promise<ClaimedEvent[]> {
  return await sql<ClaimedEvent[]>`
    with locked as (
      select tenant_id, run_id, seq, event_id, type, goal_id, dispatch_key,
             payload::text as payload, at
        from work_events
       where published_at is null and parked_at is null
         -- A filter of the scan, not an index condition: the pending index
         -- is read in event_id order and rows of other shards are skipped.
         and ${SHARD_OF(sql)} = any(${scope.shards}::int[])
         -- A one-time filter: on a session that does not hold the locks, nothing.
         and pg_backend_pid() = ${scope.pid}::int
       order by event_id
       limit ${limit}
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
function BATCH_PROBE(tx: Db, tenants: string[], ids: string[]) {
  return tx`and w.event_id = any(${ids}::bigint[]) and w.tenant_id = any(${tenants}::text[])`;
}

/** Sets `published_at = now()` on these events (by tenant and event id); returns how many. */
export async function markPublished(
  tx: Db,
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
export async function parkEvents(tx: Db, events: ParkedEvent[]): Promise<number> {
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

/** A work_events row's shard: every event of a run is in the same one. */
function SHARD_OF(sql: Db) {
  return sql`(hashtext(tenant_id || '/' || run_id::text) & ${OUTBOX_SHARDS - 1}::int)`;
}

/** This session and how many publishers hold the publishers' lock (this one or not). */
export interface PublisherCount {
  pid: number;
  /** Sessions of this database holding the publishers' lock. */
  publishers: number;
  /** Whether this session is one of them (false: a new session, its locks gone). */
  joined: boolean;
}

/**
 * Counts the publisher processes by the shared lock each holds
 * (`joinPublishers`), from `pg_locks`: a few times a minute per process, not
 * per batch.
 */
export async function countPublishers(sql: Sql): Promise<PublisherCount> {
  const [row] = await sql<PublisherCount[]>`
    select pg_backend_pid() as pid, count(*)::int as publishers,
           coalesce(bool_or(l.pid = pg_backend_pid()), false) as joined
      from pg_locks l
     where l.locktype = 'advisory' and l.granted
       and l.database = (select oid from pg_database where datname = current_database())
       and l.classid = ${OUTBOX_LOCK_CLASS}::int::oid and l.objid = ${PUBLISHERS_KEY}::int::oid
       and l.objsubid = 2`;
  return row;
}

/** Takes the publishers' lock, shared, for this session (once per session: it stacks). */
export async function joinPublishers(sql: Sql): Promise<void> {
  await sql`select pg_advisory_lock_shared(${OUTBOX_LOCK_CLASS}::int, ${PUBLISHERS_KEY}::int)`;
}

/**
 * Tries the locks of `candidates` in order, without waiting, until `need`
 * are taken; returns the shards taken. `candidates` must not hold one this
 * session already has: a session lock taken twice needs two unlocks.
 */
export async function tryLockShards(
  sql: Sql,
  candidates: number[],
  need: number,
): Promise<number[]> {
  if (need <= 0 || candidates.length === 0) return [];
  // No ORDER BY: it would evaluate (and take) every row before the LIMIT.
  const rows = await sql<{ shard: number }[]>`
    select c.shard from unnest(${candidates}::int[]) as c(shard)
     where pg_try_advisory_lock(${OUTBOX_LOCK_CLASS}::int, c.shard)
     limit ${need}::int`;
  return rows.map((r) => r.shard);
}

/** Releases these shards' locks held by this session. */
export async function unlockShards(sql: Sql, shards: number[]): Promise<void> {
  if (shards.length === 0) return;
  await sql`
    select pg_advisory_unlock(${OUTBOX_LOCK_CLASS}::int, s) from unnest(${shards}::int[]) as s`;
}
