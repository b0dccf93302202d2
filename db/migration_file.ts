/**
 * What the migration runner (db/migrate.ts) and the migration lint
 * (dev/migration_lint.ts) read in a migration's SQL: its directive, its
 * statements one by one, and the index a concurrent build creates.
 */

/**
 * The first line that makes a migration run outside a transaction, one
 * statement at a time, each in a transaction of its own: what `CREATE INDEX
 * CONCURRENTLY` (which refuses to run in a transaction block) and a
 * separate `VALIDATE CONSTRAINT` need. Such a file must be idempotent (a
 * failure part way leaves the statements before it applied, and the file
 * runs again from its first statement): `create index concurrently if not
 * exists`, `drop index concurrently if exists`.
 */
export const NO_TRANSACTION_DIRECTIVE = "-- poimen:no-transaction";

/** Whether the migration's SQL opens with {@link NO_TRANSACTION_DIRECTIVE}. */
export function runsOutsideTransaction(sql: string): boolean {
  const first = sql.replace(/^\uFEFF/, "").split("\n", 1)[0].trim();
  return first === NO_TRANSACTION_DIRECTIVE;
}

/**
 * Splits SQL into its statements (without the terminating `;`, trimmed,
 * empty ones left out), reading quotes, quoted identifiers, dollar quotes
 * and comments as Postgres does so a `;` inside any of them splits nothing.
 * Comments stay in the statement text (Postgres ignores them).
 */
export function splitStatements(sql: string): string[] {
  const out: string[] = [];
  let start = 0;
  let i = 0;
  const n = sql.length;
  while (i < n) {
    const c = sql[i];
    const next = sql[i + 1];
    if (c === "-" && next === "-") {
      const end = sql.indexOf("\n", i);
      i = end < 0 ? n : end + 1;
    } else if (c === "/" && next === "*") {
      // Block comments nest in Postgres.
      let depth = 1;
      i += 2;
      while (i < n && depth > 0) {
        if (sql[i] === "/" && sql[i + 1] === "*") depth++, i += 2;
        else if (sql[i] === "*" && sql[i + 1] === "/") depth--, i += 2;
        else i++;
      }
    } else if (c === "'" || c === '"') {
      // A doubled quote inside is an escaped one: the loop just reopens.
      const end = sql.indexOf(c, i + 1);
      i = end < 0 ? n : end + 1;
    } else if (c === "$") {
      const tag = /^\$([A-Za-z_][A-Za-z0-9_]*)?\$/.exec(sql.slice(i, i + 64));
      // `$1` (a parameter) or a `$` inside an identifier is no quote.
      const inWord = i > 0 && /[A-Za-z0-9_]/.test(sql[i - 1]);
      if (tag && !inWord) {
        const end = sql.indexOf(tag[0], i + tag[0].length);
        i = end < 0 ? n : end + tag[0].length;
      } else {
        i++;
      }
    } else if (c === ";") {
      out.push(sql.slice(start, i));
      start = ++i;
    } else {
      i++;
    }
  }
  out.push(sql.slice(start));
  return out.map((s) => s.trim()).filter((s) => stripComments(s).trim() !== "");
}

/** `sql` with its `--` and block comments replaced by a space (quotes kept). */
export function stripComments(sql: string): string {
  return sql.replace(/\/\*[\s\S]*?\*\//g, " ").replace(/--[^\n]*/g, " ");
}

/**
 * The index a `CREATE [UNIQUE] INDEX CONCURRENTLY [IF NOT EXISTS] name`
 * statement builds (as written, quotes removed), or undefined for any other
 * statement or an unnamed index.
 */
export function concurrentIndexName(statement: string): string | undefined {
  const m =
    /^\s*create\s+(?:unique\s+)?index\s+concurrently\s+(?:if\s+not\s+exists\s+)?("(?:[^"]|"")+"|[a-z_][a-z0-9_$]*)\s+on\b/i
      .exec(stripComments(statement));
  if (!m) return undefined;
  const name = m[1];
  return name.startsWith('"') ? name.slice(1, -1).replaceAll('""', '"') : name.toLowerCase();
}
