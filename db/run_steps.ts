/**
 * A run's durable calls (migration 021, `run_steps`): `ctx.step`,
 * `ctx.sleep` and `ctx.waitForSignal` (worker/durable_context.ts). Each
 * write is one statement fenced as every write of an attempt is (owner,
 * attempt, `running`: db/queue_sql.ts): it updates the run's row first
 * (taking its lock, so a reclaim or a suspend is ordered before or after
 * it) and writes the step row only from that update, so an attempt that
 * lost its lease writes nothing. A write that ends a call appends its event
 * (`step.completed`, `step.failed`) in the same statement, under the run's
 * next `seq`. Signal waits are in db/signals.ts.
 */
import type { Sql } from "./pool.ts";
import { EVENT_COLUMNS } from "./queue_sql.ts";
import {
  NULL_BOOLEAN,
  NULL_INT,
  NULL_TEXT,
  NULL_TIMESTAMP,
  stepCompletedPayload,
  stepFailedPayload,
} from "./event_payloads.ts";

// The events, from the columns of the statements' CTEs: `u` the fenced run
// (`upd`), `a` the call's own values, `d` a sleep's end.
const STEP_COMPLETED = stepCompletedPayload({
  name: "a.name",
  seq: "a.seq",
  kind: "'step'::text",
  size: "a.size",
  attempt: "u.attempts",
  duration_ms: "a.duration_ms",
  until: NULL_TIMESTAMP,
  signal_id: NULL_TEXT,
  timed_out: NULL_BOOLEAN,
});
const SLEEP_COMPLETED = stepCompletedPayload({
  name: "a.name",
  seq: "a.seq",
  kind: "'sleep'::text",
  size: "0",
  attempt: "u.attempts",
  duration_ms: NULL_INT,
  until: "d.until",
  signal_id: NULL_TEXT,
  timed_out: NULL_BOOLEAN,
});
const STEP_FAILED = stepFailedPayload({
  name: "a.name",
  seq: "a.seq",
  attempt: "u.attempts",
  tries: "a.tries",
  error: "a.error",
});

/** Who writes: the attempt holding the run's lease (the fencing token). */
export interface StepFence {
  tenant_id: string;
  run_id: string;
  /** The worker's lease owner id. */
  owner: string;
  attempt: number;
}

/** What a durable call is. */
export type StepKind = "step" | "sleep" | "signal";

/** A stored durable call, as an attempt replays it. */
export interface StoredStep {
  name: string;
  seq: number;
  kind: StepKind;
  status: "waiting" | "completed" | "failed";
  result: unknown;
  /** A sleep's end or a wait's timeout (null: none). */
  until: Date | null;
}

/**
 * The CTE `upd`: the fenced run row, its event seq moved by `bump` (an SQL
 * expression, 0 or 1), returning what an event and a step row need. Empty
 * when `f`'s attempt no longer holds the lease.
 */
function fencedRun(sql: Sql, f: StepFence, bump: ReturnType<Sql>) {
  return sql`upd as (
      update runs set event_seq = event_seq + ${bump}, updated_at = now()
       where tenant_id = ${f.tenant_id} and run_id = ${f.run_id}
         and lease_owner = ${f.owner} and attempts = ${f.attempt} and status = 'running'
      returning tenant_id, run_id, goal_id, dispatch_key, event_seq, attempts
    )`;
}

/**
 * Every durable call of a run, in call order, with its result: what an
 * attempt replays. One range of the primary key.
 */
export async function loadSteps(sql: Sql, tenantId: string, runId: string): Promise<StoredStep[]> {
  return await sql<StoredStep[]>`
    select name, seq, kind, status, result, until from run_steps
     where tenant_id = ${tenantId} and run_id = ${runId}
     order by seq`;
}

/** How a step write went. */
export type StepWrite = "written" | "stored" | "lost";

/**
 * Stores step `name`'s result (`resultJson`, JSON text of `size` bytes) as
 * completed, with `step.completed` (`kind` `step`, its `duration_ms`).
 * `stored` when this attempt had stored it already (a retry
 * of a write whose reply was lost): nothing is written twice. `lost`: the
 * attempt no longer holds the lease, nothing was written.
 */
export async function completeStep(
  sql: Sql,
  f: StepFence,
  step: { name: string; seq: number; resultJson: string; size: number; durationMs: number },
): Promise<StepWrite> {
  // The step already completed by this attempt: the update matches nothing.
  const notYet = sql`not exists (
      select 1 from run_steps s
       where s.tenant_id = ${f.tenant_id} and s.run_id = ${f.run_id} and s.name = ${step.name}
         and s.status = 'completed')`;
  const [row] = await sql<{ written: number; stored: number }[]>`
    with a as (
      select ${step.name}::text as name, ${step.seq}::int as seq, ${step.size}::int as size,
             ${Math.round(step.durationMs)}::int as duration_ms
    ),
    ${fencedRun(sql, f, sql`case when ${notYet} then 1 else 0 end`)},
    st as (
      insert into run_steps (tenant_id, run_id, name, seq, kind, status, result, size, attempt,
                             started_at, completed_at)
      select tenant_id, run_id, ${step.name}, ${step.seq}, 'step', 'completed',
             ${step.resultJson}::text::jsonb, ${step.size}, attempts,
             now() - ${step.durationMs}::float8 * interval '1 millisecond', now()
        from upd
       where ${notYet}
      on conflict (tenant_id, run_id, name) do update
         set status = 'completed', result = excluded.result, size = excluded.size, error = null,
             attempt = excluded.attempt, updated_at = now(), completed_at = now()
       where run_steps.status <> 'completed'
      returning 1
    ),
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select u.tenant_id, u.run_id, u.event_seq, 'step.completed', u.goal_id, u.dispatch_key,
             ${sql.unsafe(STEP_COMPLETED)}, now()
        from upd u cross join a
       where ${notYet}
    )
    select (select count(*) from st)::int as written,
           (select count(*) from upd)::int as stored`;
  return row.written > 0 ? "written" : row.stored > 0 ? "stored" : "lost";
}

