/**
 * Claiming: a worker takes due queued runs, fairly across tenants, under a
 * lease (see db/queue_sql.ts for the queue as a whole).
 */
import type { Sql } from "./pool.ts";
import { EVENT_COLUMNS, QUEUED_TENANTS } from "./queue_sql.ts";

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
 * Claims up to `limit` due queued runs of the `hosted` versions for `owner`,
 * fairly across tenants:
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
 * its share oldest first, skipping rows other workers hold (`FOR UPDATE SKIP
 * LOCKED`); a tenant with fewer due runs than its share leaves those slots
 * empty until the next claim. One tenant alone gets every slot. The cost is
 * one index probe per tenant with queued runs and hosted version, one per
 * run in flight and one per claimed run. Runs of versions this worker does
 * not host are never read: they wait, with no attempt spent, for a worker
 * that hosts them.
 *
 * The claimed rows are updated through `INSERT … ON CONFLICT (tenant_id,
 * run_id) DO UPDATE`, which always conflicts (each row exists and is locked
 * by this statement): the executor finds each row by probing the primary
 * key. An `UPDATE … FROM` the claimed rows is a join the planner may hash
 * over a sequential scan of `runs` when the table looks small, and a
 * prepared statement keeps that plan as the table grows.
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
    -- Runs in flight per tenant: the running partial index, as long as the
    -- fleet's concurrency plus the entries of runs that left it since the
    -- last vacuum (a bitmap scan reads those again every time). Materialized,
    -- so it is read at most once, and only when it is needed: when more than
    -- one tenant has due runs (one tenant alone gets every slot).
    in_flight as materialized (
      select tenant_id collate "C" as tenant_id, count(*) as running
        from runs
       where status = 'running' and lease_expires_at is not null
       group by 1
    ),
    -- First in line: the tenants with the fewest runs in flight, then the
    -- longest waiting. No more of them than there are slots.
    served as (
      select h.tenant_id, h.run_after,
             case when (select count(*) from heads) > 1
                  then coalesce((select f.running from in_flight f
                                  where f.tenant_id = h.tenant_id), 0)
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
    -- Each tenant's share, oldest first across the versions this worker
    -- hosts: each version's oldest (one index range each), then the oldest of
    -- those. A row locked here but not among the share is unlocked when the
    -- statement commits.
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
                     order by r.run_after
                     limit s.share
                     for update skip locked) o
              order by o.run_after
              limit s.share) c
    ),
    claimed as (
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
                runs.traceparent
    ),
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, event_seq, 'run.started', goal_id, dispatch_key,
             jsonb_build_object('attempt', attempts, 'worker', ${owner}::text), now()
        from claimed
    )
    select tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input, goal_id,
           dispatch_key, attempts, max_attempts, lease_expires_at, traceparent
      from claimed`;
}
