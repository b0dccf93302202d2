/**
 * The schedules' statements (migrations 027, 034). Every one names its
 * tenant but `claimDueSchedules`, the tickers' range of schedules_due_idx
 * across tenants (a row per schedule, never per run), and
 * `syncDeclaredSchedules`, a workflow's declared schedules in every tenant.
 */
import type { JSONValue, Sql } from "./pool.ts";
import { NAME_LOCK_CLASS } from "./catalog.ts";

/** A schedule as stored. */
export interface ScheduleRow {
  tenant_id: string;
  schedule_id: string;
  workflow_ref: string;
  cron: string;
  timezone: string;
  input: unknown;
  overlap: "skip" | "allow";
  catchup: "skip" | "latest" | "all";
  paused: boolean;
  /** The earliest occurrence not yet ticked; null while paused. */
  next_at: Date | null;
  last_run_id: string | null;
  /** A ticker's claim while it ticks the schedule. */
  ticking_until: Date | null;
  created_at: Date;
  updated_at: Date;
  /** The workflow whose definition declares it (migration 034); null: made at run time. */
  declared_by: string | null;
  /** The version of `declared_by` that wrote it last. */
  declared_version: number | null;
}

/** What a caller sets of a schedule (a null input is stored as JSON null, not SQL NULL). */
export type ScheduleFields = Pick<
  ScheduleRow,
  "workflow_ref" | "cron" | "timezone" | "input" | "overlap" | "catchup" | "paused" | "next_at"
>;

/** The database's clock: the time every tick is measured by. */
export async function databaseNow(sql: Sql): Promise<Date> {
  const [row] = await sql<{ now: Date }[]>`select now() as now`;
  return row.now;
}

/** Creates a schedule; undefined when the tenant has one with this id already. */
export async function insertSchedule(
  sql: Sql,
  tenantId: string,
  scheduleId: string,
  f: ScheduleFields,
): Promise<ScheduleRow | undefined> {
  const [row] = await sql<ScheduleRow[]>`
    insert into schedules (tenant_id, schedule_id, workflow_ref, cron, timezone, input, overlap,
                           catchup, paused, next_at)
    values (${tenantId}, ${scheduleId}, ${f.workflow_ref}, ${f.cron}, ${f.timezone},
            coalesce(${
    sql.json(f.input as JSONValue)
  }::jsonb, 'null'), ${f.overlap}, ${f.catchup}, ${f.paused},
            ${f.next_at})
    on conflict (tenant_id, schedule_id) do nothing
    returning *`;
  return row;
}

/** A declared schedule of one tenant, as registration writes it. */
export interface DeclaredRow {
  tenant_id: string;
  schedule_id: string;
  cron: string;
  timezone: string;
  input: unknown;
  overlap: "skip" | "allow";
  catchup: "skip" | "latest" | "all";
  /** Where its cursor starts when it is new or its cron or zone changed. */
  next_at: Date | null;
}

/** What registration did to one declared schedule. */
export interface DeclaredOutcome {
  tenant_id: string;
  schedule_id: string;
  /**
   * `created`, `updated`, `unchanged`, `removed` (an older version declared
   * it, the newest does not), or `taken`: the tenant has a schedule of this
   * id created at run time or declared by another workflow, left as it is;
   * `no-tenant`: no such tenant (yet), so not written.
   */
  outcome: "created" | "updated" | "unchanged" | "removed" | "taken" | "no-tenant";
}

/**
 * Writes the schedules `name@version` declares (`rows`, one per tenant and
 * schedule) when it is the workflow's newest registered version, and
 * removes the ones the workflow declared before that it no longer does;
 * otherwise does nothing and answers nothing (a newer version decides). A
 * schedule created at run time, or declared by another workflow, keeps its
 * id (`taken`); a tenant that does not exist (yet) gets none
 * (`no-tenant`). One transaction under the name's lock (db/catalog.ts), so
 * workers registering at once take turns; a schedule that already says what
 * is declared is not written, so its `updated_at` (the ticker's fence) and
 * cursor stay. A replaced declaration keeps its cursor unless its cron or
 * zone changed, and a schedule paused at run time stays paused.
 */
