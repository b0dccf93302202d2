/**
 * The Postgres connection pool (postgres.js). Every runtime SQL statement
 * lives in a named function of a `db/` module and takes this `Sql` as its
 * first argument.
 */
import postgres from "postgres";
import { PoimenError } from "../core/errors.ts";

export type Sql = postgres.Sql;
export type TransactionSql = postgres.TransactionSql;
/** A value for `sql.json()`: sent as one jsonb parameter. */
export type JSONValue = postgres.JSONValue;

export interface PoolOptions {
  url: string;
  max: number;
  applicationName: string;
}

/**
 * Runs `fn` in a transaction of `sql`: a new one on a pool, a savepoint when
 * `sql` is already a transaction (a caller's, or a test's that is rolled
 * back). A statement's locks last until the outermost transaction ends.
 */
export async function inTransaction<T>(sql: Sql, fn: (tx: Sql) => Promise<T>): Promise<T> {
  const open = sql as unknown as Partial<TransactionSql>;
  if (typeof open.savepoint === "function") {
    return await open.savepoint((tx) => fn(tx as unknown as Sql)) as T;
  }
  return await sql.begin((tx) => fn(tx as unknown as Sql)) as T;
}

/**
 * Opens a lazily connecting pool. Its sessions start with JIT off (a
 * startup parameter: no round trip). Every statement of ours is a few index
 * probes that run in milliseconds, but JIT compiles a statement whose
 * estimated cost passes `jit_above_cost` (100,000 by default), and the
 * estimates of a claim are far above what it reads: a claim of 128 runs,
 * estimated at 160,000-200,000, ran 90-140 ms of which JIT took 50-95, and
 * its generic plan (estimated at 143,000 with no statistics, 23 million
 * analyzed) 100 ms to 1 s for a 2 ms execution (docs/architecture.md, the
 * claim).
 */
export function createPool(opts: PoolOptions): Sql {
  return postgres(opts.url, {
    max: opts.max,
    idle_timeout: 60,
    connect_timeout: 5,
    max_lifetime: 30 * 60,
    onnotice: () => {},
    connection: { application_name: opts.applicationName, jit: "off" },
  });
}

/** What {@link createSessionPool} needs besides the pool whose settings it copies. */
export interface SessionPoolOptions {
  /** Told when the session's connection closes, whatever closed it (not after {@link Sql.end}). */
  onclose: () => void;
  /** Run-time parameters the session starts with (sent at connect, so a new session has them too). */
  parameters?: Record<string, string>;
}

/**
 * Opens a pool of one connection with `from`'s connection settings (hosts,
 * port, database, user, password, TLS, types, application name): a session
 * for one caller alone, for work that must stay on one session outside a
 * transaction (a session-level lock held across statements). It never idles
 * or ages out, so only a failure closes it; the caller must end it. Unlike
 * a reserved connection of a shared pool (vendor/postgres/PATCHES.md), nobody else is ever given
 * its connection, and `onclose` tells the caller its session is gone before
 * the pool would open a new one for its next statement.
 */
export function createSessionPool(from: Sql, opts: SessionPoolOptions): Sql {
  const parsed = from.options;
  // Parsed options are taken as they are (postgres.js does the same for its
  // replication connection); its per-pool state must be fresh.
  return postgres({
    ...parsed,
    shared: { retries: 0, typeArrayMap: {} },
    parameters: {},
    max: 1,
    idle_timeout: null,
    max_lifetime: null,
    connection: { ...parsed.connection, ...opts.parameters },
    onclose: opts.onclose,
  } as unknown as postgres.Options<Record<string, postgres.PostgresType>>);
}

// SQLSTATE classes that mean "the database is not there right now" rather
// than "this statement is wrong": connection exceptions, operator
// intervention (shutdown), insufficient resources.
const UNAVAILABLE_SQLSTATE = /^(08|57P0|53)/;
const UNAVAILABLE_ERRNO = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ETIMEDOUT",
  "EPIPE",
  "CONNECTION_CLOSED",
  "CONNECTION_ENDED",
  "CONNECTION_DESTROYED",
  "CONNECT_TIMEOUT",
]);

/** Whether `err` says Postgres is unreachable (→ 503, retryable) rather than a bug. */
export function isUnavailable(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const code = (err as { code?: string }).code ?? "";
  return UNAVAILABLE_ERRNO.has(code) || UNAVAILABLE_SQLSTATE.test(code);
}

// What a refused value was, by SQLSTATE, in words safe to show a caller:
// Postgres' own message may quote SQL, a column or another row's value.
const REFUSED_DATA: Record<string, string> = {
  "22001": "a string is too long",
  "22003": "a number is out of range",
  "22007": "a date or time is malformed",
  "22008": "a date or time is out of range",
  "22009": "a time zone offset is out of range",
  "22021": "a string holds a character the database cannot store",
  "22P02": "a value is malformed",
  "22P05": "a string holds a character the database cannot store",
  "23502": "a required value is missing",
  "23503": "a value refers to something that does not exist",
  "23514": "a value is outside what is allowed",
};

/**
 * Whether `err` is Postgres refusing the data of a statement: a data
 * exception (SQLSTATE class 22) or an integrity violation (class 23) other
 * than a unique violation (23505: the dispatch key's dedup is `ON CONFLICT`
 * and never throws, and any other is a race worth retrying).
 */
export function isRefusedData(err: unknown): boolean {
  if (!(err instanceof Error) || err.name !== "PostgresError") return false;
  const code = (err as { code?: string }).code ?? "";
  return /^2[23]/.test(code) && code !== "23505";
}

/**
 * Wraps a database failure as the typed error the API maps: an outage to a
 * retryable 503 (`database-unavailable`), a value Postgres refused to a
 * final 422 (`invalid-data`, with a safe message and the SQLSTATE, never
 * Postgres' own text); anything else passes through (a 500).
 */
export function toDbError(err: unknown): unknown {
  if (err instanceof PoimenError) return err;
  if (isUnavailable(err)) {
    return new PoimenError("database-unavailable", "the database is unavailable", { cause: err });
  }
  if (isRefusedData(err)) {
    const code = (err as { code: string }).code;
    const what = REFUSED_DATA[code] ?? "a value is one the database does not accept";
    return new PoimenError(
      "invalid-data",
      `the database refused the request's data: ${what} (SQLSTATE ${code})`,
      { cause: err },
    );
  }
  return err;
}

/** `select 1`: the readiness probe. */
export async function ping(sql: Sql): Promise<void> {
  await sql`select 1`;
}
