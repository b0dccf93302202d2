/**
 * Wake-up notifications. Each is sent after the transaction that made work
 * committed, never inside it (a NOTIFY in every admission transaction
 * serializes all commits behind one cluster-wide lock), and callers coalesce
 * them with a `Waker` (core/waker.ts). Listeners also poll, so a lost
 * notification only costs latency.
 */
import type { Sql } from "./pool.ts";

/** The channel that says "work_events rows are pending": the outbox relay listens on it. */
export const OUTBOX_CHANNEL = "poimen_outbox";

/** `NOTIFY` each of `channels` (empty payload) in one statement: one round trip, one commit. */
export async function notifyChannels(sql: Sql, channels: readonly string[]): Promise<void> {
  await sql`select pg_notify(c, '') from unnest(${channels as string[]}::text[]) as c`;
}
