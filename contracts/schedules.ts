/**
 * The schedules API's bodies (`/v1/schedules`): what a caller sends and
 * what it gets back. A schedule admits a run of `workflow_ref` with `input`
 * at each occurrence of `cron` in `timezone`, with the dispatch key
 * `schedule:<id>:<UTC instant>` (admission/schedule_ticker.ts).
 */
import { z } from "zod";
import { cronProblem } from "../core/cron.ts";
import { JsonValue } from "./json_value.ts";
import { WORKFLOW_REF_PATTERN } from "./runs.ts";

/** A schedule's id: no `:`, so its occurrences' dispatch keys parse back. */
export const SCHEDULE_ID_PATTERN: RegExp = /^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$/;

/** The most occurrences one backfill admits. */
export const MAX_BACKFILL = 1000;

const ScheduleId = z.string().regex(SCHEDULE_ID_PATTERN, "1–100 of A-Z a-z 0-9 . _ -, no colon")
  .describe("The schedule's id within the tenant: 1–100 of `A-Z a-z 0-9 . _ -`");

const Overlap = z.enum(["skip", "allow"]).describe(
  "`allow` (default): each occurrence starts a run; `skip`: no new run while the last " +
    "occurrence's run is unfinished (queued, running or waiting); the occurrence is dropped",
);
const Catchup = z.enum(["skip", "latest", "all"]).describe(
  "After downtime (occurrences more than a minute late): `skip` (default) drops them; " +
    "`latest` starts the latest one; `all` starts each one of the last 24 hours (at most 100)",
);

const fields = {
  workflow_ref: z.string().min(1).max(110).regex(
    WORKFLOW_REF_PATTERN,
    "expected name or name@version (a version of at most 9 digits)",
  ).describe("`name` (its current version at each occurrence) or `name@version`"),
  cron: z.string().min(1).max(200).describe(
    "5 fields: minute hour day-of-month month day-of-week (`*/15 9-17 * * 1-5`)",
  ),
  timezone: z.string().min(1).max(64).describe(
    "An IANA time zone (default `UTC`). Daylight saving time as Vixie cron: a local time the " +
      "spring-forward gap skips fires once right after it; a fixed time in the repeated autumn " +
      "hour fires once; a schedule whose hour is `*` keeps its real interval",
  ),
  input: JsonValue.describe("The input of every occurrence's run; null when absent"),
  overlap: Overlap,
  catchup: Catchup,
  paused: z.boolean().describe("A paused schedule starts nothing; resumed, it starts from now"),
};

/** Refines a body whose cron and time zone must make a schedule. */
function checkCron(
  v: { cron?: string; timezone?: string },
  ctx: z.RefinementCtx,
): void {
  if (v.cron === undefined) return;
  const problem = cronProblem(v.cron, v.timezone ?? "UTC");
  if (problem) {
    ctx.addIssue({
      code: "custom",
      path: problem.includes("time zone") ? ["timezone"] : ["cron"],
      message: problem,
    });
  }
}

/** `POST /v1/schedules`. */
export const ScheduleRequest = z.strictObject({
  id: ScheduleId,
  workflow_ref: fields.workflow_ref,
  cron: fields.cron,
  timezone: fields.timezone.optional(),
  input: fields.input.optional(),
  overlap: Overlap.optional(),
  catchup: Catchup.optional(),
  paused: fields.paused.optional(),
}).superRefine(checkCron);
export type ScheduleRequest = z.infer<typeof ScheduleRequest>;

/** `PATCH /v1/schedules/{id}`: the fields to change. */
export const SchedulePatch = z.strictObject({
  workflow_ref: fields.workflow_ref.optional(),
  cron: fields.cron.optional(),
  timezone: fields.timezone.optional(),
  input: fields.input.optional(),
  overlap: Overlap.optional(),
  catchup: Catchup.optional(),
  paused: fields.paused.optional(),
});
export type SchedulePatch = z.infer<typeof SchedulePatch>;

/** `POST /v1/schedules/{id}/backfill`: admit every occurrence `from <= t <= to`. */
export const BackfillRequest = z.strictObject({
  from: z.iso.datetime({ offset: true }).describe("RFC 3339, the first instant included"),
  to: z.iso.datetime({ offset: true }).describe(
    `RFC 3339, the last instant included; at most ${MAX_BACKFILL} occurrences between`,
  ),
});
export type BackfillRequest = z.infer<typeof BackfillRequest>;

/** A schedule as the API answers it. */
export const Schedule = z.object({
  id: z.string(),
  workflow_ref: z.string(),
  cron: z.string(),
  timezone: z.string(),
  input: z.unknown(),
  overlap: Overlap,
  catchup: Catchup,
  paused: z.boolean(),
  next_occurrences: z.array(z.string()).describe(
    "The next occurrences (UTC, RFC 3339), at most 3; empty while paused",
  ),
  last_run_id: z.string().nullable().describe("The run of the last occurrence started"),
  origin: z.enum(["api", "definition"]).describe(
    "`api`: made at run time (`/v1/schedules`, `deno task schedule`); `definition`: declared " +
      "in a workflow's definition, written when a worker registers it: only `paused` may be " +
      "changed here, and it cannot be deleted here",
  ),
  declared_by: z.string().nullable().describe(
    "The workflow version whose definition wrote it (`name@version`); null for `origin: api`",
  ),
  created_at: z.string(),
  updated_at: z.string(),
});
export type Schedule = z.infer<typeof Schedule>;

/** `GET /v1/schedules`. */
export const SchedulePage = z.object({
  schedules: z.array(Schedule),
  next_cursor: z.string().nullable().describe("Pass as `cursor` for the next page"),
});

/** `GET /v1/schedules` query. */
export const ListSchedulesQuery = z.strictObject({
  cursor: z.string().max(100).optional(),
  limit: z.coerce.number().int().min(1).max(500).optional(),
});

/** `POST /v1/schedules/{id}/backfill` answer: each occurrence, in order. */
export const BackfillResult = z.object({
  occurrences: z.array(z.object({
    scheduled_for: z.string(),
    run_id: z.string(),
    created: z.boolean().describe("false: this occurrence had its run already"),
  })),
});
