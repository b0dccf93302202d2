/**
 * The OpenAPI 3.1 document served at /openapi.json. Nothing in it is written
 * twice: every schema is generated with zod's `z.toJSONSchema` from the
 * schemas the API validates and answers with (contracts/runs.ts), and every
 * operation is one row of `ROUTES` (tests/api_openapi_test.ts checks the rows
 * against the routes hono serves, both ways, and the document against the
 * OpenAPI 3.1 schema).
 */
import { z } from "zod";
import {
  HEADERS,
  ListRunsQuery,
  Problem,
  Run,
  RunEvents,
  RunPage,
  RunRequest,
  SourceHeader,
} from "../contracts/runs.ts";
import { TENANT_ID_PATTERN } from "../contracts/topics.ts";
import { RETRY_AFTER_SECONDS } from "./problem.ts";
import { MAX_WAIT_SECONDS } from "./run_wait.ts";

/** Request bodies: documented as clients write them (zod's input side). */
const REQUEST_SCHEMAS = { RunRequest };
/** Response bodies: documented as the API writes them (zod's output side). */
const RESPONSE_SCHEMAS = { Run, RunPage, RunEvents, Problem };
type SchemaName = keyof typeof REQUEST_SCHEMAS | keyof typeof RESPONSE_SCHEMAS;

/** The health answers, as the routes in api/app.ts write them. */
const Healthy = z.object({ status: z.literal("ok") });
const Ready = z.object({
  status: z.literal("ready"),
  checks: z.record(z.string(), z.string()).describe("Each dependency and how it answered"),
});

interface Body {
  /** A component (by name) or an inline zod schema; omitted for a body of any shape. */
  schema?: SchemaName | z.ZodType;
  /** Default application/json. */
  contentType?: string;
  /** The media type's example, for a format a schema says little about (a stream). */
  example?: string;
}

interface Answer extends Body {
  description: string;
  headers?: Headers;
  /** The same answer in other content types, chosen by `Accept`. */
  also?: Body[];
}

