/**
 * Property-based tests of the API's door, in process on a real Postgres:
 * generated bodies (hostile strings, huge and non-finite numbers, deep
 * nesting, big strings, invalid UTF-8), headers (content types,
 * authorization garbage, a service token's Poimen-Tenant / Poimen-Source)
 * and query strings against every endpoint. Whatever a client sends: never
 * a 5xx; every 4xx is problem+json with a known type; a refusal changes no
 * row; an admitted run gives its input back exactly.
 *
 * Beside these hand-written properties, one generated from /openapi.json
 * itself (tests/support/openapi_fuzz.ts): every operation, every path,
 * query and header parameter and every body field from its schema, valid or
 * hostile (huge and negative numbers, timestamps Postgres cannot hold, NUL,
 * lone surrogates, long strings, wrong types), parameters repeated or
 * unknown; every 5xx it meets is listed.
 *
 * Seeded: `FUZZ_SEED=<n>` replays a run (the seed is printed on failure),
 * `FUZZ_RUNS=<n>` sets the runs per property (default 300),
 * `FUZZ_OPENAPI_RUNS=<n>` per operation of the generated one (default 150,
 * four times that with a body).
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import client from "prom-client";
import { freshDatabase, type TestDatabase } from "./support/db.ts";
import { silentLogger } from "../core/log.ts";
import { ERRORS, PROBLEM_BASE } from "../core/errors.ts";
import { Admission } from "../admission/admit.ts";
import { catalogOf } from "./support/catalog.ts";
import { createApp } from "../api/app.ts";
import { Authenticator } from "../api/auth.ts";
import { hashToken, newToken } from "../contracts/tokens.ts";
import { createApiMetrics } from "../api/metrics.ts";
import { loadConsoleAssets } from "../api/console/assets.ts";
import { encodeCursor } from "../api/run_list.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import type { Sql } from "../db/pool.ts";
import { operationsOf, requests } from "./support/openapi_fuzz.ts";

// A fixed default keeps CI deterministic; explore with FUZZ_SEED=$RANDOM.
const SEED = Number(Deno.env.get("FUZZ_SEED") ?? 20261129);
const RUNS = Number(Deno.env.get("FUZZ_RUNS") ?? 300);
// Per operation of the OpenAPI fuzz: every operation, so fewer each.
const OPENAPI_RUNS = Number(Deno.env.get("FUZZ_OPENAPI_RUNS") ?? 150);
const BODY_LIMIT = 256 * 1024;
const KNOWN_TYPES = new Set(Object.keys(ERRORS).map((code) => PROBLEM_BASE + code));

let db: TestDatabase;
let sql: Sql;
let app: ReturnType<typeof createApp>;
const tokens: Record<"acme" | "globex" | "relay", string> = { acme: "", globex: "", relay: "" };

async function setUp() {
  db = await freshDatabase();
  sql = db.sql;
  app = createApp({
    sql,
    admission: new Admission(sql, catalogOf(), { maxBatch: 64, maxConcurrent: 4 }),
    auth: new Authenticator(sql, 30_000),
    metrics: createApiMetrics(new client.Registry()),
    log: silentLogger,
    bodyLimit: BODY_LIMIT,
    consoleAssets: loadConsoleAssets(),
  });
  for (const name of ["acme", "globex"] as const) {
    tokens[name] = newToken();
    await insertTenant(sql, name);
    await insertToken(sql, await hashToken(tokens[name]), {
      kind: "tenant",
      tenant_id: name,
      name,
    });
  }
  tokens.relay = newToken();
  await insertToken(sql, await hashToken(tokens.relay), {
    kind: "service",
    tenant_id: null,
    name: "relay",
  });
}

async function counts(): Promise<{ runs: number; events: number }> {
  const [r] = await sql<{ runs: number; events: number }[]>`
    select (select count(*)::int from runs) as runs,
           (select count(*)::int from work_events) as events`;
  return r;
}

// ---------------------------------------------------------------- generators

/** Absent mostly (8 in 10), else `arb`. */
function rarely<T>(arb: fc.Arbitrary<T>): fc.Arbitrary<T | undefined> {
  return fc.oneof({ weight: 4, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: arb });
}

