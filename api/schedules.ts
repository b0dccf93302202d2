/**
 * Routes under /v1/schedules: a tenant's schedules, managed at run time,
 * and the backfill of a time range. The tick that starts their occurrences
 * is admission/schedule_ticker.ts, in every API process.
 */
import { Hono } from "hono";
import { PoimenError } from "../core/errors.ts";
import { MAX_OCCURRENCES, nextOccurrence, occurrencesBetween } from "../core/cron.ts";
import type { Sql } from "../db/pool.ts";
import {
  deleteSchedule,
  insertSchedule,
  type ScheduleRow,
  selectSchedule,
  selectSchedules,
  setSchedulePaused,
  updateSchedule,
} from "../db/schedules.ts";
import type { Admission } from "../admission/admit.ts";
import { admitOccurrence, firstOccurrenceFrom } from "../admission/schedule_ticker.ts";
import {
  BackfillRequest,
  ListSchedulesQuery,
  MAX_BACKFILL,
  type Schedule,
  SCHEDULE_ID_PATTERN,
  SchedulePatch,
  ScheduleRequest,
} from "../contracts/schedules.ts";
import { cronProblem } from "../core/cron.ts";
import type { ApiEnv } from "./app.ts";
import { limitBody, parseJsonBody, parseQuery, parseWith, requireJson } from "./request.ts";
import type { BodyBudget } from "./body_budget.ts";

/** What the schedule routes need. */
export interface SchedulesDeps {
  sql: Sql;
  admission: Admission;
  bodyLimit: number;
  bodyBudget?: { bytes: BodyBudget; waitMs: number; readTimeoutMs?: number };
}

const PAGE = 100;

/** A stored schedule as the API answers it, with its next occurrences. */
export function toSchedule(row: ScheduleRow): Schedule {
  const next: string[] = [];
  for (let at = row.next_at; at !== null && next.length < 3;) {
    next.push(at.toISOString());
    at = nextOccurrence(row.cron, row.timezone, at);
  }
  return {
    id: row.schedule_id,
    workflow_ref: row.workflow_ref,
    cron: row.cron,
    timezone: row.timezone,
    input: row.input,
    overlap: row.overlap,
    catchup: row.catchup,
    paused: row.paused,
    next_occurrences: next,
    last_run_id: row.last_run_id,
    origin: row.declared_by === null ? "api" : "definition",
    declared_by: row.declared_by === null ? null : `${row.declared_by}@${row.declared_version}`,
    created_at: row.created_at.toISOString(),
    updated_at: row.updated_at.toISOString(),
  };
}

function notFound(id: string): PoimenError {
  return new PoimenError("not-found", `no schedule ${id}`);
}

/**
 * The refusal of `what` on a declared schedule: the next registration would
 * undo it, so the definition is where it changes.
 */
export function declaredRefusal(row: ScheduleRow, what: string): PoimenError {
  return new PoimenError(
    "schedule-declared",
    `schedule ${row.schedule_id} is declared by workflow ${row.declared_by}@${row.declared_version}: ` +
      `${what} it in the definition (a new version); here it can only be paused and resumed`,
  );
}

