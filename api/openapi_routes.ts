/**
 * The operations of the OpenAPI document (api/openapi.ts turns them into
 * it): one row per route hono serves, its parameters, headers and answers
 * as the zod schemas of contracts/runs.ts.
 */
import { z } from "zod";
import {
  HEADERS,
  IdempotencyKeyHeader,
  ListRunsQuery,
  Problem,
  Run,
  RunEvents,
  RunPage,
  RunRequest,
  SourceHeader,
} from "../contracts/runs.ts";
import { RunBatch, RunBatchAnswer } from "../contracts/run_batch.ts";
import { TENANT_ID_PATTERN } from "../contracts/topics.ts";
import { MAX_WAIT_SECONDS } from "../contracts/wire.ts";
import { SignalReceipt, SignalRequest } from "../contracts/signals.ts";
import { scheduleRoutes } from "./openapi_schedule_routes.ts";
import {
  BackfillRequest,
  BackfillResult,
  Schedule,
  SchedulePage,
  SchedulePatch,
  ScheduleRequest,
} from "../contracts/schedules.ts";

/** Request or response headers, by name. */
export type Headers = Record<string, { description: string; schema: z.ZodType; example?: string }>;

/** Request bodies: documented as clients write them (zod's input side). */
export const REQUEST_SCHEMAS = {
  RunRequest,
  RunBatch,
  SignalRequest,
  ScheduleRequest,
  SchedulePatch,
  BackfillRequest,
};
/** Response bodies: documented as the API writes them (zod's output side). */
export const RESPONSE_SCHEMAS = {
  Run,
  RunPage,
  RunEvents,
  Problem,
  SignalReceipt,
  RunBatchAnswer,
  Schedule,
  SchedulePage,
  BackfillResult,
};
/** A component schema, by name. */
export type SchemaName = keyof typeof REQUEST_SCHEMAS | keyof typeof RESPONSE_SCHEMAS;

/** The health answers, as the routes in api/app.ts write them. */
const Healthy = z.object({ status: z.literal("ok") });
const Ready = z.object({
  status: z.literal("ready"),
  checks: z.record(z.string(), z.string()).describe("Each dependency and how it answered"),
});

/** A request or response body. */
export interface Body {
  /**
   * A component (by name), one of several components (`oneOf`), or an
   * inline zod schema; omitted for a body of any shape.
   */
  schema?: SchemaName | SchemaName[] | z.ZodType;
  /** Default application/json. */
  contentType?: string;
  /** The media type's example, for a format a schema says little about (a stream). */
  example?: string;
}

/** One response of an operation. */
export interface Answer extends Body {
  description: string;
  headers?: Headers;
  /** The same answer in other content types, chosen by `Accept`. */
  also?: Body[];
  /** No body (a 204). */
  empty?: boolean;
}

/** One operation of the API. */
export interface Route {
  method: "get" | "post" | "patch" | "delete";
  /** As hono writes it: `/v1/runs/:run_id`. */
  path: string;
  summary: string;
  /** More than the summary says, when there is more. */
  description?: string;
  /** Whether it needs a bearer token (everything under /v1). */
  auth: boolean;
  /** Path parameters, named as in `path`. */
  params?: Record<string, z.ZodType>;
  /** The query, as the route parses it. */
  query?: z.ZodObject;
  /** Request headers beyond Authorization. */
  headers?: Headers;
  body?: Body;
  answers: Record<number, Answer>;
  /** Statuses answered with problem+json. */
  problems: number[];
  /** What a problem status means on this route, when more than "a problem". */
  problemNotes?: Record<number, string>;
}

const TENANT_HEADER = {
  [HEADERS.tenant]: {
    description: "With a service token: the tenant it acts for (a tenant token needs none)",
    schema: z.string().regex(TENANT_ID_PATTERN),
  },
};

const RUN_ID = {
  run_id: z.string().describe("The run's id; anything but the tenant's run is a 404"),
};

