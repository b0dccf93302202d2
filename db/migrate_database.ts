/**
 * Migrating a database from the package: applies poimen's schema (the
 * migrations embedded in the package, so nothing is read from disk) to an
 * existing database, as `deno task migrate` does. It creates the tables and
 * nothing else: no database, no tenant, no token, no topic, and no workflow
 * (the catalog stays empty until a worker registers what it hosts).
 *
 * ```ts
 * import { migrateDatabase } from "@poimen/poimen/migrate";
 *
 * const applied = await migrateDatabase("postgres://poimen@127.0.0.1:5432/poimen");
 * ```
 *
 * Several processes may call it at once (they take turns on an advisory lock) and
 * calling it again applies nothing. A migration waits at most `lockTimeoutMs`
 * for each lock it needs (so a long transaction holding one never queues the
 * application behind the migration), then rolls back and tries again. The permissions it needs are
 * `--allow-net` (the database) and `--allow-env` (the driver reads the
 * `PG*` variables for what the URL leaves out).
 *
 * @module
 */
import { createPool } from "./pool.ts";
import { loadMigrations, migrate, type MigrateOptions } from "./migrate.ts";
import { type Fields, type Logger, silentLogger } from "../core/log.ts";

export type { Fields, Logger, MigrateOptions };

/**
 * Options of {@link migrateDatabase}: besides the logger, how long a
 * migration may wait for a lock (`lockTimeoutMs`, default 2 s) and how many
 * times it tries (`lockAttempts`, default 10) before it gives up.
 */
export interface MigrateDatabaseOptions extends MigrateOptions {
  /**
   * Told each migration applied (`info`, with its `version` and `name`)
   * and each try that ran out of lock time (`warn`); default: a logger that
   * writes nothing.
   */
  log?: Logger;
}

/**
 * Applies the pending migrations to the database at `databaseUrl`, which
 * must exist, each in its own transaction (or, for a file that says so,
 * statement by statement); returns the versions this call applied (empty
 * when the schema was already up to date). It opens one connection of its
 * own (and one more while a no-transaction file runs) and closes them before
 * returning, also on failure, when it rejects with the driver's error (or one
 * saying a lock never came in `lockAttempts` tries, or that a no-transaction
 * file lost its connection).
 */
export async function migrateDatabase(
  databaseUrl: string,
  options: MigrateDatabaseOptions = {},
): Promise<number[]> {
  const sql = createPool({ url: databaseUrl, max: 1, applicationName: "poimen-migrate" });
  try {
    const { log, ...lockOptions } = options;
    return await migrate(sql, loadMigrations(), log ?? silentLogger, lockOptions);
  } finally {
    await sql.end({ timeout: 5 });
  }
}