export async function syncDeclaredSchedules(
  sql: Sql,
  name: string,
  version: number,
  rows: DeclaredRow[],
): Promise<DeclaredOutcome[]> {
  return await sql.begin(async (tx) => {
    await tx`select pg_advisory_xact_lock(${NAME_LOCK_CLASS}, hashtext(${name}))`;
    return await tx<DeclaredOutcome[]>`
      with newest as (
        select not exists (select 1 from workflow_versions
                            where name = ${name} and version > ${version}) as yes
      ),
      declared as (
        select d.* from jsonb_to_recordset(${tx.json(rows as never)}::jsonb)
            as d(tenant_id text, schedule_id text, cron text, timezone text, input jsonb,
                 overlap text, catchup text, next_at timestamptz)
         where (select yes from newest)
      ),
      -- An occurrence's run needs its tenant (runs reference tenants).
      wanted as (
        select d.* from declared d where exists (select 1 from tenants t
                                                 where t.tenant_id = d.tenant_id)
      ),
      gone as (
        delete from schedules s
         where (select yes from newest) and s.declared_by = ${name}
           and not exists (select 1 from declared d
                            where d.tenant_id = s.tenant_id and d.schedule_id = s.schedule_id)
        returning s.tenant_id, s.schedule_id
      ),
      put as (
        insert into schedules (tenant_id, schedule_id, workflow_ref, cron, timezone, input,
                               overlap, catchup, next_at, declared_by, declared_version)
        select tenant_id, schedule_id, ${`${name}@${version}`}, cron, timezone,
               coalesce(input, 'null'::jsonb), overlap, catchup, next_at, ${name}, ${version}
          from wanted
        on conflict (tenant_id, schedule_id) do update
           set workflow_ref = excluded.workflow_ref, cron = excluded.cron,
               timezone = excluded.timezone, input = excluded.input,
               overlap = excluded.overlap, catchup = excluded.catchup,
               declared_version = excluded.declared_version,
               next_at = case when schedules.paused then null
                              when schedules.cron = excluded.cron
                               and schedules.timezone = excluded.timezone
                              then schedules.next_at else excluded.next_at end,
               updated_at = now()
         where schedules.declared_by = excluded.declared_by
           and (schedules.workflow_ref, schedules.cron, schedules.timezone, schedules.input,
                schedules.overlap, schedules.catchup, schedules.declared_version)
               is distinct from
               (excluded.workflow_ref, excluded.cron, excluded.timezone, excluded.input,
                excluded.overlap, excluded.catchup, excluded.declared_version)
        returning tenant_id, schedule_id, xmax = 0 as created
      )
      select d.tenant_id, d.schedule_id,
             case when p.created then 'created'
                  when p.schedule_id is not null then 'updated'
                  when s.declared_by = ${name} then 'unchanged'
                  when s.schedule_id is null and w.tenant_id is null then 'no-tenant'
                  else 'taken' end as outcome
        from declared d
        left join wanted w on w.tenant_id = d.tenant_id and w.schedule_id = d.schedule_id
        left join put p on p.tenant_id = d.tenant_id and p.schedule_id = d.schedule_id
        left join schedules s on s.tenant_id = d.tenant_id and s.schedule_id = d.schedule_id
      union all
      select tenant_id, schedule_id, 'removed' from gone`;
  });
}

/** One schedule of the tenant's. */
export async function selectSchedule(
  sql: Sql,
  tenantId: string,
  scheduleId: string,
): Promise<ScheduleRow | undefined> {
  const [row] = await sql<ScheduleRow[]>`
    select * from schedules where tenant_id = ${tenantId} and schedule_id = ${scheduleId}`;
  return row;
}

/** The tenant's schedules in id order, `limit` of them after `after`. */
export async function selectSchedules(
  sql: Sql,
  tenantId: string,
  opts: { after?: string; limit: number },
): Promise<ScheduleRow[]> {
  return await sql<ScheduleRow[]>`
    select * from schedules
     where tenant_id = ${tenantId} and schedule_id > ${opts.after ?? ""}
     order by schedule_id limit ${opts.limit}`;
}

