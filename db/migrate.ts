/**
 * The migration runner: numbered plain `.sql` files in `migrations/` (as
 * embedded in migrations/embedded.ts by `deno task embed`), applied in order
 * and recorded in `schema_migrations`, on one connection holding a
 * session-level advisory lock for the whole run. Several processes may run
 * it at once: they queue on the lock, and each reads what is applied once it
 * holds it, so every file runs exactly once.
 *
 * A migration never queues the application behind it for long: every lock it
 * asks for waits at most `lockTimeoutMs` (Postgres' `lock_timeout`). A lock
 * request waiting behind a long transaction would otherwise hold every later
 * statement on that table (even a plain select of an ACCESS EXCLUSIVE lock's
 * table) in the queue behind it. When the wait runs out the migration is
 * rolled back and tried again after a backoff, up to `lockAttempts` times,
 * and the application runs in between.
 *
 * A file is one transaction, unless its first line is `-- poimen:no-transaction`
 * (db/migration_file.ts): then each statement runs on its own (what
 * `CREATE INDEX CONCURRENTLY` needs), retried alone on a lock timeout, and
 * the file is recorded as applied once all of them succeeded.
 */
import { createPool, type ReservedSql, type Sql } from "./pool.ts";
import type { Logger } from "../core/log.ts";
import { backoffWithJitter, delay, SECOND } from "../core/time.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { registerVersions } from "./catalog.ts";
import { MIGRATIONS } from "../migrations/embedded.ts";
import { concurrentIndexName, runsOutsideTransaction, splitStatements } from "./migration_file.ts";

// An arbitrary constant shared by every poimen process: "poimen migrations".
// Older runners took it per transaction (pg_advisory_xact_lock); the session
// lock taken here conflicts with those, so mixed versions still take turns.
const MIGRATION_LOCK_KEY = 0x706f696d656e;

/** One migration: `migrations/<version>_<name>.sql` and its text. */
export interface Migration {
  version: number;
  name: string;
  sql: string;
}

/** How long a migration may wait for a lock, and how often it tries again. */
export interface MigrateOptions {
  /** Postgres' `lock_timeout` for every statement of a migration; default 2 s. */
  lockTimeoutMs?: number;
  /** Tries of one migration (or no-transaction statement) that ran out of lock time; default 10. */
  lockAttempts?: number;
  /** The backoff between tries: full jitter over base · 2^try, never under base; default 0.5 s. */
  retryBaseMs?: number;
  /** The longest backoff between tries; default 15 s. */
  retryCapMs?: number;
}

/** The defaults of {@link MigrateOptions}. */
export const MIGRATE_DEFAULTS: Required<MigrateOptions> = {
  lockTimeoutMs: 2 * SECOND,
  lockAttempts: 10,
  retryBaseMs: 500,
  retryCapMs: 15 * SECOND,
};

// How often a migrator waiting for another one asks for the lock again.
const ADVISORY_LOCK_POLL_MS = 100;

// lock_not_available (lock_timeout ran out) and deadlock_detected: the
// statement was rolled back and nothing of it remains, so it can run again.
const RETRYABLE_SQLSTATE = new Set(["55P03", "40P01"]);

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
  options: MigrateOptions = {},
): Promise<number[]> {
  const opts = { ...MIGRATE_DEFAULTS, ...options };
  const applied: number[] = [];
  const conn = await sql.reserve();
  try {
    // Waiting for another migrator has no lock_timeout: it blocks no one
    // else. Polled, not waited for in one statement: a waiting statement
    // holds a snapshot, and the other migrator's CREATE INDEX CONCURRENTLY
    // waits for every older snapshot to end (a deadlock).
    while (
      !(await conn<{ got: boolean }[]>`
      select pg_try_advisory_lock(${MIGRATION_LOCK_KEY}) as got`)[0].got
    ) {
      await delay(ADVISORY_LOCK_POLL_MS);
    }
    let failed = true;
    try {
      await conn.unsafe(`set lock_timeout = ${Math.max(1, Math.floor(opts.lockTimeoutMs))}`);
      await applyPending(conn, migrations, log, opts, applied);
      failed = false;
    } finally {
      // The connection goes back to the pool: leave it as it came. After a
      // failure, its own error is the one to report.
      const cleanUp = async () => {
        await conn.unsafe("reset lock_timeout");
        await conn`select pg_advisory_unlock(${MIGRATION_LOCK_KEY})`;
      };
      if (failed) await cleanUp().catch(() => {});
      else await cleanUp();
    }
  } finally {
    conn.release();
  }
  await seedBuiltinWorkflows(sql);
  return applied;
}

