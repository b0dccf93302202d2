/**
 * Claiming: a worker takes due queued runs, fairly across tenants, under a
 * lease (see db/queue_sql.ts for the queue as a whole).
 */
import type { Sql } from "./pool.ts";
import { EVENT_COLUMNS, QUEUED_TENANTS, slotCountMoves, tenantScan } from "./queue_sql.ts";

/** A run a worker just claimed: what it needs to execute it. */
export interface ClaimedRun {
  tenant_id: string;
  run_id: string;
  workflow_ref: string;
  workflow_name: string;
  workflow_version: number;
  input: unknown;
  goal_id: string | null;
  dispatch_key: string | null;
  /** This attempt's number, 1 on the first. */
  attempts: number;
  max_attempts: number;
  lease_expires_at: Date;
  /** The run's W3C trace (core/tracing.ts): the attempt is a span in it. */
  traceparent?: string | null;
  /** Its concurrency group's key when its version is limited; null: not limited. */
  concurrency_key?: string | null;
}

/**
 * The workflow versions a worker hosts, as two parallel arrays (one
 * `unnest` in the claim): it claims runs pinned to these and no others.
 */
export interface HostedVersions {
  names: string[];
  versions: number[];
}

/**
 * The CTE `claimed`: the rows of a CTE `picked` (whole `runs` rows, locked
 * by the statement) made `running` under `owner`'s lease, their attempt
 * counted. Updated through `INSERT … ON CONFLICT (tenant_id, run_id) DO
 * UPDATE`, which always conflicts (each row exists and is locked by this
 * statement): the executor finds each row by probing the primary key. An
 * `UPDATE … FROM` the picked rows is a join the planner may hash over a
 * sequential scan of `runs` when the table looks small, and a prepared
 * statement keeps that plan as the table grows.
 */
function claimedFromPicked(sql: Sql, owner: string, leaseMs: number) {
  return sql`claimed as (
  insert into runs select * from picked
  on conflict (tenant_id, run_id) do update
     set status = 'running',
         attempts = runs.attempts + 1,
         lease_owner = ${owner},
         lease_expires_at = now() + ${leaseMs}::float8 * interval '1 millisecond',
         started_at = coalesce(runs.started_at, now()),
         updated_at = now(),
         event_seq = runs.event_seq + 1
   where runs.status = 'queued'
  returning runs.tenant_id, runs.run_id, runs.workflow_ref, runs.workflow_name,
            runs.workflow_version, runs.input, runs.goal_id, runs.dispatch_key,
            runs.attempts, runs.max_attempts, runs.lease_expires_at, runs.event_seq,
            runs.traceparent, runs.concurrency_key
)`;
}

/** Each claimed run's `run.started` event `{attempt, worker}`, then the claimed runs. */
function startedEventsOfClaimed(sql: Sql, owner: string) {
  return sql`ev as (
  insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
  select tenant_id, run_id, event_seq, 'run.started', goal_id, dispatch_key,
         jsonb_build_object('attempt', attempts, 'worker', ${owner}::text), now()
    from claimed
)
select tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input, goal_id,
       dispatch_key, attempts, max_attempts, lease_expires_at, traceparent, concurrency_key
  from claimed`;
}

/**
 * Claims up to `limit` due queued runs of the `hosted` versions (none with a
 * concurrency limit: see `claimLimitedRuns`) for `owner`, fairly across
 * tenants:
 * each becomes `running` with a lease of `leaseMs`, its attempt counted, and
 * a `run.started` event `{attempt, worker}` appended.
 *
 * Fair: the tenants with due runs take turns, not the oldest runs of all
 * (one tenant's backlog of 100,000 would make every other tenant wait until
 * it drained). Each of the `limit` slots goes to the tenant it leaves with
 * the fewest runs in flight (ties: the tenant whose oldest due run waited
 * longest): a tenant with nothing running comes first, a tenant with a
 * backlog gets what the others leave, and with more tenants than slots the
 * ones just served wait for the others, round-robin. Each tenant then takes
 * its share highest priority first, then oldest (a tenant's priorities
 * order its own runs only), skipping rows other workers hold (`FOR UPDATE SKIP
 * LOCKED`); a tenant with fewer due runs than its share leaves those slots
 * empty until the next claim. One tenant alone gets every slot. The cost is
 * one index probe per tenant with queued runs and hosted version, one per
 * run in flight of the tenants in line and one per claimed run. Runs of
 * versions this worker does not host are never read: they wait, with no
 * attempt spent, for a worker that hosts them. The claimed rows are updated
 * by primary-key probes (`claimedFromPicked`).
 */
