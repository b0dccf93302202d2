/**
 * Suspension (migration 021): a run whose handler waits long (a sleep, a
 * signal) gives everything back and becomes `waiting` (`suspendRun`); it is
 * made `queued` again by the statement that ends its wait: its signal's
 * (db/signals.ts) or, at its deadline (`run_after`), the leader's waker
 * (`wakeDueRuns`, worker/run_waker.ts). Every wake is a conditional update
 * of a `waiting` run under its row lock, which moves its lane or
 * concurrency group as every statement that queues a run does
 * (db/queue_sql.ts), so the due-work claim finds it; any worker hosting its
 * version claims it and the handler replays its stored steps.
 */
import { inTransaction, type Sql } from "./pool.ts";
import { EVENT_COLUMNS, laneMoves, QUEUED_AT, slotCountMoves, tenantScan } from "./queue_sql.ts";
import type { StepFence } from "./run_steps.ts";
import { NULL_TEXT, waitingPayload, wokenPayload } from "./event_payloads.ts";

// The events: `a` the suspend's own values; a woken run's `reason` and
// `name`, what it waited for (the `woken` CTE).
const WAITING = waitingPayload({
  attempt: "a.attempt",
  reason: "a.reason",
  name: "a.name",
  step: "a.step",
  until: "a.until",
});
const WOKEN_BY_DEADLINE = wokenPayload({
  by: "'deadline'::text",
  reason: "reason",
  name: "name",
  signal_id: NULL_TEXT,
});

// A suspended run frees its concurrency slot (it is neither running nor
// queued while it waits); a woken one is queued in its group again, or lowers its lane.
const SUSPENDED_SLOTS = slotCountMoves("upd", "-1", "0");
const WOKEN_SLOTS = slotCountMoves(
  "upd",
  "0",
  "case when status = 'queued' then 1 else 0 end",
  QUEUED_AT,
);
const WOKEN_LANES = laneMoves("upd", QUEUED_AT);

const WAITING_TENANTS = tenantScan("waiting_tenants", "runs", "status = 'waiting'");

/** What a suspended run waits for. */
export interface Wait {
  reason: "sleep" | "signal";
  /** A sleep's step name; a wait's signal name. */
  name: string;
  /** The step name of the call that waits (for the event). */
  step: string;
  /** Its deadline (a sleep's end, a wait's timeout); null: none. */
  until: Date | null;
}

/**
 * What `suspendRun` did: `suspended`; `ready` (not suspended: what it would
 * wait for is already there, a signal or a passed deadline: go on);
 * `cancel-requested` (not suspended: the run is to end cancelled); `lost`
 * (the attempt no longer holds the lease).
 */
export type SuspendOutcome = "suspended" | "ready" | "cancel-requested" | "lost";

/**
 * Suspends the run `f`'s attempt holds: `waiting` for `wait`, its lease
 * cleared, its attempt given back (attempts - 1: the claim that resumes it
 * counts the same attempt again, as after a release), its concurrency slot
 * freed, `run_after` its deadline ('infinity' for none), with `run.waiting`
 * `{attempt, reason, name, step, until}`. Two statements in one transaction:
 * the first locks the run's row (fenced), the second, in a snapshot taken
 * under that lock, checks that the wait has not already ended (an
 * unconsumed signal of its name, a passed deadline) and only then suspends.
 * A signal sent meanwhile waits for the lock and then finds the run waiting
 * (db/signals.ts): no wake-up is lost.
 */
export async function suspendRun(sql: Sql, f: StepFence, wait: Wait): Promise<SuspendOutcome> {
  return await inTransaction(sql, async (t) => {
    const held = await lockAttempt(t, f);
    if (!held) return "lost" as const;
    if (held.cancel_requested) return "cancel-requested" as const;
    return await suspendLocked(t, f, wait) ? "suspended" as const : "ready" as const;
  });
}

/** The attempt's run row, locked until the transaction ends; undefined when fenced. */
async function lockAttempt(sql: Sql, f: StepFence) {
  const [row] = await sql<{ cancel_requested: boolean }[]>`
    select cancel_requested_at is not null as cancel_requested from runs
     where tenant_id = ${f.tenant_id} and run_id = ${f.run_id}
       and lease_owner = ${f.owner} and attempts = ${f.attempt} and status = 'running'
       for no key update`;
  return row;
}

