/**
 * The Postgres connection pool (postgres.js). Every runtime SQL statement
 * lives in a named function of a `db/` module and takes this `Sql` as its
 * first argument.
 */
import postgres from "postgres";
import { PoimenError } from "../core/errors.ts";

export type Sql = postgres.Sql;
export type TransactionSql = postgres.TransactionSql;
/** One connection of the pool, kept for a caller until it calls `release()`. */
export type ReservedSql = postgres.ReservedSql;
/** A value for `sql.json()`: sent as one jsonb parameter. */
export type JSONValue = postgres.JSONValue;

export interface PoolOptions {
  url: string;
  max: number;
  applicationName: string;
}

/** Opens a lazily connecting pool. */
export function createPool(opts: PoolOptions): Sql {
  return postgres(opts.url, {
    max: opts.max,
    idle_timeout: 60,
    connect_timeout: 5,
    max_lifetime: 30 * 60,
    onnotice: () => {},
    connection: { application_name: opts.applicationName },
  });
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

/** Wraps a database failure as the typed error the API maps to 503 when it is an outage. */
export function toDbError(err: unknown): unknown {
  if (err instanceof PoimenError) return err;
  if (isUnavailable(err)) {
    return new PoimenError("database-unavailable", "the database is unavailable", { cause: err });
  }
  return err;
}

/** `select 1`: the readiness probe. */
export async function ping(sql: Sql): Promise<void> {
  await sql`select 1`;
}
