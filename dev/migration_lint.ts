/**
 * The rules a migration must follow so it never stops the application for
 * the length of a table scan (tests/dev_migration_lint_test.ts holds every
 * migration from {@link FIRST_LINTED_VERSION} on to them). On the tables that
 * grow with the runs ({@link LARGE_TABLES}):
 *
 * - an index is built `CONCURRENTLY IF NOT EXISTS`, in a no-transaction file
 *   (`-- poimen:no-transaction` first line): a plain build holds a SHARE lock
 *   (no insert, update or delete) for the whole build;
 * - a CHECK or FOREIGN KEY constraint is added `NOT VALID`, and validated by
 *   a `VALIDATE CONSTRAINT` in a no-transaction file (it then holds only a
 *   SHARE UPDATE EXCLUSIVE lock, which writers do not wait for); a UNIQUE or
 *   PRIMARY KEY constraint is added `USING INDEX` of an index built
 *   concurrently; a constraint on a column added in the same statement (a
 *   column's `check`, `references`) is validated at once, so is refused;
 * - no column changes type or becomes `NOT NULL` (a rewrite or a full scan
 *   under an ACCESS EXCLUSIVE lock).
 *
 * A no-transaction file runs again from its first statement after a failure,
 * so its statements must be idempotent: `create index concurrently if not
 * exists`, `drop index … if exists`, no `add constraint` (which has no `if
 * not exists`).
 *
 * A statement that must break a rule anyway says why in a comment of its
 * own, just above it: `-- poimen:lock-ok: <why>`. Migrations before
 * {@link FIRST_LINTED_VERSION} are applied in existing databases and
 * unchanged (their tables were small, or new, when they were written).
 */
import type { Migration } from "../db/migrate.ts";
import { runsOutsideTransaction, splitStatements, stripComments } from "../db/migration_file.ts";

/** The first migration the rules apply to: the ones before it are applied already, as they are. */
export const FIRST_LINTED_VERSION = 14;

/**
 * The tables with a row (or more) per run, or per concurrency key ever used:
 * millions of rows, written on every admission and claim.
 */
export const LARGE_TABLES: ReadonlySet<string> = new Set([
  "runs",
  "work_events",
  "concurrency_slots",
  "run_steps",
  "run_signals",
]);

/** The comment that waives the rules for the statement just below it, with a reason. */
const WAIVER = /--[ \t]*poimen:lock-ok:[ \t]*\S/;

/** What in `m` breaks the rules, one line each; empty when it follows them. */
export function lintMigration(m: Migration): string[] {
  const noTransaction = runsOutsideTransaction(m.sql);
  const problems: string[] = [];
  for (const [i, statement] of splitStatements(m.sql).entries()) {
    if (WAIVER.test(statement)) continue;
    const text = stripComments(statement).replace(/\s+/g, " ").trim().toLowerCase();
    for (const problem of statementProblems(text, noTransaction)) {
      problems.push(`${pad(m.version)}_${m.name}.sql, statement ${i + 1}: ${problem}`);
    }
  }
  return problems;
}

function pad(version: number): string {
  return String(version).padStart(3, "0");
}

const IDENT = String.raw`(?:"(?:[^"]|"")+"|[a-z_][a-z0-9_$]*)`;
const TABLE = String.raw`((?:${IDENT}\.)?${IDENT})`;
const CREATE_INDEX = new RegExp(
  String
    .raw`^create (?:unique )?index (concurrently )?(if not exists )?(?:${IDENT} )?on (?:only )?${TABLE}`,
);
const ALTER_TABLE = new RegExp(String.raw`^alter table (?:if exists )?(?:only )?${TABLE} (.*)$`);

/** The table's name without a `public.` schema or quotes. */
function tableName(raw: string): string {
  const parts = raw.split(".").map((p) => p.replace(/^"|"$/g, ""));
  return parts.length === 2 && parts[0] === "public" ? parts[1] : parts.join(".");
}

