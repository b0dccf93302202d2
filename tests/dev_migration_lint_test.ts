/**
 * The migration rules (dev/migration_lint.ts): every migration from
 * FIRST_LINTED_VERSION on follows them, and they catch what they are for.
 */
import assert from "node:assert/strict";
import { FIRST_LINTED_VERSION, LARGE_TABLES, lintMigration } from "../dev/migration_lint.ts";
import { loadMigrations, type Migration } from "../db/migrate.ts";
import { NO_TRANSACTION_DIRECTIVE } from "../db/migration_file.ts";

const NO_TX = `${NO_TRANSACTION_DIRECTIVE}\n`;

function lint(sql: string): string[] {
  return lintMigration({ version: 99, name: "example", sql });
}

Deno.test("migration lint: every migration from the first linted one on follows the rules", () => {
  const checked: Migration[] = loadMigrations().filter((m) => m.version >= FIRST_LINTED_VERSION);
  const problems = checked.flatMap(lintMigration);
  assert.deepEqual(
    problems,
    [],
    `migrations that would stop the application:\n${problems.join("\n")}`,
  );
});

Deno.test("migration lint: the applied migrations that built indexes and constraints in place are what it refuses", () => {
  // Written when runs was small or new; a new migration doing the same is refused.
  const byName = new Map(loadMigrations().map((m) => [m.name, m]));
  const flagged = (name: string) => lintMigration(byName.get(name)!);
  assert.match(flagged("finished_runs_index").join("\n"), /an index on runs is built CONCURRENTLY/);
  assert.match(
    flagged("plan_proof_indexes").join("\n"),
    /check constraint on runs is added NOT VALID/,
  );
  assert.match(
    flagged("parked_events").join("\n"),
    /check constraint on work_events is added NOT VALID/,
  );
  assert.match(
    flagged("flow_control").join("\n"),
    /a column added to runs has no constraint of its own/,
  );
  assert.match(
    flagged("concurrency_waiting_index").join("\n"),
    /an index on concurrency_slots is built CONCURRENTLY/,
  );
  // Small tables: the catalog, tokens, tenants.
  assert.deepEqual(flagged("tenant_quotas"), []);
  assert.deepEqual(flagged("token_management"), []);
  assert.deepEqual(flagged("workflow_catalog").filter((p) => !/on runs\b/.test(p)), []);
});

Deno.test("migration lint: an index on a large table is built concurrently, if not exists, outside a transaction", () => {
  for (const table of LARGE_TABLES) {
    assert.equal(lint(`create index ${table}_x_idx on ${table} (a);`).length, 1, table);
  }
  assert.equal(lint("create index concurrently if not exists runs_x_idx on runs (a);").length, 1);
  assert.equal(lint("CREATE UNIQUE INDEX runs_x ON public.runs (a);").length, 1);
  assert.equal(lint(`${NO_TX}create index concurrently runs_x_idx on runs (a);`).length, 1);
  assert.deepEqual(
    lint(`${NO_TX}create index concurrently if not exists runs_x_idx on only runs (a);`),
    [],
  );
  assert.deepEqual(lint("create index api_tokens_x_idx on api_tokens (name);"), []);
  assert.deepEqual(lint(`${NO_TX}drop index concurrently if exists runs_x_idx;`), []);
  assert.equal(lint(`${NO_TX}drop index concurrently runs_x_idx;`).length, 1);
});

Deno.test("migration lint: a constraint on a large table is added NOT VALID and validated outside a transaction", () => {
  assert.equal(lint("alter table runs add constraint c check (priority > -100);").length, 1);
  assert.equal(lint("alter table runs add check (priority > -100);").length, 1);
  assert.equal(
    lint("alter table work_events add constraint f foreign key (tenant_id) references tenants;")
      .length,
    1,
  );
  assert.deepEqual(
    lint("alter table runs add constraint c check (priority > -100) not valid;"),
    [],
  );
  assert.equal(lint("alter table runs add constraint u unique (tenant_id, goal_id);").length, 1);
  assert.deepEqual(lint("alter table runs add constraint u unique using index runs_u_idx;"), []);
  // In the file's transaction the validation keeps the ADD's ACCESS EXCLUSIVE lock.
  assert.equal(
    lint(
      "alter table runs add constraint c check (a) not valid;\nalter table runs validate constraint c;",
    )
      .length,
    1,
  );
  assert.deepEqual(lint(`${NO_TX}alter table runs validate constraint c;`), []);
  // No IF NOT EXISTS for a constraint: a no-transaction file cannot add one.
  assert.equal(lint(`${NO_TX}alter table runs add constraint c check (a) not valid;`).length, 1);
  // A new column's own constraint is validated at once; a comma inside it splits nothing.
  assert.equal(
    lint("alter table runs add column n int check (n in (1, 2)), add column m text;").length,
    1,
  );
  assert.equal(lint("alter table runs add column t uuid references tenants;").length, 1);
  assert.deepEqual(lint("alter table runs add column n int, add column m text default 'a,b';"), []);
  assert.deepEqual(lint("alter table tenants add column n int check (n > 0);"), []);
});

Deno.test("migration lint: no column of a large table changes type or becomes not null, unless waived with a reason", () => {
  assert.equal(lint("alter table runs alter column source type varchar(200);").length, 1);
  assert.equal(lint("alter table runs alter source set data type varchar(200);").length, 1);
  assert.equal(lint("alter table runs alter column goal_id set not null;").length, 1);
  assert.deepEqual(
    lint(
      "-- poimen:lock-ok: runs_goal_not_null (validated in 020) proves it, so no scan\n" +
        "alter table runs alter column goal_id set not null;",
    ),
    [],
  );
  // A waiver names its reason, and covers only the statement below it.
  assert.equal(
    lint("-- poimen:lock-ok:\nalter table runs alter column goal_id set not null;").length,
    1,
  );
  assert.equal(
    lint(
      "-- poimen:lock-ok: proven\nalter table runs alter column a set not null;\n" +
        "alter table runs alter column b set not null;",
    ).length,
    1,
  );
});
