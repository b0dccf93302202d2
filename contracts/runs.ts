/**
 * The wire contracts of runs, as zod schemas: the `POST /v1/runs` body (which
 * is also the value of a `poimen.<tenant>.dispatch` message), the run the API
 * returns, and problem+json. The API validates with them, the OpenAPI
 * document is generated from them, and publishers may import this module:
 * it depends on zod alone.
 */
import { z } from "zod";
import type * as Wire from "./wire.ts";
import { JsonValue, MAX_JSON_DEPTH } from "./json_value.ts";
import { RUN_EVENT_PAYLOADS } from "./events.ts";
import type { RunEventType } from "./event_types.ts";

// Printable: no control characters (C0, DEL, C1) and no lone surrogates.
const PRINTABLE = /^[^\p{Cc}\p{Cs}]+$/u;

// A workflow name, and a version that fits Postgres' int4 (9 digits).
const WORKFLOW_NAME = "[a-z][a-z0-9_.-]{0,99}";
const WORKFLOW_VERSION = "[1-9][0-9]{0,8}";

/** A workflow name as registered. */
export const WORKFLOW_NAME_PATTERN: RegExp = new RegExp(`^${WORKFLOW_NAME}$`);

/**
 * `name` or `name@version`, capturing both: the one pattern the API
 * validates with and the registry resolves with, so a ref the API accepts
 * is one the registry can look up.
 */
export const WORKFLOW_REF_PATTERN: RegExp = new RegExp(
  `^(${WORKFLOW_NAME})(?:@(${WORKFLOW_VERSION}))?$`,
);

/** The lowest and highest `priority` of a run. */
export const MIN_PRIORITY = -10;
export const MAX_PRIORITY = 10;

/** How far ahead a run may be scheduled (`run_after`): 365 days. */
export const MAX_RUN_AFTER_DAYS = 365;
const MAX_RUN_AFTER_MS = MAX_RUN_AFTER_DAYS * 24 * 3600 * 1000;

/**
 * The earliest year a `run_after` may name. Any earlier time means "now"
 * just the same, and Postgres' timestamptz refuses some of them (year 0000):
 * a bound of our own keeps every accepted time one Postgres takes.
 */
export const MIN_RUN_AFTER_YEAR = 1970;
/**
 * The largest UTC offset of a `run_after`, in hours (minutes up to 59):
 * Postgres refuses offsets of 16 hours and more, though RFC 3339 allows 23.
 * No time zone is ahead of +14:00 or behind -12:00.
 */
export const MAX_RUN_AFTER_OFFSET_HOURS = 15;

/**
 * Why an RFC 3339 time (already of the right shape) is not a `run_after`
 * Postgres and poimen accept, or undefined when it is one.
 */
function runAfterProblem(at: string, now: number = Date.now()): string | undefined {
  const year = Number(at.slice(0, 4));
  if (!(year >= MIN_RUN_AFTER_YEAR)) return `a year from ${MIN_RUN_AFTER_YEAR} on`;
  const offset = /([+-])(\d\d):\d\d$/.exec(at);
  if (offset && Number(offset[2]) > MAX_RUN_AFTER_OFFSET_HOURS) {
    return `an offset within ±${MAX_RUN_AFTER_OFFSET_HOURS}:59`;
  }
  if (Date.parse(at) > now + MAX_RUN_AFTER_MS) return `at most ${MAX_RUN_AFTER_DAYS} days ahead`;
  return undefined;
}

/**
 * The prefix of the dispatch keys the inbox relay derives for keyless
 * messages (`kafka:<topic>/<partition>/<offset>`, the message's
 * `Poimen-Source` too). Reserved: only a service token may admit a key with
 * it, and only the key equal to its request's `Poimen-Source`, so no caller
 * can take the key of a keyless message not yet relayed and have that
 * message replay a run of the caller's making.
 */
export const RELAY_KEY_PREFIX = "kafka:";

/**
 * The prefix of a child run's dispatch key, `child:<parent run_id>:<name>`
 * (issue 31): derived by the worker for `ctx.start`, so a retried parent
 * finds the child it started. Reserved: no caller may admit a key with it,
 * so none can pre-claim a child's key and turn its admission into a replay.
 */
