/**
 * Fan-in (migration 028): a parent run waiting for its children (`result()`
 * of one child, `ctx.map` of many: worker/child_waits.ts).
 *
 * A parent waits for one *group* at a time: the call name of one child
 * (its dispatch key `child:<parent>:<name>`), or of a map, whose children
 * are `<name>#c<i>` (a `#` no caller's name has). `awaitChildren` counts the
 * group's unfinished children under the parent's row lock and suspends the
 * parent with that count (`children_awaited`), or says the wait is over.
 *
 * Every statement that makes a run final (db/attempt_end.ts, db/leases.ts,
 * db/cancellation.ts, `cancelChildren` here) appends `fanIn`: the same
 * statement counts its final children off their waiting parents and, at
 * the last one (or at a failure, with `failFast`), queues the parent with
 * `run.woken` `{by: 'child'}`. So a fan-in of 10,000 wakes its parent once,
 * in the transaction of the child that made it ready. The child's outcome
 * itself is its row (status, result, error), read on resume
 * (`selectChildOutcomes`), never copied into the parent's step results.
 *
 * No wake-up is lost: `fanIn` locks each parent's row FOR KEY SHARE and
 * reads its newest version, and `awaitChildren` locks it FOR UPDATE (which
 * conflicts with it) before it counts, in a snapshot of its own: either the
 * child's statement committed first and the count leaves it out, or the
 * parent was suspended first and the child's statement finds it waiting
 * (tests/db_fan_in_test.ts). KEY SHARE conflicts with nothing else a
 * running parent's statements take but FOR UPDATE: a parent whose children
 * end by the thousand is not kept from renewing its lease.
 */
import { inTransaction, type Sql } from "./pool.ts";
import { EVENT_COLUMNS, laneMoves, slotCountMoves } from "./queue_sql.ts";
import type { StepFence } from "./run_steps.ts";
import type { SuspendOutcome } from "./suspension.ts";
import { childFinishedAfterFanIn } from "./child_events.ts";
import {
  cancelledPayload,
  NULL_JSONB,
  NULL_TEXT,
  waitingPayload,
  wokenPayload,
} from "./event_payloads.ts";
import type { RunStatus } from "./runs.ts";

const FINAL = "('succeeded', 'failed', 'cancelled')";
// `child:` + a uuid + `:`: the child's call name starts after it.
const NAME_AT = 44;

/** A child's group: its call name without a map's `#c<i>`. */
const GROUP = `regexp_replace(substr(dispatch_key, ${NAME_AT}), '#c[0-9]+$', '')`;

const WOKEN_BY_CHILD = wokenPayload({
  by: "'child'::text",
  reason: "'children'::text",
  name: "wait_name",
  signal_id: NULL_TEXT,
});

/**
 * The CTEs every statement that may make runs final appends, after its
 * `source` CTE (returning tenant_id, run_id, parent_run_id, dispatch_key,
 * status, workflow_name, workflow_version, concurrency_key and the columns
 * the move expressions read): the fan-in of its final children into their
 * waiting parents (`fanin`, `fanin_ev`), then the concurrency counts and
 * lanes of the source's runs and of the parents woken, together (`moved`,
 * then slotCountMoves' and laneMoves' CTEs), so that no row of either is
 * updated twice by one statement. `running`, `queued` and `queuedAt` are
 * the source's own moves, per run, as slotCountMoves takes them.
 *
 * A parent in `source` itself is left out (a row is updated once per
 * statement); the parents are locked in key order (no deadlock between two
 * such statements).
 */
