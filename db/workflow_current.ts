/**
 * Which version of a workflow is current (migration 018), as operators see
 * and change it: the listing of every version with its live workers, and a
 * promotion. Registration sets a name's first current version
 * (db/catalog.ts); only a promotion changes it.
 */
import type { Sql } from "./pool.ts";

/** One registered version, as `deno task workflow list` and the console show it. */
export interface VersionListing {
  name: string;
  version: number;
  /** Its workflow's current version: what a run naming only the workflow gets. */
  current: boolean;
  /** When it became current (null unless current). */
  promoted_at: Date | null;
  /** The tenant scope's canonical text; null: every tenant. */
  tenants: string | null;
  max_attempts: number | null;
  concurrency_limit: number | null;
  concurrency_key: string | null;
  registered_at: Date;
  registered_by: string;
  /** The live workers hosting it (ids, sorted). */
  workers: string[];
}

/**
 * Every registered version (of `name` only, when given), by name and
 * version, with the live workers hosting each. Versions and workers are few
 * (the code deployed, the fleet): this reads both tables whole.
 */
export async function selectVersionListing(
  sql: Sql,
  name?: string,
): Promise<VersionListing[]> {
  return await sql<VersionListing[]>`
    select v.name, v.version, c.version is not null as current, c.promoted_at, v.tenants,
           v.max_attempts, v.concurrency_limit, v.concurrency_key, v.registered_at,
           v.registered_by,
           array(select w.worker_id from workflow_workers w
                  where w.expires_at > now() and v.name || '@' || v.version = any (w.workflows)
                  order by w.worker_id) as workers
      from workflow_versions v
      left join workflow_current c on c.name = v.name and c.version = v.version
     where ${name ?? null}::text is null or v.name = ${name ?? null}
     order by v.name, v.version`;
}

/** What a promotion did. */
export interface Promotion {
  /** The version current before (null: none was, which registration never leaves). */
  previous: number | null;
  version: number;
}

/**
 * Makes `name@version` its workflow's current version; undefined when that
 * version is not registered. Promoting the current version again changes
 * nothing but its promotion time. `by` is recorded (`promoted_by`).
 */
export async function promoteVersion(
  sql: Sql,
  name: string,
  version: number,
  by: string,
): Promise<Promotion | undefined> {
  const [row] = await sql<Promotion[]>`
    with before as (
      select version from workflow_current where name = ${name}
    ),
    promoted as (
      insert into workflow_current (name, version, promoted_by)
      select name, version, ${by} from workflow_versions
       where name = ${name} and version = ${version}
      on conflict (name) do update
         set version = excluded.version, promoted_at = now(), promoted_by = excluded.promoted_by
      returning version
    )
    select (select version from before) as previous, p.version from promoted p`;
  return row;
}
