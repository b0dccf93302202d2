/**
 * The workflow catalog (migration 008): the versions workers registered, with
 * what admission needs of each and which one of each name is current
 * (migration 018), and the live workers with the versions each hosts.
 * Workers write it (registration, liveness), operators promote versions
 * (db/workflow_current.ts); the API reads it (to validate input without the
 * handlers' code) and answers from it what a queued run waits for.
 */
import type { Sql } from "./pool.ts";
import type { DeclaredSchedule } from "../contracts/workflow.ts";
import { QUEUED_TENANT_SCAN } from "./queue_sql.ts";

/** One workflow version as the catalog keeps it. */
export interface CatalogVersion {
  name: string;
  version: number;
  /** JSON Schema (draft 2020-12) of the input. */
  input_schema: Record<string, unknown>;
  /** JSON Schema (draft 2020-12) of the result (migration 019); null: any JSON. */
  output_schema?: Record<string, unknown> | null;
  /**
   * The signals it declares (migration 023): signal name -> JSON Schema
   * (draft 2020-12) of its payload; null: none declared (any payload).
   */
  signal_schemas?: Record<string, Record<string, unknown>> | null;
  /** null: the API's DEFAULT_MAX_ATTEMPTS. */
  max_attempts: number | null;
  /** At most this many runs running at once per group; null: not limited. */
  concurrency_limit?: number | null;
  /** The JSON Pointer into the input naming a run's group; null: one group per tenant. */
  concurrency_key?: string | null;
  /**
   * Its debounce (migration 032), `{ key?, period, maxWait }` in
   * milliseconds; null or unset: not debounced.
   */
  debounce?: { key?: string; period: number; maxWait: number } | null;
  /**
   * The tenants that may start the version, as a tenant scope's canonical
   * text (`acme,team-*`, migration 014); null: every tenant.
   */
  tenants?: string | null;
  /**
   * The schedules it declares (migration 034), as the definition keeps them
   * (workflows/schedules.ts); null: none.
   */
  schedules?: readonly DeclaredSchedule[] | null;
}

/** What registering one version found. */
export interface Registration {
  name: string;
  version: number;
  /** This call registered it. */
  created: boolean;
  /**
   * It was registered before with the same definition: input, output and
   * signal schemas, max attempts, concurrency limit, debounce, tenants and schedules (true
   * when created); false: the stored definition differs; null: another
   * registration of it committed after this statement's snapshot (ask again),
   * or it was refused (`refused`).
   */
  same: boolean | null;
  /** This call made it its workflow's current version: the first version of its name registered. */
  current: boolean;
  /**
   * Set when the version is new and was not registered because its
   * concurrency (limit or key) differs from its workflow's: the version it
   * must agree with (the current one; for a name this call registers first,
   * the newest version of it in the call) and that version's concurrency.
   * Versions of one workflow share its concurrency slots (migration 011).
   */
  refused: ConcurrencyOf | null;
}

/** A version's concurrency, as a refused registration names it. */
export interface ConcurrencyOf {
  version: number;
  concurrency_limit: number | null;
  concurrency_key: string | null;
}

/**
 * The advisory lock class of workflow names ("poim"): registrations of one
 * name take turns, so two versions registered at once are compared with each
 * other (and their declared schedules written one after the other,
 * db/schedules.ts). The two-key form never meets the migrations' one-key lock.
 */
export const NAME_LOCK_CLASS = 0x706f696d;

/**
 * Registers `versions` for `workerId`: each `name@version` not yet in the
 * catalog is inserted; each already there is compared with what is stored
 * (jsonb equality, so key order does not matter). A name's first version
 * registered becomes its current one (migration 018); a new version whose
 * concurrency differs from its workflow's is refused (`refused`). One
 * transaction holding a lock per name, so two workers starting at once can
 * neither both "create" one version nor register two versions of a name that
 * disagree. Answers in the order of `versions`.
 */