/** Strings a hostile or unlucky client sends. */
const HOSTILE_STRINGS = [
  "",
  "\u0000",
  "a\u0000b",
  "\ud800",
  "\udc00",
  "x\ud83d",
  "\ude00y",
  "\ud83d\ude00",
  "\u2028\u2029",
  "\ufeff",
  "\uffff",
  "\u0301e",
  "\u202e",
  "%00",
  "\\u0000",
  "\r\n",
  "\t",
  "\u007f",
  "\u0085",
  "null",
  "__proto__",
  "constructor",
  "'; drop table runs; --",
  "$1",
];

const hostileString = fc.oneof(
  { weight: 3, arbitrary: fc.string({ unit: "binary", maxLength: 20 }) },
  { weight: 3, arbitrary: fc.constantFrom(...HOSTILE_STRINGS) },
  { weight: 2, arbitrary: fc.string({ maxLength: 20 }) },
  {
    weight: 1,
    arbitrary: fc.tuple(fc.constantFrom("x", "é", "💩", "\u0000"), fc.nat(120_000))
      .map(([c, n]) => c.repeat(Math.floor(n / c.length))),
  },
);

/**
 * A JSON text node: written by `write`, so that it can hold what
 * `JSON.stringify` cannot write (`1e400`) or would write differently.
 */
type Tree =
  | { t: "num"; text: string }
  | { t: "str"; value: string }
  | { t: "lit"; text: "true" | "false" | "null" }
  | { t: "arr"; items: Tree[] }
  | { t: "obj"; entries: [string, Tree][] }
  | { t: "deep"; depth: number; open: "[" | '{"k":'; inner: Tree };

/** Number texts JSON.parse reads as finite doubles, some at the edges. */
const FINE_NUMBERS = [
  "1.7976931348623157e308",
  "-1.7976931348623157e308",
  "5e-324",
  "1e-400",
  "-0",
  "0.1",
  "123456789012345678901234567890",
  "1e20",
  "1E+2",
];
/** Number texts JSON.parse reads as ±Infinity. */
const OVERFLOWING_NUMBERS = ["1e400", "-1e400", "1E+309", "1.7976931348623159e308", "1e999"];

function numberText(n: number): string {
  if (Number.isNaN(n)) return "1e999";
  if (n === Infinity) return "1e400";
  if (n === -Infinity) return "-1e400";
  return Object.is(n, -0) ? "-0" : JSON.stringify(n);
}

/** JSON texts of arbitrary shape from the given strings, numbers and deep nestings. */
function treeOf(
  strings: fc.Arbitrary<string>,
  numbers: fc.Arbitrary<string>,
  deep: fc.Arbitrary<number>,
): fc.Arbitrary<Tree> {
  return fc.letrec<{ tree: Tree }>((tie) => ({
    tree: fc.oneof(
      { depthSize: "small", withCrossShrink: true },
      { weight: 3, arbitrary: numbers.map((text) => ({ t: "num" as const, text })) },
      { weight: 3, arbitrary: strings.map((value) => ({ t: "str" as const, value })) },
      {
        weight: 1,
        arbitrary: fc.constantFrom("true", "false", "null").map((text) =>
          ({ t: "lit" as const, text }) as Tree
        ),
      },
      {
        weight: 2,
        arbitrary: fc.array(tie("tree"), { maxLength: 5 }).map((items) => ({
          t: "arr" as const,
          items,
        })),
      },
      {
        weight: 2,
        arbitrary: fc.array(fc.tuple(strings, tie("tree")), { maxLength: 5 }).map((entries) => ({
          t: "obj" as const,
          entries,
        })),
      },
      {
        weight: 1,
        arbitrary: fc.record({
          t: fc.constant("deep" as const),
          depth: deep,
          open: fc.constantFrom("[" as const, '{"k":' as const),
          inner: tie("tree"),
        }),
      },
    ),
  })).tree;
}

/** Strings poimen must store and give back exactly: any well-formed Unicode without NUL. */
const fineString = fc.oneof(
  fc.string({ unit: "binary", maxLength: 20 }),
  fc.constantFrom(...HOSTILE_STRINGS),
  fc.string({ unit: "grapheme", maxLength: 10 }),
).map((s) => s.replaceAll("\u0000", "").toWellFormed());