export const CHILD_KEY_PREFIX = "child:";

/** A child's dispatch key: `child:<parent run_id>:<name>`. */
export function childDispatchKey(parentRunId: string, name: string): string {
  return `${CHILD_KEY_PREFIX}${parentRunId}:${name}`;
}

// goal_id and dispatch_key, in a body and as query filters.
const label = () => z.string().min(1).max(255).regex(PRINTABLE, "printable characters only");

/** The admission request: `POST /v1/runs` body and dispatch message value. */
export const RunRequest = z.strictObject({
  // 110: the longest ref the pattern allows (100-character name, @, 9 digits).
  workflow_ref: z.string().min(1).max(110).regex(
    WORKFLOW_REF_PATTERN,
    "expected name or name@version (a version of at most 9 digits)",
  ).describe("`name` (its current version, pinned at admission) or `name@version`"),
  input: JsonValue.optional().describe(
    `The workflow's input (any JSON); null when absent. Strings and keys without NUL or unpaired ` +
      `surrogates, finite numbers (IEEE 754 doubles), at most ${MAX_JSON_DEPTH} levels of nesting`,
  ),
  goal_id: label().nullable().optional().describe(
    "Groups runs that serve one goal: 1–255 printable characters",
  ),
  dispatch_key: label().nullable().optional().describe(
    "Caller-chosen identity of the intended run: the same (tenant, dispatch_key) makes one run. " +
      "1–255 printable characters; the prefixes `kafka:` (the inbox relay's), `child:` (child runs')" +
      " and `schedule:` (schedules' occurrences) are reserved",
  ),
  // Piped: the bounds are checked only on a well-formed time.
  run_after: z.iso.datetime({ offset: true }).pipe(
    z.string().superRefine((at, ctx) => {
      const problem = runAfterProblem(at);
      if (problem) ctx.addIssue({ code: "custom", message: problem });
    }),
  ).nullable().optional().describe(
    "Start later: no attempt before this time. RFC 3339 with an offset " +
      `(\`2030-01-01T09:00:00+01:00\` or \`…Z\`), at most ${MAX_RUN_AFTER_DAYS} days ahead; ` +
      `a year from ${MIN_RUN_AFTER_YEAR} on, an offset within ±${MAX_RUN_AFTER_OFFSET_HOURS}:59. ` +
      "A time in the past means now. A replay of the dispatch key returns the first run, " +
      "whatever its run_after. Refused for a debounced workflow: its debounce sets the start",
  ),
  priority: z.number().int().min(MIN_PRIORITY).max(MAX_PRIORITY).nullable().optional().describe(
    `An integer from ${MIN_PRIORITY} to ${MAX_PRIORITY} (default 0): within the tenant, a ` +
      "higher priority starts first; tenants still take turns. A replay of the dispatch key " +
      "keeps the first run's priority",
  ),
});
export type RunRequest = z.infer<typeof RunRequest>;

/** Where a run is in its lifecycle. */
export const RunStatus: z.ZodEnum<
  {
    queued: "queued";
    running: "running";
    waiting: "waiting";
    succeeded: "succeeded";
    failed: "failed";
    cancelled: "cancelled";
  }
> = z.enum(["queued", "running", "waiting", "succeeded", "failed", "cancelled"]);
export type RunStatus = z.infer<typeof RunStatus>;

/** Why a queued run has not started, or what a waiting one waits for: `waiting_for`. */
export const WaitingReason: z.ZodEnum<
  {
    worker: "worker";
    schedule: "schedule";
    concurrency: "concurrency";
    slot: "slot";
    sleep: "sleep";
    signal: "signal";
    children: "children";
  }
> = z.enum(["worker", "schedule", "concurrency", "slot", "sleep", "signal", "children"]);
export type WaitingReason = z.infer<typeof WaitingReason>;

