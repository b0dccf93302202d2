/** `deno task migrate`: applies pending migrations (safe from several processes at once). */
import { z } from "zod";
import { databaseEnv, logEnv, processEnv, readEnv } from "../core/config.ts";
import { createLogger } from "../core/log.ts";
import { createPool } from "../db/pool.ts";
import { ensureDatabase, loadMigrations, migrate } from "../db/migrate.ts";

export async function main(_args: string[]): Promise<void> {
  const config = readEnv(z.object({ ...databaseEnv, ...logEnv }), processEnv());
  const log = createLogger("migrate", config.LOG_LEVEL);
  if (await ensureDatabase(config.DATABASE_URL)) log.info("database created");
  const sql = createPool({ url: config.DATABASE_URL, max: 1, applicationName: "poimen-migrate" });
  try {
    const applied = await migrate(sql, await loadMigrations(), log);
    log.info(applied.length ? "migrated" : "already up to date", { applied });
  } finally {
    await sql.end({ timeout: 5 });
  }
}
