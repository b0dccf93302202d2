/**
 * The API's refusals, in process (`app.request()`) on a real Postgres: each
 * bad input and each auth rule gets its status and problem type, and
 * changes no row.
 */
import assert from "node:assert/strict";
import client from "prom-client";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import { sampleValue } from "./support/processes.ts";
import { silentLogger } from "../core/log.ts";
import { type ErrorCode, ERRORS, PROBLEM_BASE } from "../core/errors.ts";
import { Admission } from "../admission/admit.ts";
import { catalogOf } from "./support/catalog.ts";
import { type AppDeps, createApp } from "../api/app.ts";
import { BodyBudget } from "../api/body_budget.ts";
import { Authenticator } from "../api/auth.ts";
import { hashToken, newToken } from "../contracts/tokens.ts";
import { createApiMetrics } from "../api/metrics.ts";
import { loadConsoleAssets } from "../api/console/assets.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import { RUN_PAGE_MAX_BYTES } from "../contracts/runs.ts";
import { createPool, type Sql } from "../db/pool.ts";

// Set up by the one test below, which runs every case as a step on one
// database and drops it at the end.
let db: TestDatabase;
let sql: Sql;
let app: ReturnType<typeof createApp>;
let acme: string, globex: string, relay: string;

const consoleAssets = loadConsoleAssets();

function makeApp(bodyLimit: number, bodyBudget?: AppDeps["bodyBudget"]) {
  return createApp({
    sql,
    admission: new Admission(sql, catalogOf(), { maxBatch: 64, maxConcurrent: 4 }),
    auth: new Authenticator(sql, 30_000),
    metrics: createApiMetrics(new client.Registry()),
    log: silentLogger,
    bodyLimit,
    bodyBudget,
    consoleAssets,
  });
}

async function setUp() {
  db = await freshDatabase();
  sql = db.sql;
  app = makeApp(4096);
  acme = await token("tenant", "acme");
  globex = await token("tenant", "globex");
  relay = await token("service", "relay");
}

async function token(kind: "tenant" | "service", name: string): Promise<string> {
  const t = newToken();
  if (kind === "tenant") await insertTenant(sql, name);
  await insertToken(sql, await hashToken(t), {
    kind,
    tenant_id: kind === "tenant" ? name : null,
    name,
  });
  return t;
}

const CASES: [string, (t: Deno.TestContext) => Promise<void>][] = [];

async function counts(): Promise<[number, number]> {
  const [r] = await sql`select (select count(*)::int from runs) as runs,
                               (select count(*)::int from work_events) as events`;
  return [r.runs, r.events];
}

function req(body: BodyInit | null, headers: Record<string, string> = {}, method = "POST") {
  return app.request("/v1/runs", {
    method,
    body,
    headers: { authorization: `Bearer ${acme}`, "content-type": "application/json", ...headers },
  });
}

/**
 * Sends the request `send` makes and asserts a problem response of `status`
 * and `code`, and that no row changed. The rows are counted before `send`
 * is called: a request already under way could write before the count.
 */
async function refused(
  send: () => Response | Promise<Response>,
  status: number,
  code: ErrorCode,
) {
  const before = await counts();
  const r = await send();
  const body = await r.json();
  assert.equal(r.status, status, JSON.stringify(body));
  assert.equal(r.headers.get("content-type"), "application/problem+json");
  assert.equal(body.type, PROBLEM_BASE + code);
  assert.equal(body.title, ERRORS[code].title);
  assert.equal(body.status, status);
  assert.deepEqual(await counts(), before);
  return body;
}