export async function registerVersions(
  sql: Sql,
  versions: CatalogVersion[],
  workerId: string,
): Promise<Registration[]> {
  const names = [...new Set(versions.map((v) => v.name))];
  return await sql.begin(async (tx) => {
    // In the order of the lock keys, so two registrations never wait on each other both ways.
    await tx`
      select pg_advisory_xact_lock(${NAME_LOCK_CLASS}, k)
        from (select distinct hashtext(n) as k from unnest(${names}::text[]) n order by k) s`;
    return await tx<Registration[]>`
      with wanted as (
        select * from rows from (jsonb_to_recordset(${tx.json(versions as never)}::jsonb)
            as (name text, version int, input_schema jsonb, output_schema jsonb,
                max_attempts int, concurrency_limit int, concurrency_key text, tenants text,
                signal_schemas jsonb, debounce jsonb, schedules jsonb))
          with ordinality as w(name, version, input_schema, output_schema, max_attempts,
                               concurrency_limit, concurrency_key, tenants, signal_schemas,
                               debounce, schedules, i)
      ),
      -- Per name, the version every new one must agree with on concurrency:
      -- the current one, or for a name first registered here its newest.
      agreed as (
        select distinct on (w.name) w.name,
               coalesce(v.version, w.version) as version,
               case when c.name is null then w.concurrency_limit else v.concurrency_limit end
                 as concurrency_limit,
               case when c.name is null then w.concurrency_key else v.concurrency_key end
                 as concurrency_key
          from wanted w
          left join workflow_current c on c.name = w.name
          left join workflow_versions v on v.name = c.name and v.version = c.version
         order by w.name, w.version desc
      ),
      checked as (
        select w.*, (w.concurrency_limit is not distinct from a.concurrency_limit
                     and w.concurrency_key is not distinct from a.concurrency_key) as agrees,
               a.version as agreed_version, a.concurrency_limit as agreed_limit,
               a.concurrency_key as agreed_key
          from wanted w join agreed a on a.name = w.name
      ),
      ins as (
        insert into workflow_versions (name, version, input_schema, output_schema, max_attempts,
                                       concurrency_limit, concurrency_key, tenants, signal_schemas,
                                       debounce, schedules, registered_by)
        select name, version, input_schema, output_schema, max_attempts, concurrency_limit,
               concurrency_key, tenants, signal_schemas, debounce, schedules, ${workerId}
          from checked
         where agrees
        on conflict (name, version) do nothing
        returning name, version
      ),
      cur as (
        insert into workflow_current (name, version, promoted_by)
        select name, max(version), ${`registration by ${workerId}`} from ins group by name
        on conflict (name) do nothing
        returning name, version
      )
      select w.name, w.version, i.name is not null as created,
             case when i.name is not null then true
                  when v.name is null then null
                  else v.input_schema = w.input_schema
                       and v.output_schema is not distinct from w.output_schema
                       and v.max_attempts is not distinct from w.max_attempts
                       and v.concurrency_limit is not distinct from w.concurrency_limit
                       and v.concurrency_key is not distinct from w.concurrency_key
                       and v.tenants is not distinct from w.tenants
                       and v.signal_schemas is not distinct from w.signal_schemas
                       and v.debounce is not distinct from w.debounce
                       and v.schedules is not distinct from w.schedules end as same,
             cur.name is not null as current,
             case when v.name is null and not w.agrees
                  then jsonb_build_object('version', w.agreed_version,
                                          'concurrency_limit', w.agreed_limit,
                                          'concurrency_key', w.agreed_key) end as refused
        from checked w
        left join ins i on i.name = w.name and i.version = w.version
        left join cur on cur.name = w.name and cur.version = w.version
        left join workflow_versions v on v.name = w.name and v.version = w.version
       order by w.i`;
  });
}

/** A registered version, and whether it is its workflow's current version (migration 018). */
export interface CatalogEntry extends CatalogVersion {
  current: boolean;
}

/**
 * Every registered version, with which is current. The catalog is as small
 * as the workflow code deployed (versions, not runs), so readers take all of
 * it and skip the versions they know (a version never changes; which one is
 * current does).
 */
