/**
 * Leases: a worker's heartbeat extends the lease on the run it executes, and
 * the reclaimer takes back the runs whose lease expired (their worker died or
 * hung). Both are fenced as db/queue_sql.ts explains.
 */
import type { Sql } from "./pool.ts";
import type { RunStatus } from "./runs.ts";
import { EVENT_COLUMNS, QUEUED_AT, tenantScan } from "./queue_sql.ts";
import { fanIn } from "./fan_in.ts";
import { cancelledPayload, failedPayload, NULL_JSONB, retryingPayload } from "./event_payloads.ts";

const RUNNING_TENANTS = tenantScan(
  "running_tenants",
  "runs",
  "status = 'running' and lease_expires_at is not null",
);

const RECLAIMED_MOVES = fanIn(
  "upd",
  "-1",
  "case when status = 'queued' then 1 else 0 end",
  QUEUED_AT,
);

// The events of a reclaimed run, by its new status: the expired attempt's
// worker is `previous_owner`; a run failed for good carries the
// `lease-expired` error its row now holds.
const LEASE_EXPIRED = "'lease expired'";
const RECLAIMED_FAILED = failedPayload({ attempt: "attempts", error: "error" });
const RECLAIMED_CANCELLED = cancelledPayload({
  attempt: "attempts",
  requested_at: "cancel_requested_at",
  error: NULL_JSONB,
  reason: LEASE_EXPIRED,
  worker: "previous_owner",
});
const RECLAIMED_RETRYING = retryingPayload({
  attempt: "attempts",
  error: NULL_JSONB,
  reason: LEASE_EXPIRED,
  worker: "previous_owner",
  retry_at: "run_after",
});

/** A run whose expired lease `reclaimExpired` took back. */
export interface ReclaimedRun {
  tenant_id: string;
  run_id: string;
  /**
   * `queued` (retried), `failed` (that was its last attempt) or `cancelled`
   * (a cancel was requested while it ran).
   */
  status: RunStatus;
  attempts: number;
  /** The worker that held the lease. */
  previous_owner: string | null;
}

/**
 * Takes back up to `limit` runs whose lease expired (their worker died or
 * hung): back to `queued`, due now, with a `run.retrying` event (`reason`
 * `lease expired`, the expired attempt's `worker`, no `error`); or `failed`
 * with a `run.failed` event (`error` coded `lease-expired`) when the expired
 * attempt was the last one; or `cancelled` with a `run.cancelled` event
 * (`reason` and `worker` as for a retry) when a cancel was requested
 * meanwhile. The attempt counts: a run that kills its worker every time must
 * not be retried forever.
 * Tenant by tenant: the tenants with running runs (a loose scan), then each
 * one's expired leases, oldest first, one index range each.
 */