CASES.push(["api refuses each bad input with a problem and writes nothing", async (t) => {
  const start = await counts();
  await t.step("not JSON: 400", () => refused(() => req("{nope"), 400, "bad-json"));
  await t.step("empty body: 400", () => refused(() => req(""), 400, "bad-json"));
  await t.step("a body stream that breaks off: 400, not a 500", () =>
    refused(
      () =>
        req(
          new ReadableStream<Uint8Array>({
            start(ctl) {
              ctl.enqueue(new TextEncoder().encode('{"workflow_ref":"echo","input":'));
              ctl.error(new Error("connection reset by peer"));
            },
          }),
        ),
      400,
      "body-unreadable",
    ));
  await t.step(
    "wrong content type: 415",
    () =>
      refused(
        () => req("workflow_ref=echo", { "content-type": "text/plain" }),
        415,
        "unsupported-media-type",
      ),
  );
  await t.step("body over the limit: 413", () =>
    refused(
      () => req(JSON.stringify({ workflow_ref: "echo", input: "x".repeat(5000) })),
      413,
      "body-too-large",
    ));
  await t.step("body over the limit, streamed without a Content-Length: 413", () =>
    refused(
      () =>
        req(
          new Blob([JSON.stringify({ workflow_ref: "echo", input: "x".repeat(5000) })]).stream(),
        ),
      413,
      "body-too-large",
    ));
  await t.step(
    "Content-Length over the limit: 413 before the body is read",
    () =>
      refused(
        () => req(JSON.stringify({ workflow_ref: "echo" }), { "content-length": "5000" }),
        413,
        "body-too-large",
      ),
  );
  await t.step("a large body of the wrong content type: 415, the type checked first", () =>
    refused(
      () => req("x".repeat(5000), { "content-type": "text/plain" }),
      415,
      "unsupported-media-type",
    ));
  await t.step("refusals by content type and size count as rejected admissions", async () => {
    const rejected = async () =>
      sampleValue(await (await app.request("/metrics")).text(), "poimen_admissions_total", {
        outcome: "rejected",
      });
    const before = await rejected();
    await (await req("x".repeat(5000))).body?.cancel();
    await (await req("{}", { "content-type": "text/plain" })).body?.cancel();
    assert.equal(await rejected(), before + 2);
  });
  await t.step("missing workflow_ref: 422 naming the field", async () => {
    const body = await refused(() => req(JSON.stringify({ input: {} })), 422, "validation");
    assert.equal(body.errors[0].path, "workflow_ref");
  });
  await t.step(
    "unknown field: 422",
    () =>
      refused(
        () => req(JSON.stringify({ workflow_ref: "echo", dispatchKey: "k" })),
        422,
        "validation",
      ),
  );
  await t.step(
    "unknown workflow: 422",
    () => refused(() => req(JSON.stringify({ workflow_ref: "nope" })), 422, "unknown-workflow"),
  );
  await t.step("a version longer than the registry allows: 422 naming workflow_ref", async () => {
    // The API and the registry share one pattern: what the one refuses is
    // a schema error, not a ref that passes and then resolves to nothing.
    const body = await refused(
      () => req(JSON.stringify({ workflow_ref: "echo@1234567890" })),
      422,
      "validation",
    );
    assert.equal(body.errors[0].path, "workflow_ref");
  });
  await t.step(
    "unknown version: 422",
    () => refused(() => req(JSON.stringify({ workflow_ref: "echo@99" })), 422, "unknown-workflow"),
  );
  await t.step("input not matching the workflow: 422", async () => {
    const body = await refused(
      () => req(JSON.stringify({ workflow_ref: "sleep", input: { ms: "long" } })),
      422,
      "validation",
    );
    assert.equal(body.errors[0].path, "input.ms");
  });
  await t.step(
    "empty dispatch_key: 422",
    () =>
      refused(
        () => req(JSON.stringify({ workflow_ref: "echo", dispatch_key: "" })),
        422,
        "validation",
      ),
  );
  await t.step("dispatch_key over 255 chars: 422", () =>
    refused(
      () => req(JSON.stringify({ workflow_ref: "echo", dispatch_key: "k".repeat(256) })),
      422,
      "validation",
    ));
  await t.step(
    "dispatch_key with a control character: 422",
    () =>
      refused(
        () => req(JSON.stringify({ workflow_ref: "echo", dispatch_key: "a\nb" })),
        422,
        "validation",
      ),
  );
  await t.step(
    "goal_id over 255 chars: 422",
    () =>
      refused(
        () => req(JSON.stringify({ workflow_ref: "echo", goal_id: "g".repeat(256) })),
        422,
        "validation",
      ),
  );
  await t.step(
    "bad list filter: 422",
    () =>
      refused(
        () => app.request("/v1/runs?status=lost", { headers: { authorization: `Bearer ${acme}` } }),
        422,
        "validation",
      ),
  );
  await t.step(
    "bad cursor: 422",
    () =>
      refused(
        () => app.request("/v1/runs?cursor=zzz", { headers: { authorization: `Bearer ${acme}` } }),
        422,
        "validation",
      ),
  );
  assert.deepEqual(await counts(), start);
}]);

