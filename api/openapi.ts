/**
 * The OpenAPI 3.1 document served at /openapi.json. Nothing in it is written
 * twice: every schema is generated with zod's `z.toJSONSchema` from the
 * schemas the API validates and answers with (contracts/runs.ts), and every
 * operation is one row of `ROUTES` in api/openapi_routes.ts
 * (tests/api_openapi_test.ts checks the rows against the routes hono
 * serves, both ways, and the document against the OpenAPI 3.1 schema).
 */
import { z } from "zod";
import { RETRY_AFTER_SECONDS } from "./problem.ts";
import {
  type Body,
  type Headers,
  REQUEST_SCHEMAS,
  RESPONSE_SCHEMAS,
  type Route,
  ROUTES,
} from "./openapi_routes.ts";

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
    : Array.isArray(body.schema)
    ? { oneOf: body.schema.map((name) => ({ $ref: `#/components/schemas/${name}` })) }
    : typeof body.schema === "string"
    ? { $ref: `#/components/schemas/${body.schema}` }
    : toJson(body.schema, io);
  const example = body.example === undefined ? {} : { example: body.example };
  return { [body.contentType ?? "application/json"]: { schema, ...example } };
}

/**
 * Query parameters from the query's zod object: one per property. A query
 * value is text on the wire, but a client passes the value it stands for
 * (`limit` a number, which its generator's types and serializer then
 * follow), so each schema is zod's output side, what the parser turns the
 * text into (`limit`: an integer 1–500); whether one is required is the
 * input side's (a default makes it optional to send). An array is one
 * comma-separated value (`fields=input,result`: form style, not exploded),
 * since a parameter given twice is refused.
 */
function queryParameters(query: z.ZodObject) {
  const json = toJson(query, "output") as { properties: Record<string, JsonSchema> };
  const required = (toJson(query, "input") as { required?: string[] }).required ?? [];
  return Object.entries(json.properties).map(([name, { description, ...schema }]) => ({
    name,
    in: "query",
    required: required.includes(name),
    ...(description === undefined ? {} : { description }),
    ...(schema.type === "array" ? { style: "form", explode: false } : {}),
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

/** Headers every problem of a status carries (api/problem.ts). */
const PROBLEM_HEADERS: Record<number, Headers> = {
  401: {
    "WWW-Authenticate": { description: "The Bearer challenge", schema: z.string() },
  },
  429: {
    "Retry-After": {
      description: "Whole seconds to wait before retrying: when the tenant's next admission " +
        "is due (`rate-limited`), or the quota refresh interval (`queue-full`), or a few " +
        "seconds (`too-many-streams`)",
      schema: z.int().min(1),
    },
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
      ...(answer.empty ? {} : {
        content: Object.assign(
          content(answer, "output"),
          ...(answer.also ?? []).map((body) => content(body, "output")),
        ),
      }),
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