export async function claimRuns(
  sql: Sql,
  owner: string,
  limit: number,
  leaseMs: number,
  hosted: HostedVersions,
): Promise<ClaimedRun[]> {
  return await sql<ClaimedRun[]>`
    with recursive versions (name, version) as (
      select * from unnest(${hosted.names}::text[], ${hosted.versions}::int[])
    ),
    ${sql.unsafe(QUEUED_TENANTS)},
    -- First in line: the tenants with the fewest runs in flight, then the
    -- longest waiting. No more of them than there are slots. A tenant's runs
    -- in flight are one range of the running index (migration 011), as long
    -- as its running runs plus the entries of runs that left since the last
    -- vacuum; counted only when more than one tenant has due runs (one
    -- tenant alone gets every slot).
    served as (
      select h.tenant_id, h.run_after,
             case when (select count(*) from heads) > 1
                  then (select count(*) from runs f
                         where f.tenant_id collate "C" = h.tenant_id and f.status = 'running'
                           and f.lease_expires_at is not null)
                  else 0 end as running
        from heads h
       order by 3, 2, 1
       limit ${limit}
    ),
    -- Each slot goes to the tenant it leaves with the fewest runs in flight.
    shares as (
      select tenant_id, count(*) as share
        from (select s.tenant_id from served s
               cross join generate_series(1, ${limit}::int) k
               order by s.running + k, s.run_after, s.tenant_id
               limit ${limit}) slot
       group by tenant_id
    ),
    -- Each tenant's share, highest priority then oldest first across the
    -- versions this worker hosts: each version's first (one index range
    -- each), then the first of those. A row locked here but not among the
    -- share is unlocked when the statement commits.
    picked as (
      select c.*
        from shares s
       cross join lateral (
             select o.* from versions v
              cross join lateral (
                    select r.* from runs r
                     where r.tenant_id collate "C" = s.tenant_id and r.status = 'queued'
                       and r.workflow_name = v.name and r.workflow_version = v.version
                       and r.run_after <= now()
                     order by r.priority desc, r.run_after
                     limit s.share
                     for update skip locked) o
              order by o.priority desc, o.run_after
              limit s.share) c
    ),
    ${claimedFromPicked(sql, owner, leaseMs)},
    ${startedEventsOfClaimed(sql, owner)}`;
}

// A claimed run is running in its group, no longer queued; the group goes
// to the back of its tenant's line.
const READY_TENANTS = tenantScan(
  "ready_tenants",
  "concurrency_slots",
  "queued > 0 and running < max_running",
);
const CLAIMED_SLOTS = slotCountMoves("claimed", "1", "-1", "served_at = now()");

/**
 * Claims up to `limit` due queued runs of the `hosted` versions that declare
 * a concurrency limit (migration 011), never more running at once per
 * concurrency group (tenant, workflow, key) than the group's limit, however
 * many workers claim and whatever their statements' snapshots: a group is
 * claimed from only while this statement holds its `concurrency_slots` row
 * (`FOR UPDATE SKIP LOCKED`), its room is read from that newest row, and the
 * row's counts move in the same statement as the runs.
 *
 * Fair across tenants and keys: the tenants with groups that have queued
 * runs and room (a loose scan of the slots' ready index) take the slots in
 * turn, least recently served first, and so do a tenant's groups; a group
 * starts its runs highest priority first, then oldest. A group whose
 * queued runs are not due yet is looked at and goes to the back of the
 * line. The cost is one probe per tenant with ready groups and hosted
 * workflow, one per group looked at and one per claimed run: full groups
 * and their backlogs are never read.
 */