/** Any JSON text, hostile ones included (mostly fine parts, so that some trees are fine). */
const tree: fc.Arbitrary<Tree> = treeOf(
  fc.oneof({ weight: 4, arbitrary: fineString }, { weight: 1, arbitrary: hostileString }),
  fc.oneof(
    { weight: 3, arbitrary: fc.double().map(numberText) },
    { weight: 1, arbitrary: fc.integer().map(String) },
    { weight: 2, arbitrary: fc.constantFrom(...FINE_NUMBERS, ...OVERFLOWING_NUMBERS) },
  ),
  fc.oneof(fc.integer({ min: 1, max: 70 }), fc.constantFrom(1_000, 100_000)),
);

/** JSON texts poimen must admit: finite numbers, fine strings, at most 64 levels deep. */
const fineTree = treeOf(
  fineString,
  fc.oneof(
    fc.double({ noNaN: true, noDefaultInfinity: true }).map(numberText),
    fc.constantFrom(...FINE_NUMBERS),
  ),
  fc.integer({ min: 1, max: 40 }),
);

/** A fine JSON text, sometimes nested to exactly the documented limit of 64 levels. */
const fineInput = fc.tuple(fineTree, fc.boolean()).map(([t, toLimit]): Tree => {
  const d = depthOf(t);
  if (d > 64) return { t: "lit", text: "null" };
  return toLimit && d < 64 ? { t: "deep", depth: 64 - d, open: "[", inner: t } : t;
});

function depthOf(node: Tree): number {
  switch (node.t) {
    case "arr":
      return 1 + Math.max(0, ...node.items.map(depthOf));
    case "obj":
      return 1 + Math.max(0, ...node.entries.map(([, v]) => depthOf(v)));
    case "deep":
      return node.depth + depthOf(node.inner);
    default:
      return 0;
  }
}

// JSON.stringify writes a lone surrogate as an escape (`"\ud800"`) and NUL
// as `\u0000`: both reach the server as JSON escapes, as from any client.
function write(node: Tree): string {
  switch (node.t) {
    case "num":
    case "lit":
      return node.text;
    case "str":
      return JSON.stringify(node.value);
    case "arr":
      return `[${node.items.map(write).join(",")}]`;
    case "obj":
      return `{${node.entries.map(([k, v]) => `${JSON.stringify(k)}:${write(v)}`).join(",")}}`;
    case "deep":
      return node.open.repeat(node.depth) + write(node.inner) +
        (node.open === "[" ? "]" : "}").repeat(node.depth);
  }
}

/** A `POST /v1/runs` body: mostly shaped like a request, sometimes anything at all. */
const body: fc.Arbitrary<BodyInit | undefined> = fc.oneof(
  {
    weight: 8,
    arbitrary: fc.record({
      workflow_ref: fc.oneof(
        { weight: 6, arbitrary: fc.constant("echo") },
        { weight: 2, arbitrary: fc.constantFrom("echo@1", "sleep", "fail@1", "nope", "ECHO", "") },
        { weight: 1, arbitrary: hostileString },
      ),
      input: fc.option(tree, { nil: undefined, freq: 10 }),
      goal_id: rarely(fc.oneof(fc.constantFrom("g1", "g2"), hostileString)),
      // A few keys, so that replays (200) happen too.
      dispatch_key: rarely(fc.oneof(fc.constantFrom("k1", "k2", "k3"), hostileString)),
      extra: rarely(fc.tuple(hostileString, tree)),
      // Ways a text goes wrong after it was written.
      mangle: fc.oneof(
        { weight: 12, arbitrary: fc.constant("none") },
        { weight: 1, arbitrary: fc.constantFrom("bom", "truncate", "trailing", "dup") },
      ),
    }).map((r) => {
      const fields: string[] = [`"workflow_ref":${JSON.stringify(r.workflow_ref)}`];
      if (r.input) fields.push(`"input":${write(r.input)}`);
      if (r.goal_id !== undefined) fields.push(`"goal_id":${JSON.stringify(r.goal_id)}`);
      if (r.dispatch_key !== undefined) {
        fields.push(`"dispatch_key":${JSON.stringify(r.dispatch_key)}`);
      }
      if (r.extra) fields.push(`${JSON.stringify(r.extra[0])}:${write(r.extra[1])}`);
      if (r.mangle === "dup") fields.push(`"workflow_ref":"echo"`);
      const text = `{${fields.join(",")}}`;
      switch (r.mangle) {
        case "bom":
          return "\ufeff" + text;
        case "truncate":
          return text.slice(0, text.length - 1);
        case "trailing":
          return text + " x";
        default:
          return text;
      }
    }),
  },
  { weight: 1, arbitrary: tree.map(write) },
  { weight: 1, arbitrary: fc.string({ unit: "binary", maxLength: 50 }) },
  { weight: 1, arbitrary: fc.uint8Array({ maxLength: 50 }) },
  { weight: 1, arbitrary: fc.constant(undefined) },
);