function statementProblems(text: string, noTransaction: boolean): string[] {
  const problems: string[] = [];
  const index = CREATE_INDEX.exec(text);
  if (index) {
    const [, concurrently, ifNotExists, table] = index;
    if (LARGE_TABLES.has(tableName(table)) && (!concurrently || !noTransaction)) {
      problems.push(
        `an index on ${tableName(table)} is built CONCURRENTLY, in a no-transaction file ` +
          `(first line "-- poimen:no-transaction"): a plain build stops every write for its length`,
      );
    }
    if (noTransaction && !(concurrently && ifNotExists)) {
      problems.push(
        "a no-transaction file builds indexes CONCURRENTLY IF NOT EXISTS (it may run again)",
      );
    }
  }
  if (
    noTransaction && /^drop index /.test(text) &&
    !/^drop index (concurrently )?if exists /.test(text)
  ) {
    problems.push("a no-transaction file drops indexes IF EXISTS (it may run again)");
  }
  const alter = ALTER_TABLE.exec(text);
  if (alter) {
    const large = LARGE_TABLES.has(tableName(alter[1]));
    for (const action of topLevelActions(alter[2])) {
      problems.push(...actionProblems(action, large, noTransaction, tableName(alter[1])));
    }
  }
  return problems;
}

function actionProblems(
  action: string,
  large: boolean,
  noTransaction: boolean,
  table: string,
): string[] {
  const problems: string[] = [];
  const addConstraint = /^add (?:constraint \S+ )?(check|foreign key|unique|primary key|exclude)\b/
    .exec(action);
  if (addConstraint && noTransaction) {
    problems.push(
      "a no-transaction file adds no constraint (ADD CONSTRAINT has no IF NOT EXISTS): " +
        "add it NOT VALID in a transaction, validate it in a no-transaction file",
    );
  }
  if (!large) return problems;
  if (addConstraint) {
    const kind = addConstraint[1];
    const ok = kind === "check" || kind === "foreign key"
      ? /\bnot valid\b/.test(action)
      : /\busing index\b/.test(action);
    if (!ok) {
      problems.push(
        kind === "check" || kind === "foreign key"
          ? `a ${kind} constraint on ${table} is added NOT VALID, then validated in a ` +
            "no-transaction file: validating it here scans the table under an ACCESS EXCLUSIVE lock"
          : `a ${kind} constraint on ${table} is added USING INDEX of an index built ` +
            "concurrently: building it here stops every write for its length",
      );
    }
  } else if (/^add (?!constraint\b)/.test(action) && /\b(check|references)\b/.test(action)) {
    problems.push(
      `a column added to ${table} has no constraint of its own (it is validated at once, under ` +
        "an ACCESS EXCLUSIVE lock): add the column, then the constraint NOT VALID",
    );
  }
  if (/^validate constraint\b/.test(action) && !noTransaction) {
    problems.push(
      `a constraint of ${table} is validated in a no-transaction file: in the file's ` +
        "transaction it keeps the ACCESS EXCLUSIVE lock of what came before for its scan",
    );
  }
  if (/^alter (?:column )?\S+ (?:set data )?type\b/.test(action)) {
    problems.push(
      `a column of ${table} changes type: that rewrites the table under an ACCESS EXCLUSIVE lock`,
    );
  }
  if (/^alter (?:column )?\S+ set not null\b/.test(action)) {
    problems.push(
      `a column of ${table} becomes NOT NULL: that scans the table under an ACCESS EXCLUSIVE ` +
        "lock; add a CHECK (… is not null) NOT VALID, validate it, then waive the SET NOT NULL " +
        "(Postgres then skips the scan)",
    );
  }
  return problems;
}

/** An ALTER TABLE's actions: its text split at the commas outside parentheses and quotes. */
function topLevelActions(text: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let start = 0;
  let quote: string | undefined;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quote) {
      if (c === quote) quote = undefined;
    } else if (c === "'" || c === '"') quote = c;
    else if (c === "(") depth++;
    else if (c === ")") depth--;
    else if (c === "," && depth === 0) {
      out.push(text.slice(start, i).trim());
      start = i + 1;
    }
  }
  out.push(text.slice(start).trim());
  return out.filter(Boolean);
}
