/**
 * /openapi.json: valid OpenAPI 3.1 by a validator that knows the standard
 * (@seriousme/openapi-schema-validator: the official 3.1 schema and the JSON
 * Schema 2020-12 dialect), complete (every route hono serves is in it, and
 * nothing else is), and generated (its schemas are zod's, not a copy).
 */
import assert from "node:assert/strict";
import client from "prom-client";
import { z } from "zod";
import { Validator } from "@seriousme/openapi-schema-validator";
import { Ajv2020 } from "ajv/dist/2020.js";
import { createApp } from "../api/app.ts";
import { createApiMetrics } from "../api/metrics.ts";
import { openApiPath } from "../api/openapi.ts";
import { silentLogger } from "../core/log.ts";
import { ListRunsQuery, Problem, Run, RunPage, RunRequest } from "../contracts/runs.ts";
import { SignalReceipt, SignalRequest } from "../contracts/signals.ts";

type Doc = {
  openapi: string;
  components: { schemas: Record<string, unknown> };
  paths: Record<string, Record<string, Record<string, unknown>>>;
};

// Serving the document touches neither Postgres nor the admission kernel.
const app = createApp({
  sql: {} as never,
  admission: {} as never,
  auth: {} as never,
  metrics: createApiMetrics(new client.Registry()),
  log: silentLogger,
  bodyLimit: 4096,
  consoleAssets: { appJs: "", css: "" },
});

async function served(): Promise<Doc> {
  const res = await app.request("/openapi.json");
  assert.equal(res.status, 200);
  assert.match(res.headers.get("content-type") ?? "", /^application\/json/);
  return await res.json();
}

/** Every Schema Object in `doc`, by where it is: components, parameters, headers, bodies. */
function schemaObjects(doc: Doc): [string, unknown][] {
  const found: [string, unknown][] = Object.entries(doc.components.schemas)
    .map(([name, s]) => [`components.schemas.${name}`, s]);
  const walk = (node: unknown, at: string) => {
    if (typeof node !== "object" || node === null) return;
    for (const [k, v] of Object.entries(node)) {
      if (k === "schema") found.push([`${at}.schema`, v]);
      else walk(v, `${at}.${k}`);
    }
  };
  walk(doc.paths, "paths");
  return found;
}

/**
 * The OpenAPI 3.1 schema leaves Schema Objects open (any object), so the
 * validator checks the document's structure and its $refs; each Schema
 * Object is checked here against the JSON Schema 2020-12 meta-schema.
 */
async function validate(doc: Doc) {
  const validator = new Validator();
  const result = await validator.validate(structuredClone(doc) as never);
  const ajv = new Ajv2020({ strict: true });
  const schemaErrors = schemaObjects(doc).flatMap(([at, s]) =>
    ajv.validateSchema(s as object) ? [] : [{ at, errors: ajv.errors }]
  );
  return {
    version: validator.version,
    valid: result.valid && schemaErrors.length === 0,
    errors: [result.errors ?? [], schemaErrors].flat(),
    schemas: schemaObjects(doc).length,
  };
}

Deno.test("openapi: the served document is valid OpenAPI 3.1", async () => {
  const doc = await served();
  assert.equal(doc.openapi, "3.1.0");
  const result = await validate(doc);
  assert.equal(result.version, "3.1");
  assert.equal(result.valid, true, JSON.stringify(result.errors, null, 2));
  assert.ok(result.schemas > 20, `only ${result.schemas} schema objects found`);
});

Deno.test("openapi: the validator refuses a document that breaks the standard", async () => {
  // So that the test above could fail: each of these is a real mistake.
  const noDescription = await served();
  const created = (noDescription.paths["/v1/runs"].post.responses as Record<string, object>)["201"];
  delete (created as { description?: string }).description;
  assert.equal((await validate(noDescription)).valid, false, "a response without description");

  const badParameter = await served();
  const parameters = badParameter.paths["/v1/runs"].get.parameters as { in: string }[];
  parameters[0].in = "body";
  assert.equal((await validate(badParameter)).valid, false, "a parameter `in: body`");

  const badSchema = await served();
  badSchema.components.schemas.Run = { type: "object", required: "run_id" };
  assert.equal((await validate(badSchema)).valid, false, "a schema whose `required` is no list");

  const badType = await served();
  const header = (badType.paths["/v1/runs"].post.parameters as { schema: object }[])[0];
  header.schema = { type: "strin" };
  assert.equal((await validate(badType)).valid, false, "a parameter schema of an unknown type");

  const dangling = await served();
  dangling.components.schemas.RunPage = { $ref: "#/components/schemas/Nothing" };
  assert.equal((await validate(dangling)).valid, false, "a $ref to nothing");
});

