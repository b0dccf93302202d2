/**
 * The console and the run-events endpoint, in process (`app.request`): every
 * console response carries the security headers, fragments are behind the
 * bearer tokens and tenant-scoped, hostile values are rendered as text, and
 * a run page's live stream is the tenant's run's event stream (or a 503).
 * The same console in a real browser: tests/it_console_test.ts.
 */
import assert from "node:assert/strict";
import client from "prom-client";
import { freshDatabase, type TestDatabase } from "./support/db.ts";
import { silentLogger } from "../core/log.ts";
import { Admission } from "../admission/admit.ts";
import { catalogOf, limitedRegistry } from "./support/catalog.ts";
import { createApp } from "../api/app.ts";
import { Authenticator } from "../api/auth.ts";
import { hashToken, newToken } from "../contracts/tokens.ts";
import { createApiMetrics } from "../api/metrics.ts";
import { loadConsoleAssets } from "../api/console/assets.ts";
import { CONSOLE_CSP } from "../api/console/console_routes.tsx";
import { insertTenant, insertToken } from "../db/auth.ts";
import { type CatalogVersion, registerVersions, renewWorker } from "../db/catalog.ts";
import { promoteVersion } from "../db/workflow_current.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { RunWatch } from "../api/run_watch.ts";
import { createPool } from "../db/pool.ts";
import { setTenantQuota } from "../db/tenant_quotas.ts";
import { type ClaimedRun, claimLimitedRuns } from "../db/claims.ts";
import { completeRun } from "../db/attempt_end.ts";

const SCRIPT = "<script>alert(1)</script>";
const IMG = `"><img src=x onerror=alert(2)>`;

interface World {
  db: TestDatabase;
  app: ReturnType<typeof createApp>;
  acme: string;
  globex: string;
  relay: string;
  watch?: RunWatch;
}

// shop.sync, limited to one running run per customer: the catalog's only limited one.
const REGISTRY = limitedRegistry();

/** With `live`, the API has a started RunWatch (stopped by `close`). */
async function world(live = false): Promise<World> {
  const db = await freshDatabase();
  const sql = db.sql;
  const watch = live
    ? new RunWatch(sql, {
      listen: () => createPool({ url: db.url, max: 1, applicationName: "poimen-test-watch" }),
      maxWatchers: 4,
      log: silentLogger,
    })
    : undefined;
  await watch?.start();
  const app = createApp({
    watch,
    sql,
    admission: new Admission(sql, catalogOf(REGISTRY), { maxBatch: 64, maxConcurrent: 2 }),
    auth: new Authenticator(sql, 30_000),
    metrics: createApiMetrics(new client.Registry()),
    log: silentLogger,
    bodyLimit: 65536,
    consoleAssets: loadConsoleAssets(),
  });
  const token = async (kind: "tenant" | "service", name: string) => {
    const t = newToken();
    if (kind === "tenant") await insertTenant(sql, name);
    await insertToken(sql, await hashToken(t), {
      kind,
      tenant_id: kind === "tenant" ? name : null,
      name,
    });
    return t;
  };
  return {
    db,
    app,
    watch,
    acme: await token("tenant", "acme"),
    globex: await token("tenant", "globex"),
    relay: await token("service", "relay"),
  };
}

async function admit(w: World, token: string, body: Record<string, unknown>) {
  const r = await w.app.request("/v1/runs", {
    method: "POST",
    body: JSON.stringify({ workflow_ref: "echo", ...body }),
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
  });
  assert.ok(r.status === 201 || r.status === 200, `admission: ${r.status}`);
  return (await r.json()) as { run_id: string };
}

async function get(w: World, path: string, token?: string, extra: Record<string, string> = {}) {
  const headers: Record<string, string> = { ...extra };
  if (token) headers.authorization = `Bearer ${token}`;
  const r = await w.app.request(path, { headers });
  return { status: r.status, headers: r.headers, text: await r.text() };
}

function assertSecurityHeaders(headers: Headers, path: string) {
  assert.equal(headers.get("content-security-policy"), CONSOLE_CSP, path);
  assert.equal(headers.get("x-content-type-options"), "nosniff", path);
  assert.equal(headers.get("referrer-policy"), "no-referrer", path);
}

