/** `deno task migrate`: idempotent, and safe from several processes at once. */
import assert from "node:assert/strict";
import { freshDatabase, waitFor } from "./support/db.ts";
import { runCommand, runFlags } from "./support/processes.ts";
import { loadMigrations } from "../db/migrate.ts";
import { migrateDatabase } from "../db/migrate_database.ts";
import { createLogger, type Fields } from "../core/log.ts";

// The task's own permissions: the migrations are embedded, so no read access.
const PERMS = runFlags("migrate");

Deno.test("idempotent_admission: migrate applies each migration once, from two processes at once and again", async () => {
  const db = await freshDatabase(false);
  try {
    const env = { DATABASE_URL: db.url };
    const [a, b] = await Promise.all([
      runCommand("migrate", [], env, PERMS),
      runCommand("migrate", [], env, PERMS),
    ]);
    assert.equal(a.code, 0, a.stderr);
    assert.equal(b.code, 0, b.stderr);
    const files = loadMigrations();
    const rows = await db.sql`select version from schema_migrations order by version`;
    assert.deepEqual(rows.map((r) => r.version), files.map((f) => f.version));

    const again = await runCommand("migrate", [], env, PERMS);
    assert.equal(again.code, 0, again.stderr);
    assert.match(again.stderr, /already up to date/);
    const [n] = await db.sql`select count(*)::int as n from schema_migrations`;
    assert.equal(n.n, files.length);
  } finally {
    await db.drop();
  }
});

Deno.test("idempotent_admission: a bad DATABASE_URL is one line naming the variable, exit 2", async () => {
  const out = await runCommand("migrate", [], { DATABASE_URL: "not a url" }, PERMS);
  assert.equal(out.code, 2);
  assert.equal(out.stderr.trim().split("\n").length, 1);
  assert.match(out.stderr, /DATABASE_URL/);
});

Deno.test("idempotent_admission: migrate creates a missing database", async () => {
  const db = await freshDatabase(false);
  const url = new URL(db.url);
  url.pathname = `/${db.name}_new`;
  try {
    const out = await runCommand("migrate", [], { DATABASE_URL: url.href }, PERMS);
    assert.equal(out.code, 0, out.stderr);
    assert.match(out.stderr, /database created/);
  } finally {
    await db.sql.unsafe(`drop database if exists ${db.name}_new with (force)`);
    await db.drop();
  }
});

Deno.test("idempotent_admission: the package's migrateDatabase applies the schema once and closes its connection", async () => {
  const db = await freshDatabase(false);
  try {
    const told: Fields[] = [];
    const log = createLogger("test", "info", (line) => told.push(JSON.parse(line)));
    const applied = await migrateDatabase(db.url, { log });
    const versions = loadMigrations().map((m) => m.version);
    assert.deepEqual(applied, versions);
    assert.deepEqual(told.map((f) => f.version), versions);
    assert.deepEqual(await migrateDatabase(db.url), []);
    // A closed connection's backend leaves pg_stat_activity a moment after the client.
    await waitFor("migrateDatabase's connections to close", async () => {
      const [open] = await db.sql`
        select count(*)::int as n from pg_stat_activity
        where datname = ${db.name} and application_name = 'poimen-migrate'`;
      return open.n === 0;
    }, 5_000);
  } finally {
    await db.drop();
  }
});
