/**
 * A child run's life on its parent's timeline (issue 31): `child.started`
 * when a child is admitted (`noteChildrenStarted`, in the admission's
 * transaction) and `child.finished` when one becomes final
 * (`childFinishedMoves`, a CTE fragment for the statement that makes it
 * final). Each appends to the PARENT's events, under the parent's row lock
 * (its `event_seq` is bumped by the update that takes it).
 */
import type { Sql } from "./pool.ts";
import { EVENT_COLUMNS } from "./queue_sql.ts";
import { childFinishedPayload, childStartedPayload } from "./event_payloads.ts";
import { CHILD_KEY_PREFIX } from "../contracts/runs.ts";

// The call's name in the parent: the child's key is `child:<parent uuid>:<name>`.
const nameOf = (alias: string) =>
  `substr(${alias}.dispatch_key, ${CHILD_KEY_PREFIX.length + 36 + 2})`;

/** What a statement embedding `childFinishedMoves` adds to its parents' one update. */
export interface ChildFinishedOptions {
  /**
   * More `col = expr` assignments for the parent's update (the fan-in's
   * count of unfinished children, a wake-up…), in terms of `p` (the parent
   * as it was) and `f` (per parent: `n` children finishing here, `n_failed`,
   * `n_cancelled`). One update per parent row per statement: whatever else
   * the statement does to the parent must go here.
   */
  set?: string;
  /**
   * More columns `child_parents` returns (`p.…` as updated, `f.…`), for the
   * statement's later CTEs.
   */
  returning?: string;
}

/**
 * CTEs appending `child.finished` to the parent of each child in `source`
 * (a CTE of the statement, with `tenant_id`, `run_id`, `parent_run_id`,
 * `dispatch_key` and the child's final `status`; rows with no parent are
 * skipped): one update per parent, its `event_seq` raised by its number of
 * children finishing here, then the events, numbered under that lock.
 *
 * The one SQL of "a child became final": a statement that ends runs
 * (cancel, completion, failure) embeds it after its update, its `source`
 * the final rows it returned. The parent must not be updated by another
 * CTE of the same statement (Postgres applies only one update to a row per
 * statement): what else the statement changes on the parent goes in
 * `options.set`; a parent made final by the same statement as its child
 * cannot be (a cancel's cascade makes them final in two statements, see
 * db/cascade.ts). The CTEs are named `child_parents` and `child_finished`.
 */
export function childFinishedMoves(source: string, options: ChildFinishedOptions = {}): string {
  const payload = childFinishedPayload({
    run_id: "s.run_id",
    name: nameOf("s"),
    status: "s.status",
  });
  return `child_parents as (
      update runs p
         set event_seq = p.event_seq + f.n${options.set ? `,\n             ${options.set}` : ""}
        from (select tenant_id, parent_run_id, count(*)::int as n,
                     (count(*) filter (where status = 'failed'))::int as n_failed,
                     (count(*) filter (where status = 'cancelled'))::int as n_cancelled
                from ${source}
               where parent_run_id is not null
               group by 1, 2) f
       where p.tenant_id = f.tenant_id and p.run_id = f.parent_run_id
      returning p.tenant_id, p.run_id, p.event_seq - f.n as seq0, p.goal_id, p.dispatch_key${
    options.returning ? `, ${options.returning}` : ""
  }
    ),
    child_finished as (
      insert into work_events (${EVENT_COLUMNS})
      select cp.tenant_id, cp.run_id,
             cp.seq0 + row_number() over (partition by cp.run_id order by s.run_id),
             'child.finished', cp.goal_id, cp.dispatch_key, ${payload}, now()
        from ${source} s
        join child_parents cp on cp.tenant_id = s.tenant_id and cp.run_id = s.parent_run_id
    )`;
}

/**
 * `fanIn`'s `child.finished` (db/child_events.ts' event, here for the
 * statements that also deliver children to their waiting parents): one
 * update per parent row per statement, so a parent `fanin` updated (its
 * `event_seq` raised there by its finishing children too, before its
 * `run.woken`) is left out of `fanin_child_parents`, which raises the
 * others'. A parent in `source` itself gets none (its own row is the
 * source's; no caller ends a parent and its child in one statement).
 */
