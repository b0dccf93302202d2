/** The OpenAPI 3.1 document, generated from the same zod schemas the API validates with. */
import { z } from "zod";
import { ListRunsQuery, Problem, Run, RunEvents, RunPage, RunRequest } from "../contracts/runs.ts";

const schema = (s: z.ZodType) => z.toJSONSchema(s, { io: "input", unrepresentable: "any" });

function problems(...statuses: number[]) {
  return Object.fromEntries(statuses.map((s) => [String(s), {
    description: "problem+json",
    content: { "application/problem+json": { schema: { $ref: "#/components/schemas/Problem" } } },
  }]));
}

let cached: unknown;

/** The document served at /openapi.json. */
export function openApiDocument(): unknown {
  if (cached) return cached;
  const listParams = Object.entries(
    (schema(ListRunsQuery) as { properties: Record<string, unknown> }).properties,
  ).map(([name, s]) => ({ name, in: "query", required: false, schema: s }));
  cached = {
    openapi: "3.1.0",
    info: { title: "poimen", version: "1" },
    components: {
      securitySchemes: { bearer: { type: "http", scheme: "bearer" } },
      schemas: {
        RunRequest: schema(RunRequest),
        Run: schema(Run),
        RunPage: schema(RunPage),
        RunEvents: schema(RunEvents),
        Problem: schema(Problem),
      },
    },
    security: [{ bearer: [] }],
    paths: {
      "/v1/runs": {
        post: {
          summary: "Admit a run (idempotent by dispatch_key)",
          requestBody: {
            required: true,
            content: {
              "application/json": { schema: { $ref: "#/components/schemas/RunRequest" } },
            },
          },
          responses: {
            "201": {
              description: "Created",
              headers: { Location: { schema: { type: "string" } } },
              content: { "application/json": { schema: { $ref: "#/components/schemas/Run" } } },
            },
            "200": {
              description: "The dispatch_key was seen: the first run (Idempotent-Replayed: true)",
              content: { "application/json": { schema: { $ref: "#/components/schemas/Run" } } },
            },
            ...problems(400, 401, 403, 413, 415, 422, 503),
          },
        },
        get: {
          summary: "List the tenant's runs, newest first",
          parameters: listParams,
          responses: {
            "200": {
              description: "A page",
              content: { "application/json": { schema: { $ref: "#/components/schemas/RunPage" } } },
            },
            ...problems(401, 403, 422, 503),
          },
        },
      },
      "/v1/runs/{run_id}": {
        get: {
          summary: "One run of the tenant",
          parameters: [{ name: "run_id", in: "path", required: true, schema: { type: "string" } }],
          responses: {
            "200": {
              description: "The run",
              content: { "application/json": { schema: { $ref: "#/components/schemas/Run" } } },
            },
            ...problems(401, 403, 404, 503),
          },
        },
      },
      "/v1/runs/{run_id}/events": {
        get: {
          summary: "One run's event timeline (what work_events still holds)",
          parameters: [{ name: "run_id", in: "path", required: true, schema: { type: "string" } }],
          responses: {
            "200": {
              description: "The run's events, oldest first",
              content: {
                "application/json": { schema: { $ref: "#/components/schemas/RunEvents" } },
              },
            },
            ...problems(401, 403, 404, 503),
          },
        },
      },
      "/v1/runs/{run_id}/cancel": {
        post: {
          summary: "Cancel a run (idempotent)",
          description: "A queued run becomes `cancelled` at once. A running run gets " +
            "`cancel_requested_at`: its handler's signal is aborted and the run ends " +
            "`cancelled` once its worker sees the request (within a heartbeat). " +
            "A cancelled run is returned as it is; a succeeded or failed one is a 409 " +
            "`run-finished` problem naming its status in `run_status`.",
          parameters: [{ name: "run_id", in: "path", required: true, schema: { type: "string" } }],
          responses: {
            "200": {
              description: "The run, cancelled or with its cancel requested",
              content: { "application/json": { schema: { $ref: "#/components/schemas/Run" } } },
            },
            ...problems(401, 403, 404, 409, 503),
          },
        },
      },
    },
  };
  return cached;
}
