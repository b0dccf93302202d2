/** `deno task migrate`: applies pending migrations (safe from several processes at once). */
import { z } from "zod";
import { databaseEnv, logEnv, millis, positiveInt, processEnv, readEnv } from "../core/config.ts";
import { createLogger, type Logger } from "../core/log.ts";
import { ensureDatabase, MIGRATE_DEFAULTS, type MigrateOptions } from "../db/migrate.ts";
import { migrateDatabase } from "../db/migrate_database.ts";
import { type CommandSpec, parseCommandLine } from "../core/command_line.ts";

/** How long a migration waits for a lock, and how often it tries (migrate, init). */
export const migrationEnv = {
  MIGRATION_LOCK_TIMEOUT_MS: millis(MIGRATE_DEFAULTS.lockTimeoutMs).refine((ms) => ms > 0, {
    message: "expected a positive number of milliseconds",
  }),
  MIGRATION_LOCK_ATTEMPTS: positiveInt(MIGRATE_DEFAULTS.lockAttempts),
};

/** The {@link MigrateOptions} that validated `migrationEnv` variables say. */
export function migrationOptions(
  env: { MIGRATION_LOCK_TIMEOUT_MS: number; MIGRATION_LOCK_ATTEMPTS: number },
): MigrateOptions {
  return {
    lockTimeoutMs: env.MIGRATION_LOCK_TIMEOUT_MS,
    lockAttempts: env.MIGRATION_LOCK_ATTEMPTS,
  };
}

const MigrateEnv = z.object({ ...databaseEnv, ...logEnv, ...migrationEnv });

const COMMAND = {
  name: "migrate",
  synopsis: "",
  description: `
Creates the database if it is missing and applies the pending migrations
(safe from several processes at once). A migration waits at most
MIGRATION_LOCK_TIMEOUT_MS for a lock, then rolls back and tries again, up to
MIGRATION_LOCK_ATTEMPTS times.`,
  env: MigrateEnv,
} satisfies CommandSpec;

export async function main(args: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const config = readEnv(MigrateEnv, processEnv());
  const log = createLogger("migrate", config.LOG_LEVEL);
  await createAndMigrate(config.DATABASE_URL, log, migrationOptions(config));
  return 0;
}

/**
 * Creates the database at `url` if missing and applies the pending
 * migrations (the package's `migrateDatabase`, which creates no database).
 */
export async function createAndMigrate(
  url: string,
  log: Logger,
  options: MigrateOptions = {},
): Promise<void> {
  if (await ensureDatabase(url)) log.info("database created");
  const applied = await migrateDatabase(url, { ...options, log });
  log.info(applied.length ? "migrated" : "already up to date", { applied });
}
