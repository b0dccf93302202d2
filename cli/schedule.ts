/**
 * `deno task schedule <tenant> <list|create|pause|resume|delete|backfill> …`:
 * a tenant's schedules (migration 027), as `/v1/schedules` manages them,
 * from an operator's shell. The APIs' ticks see a change at their next tick.
 */
import { z } from "zod";
import { PoimenError } from "../core/errors.ts";
import { databaseEnv, logEnv, processEnv, readEnv } from "../core/config.ts";
import { createLogger } from "../core/log.ts";
import { cronProblem, occurrencesBetween } from "../core/cron.ts";
import { createPool, type Sql } from "../db/pool.ts";
import {
  deleteSchedule,
  insertSchedule,
  type ScheduleRow,
  selectSchedule,
  selectSchedules,
  setSchedulePaused,
} from "../db/schedules.ts";
import { Admission } from "../admission/admit.ts";
import { WorkflowCatalog } from "../admission/catalog.ts";
import { admitOccurrence, firstOccurrenceFrom } from "../admission/schedule_ticker.ts";
import { isTenantId } from "../contracts/topics.ts";
import { WORKFLOW_REF_PATTERN } from "../contracts/runs.ts";
import { MAX_BACKFILL, SCHEDULE_ID_PATTERN } from "../contracts/schedules.ts";
import { type CommandSpec, parseCommandLine, usageError } from "../core/command_line.ts";

const ScheduleEnv = z.object({ ...databaseEnv, ...logEnv });

/** Exit code when the schedule named does not exist (or exists, for create). */
export const NOT_FOUND = 1;

const COMMAND = {
  name: "schedule",
  synopsis: "<tenant> <list|create|pause|resume|delete|backfill> [<id>] [options]",
  description: `
Manages a tenant's schedules: a run of a workflow at each occurrence of a
5-field cron in an IANA time zone, admitted with the dispatch key
schedule:<id>:<UTC instant>, so each occurrence starts once.

  schedule acme list
  schedule acme create nightly --workflow report --cron "30 2 * * *"
           --timezone Europe/Paris --input '{"full":true}' --overlap skip
  schedule acme pause nightly       no occurrence starts until resumed
  schedule acme resume nightly      from the next occurrence after now
  schedule acme delete nightly      its runs stay
  schedule acme backfill nightly --from 2030-01-01T00:00:00Z --to 2030-01-08T00:00:00Z
                                    every occurrence of the range, idempotent
                                    (at most 1000; needs the workflow registered)

Prints one line per schedule or occurrence. Exit 1 when the schedule does not
exist (or, for create, exists already).`,
  flags: {
    workflow: { type: "string", valueName: "ref", description: "create: name or name@version" },
    cron: { type: "string", valueName: "expr", description: "create: 5-field cron" },
    timezone: { type: "string", valueName: "zone", description: "create: IANA zone (UTC)" },
    input: { type: "string", valueName: "json", description: "create: the runs' input (null)" },
    overlap: { type: "string", valueName: "skip|allow", description: "create: (allow)" },
    catchup: { type: "string", valueName: "skip|latest|all", description: "create: (skip)" },
    from: { type: "string", valueName: "time", description: "backfill: RFC 3339, included" },
    to: { type: "string", valueName: "time", description: "backfill: RFC 3339, included" },
  },
  positionals: { min: 2, max: 3 },
  env: ScheduleEnv,
} satisfies CommandSpec;

const ACTIONS = ["list", "create", "pause", "resume", "delete", "backfill"] as const;
type Action = typeof ACTIONS[number];

/** One line for people: `nightly report "30 2 * * *" Europe/Paris next 2030-…Z`. */
function scheduleLine(s: ScheduleRow): string {
  const next = s.next_at ? `next ${s.next_at.toISOString()}` : "paused";
  return `${s.schedule_id} ${s.workflow_ref} ${JSON.stringify(s.cron)} ${s.timezone} ` +
    `overlap=${s.overlap} catchup=${s.catchup} ${next}` +
    (s.declared_by ? ` declared-by=${s.declared_by}@${s.declared_version}` : "");
}