Deno.test("console: pages, fragments and run events", async (t) => {
  const w = await world();
  try {
    await t.step("every console response has the CSP, nosniff and no-referrer", async () => {
      const run = await admit(w, w.acme, {});
      for (
        const [path, token] of [
          ["/console/login", undefined],
          ["/console/runs", undefined],
          [`/console/runs/${run.run_id}`, undefined],
          ["/console/queue", undefined],
          ["/console/app.js", undefined],
          ["/console/console.css", undefined],
          ["/console/fragments/runs", undefined], // 401
          ["/console/fragments/runs", w.acme],
          [`/console/fragments/runs/${run.run_id}`, w.acme],
          ["/console/fragments/queue", w.acme],
          ["/console/workflows", undefined],
          ["/console/fragments/workflows", w.acme],
          ["/console/runs/not-a-run", undefined], // 404
        ] as const
      ) {
        const r = await get(w, path, token);
        assertSecurityHeaders(r.headers, path);
      }
      const live = await get(w, `/console/live/runs/${run.run_id}`, w.acme);
      assertSecurityHeaders(live.headers, "/console/live/runs/:run_id");
      assert.equal(
        (await get(w, "/console/app.js")).headers.get("content-type"),
        "text/javascript; charset=utf-8",
      );
      assert.equal(
        (await get(w, "/console/console.css")).headers.get("content-type"),
        "text/css; charset=utf-8",
      );
    });

    await t.step("the CSP is as strict as promised", () => {
      const d = new Map(CONSOLE_CSP.split("; ").map((p) => [p.split(" ")[0], p]));
      assert.equal(d.get("default-src"), "default-src 'none'");
      assert.equal(d.get("script-src"), "script-src 'self'");
      assert.equal(d.get("style-src"), "style-src 'self'");
      assert.equal(d.get("frame-ancestors"), "frame-ancestors 'none'");
      assert.ok(!CONSOLE_CSP.includes("unsafe"));
    });

    await t.step("shells carry no tenant data and load only same-origin files", async () => {
      const shell = await get(w, "/console/runs");
      assert.equal(shell.status, 200);
      assert.match(shell.text, /^<!doctype html>/);
      assert.match(shell.text, /<script src="\/console\/app\.js" defer(="")?><\/script>/);
      assert.ok(!/<script>/.test(shell.text), "no inline script");
      assert.ok(!/ style=/.test(shell.text), "no inline style");
      assert.ok(!/https?:\/\//.test(shell.text.replaceAll("http://www.w3.org/2000/svg", "")));
      const run = await get(w, `/console/runs/${crypto.randomUUID()}`);
      assert.match(run.text, /data-live="\/console\/live\/runs\/[0-9a-f-]{36}"/);
      assert.match(run.text, /<p id="live" class="live" role="status" hidden(="")?>/);
      assert.ok(!shell.text.includes('id="live"'), "only a run page is live");
      const redirect = await w.app.request("/console");
      assert.equal(redirect.status, 303);
      assert.equal(redirect.headers.get("location"), "/console/runs");
    });

    await t.step("fragments need a valid bearer token", async () => {
      for (const path of ["/console/fragments/runs", "/console/fragments/queue"]) {
        assert.equal((await get(w, path)).status, 401);
        assert.equal((await get(w, path, newToken())).status, 401);
      }
      assert.equal((await get(w, "/console/fragments/whoami", w.acme)).text, '{"tenant":"acme"}');
      const service = await get(w, "/console/fragments/whoami", w.relay, {
        "poimen-tenant": "globex",
      });
      assert.equal(service.text, '{"tenant":"globex"}');
    });

    await t.step("hostile values are rendered as text, never as markup", async () => {
      const run = await admit(w, w.acme, {
        dispatch_key: `${SCRIPT}${IMG}`,
        goal_id: IMG,
        input: { note: SCRIPT, attr: IMG },
      });
      const list = await get(
        w,
        `/console/fragments/runs?dispatch_key=${encodeURIComponent(`${SCRIPT}${IMG}`)}`,
        w.acme,
      );
      const detail = await get(w, `/console/fragments/runs/${run.run_id}`, w.acme);
      for (const page of [list, detail]) {
        assert.equal(page.status, 200);
        assert.ok(page.text.includes(run.run_id));
        assert.ok(!page.text.includes("<script"), "no script element");
        assert.ok(!page.text.includes("<img"), "no img element");
        assert.ok(page.text.includes("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert.ok(page.text.includes("&lt;img src=x onerror=alert(2)&gt;"));
      }
      // In an attribute (the filter form's value), the quote is escaped too.
      assert.ok(list.text.includes('value="&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;'));
    });

    await t.step("a tenant sees only its own runs, events and queue", async () => {
      const mine = await admit(w, w.acme, { dispatch_key: "acme-only" });
      for (
        const path of [
          `/console/fragments/runs/${mine.run_id}`,
          `/console/live/runs/${mine.run_id}`,
          `/v1/runs/${mine.run_id}/events`,
        ]
      ) {
        assert.equal((await get(w, path, w.globex)).status, 404, path);
      }
      const list = await get(w, "/console/fragments/runs?dispatch_key=acme-only", w.globex);
      assert.ok(!list.text.includes(mine.run_id));
      assert.ok(list.text.includes("No runs match."));
      const theirs = await get(w, "/console/fragments/queue", w.globex);
      assert.match(theirs.text, /<div class="value" id="queued">0<\/div>/);
      const ours = await get(w, "/console/fragments/queue", w.acme);
      assert.doesNotMatch(ours.text, /<div class="value" id="queued">0<\/div>/);
    });

    await t.step("without a RunWatch, a run page's live stream is refused: 503", async () => {
      const run = await admit(w, w.acme, {});
      const r = await get(w, `/console/live/runs/${run.run_id}`, w.acme);
      assert.equal(r.status, 503, r.text);
      assert.ok(r.headers.get("retry-after"));
      assert.match(JSON.parse(r.text).type, /\/busy$/);
      assert.equal((await get(w, `/console/live/runs/${run.run_id}`)).status, 401);
    });

    await t.step("GET /v1/runs/{id}/events lists the run's events in order", async () => {
      const run = await admit(w, w.acme, { input: { x: 1 } });
      const r = await get(w, `/v1/runs/${run.run_id}/events`, w.acme);
      assert.equal(r.status, 200);
      const body = JSON.parse(r.text);
      assert.equal(body.events.length, 1);
      assert.equal(body.events[0].seq, 1);
      assert.equal(body.events[0].type, "run.admitted");
      assert.equal(body.events[0].published_at, null);
      assert.equal((await get(w, `/v1/runs/not-a-uuid/events`, w.acme)).status, 404);
      assert.equal((await get(w, `/v1/runs/${crypto.randomUUID()}/events`, w.acme)).status, 404);
      assert.equal((await get(w, `/v1/runs/${run.run_id}/events`)).status, 401);
    });

    await t.step("the runs fragment filters and pages like /v1/runs", async () => {
      const goal = `g-${crypto.randomUUID()}`;
      const made = [];
      for (let i = 0; i < 5; i++) made.push((await admit(w, w.acme, { goal_id: goal })).run_id);
      const seen: string[] = [];
      let path: string | undefined = `/console/fragments/runs?goal_id=${goal}&limit=2&status=`;
      while (path) {
        const page = await get(w, path, w.acme);
        assert.equal(page.status, 200, page.text);
        seen.push(...[...page.text.matchAll(/data-run-id="([^"]+)"/g)].map((m) => m[1]));
        const older = /id="older" href="\/console\/runs\?([^"]+)"/.exec(page.text);
        path = older ? `/console/fragments/runs?${older[1].replaceAll("&amp;", "&")}` : undefined;
      }
      assert.deepEqual(seen, made.reverse());
      const bad = await get(w, "/console/fragments/runs?status=nope", w.acme);
      assert.equal(bad.status, 422);
    });

    await t.step("the queue fragment draws a minute per bar over the last hour", async () => {
      const q = await get(w, "/console/fragments/queue", w.acme);
      assert.equal(q.status, 200);
      assert.equal([...q.text.matchAll(/<rect /g)].length, 60);
      const admittedThisHour = Number(/id="admitted-hour">(\d+)</.exec(q.text)?.[1]);
      const [{ n }] = await w.db.sql<{ n: number }[]>`
        select count(*)::int as n from runs where tenant_id = 'acme'`;
      assert.equal(admittedThisHour, n);
    });

    await t.step(
      "the queue fragment shows a tenant's quota use, and nothing without one",
      async () => {
        const none = await get(w, "/console/fragments/queue", w.globex);
        assert.ok(!none.text.includes('id="quota"'), "no quota, no quota cards");
        const [{ n }] = await w.db.sql<{ n: number }[]>`
        select count(*)::int as n from runs where tenant_id = 'acme' and status = 'queued'`;
        await setTenantQuota(w.db.sql, "acme", { max_queued: n + 5, admission_rate: 2.5 });
        const q = await get(w, "/console/fragments/queue", w.acme);
        assert.equal(/id="quota-queued">([^<]*)</.exec(q.text)?.[1], `${n} / ${n + 5}`);
        assert.equal(/id="quota-rate">([^<]*)</.exec(q.text)?.[1], "2.5/s");
        assert.ok(!q.text.includes("(full:"), q.text);
        await setTenantQuota(w.db.sql, "acme", { max_queued: n, admission_rate: null });
        const full = await get(w, "/console/fragments/queue", w.acme);
        assert.equal(/id="quota-queued">([^<]*)</.exec(full.text)?.[1], `${n} / ${n}`);
        assert.equal(/id="quota-rate">([^<]*)</.exec(full.text)?.[1], "unlimited");
        assert.ok(full.text.includes("full: admissions get 429 queue-full"), full.text);
        // The other tenant still sees none: its own page, its own quota.
        assert.ok(
          !(await get(w, "/console/fragments/queue", w.globex)).text.includes('id="quota"'),
        );
        await setTenantQuota(w.db.sql, "acme", { max_queued: null });
      },
    );

    await t.step(
      "the queue fragment lists the versions waiting for a worker, per tenant",
      async () => {
        const sql = w.db.sql;
        await registerVersions(sql, builtinRegistry().catalogVersions(), "console-test");
        const run = await admit(w, w.acme, {});
        const [{ ref }] = await sql<{ ref: string }[]>`
        select workflow_name || '@' || workflow_version as ref from runs
         where run_id = ${run.run_id}`;
        const [{ n }] = await sql<{ n: number }[]>`
        select count(*)::int as n from runs
         where tenant_id = 'acme' and status = 'queued'
           and workflow_name || '@' || workflow_version = ${ref}`;
        const waiting = (text: string) =>
          [...text.matchAll(/<tr data-workflow="([^"]+)"><td class="mono">[^<]*<\/td><td>(\d+)</g)]
            .map((m) => [m[1], Number(m[2])]);
        const ours = await get(w, "/console/fragments/queue", w.acme);
        assert.deepEqual(waiting(ours.text), [[ref, n]]);
        assert.ok(!ours.text.includes('id="no-waiting"'));
        // globex has no queued run of it: nothing waits.
        const theirs = await get(w, "/console/fragments/queue", w.globex);
        assert.deepEqual(waiting(theirs.text), []);
        assert.ok(
          theirs.text.includes("Every queued run&#39;s version has a worker."),
          theirs.text,
        );
        // A live worker hosting it: acme's runs wait for a slot, not a worker.
        await renewWorker(sql, "console-test-worker", [ref], 60_000);
        const hosted = await get(w, "/console/fragments/queue", w.acme);
        assert.deepEqual(waiting(hosted.text), []);
        assert.ok(hosted.text.includes('id="no-waiting"'));
      },
    );
  } finally {
    await w.db.drop();
  }
});

Deno.test("console: the queue page lists the tenant's groups waiting on a concurrency limit; a waiting run's page says so", async (t) => {
  const w = await world();
  try {
    const sql = w.db.sql;
    const sync = (token: string, customer_id: string, n: number) =>
      admit(w, token, { workflow_ref: "shop.sync", input: { customer_id, n } });
    const rows = (text: string) =>
      [
        ...text.matchAll(
          /<tr data-workflow="([^"]*)" data-key="([^"]*)"><td class="mono">[^<]*<\/td><td class="mono">(?:<span[^>]*>)?[^<]*(?:<\/span>)?<\/td><td>(\d+)<\/td><td>(\d+)<\/td><td>(\d+)</g,
        ),
      ].map((m) => [m[1], m[2], Number(m[3]), Number(m[4]), Number(m[5])]);
    const text = (page: string, id: string) =>
      new RegExp(`id="${id}"[^>]*>([^<]*)<`).exec(page)?.[1];

    await t.step("nothing waits before a group is full", async () => {
      await sync(w.acme, "a", 0);
      const q = await get(w, "/console/fragments/queue", w.acme);
      assert.ok(q.text.includes("Waiting on a concurrency limit"), q.text);
      assert.ok(q.text.includes('id="no-concurrency-waiting"'), q.text);
      assert.deepEqual(rows(q.text), []);
    });

    let waitingRun = "";
    let started: ClaimedRun[] = [];
    await t.step("full groups with queued runs: most queued first, and totals", async () => {
      for (let n = 1; n < 4; n++) waitingRun = (await sync(w.acme, "a", n)).run_id;
      // A hostile key is shown as text.
      for (let n = 0; n < 2; n++) await sync(w.acme, SCRIPT, n);
      await sync(w.acme, "lonely", 0); // starts, nothing behind it: not listed
      await sync(w.globex, "g", 0);
      await sync(w.globex, "g", 1);
      started = await claimLimitedRuns(
        sql,
        "console-test",
        16,
        60_000,
        REGISTRY.hostedByLimit().limited,
      );
      assert.equal(started.length, 4, "one per customer");
      // A live worker hosts it: its queued runs wait on the limit, not for a worker.
      await renewWorker(sql, "console-test", ["shop.sync@1"], 60_000);
      const q = await get(w, "/console/fragments/queue", w.acme);
      assert.deepEqual(rows(q.text), [
        ["shop.sync", "a", 1, 1, 3],
        ["shop.sync", "&lt;script&gt;alert(1)&lt;/script&gt;", 1, 1, 1],
      ]);
      assert.ok(!q.text.includes("<script>"), "no script element");
      assert.equal(text(q.text, "concurrency-waiting-runs"), "4");
      assert.equal(text(q.text, "concurrency-full-groups"), "2");
      assert.ok(!q.text.includes('id="no-concurrency-waiting"'));
      // globex sees its own group only.
      const theirs = await get(w, "/console/fragments/queue", w.globex);
      assert.deepEqual(rows(theirs.text), [["shop.sync", "g", 1, 1, 1]]);
      assert.equal(text(theirs.text, "concurrency-waiting-runs"), "1");
    });

    await t.step("a run waiting on its key's limit says so on its page", async () => {
      const page = await get(w, `/console/fragments/runs/${waitingRun}`, w.acme);
      assert.match(page.text, /id="run-waiting-for" data-reason="concurrency"/);
      assert.equal(text(page.text, "run-waiting-running"), "1");
      assert.equal(text(page.text, "run-waiting-limit"), "1");
      assert.equal(text(page.text, "run-waiting-key"), "a");
      // A queued run of a version no worker hosts says that instead.
      const echo = await admit(w, w.acme, {});
      const other = await get(w, `/console/fragments/runs/${echo.run_id}`, w.acme);
      assert.match(other.text, /id="run-waiting-for" data-reason="worker">no running worker/);
    });

    await t.step("when a run ends, its group has room and leaves the list", async () => {
      const [{ run_id }] = await sql<{ run_id: string }[]>`
        select run_id from runs
         where tenant_id = 'acme' and concurrency_key = 'a' and status = 'running'`;
      const a = started.find((r) => r.run_id === run_id)!;
      assert.ok(await completeRun(sql, "acme", a.run_id, "console-test", a.attempts, null));
      const q = await get(w, "/console/fragments/queue", w.acme);
      assert.deepEqual(rows(q.text), [
        ["shop.sync", "&lt;script&gt;alert(1)&lt;/script&gt;", 1, 1, 1],
      ]);
      assert.equal(text(q.text, "concurrency-waiting-runs"), "1");
      const page = await get(w, `/console/fragments/runs/${waitingRun}`, w.acme);
      assert.match(page.text, /data-reason="slot"/);
    });
  } finally {
    await w.db.drop();
  }
});

/** Reads an event stream to its end (or `signal`), as id/event pairs. */
async function readStream(res: Response): Promise<{ id: number; event: string }[]> {
  const text = await res.text();
  return [...text.matchAll(/^id: (\d+)\nevent: (\S+)\n/gm)].map((m) => ({
    id: Number(m[1]),
    event: m[2],
  }));
}

Deno.test("console: the workflows page lists the versions the tenant may start, which one its bare name gets, and their live workers; never another tenant's versions", async () => {
  const w = await world();
  try {
    const sql = w.db.sql;
    const v = (version: number, tenants: string | null = null): CatalogVersion => ({
      name: "billing.invoice",
      version,
      input_schema: { type: "object" },
      max_attempts: null,
      concurrency_limit: 3,
      concurrency_key: "/customer_id",
      tenants,
    });
    await registerVersions(sql, [v(1)], "console-test");
    await registerVersions(sql, [v(2), v(3, "globex")], "console-test");
    await renewWorker(sql, "w-old", ["billing.invoice@1"], 60_000);
    await renewWorker(sql, "w-new", ["billing.invoice@1", "billing.invoice@2"], 60_000);
    const rows = async (token: string) => {
      const page = await get(w, "/console/fragments/workflows", token);
      assert.equal(page.status, 200, page.text);
      assert.ok(!page.text.includes("w-old"), "worker ids are not shown");
      return [
        ...page.text.matchAll(
          /<tr data-workflow="([^"]+)" data-current="(true|false)">.*?data-live-workers="(\d+)"/g,
        ),
      ].map((m) => [m[1], m[2] === "true", Number(m[3])]);
    };
    const builtins = [["echo@1", true, 0], ["fail@1", true, 0], ["sleep@1", true, 0]];
    assert.deepEqual(await rows(w.acme), [
      ["billing.invoice@1", true, 2],
      ["billing.invoice@2", false, 1],
      ...builtins,
    ]);
    assert.deepEqual((await rows(w.globex)).slice(0, 3), [
      ["billing.invoice@1", true, 2],
      ["billing.invoice@2", false, 1],
      ["billing.invoice@3", false, 0],
    ]);

    // 3 promoted: globex gets it; acme, which may not start it, the newest older one.
    await promoteVersion(sql, "billing.invoice", 3, "test");
    assert.deepEqual((await rows(w.acme)).slice(0, 2), [
      ["billing.invoice@1", false, 2],
      ["billing.invoice@2", true, 1],
    ]);
    assert.deepEqual((await rows(w.globex)).slice(0, 3), [
      ["billing.invoice@1", false, 2],
      ["billing.invoice@2", false, 1],
      ["billing.invoice@3", true, 0],
    ]);

    const shell = await get(w, "/console/workflows");
    assert.equal(shell.status, 200);
    assert.ok(shell.text.includes('data-fragment="/console/fragments/workflows"'), shell.text);
    assert.ok(shell.text.includes('href="/console/workflows"'));
    assert.equal((await get(w, "/console/fragments/workflows")).status, 401);
  } finally {
    await w.db.drop();
  }
});