CASES.push(["hostile input is a 422 naming the failing field, never a 5xx", async (t) => {
  // Raw JSON texts: what a client sends, escapes and all.
  const bodies: [string, string, string][] = [
    ["NUL in a string input", '{"workflow_ref":"echo","input":"\\u0000"}', "input"],
    ["a lone high surrogate", '{"workflow_ref":"echo","input":"\\ud800"}', "input"],
    ["a lone low surrogate", '{"workflow_ref":"echo","input":"a\\udc00b"}', "input"],
    [
      "NUL deep in an array",
      '{"workflow_ref":"echo","input":{"a":{"b":[0,1,2,"x\\u0000"]}}}',
      "input.a.b[3]",
    ],
    [
      "NUL in an object key",
      '{"workflow_ref":"echo","input":{"a":{"k\\u0000":1}}}',
      'input.a["k\\u0000"]',
    ],
    [
      "a lone surrogate in a key",
      '{"workflow_ref":"echo","input":[{"\\ud800":1}]}',
      'input[0]["\\ud800"]',
    ],
    ["a number over the double range", '{"workflow_ref":"echo","input":{"n":1e400}}', "input.n"],
    ["a negative number over the range", '{"workflow_ref":"echo","input":[-1e400]}', "input[0]"],
    [
      "nesting deeper than the limit",
      `{"workflow_ref":"echo","input":${"[".repeat(65)}${"]".repeat(65)}}`,
      "input" + "[0]".repeat(64),
    ],
    ["NUL in dispatch_key", '{"workflow_ref":"echo","dispatch_key":"k\\u0000"}', "dispatch_key"],
    ["a lone surrogate in goal_id", '{"workflow_ref":"echo","goal_id":"\\ud800"}', "goal_id"],
  ];
  for (const [what, text, path] of bodies) {
    await t.step(`${what}: 422 at ${path}`, async () => {
      const body = await refused(() => req(text), 422, "validation");
      assert.equal(body.retryable, false);
      assert.ok(
        body.errors.some((e: { path: string }) => e.path === path),
        `no error at ${path}: ${JSON.stringify(body.errors)}`,
      );
    });
  }
  await t.step("nesting 100,000 deep: a 4xx problem, the process unharmed", async () => {
    const deep = `{"workflow_ref":"echo","input":${"[".repeat(100_000)}${"]".repeat(100_000)}}`;
    // The default body limit (1 MiB), so that the depth check is what refuses it.
    const big = () =>
      makeApp(1 << 20).request("/v1/runs", {
        method: "POST",
        body: deep,
        headers: { authorization: `Bearer ${acme}`, "content-type": "application/json" },
      });
    await refused(big, 422, "validation");
  });
  await t.step("nesting at the limit is admitted and read back as sent", async () => {
    const input = JSON.parse(`${"[".repeat(63)}{"x":1}${"]".repeat(63)}`);
    const r = await req(JSON.stringify({ workflow_ref: "echo", input }));
    assert.equal(r.status, 201);
    const run = await r.json();
    const got = await (await app.request(`/v1/runs/${run.run_id}`, {
      headers: { authorization: `Bearer ${acme}` },
    })).json();
    assert.deepEqual(got.input, input);
  });
  const auth = { headers: { authorization: `Bearer ${acme}` } };
  const queries: [string, string][] = [
    ["goal_id=%00", "goal_id"],
    ["dispatch_key=%00", "dispatch_key"],
    ["dispatch_key=a%0Ab", "dispatch_key"],
    ["goal_id=%ED%A0%80", "goal_id"],
    ["limit=abc", "limit"],
    ["limit=0x10", "limit"],
    ["limit=1e2", "limit"],
    ["limit=", "limit"],
    ["cursor=%00", "cursor"],
    ["cursor=%F0%9F%92%A9%F0%9F%92%A9", "cursor"],
    ["status=queued&status=running", "status"],
    ["limit=5&limit=6", "limit"],
  ];
  for (const [q, path] of queries) {
    await t.step(`GET /v1/runs?${q}: 422 at ${path}`, async () => {
      const body = await refused(() => app.request(`/v1/runs?${q}`, auth), 422, "validation");
      assert.ok(
        body.errors.some((e: { path: string }) => e.path === path),
        `no error at ${path}: ${JSON.stringify(body.errors)}`,
      );
    });
  }
  for (const id of ["%00", "not-a-uuid", "%ED%A0%80", "%", "..%2F..%2Fetc", "x".repeat(5000)]) {
    await t.step(
      `GET /v1/runs/${id.slice(0, 20)}: 404`,
      () => refused(() => app.request(`/v1/runs/${id}`, auth), 404, "not-found"),
    );
  }
  await t.step(
    "body bytes that are not UTF-8: 400",
    () => refused(() => req(new Uint8Array([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x7d])), 400, "bad-json"),
  );
  await t.step("a charset other than UTF-8: 415", () =>
    refused(
      () => req('{"workflow_ref":"echo"}', { "content-type": "application/json; charset=latin1" }),
      415,
      "unsupported-media-type",
    ));
  const service = async (headers: Record<string, string>, status: number, code: ErrorCode) =>
    await refused(
      () => req('{"workflow_ref":"echo"}', { authorization: `Bearer ${relay}`, ...headers }),
      status,
      code,
    );
  await t.step("service token: a garbage Poimen-Tenant is a 403", async () => {
    for (const tenant of ["", " ", "ACME", "a\tb", "\u00ff\u00fe", "x".repeat(4000)]) {
      await service({ "poimen-tenant": tenant }, 403, "forbidden");
    }
  });
  await t.step("service token: a garbage Poimen-Source is a 422 naming the header", async () => {
    for (const source of ["\u00ff\u0080", "a\tb", "x".repeat(301)]) {
      const body = await service(
        { "poimen-tenant": "globex", "poimen-source": source },
        422,
        "validation",
      );
      assert.equal(body.errors[0].path, "header.Poimen-Source");
    }
  });
}]);

