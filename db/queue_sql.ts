/**
 * The run queue, on the `runs` table itself, and the SQL text its statements
 * share. Workers claim due queued runs with `FOR UPDATE SKIP LOCKED` under a
 * lease (db/claims.ts), heartbeat it and lose it when it expires
 * (db/leases.ts), and end the attempt with one guarded statement
 * (db/attempt_end.ts); the API cancels runs (db/cancellation.ts) and metrics
 * read the queue's size (db/queue_stats.ts). Every state change appends its
 * `work_events` row in the same statement (a data-modifying CTE), so the
 * change and its event commit together, and the event's `seq` is the run's
 * new `event_seq`, taken under the row lock the update holds.
 *
 * Every statement a worker makes about its claim (heartbeat, completion,
 * failure, release) is fenced by `lease_owner = owner and attempts = attempt
 * and status = 'running'`: a worker that lost its lease (its run reclaimed,
 * maybe claimed again by another worker or by this same worker id under a
 * newer attempt) changes nothing and is told so. The owner alone is not
 * enough: a worker whose lease expired can re-claim the same run, and a late
 * or replayed write for attempt 1 would then finish attempt 2. The attempt
 * number is the fencing token because every claim increments it; the one
 * exception is `releaseRun`, which gives the attempt back, so the number is
 * reused by the next claim. A released attempt belongs to a worker that is
 * shutting down and claims nothing more, and a restarted process has a new
 * default id, so (owner, attempt) still names one claim in practice.
 *
 * Wake-ups: workers `LISTEN` on `QUEUE_CHANNEL` (db/notify.ts); whoever
 * makes runs due calls `notifyQueued` after its transaction committed.
 * Runs that become due later (retry backoff) are found by polling.
 */

/**
 * The columns of the event insert shared by every transition: `from` is a
 * CTE returning the updated run's tenant_id, run_id, goal_id, dispatch_key
 * and new event_seq. Kept as text so each statement stays one round trip
 * with one plan.
 */
export const EVENT_COLUMNS = "tenant_id, run_id, seq, type, goal_id, dispatch_key, payload, at";

/**
 * A CTE for a `with recursive`: `queued_tenants`, the tenants with queued
 * runs in collation "C" order (a loose index scan of
 * runs_queued_workflow_idx's leading column, one probe per tenant however
 * long its queue), ending with a null row. Collation "C" is the index's: no
 * other index can serve the probes (see migrations/003).
 */
export const QUEUED_TENANT_SCAN = tenantScan("queued_tenants", "runs", "status = 'queued'");

/**
 * A CTE for a `with recursive`: `name (tenant_id)`, the tenants with rows of
 * `table` where `predicate` holds (written for rows of `table` unqualified,
 * its columns bare), in collation "C" order, ending with a null row: a loose
 * index scan of a partial index with that predicate led by `tenant_id
 * collate "C"`, one probe per tenant however many rows each has. The one
 * shape of "which tenants have work of this kind" (queued runs, running
 * runs, concurrency groups with room).
 */
export function tenantScan(name: string, table: string, predicate: string): string {
  return `${name} (tenant_id) as (
      (select tenant_id collate "C" from ${table}
        where ${predicate}
        order by tenant_id collate "C" limit 1)
      union all
      select (select tenant_id collate "C" from ${table}
               where ${predicate} and tenant_id collate "C" > t.tenant_id
               order by tenant_id collate "C" limit 1)
        from ${name} t
       where t.tenant_id is not null
    )`;
}

/**
 * Two CTEs for a `with recursive`: `queued_tenants` (QUEUED_TENANT_SCAN)
 * and `heads`, when each such tenant's next due run among the workflow
 * versions in a CTE `versions (name, version)` that the statement defines
 * before these became due (per version the next is the highest priority,
 * then the oldest): one probe per tenant and version, each the head of one
 * index range (migrations 008 and 011).
 */
export const QUEUED_TENANTS = `${QUEUED_TENANT_SCAN},
    -- Each such tenant's next due run of those versions (highest priority,
    -- then oldest): its wait is the tenant's place in line.
    heads as (
      select t.tenant_id, h.run_after
        from queued_tenants t
       cross join lateral (
             select min(o.run_after) as run_after
               from versions v
              cross join lateral (
                    select r.run_after from runs r
                     where r.tenant_id collate "C" = t.tenant_id and r.status = 'queued'
                       and r.workflow_name = v.name and r.workflow_version = v.version
                       and r.run_after <= now()
                     order by r.priority desc, r.run_after limit 1) o) h
       where h.run_after is not null
    )`;

/** `versions (name, version)` for QUEUED_TENANTS: every version in the catalog. */
export const CATALOG_VERSIONS = `versions (name, version) as (
      select name, version from workflow_versions
    )`;

