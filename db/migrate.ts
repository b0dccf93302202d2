/**
 * The migration runner: numbered plain `.sql` files in `migrations/` (as
 * embedded in migrations/embedded.ts by `deno task embed`), applied in order
 * and recorded in `schema_migrations`, each under an advisory lock shared by
 * every poimen process. Several processes may run it at once: they take
 * turns on the lock, and each reads whether a file is applied once it holds
 * it, so every file runs exactly once, in order.
 *
 * A file is one transaction, unless its first line is `-- poimen:no-transaction`
 * (db/migration_file.ts). A transactional file runs in `sql.begin`, which
 * takes the lock for that transaction (`pg_advisory_xact_lock`) and checks
 * `schema_migrations` inside it: whatever happens to a connection, the file,
 * its record and the lock commit or roll back together. A no-transaction file
 * (what `CREATE INDEX CONCURRENTLY` needs) runs statement by statement on one
 * session holding the session-level lock across them: a pool of one
 * connection the runner opens for the run and ends after, never shared (not
 * a reserved connection of the shared pool, which has no guard against a killed connection:
 * vendor/postgres/PATCHES.md). When that connection closes the run stops with
 * an error rather than go on, unlocked, on the session the pool would open
 * next; each statement first checks that its session still holds the lock.
 *
 * The lock is never waited for inside Postgres: a session waiting on it holds
 * a snapshot, and a concurrent index build of the lock's holder waits for
 * every older snapshot, a deadlock. A migrator polls `pg_try_advisory_*` with
 * a short backoff instead.
 *
 * A migration never queues the application behind it for long: every lock it
 * asks for waits at most `lockTimeoutMs` (Postgres' `lock_timeout`). A lock
 * request waiting behind a long transaction would otherwise hold every later
 * statement on that table (even a plain select of an ACCESS EXCLUSIVE lock's
 * table) in the queue behind it. When the wait runs out the migration (or
 * no-transaction statement) is rolled back and tried again after a backoff,
 * up to `lockAttempts` times, and the application runs in between.
 */
import { createPool, createSessionPool, type Sql, type TransactionSql } from "./pool.ts";
import type { Logger } from "../core/log.ts";
import { backoffWithJitter, delay, SECOND } from "../core/time.ts";
import { MIGRATIONS } from "../migrations/embedded.ts";
import { concurrentIndexName, runsOutsideTransaction, splitStatements } from "./migration_file.ts";

// An arbitrary constant shared by every poimen process: "poimen migrations".
// Taken per transaction (pg_advisory_xact_lock) or per session; the two
// conflict, so runners of any version take turns.
const MIGRATION_LOCK_KEY = 0x706f696d656e;

// Polling for the migration lock while another migrator holds it.
const LOCK_POLL_BASE_MS = 20;
const LOCK_POLL_CAP_MS = 500;

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

/**
 * Applies every pending migration; returns the versions this call applied
 * (not those another migrator running at the same time applied). Transactional
 * files run on `sql`; a pending no-transaction file opens one more connection
 * with `sql`'s settings for the rest of the run.
 */
export async function migrate(
  sql: Sql,
  migrations: readonly Migration[],
  log: Logger,
  options: MigrateOptions = {},
): Promise<number[]> {
  const opts = { ...MIGRATE_DEFAULTS, ...options };
  const lockTimeout = String(Math.max(1, Math.floor(opts.lockTimeoutMs)));
  const applied: number[] = [];
  let session: MigrationSession | undefined;
  try {
    await withMigrationLock(
      sql,
      lockTimeout,
      (tx) =>
        tx`create table if not exists schema_migrations (
        version integer primary key,
        name text not null,
        applied_at timestamptz not null default now()
      )`,
    );
    // Read without the lock: what is done stays done. Each pending file is
    // looked up again under the lock.
    const done = new Set(
      (await sql<{ version: number }[]>`select version from schema_migrations`)
        .map((r) => r.version),
    );
    for (const m of migrations) {
      if (done.has(m.version)) continue;
      let ran: boolean;
      if (runsOutsideTransaction(m.sql)) {
        session ??= openSession(sql, lockTimeout);
        ran = await session.apply(m, log, opts);
      } else {
        ran = await withLockRetries(
          log,
          opts,
          { version: m.version, name: m.name },
          () => withMigrationLock(sql, lockTimeout, (tx) => applyInTransaction(tx, m)),
        );
      }
      if (!ran) continue; // another migrator applied it meanwhile
      applied.push(m.version);
      log.info("migration applied", { version: m.version, name: m.name });
    }
  } finally {
    await session?.end();
  }
  return applied;
}

/**
 * Runs `work` in a transaction of `sql` holding the migration lock, with
 * `lock_timeout` set for it; waits (outside any transaction) while another
 * migrator holds the lock.
 */
async function withMigrationLock<T>(
  sql: Sql,
  lockTimeout: string,
  work: (tx: TransactionSql) => Promise<T>,
): Promise<T> {
  for (let attempt = 1;; attempt++) {
    const outcome = await sql.begin(async (tx) => {
      const [{ locked }] = await tx<{ locked: boolean }[]>`
        select pg_try_advisory_xact_lock(${MIGRATION_LOCK_KEY}) as locked`;
      if (!locked) return { locked };
      await tx`select set_config('lock_timeout', ${lockTimeout}, true)`;
      return { locked, value: await work(tx) };
    });
    if (outcome.locked) return outcome.value as T;
    await delay(lockPollMs(attempt));
  }
}