/** `Prefer: wait=N` (RFC 7240), as api/run_wait.ts reads it. */
const PREFER_HEADER = {
  Prefer: {
    description: "`wait=N` (RFC 7240): answer once the run is final (`succeeded`, `failed`, " +
      `\`cancelled\`) or after N seconds, whichever is first, with the run as it then is; N above ` +
      `${MAX_WAIT_SECONDS} is cut to ${MAX_WAIT_SECONDS}. Other preferences are ignored. A ` +
      "tenant holding its share of waits and streams (RUN_WATCHERS_PER_TENANT) is answered at " +
      "once, without `Preference-Applied`.",
    schema: z.string(),
    example: "wait=10",
  },
};

const PREFERENCE_APPLIED = {
  "Preference-Applied": {
    description: "With `Prefer: wait=N`: `wait=<the seconds applied>` (N, or at most " +
      `${MAX_WAIT_SECONDS})`,
    schema: z.string().regex(/^wait=\d+$/),
  },
};

/** Why a wait or a stream can be a 503, beside Postgres. */
const WATCH_BUSY = "A problem (RFC 9457): `database-unavailable`, or `busy` when this API " +
  "process already holds RUN_WATCHERS_MAX waits and event streams; retry after `Retry-After`";

/** The `text/event-stream` body, as api/run_stream.ts writes it. */
const EVENT_STREAM_FORMAT = "Server-sent events (text/event-stream): first `retry: 2000`, then " +
  "one event per run event, oldest first, each `id: <seq>`, `event: <type>` and `data: <the " +
  "event as JSON, a RunEvent>`; new events as they commit; `: keep-alive` comment lines while " +
  "idle (RUN_STREAM_HEARTBEAT_MS); the stream ends after the run's final event, or after " +
  "RUN_STREAM_MAX_MS with a `: reconnect` comment line (resume with `Last-Event-ID`). A reader " +
  "that leaves its stream unread for RUN_STREAM_STALL_MS is disconnected.";

/** Why a stream can be a 429. */
const STREAM_SHARE = "A problem (RFC 9457): `too-many-streams` when the tenant already holds " +
  "RUN_WATCHERS_PER_TENANT waits and event streams on this API process; retry after " +
  "`Retry-After` (a `Prefer: wait` past it is answered at once, without waiting)";