export function childFinishedAfterFanIn(source: string): string {
  const payload = childFinishedPayload({
    run_id: "s.run_id",
    name: nameOf("s"),
    status: "s.status",
  });
  return `
    fanin_child_parents as (
      update runs p
         set event_seq = p.event_seq + c.n
        from fanin_counts c
       where p.tenant_id = c.tenant_id and p.run_id = c.parent_run_id
         and not exists (select 1 from ${source} s
                          where s.tenant_id = p.tenant_id and s.run_id = p.run_id)
         and not exists (select 1 from fanin x
                          where x.tenant_id = p.tenant_id and x.run_id = p.run_id)
      returning p.tenant_id, p.run_id, p.event_seq - c.n as seq0, p.goal_id, p.dispatch_key
    ),
    fanin_child_ev as (
      insert into work_events (${EVENT_COLUMNS})
      select cp.tenant_id, cp.run_id,
             cp.seq0 + row_number() over (partition by cp.run_id order by s.run_id),
             'child.finished', cp.goal_id, cp.dispatch_key, ${payload}, now()
        from ${source} s
        join (select tenant_id, run_id, seq0, goal_id, dispatch_key from fanin
              union all
              select tenant_id, run_id, seq0, goal_id, dispatch_key from fanin_child_parents) cp
          on cp.tenant_id = s.tenant_id and cp.run_id = s.parent_run_id
       where s.status in ('succeeded', 'failed', 'cancelled')
    ),`;
}

const STARTED = childStartedPayload({
  run_id: "c.run_id",
  name: nameOf("c"),
  workflow: "c.workflow_name",
  workflow_version: "c.workflow_version",
  detached: "c.detached",
});

/** A child the admission statement just created, as `noteChildrenStarted` reads it. */
export interface StartedChild {
  run_id: string;
  parent_run_id: string;
  detached: boolean;
}

/**
 * Locks runs `runIds` of one tenant (FOR NO KEY UPDATE, as an update
 * does), in run id order: two admission batches of children of the same
 * parents (a worker runs two flushes at once) then take the parents' locks
 * in one order and cannot deadlock, which one UPDATE over them would not
 * promise (its join decides its order).
 */
export async function lockParents(sql: Sql, tenantId: string, runIds: string[]): Promise<void> {
  await sql`select run_id from runs
             where tenant_id = ${tenantId} and run_id = any(${runIds}::uuid[])
             order by run_id
               for no key update`;
}

/**
 * Appends `child.started` to the parents of children just created, in the
 * admission's transaction (the children must be visible to it: inserted by
 * an earlier statement of the same transaction), one update per parent.
 * The update is also the parent's row lock: a cancel of the parent
 * (db/cascade.ts) waits for this transaction, then sees its children; a
 * cancel that committed first is seen here. Returns the parents found
 * closed to new children: cancel requested, or final. The caller cancels
 * those parents' non-detached new children, in the same transaction.
 */
export async function noteChildrenStarted(
  sql: Sql,
  tenantId: string,
  children: StartedChild[],
): Promise<string[]> {
  if (children.length === 0) return [];
  const ids = children.map((c) => c.run_id);
  await lockParents(sql, tenantId, [...new Set(children.map((c) => c.parent_run_id))]);
  const rows = await sql<{ run_id: string; closed: boolean }[]>`
    with c as (
      select run_id, parent_run_id, dispatch_key, workflow_name, workflow_version, detached,
             tenant_id
        from runs
       where tenant_id = ${tenantId} and run_id = any(${ids}::uuid[])
    ),
    par as (
      update runs p
         set event_seq = p.event_seq + f.n
        from (select parent_run_id, count(*)::int as n from c
               where parent_run_id is not null
               group by 1) f
       where p.tenant_id = ${tenantId} and p.run_id = f.parent_run_id
      returning p.tenant_id, p.run_id, p.event_seq - f.n as seq0, p.goal_id, p.dispatch_key,
                (p.cancel_requested_at is not null
                 or p.status in ('succeeded', 'failed', 'cancelled')) as closed
    ),
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select par.tenant_id, par.run_id,
             par.seq0 + row_number() over (partition by par.run_id order by c.run_id),
             'child.started', par.goal_id, par.dispatch_key, ${sql.unsafe(STARTED)}, now()
        from c join par on par.run_id = c.parent_run_id
    )
    select run_id, closed from par`;
  return rows.filter((r) => r.closed).map((r) => r.run_id);
}