/** What a queued run waits for, in the order it is checked. */
export const WaitingFor = z.object({
  reason: WaitingReason.describe(
    "A queued run: `worker`: no running worker hosts the run's workflow version; `schedule`: " +
      "its run_after has not come; `concurrency`: its workflow's concurrency limit for its key " +
      "is reached; `slot`: it is due and a worker hosts it, and waits for a free slot. A " +
      "waiting run: `sleep`: a sleep's end; `signal`: a signal; `children`: its children " +
      "(a child's `result()`, `ctx.map`)",
  ),
  workflow: z.string().optional().describe("On `worker`: the version it waits for, `name@version`"),
  until: z.string().optional().describe(
    "On `schedule`: when it is due (its run_after); on `sleep`: when it ends; on `signal`: " +
      "when the wait times out (absent: never)",
  ),
  name: z.string().optional().describe(
    "On `sleep`: the sleep's name; on `signal`: the signal's; on `children`: the awaited " +
      "child's or map's call name",
  ),
  key: z.string().optional().describe(
    "On `concurrency`: the run's concurrency key ('' when the limit is per tenant)",
  ),
  limit: z.number().int().optional().describe("On `concurrency`: the limit"),
  running: z.number().int().optional().describe(
    "On `concurrency`: how many of the key's runs are running now",
  ),
  detail: z.string().describe("The same for people"),
});
export type WaitingFor = z.infer<typeof WaitingFor>;

/** One durable call of a run, as `GET /v1/runs/{run_id}` shows it. */
export const RunStep = z.object({
  name: z.string().describe("`name`, `name#2`… in call order"),
  seq: z.number().int().describe("Its place in the run's call order, from 1"),
  kind: z.enum(["step", "sleep", "signal"]),
  status: z.enum(["waiting", "completed", "failed"]).describe(
    "`waiting`: a sleep or wait under way; `failed`: its last try threw",
  ),
  size: z.number().int().nullable().describe("Its result's size as JSON, in bytes"),
  until: z.string().nullable().describe("A sleep's end, a wait's timeout"),
  signal_name: z.string().nullable().describe("A wait's signal name"),
  attempt: z.number().int().describe("The attempt that wrote it last"),
  error: z.string().nullable().describe("A failed step's error message (at most 1,000 characters)"),
  started_at: z.string(),
  completed_at: z.string().nullable(),
});
export type RunStep = z.infer<typeof RunStep>;

/**
 * The largest page of `GET /v1/runs`, as bytes of JSON: a page ends before
 * the run that would pass it (so `next_cursor` continues there), except a
 * page's first run, which is always on it.
 */
export const RUN_PAGE_MAX_BYTES = 1024 * 1024;

/** Run fields a list leaves out unless asked for (`fields=`): a run's large values. */
export const RunListField: z.ZodEnum<{ input: "input"; result: "result" }> = z.enum([
  "input",
  "result",
]);
export type RunListField = z.infer<typeof RunListField>;