export function fanIn(
  source: string,
  running: string,
  queued: string,
  queuedAt = "null::timestamptz",
  options: { childFinished?: boolean } = {},
): string {
  const finished = options.childFinished === true;
  // With child.finished: each parent's finishing children here, all groups.
  const all = `coalesce((select c.n from fanin_counts c
                          where c.tenant_id = runs.tenant_id
                            and c.parent_run_id = runs.run_id), 0)`;
  // The finishing children of the parent's awaited group, as it is now (`runs`).
  const mine = (agg: string) =>
    `(select ${agg} from fanin_groups g
       where g.tenant_id = runs.tenant_id and g.parent_run_id = runs.run_id
         and g.grp = runs.wait_name)`;
  const n = mine("g.n");
  const wake = `(runs.children_awaited - ${n} <= 0
                 or (coalesce(runs.wait_fail_fast, false) and ${mine("g.failed")}))`;
  return `fanin_groups as (
      select tenant_id, parent_run_id, ${GROUP} as grp, count(*)::int as n,
             bool_or(status <> 'succeeded') as failed
        from ${source}
       where parent_run_id is not null and status in ${FINAL}
       group by 1, 2, 3
    ),${
    finished
      ? `
    fanin_counts as (
      select tenant_id, parent_run_id, sum(n)::int as n from fanin_groups group by 1, 2
    ),`
      : ""
  }
    -- Every parent, locked FOR KEY SHARE in key order, each by a probe of
    -- the primary key (a lateral subquery with a limit is never flattened
    -- into a join the planner could hash over a scan of runs). A suspend's
    -- FOR UPDATE (awaitChildren) and this lock wait for each other; a
    -- heartbeat or a signal does not (neither conflicts with it). The row
    -- read is its newest version: what the parent waits for now.
    fanin_parents as (
      select l.tenant_id, l.run_id, l.status, l.wait_reason
        from (select distinct tenant_id, parent_run_id from fanin_groups g
               where not exists (select 1 from ${source} s
                                  where s.tenant_id = g.tenant_id
                                    and s.run_id = g.parent_run_id)
               order by 1, 2) g
       cross join lateral (
             select p.tenant_id, p.run_id, p.status, p.wait_reason from runs p
              where p.tenant_id = g.tenant_id and p.run_id = g.parent_run_id
              limit 1
                for key share) l
    ),
    -- The waiting ones, upserted through their key: the update lands on the
    -- newest version whatever the statement's snapshot (updateThroughKey).
    fanin as (
      insert into runs
      select l.* from fanin_parents w
       cross join lateral (
             select p.* from runs p
              where p.tenant_id = w.tenant_id and p.run_id = w.run_id
              limit 1) l
       where w.status = 'waiting' and w.wait_reason = 'children'
       order by l.tenant_id, l.run_id
      on conflict (tenant_id, run_id) do update
         set children_awaited = runs.children_awaited - ${n},
             status = case when ${wake} then 'queued' else runs.status end,
             run_after = case when ${wake} then now() else runs.run_after end,
             wait_reason = case when ${wake} then null else runs.wait_reason end,
             wait_fail_fast = case when ${wake} then null else runs.wait_fail_fast end,
             event_seq = runs.event_seq + ${
    finished ? `${all} + ` : ""
  }case when ${wake} then 1 else 0 end,
             updated_at = now()
       where runs.status = 'waiting' and runs.wait_reason = 'children' and ${n} is not null
      returning runs.tenant_id, runs.run_id, runs.goal_id, runs.dispatch_key, runs.event_seq,
                runs.status, runs.run_after, runs.wait_name, runs.workflow_name,
                runs.workflow_version, runs.concurrency_key${
    finished
      ? `,
                runs.event_seq - ${all} - case when runs.status = 'queued' then 1 else 0 end
                  as seq0`
      : ""
  }
    ),
    fanin_ev as (
      insert into work_events (${EVENT_COLUMNS})
      select tenant_id, run_id, event_seq, 'run.woken', goal_id, dispatch_key,
             ${WOKEN_BY_CHILD}, now()
        from fanin
       where status = 'queued'
    ),${finished ? childFinishedAfterFanIn(source) : ""}
    moved as (
      select tenant_id, workflow_name, workflow_version, concurrency_key,
             (${running})::int as d_running, (${queued})::int as d_queued,
             (${queuedAt})::timestamptz as queued_at
        from ${source}
      union all
      select tenant_id, workflow_name, workflow_version, concurrency_key, 0, 1, run_after
        from fanin
       where status = 'queued'
    ),
    ${slotCountMoves("moved", "d_running", "d_queued", "queued_at")},
    ${laneMoves("moved", "queued_at")}`;
}

const WAITING_FOR_CHILDREN = waitingPayload({
  attempt: "a.attempt",
  reason: "'children'::text",
  name: "a.grp",
  step: "a.grp",
  until: "null::timestamptz",
});

/** The dispatch key of `group`'s one child, and the prefix of a map's children's. */
function groupOf(parentRunId: string, group: string) {
  const key = `child:${parentRunId}:${group}`;
  return { key, prefix: `${key}#c` };
}

/**
 * Suspends the parent run `f`'s attempt holds until the children of
 * `group` are final (or, `failFast`, one of them failed; or, with `slack`,
 * until all but `slack` of its unfinished ones are: a map refilling up to
 * its `concurrency`): `waiting` with
 * reason `children`, `children_awaited` the group's unfinished children,
 * given back all a suspend gives back (db/suspension.ts), with
 * `run.waiting`. `ready` when there is nothing to wait for (none
 * unfinished, or a failure with `failFast`); `lost`, `cancel-requested` as
 * `suspendRun`. The count is taken in a statement after the row lock (see
 * the module comment).
 */
