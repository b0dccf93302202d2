/**
 * The OpenAPI description of the `/v1/schedules` routes (api/schedules.ts),
 * beside api/openapi_routes.ts, which lists them with the others.
 */
import { z } from "zod";
import type { Headers, Route } from "./openapi_routes.ts";
import { ListSchedulesQuery } from "../contracts/schedules.ts";

const SCHEDULE_ID = {
  id: z.string().describe("The schedule's id; anything but the tenant's schedule is a 404"),
};

/** The schedule routes, each with `tenantHeader` (a service token's tenant). */
export function scheduleRoutes(tenantHeader: Headers): Route[] {
  const TENANT_HEADER = tenantHeader;
  return [
    {
      method: "post",
      path: "/v1/schedules",
      summary: "Create a schedule: a run of a workflow at each occurrence of a cron",
      description: "Each occurrence is a run admitted with the dispatch key " +
        "`schedule:<id>:<UTC instant>` (the `schedule:` prefix is reserved: a run request " +
        "with it is a 422), by the tick every API process runs (SCHEDULE_TICK_MS), on the " +
        "database's clock: each occurrence starts exactly once. The first occurrence is the " +
        "first at or after now. An id the tenant has is a 409 `schedule-exists`.",
      auth: true,
      headers: TENANT_HEADER,
      body: { schema: "ScheduleRequest" },
      answers: {
        201: {
          description: "Created",
          schema: "Schedule",
          headers: { Location: { description: "The schedule's URL", schema: z.string() } },
        },
      },
      problems: [400, 401, 403, 408, 409, 413, 415, 422, 503],
    },
    {
      method: "get",
      path: "/v1/schedules",
      summary: "List the tenant's schedules, by id",
      auth: true,
      headers: TENANT_HEADER,
      query: ListSchedulesQuery,
      answers: { 200: { description: "A page of schedules", schema: "SchedulePage" } },
      problems: [401, 403, 422, 503],
    },
    {
      method: "get",
      path: "/v1/schedules/:id",
      summary: "One schedule, with its next occurrences",
      auth: true,
      params: SCHEDULE_ID,
      headers: TENANT_HEADER,
      answers: { 200: { description: "The schedule", schema: "Schedule" } },
      problems: [401, 403, 404, 503],
    },
    {
      method: "patch",
      path: "/v1/schedules/:id",
      summary: "Change a schedule; `paused` pauses or resumes it",
      description: "Only the fields given change. A new cron or time zone, a pause or a " +
        "resume moves the next occurrence to the first at or after now: a resumed schedule " +
        "catches up nothing of its pause (backfill for that). A schedule a workflow's " +
        "definition declares (`origin: definition`) takes only `paused`: any other field is a " +
        "409 `schedule-declared` (a new version of the definition changes it).",
      auth: true,
      params: SCHEDULE_ID,
      headers: TENANT_HEADER,
      body: { schema: "SchedulePatch" },
      answers: { 200: { description: "The schedule as changed", schema: "Schedule" } },
      problems: [400, 401, 403, 404, 408, 409, 413, 415, 422, 503],
    },
    {
      method: "delete",
      path: "/v1/schedules/:id",
      summary: "Delete a schedule (its runs stay)",
      description: "A schedule a workflow's definition declares (`origin: definition`) is a " +
        "409 `schedule-declared`: it is removed from the definition (a new version), and " +
        "paused meanwhile.",
      auth: true,
      params: SCHEDULE_ID,
      headers: TENANT_HEADER,
      answers: { 204: { description: "Deleted", empty: true } },
      problems: [401, 403, 404, 409, 503],
    },
    {
      method: "post",
      path: "/v1/schedules/:id/backfill",
      summary: "Start every occurrence of a time range (idempotent)",
      description: "Each occurrence `from <= t <= to` is admitted with its own dispatch key, " +
        "whether paused or not and whatever the overlap policy: an occurrence that has its " +
        "run already (by the tick or an earlier backfill) is answered with it, `created: " +
        "false`. At most 1,000 occurrences.",
      auth: true,
      params: SCHEDULE_ID,
      headers: TENANT_HEADER,
      body: { schema: "BackfillRequest" },
      answers: { 200: { description: "Each occurrence and its run", schema: "BackfillResult" } },
      problems: [400, 401, 403, 404, 408, 413, 415, 422, 503],
    },
  ];
}