// A header value the Fetch API lets through (Latin-1 bytes, no NUL/CR/LF).
const headerValue = fc.string({
  unit: fc.integer({ min: 0x09, max: 0xff }).map((c) => String.fromCharCode(c)),
  maxLength: 40,
})
  .filter((v) => !/[\r\n]/.test(v));

const FINE_CONTENT_TYPES = [
  "application/json",
  "application/json; charset=utf-8",
  'Application/JSON;Charset="UTF-8"',
  "application/problem+json",
  "application/vnd.api+json",
];

type Caller = "acme" | "globex" | "relay" | "none" | "garbage" | "unknown";

/** Headers: a caller, a content type, and for a service token its tenant and source. */
const headers = fc.record({
  caller: fc.oneof(
    { weight: 10, arbitrary: fc.constantFrom<Caller>("acme", "relay", "globex") },
    { weight: 1, arbitrary: fc.constantFrom<Caller>("none", "garbage", "unknown") },
  ),
  garbage: headerValue,
  contentType: fc.oneof(
    { weight: 12, arbitrary: fc.constantFrom(...FINE_CONTENT_TYPES) },
    {
      weight: 2,
      arbitrary: fc.constantFrom(
        "text/plain",
        "application/json; charset=latin1",
        "application/jsonx",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "",
        "application/json, text/plain",
      ),
    },
    { weight: 1, arbitrary: headerValue },
  ),
  // Mostly what a well-behaved caller sends ("auto": a service token names
  // a tenant, a tenant token names none), so that requests get past the door.
  tenant: fc.oneof(
    { weight: 8, arbitrary: fc.constant<string | undefined>("auto") },
    { weight: 1, arbitrary: fc.constant(undefined) },
    { weight: 1, arbitrary: fc.constantFrom("acme", "globex", "nobody", "ACME", " acme") },
    { weight: 1, arbitrary: headerValue },
  ),
  source: fc.oneof(
    { weight: 6, arbitrary: fc.constant<string | undefined>(undefined) },
    { weight: 3, arbitrary: fc.constant("kafka:poimen.acme.dispatch/0/7") },
    { weight: 1, arbitrary: headerValue },
    { weight: 1, arbitrary: fc.constant("x".repeat(400)) },
  ),
}).filter((h) => validHeaders(h));

type GenHeaders = {
  caller: Caller;
  garbage: string;
  contentType: string;
  tenant?: string;
  source?: string;
};

function toHeaders(h: GenHeaders): Record<string, string> {
  const out: Record<string, string> = {};
  if (h.caller === "garbage") out.authorization = h.garbage;
  else if (h.caller === "unknown") out.authorization = `Bearer ${newTokenLike(h.garbage)}`;
  else if (h.caller !== "none") out.authorization = `Bearer ${tokens[h.caller]}`;
  out["content-type"] = h.contentType;
  if (h.tenant === "auto") {
    if (h.caller === "relay") out["poimen-tenant"] = "globex";
  } else if (h.tenant !== undefined) out["poimen-tenant"] = h.tenant;
  if (h.source !== undefined) out["poimen-source"] = h.source;
  return out;
}

function newTokenLike(garbage: string): string {
  return `pmn_${garbage.replaceAll(/\s/g, "")}`;
}

function validHeaders(h: GenHeaders): boolean {
  try {
    new Headers(toHeaders(h));
    return true;
  } catch {
    return false;
  }
}