CASES.push([
  "api auth: a token is required, a tenant token acts for its own tenant only, a service token for a named one",
  async (t) => {
    const ok = JSON.stringify({ workflow_ref: "echo", input: { hi: 1 } });
    await t.step("no token: 401 with WWW-Authenticate", async () => {
      await refused(
        () =>
          app.request("/v1/runs", {
            method: "POST",
            body: ok,
            headers: { "content-type": "application/json" },
          }),
        401,
        "unauthorized",
      );
      assert.match((await app.request("/v1/runs")).headers.get("www-authenticate") ?? "", /Bearer/);
    });
    await t.step(
      "unknown token: 401",
      () => refused(() => req(ok, { authorization: `Bearer ${newToken()}` }), 401, "unauthorized"),
    );
    await t.step(
      "not a bearer token: 401",
      () => refused(() => req(ok, { authorization: `Basic ${btoa("a:b")}` }), 401, "unauthorized"),
    );
    await t.step(
      "tenant token naming another tenant: 403",
      () => refused(() => req(ok, { "poimen-tenant": "globex" }), 403, "forbidden"),
    );
    await t.step(
      "service token without a tenant: 403",
      () => refused(() => req(ok, { authorization: `Bearer ${relay}` }), 403, "forbidden"),
    );
    await t.step(
      "service token for an unknown tenant: 403",
      () =>
        refused(
          () => req(ok, { authorization: `Bearer ${relay}`, "poimen-tenant": "nobody" }),
          403,
          "forbidden",
        ),
    );
    await t.step("service token for a tenant: admits there, with its source", async () => {
      const r = await req(ok, {
        authorization: `Bearer ${relay}`,
        "poimen-tenant": "globex",
        "poimen-source": "kafka:poimen.globex.dispatch/0/42",
      });
      assert.equal(r.status, 201);
      const run = await r.json();
      assert.equal(run.tenant_id, "globex");
      assert.equal(run.source, "kafka:poimen.globex.dispatch/0/42");
    });
    await t.step("a child: dispatch key is a 422, from any caller, body or header", async () => {
      const child = `child:${crypto.randomUUID()}:charge`;
      const fromBody = JSON.stringify({ workflow_ref: "echo", dispatch_key: child });
      const body = await refused(() => req(fromBody), 422, "validation");
      assert.equal(body.errors[0].path, "dispatch_key");
      assert.match(body.errors[0].message, /child: is reserved/);
      const header = await refused(() => req(ok, { "idempotency-key": child }), 422, "validation");
      assert.equal(header.errors[0].path, "header.Idempotency-Key");
      await refused(
        () =>
          req(fromBody, {
            authorization: `Bearer ${relay}`,
            "poimen-tenant": "globex",
            "poimen-source": child,
          }),
        422,
        "validation",
      );
    });
    await t.step("a tenant token cannot claim a source", async () => {
      const r = await req(ok, { "poimen-source": "kafka:poimen.acme.dispatch/0/1" });
      assert.equal(r.status, 201);
      assert.equal((await r.json()).source, "http:acme");
    });
    await t.step("another tenant's run is a 404, and absent from its list", async () => {
      const mine = await (await req(ok)).json();
      const other = () =>
        app.request(`/v1/runs/${mine.run_id}`, { headers: { authorization: `Bearer ${globex}` } });
      await refused(other, 404, "not-found");
      const list = await (await app.request("/v1/runs?limit=500", {
        headers: { authorization: `Bearer ${globex}` },
      })).json();
      assert.ok(list.runs.every((r: { tenant_id: string }) => r.tenant_id === "globex"));
      assert.ok(!list.runs.some((r: { run_id: string }) => r.run_id === mine.run_id));
    });
  },
]);