export async function reclaimExpired(sql: Sql, limit: number): Promise<ReclaimedRun[]> {
  // Updated through an always-conflicting upsert, as in `claimRuns`: each
  // row is found by the primary key's probe, never by a planned join.
  return await sql<ReclaimedRun[]>`
    with recursive
    -- The tenants with running runs: a loose scan of runs_running_tenant_idx's
    -- leading column, one probe per tenant.
    ${sql.unsafe(RUNNING_TENANTS)},
    -- Each tenant's expired leases, oldest first: one range each.
    expired as (
      select e.*
        from running_tenants t
       cross join lateral (
             select * from runs r
              where r.tenant_id collate "C" = t.tenant_id and r.status = 'running'
                and r.lease_expires_at is not null and r.lease_expires_at < now()
              order by r.lease_expires_at
              limit ${limit}
                for update skip locked) e
       where t.tenant_id is not null
       limit ${limit}
    ),
    upd as (
      insert into runs select * from expired
      on conflict (tenant_id, run_id) do update
         set status = case when runs.cancel_requested_at is not null then 'cancelled'
                           when runs.attempts >= runs.max_attempts then 'failed'
                           else 'queued' end,
             run_after = case when runs.cancel_requested_at is null
                                   and runs.attempts < runs.max_attempts
                              then now() else runs.run_after end,
             error = case when runs.cancel_requested_at is null
                               and runs.attempts >= runs.max_attempts
                          then jsonb_build_object('message', 'lease expired', 'code', 'lease-expired',
                                                  'attempt', runs.attempts,
                                                  'worker', runs.lease_owner)
                          else runs.error end,
             finished_at = case when runs.cancel_requested_at is not null
                                  or runs.attempts >= runs.max_attempts then now() end,
             lease_owner = null,
             lease_expires_at = null,
             updated_at = now(),
             event_seq = runs.event_seq + 1
       where runs.status = 'running'
      returning runs.tenant_id, runs.run_id, runs.goal_id, runs.dispatch_key, runs.status,
                runs.attempts, runs.error, runs.event_seq, runs.cancel_requested_at,
                runs.workflow_name, runs.workflow_version, runs.run_after, runs.concurrency_key,
                runs.parent_run_id
    ),
    -- The expired attempt's slot is freed here, once: the run is queued in
    -- its group again, not counted running twice; an unlimited run lowers
    -- its lane; a run failed or cancelled for good is delivered to its
    -- waiting parent (db/fan_in.ts).
    ${sql.unsafe(RECLAIMED_MOVES)},
    -- Two CTEs joined: no table is read, whatever the plan.
    reclaimed as (
      select u.*, e.lease_owner as previous_owner
        from upd u join expired e on e.tenant_id = u.tenant_id and e.run_id = u.run_id
    ),
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, event_seq,
             case status when 'failed' then 'run.failed' when 'cancelled' then 'run.cancelled'
                         else 'run.retrying' end,
             goal_id, dispatch_key,
             case status
               when 'failed' then ${sql.unsafe(RECLAIMED_FAILED)}
               when 'cancelled' then ${sql.unsafe(RECLAIMED_CANCELLED)}
               else ${sql.unsafe(RECLAIMED_RETRYING)}
             end,
             now()
        from reclaimed
    )
    select tenant_id, run_id, status, attempts, previous_owner from reclaimed`;
}

/**
 * What a lease renewal learned of one run: the lease is extended (`held`),
 * extended but a cancel was requested (`cancel-requested`: abort the
 * handler, keep renewing until it returned), gone (`lost`: stop working on
 * the run), or not renewed this time because another statement holds the
 * row (`busy`: a finishing write of this worker, the reclaimer, a cancel;
 * the lease is left unconfirmed and tried again next time).
 */
export type HeartbeatResult = "held" | "cancel-requested" | "lost" | "busy";

/** One lease a worker renews: the run, and the attempt it holds (the fencing token). */
export interface HeldLease {
  tenant_id: string;
  run_id: string;
  attempt: number;
}

/**
 * Extends `owner`'s leases on `leases` to now + `leaseMs`, in one statement
 * (one commit) however many there are; the result is per lease, in order.
 * Each is fenced as every statement of a claim is (`lease_owner = owner and
 * attempts = attempt and status = 'running'`): `lost` when the lease is gone
 * (reclaimed, finished, owned by another worker or by a newer attempt), and
 * the caller must stop working on that run. Not a state change, so no event.
 *
 * Rows another statement holds are skipped (`busy`), not waited for: one row
 * locked by a slow finishing write must not hold up the renewal of all the
 * worker's other runs (and waiting would risk a deadlock with a completion
 * batch locking the same rows in another order). Each run is found by a
 * primary-key probe in a lateral subquery (never flattened into a join the
 * planner could hash over a scan of `runs`), and written through an
 * always-conflicting upsert, as in `completeRuns`: an `UPDATE … FROM` the
 * locked rows was planned as a sequential scan of a never-analyzed `runs`
 * (tests/db_plans_test.ts), the arbiter's probe never is.
 *
 * `signal` bounds the wait: when it aborts, the statement is cancelled (also
 * on the server) and the promise rejects with the signal's reason. A renewal
 * that timed out may or may not have been written; the caller treats its
 * leases as unconfirmed.
 */
