/**
 * The durable workflow's side effects, and what the checks read of its
 * runs. Each call of a step's function inserts one row into
 * `chaos_step_calls` of the chaos database, through a connection of its
 * own (not poimen's), with a plain INSERT: a step called again is a second
 * row, never merged away. The checks (dev/chaos/verdict_durable.ts) hold
 * the calls against the steps poimen stored (`run_steps`) and the events it
 * wrote. The harness' own queries, as in dev/chaos/observe.ts.
 */
import type { Sql } from "../../db/pool.ts";

/** Creates the calls table (before any run of the durable workflow is admitted). */
export async function createStepCalls(sql: Sql): Promise<void> {
  // No unique key on purpose: a second call of a step must stay visible.
  await sql`
    create table if not exists chaos_step_calls (
      id       bigint generated always as identity primary key,
      run_id   uuid not null,
      step     text not null,
      step_key text not null,
      attempt  integer not null,
      at       timestamptz not null default clock_timestamp()
    )`;
}

/** Records one call of a step's function; returns its id (the step's result). */
export async function insertStepCall(
  sql: Sql,
  call: { runId: string; step: string; stepKey: string; attempt: number },
): Promise<number> {
  const [row] = await sql<{ id: string }[]>`
    insert into chaos_step_calls (run_id, step, step_key, attempt)
    values (${call.runId}, ${call.step}, ${call.stepKey}, ${call.attempt})
    returning id`;
  return Number(row.id);
}

/** One call of a step's function, as recorded. */
export interface StepCall {
  id: number;
  step: string;
  attempt: number;
  /** Milliseconds since the epoch, by Postgres' clock. */
  at: number;
}

/** One durable call poimen stored for a run (a `run_steps` row). */
export interface StoredStep {
  name: string;
  kind: string;
  status: string;
  result: unknown;
  /** A sleep's end (ms since the epoch); null: none. */
  until: number | null;
  /** When its result was stored (ms since the epoch); null: not yet. */
  completedAt: number | null;
}

/** A run of the durable workflow, with everything the checks hold against each other. */
export interface DurableRun {
  tenant: string;
  runId: string;
  dispatchKey: string | null;
  status: string;
  result: unknown;
  steps: StoredStep[];
  calls: StepCall[];
  /** Its `run.waiting` and `run.woken` events: how often it was suspended and woken. */
  suspended: number;
  woken: number;
}

/** Every run of `workflow`, with its stored steps, its step calls and its suspensions. */
export async function selectDurableRuns(sql: Sql, workflow: string): Promise<DurableRun[]> {
  const rows = await sql<
    {
      tenant_id: string;
      run_id: string;
      dispatch_key: string | null;
      status: string;
      result: unknown;
      steps: StoredStep[] | null;
      calls: StepCall[] | null;
      suspended: number;
      woken: number;
    }[]
  >`
    select r.tenant_id, r.run_id, r.dispatch_key, r.status, r.result,
           (select jsonb_agg(jsonb_build_object(
                     'name', s.name, 'kind', s.kind, 'status', s.status, 'result', s.result,
                     'until', extract(epoch from s.until) * 1000,
                     'completedAt', extract(epoch from s.completed_at) * 1000)
                     order by s.seq)
              from run_steps s
             where s.tenant_id = r.tenant_id and s.run_id = r.run_id) as steps,
           (select jsonb_agg(jsonb_build_object(
                     'id', c.id, 'step', c.step, 'attempt', c.attempt,
                     'at', extract(epoch from c.at) * 1000) order by c.id)
              from chaos_step_calls c where c.run_id = r.run_id) as calls,
           (select count(*) from work_events e
             where e.tenant_id = r.tenant_id and e.run_id = r.run_id
               and e.type = 'run.waiting')::int as suspended,
           (select count(*) from work_events e
             where e.tenant_id = r.tenant_id and e.run_id = r.run_id
               and e.type = 'run.woken')::int as woken
      from runs r
     where r.workflow_name = ${workflow}`;
  return rows.map((r) => ({
    tenant: r.tenant_id,
    runId: r.run_id,
    dispatchKey: r.dispatch_key,
    status: r.status,
    result: r.result,
    steps: (r.steps ?? []).map((s) => ({
      ...s,
      until: s.until === null ? null : Number(s.until),
      completedAt: s.completedAt === null ? null : Number(s.completedAt),
    })),
    calls: (r.calls ?? []).map((c) => ({ ...c, id: Number(c.id), at: Number(c.at) })),
    suspended: r.suspended,
    woken: r.woken,
  }));
}