/** The suspend itself, under the lock `lockAttempt` took; false when the wait has ended. */
async function suspendLocked(sql: Sql, f: StepFence, wait: Wait): Promise<boolean> {
  const [row] = await sql<{ n: number }[]>`
    with a as (
      select ${f.attempt}::int as attempt, ${wait.reason}::text as reason,
             ${wait.name}::text as name, ${wait.step}::text as step,
             ${wait.until}::timestamptz as until
    ),
    ready as (
      select ${wait.until}::timestamptz <= now()
             or (${wait.reason} = 'signal' and exists (
                   select 1 from run_signals s
                    where s.tenant_id collate "C" = ${f.tenant_id} and s.run_id = ${f.run_id}
                      and s.name = ${wait.name} and s.consumed_as is null)) as ended
    ),
    upd as (
      update runs
         set status = 'waiting',
             attempts = greatest(attempts - 1, 0),
             lease_owner = null,
             lease_expires_at = null,
             run_after = coalesce(${wait.until}::timestamptz, 'infinity'),
             wait_reason = ${wait.reason},
             wait_name = ${wait.name},
             updated_at = now(),
             event_seq = event_seq + 1
       where tenant_id = ${f.tenant_id} and run_id = ${f.run_id}
         and lease_owner = ${f.owner} and attempts = ${f.attempt} and status = 'running'
         and not coalesce((select ended from ready), false)
      returning tenant_id, run_id, goal_id, dispatch_key, event_seq, workflow_name,
                concurrency_key
    ),
    ${sql.unsafe(SUSPENDED_SLOTS)},
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select u.tenant_id, u.run_id, u.event_seq, 'run.waiting', u.goal_id, u.dispatch_key,
             ${sql.unsafe(WAITING)}, now()
        from upd u cross join a
    )
    select count(*)::int as n from upd`;
  return row.n > 0;
}

/** A run `wakeDueRuns` made queued. */
export interface WokenRun {
  tenant_id: string;
  run_id: string;
  /** What it waited for: `sleep` (its end came) or `signal` (its timeout came). */
  reason: "sleep" | "signal";
  name: string;
}

/**
 * Makes up to `limit` waiting runs whose deadline (`run_after`) has come
 * `queued` again, due now, each with `run.woken` (`by` `deadline`, `signal_id`
 * null) and its lane or concurrency group moved. Tenant by tenant, as the
 * reclaimer goes: the tenants with waiting runs (a loose scan of
 * runs_waiting_tenant_idx, migration 022), then each one's due runs, oldest
 * deadline first, one range each; rows another statement holds (a signal
 * waking the run, a cancel) are skipped.
 */
export async function wakeDueRuns(sql: Sql, limit: number): Promise<WokenRun[]> {
  return await sql<WokenRun[]>`
    with recursive ${sql.unsafe(WAITING_TENANTS)},
    due as (
      select e.*
        from waiting_tenants t
       cross join lateral (
             select * from runs r
              where r.tenant_id collate "C" = t.tenant_id and r.status = 'waiting'
                and r.run_after <= now()
              order by r.run_after
              limit ${limit}
                for update skip locked) e
       where t.tenant_id is not null
       limit ${limit}
    ),
    upd as (
      insert into runs select * from due
      on conflict (tenant_id, run_id) do update
         set status = 'queued',
             run_after = now(),
             wait_reason = null,
             wait_name = null,
             updated_at = now(),
             event_seq = runs.event_seq + 1
       where runs.status = 'waiting'
      returning runs.tenant_id, runs.run_id, runs.goal_id, runs.dispatch_key, runs.event_seq,
                runs.status, runs.run_after, runs.workflow_name, runs.workflow_version,
                runs.concurrency_key
    ),
    ${sql.unsafe(WOKEN_SLOTS)},
    ${sql.unsafe(WOKEN_LANES)},
    -- Two CTEs joined: no table is read, whatever the plan.
    woken as (
      select u.*, d.wait_reason as reason, d.wait_name as name
        from upd u join due d on d.tenant_id = u.tenant_id and d.run_id = u.run_id
    ),
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, event_seq, 'run.woken', goal_id, dispatch_key,
             ${sql.unsafe(WOKEN_BY_DEADLINE)}, now()
        from woken
    )
    select tenant_id, run_id, reason, name from woken`;
}