/**
 * The head of an UPDATE of rows that exist, written as an upsert that always
 * conflicts: `insert into <table> <rows> on conflict (<key>) do update`, the
 * caller appending `set …`. The one place this shape is chosen, for two
 * reasons, each proven by a test:
 *
 * - the plan: each row is found by a probe of the key's unique index, which
 *   is how ON CONFLICT works, whatever the statistics. An `UPDATE … FROM` a
 *   CTE of a few rows is a join the planner hashes over a sequential scan of
 *   the table when it looks small (tests/db_plans_test.ts catches it for
 *   `runs` and `queue_lanes`, and `ctid = any(…)` too in generic plans), and
 *   a prepared statement keeps that plan as the table grows;
 * - the version: the update lands on the row's newest version whatever the
 *   statement's snapshot. A plain UPDATE reads rows through the snapshot and
 *   skips a version committed after it when reached by its ctid: a
 *   concurrency group locked by a claim may be newer than the claim's
 *   snapshot (db/claims.ts), and a count moved on an older version would be
 *   lost (tests/db_flow_control_test.ts counts the drift).
 *
 * `rows` yields whole rows in key order (locks in one order: no deadlock);
 * the proposed row's values reach the update as `excluded`.
 */
export function updateThroughKey(table: string, key: string, rows: string): string {
  return `insert into ${table} ${rows}
      on conflict (${key}) do update`;
}

/** A run's due time when the statement left it queued, else null (`laneMoves`, `slotCountMoves`). */
export const QUEUED_AT = "case when status = 'queued' then run_after end";

/**
 * A CTE `lane_moves` that lowers the lanes (migration 016) of the unlimited
 * runs a statement just made queued: per (tenant, workflow version) of
 * `source` (a CTE returning tenant_id, workflow_name, workflow_version,
 * concurrency_key and the expression `queuedAt`, e.g. `case when status =
 * 'queued' then run_after end`: null for a run not queued), `ready_at =
 * least(ready_at, earliest queuedAt)`, the lane made on its first run. In
 * key order, so two such statements cannot deadlock.
 *
 * Always an update, never skipped when `least` changes nothing: the new row
 * version is what tells a concurrent claim that a run became queued after its
 * snapshot (db/claims.ts), and the row lock is what makes a claim's
 * push-back wait for this statement, or this statement for it.
 */
export function laneMoves(source: string, queuedAt: string): string {
  return `lane_moves as (
      insert into queue_lanes (tenant_id, workflow_name, workflow_version, ready_at)
      select tenant_id, workflow_name, workflow_version, min(${queuedAt})
        from ${source}
       where concurrency_key is null and ${queuedAt} is not null
       group by 1, 2, 3
       order by 1, 2, 3
      on conflict (tenant_id, workflow_name, workflow_version) do update
         set ready_at = least(queue_lanes.ready_at, excluded.ready_at)
    )`;
}

/**
 * Two CTEs that move the concurrency counts (migration 011) of the limited
 * runs a statement just moved: `slot_moves`, per group of `source` (a CTE
 * returning tenant_id, workflow_name, concurrency_key and, per run, the
 * expressions `running` and `queued` as deltas, e.g. `-1` and `case when
 * status = 'queued' then 1 else 0 end`), and `slot_counts`, which applies
 * them. `queuedAt` (as in `laneMoves`) lowers the group's due time
 * (migration 016) to its runs that went back to the queue. Runs without a
 * concurrency key move nothing.
 *
 * Applied through `updateThroughKey` (the group's row exists from its first
 * admission): the delta lands on the row's newest version whatever the
 * statement's snapshot, and the groups are locked in key order, so two such
 * statements cannot deadlock. The deltas ride in a subquery of the CTE, not in the proposed
 * row: were the row missing (a bug), it is made with zero counts, not the
 * deltas. No clamp at zero: a count that went wrong shows, and the
 * reconciler corrects it.
 */
export function slotCountMoves(
  source: string,
  running: string,
  queued: string,
  queuedAt?: string,
): string {
  const pick = (col: string) =>
    `(select m.${col} from slot_moves m
                where m.tenant_id = excluded.tenant_id and m.workflow_name = excluded.workflow_name
                  and m.concurrency_key = excluded.concurrency_key)`;
  return `slot_moves as (
      select tenant_id, workflow_name, concurrency_key,
             sum(${running})::int as d_running, sum(${queued})::int as d_queued,
             min(${queuedAt ?? "null::timestamptz"}) as due_at
        from ${source}
       where concurrency_key is not null
       group by 1, 2, 3
    ),
    slot_counts as (
      ${
    updateThroughKey(
      "concurrency_slots (tenant_id, workflow_name, concurrency_key, max_running)",
      "tenant_id, workflow_name, concurrency_key",
      "select tenant_id, workflow_name, concurrency_key, 1 from slot_moves order by 1, 2, 3",
    )
  }
         set running = concurrency_slots.running + ${pick("d_running")},
             queued = concurrency_slots.queued + ${pick("d_queued")},
             due_at = least(concurrency_slots.due_at, ${pick("due_at")})
    )`;
}
