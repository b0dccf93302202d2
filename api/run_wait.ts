/**
 * `Prefer: wait=N` (RFC 7240) on `GET /v1/runs/{id}` and `POST /v1/runs`:
 * the answer comes once the run is final, or after N seconds (at most
 * `MAX_WAIT_SECONDS`), whichever is first, with the run as it then is and
 * `Preference-Applied: wait=<the seconds applied>`. Woken by the API's
 * `RunWatch` (api/run_watch.ts), never by polling per caller.
 *
 * A tenant that holds its share of waits and streams (RUN_WATCHERS_PER_TENANT)
 * is answered at once, with the run as it is and no `Preference-Applied`:
 * a preference a server does not apply is ignored (RFC 7240), the answer
 * stays what the request asked for (a `POST`'s run is admitted either way,
 * so an error would invite a retry of an admission that succeeded), and the
 * client, seeing no wait applied, asks again at its own pace.
 */
import { PoimenError } from "../core/errors.ts";
import { SECOND } from "../core/time.ts";
import type { Sql } from "../db/pool.ts";
import { type RunDetailRow, selectRun } from "../db/runs.ts";
import { FINAL_STATUSES, MAX_WAIT_SECONDS } from "../contracts/wire.ts";
import type { RunWatch } from "./run_watch.ts";

/**
 * The seconds to wait that a `Prefer` header asks for, bounded by
 * `MAX_WAIT_SECONDS`; undefined when it asks for no wait (or not in a form
 * RFC 7240 allows: a preference the server does not understand is ignored).
 */
export function preferredWait(header: string | undefined | null): number | undefined {
  if (!header) return undefined;
  for (const preference of header.split(",")) {
    const m = /^\s*wait\s*=\s*"?(\d{1,10})"?\s*(?:;.*)?$/i.exec(preference);
    if (m) return Math.min(Number(m[1]), MAX_WAIT_SECONDS);
  }
  return undefined;
}

/** What `readRunWaiting` read: the run (undefined when none), and whether the wait was applied. */
export interface WaitedRun {
  row: RunDetailRow | undefined;
  /** False when the tenant held its share of watchers: answered without waiting. */
  applied: boolean;
}

/**
 * Reads the run, and while it is not final waits for it to change, until
 * `seconds` passed or `signal` (the caller going away) aborts; resolves
 * with the run as last read, or undefined when it does not exist (for this
 * tenant). Holds a watcher slot while it waits (`busy` when none is free;
 * past the tenant's share, no wait: see the module comment).
 */
export async function readRunWaiting(
  sql: Sql,
  watch: RunWatch,
  tenantId: string,
  runId: string,
  seconds: number,
  signal: AbortSignal,
): Promise<WaitedRun> {
  const read = () => selectRun(sql, tenantId, runId, { waiting: true });
  let epoch = watch.epoch;
  let row = await read();
  if (!row || FINAL_STATUSES.has(row.status) || seconds <= 0) return { row, applied: true };
  const timeout = new AbortController();
  const timer = setTimeout(() => timeout.abort(), seconds * SECOND);
  const deadline = AbortSignal.any([signal, timeout.signal]);
  let watcher;
  try {
    watcher = watch.open(tenantId, runId);
  } catch (err) {
    clearTimeout(timer);
    if (err instanceof PoimenError && err.code === "too-many-streams") {
      return { row, applied: false };
    }
    throw err;
  }
  try {
    while (!deadline.aborted && !watch.stopped) {
      await watcher.next(row.event_seq, epoch, deadline);
      if (signal.aborted) return { row, applied: true }; // nobody to answer
      epoch = watch.epoch;
      const again = await read();
      if (!again) return { row: undefined, applied: true };
      row = again;
      if (FINAL_STATUSES.has(row.status)) break;
    }
    return { row, applied: true };
  } finally {
    clearTimeout(timer);
    watcher.close();
  }
}