async function applyPending(
  conn: ReservedSql,
  migrations: readonly Migration[],
  log: Logger,
  opts: Required<MigrateOptions>,
  applied: number[],
): Promise<void> {
  await conn`create table if not exists schema_migrations (
    version integer primary key,
    name text not null,
    applied_at timestamptz not null default now()
  )`;
  const done = new Set(
    (await conn<{ version: number }[]>`select version from schema_migrations`)
      .map((r) => r.version),
  );
  for (const m of migrations) {
    if (done.has(m.version)) continue;
    if (runsOutsideTransaction(m.sql)) {
      await applyStatementByStatement(conn, m, log, opts);
    } else {
      await withLockRetries(
        log,
        opts,
        { version: m.version, name: m.name },
        () => applyInTransaction(conn, m),
      );
    }
    applied.push(m.version);
    log.info("migration applied", { version: m.version, name: m.name });
  }
}

async function applyInTransaction(conn: ReservedSql, m: Migration): Promise<void> {
  await conn.unsafe("begin");
  try {
    await conn.unsafe(m.sql);
    await conn`insert into schema_migrations (version, name) values (${m.version}, ${m.name})`;
    await conn.unsafe("commit");
  } catch (err) {
    await conn.unsafe("rollback").catch(() => {});
    throw err;
  }
}

/**
 * A no-transaction migration: each statement alone, in order; recorded once
 * all succeeded. A concurrent index build that failed (a lock timeout, a
 * deadlock, a crash) leaves an INVALID index of its name behind, which `IF
 * NOT EXISTS` would then take for done: it is dropped before each build.
 */
async function applyStatementByStatement(
  conn: ReservedSql,
  m: Migration,
  log: Logger,
  opts: Required<MigrateOptions>,
): Promise<void> {
  for (const [i, statement] of splitStatements(m.sql).entries()) {
    const index = concurrentIndexName(statement);
    await withLockRetries(
      log,
      opts,
      { version: m.version, name: m.name, statement: i + 1 },
      async () => {
        if (index !== undefined) await dropInvalidIndex(conn, index, log);
        await conn.unsafe(statement);
      },
    );
  }
  await conn`insert into schema_migrations (version, name) values (${m.version}, ${m.name})`;
}

/** Drops the index `name` (in the search path) when a failed concurrent build left it invalid. */
async function dropInvalidIndex(conn: ReservedSql, name: string, log: Logger): Promise<void> {
  const [invalid] = await conn<{ qualified: string }[]>`
    select format('%I.%I', n.nspname, c.relname) as qualified
      from pg_index i
      join pg_class c on c.oid = i.indexrelid
      join pg_namespace n on n.oid = c.relnamespace
     where c.oid = to_regclass(${`"${name.replaceAll('"', '""')}"`}) and not i.indisvalid`;
  if (!invalid) return;
  log.warn("dropping an invalid index a failed build left, to build it again", { index: name });
  await conn.unsafe(`drop index concurrently if exists ${invalid.qualified}`);
}

/** Runs `work` until it succeeds, retrying it after a backoff while it fails for want of a lock. */
async function withLockRetries(
  log: Logger,
  opts: Required<MigrateOptions>,
  fields: Record<string, unknown>,
  work: () => Promise<void>,
): Promise<void> {
  for (let attempt = 1;; attempt++) {
    try {
      return await work();
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (!RETRYABLE_SQLSTATE.has(code ?? "") || attempt >= opts.lockAttempts) {
        if (code && RETRYABLE_SQLSTATE.has(code)) {
          throw new Error(
            `migration ${fields.version} (${fields.name}) gave up after ${attempt} tries: ` +
              `${(err as Error).message}; a long transaction holds a lock it needs ` +
              `(see pg_locks and pg_stat_activity); end it, or allow more tries (MIGRATION_LOCK_ATTEMPTS)`,
            { cause: err },
          );
        }
        throw err;
      }
      const waitMs = Math.max(
        opts.retryBaseMs,
        backoffWithJitter(attempt, opts.retryBaseMs, opts.retryCapMs),
      );
      log.warn("migration could not take a lock in time; trying again", {
        ...fields,
        attempt,
        wait_ms: waitMs,
        error: (err as Error).message,
      });
      await delay(waitMs);
    }
  }
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