// Short: a query string has no body limit to hit, only hostile characters.
const queryString = fc.oneof(
  fc.constantFrom(...HOSTILE_STRINGS),
  fc.string({ unit: "binary", maxLength: 10 }),
);

const encoding = fc.oneof(
  { weight: 6, arbitrary: fc.constant("encode") },
  { weight: 1, arbitrary: fc.constantFrom("raw", "percent-garbage") },
);

/** One query parameter: a known or odd name, a plausible or hostile value, well or badly encoded. */
const queryPart = fc.oneof(
  {
    weight: 3,
    arbitrary: fc.tuple(
      fc.constantFrom("goal_id", "dispatch_key"),
      fc.oneof(fc.constantFrom("g1", "k1"), queryString),
    ),
  },
  {
    weight: 1,
    arbitrary: fc.tuple(
      fc.constant("status"),
      fc.oneof(fc.constantFrom("queued", "running", "succeeded", "failed"), queryString),
    ),
  },
  {
    weight: 1,
    arbitrary: fc.tuple(
      fc.constant("limit"),
      fc.oneof(
        fc.integer({ min: -5, max: 600 }).map(String),
        fc.constantFrom("1e2", "0x10", " 5", "", "007"),
        queryString,
      ),
    ),
  },
  {
    weight: 1,
    arbitrary: fc.tuple(
      fc.constant("cursor"),
      fc.oneof(fc.constantFrom("MDFh", "AAAA", "!!!!"), fc.base64String(), queryString),
    ),
  },
  { weight: 1, arbitrary: fc.tuple(queryString, queryString) },
).chain(([name, value]) =>
  encoding.map((how) => `${encodePart(name, "encode")}=${encodePart(value, how)}`)
);

function encodePart(s: string, how: string): string {
  if (how === "percent-garbage") {
    return ["%", "%Z1", "%ED%A0%80", "%C0%80", "%FF", "%00", "+%2B+"][s.length % 7];
  }
  if (how === "raw") return [...s].filter((c) => /[A-Za-z0-9._~%+-]/.test(c)).join("");
  try {
    return encodeURIComponent(s);
  } catch {
    return "%ED%A0%80"; // a lone surrogate has no UTF-8: sent as its would-be bytes
  }
}

const query = fc.array(queryPart, { maxLength: 3 }).map((parts) =>
  parts.length ? `?${parts.join("&")}` : ""
);

// ---------------------------------------------------------------- properties

/** Asserts the answer is no 5xx, and a 4xx is problem+json of a known type. */
async function checkAnswer(r: Response, method = "GET"): Promise<unknown> {
  assert.ok(r.status < 500, `answered ${r.status}: ${await r.clone().text()}`);
  if (method === "HEAD") return undefined;
  if (r.status >= 400) {
    assert.equal(r.headers.get("content-type"), "application/problem+json");
    const problem = await r.json();
    assert.ok(KNOWN_TYPES.has(problem.type), `unknown problem type ${problem.type}`);
    assert.equal(problem.status, r.status);
    assert.equal(typeof problem.retryable, "boolean");
    return problem;
  }
  const type = r.headers.get("content-type") ?? "";
  return type.startsWith("application/json") ? await r.json() : await r.text();
}

// -0 reads back as 0 (JSON has one zero); everything else exactly.
function normalize(v: unknown): unknown {
  if (typeof v === "number") return Object.is(v, -0) ? 0 : v;
  if (Array.isArray(v)) return v.map(normalize);
  if (v !== null && typeof v === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) {
      Object.defineProperty(out, k, { value: normalize(x), enumerable: true });
    }
    return out;
  }
  return v;
}

// The tenant a successful request acted for (Headers strip a value's outer
// spaces and tabs, as HTTP does).
function tenantOf(h: GenHeaders): string {
  if (h.caller !== "relay") return h.caller;
  return h.tenant === "auto" ? "globex" : h.tenant!.replace(/^[\t ]+|[\t ]+$/g, "");
}

async function check<T>(property: fc.IAsyncProperty<T>) {
  try {
    await fc.assert(property, { seed: SEED, numRuns: RUNS });
  } catch (err) {
    throw new Error(`FUZZ_SEED=${SEED} reproduces this failure\n${(err as Error).message}`);
  }
}

