/**
 * The admission of a run of a debounced workflow (migrations 032 and 033):
 * one statement per request, outside the group-commit batcher, so the
 * admissions of other workflows never pay for it. The request either
 * replays the run holding its dispatch key, creates a pending run for its
 * debounce key, or joins the pending run that holds it: one
 * `INSERT … ON CONFLICT … DO UPDATE` whose arbiter is the partial unique
 * index `runs_debounce_pending_uq`, so concurrent requests of one burst make
 * one run, never a check-then-insert. Times are the database's.
 */
import type { JSONValue, Sql } from "./pool.ts";
import { runColumns } from "./runs.ts";
import { EVENT_COLUMNS, laneMoves } from "./queue_sql.ts";
import { admittedPayload } from "./event_payloads.ts";
import { type AdmittedRow, HOLDER, type NewRun, SAME_BODY } from "./admission.ts";

const ADMITTED_LANES = laneMoves("created", "run_after");
const ADMITTED = admittedPayload({
  workflow_ref: "workflow_ref",
  workflow: "workflow_name",
  workflow_version: "workflow_version",
  source: "source",
  run_after: "run_after",
});

/** A debounced admission: the run as a new one would be, its debounce key and timing. */
export interface DebouncedRun extends NewRun {
  /** The text of the input's value at the version's debounce key (`""` without a key). */
  debounce_key: string;
  /** Milliseconds after this request that the run starts. */
  period_ms: number;
  /** Milliseconds after the burst's first request (the run's creation) that it starts at the latest. */
  max_wait_ms: number;
}

/** What a debounced admission returned. */
export interface DebouncedRow extends AdmittedRow {
  /** true: the request joined the pending run of its debounce key (input replaced, start moved). */
  debounced: boolean;
}

/**
 * Admits `run` of a debounced version; one row. A replay (a run holds the
 * dispatch key, or a request with it joined a run, in this statement's
 * snapshot) returns that run untouched.
 * Otherwise the run is inserted, due `period` from now; when a pending run
 * (queued, never claimed) holds the debounce key, that run takes the
 * request's input instead, and its start moves to `period` from now, never
 * past `maxWait` after its creation and never earlier than it was (a lane's
 * or group's due time is a lower bound of its runs', migration 016: a start
 * that only moves later keeps it one). The joined run keeps its first
 * request's dispatch key, goal, priority, concurrency group and source; a
 * joining request's own dispatch key is recorded (`debounce_joins`,
 * migration 032), and a later request with it replays the run it joined.
 *
 * A run taking the dispatch key in a transaction that committed after this
 * statement's snapshot makes it fail with a unique violation: the caller
 * runs it again, and the holder is then seen.
 */
export async function admitDebounced(sql: Sql, run: DebouncedRun): Promise<DebouncedRow> {
  const req = sql.json(run as unknown as JSONValue);
  const [row] = await sql<DebouncedRow[]>`
    with q as (
      select * from jsonb_to_record(${req}) as q(
        tenant_id text, run_id uuid, workflow_ref text, workflow_name text,
        workflow_version integer, input jsonb, goal_id text, dispatch_key text, source text,
        max_attempts integer, traceparent text, priority smallint, concurrency_key text,
        concurrency_limit integer, parent_run_id uuid, root_run_id uuid, debounce_key text,
        period_ms float8, max_wait_ms float8)
    ),
    -- The run holding the dispatch key, or the one a request with it joined.
    held as (
      select ${sql.unsafe(runColumns("r"))}, ${sql.unsafe(SAME_BODY)} as same_body
        from q cross join lateral (
              select * from ((${sql.unsafe(HOLDER)})
                             union all
                             (select r.* from debounce_joins j
                                join runs r on r.tenant_id = j.tenant_id and r.run_id = j.run_id
                               where j.tenant_id = q.tenant_id and j.dispatch_key = q.dispatch_key
                               limit 1)) h
               limit 1) r
    ),
    ins as (
      insert into runs (tenant_id, run_id, workflow_ref, workflow_name,
                        workflow_version, input, goal_id, dispatch_key, source, max_attempts,
                        run_after, traceparent, priority, concurrency_key, parent_run_id,
                        root_run_id, debounce_key)
      select tenant_id, run_id, workflow_ref, workflow_name, workflow_version,
             coalesce(input, 'null'::jsonb), goal_id, dispatch_key, source, max_attempts,
             now() + period_ms * interval '1 millisecond', traceparent, coalesce(priority, 0),
             concurrency_key, parent_run_id, root_run_id, debounce_key
        from q
       where not exists (select 1 from held)
      on conflict (tenant_id collate "C", workflow_name, workflow_version, debounce_key)
         where debounce_key is not null and status = 'queued' and started_at is null
      do update
         set input = excluded.input,
             run_after = greatest(runs.run_after, least(excluded.run_after,
               runs.created_at + (select max_wait_ms from q) * interval '1 millisecond')),
             updated_at = now()
      returning runs.*, runs.xmax = 0 as created
    ),
    created as (select * from ins where created),
    -- A joining request's own key, so that sending it again is a replay. A
    -- row left by a run retention deleted is taken over.
    joins as (
      insert into debounce_joins (tenant_id, dispatch_key, run_id)
      select i.tenant_id, q.dispatch_key, i.run_id
        from ins i cross join q
       where not i.created and q.dispatch_key is not null
      on conflict (tenant_id, dispatch_key) do update set run_id = excluded.run_id
    ),
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, 1, 'run.admitted', goal_id, dispatch_key,
             ${sql.unsafe(ADMITTED)}, created_at
        from created
    ),
    -- A created limited run is queued in its group, as insertRuns does.
    groups as (
      insert into concurrency_slots (tenant_id, workflow_name, concurrency_key, max_running,
                                     queued, due_at)
      select c.tenant_id, c.workflow_name, c.concurrency_key, q.concurrency_limit, 1, c.run_after
        from created c cross join q
       where c.concurrency_key is not null
      on conflict (tenant_id, workflow_name, concurrency_key) do update
         set queued = concurrency_slots.queued + excluded.queued,
             max_running = excluded.max_running,
             due_at = least(concurrency_slots.due_at, excluded.due_at)
    ),
    ${sql.unsafe(ADMITTED_LANES)}
    select ${sql.unsafe(runColumns("r"))}, 0 as i, r.created, true as same_body,
           not r.created as debounced
      from ins r
    union all
    select ${sql.unsafe(runColumns("h"))}, 0, false, h.same_body, false from held h`;
  return row;
}
