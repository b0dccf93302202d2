/** `deno task migrate`: applies pending migrations (safe from several processes at once). */
import { z } from "zod";
import { databaseEnv, logEnv, processEnv, readEnv } from "../core/config.ts";
import { createLogger, type Logger } from "../core/log.ts";
import { ensureDatabase } from "../db/migrate.ts";
import { migrateDatabase } from "../db/migrate_database.ts";
import { type CommandSpec, parseCommandLine } from "../core/command_line.ts";

const MigrateEnv = z.object({ ...databaseEnv, ...logEnv });

const COMMAND = {
  name: "migrate",
  synopsis: "",
  description: `
Creates the database if it is missing and applies the pending migrations
(safe from several processes at once).`,
  env: MigrateEnv,
} satisfies CommandSpec;

export async function main(args: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const config = readEnv(MigrateEnv, processEnv());
  await createAndMigrate(config.DATABASE_URL, createLogger("migrate", config.LOG_LEVEL));
  return 0;
}

/**
 * Creates the database at `url` if missing and applies the pending
 * migrations (the package's `migrateDatabase`, which creates no database).
 */
export async function createAndMigrate(url: string, log: Logger): Promise<void> {
  if (await ensureDatabase(url)) log.info("database created");
  const applied = await migrateDatabase(url, { log });
  log.info(applied.length ? "migrated" : "already up to date", { applied });
}