export async function claimLimitedRuns(
  sql: Sql,
  owner: string,
  limit: number,
  leaseMs: number,
  hosted: HostedVersions,
): Promise<ClaimedRun[]> {
  return await sql<ClaimedRun[]>`
    with recursive versions (name, version) as (
      select * from unnest(${hosted.names}::text[], ${hosted.versions}::int[])
    ),
    names as (select distinct name from versions),
    -- The tenants with a group that has queued runs and room: a loose scan
    -- of concurrency_slots_ready_idx's leading column, one probe per tenant.
    ${sql.unsafe(READY_TENANTS)},
    -- Each such tenant's least recently served ready group of a hosted workflow.
    heads as (
      select t.tenant_id, h.served_at
        from ready_tenants t
       cross join lateral (
             select min(o.served_at) as served_at
               from names n
              cross join lateral (
                    select s.served_at from concurrency_slots s
                     where s.tenant_id collate "C" = t.tenant_id and s.workflow_name = n.name
                       and s.queued > 0 and s.running < s.max_running
                     order by s.served_at limit 1) o) h
       where t.tenant_id is not null and h.served_at is not null
    ),
    served as (
      select tenant_id, served_at from heads order by served_at, tenant_id limit ${limit}
    ),
    -- The slots, round-robin over those tenants.
    shares as (
      select tenant_id, count(*) as share
        from (select s.tenant_id from served s
               cross join generate_series(1, ${limit}::int) k
               order by k, s.served_at, s.tenant_id
               limit ${limit}) slot
       group by tenant_id
    ),
    -- Each tenant's groups, least recently served first, at most its share,
    -- each held for the rest of the statement. The room is the locked
    -- (newest) row's: no other statement moves its counts meanwhile.
    groups as materialized (
      select g.*
        from shares sh
       cross join lateral (
             select o.* from names n
              cross join lateral (
                    select s.tenant_id, s.workflow_name, s.concurrency_key, s.served_at,
                           s.max_running - s.running as room
                      from concurrency_slots s
                     where s.tenant_id collate "C" = sh.tenant_id and s.workflow_name = n.name
                       and s.queued > 0 and s.running < s.max_running
                     order by s.served_at
                     limit sh.share
                       for update skip locked) o
              order by o.served_at
              limit sh.share) g
    ),
    -- Each group's next runs (at most its room), highest priority then
    -- oldest, of the versions this worker hosts; then each tenant's share of
    -- them, one per group in turn.
    candidates as (
      select l.r, g.tenant_id, g.served_at as group_served_at,
             row_number() over (partition by g.tenant_id, g.workflow_name, g.concurrency_key
                                order by (l.r).priority desc, (l.r).run_after) as nth
        from groups g
       cross join lateral (
             select r from runs r
              where r.tenant_id collate "C" = g.tenant_id and r.workflow_name = g.workflow_name
                and r.concurrency_key = g.concurrency_key and r.status = 'queued'
                and r.concurrency_key is not null and r.run_after <= now()
                and exists (select 1 from versions v
                             where v.name = r.workflow_name and v.version = r.workflow_version)
              order by r.priority desc, r.run_after
              limit g.room
                for update skip locked) l
    ),
    picked as (
      select (p.r).*
        from (select x.r, sh.share,
                     row_number() over (partition by x.tenant_id
                                        order by x.nth, x.group_served_at) as turn
                from candidates x join shares sh on sh.tenant_id = x.tenant_id) p
       where p.turn <= p.share
    ),
    ${claimedFromPicked(sql, owner, leaseMs)},
    ${sql.unsafe(CLAIMED_SLOTS)},
    -- Every group looked at goes to the back of its tenant's line, also one
    -- that had nothing due (its runs wait for their run_after).
    turned as (
      insert into concurrency_slots (tenant_id, workflow_name, concurrency_key, max_running)
      select tenant_id, workflow_name, concurrency_key, 1 from groups
       where not exists (select 1 from slot_moves m
                          where m.tenant_id = groups.tenant_id
                            and m.workflow_name = groups.workflow_name
                            and m.concurrency_key = groups.concurrency_key)
       order by 1, 2, 3
      on conflict (tenant_id, workflow_name, concurrency_key) do update
         set served_at = now()
    ),
    ${startedEventsOfClaimed(sql, owner)}`;
}
