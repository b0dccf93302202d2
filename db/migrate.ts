/**
 * The migration runner: numbered plain `.sql` files in `migrations/`, applied
 * in order, each in its own transaction under a transaction-scoped advisory
 * lock, and recorded in `schema_migrations`. Several processes may run it at
 * once: they queue on the lock, and each re-reads what is applied once it
 * holds it, so every file runs exactly once.
 */
import type { Sql } from "./pool.ts";
import type { Logger } from "../core/log.ts";

// An arbitrary constant shared by every poimen process: "poimen migrations".
const MIGRATION_LOCK_KEY = 0x706f696d656e;

export interface Migration {
  version: number;
  name: string;
  sql: string;
}

const MIGRATIONS_DIR = new URL("../migrations/", import.meta.url);

/** Reads `migrations/NNN_name.sql` files, sorted by number (needs read access to the folder). */
export async function loadMigrations(dir: URL = MIGRATIONS_DIR): Promise<Migration[]> {
  const out: Migration[] = [];
  for await (const entry of Deno.readDir(dir)) {
    const m = /^(\d+)_([a-z0-9_]+)\.sql$/.exec(entry.name);
    if (!entry.isFile || !m) continue;
    out.push({
      version: Number(m[1]),
      name: m[2],
      sql: await Deno.readTextFile(new URL(entry.name, dir)),
    });
  }
  out.sort((a, b) => a.version - b.version);
  for (let i = 1; i < out.length; i++) {
    if (out[i].version === out[i - 1].version) {
      throw new Error(`two migrations share number ${out[i].version}`);
    }
  }
  return out;
}

/** Applies every pending migration; returns the versions this call applied. */
export async function migrate(
  sql: Sql,
  migrations: Migration[],
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
  return applied;
}