/** One operation of the API. */
export interface Route {
  method: "get" | "post";
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
      `${MAX_WAIT_SECONDS} is cut to ${MAX_WAIT_SECONDS}. Other preferences are ignored.`,
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
  "idle (RUN_STREAM_HEARTBEAT_MS); the stream ends after the run's final event.";

/** Every route the API serves. */
export const ROUTES: Route[] = [
  {
    method: "post",
    path: "/v1/runs",
    summary: "Admit a run (idempotent by dispatch_key)",
    auth: true,
    headers: {
      ...TENANT_HEADER,
      [HEADERS.source]: {
        description: "With a service token: where the request came from " +
          "(the relay's is `kafka:<topic>/<partition>/<offset>`); ignored for a tenant token",
        schema: SourceHeader,
      },
      ...PREFER_HEADER,
    },
    body: { schema: "RunRequest" },
    answers: {
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
        description: "The dispatch_key was seen before: the first run (with `Prefer: wait=N`, " +
          "as it is once final or after N seconds)",
        schema: "Run",
        headers: {
          [HEADERS.replayed]: { description: "Always `true`", schema: z.literal("true") },
          [HEADERS.bodyMismatch]: {
            description: "`true` when this body differs from the first one's",
            schema: z.literal("true"),
          },
          ...PREFERENCE_APPLIED,
        },
      },
    },
    problems: [400, 401, 403, 408, 413, 415, 422, 503],
    problemNotes: {
      503: "A problem (RFC 9457): `database-unavailable`; `busy` when too many bodies are in " +
        "progress (BODY_BUDGET_BYTES) or, with `Prefer: wait=N`, when this API process already " +
        "holds RUN_WATCHERS_MAX waits and event streams; retry after `Retry-After`",
    },
  },
  {
    method: "get",
    path: "/v1/runs",
    summary: "List the tenant's runs, newest first",
    auth: true,
    headers: TENANT_HEADER,
    query: ListRunsQuery,
    answers: { 200: { description: "A page of runs", schema: "RunPage" } },
    problems: [401, 403, 422, 503],
  },
  {
    method: "get",
    path: "/v1/runs/:run_id",
    summary: "One run of the tenant, with its input and, while queued, what it waits for",
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
      "`run-finished` problem naming its status in `run_status`.",
    auth: true,
    params: RUN_ID,
    headers: TENANT_HEADER,
    answers: {
      200: { description: "The run, cancelled or with its cancel requested", schema: "Run" },
    },
    problems: [401, 403, 404, 409, 503],
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
    problems: [401, 403, 404, 503],
    problemNotes: { 503: WATCH_BUSY },
  },
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
    summary: "Prometheus metrics",
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

type JsonSchema = Record<string, unknown>;

// OpenAPI 3.1's default dialect is JSON Schema 2020-12, what zod writes, so
// no schema needs its own `$schema`; and the `$id` zod derives from `uri` is
// a bare fragment, which 2020-12 does not allow.
function bare({ $schema: _s, $id: _i, ...rest }: JsonSchema): JsonSchema {
  return rest;
}

function toJson(s: z.ZodType, io: "input" | "output"): JsonSchema {
  return bare(z.toJSONSchema(s, { io, unrepresentable: "any" }) as JsonSchema);
}

/** Named schemas, generated together so that one refers to another by $ref (RunPage → Run). */
function components(schemas: Record<string, z.ZodType>, io: "input" | "output") {
  const registry = z.registry<{ id: string }>();
  for (const [id, s] of Object.entries(schemas)) registry.add(s, { id });
  const out = z.toJSONSchema(registry, {
    io,
    unrepresentable: "any",
    uri: (id) => `#/components/schemas/${id}`,
  }).schemas as Record<string, JsonSchema>;
  return Object.fromEntries(Object.entries(out).map(([id, s]) => [id, bare(s)]));
}

function content(body: Body, io: "input" | "output") {
  const schema = body.schema === undefined
    ? {}
    : typeof body.schema === "string"
    ? { $ref: `#/components/schemas/${body.schema}` }
    : toJson(body.schema, io);
  const example = body.example === undefined ? {} : { example: body.example };
  return { [body.contentType ?? "application/json"]: { schema, ...example } };
}

/** Query parameters from the query's zod object: one per property. */
function queryParameters(query: z.ZodObject) {
  const json = toJson(query, "input") as {
    properties: Record<string, JsonSchema>;
    required?: string[];
  };
  return Object.entries(json.properties).map(([name, { description, ...schema }]) => ({
    name,
    in: "query",
    required: json.required?.includes(name) ?? false,
    ...(description === undefined ? {} : { description }),
    schema,
  }));
}

function parameter(
  name: string,
  where: "path" | "header",
  s: z.ZodType,
  description?: string,
  example?: string,
) {
  const { description: own, ...schema } = toJson(s, "input");
  const text = description ?? own;
  return {
    name,
    in: where,
    required: where === "path",
    ...(text === undefined ? {} : { description: text }),
    schema,
    ...(example === undefined ? {} : { example }),
  };
}

type Headers = Record<string, { description: string; schema: z.ZodType; example?: string }>;

/** Headers every problem of a status carries (api/problem.ts). */
const PROBLEM_HEADERS: Record<number, Headers> = {
  401: {
    "WWW-Authenticate": { description: "The Bearer challenge", schema: z.string() },
  },
  503: {
    "Retry-After": {
      description: "Seconds to wait before retrying",
      schema: z.literal(RETRY_AFTER_SECONDS),
    },
  },
};

function headerObjects(headers: Headers) {
  return Object.fromEntries(
    Object.entries(headers).map(([name, h]) => [name, {
      description: h.description,
      schema: toJson(h.schema, "output"),
    }]),
  );
}

function operation(route: Route) {
  const parameters = [
    ...Object.entries(route.params ?? {}).map(([name, s]) => parameter(name, "path", s)),
    ...(route.query ? queryParameters(route.query) : []),
    ...Object.entries(route.headers ?? {}).map(([name, h]) =>
      parameter(name, "header", h.schema, h.description, h.example)
    ),
  ];
  const responses: Record<string, unknown> = {};
  for (const [status, answer] of Object.entries(route.answers)) {
    responses[status] = {
      description: answer.description,
      ...(answer.headers ? { headers: headerObjects(answer.headers) } : {}),
      content: Object.assign(
        content(answer, "output"),
        ...(answer.also ?? []).map((body) => content(body, "output")),
      ),
    };
  }
  for (const status of route.problems) {
    const headers = PROBLEM_HEADERS[status];
    responses[String(status)] = {
      description: route.problemNotes?.[status] ?? "A problem (RFC 9457)",
      ...(headers ? { headers: headerObjects(headers) } : {}),
      content: content({ schema: "Problem", contentType: "application/problem+json" }, "output"),
    };
  }
  return {
    summary: route.summary,
    ...(route.description === undefined ? {} : { description: route.description }),
    ...(route.auth ? {} : { security: [] }),
    ...(parameters.length > 0 ? { parameters } : {}),
    ...(route.body
      ? { requestBody: { required: true, content: content(route.body, "input") } }
      : {}),
    responses,
  };
}

/** `/v1/runs/:run_id` as OpenAPI writes it: `/v1/runs/{run_id}`. */
export function openApiPath(honoPath: string): string {
  return honoPath.replace(/:([A-Za-z_][A-Za-z0-9_]*)/g, "{$1}");
}

function buildDocument() {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const route of ROUTES) {
    (paths[openApiPath(route.path)] ??= {})[route.method] = operation(route);
  }
  return {
    openapi: "3.1.0",
    info: { title: "poimen", version: "1" },
    components: {
      securitySchemes: { bearer: { type: "http", scheme: "bearer" } },
      schemas: {
        ...components(REQUEST_SCHEMAS, "input"),
        ...components(RESPONSE_SCHEMAS, "output"),
      },
    },
    security: [{ bearer: [] }],
    paths,
  };
}

let cached: ReturnType<typeof buildDocument> | undefined;

/** The document served at /openapi.json (built once). */
export function openApiDocument(): ReturnType<typeof buildDocument> {
  return cached ??= buildDocument();
}