export async function awaitChildren(
  sql: Sql,
  f: StepFence,
  wait: { group: string; failFast: boolean; slack?: number },
): Promise<SuspendOutcome> {
  const { key, prefix } = groupOf(f.run_id, wait.group);
  return await inTransaction(sql, async (t) => {
    const [held] = await t<{ cancel_requested: boolean }[]>`
      select cancel_requested_at is not null as cancel_requested from runs
       where tenant_id = ${f.tenant_id} and run_id = ${f.run_id}
         and lease_owner = ${f.owner} and attempts = ${f.attempt} and status = 'running'
         for update`;
    if (!held) return "lost" as const;
    if (held.cancel_requested) return "cancel-requested" as const;
    const [row] = await t<{ n: number }[]>`
      with a as (select ${f.attempt}::int as attempt, ${wait.group}::text as grp),
      kids as (
        select count(*) filter (where c.status not in ${t.unsafe(FINAL)})::int as open,
               coalesce(bool_or(c.status in ('failed', 'cancelled')), false) as failed
          from runs c
         where c.tenant_id collate "C" = ${f.tenant_id} and c.parent_run_id = ${f.run_id}
           and c.parent_run_id is not null
           and (c.dispatch_key = ${key} or starts_with(c.dispatch_key, ${prefix}))
      ),
      upd as (
        update runs
           set status = 'waiting',
               attempts = greatest(attempts - 1, 0),
               lease_owner = null,
               lease_expires_at = null,
               run_after = 'infinity',
               wait_reason = 'children',
               wait_name = ${wait.group},
               children_awaited = (select open from kids) - ${wait.slack ?? 0}::int,
               wait_fail_fast = ${wait.failFast},
               updated_at = now(),
               event_seq = event_seq + 1
         where tenant_id = ${f.tenant_id} and run_id = ${f.run_id}
           and lease_owner = ${f.owner} and attempts = ${f.attempt} and status = 'running'
           and (select open from kids) - ${wait.slack ?? 0}::int > 0
           and not (${wait.failFast}::boolean and (select failed from kids))
        returning tenant_id, run_id, goal_id, dispatch_key, event_seq, workflow_name,
                  concurrency_key
      ),
      ${t.unsafe(slotCountMoves("upd", "-1", "0"))},
      ev as (
        insert into work_events (${t.unsafe(EVENT_COLUMNS)})
        select u.tenant_id, u.run_id, u.event_seq, 'run.waiting', u.goal_id, u.dispatch_key,
               ${t.unsafe(WAITING_FOR_CHILDREN)}, now()
          from upd u cross join a
      )
      select count(*)::int as n from upd`;
    return row.n > 0 ? "suspended" as const : "ready" as const;
  });
}

/** Where a map's children stand (`childGroupState`). */
export interface ChildGroupState {
  /** Children admitted so far. */
  admitted: number;
  /** Of them, not final. */
  open: number;
  /** One of them failed or was cancelled. */
  failed: boolean;
  /** The highest `<i>` of `<name>#c<i>` admitted; -1: none. */
  last: number;
}

/**
 * How many of a map's children (`<group>#c<i>`) are admitted, how many are
 * unfinished, whether one failed: counts only, one range of
 * runs_parent_idx, what a map with `concurrency` reads to admit the next.
 */
export async function childGroupState(
  sql: Sql,
  tenantId: string,
  parentRunId: string,
  group: string,
): Promise<ChildGroupState> {
  const { prefix } = groupOf(parentRunId, group);
  const [row] = await sql<ChildGroupState[]>`
    select count(*)::int as admitted,
           count(*) filter (where c.status not in ${sql.unsafe(FINAL)})::int as open,
           coalesce(bool_or(c.status in ('failed', 'cancelled')), false) as failed,
           coalesce(max(substr(c.dispatch_key, ${prefix.length + 1})::int), -1) as last
      from runs c
     where c.tenant_id collate "C" = ${tenantId} and c.parent_run_id = ${parentRunId}
       and c.parent_run_id is not null and starts_with(c.dispatch_key, ${prefix})`;
  return row;
}

/** A child as its parent reads it on resume. */
export interface ChildOutcome {
  run_id: string;
  /** Its call name in the parent (`invoice`, `m#c12`). */
  name: string;
  status: RunStatus;
  result: unknown;
  error: unknown;
  workflow_name: string;
  workflow_version: number;
}

