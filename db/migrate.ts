/**
 * The migration runner: numbered plain `.sql` files in `migrations/` (as
 * embedded in migrations/embedded.ts by `deno task embed`), applied in order,
 * each in its own transaction under a transaction-scoped advisory lock, and
 * recorded in `schema_migrations`. Several processes may run it at once: they
 * queue on the lock, and each re-reads what is applied once it holds it, so
 * every file runs exactly once.
 */
import { createPool, type Sql } from "./pool.ts";
import type { Logger } from "../core/log.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { registerVersions } from "./catalog.ts";
import { MIGRATIONS } from "../migrations/embedded.ts";

// An arbitrary constant shared by every poimen process: "poimen migrations".
const MIGRATION_LOCK_KEY = 0x706f696d656e;

/** One migration: `migrations/<version>_<name>.sql` and its text. */
export interface Migration {
  version: number;
  name: string;
  sql: string;
}

/**
 * The migrations, in order: migrations/NNN_name.sql as embedded in
 * migrations/embedded.ts by `deno task embed`, so migrating reads no file.
 */
export function loadMigrations(): readonly Migration[] {
  return MIGRATIONS;
}

/** Applies every pending migration; returns the versions this call applied. */
export async function migrate(
  sql: Sql,
  migrations: readonly Migration[],
  log: Logger,
): Promise<number[]> {
  await sql.begin(async (tx) => {
    await tx`select pg_advisory_xact_lock(${MIGRATION_LOCK_KEY})`;
    await tx`create table if not exists schema_migrations (
      version integer primary key,
      name text not null,
      applied_at timestamptz not null default now()
    )`;
  });
  const applied: number[] = [];
  for (const m of migrations) {
    const didApply = await sql.begin(async (tx) => {
      await tx`select pg_advisory_xact_lock(${MIGRATION_LOCK_KEY})`;
      const [done] = await tx`select 1 from schema_migrations where version = ${m.version}`;
      if (done) return false;
      await tx.unsafe(m.sql);
      await tx`insert into schema_migrations (version, name) values (${m.version}, ${m.name})`;
      return true;
    });
    if (didApply) {
      applied.push(m.version);
      log.info("migration applied", { version: m.version, name: m.name });
    }
  }
  await seedBuiltinWorkflows(sql);
  return applied;
}

/**
 * Registers poimen's own workflows (echo, sleep, fail) in the catalog, as a
 * worker hosting them would, so a fresh installation admits them before any
 * worker started (their runs wait for one). Never overwrites: a registered
 * version is immutable, and a worker with another definition refuses to start.
 */
async function seedBuiltinWorkflows(sql: Sql): Promise<void> {
  const [{ present }] = await sql<{ present: boolean }[]>`
    select to_regclass('workflow_versions') is not null as present`;
  if (!present) return;
  await registerVersions(sql, builtinRegistry().catalogVersions(), "poimen migrate");
}

/**
 * Creates the database named in `url` when it does not exist (connecting to
 * the server's `postgres` database to do so); true when it created it. For
 * development and first start-up; production databases are usually made by
 * their operators.
 */
export async function ensureDatabase(url: string): Promise<boolean> {
  const target = new URL(url);
  const name = decodeURIComponent(target.pathname.slice(1));
  const probe = createPool({ url, max: 1, applicationName: "poimen-migrate" });
  try {
    await probe`select 1`;
    return false;
  } catch (err) {
    if ((err as { code?: string }).code !== "3D000") throw err; // invalid_catalog_name
  } finally {
    await probe.end({ timeout: 5 });
  }
  target.pathname = "/postgres";
  const admin = createPool({ url: target.href, max: 1, applicationName: "poimen-migrate" });
  try {
    await admin.unsafe(`create database "${name.replaceAll('"', '""')}"`);
    return true;
  } catch (err) {
    // Another process created it meanwhile: duplicate_database.
    if ((err as { code?: string }).code === "42P04") return false;
    throw err;
  } finally {
    await admin.end({ timeout: 5 });
  }
}