CASES.push(["runs list filters and pages with a cursor", async (_t) => {
  const auth = { authorization: `Bearer ${acme}` };
  const goal = `goal-${crypto.randomUUID()}`;
  const made: string[] = [];
  for (let i = 0; i < 7; i++) {
    const r = await req(JSON.stringify({ workflow_ref: "echo", input: { i }, goal_id: goal }));
    assert.equal(r.status, 201);
    made.push((await r.json()).run_id);
  }
  const seen: string[] = [];
  let cursor: string | null = null;
  do {
    const q: string = `/v1/runs?goal_id=${goal}&limit=3${cursor ? `&cursor=${cursor}` : ""}`;
    const page = await (await app.request(q, { headers: auth })).json();
    assert.ok(page.runs.length <= 3);
    seen.push(...page.runs.map((r: { run_id: string }) => r.run_id));
    cursor = page.next_cursor;
  } while (cursor);
  assert.deepEqual(seen, [...made].reverse(), "newest first, each once");

  const byKey = await req(JSON.stringify({ workflow_ref: "echo", dispatch_key: "find-me" }));
  const id = (await byKey.json()).run_id;
  const found = await (await app.request("/v1/runs?dispatch_key=find-me", { headers: auth }))
    .json();
  assert.deepEqual(found.runs.map((r: { run_id: string }) => r.run_id), [id]);
  const queued = await (await app.request(`/v1/runs?status=queued&goal_id=${goal}`, {
    headers: auth,
  })).json();
  assert.equal(queued.runs.length, 7);
  const one = await (await app.request(`/v1/runs/${id}`, { headers: auth })).json();
  assert.equal(one.run_id, id);
  assert.equal(one.input, null);
  assert.equal(one.workflow_version, 1);
}]);

CASES.push(["requests are counted under their route pattern, unmatched ones as other", async () => {
  const auth = { headers: { authorization: `Bearer ${acme}` } };
  const runId = crypto.randomUUID();
  await (await app.request(`/v1/runs/${runId}`, auth)).body?.cancel();
  await (await app.request("/v1/runs", auth)).body?.cancel();
  await (await app.request("/scan/wp-admin.php")).body?.cancel();
  await (await app.request("/v1/runs", { ...auth, method: "DELETE" })).body?.cancel();
  const text = await (await app.request("/metrics")).text();
  const count = (route: string) => sampleValue(text, "poimen_http_requests_total", { route });
  assert.ok(count("/v1/runs/:run_id") >= 1);
  assert.ok(count("/v1/runs") >= 1);
  assert.ok(count("other") >= 2);
  assert.ok(!text.includes(runId), "a run id became a label");
  assert.ok(!text.includes("wp-admin"), "a scanned path became a label");
}]);

CASES.push(["health, readiness, metrics and the OpenAPI document", async (_t) => {
  assert.equal((await app.request("/healthz")).status, 200);
  assert.equal((await app.request("/readyz")).status, 200);
  const text = await (await app.request("/metrics")).text();
  assert.match(text, /poimen_admissions_total\{outcome="created"\} \d+/);
  const doc = await (await app.request("/openapi.json")).json();
  assert.equal(doc.openapi, "3.1.0");
  assert.deepEqual(doc.components.schemas.RunRequest.required, ["workflow_ref"]);
  assert.ok(doc.paths["/v1/runs"].post.responses["201"]);
}]);