Deno.test("openapi: every route the API serves is documented, and nothing else is", async () => {
  const doc = await served();
  // The console (/console) is a browser UI of HTML pages, not part of the API.
  const api = app.routes.filter((r) => r.method !== "ALL" && !r.path.startsWith("/console"));
  const servedRoutes = new Set(
    api.map((r) => `${r.method.toLowerCase()} ${openApiPath(r.path)}`),
  );
  const documented = new Set(
    Object.entries(doc.paths).flatMap(([path, ops]) =>
      Object.keys(ops).map((method) => `${method} ${path}`)
    ),
  );
  assert.deepEqual([...documented].sort(), [...servedRoutes].sort());
  // Only /v1 needs a token.
  for (const [path, ops] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(ops)) {
      const open = Array.isArray(op.security) && op.security.length === 0;
      assert.equal(open, !path.startsWith("/v1/"), `${method} ${path}`);
    }
  }
});

Deno.test("openapi: the schemas are zod's, generated from contracts/runs.ts", async () => {
  const doc = await served();
  const zodSchema = (s: z.ZodType, io: "input" | "output") => {
    const { $schema: _, ...rest } = z.toJSONSchema(s, { io, unrepresentable: "any" });
    return rest;
  };
  assert.deepEqual(doc.components.schemas.RunRequest, zodSchema(RunRequest, "input"));
  assert.deepEqual(doc.components.schemas.Run, zodSchema(Run, "output"));
  assert.deepEqual(doc.components.schemas.Problem, zodSchema(Problem, "output"));
  assert.deepEqual(doc.components.schemas.SignalRequest, zodSchema(SignalRequest, "input"));
  assert.deepEqual(doc.components.schemas.SignalReceipt, zodSchema(SignalReceipt, "output"));
  // What a queued run waits for: one object, its reason an enum, documented.
  const run = doc.components.schemas.Run as { properties: Record<string, unknown> };
  const waiting = (run.properties.waiting_for as { anyOf: Record<string, unknown>[] }).anyOf[0] as {
    properties: Record<string, { enum?: string[]; description?: string }>;
    required: string[];
  };
  assert.deepEqual(waiting.properties.reason.enum, [
    "worker",
    "schedule",
    "concurrency",
    "slot",
    "sleep",
    "signal",
    "children",
  ]);
  assert.ok(waiting.properties.reason.description?.includes("no running worker"));
  assert.deepEqual(waiting.required, ["reason", "detail"]);
  // RunPage refers to Run rather than repeating it.
  const page = doc.components.schemas.RunPage as { properties: Record<string, unknown> };
  assert.deepEqual(page.properties.runs, {
    type: "array",
    items: { $ref: "#/components/schemas/Run" },
    description: RunPage.shape.runs.description,
  });
  assert.deepEqual(page.properties.next_cursor, zodSchema(RunPage.shape.next_cursor, "output"));
  // The list's query parameters are ListRunsQuery's fields, each once.
  const params = doc.paths["/v1/runs"].get.parameters as { name: string; in: string }[];
  assert.deepEqual(
    params.filter((p) => p.in === "query").map((p) => p.name),
    Object.keys(ListRunsQuery.shape),
  );
});

type Operation = {
  description?: string;
  parameters?: { name: string; in: string; description?: string; example?: string }[];
  responses: Record<string, {
    description: string;
    headers?: Record<string, { description: string; schema: { pattern?: string } }>;
    content: Record<string, { schema: Record<string, unknown>; example?: string }>;
  }>;
};

Deno.test("openapi: waiting (Prefer: wait=N) is documented on admitting and reading a run", async () => {
  const doc = await served();
  const ops: [string, Operation, string[]][] = [
    ["post /v1/runs", doc.paths["/v1/runs"].post as Operation, ["201", "200"]],
    ["get /v1/runs/{run_id}", doc.paths["/v1/runs/{run_id}"].get as Operation, ["200"]],
  ];
  for (const [name, op, answers] of ops) {
    const prefer = op.parameters?.find((p) => p.name === "Prefer" && p.in === "header");
    assert.ok(prefer, `${name}: the Prefer header`);
    assert.match(prefer.description ?? "", /wait=N/, name);
    assert.match(prefer.description ?? "", /\b60\b/, `${name}: the 60 s maximum`);
    assert.equal(prefer.example, "wait=10", name);
    for (const status of answers) {
      const applied = op.responses[status].headers?.["Preference-Applied"];
      assert.ok(applied, `${name} ${status}: Preference-Applied`);
      assert.ok(new RegExp(applied.schema.pattern!).test("wait=60"), `${name} ${status}`);
      assert.ok(!new RegExp(applied.schema.pattern!).test("wait=ten"), `${name} ${status}`);
    }
    const busy = op.responses["503"];
    assert.match(busy.description, /`busy`/, `${name}: 503 busy`);
    assert.match(busy.description, /RUN_WATCHERS_MAX/, name);
    assert.ok(busy.headers?.["Retry-After"], `${name}: 503 with Retry-After`);
  }
  // The replay answer keeps its own headers beside the new one.
  const replay = (doc.paths["/v1/runs"].post as Operation).responses["200"].headers!;
  assert.ok(replay["Idempotent-Replayed"], "200 still says Idempotent-Replayed");
});

