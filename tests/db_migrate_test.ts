/**
 * `deno task migrate`: idempotent, safe from several processes at once, and
 * never a long stop for the application (lock_timeout and retries,
 * no-transaction files for concurrent index builds).
 */
import assert from "node:assert/strict";
import { freshDatabase, waitFor } from "./support/db.ts";
import { runCommand, runFlags } from "./support/processes.ts";
import { loadMigrations, migrate, type Migration } from "../db/migrate.ts";
import { migrateDatabase } from "../db/migrate_database.ts";
import { NO_TRANSACTION_DIRECTIVE } from "../db/migration_file.ts";
import { createPool } from "../db/pool.ts";
import { insertRuns } from "../db/admission.ts";
import { insertTenant } from "../db/auth.ts";
import { createLogger, type Fields, silentLogger } from "../core/log.ts";

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

Deno.test("migrate: a bad MIGRATION_LOCK_TIMEOUT_MS or MIGRATION_LOCK_ATTEMPTS is one line naming it, exit 2", async () => {
  for (
    const [name, value] of [["MIGRATION_LOCK_TIMEOUT_MS", "0"], ["MIGRATION_LOCK_ATTEMPTS", "x"]]
  ) {
    const out = await runCommand("migrate", [], { [name]: value }, PERMS);
    assert.equal(out.code, 2, name);
    assert.equal(out.stderr.trim().split("\n").length, 1);
    assert.match(out.stderr, new RegExp(`${name} is invalid`));
  }
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

Deno.test("idempotent_admission: the package's migrateDatabase applies the schema once, registers no workflow and closes its connection", async () => {
  const db = await freshDatabase(false);
  try {
    const told: Fields[] = [];
    const log = createLogger("test", "info", (line) => told.push(JSON.parse(line)));
    const applied = await migrateDatabase(db.url, { log });
    const versions = loadMigrations().map((m) => m.version);
    assert.deepEqual(applied, versions);
    assert.deepEqual(told.map((f) => f.version), versions);
    assert.deepEqual(await migrateDatabase(db.url), []);
    // The schema only: no workflow (the built-ins are `init --builtins`' to register).
    const catalog = await db.sql`
      select (select count(*)::int from workflow_versions) as versions,
             (select count(*)::int from workflow_current) as current`;
    assert.deepEqual({ ...catalog[0] }, { versions: 0, current: 0 });
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

// A steady writer: admissions (the real admission statement) one after the
// other on a connection of its own, each commit's time noted, until stopped.
interface Writer {
  commits: number[];
  stop(): Promise<void>;
}

function startWriter(url: string, tenant: string): Writer {
  const sql = createPool({ url, max: 1, applicationName: "poimen-test-writer" });
  const commits: number[] = [];
  let stopping = false;
  const loop = (async () => {
    while (!stopping) {
      await insertRuns(sql, [{
        tenant_id: tenant,
        run_id: crypto.randomUUID(),
        workflow_ref: "echo",
        workflow_name: "echo",
        workflow_version: 1,
        input: { at: commits.length },
        goal_id: null,
        dispatch_key: null,
        source: "http:writer",
        max_attempts: 3,
        run_after: null,
      }]);
      commits.push(performance.now());
    }
  })();
  return {
    commits,
    async stop() {
      stopping = true;
      try {
        await loop;
      } finally {
        await sql.end({ timeout: 5 });
      }
    },
  };
}

/** The writer's commits in [from, to], and the longest time it went without one there. */
function writesBetween(commits: number[], from: number, to: number) {
  const inside = commits.filter((t) => t >= from && t <= to);
  let longestStallMs = 0;
  let previous = from;
  for (const t of [...inside, to]) {
    longestStallMs = Math.max(longestStallMs, t - previous);
    previous = t;
  }
  return { count: inside.length, longestStallMs: Math.round(longestStallMs) };
}

/** A test-only migration, numbered after every real one. */
function testMigration(offset: number, name: string, sql: string): Migration {
  const last = loadMigrations().at(-1)!.version;
  return { version: last + 1000 + offset, name, sql };
}

function capturedLog() {
  const lines: Fields[] = [];
  const log = createLogger("migrate", "info", (line) => lines.push(JSON.parse(line)));
  return { log, lines };
}

Deno.test("migrate: a no-transaction migration builds an index concurrently on a populated runs table while admissions keep committing", async () => {
  const db = await freshDatabase();
  const rows = 200_000;
  let writer: Writer | undefined;
  try {
    await insertTenant(db.sql, "acme");
    await db.sql`
      insert into runs (tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input,
                        source, status, max_attempts, finished_at)
      select 'acme', gen_random_uuid(), 'echo', 'echo', 1, jsonb_build_object('n', g),
             'test', 'succeeded', 3, now()
        from generate_series(1, ${rows}) g`;
    writer = startWriter(db.url, "acme");
    const w = writer;
    await waitFor("the writer to commit", () => w.commits.length >= 20);

    const m = testMigration(
      1,
      "concurrent_index",
      `${NO_TRANSACTION_DIRECTIVE}\n-- A test-only index, built on a table that is being written.\n` +
        "create index concurrently if not exists runs_migrate_test_idx\n" +
        "  on runs (tenant_id, (input ->> 'n'), created_at);\n",
    );
    // What Postgres says the build is doing, sampled from another connection:
    // the build's start and end are the first and last samples that see it.
    const monitor = createPool({ url: db.url, max: 1, applicationName: "poimen-test-monitor" });
    const seen: { at: number; command: string }[] = [];
    let migrating = true;
    const watching = (async () => {
      while (migrating) {
        const [p] = await monitor<{ command: string }[]>`
          select command from pg_stat_progress_create_index where datname = current_database()`;
        if (p) seen.push({ at: performance.now(), command: p.command });
      }
    })();
    const { log, lines } = capturedLog();
    const started = performance.now();
    let applied: number[];
    try {
      applied = await migrate(db.sql, [...loadMigrations(), m], log);
    } finally {
      migrating = false;
      await watching;
      await monitor.end({ timeout: 5 });
    }
    const ended = performance.now();
    assert.deepEqual(applied, [m.version]);
    assert.ok(seen.length >= 2, `the build was seen in progress only ${seen.length} times`);
    assert.ok(
      seen.every((s) => s.command === "CREATE INDEX CONCURRENTLY"),
      `built as ${[...new Set(seen.map((s) => s.command))]}`,
    );
    const build = writesBetween(w.commits, seen[0].at, seen.at(-1)!.at);
    const whole = writesBetween(w.commits, started, ended);
    console.error(
      `index build on ${rows} runs: ${Math.round(seen.at(-1)!.at - seen[0].at)} ms seen, ` +
        `${build.count} admissions committed during it, the writer's longest stall ` +
        `${build.longestStallMs} ms (${whole.longestStallMs} ms over the whole migration)`,
    );
    assert.ok(build.count > 0, "no admission committed while the index was being built");

    const [index] = await db.sql`
      select i.indisvalid, i.indisready from pg_index i
       where i.indexrelid = to_regclass('runs_migrate_test_idx')`;
    assert.deepEqual(index, { indisvalid: true, indisready: true });
    const [recorded] = await db
      .sql`select name from schema_migrations where version = ${m.version}`;
    assert.equal(recorded?.name, "concurrent_index");
    assert.deepEqual(lines.filter((l) => l.level === "warn"), []);
  } finally {
    await writer?.stop();
    await db.drop();
  }
});

Deno.test("migrate: a migration blocked by a long transaction gives up its lock request in time and retries while writers go on, and completes once it ends", async () => {
  const db = await freshDatabase();
  let writer: Writer | undefined;
  const long = await db.sql.reserve();
  try {
    await insertTenant(db.sql, "acme");
    // A long transaction that read runs: it holds ACCESS SHARE on runs until it ends.
    await long.unsafe("begin");
    await long`select count(*) from runs`;
    writer = startWriter(db.url, "acme");
    const w = writer;
    await waitFor("the writer to commit", () => w.commits.length >= 5);
    // ADD COLUMN needs ACCESS EXCLUSIVE: it waits for the long transaction, and
    // while it waits in the queue, every statement on runs waits behind it.
    const m = testMigration(
      2,
      "blocked_column",
      "alter table runs add column migrate_test_note text;\n",
    );
    const fast = { lockTimeoutMs: 150, retryBaseMs: 100, retryCapMs: 200 };

    const gaveUp = capturedLog();
    await assert.rejects(
      migrate(db.sql, [...loadMigrations(), m], gaveUp.log, { ...fast, lockAttempts: 2 }),
      /gave up after 2 tries: .*lock timeout/,
    );
    assert.equal(gaveUp.lines.filter((l) => l.level === "warn").length, 1);

    const { log, lines } = capturedLog();
    const started = performance.now();
    let done = false;
    const migrating = migrate(db.sql, [...loadMigrations(), m], log, {
      ...fast,
      lockAttempts: 1000,
    })
      .finally(() => done = true);
    const retries = () =>
      lines.filter((l) => l.msg === "migration could not take a lock in time; trying again");
    await waitFor("the migration to retry", () => retries().length >= 2, 10_000, 10);
    const before = w.commits.length;
    await waitFor("two more retries", () => retries().length >= 4, 10_000, 10);
    const waiting = w.commits.length - before;
    assert.equal(done, false, "the migration finished while the long transaction held its lock");
    assert.ok(waiting > 0, "no admission committed while the migration waited for its lock");
    assert.deepEqual(retries()[0].version, m.version);
    assert.deepEqual(retries().slice(0, 4).map((l) => l.attempt), [1, 2, 3, 4]);

    await long.unsafe("commit");
    assert.deepEqual(await migrating, [m.version]);
    const stall = writesBetween(w.commits, started, performance.now());
    console.error(
      `blocked migration: ${retries().length} retries, ${waiting} admissions committed over two ` +
        `of them, the writer's longest stall ${stall.longestStallMs} ms (lock_timeout 150 ms)`,
    );
    const [column] = await db.sql`
      select 1 from information_schema.columns
       where table_name = 'runs' and column_name = 'migrate_test_note'`;
    assert.ok(column, "the migration's column is there");
  } finally {
    await long.unsafe("rollback").catch(() => {});
    long.release();
    await writer?.stop();
    await db.drop();
  }
});

Deno.test("migrate: a failed concurrent build is not recorded, and the next run drops the invalid index it left and builds it again", async () => {
  const db = await freshDatabase();
  // One connection: what migrate leaves on it is what the next user gets.
  const sql = createPool({ url: db.url, max: 1, applicationName: "poimen-test" });
  try {
    await insertTenant(db.sql, "acme");
    await db.sql`
      insert into runs (tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input,
                        source, max_attempts, goal_id)
      select 'acme', gen_random_uuid(), 'echo', 'echo', 1, '{}', 'test', 3, 'g' || (g % 3)
        from generate_series(1, 6) g`;
    const m = testMigration(
      3,
      "unique_goal",
      `${NO_TRANSACTION_DIRECTIVE}\n` +
        "create unique index concurrently if not exists runs_migrate_test_uq on runs (goal_id);\n",
    );
    const validity = async () =>
      (await db.sql`select indisvalid from pg_index
                     where indexrelid = to_regclass('runs_migrate_test_uq')`)[0]?.indisvalid;

    // Duplicate goals: the build fails and leaves an invalid index behind.
    await assert.rejects(
      migrate(sql, [...loadMigrations(), m], silentLogger),
      /could not create unique index/,
    );
    assert.equal(await validity(), false);
    assert.equal(
      (await sql`select 1 from schema_migrations where version = ${m.version}`).length,
      0,
    );
    // The connection went back as it came: no lock_timeout, no migration lock.
    const [setting] = await sql`show lock_timeout`;
    assert.equal(setting.lock_timeout, "0");
    const [{ n }] = await db.sql`
      select count(*)::int as n from pg_locks
       where locktype = 'advisory'
         and database = (select oid from pg_database where datname = current_database())`;
    assert.equal(n, 0);

    // IF NOT EXISTS alone would take the invalid index for done.
    await db.sql`update runs set goal_id = run_id::text`;
    const { log, lines } = capturedLog();
    assert.deepEqual(await migrate(sql, [...loadMigrations(), m], log), [m.version]);
    assert.equal(await validity(), true);
    assert.ok(
      lines.some((l) =>
        String(l.msg).startsWith("dropping an invalid index") && l.index === "runs_migrate_test_uq"
      ),
    );
    assert.deepEqual(await migrate(sql, [...loadMigrations(), m], silentLogger), []);
  } finally {
    await sql.end({ timeout: 5 });
    await db.drop();
  }
});

Deno.test("migrate: two migrators racing over a no-transaction file and transactional ones apply each exactly once, and the one waiting for the lock never deadlocks the other's concurrent build", async () => {
  const db = await freshDatabase();
  const pools = [0, 1].map(() =>
    createPool({ url: db.url, max: 2, applicationName: "poimen-test-migrator" })
  );
  try {
    for (const round of [0, 1, 2]) {
      const table = `migrate_race_${round}`;
      // Every file leaves a row per run: a second run of any of them shows.
      const files = [
        testMigration(
          10 + 3 * round,
          "race_before",
          `create table ${table} (what text not null);\ninsert into ${table} values ('before');\n`,
        ),
        testMigration(
          11 + 3 * round,
          "race_concurrent",
          `${NO_TRANSACTION_DIRECTIVE}\ninsert into ${table} values ('no-transaction');\n` +
            // Holds the session lock long enough for the other to wait for it.
            "select pg_sleep(0.3);\n" +
            `create index concurrently if not exists ${table}_idx on runs (created_at);\n`,
        ),
        testMigration(12 + 3 * round, "race_after", `insert into ${table} values ('after');\n`),
      ];
      const logs = pools.map(() => capturedLog());
      const applied = await Promise.all(
        pools.map((sql, i) => migrate(sql, [...loadMigrations(), ...files], logs[i].log)),
      );
      assert.deepEqual(
        applied.flat().sort((a, b) => a - b),
        files.map((f) => f.version),
        `round ${round}: applied ${JSON.stringify(applied)}`,
      );
      const rows = await db.sql.unsafe(`select what from ${table} order by what`);
      assert.deepEqual(rows.map((r) => r.what), ["after", "before", "no-transaction"]);
      const [index] = await db.sql`
        select indisvalid from pg_index where indexrelid = to_regclass(${`${table}_idx`})`;
      assert.equal(index?.indisvalid, true);
      // A deadlock would have shown as a retry.
      assert.deepEqual(logs.flatMap((l) => l.lines.filter((x) => x.level === "warn")), []);
    }
  } finally {
    await Promise.all(pools.map((p) => p.end({ timeout: 5 })));
    await db.drop();
  }
});

Deno.test("migrate: a no-transaction file whose connection is killed between statements stops the run unrecorded, not going on unlocked on a new session", async () => {
  const db = await freshDatabase();
  const holder = createPool({ url: db.url, max: 1, applicationName: "poimen-test-holder" });
  try {
    await db.sql`create table migrate_kill (id integer)`;
    // Holds a lock a concurrent build waits for: the build times out and waits to try again.
    await holder.unsafe("begin");
    await holder`lock table migrate_kill in share mode`;
    const m = testMigration(
      20,
      "killed_session",
      `${NO_TRANSACTION_DIRECTIVE}\n` +
        "create index concurrently if not exists migrate_kill_idx on migrate_kill (id);\n" +
        "insert into migrate_kill values (1);\n",
    );
    const { log, lines } = capturedLog();
    const migrating = migrate(db.sql, [...loadMigrations(), m], log, {
      lockTimeoutMs: 100,
      lockAttempts: 5,
      retryBaseMs: 1_500,
      retryCapMs: 1_500,
    });
    const outcome = migrating.then(() => "resolved", (err: Error) => err);
    await waitFor("the build to time out", () => lines.some((l) => l.level === "warn"), 10_000, 10);
    // Its session, idle in the backoff, is the one holding the migration lock.
    const killed = await db.sql`
      select pg_terminate_backend(pid) as done from pg_locks
       where locktype = 'advisory' and granted
         and database = (select oid from pg_database where datname = current_database())`;
    assert.deepEqual(killed.map((k) => k.done), [true]);
    // From here the build would succeed on any session.
    await holder.unsafe("commit");

    const err = await outcome;
    assert.ok(err instanceof Error, `migrate ${err}`);
    assert.match(err.message, /lost its database connection/);
    const [recorded] = await db.sql`select 1 from schema_migrations where version = ${m.version}`;
    assert.equal(recorded, undefined);
    const [index] = await db.sql`select to_regclass('migrate_kill_idx') as oid`;
    assert.equal(index.oid, null, "a statement ran on the new session, without the lock");
    const [{ n }] = await db.sql`select count(*)::int as n from migrate_kill`;
    assert.equal(n, 0);
  } finally {
    await holder.unsafe("rollback").catch(() => {});
    await holder.end({ timeout: 5 });
    await db.drop();
  }
});