/** A run as the API returns it. */
export const Run = z.object({
  run_id: z.uuid(),
  tenant_id: z.string(),
  workflow_ref: z.string().describe("As asked"),
  workflow: z.string().describe("The resolved workflow name"),
  workflow_version: z.number().int().describe("The version pinned at admission"),
  status: RunStatus,
  goal_id: z.string().nullable(),
  dispatch_key: z.string().nullable(),
  source: z.string().describe("`http:<token name>` or `kafka:<topic>/<partition>/<offset>`"),
  attempts: z.number().int(),
  max_attempts: z.number().int(),
  input: z.unknown().optional().describe(
    "On GET /v1/runs/{run_id} and a cancel; in a list only with `fields=input`",
  ),
  result: z.unknown().nullable().optional().describe(
    "What the workflow returned, once succeeded (null before). Always on one run; in a list " +
      "only with `fields=result`",
  ),
  error: z.unknown().nullable(),
  created_at: z.string(),
  updated_at: z.string(),
  started_at: z.string().nullable(),
  finished_at: z.string().nullable(),
  run_after: z.string().describe("When the run is due: no attempt starts before"),
  cancel_requested_at: z.string().nullable().describe(
    "When a cancel was asked for; a running run ends `cancelled` once its worker sees it",
  ),
  priority: z.number().int().describe("-10..10: within the tenant, a higher priority starts first"),
  concurrency_key: z.string().nullable().describe(
    "Its concurrency key when its workflow version declares a concurrency limit ('' for a " +
      "limit per tenant); null: not limited",
  ),
  parent_run_id: z.uuid().nullable().describe(
    "The run whose handler started this one (a child run); null: a caller admitted it",
  ),
  root_run_id: z.uuid().nullable().describe(
    "The root of its tree of runs; null for a run a caller admitted (a root itself)",
  ),
  detached: z.boolean().describe(
    "A child started with `{ detached: true }`: a cancel of its ancestors does not reach it",
  ),
  debounced: z.boolean().optional().describe(
    "Only on an admission's answer for a debounced workflow: true when the request joined the " +
      "pending run of its debounce key (200: the run's input replaced, its start moved), false " +
      "when it made the run (201); absent on a replay (docs/workflows.md#debounce)",
  ),
  schedule_id: z.string().optional().describe(
    "Only on a schedule's occurrence (dispatch key `schedule:<id>:<instant>`): its schedule",
  ),
  scheduled_for: z.string().optional().describe(
    "Only on a schedule's occurrence: the occurrence's UTC instant (RFC 3339)",
  ),
  waiting_for: WaitingFor.nullable().optional().describe(
    "Only on GET /v1/runs/{run_id}: null unless the run is queued or waiting; what it waits for",
  ),
  children: z.object({
    runs: z.array(z.object({ run_id: z.uuid(), status: RunStatus, dispatch_key: z.string() })),
    next_cursor: z.string().nullable().describe(
      "More children: `GET /v1/runs?parent_run_id=<run_id>&cursor=<next_cursor>`",
    ),
  }).optional().describe(
    "Only on GET /v1/runs/{run_id}: its child runs, newest first, the first 100",
  ),
  steps: z.array(RunStep).optional().describe(
    "Only on GET /v1/runs/{run_id}: its durable calls (ctx.step, ctx.sleep, " +
      "ctx.waitForSignal) in call order, the first 1,000, without their results",
  ),
});
export type Run = z.infer<typeof Run>;

/** One page of `GET /v1/runs`. */
export const RunPage = z.object({
  runs: z.array(Run).describe(
    `Newest first: at most \`limit\` runs, and fewer when the page would pass ` +
      `${RUN_PAGE_MAX_BYTES / 1024 / 1024} MiB of JSON (a first run larger than that alone ` +
      "still makes a page); `next_cursor` continues either way",
  ),
  next_cursor: z.string().nullable().describe(
    "Pass as `cursor` for the next page; null at the end",
  ),
});
export type RunPage = z.infer<typeof RunPage>;

/** One event of type `type`, as `GET /v1/runs/{run_id}/events` returns it. */
function runEventOf<T extends RunEventType>(type: T) {
  return z.object({
    seq: z.number().int().describe("Per-run sequence number, from 1"),
    type: z.literal(type),
    payload: RUN_EVENT_PAYLOADS[type],
    at: z.string(),
    published_at: z.string().nullable().describe("When the outbox shipped it to Kafka"),
    parked_at: z.string().nullable().describe("Set aside by the outbox: it can never be shipped"),
  });
}

/** One event of a run: its payload is its type's (docs/runs.md lists them). */
export const RunEvent = z.discriminatedUnion("type", [
  runEventOf("run.admitted"),
  runEventOf("run.started"),
  runEventOf("run.succeeded"),
  runEventOf("run.retrying"),
  runEventOf("run.failed"),
  runEventOf("run.released"),
  runEventOf("run.cancelled"),
  runEventOf("run.waiting"),
  runEventOf("run.woken"),
  runEventOf("step.completed"),
  runEventOf("step.failed"),
  runEventOf("signal.received"),
  runEventOf("child.started"),
  runEventOf("child.finished"),
]);
export type RunEvent = z.infer<typeof RunEvent>;

export const RunEvents = z.object({
  events: z.array(RunEvent).describe(
    "Oldest first. Published events are purged after a while: an old run's list may be short",
  ),
});

/**
 * The `GET /v1/runs` query. Each parameter at most once; values are
 * percent-decoded UTF-8.
 */