const CASES: [string, () => Promise<void>][] = [];

CASES.push([
  "POST /v1/runs: never a 5xx, a refusal writes nothing, an admission reads back",
  () =>
    check(
      fc.asyncProperty(body, headers, query, async (b, h, q) => {
        const before = await counts();
        const r = await app.request(`/v1/runs${q}`, {
          method: "POST",
          body: b,
          headers: toHeaders(h),
        });
        const answer = await checkAnswer(r, "POST");
        if (r.status >= 400) {
          assert.deepEqual(await counts(), before, "a refused request changed rows");
          return;
        }
        if (r.status === 207) {
          // A batch: every item answered, and rows for the created ones only.
          const text = typeof b === "string" ? b : new TextDecoder().decode(b as Uint8Array);
          const items = JSON.parse(text.replace(/^\ufeff/, "")) as unknown[];
          const { results } = answer as { results: { outcome: string; status: number }[] };
          assert.equal(results.length, items.length);
          assert.ok(results.every((x) => x.status < 500), JSON.stringify(results));
          const created = results.filter((x) => x.outcome === "created").length;
          assert.deepEqual(await counts(), {
            runs: before.runs + created,
            events: before.events + created,
          });
          return;
        }
        assert.ok(r.status === 201 || r.status === 200, `answered ${r.status}`);
        if (r.status !== 201) return;
        const run = answer as { run_id: string; tenant_id: string };
        assert.equal(run.tenant_id, tenantOf(h));
        const got = await app.request(`/v1/runs/${run.run_id}`, { headers: toHeaders(h) });
        assert.equal(got.status, 200);
        // As the server reads it: UTF-8, a leading byte order mark dropped.
        const text = typeof b === "string" ? b : new TextDecoder().decode(b as Uint8Array);
        const sent = JSON.parse(text.replace(/^\ufeff/, "")) as { input?: unknown };
        assert.deepEqual(normalize((await got.json()).input), normalize(sent.input ?? null));
      }),
    ),
]);

CASES.push([
  "POST /v1/runs: every well-formed request is admitted and reads back exactly",
  () =>
    check(
      fc.asyncProperty(
        fineInput,
        fc.option(fineString.filter((s) => /^[^\p{Cc}\p{Cs}]{1,255}$/u.test(s)), {
          nil: undefined,
        }),
        fc.boolean(),
        fc.constantFrom(...FINE_CONTENT_TYPES),
        fc.constantFrom<Caller>("acme", "relay"),
        async (input, goalId, keyed, contentType, caller) => {
          const text = JSON.stringify({
            workflow_ref: "echo",
            goal_id: goalId,
            dispatch_key: keyed ? crypto.randomUUID() : undefined,
          }).slice(0, -1) + `,"input":${write(input)}}`;
          const h = toHeaders({ caller, garbage: "", contentType, tenant: "auto" });
          const r = await app.request("/v1/runs", { method: "POST", body: text, headers: h });
          const run = await checkAnswer(r, "POST") as { run_id: string; goal_id: string | null };
          assert.equal(r.status, 201, JSON.stringify(run));
          assert.equal(run.goal_id, goalId ?? null);
          const got = await app.request(`/v1/runs/${run.run_id}`, { headers: h });
          assert.deepEqual(normalize((await got.json()).input), normalize(JSON.parse(text).input));
        },
      ),
    ),
]);

CASES.push([
  "GET /v1/runs: never a 5xx, never another tenant's run, never a changed row",
  () =>
    check(
      fc.asyncProperty(headers, query, async (h, q) => {
        const before = await counts();
        const r = await app.request(`/v1/runs${q}`, { headers: toHeaders(h) });
        const answer = await checkAnswer(r);
        assert.deepEqual(await counts(), before);
        if (r.status === 200) {
          const page = answer as { runs: { tenant_id: string }[] };
          assert.ok(page.runs.every((run) => run.tenant_id === tenantOf(h)));
        }
      }),
    ),
]);

