/**
 * The schedule tick. Every API process runs a `ScheduleTicker` (it has the
 * admission kernel and the workflow catalog already; no process to add, no
 * leader to elect): each round it claims the schedules due by the
 * database's clock (a short lease, taken with `for update skip locked`, so
 * two tickers do not tick one schedule at once and neither waits, and no
 * transaction stays open while it admits), admits the occurrences its
 * policies choose, and moves each schedule's cursor past now. An occurrence is a run admitted
 * with the dispatch key `schedule:<id>:<UTC instant>`: a ticker that dies
 * between admitting and moving the cursor, or a late one, admits the same
 * key again and gets the same run, so each occurrence starts exactly once
 * however many tickers there are.
 */
import { PoimenError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { IntervalMaintenance } from "../core/maintenance.ts";
import { DAY, MINUTE, SECOND } from "../core/time.ts";
import { nextOccurrence, occurrencesBetween } from "../core/cron.ts";
import type { Sql } from "../db/pool.ts";
import {
  advanceSchedule,
  claimDueSchedules,
  databaseNow,
  runUnfinished,
  type ScheduleRow,
} from "../db/schedules.ts";
import type { Admission, AdmitResult } from "./admit.ts";

/** The prefix of the dispatch keys of schedule occurrences; reserved from callers. */
export const SCHEDULE_KEY_PREFIX = "schedule:";

/** An occurrence later than this when ticked is late: the catch-up policy decides. */
export const LATE_AFTER_MS = MINUTE;
/** Catch-up looks back at most this far from now. */
export const CATCHUP_WINDOW_MS = DAY;
/** `catchup: "all"` admits at most this many missed occurrences (the latest). */
export const MAX_CATCHUP_RUNS = 100;
/** One backfill admits at most this many occurrences. */
export const MAX_BACKFILL_RUNS = 1000;

// Schedules one round locks and ticks at most; more wait for the next round.
const SCHEDULES_PER_ROUND = 100;
const DB_RETRY_CAP_MS = 10 * SECOND;
// How long a ticker holds the schedules it claimed: far longer than a tick
// takes, so another ticker takes one over only from a ticker that died or
// hung (it admits the same keys again: the same runs).
const CLAIM_LEASE_MS = 30 * SECOND;

/** The dispatch key of `scheduleId`'s occurrence at `at`. */
export function occurrenceKey(scheduleId: string, at: Date): string {
  return `${SCHEDULE_KEY_PREFIX}${scheduleId}:${at.toISOString()}`;
}

/** The schedule and occurrence a dispatch key names; undefined for any other key. */
export function parseOccurrenceKey(
  key: string | null,
): { schedule_id: string; scheduled_for: string } | undefined {
  const m = key === null ? null : /^schedule:([^:]+):(\d{4}-\d\d-\d\dT[\d:.]+Z)$/.exec(key);
  return m ? { schedule_id: m[1], scheduled_for: m[2] } : undefined;
}

/**
 * The occurrences due at `now` that `s`'s catch-up policy admits, from its
 * cursor: `skip` the ones at most LATE_AFTER_MS late; `latest` those, or
 * else the latest late one; `all` every one within CATCHUP_WINDOW_MS (the
 * latest MAX_CATCHUP_RUNS).
 */
export function dueOccurrences(s: ScheduleRow, now: Date): Date[] {
  if (s.next_at === null) return [];
  const from = new Date(Math.max(s.next_at.getTime(), now.getTime() - CATCHUP_WINDOW_MS));
  const due = occurrencesBetween(s.cron, s.timezone, from, now);
  const onTime = due.filter((t) => now.getTime() - t.getTime() <= LATE_AFTER_MS);
  switch (s.catchup) {
    case "skip":
      return onTime;
    case "latest":
      return onTime.length > 0 ? onTime : due.slice(-1);
    case "all":
      return due.slice(-MAX_CATCHUP_RUNS);
  }
}

/**
 * Where a new, changed or resumed schedule's cursor starts: its first
 * occurrence at or after the database's now (nothing before is caught up);
 * null while paused.
 */
export async function firstOccurrenceFrom(
  sql: Sql,
  f: Pick<ScheduleRow, "cron" | "timezone" | "paused">,
): Promise<Date | null> {
  if (f.paused) return null;
  const now = await databaseNow(sql);
  return nextOccurrence(f.cron, f.timezone, new Date(now.getTime() - 1));
}

/** Admits `schedule`'s occurrence at `at` (a replay when it was admitted already). */
export async function admitOccurrence(
  admission: Admission,
  s: Pick<ScheduleRow, "tenant_id" | "schedule_id" | "workflow_ref" | "input">,
  at: Date,
): Promise<AdmitResult> {
  return await admission.admit({
    workflow_ref: s.workflow_ref,
    input: s.input as never,
    dispatch_key: occurrenceKey(s.schedule_id, at),
  }, {
    tenantId: s.tenant_id,
    source: `${SCHEDULE_KEY_PREFIX}${s.schedule_id}`,
    entry: "schedule",
  });
}

/** Options of `ScheduleTicker`. */
export interface ScheduleTickerOptions {
  /** Mean time between two ticks (jittered ±25%). */
  intervalMs: number;
  log: Logger;
  /** The clock; the database's (`select now()`) unless a test injects one. */
  now?: () => Promise<Date>;
  /** After an occurrence was admitted (created or replayed); must not throw. */
  onAdmitted?(s: ScheduleRow, at: Date, result: AdmitResult): void;
}

/** Ticks the schedules every `intervalMs` until stopped. */
export class ScheduleTicker extends IntervalMaintenance {
  readonly #sql: Sql;
  readonly #admission: Admission;
  readonly #opts: ScheduleTickerOptions;

  constructor(sql: Sql, admission: Admission, opts: ScheduleTickerOptions) {
    super("schedule ticker", opts.log, {
      intervalMs: opts.intervalMs,
      retryCapMs: DB_RETRY_CAP_MS,
      failedMessage: "schedule tick failed",
    });
    this.#sql = sql;
    this.#admission = admission;
    this.#opts = opts;
  }

  protected async work(): Promise<void> {
    await this.tick();
  }

  /** One tick: every schedule due now, once. Returns how many schedules it ticked. */
  async tick(): Promise<number> {
    const now = await (this.#opts.now?.() ?? databaseNow(this.#sql));
    const due = await claimDueSchedules(this.#sql, now, SCHEDULES_PER_ROUND, CLAIM_LEASE_MS);
    for (const s of due) await this.#tickOne(s, now);
    return due.length;
  }

  async #tickOne(s: ScheduleRow, now: Date): Promise<void> {
    let chosen = dueOccurrences(s, now);
    if (s.overlap === "skip" && chosen.length > 0) {
      // One at a time: the latest, and only once the last one finished.
      const busy = s.last_run_id !== null &&
        await runUnfinished(this.#sql, s.tenant_id, s.last_run_id);
      chosen = busy ? [] : chosen.slice(-1);
    }
    let lastRunId: string | null = null;
    for (const at of chosen) {
      try {
        const result = await admitOccurrence(this.#admission, s, at);
        lastRunId = result.run.run_id;
        this.#opts.onAdmitted?.(s, at, result);
      } catch (error) {
        // A refusal (unknown workflow, input the version refuses) would be
        // refused again: the occurrence is skipped, said in the log. Anything
        // else leaves the cursor where it is, for the next tick.
        if (!(error instanceof PoimenError) || error.retryable) throw error;
        this.#opts.log.warn("schedule occurrence refused", {
          tenant: s.tenant_id,
          schedule: s.schedule_id,
          scheduled_for: at.toISOString(),
          error,
        });
      }
    }
    await advanceSchedule(this.#sql, s, nextOccurrence(s.cron, s.timezone, now), lastRunId);
  }
}
