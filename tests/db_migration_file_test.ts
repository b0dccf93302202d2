/** Reading a migration file: its directive, its statements, the index a concurrent build makes. */
import assert from "node:assert/strict";
import {
  concurrentIndexName,
  NO_TRANSACTION_DIRECTIVE,
  runsOutsideTransaction,
  splitStatements,
} from "../db/migration_file.ts";
import { loadMigrations } from "../db/migrate.ts";

Deno.test("migration file: only a first line of exactly the directive runs a file outside a transaction", () => {
  assert.equal(runsOutsideTransaction(`${NO_TRANSACTION_DIRECTIVE}\ncreate index …;`), true);
  assert.equal(runsOutsideTransaction(`  ${NO_TRANSACTION_DIRECTIVE}  \r\nselect 1;`), true);
  assert.equal(runsOutsideTransaction(`-- a comment\n${NO_TRANSACTION_DIRECTIVE}\n`), false);
  assert.equal(runsOutsideTransaction("-- poimen:no-transactions\n"), false);
  assert.equal(runsOutsideTransaction("select 1;"), false);
  // The migrations that build indexes concurrently (dev/migration_lint.ts) or validate a
  // constraint without stopping writes (029), and no other.
  assert.deepEqual(
    loadMigrations().filter((m) => runsOutsideTransaction(m.sql)).map((m) => m.version),
    [16, 22, 25, 29, 33],
  );
});

Deno.test("migration file: statements split at the semicolons outside quotes, dollar quotes and comments", () => {
  const sql = `${NO_TRANSACTION_DIRECTIVE}
-- header; with a semicolon
create index concurrently if not exists a_idx on runs (x);
insert into t values ('a;b', 'it''s; fine', "odd;name");
/* block; /* nested; */ still; */ select 1;
do $body$ begin perform 1; end $body$;
select $$x;y$$, $1::int;
;;
-- trailing comment only; nothing to run
`;
  assert.deepEqual(splitStatements(sql), [
    `${NO_TRANSACTION_DIRECTIVE}\n-- header; with a semicolon\n` +
    "create index concurrently if not exists a_idx on runs (x)",
    `insert into t values ('a;b', 'it''s; fine', "odd;name")`,
    "/* block; /* nested; */ still; */ select 1",
    "do $body$ begin perform 1; end $body$",
    "select $$x;y$$, $1::int",
  ]);
  assert.deepEqual(splitStatements("select 1"), ["select 1"]);
  assert.deepEqual(splitStatements("  -- nothing\n"), []);
});

Deno.test("migration file: every existing migration splits into statements that rejoin to it", () => {
  for (const m of loadMigrations()) {
    const statements = splitStatements(m.sql);
    assert.ok(statements.length >= 1, `${m.name}: no statement`);
    // Nothing is lost: the statements are the file's text in order, less separators.
    const squash = (s: string) => s.replace(/[\s;]/g, "");
    assert.equal(squash(statements.join("")), squash(m.sql), m.name);
  }
});

Deno.test("migration file: the index a concurrent build makes is named, unquoted and folded as Postgres folds it", () => {
  assert.equal(
    concurrentIndexName("create index concurrently if not exists Runs_X_idx on runs (a)"),
    "runs_x_idx",
  );
  assert.equal(
    concurrentIndexName('-- why\nCREATE UNIQUE INDEX CONCURRENTLY "Odd ""Name" ON runs (a)'),
    'Odd "Name',
  );
  assert.equal(concurrentIndexName("create index concurrently on runs (a)"), undefined);
  assert.equal(concurrentIndexName("create index runs_x_idx on runs (a)"), undefined);
  assert.equal(concurrentIndexName("drop index concurrently if exists runs_x_idx"), undefined);
});
