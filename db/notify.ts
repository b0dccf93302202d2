/**
 * Wake-up notifications. Each is sent after the transaction that made work
 * committed, never inside it (a NOTIFY in every admission transaction
 * serializes all commits behind one cluster-wide lock), and callers coalesce
 * them with a `Waker` (core/waker.ts). Listeners also poll, so a lost
 * notification only costs latency.
 */
import type { Sql } from "./pool.ts";

/** The channel that says "work_events rows are pending": the outbox publisher listens on it. */
export const OUTBOX_CHANNEL = "poimen_outbox";

/** `NOTIFY` each of `channels` (empty payload) in one statement: one round trip, one commit. */
export async function notifyChannels(sql: Sql, channels: readonly string[]): Promise<void> {
  await sql`select pg_notify(c, '') from unnest(${channels as string[]}::text[]) as c`;
}

/** The `LISTEN`/`NOTIFY` channel that says "runs are queued". */
export const QUEUE_CHANNEL = "poimen_runs";

/**
 * The `LISTEN`/`NOTIFY` channel that says "a cancel was requested for the
 * running run `<tenant>/<run_id>`" (the payload). Only a hint to look now:
 * the worker reads the request from the row, in a heartbeat fenced by
 * attempt, never from the payload.
 */
export const CANCEL_CHANNEL = "poimen_cancel";

/**
 * `NOTIFY poimen_cancel '<tenant>/<run_id>'`: tells the worker running that
 * run to look at it now rather than at its next heartbeat. Sent after the
 * request committed; losing it only delays the cancel by a heartbeat.
 */
export async function notifyCancel(sql: Sql, tenantId: string, runId: string): Promise<void> {
  await sql`select pg_notify(${CANCEL_CHANNEL}, ${`${tenantId}/${runId}`})`;
}

/** `notifyCancel` for each of `runIds` of one tenant, in one statement (a cancel cascade's). */
export async function notifyCancels(sql: Sql, tenantId: string, runIds: string[]): Promise<void> {
  if (runIds.length === 0) return;
  await sql`select pg_notify(${CANCEL_CHANNEL}, ${tenantId} || '/' || r)
              from unnest(${runIds}::text[]) as r`;
}

/**
 * `NOTIFY poimen_runs`: wakes listening workers. Call it after the
 * transaction that queued runs committed, not inside it, and coalesce calls
 * (see `Waker` in core/waker.ts).
 */
export async function notifyQueued(sql: Sql): Promise<void> {
  await sql`select pg_notify(${QUEUE_CHANNEL}, '')`;
}

/**
 * The channel that says "workflow versions were registered" (and "a worker
 * started or stopped hosting some", which changes what queued runs wait
 * for): APIs listen on it to refresh their catalog. Sent after the
 * registration committed; APIs also refresh on a timer and on an unknown
 * workflow, so a lost one only delays.
 */
export const CATALOG_CHANNEL = "poimen_catalog";

/** `NOTIFY poimen_catalog`: after a registration, or a worker's start or stop, committed. */
export async function notifyCatalog(sql: Sql): Promise<void> {
  await sql`select pg_notify(${CATALOG_CHANNEL}, '')`;
}