/**
 * Records that step `name` threw on its last try (`error`, bounded by the
 * caller): the row says `failed` (a later attempt calls it again) and
 * `step.failed` `{name, seq, attempt, tries, error}` is appended. False when
 * the attempt no longer holds the lease.
 */
export async function failStep(
  sql: Sql,
  f: StepFence,
  step: { name: string; seq: number; tries: number; error: unknown },
): Promise<boolean> {
  const error = sql.json(JSON.parse(JSON.stringify(step.error ?? null)));
  const [row] = await sql<{ n: number }[]>`
    with a as (
      select ${step.name}::text as name, ${step.seq}::int as seq, ${step.tries}::int as tries,
             ${error}::jsonb as error
    ),
    ${fencedRun(sql, f, sql`1`)},
    st as (
      insert into run_steps (tenant_id, run_id, name, seq, kind, status, error, attempt)
      select tenant_id, run_id, ${step.name}, ${step.seq}, 'step', 'failed', ${error}::jsonb,
             attempts
        from upd
      on conflict (tenant_id, run_id, name) do update
         set status = 'failed', error = excluded.error, attempt = excluded.attempt,
             updated_at = now()
       where run_steps.status <> 'completed'
    ),
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select u.tenant_id, u.run_id, u.event_seq, 'step.failed', u.goal_id, u.dispatch_key,
             ${sql.unsafe(STEP_FAILED)}, now()
        from upd u cross join a
    )
    select count(*)::int as n from upd`;
  return row.n > 0;
}

/** Where a sleep stands after `settleSleep`. */
export interface SleepState {
  /** Its end, computed once (the first call), by Postgres' clock. */
  until: Date;
  /** Postgres' clock now: the time left is `until - now`, free of this host's clock. */
  now: Date;
  /** Its end has come: the sleep is completed (now, or before). */
  done: boolean;
  /** false: the attempt no longer holds the lease, nothing was written. */
  held: boolean;
}

/**
 * A sleep's row: made on its first call with its end (`until`, or now +
 * `ms`: the end is computed once and stored, so a replay sleeps only what is
 * left), then completed, with `step.completed` (`kind` `sleep`, its
 * `until`), by the first call that finds its end has come.
 */
export async function settleSleep(
  sql: Sql,
  f: StepFence,
  step: { name: string; seq: number; ms?: number; until?: Date },
): Promise<SleepState> {
  const end = sql`coalesce(
      (select s.until from run_steps s
        where s.tenant_id = ${f.tenant_id} and s.run_id = ${f.run_id} and s.name = ${step.name}),
      ${step.until ?? null}::timestamptz,
      now() + ${step.ms ?? 0}::float8 * interval '1 millisecond')`;
  const [row] = await sql<{ until: Date; now: Date; done: boolean; held: boolean }[]>`
    with d as (select ${end} as until),
    a as (select ${step.name}::text as name, ${step.seq}::int as seq),
    ${fencedRun(sql, f, sql`case when (select until from d) <= now() then 1 else 0 end`)},
    st as (
      insert into run_steps (tenant_id, run_id, name, seq, kind, status, until, size, attempt,
                             completed_at)
      select u.tenant_id, u.run_id, ${step.name}, ${step.seq}, 'sleep',
             case when d.until <= now() then 'completed' else 'waiting' end, d.until, 0,
             u.attempts, case when d.until <= now() then now() end
        from upd u cross join d
      on conflict (tenant_id, run_id, name) do update
         set status = excluded.status, attempt = excluded.attempt, updated_at = now(),
             completed_at = excluded.completed_at
       where run_steps.status <> 'completed'
    ),
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select u.tenant_id, u.run_id, u.event_seq, 'step.completed', u.goal_id, u.dispatch_key,
             ${sql.unsafe(SLEEP_COMPLETED)}, now()
        from upd u cross join d cross join a
       where d.until <= now()
    )
    select d.until, now() as now, d.until <= now() as done, exists (select 1 from upd) as held
      from d`;
  return row;
}

/** A durable call as `GET /v1/runs/{id}` shows it: no result, which may be large. */
export interface StepSummary {
  name: string;
  seq: number;
  kind: StepKind;
  status: "waiting" | "completed" | "failed";
  /** The result's size as JSON (bytes). */
  size: number | null;
  until: Date | null;
  signal_name: string | null;
  attempt: number;
  /** The last error's message, cut to 1,000 characters. */
  error_message: string | null;
  started_at: Date;
  completed_at: Date | null;
}

/** Most steps `GET /v1/runs/{id}` lists. */
export const MAX_LISTED_STEPS = 1000;

/**
 * A run's first `limit` durable calls in call order, without results (one
 * range of the primary key).
 */
export async function selectStepSummaries(
  sql: Sql,
  tenantId: string,
  runId: string,
  limit = MAX_LISTED_STEPS,
): Promise<StepSummary[]> {
  return await sql<StepSummary[]>`
    select name, seq, kind, status, size, until, signal_name, attempt,
           left(error ->> 'message', 1000) as error_message, started_at, completed_at
      from run_steps
     where tenant_id = ${tenantId} and run_id = ${runId}
     order by seq
     limit ${limit}`;
}
