/**
 * Schedule times: a 5-field cron (croner) read in an IANA time zone.
 *
 * Daylight saving time follows Vixie cron, which is what cron users expect:
 * a local time the spring-forward gap skips fires once, right after the gap
 * (`30 2 * * *` in Europe/Paris on the last Sunday of March fires at 03:00
 * CEST); a fixed local time in the hour that autumn repeats fires once, at
 * its first instance (`30 1 * * *` in America/New_York fires at 01:30 EDT,
 * not again at 01:30 EST); a schedule whose hour is `*` keeps its real
 * interval through either change (every 30 minutes stays every 30 minutes
 * of elapsed time). Each occurrence is a UTC instant, which names it.
 */
import { Cron } from "croner";

/** At most this many occurrences are listed by one call (a day of minutes fits). */
export const MAX_OCCURRENCES = 2000;

/** Why `cron` in `timezone` is not a schedule; undefined when it is one. */
export function cronProblem(cron: string, timezone: string): string | undefined {
  if (cron.trim().split(/\s+/).length !== 5) {
    return "expected 5 fields: minute hour day-of-month month day-of-week";
  }
  try {
    new Intl.DateTimeFormat("en", { timeZone: timezone });
  } catch {
    return `unknown IANA time zone ${JSON.stringify(timezone)}`;
  }
  try {
    const c = compile(cron, timezone);
    if (c.nextRun(new Date(0)) === null) return "never fires";
  } catch (err) {
    return err instanceof Error ? err.message : String(err);
  }
  return undefined;
}

function compile(cron: string, timezone: string): Cron {
  // legacyMode: day-of-month and day-of-week are OR'ed, as in Vixie cron.
  return new Cron(cron, { timezone, paused: true, legacyMode: true });
}

/** The first occurrence strictly after `after`; null when there is none. */
export function nextOccurrence(cron: string, timezone: string, after: Date): Date | null {
  return compile(cron, timezone).nextRun(after);
}

/**
 * The occurrences `from <= t <= until`, in order, at most `max`
 * (MAX_OCCURRENCES at most).
 */
export function occurrencesBetween(
  cron: string,
  timezone: string,
  from: Date,
  until: Date,
  max = MAX_OCCURRENCES,
): Date[] {
  const c = compile(cron, timezone);
  const out: Date[] = [];
  // nextRun is strictly after its argument: start a millisecond before.
  let at: Date | null = new Date(from.getTime() - 1);
  while (out.length < Math.min(max, MAX_OCCURRENCES)) {
    at = c.nextRun(at);
    if (at === null || at.getTime() > until.getTime()) break;
    out.push(at);
  }
  return out;
}