export const ListRunsQuery = z.strictObject({
  goal_id: label().optional().describe("Only runs of this goal"),
  dispatch_key: label().optional().describe("Only the run with this dispatch key"),
  parent_run_id: z.uuid().optional().describe("Only the children of this run"),
  root_run_id: z.uuid().optional().describe(
    "Only the runs of this root's tree (its descendants, the root itself excluded)",
  ),
  status: RunStatus.optional(),
  limit: z.string().regex(/^[0-9]{1,3}$/, "an integer from 1 to 500").transform(Number)
    .pipe(z.number().int().min(1).max(500)).default(50).describe(
      "Page size, 1–500 (default 50)",
    ),
  cursor: z.string().max(200).optional().describe("A `next_cursor` from the previous page"),
  fields: z.string().regex(/^[a-z_]+(,[a-z_]+)*$/, "a comma-separated list: input, result")
    .transform((s) => [...new Set(s.split(","))]).pipe(z.array(RunListField)).optional()
    .describe(
      "Large fields to add to each run, comma-separated (`input,result`): a list leaves a " +
        "run's `input` and `result` out unless asked for",
    ),
});

/**
 * `Poimen-Source`, as a service token may send it: 1–300 printable ASCII
 * characters (the relay's is `kafka:<topic>/<partition>/<offset>`).
 */
export const SourceHeader = z.string().min(1).max(300).regex(
  /^[\x20-\x7e]+$/,
  "1–300 printable ASCII characters",
);

/**
 * The key of an `Idempotency-Key` header value: the value itself, or, when
 * it starts with `"`, the content of an sf-string (RFC 8941 §3.3.3, what the
 * IETF draft specifies): `"abc"` is `abc`, `\"` and `\\` are escapes.
 * Undefined when it starts with `"` and is no well-formed sf-string (an
 * item parameter after it included: the draft defines none).
 */
function idempotencyKeyOf(value: string): string | undefined {
  if (!value.startsWith('"')) return value;
  const m = /^"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"$/.exec(value);
  return m ? m[1].replace(/\\(["\\])/g, "$1") : undefined;
}

/**
 * `Idempotency-Key` on `POST /v1/runs`: a dispatch key as a header, bare
 * (`abc`) or an sf-string (`"abc"`), then the same rules as the body's
 * `dispatch_key`. Printable ASCII only: a header's bytes have no agreed
 * encoding, so a key with other characters goes in the body. No comma: a
 * header sent twice reaches the API as its values joined by `, `
 * (`a, b`), which a key containing a comma cannot be told apart from.
 */
export const IdempotencyKeyHeader = z.string().min(1)
  .regex(/^[\x20-\x7e]*$/, "printable ASCII only (send other keys as the body's dispatch_key)")
  .refine(
    (value) => !value.includes(","),
    "given more than once, or containing a comma (which cannot be told from a repeated " +
      "header): send the header once, and a key with a comma as the body's dispatch_key",
  )
  .transform((value, ctx) => {
    const key = idempotencyKeyOf(value);
    if (key === undefined) {
      ctx.addIssue({ code: "custom", message: 'a value starting with " must be one sf-string' });
      return z.NEVER;
    }
    return key;
  })
  .pipe(label());

/** RFC 9457 problem details. */
export const Problem = z.object({
  type: z.string(),
  title: z.string(),
  status: z.number().int(),
  detail: z.string().optional(),
  retryable: z.boolean(),
  errors: z.array(z.object({ path: z.string(), message: z.string() })).optional(),
  run_status: RunStatus.optional().describe(
    "On `run-finished` (409): the status of the run a cancel found finished",
  ),
});
export type Problem = z.infer<typeof Problem>;

/** Headers of the admission protocol (defined in wire.ts, which needs no zod). */
export { HEADERS } from "./wire.ts";

// The plain types of wire.ts (what the clients show their users) and the
// schemas above must describe the same shapes: a difference fails here.
type Same<A, B> = (<T>() => T extends A ? 1 : 2) extends (<T>() => T extends B ? 1 : 2) ? true
  : false;
const sameShapes: [
  Same<RunStep, Wire.RunStep>,
  Same<RunRequest, Wire.RunRequest>,
  Same<RunStatus, Wire.RunStatus>,
  Same<WaitingFor, Wire.WaitingFor>,
  Same<Run, Wire.Run>,
  Same<RunPage, Wire.RunPage>,
  Same<RunEvent, Wire.RunEvent>,
  Same<Problem, Wire.Problem>,
] = [true, true, true, true, true, true, true, true];
void sameShapes;