Deno.test("openapi: a run's events are documented as JSON and as text/event-stream", async () => {
  const doc = await served();
  const op = doc.paths["/v1/runs/{run_id}/events"].get as Operation;
  const ok = op.responses["200"];
  assert.deepEqual(Object.keys(ok.content), ["application/json", "text/event-stream"]);
  assert.deepEqual(ok.content["application/json"].schema, {
    $ref: "#/components/schemas/RunEvents",
  });
  const stream = ok.content["text/event-stream"];
  assert.equal(stream.schema.type, "string");
  const format = String(stream.schema.description);
  for (const part of ["id: <seq>", "event: <type>", "data:", "retry: 2000", ": keep-alive"]) {
    assert.ok(format.includes(part), `the event format names ${part}: ${format}`);
  }
  assert.match(stream.example ?? "", /^retry: 2000\n\nid: 1\nevent: run\.admitted\ndata: \{/);
  const resume = op.parameters?.find((p) => p.name === "Last-Event-ID" && p.in === "header");
  assert.ok(resume, "the Last-Event-ID header");
  assert.match(resume.description ?? "", /seq/);
  assert.match(op.description ?? "", /Accept: text\/event-stream/);
  assert.match(op.responses["503"].description, /`busy`/);
  assert.ok(op.responses["503"].headers?.["Retry-After"], "503 with Retry-After");
});

Deno.test("openapi: Idempotency-Key is documented on admitting, beside the body's dispatch_key", async () => {
  const doc = await served();
  const op = doc.paths["/v1/runs"].post as Operation;
  const key = op.parameters?.find((p) => p.name === "Idempotency-Key" && p.in === "header") as
    | { description?: string; schema: { type?: string }; required: boolean }
    | undefined;
  assert.ok(key, "the Idempotency-Key header");
  assert.equal(key.required, false);
  assert.equal(key.schema.type, "string");
  assert.match(key.description ?? "", /sf-string/);
  assert.match(key.description ?? "", /header\.Idempotency-Key/);
  assert.match(op.responses["200"].description, /dispatch key was seen/);
});

Deno.test("openapi: POST /v1/runs documents the quota 429s with an integer Retry-After", async () => {
  const doc = await served();
  const op = doc.paths["/v1/runs"].post as Operation;
  const tooMany = op.responses["429"];
  assert.ok(tooMany, "a 429 answer");
  assert.match(tooMany.description, /`queue-full`/);
  assert.match(tooMany.description, /`rate-limited`/);
  assert.deepEqual(Object.keys(tooMany.content), ["application/problem+json"]);
  const retryAfter = tooMany.headers?.["Retry-After"];
  assert.ok(retryAfter, "429 with Retry-After");
  const schema = retryAfter.schema as { type?: string; minimum?: number };
  assert.equal(schema.type, "integer");
  assert.equal(schema.minimum, 1);
  assert.equal((doc.paths["/v1/runs"].get as Operation).responses["429"], undefined);
});

Deno.test("openapi: GET /v1/runs documents fields as one comma-separated value, and the page's byte bound", async () => {
  const doc = await served();
  const list = doc.paths["/v1/runs"].get as Operation;
  const fields = list.parameters?.find((p) => p.name === "fields") as unknown as {
    in: string;
    style: string;
    explode: boolean;
    schema: { type: string; items: { enum: string[] } };
  };
  assert.equal(fields.in, "query");
  // Exploded (`fields=input&fields=result`) would be a parameter given twice: refused.
  assert.equal(fields.style, "form");
  assert.equal(fields.explode, false);
  assert.equal(fields.schema.type, "array");
  assert.deepEqual(fields.schema.items.enum, ["input", "result"]);
  assert.match(list.description ?? "", /1 MiB/);
  const run = doc.components.schemas.Run as {
    required: string[];
    properties: Record<string, { description?: string }>;
  };
  assert.ok(!run.required.includes("result") && !run.required.includes("input"));
  assert.match(run.properties.result.description ?? "", /fields=result/);
});