CASES.push(["GET /v1/runs/{id}: never a 5xx, another tenant's run is a 404", async () => {
  // A run of each tenant, so that ids that exist are among the generated ones.
  const ids: string[] = [];
  for (const t of ["acme", "globex"] as const) {
    const r = await app.request("/v1/runs", {
      method: "POST",
      body: '{"workflow_ref":"echo","input":1}',
      headers: { authorization: `Bearer ${tokens[t]}`, "content-type": "application/json" },
    });
    ids.push((await r.json()).run_id);
  }
  const id = fc.oneof(
    fc.constantFrom(...ids),
    fc.uuid(),
    hostileString.map((s) => encodePart(s, "encode")),
    hostileString.map((s) => encodePart(s, "percent-garbage")),
    fc.constantFrom("", "..", "%2F", "a/b", "x".repeat(5000)),
  );
  await check(
    fc.asyncProperty(id, headers, query, async (runId, h, q) => {
      const before = await counts();
      const r = await app.request(`/v1/runs/${runId}${q}`, { headers: toHeaders(h) });
      const answer = await checkAnswer(r);
      assert.deepEqual(await counts(), before);
      if (r.status === 200 && runId !== "") {
        assert.equal((answer as { tenant_id: string }).tenant_id, tenantOf(h));
      }
    }),
  );
}]);

CASES.push([
  "health, metrics and OpenAPI: never a 5xx whatever the method, query or headers",
  () =>
    check(
      fc.asyncProperty(
        fc.constantFrom("/healthz", "/readyz", "/metrics", "/openapi.json", "/", "/v1", "/v2/runs"),
        fc.constantFrom("GET", "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"),
        headers,
        query,
        fc.option(body, { nil: undefined }),
        async (path, method, h, q, b) => {
          const before = await counts();
          const r = await app.request(`${path}${q}`, {
            method,
            headers: toHeaders(h),
            body: method === "GET" || method === "HEAD" ? undefined : b,
          });
          await checkAnswer(r, method);
          assert.deepEqual(await counts(), before);
          if (
            method === "GET" && ["/healthz", "/readyz", "/metrics", "/openapi.json"].includes(path)
          ) {
            assert.equal(r.status, 200, `${path} answered ${r.status}`);
          }
        },
      ),
    ),
]);