CASES.push([
  "bodies beyond BODY_BUDGET_BYTES wait, then get a 503 busy with Retry-After; nothing is lost",
  async () => {
    const budget = new BodyBudget(4096);
    const budgetApp = makeApp(4096, { bytes: budget, waitMs: 100 });
    const post = (body: BodyInit, headers: Record<string, string> = {}) =>
      budgetApp.request("/v1/runs", {
        method: "POST",
        body,
        headers: {
          authorization: `Bearer ${acme}`,
          "content-type": "application/json",
          ...headers,
        },
      });
    // A client that declares the whole budget and is slow to send it.
    const shell = JSON.stringify({ workflow_ref: "echo", input: { pad: "" } });
    const text = JSON.stringify({
      workflow_ref: "echo",
      input: { pad: "x".repeat(4096 - shell.length) },
    });
    const bytes = new TextEncoder().encode(text);
    let finish = () => {};
    const slow = post(
      new ReadableStream<Uint8Array>({
        start(ctl) {
          ctl.enqueue(bytes.slice(0, 10));
          finish = () => {
            ctl.enqueue(bytes.slice(10));
            ctl.close();
          };
        },
      }),
      { "content-length": String(bytes.byteLength) },
    );
    await waitFor("the slow request holds the whole budget", () => budget.free === 0, 5_000, 5);
    const busy = await refused(
      () => post(JSON.stringify({ workflow_ref: "echo", input: { n: 1 } })),
      503,
      "busy",
    );
    assert.equal(busy.retryable, true);
    const again = await post(JSON.stringify({ workflow_ref: "echo", input: { n: 1 } }));
    assert.equal(again.headers.get("retry-after"), "1");
    await again.body?.cancel();
    // The slow body arrives: it is admitted, and its bytes are given back.
    finish();
    const first = await slow;
    assert.equal(first.status, 201, await first.clone().text());
    await first.body?.cancel();
    const after = await post(JSON.stringify({ workflow_ref: "echo", input: { n: 2 } }));
    assert.equal(after.status, 201);
    await after.body?.cancel();
  },
]);

CASES.push([
  "a body still arriving after BODY_READ_TIMEOUT_MS is a 408, and its share of the budget is given back",
  async () => {
    const budget = new BodyBudget(4096);
    const slowApp = makeApp(4096, { bytes: budget, waitMs: 100, readTimeoutMs: 200 });
    let stalled: ReadableStreamDefaultController<Uint8Array> | undefined;
    const body = await refused(
      () =>
        slowApp.request("/v1/runs", {
          method: "POST",
          // Sends the first bytes of a 4 KiB body, then nothing.
          body: new ReadableStream<Uint8Array>({
            start(ctl) {
              stalled = ctl;
              ctl.enqueue(new TextEncoder().encode('{"workflow_ref":"echo",'));
            },
          }),
          headers: {
            authorization: `Bearer ${acme}`,
            "content-type": "application/json",
            "content-length": "4096",
          },
        }),
      408,
      "body-timeout",
    );
    assert.equal(body.retryable, true);
    assert.equal(budget.free, 4096);
    stalled?.close();
  },
]);