/** Replaces a schedule's fields; undefined when there is no such schedule. */
export async function updateSchedule(
  sql: Sql,
  tenantId: string,
  scheduleId: string,
  f: ScheduleFields,
): Promise<ScheduleRow | undefined> {
  const [row] = await sql<ScheduleRow[]>`
    update schedules
       set workflow_ref = ${f.workflow_ref}, cron = ${f.cron}, timezone = ${f.timezone},
           input = coalesce(${
    sql.json(f.input as JSONValue)
  }::jsonb, 'null'), overlap = ${f.overlap},
           catchup = ${f.catchup}, paused = ${f.paused}, next_at = ${f.next_at},
           updated_at = now()
     where tenant_id = ${tenantId} and schedule_id = ${scheduleId}
    returning *`;
  return row;
}

/**
 * Pauses or resumes a schedule, changing nothing else (a registration may
 * be rewriting a declared schedule's other fields meanwhile); undefined
 * when there is no such schedule.
 */
export async function setSchedulePaused(
  sql: Sql,
  tenantId: string,
  scheduleId: string,
  paused: boolean,
  nextAt: Date | null,
): Promise<ScheduleRow | undefined> {
  const [row] = await sql<ScheduleRow[]>`
    update schedules set paused = ${paused}, next_at = ${nextAt}, updated_at = now()
     where tenant_id = ${tenantId} and schedule_id = ${scheduleId}
    returning *`;
  return row;
}

/** Deletes a schedule; false when there was none. Its runs stay. */
export async function deleteSchedule(
  sql: Sql,
  tenantId: string,
  scheduleId: string,
): Promise<boolean> {
  const rows = await sql`
    delete from schedules where tenant_id = ${tenantId} and schedule_id = ${scheduleId}
    returning 1`;
  return rows.length > 0;
}

/**
 * Claims up to `limit` schedules due at `now`, earliest first, for
 * `leaseMs` of the database's clock: a schedule another ticker holds (its
 * lease not expired, or its row locked this instant) is skipped, so tickers
 * never wait on each other and none holds a transaction while it admits.
 */
export async function claimDueSchedules(
  sql: Sql,
  now: Date,
  limit: number,
  leaseMs: number,
): Promise<ScheduleRow[]> {
  return await sql<ScheduleRow[]>`
    update schedules s
       set ticking_until = clock_timestamp() + ${leaseMs} * interval '1 millisecond'
      from (select tenant_id, schedule_id from schedules
             where next_at is not null and next_at <= ${now}
               and (ticking_until is null or ticking_until < clock_timestamp())
             order by next_at limit ${limit}
               for update skip locked) d
     where s.tenant_id = d.tenant_id and s.schedule_id = d.schedule_id
    returning s.*`;
}

/**
 * Moves a ticked schedule's cursor to `nextAt`, and its last run when one
 * was admitted, and ends the claim. Not when the schedule changed meanwhile
 * (paused, its cron edited: `updated_at` moved), which set its own cursor.
 */
export async function advanceSchedule(
  sql: Sql,
  s: Pick<ScheduleRow, "tenant_id" | "schedule_id" | "updated_at">,
  nextAt: Date | null,
  lastRunId: string | null,
): Promise<void> {
  await sql`
    update schedules
       -- Compared in milliseconds: the row came back as a JS Date.
       set next_at = case when date_trunc('milliseconds', updated_at) = ${s.updated_at}
                          then ${nextAt} else next_at end,
           last_run_id = coalesce(${lastRunId}::uuid, last_run_id), ticking_until = null
     where tenant_id = ${s.tenant_id} and schedule_id = ${s.schedule_id}`;
}

/** Whether the tenant's run `runId` exists and has not finished. */
export async function runUnfinished(sql: Sql, tenantId: string, runId: string): Promise<boolean> {
  const rows = await sql`
    select 1 from runs
     where tenant_id = ${tenantId} and run_id = ${runId}
       and status in ('queued', 'running', 'waiting')`;
  return rows.length > 0;
}