CASES.push([
  "every operation of /openapi.json, every parameter and body from its schema plus hostile values: never a 5xx",
  async () => {
    const doc = await (await app.request("/openapi.json")).json();
    const ops = operationsOf(doc);
    assert.ok(ops.length >= 9, `${ops.length} operations`);
    // Runs of both tenants, so that path parameters name runs that exist (a cancel finds one).
    const admitSome = async () => {
      const ids: string[] = [];
      for (const t of ["acme", "globex"] as const) {
        for (let i = 0; i < 3; i++) {
          const r = await app.request("/v1/runs", {
            method: "POST",
            body: JSON.stringify({ workflow_ref: "echo", input: { i } }),
            headers: { authorization: `Bearer ${tokens[t]}`, "content-type": "application/json" },
          });
          ids.push((await r.json()).run_id);
        }
      }
      return ids;
    };
    const ids = await admitSome();
    // Schedules of both tenants, made afresh for each operation (a delete
    // removes some), so that path parameters name schedules that exist.
    let made = 0;
    const scheduleSome = async () => {
      const ids: string[] = [];
      for (const t of ["acme", "globex"] as const) {
        const id = `fz-${made++}`;
        const r = await app.request("/v1/schedules", {
          method: "POST",
          body: JSON.stringify({ id, workflow_ref: "echo", cron: "*/20 * * * *" }),
          headers: { authorization: `Bearer ${tokens[t]}`, "content-type": "application/json" },
        });
        assert.equal(r.status, 201, await r.text());
        ids.push(id);
      }
      return ids;
    };
    const failures: string[] = [];
    const accepted = new Set<string>();
    for (const op of ops) {
      // A signal needs a run not final: the cancel's runs may all be cancelled by now.
      const runIds = op.path.endsWith("/signals") ? await admitSome() : ids;
      const scheduleIds = op.path.startsWith("/v1/schedules") ? await scheduleSome() : ["none"];
      // Creating one needs a new id; everything else names one that exists.
      const scheduleId = op.method === "post" && op.path === "/v1/schedules"
        ? fc.stringMatching(/^[a-z][a-z0-9]{0,12}$/)
        : fc.constantFrom(...scheduleIds, "no-such", "a:b");
      const generated = requests(op, {
        doc,
        hints: {
          run_id: fc.constantFrom(...runIds),
          cursor: fc.constantFrom(...ids).map(encodeCursor),
          workflow_ref: fc.constantFrom("echo", "echo@1", "sleep"),
          // A signal's name (the pattern is beyond the generator's regexes).
          name: fc.constantFrom("approval", "go", "a b"),
          fields: fc.constantFrom(["input"], ["input", "result"]),
          id: scheduleId,
          cron: fc.constantFrom("*/20 * * * *", "0 9 * * 1-5", "30 2 * * *", "61 * * * *", "* *"),
          timezone: fc.constantFrom("UTC", "Europe/Paris", "America/New_York", "Mars/Olympus"),
          from: fc.constantFrom("2030-01-01T00:00:00Z", "2030-01-01T00:30:00+01:00"),
          to: fc.constantFrom("2030-01-01T02:00:00Z", "2029-12-31T00:00:00Z"),
          Prefer: fc.constantFrom("wait=0", "wait=-1", "wait=99999999999999999999"),
          "Poimen-Tenant": fc.constantFrom("globex", "acme", "nobody"),
        },
      });
      const who = fc.oneof(
        { weight: 5, arbitrary: fc.constant("acme-as-itself") },
        { weight: 2, arbitrary: fc.constantFrom("acme", "relay") },
        { weight: 1, arbitrary: fc.constant("none") },
      );
      const contentType = fc.oneof(
        { weight: 6, arbitrary: fc.constant("application/json") },
        { weight: 1, arbitrary: fc.constantFrom("text/plain", "application/json; charset=latin1") },
      );
      await fc.assert(
        fc.asyncProperty(generated, who, contentType, async (g, caller, type) => {
          const headers = new Headers();
          for (const [name, v] of g.headers) {
            // The tenant's own token with another tenant named is a 403 every time: mostly not.
            if (caller === "acme-as-itself" && name.toLowerCase() === "poimen-tenant") continue;
            headers.append(name, v);
          }
          if (caller === "relay") {
            headers.set("authorization", `Bearer ${tokens.relay}`);
            if (!headers.has("poimen-tenant")) headers.set("poimen-tenant", "globex");
          } else if (caller !== "none") headers.set("authorization", `Bearer ${tokens.acme}`);
          if (g.body !== undefined) headers.set("content-type", type);
          const r = await app.request(g.url, { method: op.method, headers, body: g.body });
          // Every 5xx is collected, not only the first: the report lists them all.
          if (r.status >= 500) {
            // Both ends of a long value: a body's last fields are as telling as its first.
            const shown = (x: string | undefined) => {
              const text = JSON.stringify(x) ?? "undefined";
              return text.length > 400 ? `${text.slice(0, 200)}…${text.slice(-200)}` : text;
            };
            const sent = `headers=${shown(JSON.stringify(g.headers))} body=${shown(g.body)}`;
            failures.push(
              `${r.status} ${op.method} ${shown(g.url)} ${sent} → ${
                (await r.text()).slice(0, 300)
              }`,
            );
            return;
          }
          if (r.status < 300) accepted.add(`${op.method} ${op.path}`);
          await checkAnswer(r, op.method);
        }),
        // A body has many more ways to be wrong than a few parameters.
        { seed: SEED, numRuns: op.body ? 4 * OPENAPI_RUNS : OPENAPI_RUNS },
      );
    }
    assert.deepEqual(failures, [], `FUZZ_SEED=${SEED}: ${failures.length} answers were 5xx`);
    // Requests got past the door on every operation, not only refusals.
    assert.deepEqual(
      ops.map((op) => `${op.method} ${op.path}`).filter((op) => !accepted.has(op)),
      [],
      "operations never answered with a 2xx",
    );
  },
]);

Deno.test("api fuzz: no client input yields a 5xx, a refusal changes no row, an admission round-trips", async (t) => {
  await setUp();
  try {
    for (const [name, fn] of CASES) await t.step(name, fn);
  } finally {
    await db.drop();
  }
});
