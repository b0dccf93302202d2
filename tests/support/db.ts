/**
 * A database of its own for each test file: created empty, migrated with
 * the real migrations, dropped at the end, so test files run in any order
 * and in parallel without seeing each other's rows. Under `deno task test`
 * a migrated one is a clone of the run's template database (dev/checks.ts),
 * which is the same migrations applied once. Migrating registers no
 * workflow; a migrated test database has the built-ins (echo, sleep, fail)
 * registered, as `deno task up` does, unless asked not to.
 */
import { createPool, type Sql } from "../../db/pool.ts";
import { loadMigrations, migrate } from "../../db/migrate.ts";
import { registerVersions } from "../../db/catalog.ts";
import { silentLogger } from "../../core/log.ts";
import { builtinRegistry } from "../../workflows/builtin.ts";

export const ADMIN_URL = Deno.env.get("TEST_DATABASE_ADMIN_URL") ??
  "postgres://postgres@127.0.0.1:5432/postgres";

export interface TestDatabase {
  name: string;
  url: string;
  sql: Sql;
  drop(): Promise<void>;
}

/** Registers the built-in workflows in the catalog, as `deno task init --builtins` does. */
export async function registerBuiltins(sql: Sql): Promise<void> {
  await registerVersions(sql, builtinRegistry().catalogVersions(), "tests");
}

/**
 * Creates and migrates a fresh database, with the built-ins registered unless
 * `builtins` is false; `drop()` closes `sql` and removes it.
 */
export async function freshDatabase(
  migrated = true,
  { builtins = true }: { builtins?: boolean } = {},
): Promise<TestDatabase> {
  const name = `poimen_test_${crypto.randomUUID().replaceAll("-", "").slice(0, 12)}`;
  const template = migrated ? Deno.env.get("POIMEN_TEST_TEMPLATE") : undefined;
  const admin = createPool({ url: ADMIN_URL, max: 1, applicationName: "poimen-test" });
  await admin.unsafe(`create database ${name}${template ? ` template ${template}` : ""}`);
  await admin.end();
  const url = new URL(ADMIN_URL);
  url.pathname = `/${name}`;
  const sql = createPool({ url: url.href, max: 10, applicationName: "poimen-test" });
  if (migrated && !template) await migrate(sql, loadMigrations(), silentLogger);
  if (migrated && builtins) await registerBuiltins(sql);
  return {
    name,
    url: url.href,
    sql,
    async drop() {
      await sql.end({ timeout: 5 });
      const a = createPool({ url: ADMIN_URL, max: 1, applicationName: "poimen-test" });
      await a.unsafe(`drop database if exists ${name} with (force)`);
      await a.end();
    },
  };
}

/** Polls `check` until it returns a value other than undefined/false, or throws at the deadline. */
export async function waitFor<T>(
  what: string,
  check: () => Promise<T | undefined | false> | T | undefined | false,
  timeoutMs = 30_000,
  intervalMs = 50,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      const v = await check();
      if (v !== undefined && v !== false) return v as T;
    } catch (err) {
      last = err;
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
  throw new Error(`timed out waiting for ${what}${last ? `: ${last}` : ""}`);
}

/**
 * The lanes (migration 016) of the queued runs a test wrote straight into
 * `runs`, as the statements that queue runs keep them: a test that inserts
 * runs by hand calls this before a claim is to find them (those of `tenant`
 * only, when given).
 */
export async function laneQueuedRuns(sql: Sql, tenant?: string): Promise<void> {
  await sql`
    insert into queue_lanes (tenant_id, workflow_name, workflow_version, ready_at)
    select tenant_id, workflow_name, workflow_version, min(run_after)
      from runs
     where status = 'queued' and concurrency_key is null
       and (${tenant ?? null}::text is null or tenant_id = ${tenant ?? null})
     group by 1, 2, 3
    on conflict (tenant_id, workflow_name, workflow_version) do update
       set ready_at = least(queue_lanes.ready_at, excluded.ready_at)`;
}