/**
 * The children of `group` of a parent (one, or a map's), with their
 * outcomes: one range of runs_parent_idx (migration 025), filtered by key.
 */
export async function selectChildOutcomes(
  sql: Sql,
  tenantId: string,
  parentRunId: string,
  group: string,
): Promise<ChildOutcome[]> {
  const { key, prefix } = groupOf(parentRunId, group);
  return await sql<ChildOutcome[]>`
    select run_id, substr(dispatch_key, ${NAME_AT}) as name, status, result, error,
           workflow_name, workflow_version
      from runs c
     where c.tenant_id collate "C" = ${tenantId} and c.parent_run_id = ${parentRunId}
       and c.parent_run_id is not null
       and (c.dispatch_key = ${key} or starts_with(c.dispatch_key, ${prefix}))`;
}

/** A child by its run id, for `result()`: its outcome, or undefined (no such child). */
export async function selectChild(
  sql: Sql,
  tenantId: string,
  parentRunId: string,
  childRunId: string,
): Promise<ChildOutcome | undefined> {
  const [row] = await sql<(ChildOutcome & { parent_run_id: string | null })[]>`
    select run_id, substr(dispatch_key, ${NAME_AT}) as name, status, result, error,
           workflow_name, workflow_version, parent_run_id
      from runs
     where tenant_id = ${tenantId} and run_id = ${childRunId}`;
  // Checked here, not in the statement: the primary key's probe, not the
  // parent's index range, whatever the planner would make of both.
  if (!row || row.parent_run_id !== parentRunId) return undefined;
  const { parent_run_id: _, ...child } = row;
  return child;
}

// A queued child leaves its group's queue; a waiting one was in no count.
const CANCELLED_CHILDREN_MOVES = fanIn(
  "upd",
  "0",
  "case when was_queued then -1 else 0 end",
  undefined,
  { childFinished: true },
);
const CANCELLED_CHILD = cancelledPayload({
  attempt: "attempts",
  requested_at: "cancel_requested_at",
  error: NULL_JSONB,
  reason: "'fail-fast'::text",
  worker: NULL_TEXT,
});

/**
 * `failFast`: cancels the unfinished children of `group` as a cancel does
 * (db/cancellation.ts): queued or waiting ones become `cancelled` at once
 * (`run.cancelled`, reason `fail-fast`), running ones get
 * `cancel_requested_at` (their workers end them). Returns the running ones
 * asked (to NOTIFY their workers).
 */
export async function cancelChildren(
  sql: Sql,
  tenantId: string,
  parentRunId: string,
  group: string,
): Promise<string[]> {
  const { key, prefix } = groupOf(parentRunId, group);
  const rows = await sql<{ run_id: string; status: RunStatus }[]>`
    with picked as (
      select c.* from runs c
       where c.tenant_id collate "C" = ${tenantId} and c.parent_run_id = ${parentRunId}
         and c.parent_run_id is not null
         and (c.dispatch_key = ${key} or starts_with(c.dispatch_key, ${prefix}))
         and (c.status in ('queued', 'waiting')
              or (c.status = 'running' and c.cancel_requested_at is null))
       order by c.tenant_id, c.run_id
    ),
    upd as (
      insert into runs select * from picked
      on conflict (tenant_id, run_id) do update
         set status = case when runs.status in ('queued', 'waiting') then 'cancelled'
                           else runs.status end,
             cancel_requested_at = coalesce(runs.cancel_requested_at, now()),
             finished_at = case when runs.status in ('queued', 'waiting') then now()
                                else runs.finished_at end,
             updated_at = now(),
             event_seq = runs.event_seq + case when runs.status in ('queued', 'waiting')
                                               then 1 else 0 end
       where runs.status in ('queued', 'waiting')
          or (runs.status = 'running' and runs.cancel_requested_at is null)
      returning runs.tenant_id, runs.run_id, runs.parent_run_id, runs.goal_id,
                runs.dispatch_key, runs.event_seq, runs.status, runs.attempts,
                runs.cancel_requested_at, runs.workflow_name, runs.workflow_version,
                runs.concurrency_key, runs.run_after,
                (runs.status = 'cancelled' and runs.wait_reason is null) as was_queued
    ),
    ${sql.unsafe(CANCELLED_CHILDREN_MOVES)},
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, event_seq, 'run.cancelled', goal_id, dispatch_key,
             ${sql.unsafe(CANCELLED_CHILD)}, now()
        from upd
       where status = 'cancelled'
    )
    select run_id, status from upd`;
  return rows.filter((r) => r.status === "running").map((r) => r.run_id);
}