CASES.push([
  "a runs list leaves input and result out unless fields asks, and pages stay under 1 MiB to the last run",
  async (t) => {
    const bigApp = makeApp(2 * 1024 * 1024);
    const auth = { authorization: `Bearer ${acme}` };
    const goal = `big-${crypto.randomUUID()}`;
    // 300 KB of JSON each ("é" is 2 bytes in UTF-8 and 1 UTF-16 unit), and one run
    // alone over the bound; results of 200 KB.
    const inputs = [0, 1, 2, 3, 4, 5, 6].map((i) => ({
      i,
      pad: "é".repeat(i === 3 ? 600_000 : 150_000),
    }));
    const made: string[] = [];
    for (const input of inputs) {
      const r = await bigApp.request("/v1/runs", {
        method: "POST",
        body: JSON.stringify({ workflow_ref: "echo", input, goal_id: goal }),
        headers: { ...auth, "content-type": "application/json" },
      });
      assert.equal(r.status, 201, await r.clone().text());
      made.push((await r.json()).run_id);
    }
    // Finished as a worker would leave them: a result of its own on each.
    const resultOf = (id: string) => ({ id, out: "r".repeat(200_000) });
    for (const id of made) {
      await sql`update runs set status = 'succeeded', result = ${sql.json(resultOf(id))},
                                finished_at = now()
                 where tenant_id = 'acme' and run_id = ${id}`;
    }
    const newestFirst = [...made].reverse();
    const list = async (q: string) => {
      const r = await bigApp.request(`/v1/runs?goal_id=${goal}&limit=500${q}`, { headers: auth });
      const text = await r.text();
      assert.equal(r.status, 200, text);
      assert.match(r.headers.get("content-type") ?? "", /^application\/json/);
      return { bytes: new TextEncoder().encode(text).byteLength, page: JSON.parse(text) };
    };
    type Listed = { run_id: string; input?: unknown; result?: unknown; status: string };

    await t.step("without fields: one page, no input and no result on any run", async () => {
      const { bytes, page } = await list("");
      assert.deepEqual(page.runs.map((r: Listed) => r.run_id), newestFirst);
      assert.equal(page.next_cursor, null);
      for (const run of page.runs as Listed[]) {
        assert.ok(!("input" in run) && !("result" in run), Object.keys(run).join());
        assert.equal(run.status, "succeeded");
      }
      assert.ok(bytes < 20_000, `${bytes} bytes for 7 runs without their values`);
    });

    for (const fields of ["input,result", "result,input", "input", "result"]) {
      await t.step(
        `fields=${fields}: pages under 1 MiB whose cursor reaches every run`,
        async () => {
          const seen: Listed[] = [];
          let pages = 0;
          let cursor: string | null = null;
          do {
            const { bytes, page }: {
              bytes: number;
              page: { runs: Listed[]; next_cursor: string };
            } = await list(`&fields=${fields}${cursor ? `&cursor=${cursor}` : ""}`);
            pages++;
            assert.ok(page.runs.length >= 1, "a page holds a run");
            if (page.runs.length > 1) assert.ok(bytes <= RUN_PAGE_MAX_BYTES, `${bytes} bytes`);
            // The run over the bound by itself is alone on its page.
            if (page.runs.some((r) => r.run_id === made[3]) && fields.includes("input")) {
              assert.equal(page.runs.length, 1);
            }
            seen.push(...page.runs);
            cursor = page.next_cursor;
          } while (cursor !== null && pages < 20);
          assert.deepEqual(seen.map((r) => r.run_id), newestFirst, "each run once, newest first");
          const wants = fields.split(",");
          for (const run of seen) {
            const i = made.indexOf(run.run_id);
            assert.equal("input" in run, wants.includes("input"));
            assert.equal("result" in run, wants.includes("result"));
            if (wants.includes("input")) assert.deepEqual(run.input, inputs[i]);
            if (wants.includes("result")) assert.deepEqual(run.result, resultOf(run.run_id));
          }
          // 1.4 MB of results: two pages at least; with inputs, the big one alone and the rest.
          assert.ok(pages >= (wants.includes("input") ? 3 : 2), `${pages} pages`);
        },
      );
    }

    await t.step("a bad fields value is a 422 naming fields", async () => {
      for (
        const q of [
          "fields=secret",
          "fields=",
          "fields=input,,result",
          "fields=input&fields=result",
        ]
      ) {
        const body = await refused(
          () => bigApp.request(`/v1/runs?${q}`, { headers: auth }),
          422,
          "validation",
        );
        assert.match(body.errors[0].path, /^fields/, q);
      }
    });
  },
]);

CASES.push(["a database outage is a 503 with Retry-After", async (_t) => {
  // A pool pointing at a port where no Postgres listens.
  const dead = createPool({
    url: "postgres://postgres@127.0.0.1:1/nowhere",
    max: 1,
    applicationName: "dead",
  });
  const deadApp = createApp({
    sql: dead,
    admission: new Admission(dead, catalogOf(), { maxBatch: 8, maxConcurrent: 1 }),
    auth: new Authenticator(dead, 1000),
    metrics: createApiMetrics(new client.Registry()),
    log: silentLogger,
    bodyLimit: 4096,
    consoleAssets,
  });
  for (const path of ["/readyz", "/v1/runs"]) {
    const r = await deadApp.request(path, { headers: { authorization: `Bearer ${acme}` } });
    assert.equal(r.status, 503, path);
    assert.equal(r.headers.get("retry-after"), "1");
    assert.equal((await r.json()).type, PROBLEM_BASE + "database-unavailable");
  }
  await dead.end();
}]);

Deno.test("idempotent_admission: the API in process refuses bad input, enforces auth, lists and reports health", async (t) => {
  await setUp();
  try {
    for (const [name, fn] of CASES) await t.step(name, fn);
  } finally {
    await db.drop();
  }
});