/** Every route the API serves. */
export const ROUTES: Route[] = [
  {
    method: "post",
    path: "/v1/runs",
    summary: "Admit a run, or a batch of runs (idempotent by dispatch_key or Idempotency-Key)",
    description: "A JSON array is a batch: 1 to 1,000 run requests in one body (the body limit, " +
      "BODY_LIMIT_BYTES, and the body budget apply to its bytes), answered 207 with one result " +
      "per item, in order: each item is validated, deduplicated, quota-checked and admitted " +
      "exactly as the same request sent alone, and one bad item never fails the others. Items " +
      "with the same dispatch_key are admitted in their order (the first is created). A batch " +
      "with `Idempotency-Key` is a 422 (each item carries its own `dispatch_key`), and so is " +
      "one with a service token's `Poimen-Source` (a source names one request: its " +
      "`Poimen-Sources` names each item's); `Prefer` is " +
      "ignored. An empty or longer batch is a 422 for the whole request.",
    auth: true,
    headers: {
      ...TENANT_HEADER,
      [HEADERS.source]: {
        description: "With a service token: where the request came from " +
          "(the relay's is `kafka:<topic>/<partition>/<offset>`); ignored for a tenant token",
        schema: SourceHeader,
      },
      [HEADERS.sources]: {
        description: "On a batch, with a service token: each item's source, in order, " +
          "comma-separated, each `<source>` or `<source> <traceparent>` (the relay's batches); " +
          "a header that does not name every item is a 422; ignored for a tenant token",
        schema: z.string(),
      },
      [HEADERS.idempotencyKey]: {
        description: "The dispatch key as a header (IETF draft `Idempotency-Key`): bare " +
          '(`order-42`) or an sf-string (`"order-42"`, RFC 8941: `\\"` and `\\\\` escaped), ' +
          "then the rules of the body's `dispatch_key`, in printable ASCII, without a comma " +
          "(a repeated header arrives joined by `, `: sent once). The same as that " +
          "field; given both, they must be equal (otherwise a 422 at `header.Idempotency-Key`)",
        schema: IdempotencyKeyHeader,
        example: '"order-42"',
      },
      ...PREFER_HEADER,
    },
    body: { schema: ["RunRequest", "RunBatch"] },
    answers: {
      207: {
        description: "A batch was answered: each item's result, in order (`created`, " +
          "`replayed` and `debounced` with the run, or its `problem` with its status and " +
          "`retryable`)",
        schema: "RunBatchAnswer",
      },
      201: {
        description: "Admitted: a new run (with `Prefer: wait=N`, as it is once final or " +
          "after N seconds)",
        schema: "Run",
        headers: {
          Location: { description: "The run's URL", schema: z.string() },
          ...PREFERENCE_APPLIED,
        },
      },
      200: {
        description: "The dispatch key was seen before: the first run (with `Prefer: wait=N`, " +
          "as it is once final or after N seconds). Or, for a debounced workflow, the request " +
          "joined the pending run of its debounce key: that run, with `debounced: true`, its " +
          "input now this request's and its start moved (docs/workflows.md#debounce)",
        schema: "Run",
        headers: {
          [HEADERS.replayed]: {
            description: "`true` on a replay; absent when the request joined a debounced run",
            schema: z.literal("true"),
          },
          [HEADERS.bodyMismatch]: {
            description: "`true` when this body differs from the first one's",
            schema: z.literal("true"),
          },
          ...PREFERENCE_APPLIED,
        },
      },
    },
    problems: [400, 401, 403, 408, 413, 415, 422, 429, 503],
    problemNotes: {
      429: "A problem (RFC 9457): the tenant is over a quota (`deno task tenant`), nothing was " +
        "admitted: `queue-full` when it has its `max_queued` queued runs, `rate-limited` past " +
        "its admission rate; retry after `Retry-After` (a replay of a known dispatch key is " +
        "refused alike)",
      503: "A problem (RFC 9457): `database-unavailable`; `busy` when too many bodies are in " +
        "progress (BODY_BUDGET_BYTES) or, with `Prefer: wait=N`, when this API process already " +
        "holds RUN_WATCHERS_MAX waits and event streams; retry after `Retry-After`",
    },
  },
  {
    method: "get",
    path: "/v1/runs",
    summary: "List the tenant's runs, newest first",
    description: "Keyset pages: pass a page's `next_cursor` as `cursor` for the next. A page " +
      "holds at most `limit` runs and at most 1 MiB of JSON, whichever comes first (a first " +
      "run larger than that alone is a page of one). A run's `input` and `result` are left " +
      "out unless `fields` asks for them (`fields=input,result`).",
    auth: true,
    headers: TENANT_HEADER,
    query: ListRunsQuery,
    answers: { 200: { description: "A page of runs", schema: "RunPage" } },
    problems: [401, 403, 422, 503],
  },
  {
    method: "get",
    path: "/v1/runs/:run_id",
    summary: "One run of the tenant, with its input, its durable steps and, while queued or " +
      "waiting, what it waits for",
    auth: true,
    params: RUN_ID,
    headers: { ...TENANT_HEADER, ...PREFER_HEADER },
    answers: {
      200: {
        description: "The run (with `Prefer: wait=N`, as it is once final or after N seconds)",
        schema: "Run",
        headers: PREFERENCE_APPLIED,
      },
    },
    problems: [401, 403, 404, 503],
    problemNotes: { 503: WATCH_BUSY },
  },
  {
    method: "post",
    path: "/v1/runs/:run_id/cancel",
    summary: "Cancel a run (idempotent)",
    description: "A queued run becomes `cancelled` at once. A running run gets " +
      "`cancel_requested_at`: its handler's signal is aborted and the run ends " +
      "`cancelled` once its worker sees the request (within a heartbeat). " +
      "A cancelled run is returned as it is; a succeeded or failed one is a 409 " +
      "`run-finished` problem naming its status in `run_status`. Its unfinished, " +
      "non-detached descendants (child runs) are cancelled with it, in the same transaction.",
    auth: true,
    params: RUN_ID,
    headers: TENANT_HEADER,
    answers: {
      200: { description: "The run, cancelled or with its cancel requested", schema: "Run" },
    },
    problems: [401, 403, 404, 409, 503],
  },
  {
    method: "post",
    path: "/v1/runs/:run_id/signals",
    summary: "Send a signal to a run (idempotent by signal_id)",
    description: "The signal is kept in the run's mailbox until a wait of the run's handler " +
      "(`ctx.waitForSignal(name)`) consumes it, however long before the wait it arrived; a run " +
      "waiting for it is woken (`queued`) in the same transaction. The same (run, name, " +
      "signal_id) is one signal: sending it again is a replay (200, `Idempotent-Replayed`), " +
      "also once the run is final. A new signal to a final run (`succeeded`, `failed`, " +
      "`cancelled`) is a 409 `run-finished` naming its status in `run_status`. A payload that " +
      "fails the schema the run's version declares for the signal is a 422 `validation` naming " +
      "the fields (`payload.…`); a signal the version does not declare takes any JSON.",
    auth: true,
    params: RUN_ID,
    headers: TENANT_HEADER,
    body: { schema: "SignalRequest" },
    answers: {
      201: { description: "Stored: a new signal", schema: "SignalReceipt" },
      200: {
        description: "This signal_id was seen before: the signal as stored then",
        schema: "SignalReceipt",
        headers: {
          [HEADERS.replayed]: { description: "Always `true`", schema: z.literal("true") },
        },
      },
    },
    problems: [400, 401, 403, 404, 408, 409, 413, 415, 422, 503],
  },
  {
    method: "get",
    path: "/v1/runs/:run_id/events",
    summary: "One run's event timeline (what work_events still holds)",
    description: "JSON by default. With `Accept: text/event-stream`, a stream of server-sent " +
      "events instead: the events the run already has, then each new one as it commits, ending " +
      "after the run is final. A client that reconnects with `Last-Event-ID` gets the events " +
      "after that seq, without gaps or repeats (EventSource does it by itself).",
    auth: true,
    params: RUN_ID,
    headers: {
      ...TENANT_HEADER,
      "Last-Event-ID": {
        description: "With `Accept: text/event-stream`: the last seq received; the stream " +
          "starts after it (absent or not a seq: from the first event)",
        schema: z.string(),
      },
    },
    answers: {
      200: {
        description: "The run's events, oldest first (JSON), or their stream " +
          "(`Accept: text/event-stream`)",
        schema: "RunEvents",
        also: [{
          contentType: "text/event-stream",
          schema: z.string().describe(EVENT_STREAM_FORMAT),
          example: "retry: 2000\n\nid: 1\nevent: run.admitted\ndata: " +
            '{"seq":1,"type":"run.admitted",…}\n\n: keep-alive\n\n',
        }],
      },
    },
    problems: [401, 403, 404, 429, 503],
    problemNotes: { 429: STREAM_SHARE, 503: WATCH_BUSY },
  },
  ...scheduleRoutes(TENANT_HEADER),
  {
    method: "get",
    path: "/healthz",
    summary: "Alive",
    auth: false,
    answers: { 200: { description: "The process serves requests", schema: Healthy } },
    problems: [],
  },
  {
    method: "get",
    path: "/readyz",
    summary: "Ready: Postgres answers",
    auth: false,
    answers: { 200: { description: "Ready", schema: Ready } },
    problems: [503],
  },
  {
    method: "get",
    path: "/metrics",
    summary: "Prometheus metrics that name no tenant (all of them: API_METRICS_PORT)",
    auth: false,
    answers: { 200: { description: "Prometheus text format", contentType: "text/plain" } },
    problems: [],
  },
  {
    method: "get",
    path: "/openapi.json",
    summary: "This document",
    auth: false,
    answers: { 200: { description: "OpenAPI 3.1" } },
    problems: [],
  },
];