export async function selectCatalog(sql: Sql): Promise<CatalogEntry[]> {
  return await sql<CatalogEntry[]>`
    select v.name, v.version, v.input_schema, v.output_schema, v.max_attempts, v.concurrency_limit,
           v.concurrency_key, v.tenants, v.signal_schemas, v.debounce,
           c.version is not null as current
      from workflow_versions v
      left join workflow_current c on c.name = v.name and c.version = v.version
     order by v.name, v.version`;
}

/**
 * Says `workerId` is alive and hosts `workflows` ('name@version') until
 * `ttlMs` from now; also forgets workers that expired over a day ago, so
 * the table holds the fleet and its recent past, not every process ever.
 */
export async function renewWorker(
  sql: Sql,
  workerId: string,
  workflows: string[],
  ttlMs: number,
): Promise<void> {
  await sql`
    with forget as (
      delete from workflow_workers where expires_at < now() - interval '1 day'
    )
    insert into workflow_workers (worker_id, workflows, expires_at)
    values (${workerId}, ${workflows}::text[],
            now() + ${ttlMs}::float8 * interval '1 millisecond')
    on conflict (worker_id) do update
       set workflows = excluded.workflows, expires_at = excluded.expires_at`;
}

/** A worker that stops says so: its versions stop counting as hosted at once. */
export async function removeWorker(sql: Sql, workerId: string): Promise<void> {
  await sql`delete from workflow_workers where worker_id = ${workerId}`;
}

/**
 * The one definition of "no live worker hosts this version", as SQL text
 * for a statement's WHERE: `name` and `version` are SQL expressions of the
 * version (`v.name`, `r.workflow_version`…). A worker is live while its row
 * has not expired; the table holds one row per worker, so this reads a few.
 */
export function noLiveHost(name: string, version: string): string {
  return `not exists (select 1 from workflow_workers w
                       where w.expires_at > now()
                         and ${name} || '@' || ${version} = any (w.workflows))`;
}

/**
 * A CTE `unhosted (name, version, workflow)`: the catalog's versions no live
 * worker hosts, materialized so that they are filtered before any of `runs`
 * is read.
 */
export const UNHOSTED_VERSIONS = `unhosted as materialized (
      select v.name, v.version, v.name || '@' || v.version as workflow
        from workflow_versions v
       where ${noLiveHost("v.name", "v.version")}
    )`;

/** Whether a live worker hosts `name@version`. */
export async function isHosted(sql: Sql, name: string, version: number): Promise<boolean> {
  const [r] = await sql<{ unhosted: boolean }[]>`
    select ${sql.unsafe(noLiveHost("h.name", "h.version"))} as unhosted
      from (select ${name}::text as name, ${version}::int as version) h`;
  return !r.unhosted;
}

/** Queued runs of one version that no live worker hosts. */
export interface UnhostedQueue {
  /** `name@version`. */
  workflow: string;
  /** Queued runs pinned to it, at most `cap`. */
  runs: number;
}

/**
 * The catalog's versions that no live worker hosts and that have queued
 * runs, with how many (capped: each version's count stops at `cap`).
 * Versions are few; only unhosted ones are counted. The queue index leads
 * with the tenant (migration 008), so a version's queued runs are found per
 * tenant with queued runs (QUEUED_TENANT_SCAN): one capped range of the
 * index per tenant and version, never a read of all of `runs`.
 */
export async function selectUnhostedQueues(sql: Sql, cap: number): Promise<UnhostedQueue[]> {
  return await sql<UnhostedQueue[]>`
    with recursive ${sql.unsafe(QUEUED_TENANT_SCAN)},
    ${sql.unsafe(UNHOSTED_VERSIONS)}
    select u.workflow, q.runs
      from unhosted u
     cross join lateral (
           select count(*)::int as runs
             from (select 1 from queued_tenants t
                    cross join lateral (
                          select 1 from runs r
                           where r.tenant_id collate "C" = t.tenant_id and r.status = 'queued'
                             and r.workflow_name = u.name and r.workflow_version = u.version
                           limit ${cap}) x
                    where t.tenant_id is not null
                    limit ${cap}) l) q
     where q.runs > 0
     order by u.name, u.version`;
}
