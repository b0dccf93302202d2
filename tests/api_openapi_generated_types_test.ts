/**
 * /openapi.json as a user's generator reads it: openapi-typescript (the
 * mainstream TypeScript generator) turns the served document into types,
 * and a small client program that admits, replays, lists and reads runs
 * with them must type-check, including lines that must not (so types that
 * degrade to `any` or to strings fail the test).
 */
import assert from "node:assert/strict";
import client from "prom-client";
import openapiTS, { astToString } from "openapi-typescript";
import { createApp } from "../api/app.ts";
import { createApiMetrics } from "../api/metrics.ts";
import { silentLogger } from "../core/log.ts";

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

type Doc = { paths: Record<string, Record<string, { parameters?: Param[] }>> };
type Param = { name: string; in: string; schema: Record<string, unknown> };

async function served(): Promise<Doc> {
  const res = await app.request("/openapi.json");
  assert.equal(res.status, 200);
  return await res.json();
}

/** What a user of the API would write with the generated `paths` (type-checked, never run). */
const PROGRAM = `import type { paths } from "./api.ts";

type Admit = paths["/v1/runs"]["post"];
type AdmitBody = Admit["requestBody"]["content"]["application/json"];
type AdmitHeaders = NonNullable<Admit["parameters"]["header"]>;
type Created = Admit["responses"][201]["content"]["application/json"];
type Replayed = Admit["responses"][200];
type Invalid = Admit["responses"][422]["content"]["application/problem+json"];
type List = paths["/v1/runs"]["get"];
type ListQuery = NonNullable<List["parameters"]["query"]>;
type Page = List["responses"][200]["content"]["application/json"];
type ReadRun = paths["/v1/runs/{run_id}"]["get"];
type OneRun = ReadRun["responses"][200]["content"]["application/json"];

const BASE = "http://localhost:8080";
const auth = { authorization: "Bearer t", "content-type": "application/json" };

export async function admit(body: AdmitBody, headers: AdmitHeaders): Promise<Created> {
  const res = await fetch(\`\${BASE}/v1/runs\`, {
    method: "POST",
    headers: { ...auth, ...headers },
    body: JSON.stringify(body),
  });
  if (res.status === 422) {
    const problem: Invalid = await res.json();
    const paths: string[] = (problem.errors ?? []).map((e) => e.path);
    throw new Error(paths.join(", "));
  }
  return await res.json();
}

export async function list(query: ListQuery): Promise<Page> {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined) params.set(name, String(value));
  }
  return await (await fetch(\`\${BASE}/v1/runs?\${params}\`, { headers: auth })).json();
}

export async function read(runId: ReadRun["parameters"]["path"]["run_id"]): Promise<OneRun> {
  return await (await fetch(\`\${BASE}/v1/runs/\${runId}\`, { headers: auth })).json();
}

export async function demo(): Promise<void> {
  const body: AdmitBody = { workflow_ref: "echo", input: { n: 1 }, goal_id: null };
  const run = await admit(body, { "Idempotency-Key": "order-42", Prefer: "wait=10" });
  const again = await admit({ ...body, dispatch_key: "order-42" }, {});
  const replayed: "true" | undefined = ({} as Replayed["headers"])["Idempotent-Replayed"];
  const key: string | undefined = ({} as AdmitHeaders)["Idempotency-Key"];
  const id: string = run.run_id;
  const version: number = again.workflow_version;
  const status: "queued" | "running" | "waiting" | "succeeded" | "failed" | "cancelled" =
    run.status;

  const page = await list({ limit: 50, status: "succeeded", goal_id: "g1" });
  const next: string | null = page.next_cursor;
  const more = next === null ? undefined : await list({ limit: 500, cursor: next });
  const ids: string[] = page.runs.map((r) => r.run_id);
  // One comma-separated value (explode: false): String(["input", "result"]) is "input,result".
  const withValues = await list({ fields: ["input", "result"] });
  const results: unknown[] = withValues.runs.map((r) => r.result);

  const one = await read(ids[0] ?? id);
  const waits:
    | "worker"
    | "schedule"
    | "concurrency"
    | "slot"
    | "sleep"
    | "signal"
    | "children"
    | undefined = one.waiting_for?.reason;
  const attempts: number = one.attempts;
  void [replayed, key, version, status, more, waits, attempts, results];

  // What the API refuses must not type-check either: each line below is an error.
  // @ts-expect-error limit is a number, not text
  await list({ limit: "50" });
  // @ts-expect-error no such status
  await list({ status: "done" });
  // @ts-expect-error a list adds only input and result
  await list({ fields: ["secret"] });
  // @ts-expect-error workflow_ref is required
  await admit({ input: 1 }, {});
  // @ts-expect-error a run's status is one of five
  const wrong: Created["status"] = "pending";
  // @ts-expect-error attempts is a number
  const text: string = one.attempts;
  void [wrong, text];
}
`;

/** Generates `api.ts` from `doc` into a temp dir beside PROGRAM and runs `deno check` there. */
async function checkAgainst(doc: unknown): Promise<{ code: number; output: string }> {
  const types = astToString(await openapiTS(structuredClone(doc) as never));
  const dir = await Deno.makeTempDir({ prefix: "poimen_openapi_types_" });
  try {
    await Deno.writeTextFile(`${dir}/api.ts`, types);
    await Deno.writeTextFile(`${dir}/program.ts`, PROGRAM);
    // No config and no lock: the program is checked as a user's own would be, with Deno's
    // default (strict) compiler options, importing nothing but the generated file.
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["check", "--no-config", "--no-lock", "--quiet", "program.ts"],
      cwd: dir,
      env: { NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const decode = (b: Uint8Array) => new TextDecoder().decode(b);
    return { code: out.code, output: decode(out.stdout) + decode(out.stderr) };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

function listParam(doc: Doc, name: string): Param {
  const param = doc.paths["/v1/runs"].get.parameters?.find((p) => p.name === name);
  assert.ok(param, `GET /v1/runs has ${name}`);
  return param;
}

Deno.test("openapi generated types: query parameters are typed as what a client passes", async () => {
  const doc = await served();
  assert.deepEqual(listParam(doc, "limit").schema, {
    type: "integer",
    minimum: 1,
    maximum: 500,
    default: 50,
  });
  for (const name of ["goal_id", "dispatch_key", "cursor"]) {
    assert.equal(listParam(doc, name).schema.type, "string", name);
  }
  assert.deepEqual(listParam(doc, "status").schema.enum, [
    "queued",
    "running",
    "waiting",
    "succeeded",
    "failed",
    "cancelled",
  ]);
});

Deno.test("openapi generated types: a client program type-checks with openapi-typescript's types", async () => {
  const doc = await served();
  const good = await checkAgainst(doc);
  assert.equal(good.code, 0, good.output);

  // The same program must fail against degraded documents: so it could fail above.
  const limitAsText = structuredClone(doc);
  listParam(limitAsText, "limit").schema = { type: "string", pattern: "^[0-9]{1,3}$" };
  const anyBody = structuredClone(doc) as Doc & {
    components: { schemas: Record<string, unknown> };
  };
  anyBody.components.schemas.Run = {};
  anyBody.components.schemas.RunRequest = {};
  const [text, untyped] = await Promise.all([checkAgainst(limitAsText), checkAgainst(anyBody)]);
  assert.notEqual(text.code, 0, "limit typed as a string type-checks");
  assert.match(text.output, /Unused '@ts-expect-error' directive/);
  assert.notEqual(untyped.code, 0, "untyped runs type-check");
  assert.match(untyped.output, /Unused '@ts-expect-error' directive/);
});