/** Routes under /v1/schedules. */
export function schedulesRoutes(deps: SchedulesDeps): Hono<ApiEnv> {
  const { sql } = deps;
  const app = new Hono<ApiEnv>();
  const body = [requireJson, limitBody(deps.bodyLimit, deps.bodyBudget)] as const;
  const read = async (c: Parameters<typeof parseJsonBody>[0]) =>
    await parseJsonBody(c, deps.bodyBudget?.readTimeoutMs);

  app.post("/", ...body, async (c) => {
    const req = parseWith(ScheduleRequest, await read(c));
    const tenantId = c.get("principal").tenantId;
    const f = {
      workflow_ref: req.workflow_ref,
      cron: req.cron,
      timezone: req.timezone ?? "UTC",
      input: req.input ?? null,
      overlap: req.overlap ?? "allow",
      catchup: req.catchup ?? "skip",
      paused: req.paused ?? false,
    };
    const row = await insertSchedule(sql, tenantId, req.id, {
      ...f,
      next_at: await firstOccurrenceFrom(sql, f),
    });
    if (!row) {
      throw new PoimenError("schedule-exists", `schedule ${req.id} exists (PATCH it to change it)`);
    }
    c.header("Location", `/v1/schedules/${row.schedule_id}`);
    return c.json(toSchedule(row), 201);
  });

  app.get("/", async (c) => {
    const q = parseQuery(c, ListSchedulesQuery);
    const limit = q.limit ?? PAGE;
    const rows = await selectSchedules(sql, c.get("principal").tenantId, {
      after: q.cursor,
      limit,
    });
    return c.json({
      schedules: rows.map(toSchedule),
      next_cursor: rows.length === limit ? rows[rows.length - 1].schedule_id : null,
    });
  });

  app.get("/:id", async (c) => {
    const id = c.req.param("id");
    const row = SCHEDULE_ID_PATTERN.test(id)
      ? await selectSchedule(sql, c.get("principal").tenantId, id)
      : undefined;
    if (!row) throw notFound(id);
    return c.json(toSchedule(row));
  });

  app.patch("/:id", ...body, async (c) => {
    const id = c.req.param("id");
    const tenantId = c.get("principal").tenantId;
    const patch = parseWith(SchedulePatch, await read(c));
    const row = SCHEDULE_ID_PATTERN.test(id) ? await selectSchedule(sql, tenantId, id) : undefined;
    if (!row) throw notFound(id);
    if (row.declared_by !== null && Object.keys(patch).some((k) => k !== "paused")) {
      throw declaredRefusal(row, "change");
    }
    const f = {
      workflow_ref: patch.workflow_ref ?? row.workflow_ref,
      cron: patch.cron ?? row.cron,
      timezone: patch.timezone ?? row.timezone,
      input: patch.input === undefined ? row.input : patch.input,
      overlap: patch.overlap ?? row.overlap,
      catchup: patch.catchup ?? row.catchup,
      paused: patch.paused ?? row.paused,
    };
    const problem = cronProblem(f.cron, f.timezone);
    if (problem) {
      throw new PoimenError("validation", "the request does not match the schema", {
        errors: [{ path: problem.includes("time zone") ? "timezone" : "cron", message: problem }],
      });
    }
    // The cursor stays unless when the schedule fires changed, or it was
    // paused or resumed: a resumed schedule starts from now, catching up nothing.
    const same = f.cron === row.cron && f.timezone === row.timezone && f.paused === row.paused;
    const next_at = same ? row.next_at : await firstOccurrenceFrom(sql, f);
    const updated = row.declared_by === null
      ? await updateSchedule(sql, tenantId, id, { ...f, next_at })
      : await setSchedulePaused(sql, tenantId, id, f.paused, next_at);
    if (!updated) throw notFound(id);
    return c.json(toSchedule(updated));
  });

  app.delete("/:id", async (c) => {
    const id = c.req.param("id");
    const tenantId = c.get("principal").tenantId;
    const row = SCHEDULE_ID_PATTERN.test(id) ? await selectSchedule(sql, tenantId, id) : undefined;
    if (row?.declared_by) throw declaredRefusal(row, "remove");
    const gone = row !== undefined && await deleteSchedule(sql, tenantId, id);
    if (!gone) throw notFound(id);
    return c.body(null, 204);
  });

  // Every occurrence of the range, admitted with its occurrence's dispatch
  // key: idempotent, and never a second run of one the tick started.
  app.post("/:id/backfill", ...body, async (c) => {
    const id = c.req.param("id");
    const tenantId = c.get("principal").tenantId;
    const req = parseWith(BackfillRequest, await read(c));
    const row = SCHEDULE_ID_PATTERN.test(id) ? await selectSchedule(sql, tenantId, id) : undefined;
    if (!row) throw notFound(id);
    const from = new Date(req.from);
    const to = new Date(req.to);
    const times = occurrencesBetween(row.cron, row.timezone, from, to, MAX_OCCURRENCES);
    if (to < from || times.length > MAX_BACKFILL) {
      throw new PoimenError("validation", "the request does not match the schema", {
        errors: [{
          path: "to",
          message: to < from
            ? "before from"
            : `more than ${MAX_BACKFILL} occurrences between from and to`,
        }],
      });
    }
    const results = await Promise.all(times.map((t) => admitOccurrence(deps.admission, row, t)));
    return c.json({
      occurrences: results.map((r, i) => ({
        scheduled_for: times[i].toISOString(),
        run_id: r.run.run_id,
        created: r.created,
      })),
    });
  });

  return app;
}