Deno.test("console: a run page's live stream is its tenant's run's event stream", async (t) => {
  const w = await world(true);
  const live = (runId: string, token: string, extra: Record<string, string> = {}) =>
    w.app.request(`/console/live/runs/${runId}`, {
      headers: { authorization: `Bearer ${token}`, ...extra },
      // A stream that never ends fails the test instead of hanging it.
      signal: AbortSignal.timeout(20_000),
    });
  try {
    await t.step("it streams the run's events and ends once the run is final", async () => {
      const run = await admit(w, w.acme, {});
      const res = await live(run.run_id, w.acme);
      assert.equal(res.status, 200);
      assert.equal(res.headers.get("content-type"), "text/event-stream; charset=utf-8");
      assertSecurityHeaders(res.headers, "/console/live/runs/:run_id");
      assert.equal(w.watch?.watchers, 1);
      const events = readStream(res);
      const cancel = await w.app.request(`/v1/runs/${run.run_id}/cancel`, {
        method: "POST",
        headers: { authorization: `Bearer ${w.acme}` },
      });
      assert.equal(cancel.status, 200);
      assert.deepEqual(await events, [
        { id: 1, event: "run.admitted" },
        { id: 2, event: "run.cancelled" },
      ]);
      assert.equal(w.watch?.watchers, 0, "the slot is given back");
      // Resumed after what the page shows: only what came since.
      const after = await live(run.run_id, w.acme, { "last-event-id": "1" });
      assert.deepEqual(await readStream(after), [{ id: 2, event: "run.cancelled" }]);
    });

    await t.step("another tenant's run, or no run, is a 404 on the stream too", async () => {
      const run = await admit(w, w.acme, {});
      for (const [id, token] of [[run.run_id, w.globex], ["not-a-run", w.acme]]) {
        const res = await live(id, token);
        assert.equal(res.status, 404, await res.text());
      }
      assert.equal((await live(crypto.randomUUID(), w.acme)).status, 404);
      assert.equal(w.watch?.watchers, 0, "no slot taken for a refused stream");
    });
  } finally {
    await w.watch?.stop();
    await w.db.drop();
  }
});