function lockPollMs(attempt: number): number {
  return Math.max(
    LOCK_POLL_BASE_MS,
    backoffWithJitter(attempt, LOCK_POLL_BASE_MS, LOCK_POLL_CAP_MS),
  );
}

/** Applies `m` in `tx` (holding the lock) unless it is applied; true when it did. */
async function applyInTransaction(tx: TransactionSql, m: Migration): Promise<boolean> {
  const [present] = await tx`select 1 from schema_migrations where version = ${m.version}`;
  if (present) return false;
  await tx.unsafe(m.sql);
  await tx`insert into schema_migrations (version, name) values (${m.version}, ${m.name})`;
  return true;
}

/** The session no-transaction files run on, for one run of the runner. */
interface MigrationSession {
  /** Applies the no-transaction file `m` unless it is applied; true when it did. */
  apply(m: Migration, log: Logger, opts: Required<MigrateOptions>): Promise<boolean>;
  /** Ends the session (releasing its locks); never throws. */
  end(): Promise<void>;
}

/**
 * Opens the run's own session: one connection with `sql`'s settings and
 * `lock_timeout` from its start. Once that connection closed, every use of
 * the session fails: a statement must never run on the session the pool
 * would open next, which holds no migration lock.
 */
function openSession(sql: Sql, lockTimeout: string): MigrationSession {
  let ending = false;
  let lost = false;
  const conn = createSessionPool(sql, {
    parameters: { lock_timeout: lockTimeout },
    onclose: () => {
      if (!ending) lost = true;
    },
  });
  let current: Migration | undefined;
  const closedError = (cause?: unknown) =>
    new Error(
      `migration ${current?.version} (${current?.name}) lost its database connection; ` +
        "the run stops rather than go on without the migration lock, and the file is not " +
        "recorded: migrate again (its statements are idempotent)",
      { cause },
    );
  // Checked synchronously before a statement is handed to the pool: the pool
  // reconnects only for a statement given to it after the close was handled.
  const run = async <T>(query: (s: Sql) => Promise<T>): Promise<T> => {
    if (lost) throw closedError();
    try {
      return await query(conn);
    } catch (err) {
      // The close is handled (onclose told) before the failed statement's
      // caller resumes.
      if (lost) throw closedError(err);
      throw err;
    }
  };
  // The session lock is reentrant: taking it again succeeds at once on the
  // session that holds it, and fails on any other.
  const stillLocked = async () => {
    const [{ locked }] = await run((s) =>
      s<{ locked: boolean }[]>`select pg_try_advisory_lock(${MIGRATION_LOCK_KEY}) as locked`
    );
    if (!locked) throw closedError();
  };
  const unlock = () => run((s) => s`select pg_advisory_unlock_all()`);

  return {
    async apply(m, log, opts) {
      current = m;
      for (let attempt = 1;; attempt++) {
        const [{ locked }] = await run((s) =>
          s<{ locked: boolean }[]>`select pg_try_advisory_lock(${MIGRATION_LOCK_KEY}) as locked`
        );
        if (locked) break;
        await delay(lockPollMs(attempt));
      }
      let failed = true;
      try {
        const [present] = await run((s) =>
          s`select 1 from schema_migrations where version = ${m.version}`
        );
        if (present) {
          failed = false;
          return false;
        }
        for (const [i, statement] of splitStatements(m.sql).entries()) {
          const index = concurrentIndexName(statement);
          await withLockRetries(
            log,
            opts,
            { version: m.version, name: m.name, statement: i + 1 },
            async () => {
              await stillLocked();
              if (index !== undefined) await dropInvalidIndex(run, index, log);
              await run((s) => s.unsafe(statement));
            },
          );
        }
        await stillLocked();
        await run((s) =>
          s`insert into schema_migrations (version, name) values (${m.version}, ${m.name})`
        );
        failed = false;
        return true;
      } finally {
        // The next file may be transactional: its transaction on another
        // connection takes the lock. After a failure, its own error is the one
        // to report (and end() releases the lock anyway).
        if (failed) await unlock().catch(() => {});
        else await unlock();
      }
    },
    async end() {
      ending = true;
      if (!lost) await unlock().catch(() => {});
      await conn.end({ timeout: 5 }).catch(() => {});
    },
  };
}

type SessionRunner = <T>(query: (s: Sql) => Promise<T>) => Promise<T>;

/**
 * Drops the index `name` (in the search path) when a failed concurrent build
 * left it invalid, which `IF NOT EXISTS` would take for done.
 */
async function dropInvalidIndex(run: SessionRunner, name: string, log: Logger): Promise<void> {
  const [invalid] = await run((s) =>
    s<{ qualified: string }[]>`
      select format('%I.%I', n.nspname, c.relname) as qualified
        from pg_index i
        join pg_class c on c.oid = i.indexrelid
        join pg_namespace n on n.oid = c.relnamespace
       where c.oid = to_regclass(${`"${name.replaceAll('"', '""')}"`}) and not i.indisvalid`
  );
  if (!invalid) return;
  log.warn("dropping an invalid index a failed build left, to build it again", { index: name });
  await run((s) => s.unsafe(`drop index concurrently if exists ${invalid.qualified}`));
}

/** Runs `work` until it succeeds, retrying it after a backoff while it fails for want of a lock. */
async function withLockRetries<T>(
  log: Logger,
  opts: Required<MigrateOptions>,
  fields: Record<string, unknown>,
  work: () => Promise<T>,
): Promise<T> {
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