/** Runs `schedule` with its arguments; returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const [tenant, action, id] = line.positionals as [string, Action, string | undefined];
  const f = line.flags;
  if (!isTenantId(tenant)) {
    return usageError(COMMAND, `bad tenant id ${JSON.stringify(tenant)}`);
  }
  if (!ACTIONS.includes(action)) {
    return usageError(COMMAND, `unknown command ${JSON.stringify(action)}: ${ACTIONS.join(", ")}`);
  }
  if (action !== "list" && (id === undefined || !SCHEDULE_ID_PATTERN.test(id))) {
    return usageError(COMMAND, `${action} needs a schedule id (A-Z a-z 0-9 . _ -, 1-100)`);
  }
  let input: unknown = null;
  if (action === "create") {
    if (!f.workflow || !WORKFLOW_REF_PATTERN.test(f.workflow)) {
      return usageError(COMMAND, "create needs --workflow <name or name@version>");
    }
    const problem = f.cron === undefined
      ? "create needs --cron"
      : cronProblem(f.cron, f.timezone ?? "UTC");
    if (problem) return usageError(COMMAND, `bad --cron or --timezone: ${problem}`);
    if (f.overlap && !["skip", "allow"].includes(f.overlap)) {
      return usageError(COMMAND, "bad --overlap: skip or allow");
    }
    if (f.catchup && !["skip", "latest", "all"].includes(f.catchup)) {
      return usageError(COMMAND, "bad --catchup: skip, latest or all");
    }
    try {
      input = f.input === undefined ? null : JSON.parse(f.input);
    } catch {
      return usageError(COMMAND, "bad --input: not JSON");
    }
  }
  const from = f.from === undefined ? NaN : Date.parse(f.from);
  const to = f.to === undefined ? NaN : Date.parse(f.to);
  if (action === "backfill" && !(from <= to)) {
    return usageError(COMMAND, "backfill needs --from <time> and --to <time>, from before to");
  }

  const config = readEnv(ScheduleEnv, processEnv());
  const log = createLogger("schedule", config.LOG_LEVEL);
  const sql = createPool({ url: config.DATABASE_URL, max: 2, applicationName: "poimen-schedule" });
  const missing = () => {
    console.error(`schedule: no schedule ${JSON.stringify(id)} of tenant ${tenant}`);
    return NOT_FOUND;
  };
  try {
    switch (action) {
      case "list": {
        for (const s of await selectSchedules(sql, tenant, { limit: 10_000 })) {
          console.log(scheduleLine(s));
        }
        return 0;
      }
      case "create": {
        const fields = {
          workflow_ref: f.workflow!,
          cron: f.cron!,
          timezone: f.timezone ?? "UTC",
          input,
          overlap: (f.overlap ?? "allow") as ScheduleRow["overlap"],
          catchup: (f.catchup ?? "skip") as ScheduleRow["catchup"],
          paused: false,
        };
        const row = await insertSchedule(sql, tenant, id!, {
          ...fields,
          next_at: await firstOccurrenceFrom(sql, fields),
        });
        if (!row) {
          console.error(`schedule: ${tenant} has a schedule ${id} already`);
          return NOT_FOUND;
        }
        console.log(`${scheduleLine(row)} (created)`);
        return 0;
      }
      case "pause":
      case "resume": {
        const row = await selectSchedule(sql, tenant, id!);
        if (!row) return missing();
        const paused = action === "pause";
        const next_at = paused === row.paused
          ? row.next_at
          : await firstOccurrenceFrom(sql, { ...row, paused });
        const updated = await setSchedulePaused(sql, tenant, id!, paused, next_at);
        if (!updated) return missing();
        console.log(scheduleLine(updated));
        return 0;
      }
      case "delete": {
        const row = await selectSchedule(sql, tenant, id!);
        if (row?.declared_by) {
          console.error(
            `schedule: ${id} is declared by workflow ${row.declared_by}@${row.declared_version}: ` +
              "remove it from the definition (a new version); pause it meanwhile",
          );
          return NOT_FOUND;
        }
        if (!row || !await deleteSchedule(sql, tenant, id!)) return missing();
        console.log(`${id} deleted (its runs stay)`);
        return 0;
      }
      case "backfill":
        return await backfill(sql, log, tenant, id!, new Date(from), new Date(to), missing);
    }
  } finally {
    await sql.end({ timeout: 5 });
  }
}

async function backfill(
  sql: Sql,
  log: ReturnType<typeof createLogger>,
  tenant: string,
  id: string,
  from: Date,
  to: Date,
  missing: () => number,
): Promise<number> {
  const row = await selectSchedule(sql, tenant, id);
  if (!row) return missing();
  const times = occurrencesBetween(row.cron, row.timezone, from, to);
  if (times.length > MAX_BACKFILL) {
    return usageError(COMMAND, `more than ${MAX_BACKFILL} occurrences between --from and --to`);
  }
  // The catalog the APIs validate against, read once: the runs are admitted
  // exactly as the tick admits them.
  const catalog = new WorkflowCatalog(sql, {
    refreshMs: 3_600_000,
    // Never started, so it never listens: refreshed once, below.
    listen: () => sql,
    log,
  });
  await catalog.refresh();
  const admission = new Admission(sql, catalog, { maxBatch: 100, maxConcurrent: 1 });
  for (const at of times) {
    try {
      const r = await admitOccurrence(admission, row, at);
      console.log(`${at.toISOString()} ${r.run.run_id} ${r.created ? "created" : "existed"}`);
    } catch (err) {
      if (!(err instanceof PoimenError)) throw err;
      console.error(`schedule: ${at.toISOString()} refused: ${err.message}`);
      return NOT_FOUND;
    }
  }
  return 0;
}