export async function renewLeases(
  sql: Sql,
  owner: string,
  leases: readonly HeldLease[],
  leaseMs: number,
  signal?: AbortSignal,
): Promise<HeartbeatResult[]> {
  if (leases.length === 0) return [];
  const query = sql<
    { i: number; renewed: boolean; cancel_requested: boolean; ours: boolean | null }[]
  >`
    with l as (
      select l.tenant_id, l.run_id, l.attempt, l.i::int as i
        from unnest(${leases.map((l) => l.tenant_id)}::text[],
                    ${leases.map((l) => l.run_id)}::uuid[],
                    ${leases.map((l) => l.attempt)}::int[])
             with ordinality as l(tenant_id, run_id, attempt, i)
    ),
    locked as (
      select l.i, k.r
        from l
       cross join lateral (
             select r from runs r
              where r.tenant_id = l.tenant_id and r.run_id = l.run_id
                and r.lease_owner = ${owner} and r.attempts = l.attempt
                and r.status = 'running'
                -- No key update: not held up by a child's finishing
                -- statement's KEY SHARE lock on its parent (db/fan_in.ts).
                for no key update skip locked) k
    ),
    upd as (
      insert into runs select (k.r).* from locked k
      on conflict (tenant_id, run_id) do update
         set lease_expires_at = now() + ${leaseMs}::float8 * interval '1 millisecond'
       where runs.status = 'running' and runs.lease_owner = ${owner}
      returning runs.tenant_id, runs.run_id, runs.cancel_requested_at is not null as cancel_requested
    )
    -- Joins of CTEs only: no table is read, whatever the plan. Not renewed:
    -- lost when the row (as this statement's snapshot sees it) is not the
    -- attempt's any more, else busy (held by another statement).
    select l.i, u.run_id is not null as renewed,
           coalesce(u.cancel_requested, false) as cancel_requested,
           o.ours is not null as ours
      from l
      left join upd u on u.tenant_id = l.tenant_id and u.run_id = l.run_id
      -- A probe per run, only for those not renewed.
      left join lateral (
             select true as ours from runs r
              where u.run_id is null
                and r.tenant_id = l.tenant_id and r.run_id = l.run_id
                and r.lease_owner = ${owner} and r.attempts = l.attempt
                and r.status = 'running'
              limit 1) o on true`;
  const rows = await cancelledOnAbort(query, signal);
  const out: HeartbeatResult[] = leases.map(() => "lost");
  for (const r of rows) {
    out[r.i - 1] = r.renewed
      ? (r.cancel_requested ? "cancel-requested" : "held")
      : r.ours
      ? "busy"
      : "lost";
  }
  return out;
}

/**
 * `renewLeases` for one run: extends `owner`'s lease on attempt `attempt`
 * of a running run.
 */
export async function heartbeat(
  sql: Sql,
  tenantId: string,
  runId: string,
  owner: string,
  attempt: number,
  leaseMs: number,
  signal?: AbortSignal,
): Promise<HeartbeatResult> {
  const [result] = await renewLeases(
    sql,
    owner,
    [{ tenant_id: tenantId, run_id: runId, attempt }],
    leaseMs,
    signal,
  );
  return result;
}

/**
 * Settles like `query`, or rejects with `signal`'s reason as soon as it
 * aborts, after asking postgres.js to cancel the query (dropped from the
 * queue if not sent yet, a cancel request to the server if running).
 */
function cancelledOnAbort<T>(
  query: Promise<T> & { cancel(): unknown },
  signal: AbortSignal | undefined,
): Promise<T> {
  if (!signal) return query;
  // A postgres.js query is sent on its first then(): one never awaited never runs.
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      // The cancel's own outcome does not matter: the caller has given up.
      Promise.resolve(query.cancel()).catch(() => {});
      reject(signal.reason);
    };
    signal.addEventListener("abort", onAbort, { once: true });
    query.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}
