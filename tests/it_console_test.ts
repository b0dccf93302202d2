/**
 * The console as a person uses it, in a real browser (headless Chromium from
 * Debian's package, tests/support/browser.ts) against the real API process:
 * log in with a token, find a run by its dispatch key, open it, cancel it and
 * watch its status change; and a run whose dispatch key and input are
 * markup is shown as text; an open run's page follows the run live, and
 * with its stream refused says so and still shows the run. Along the way:
 * the CSP header is there, nothing violates it, and no request leaves
 * localhost.
 *
 * CONSOLE_SCREENSHOTS=docs/console also saves one screenshot per page there
 * (docs/console.md shows them).
 */
import assert from "node:assert/strict";
import type { Page } from "playwright-core";
import { CONSOLE_CSP } from "../api/console/console_routes.tsx";
import { SECOND } from "../core/time.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, PoimenProcess, runCommand } from "./support/processes.ts";
import { type Browser, launchBrowser } from "./support/browser.ts";
import { z } from "zod";
import { registerVersions, renewWorker } from "../db/catalog.ts";
import { claimLimitedRuns } from "../db/claims.ts";
import { notifyCatalog } from "../db/notify.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { defineWorkflow } from "../workflows/define.ts";
import { writeDeclaredSchedules } from "../worker/declared_schedules.ts";
import { silentLogger } from "../core/log.ts";

const SCREENSHOTS = Deno.env.get("CONSOLE_SCREENSHOTS");
const LONG = 60 * SECOND;
const SCRIPT = "<script>alert(1)</script>";
const IMG = `"><img src=x onerror=alert(2)>`;

/** A workflow limited to one running run per customer, as a worker would register it. */
const LIMITED = new WorkflowRegistry().register(defineWorkflow({
  name: "crm.sync",
  version: 1,
  input: z.object({ customer_id: z.string() }),
  concurrency: { limit: 1, key: "/customer_id" },
  handler: () => Promise.resolve(null),
}));

/** Playwright's child process and sockets outlive a test's op accounting. */
const BROWSER_TEST = { sanitizeOps: false, sanitizeResources: false } as const;

interface Setup extends AsyncDisposable {
  db: TestDatabase;
  api: ApiProcess;
  token: string;
  browser: Browser;
  admit(body: Record<string, unknown>): Promise<string>;
  status(runId: string): Promise<string>;
}

async function setUp(tenant: string): Promise<Setup> {
  const db = await freshDatabase();
  const tok = await runCommand("token", [tenant], { DATABASE_URL: db.url });
  assert.equal(tok.code, 0, tok.stderr);
  const token = tok.stdout.trim();
  // One attempt per run: a failing run fails at once, without a retry backoff.
  const api = new ApiProcess({ DATABASE_URL: db.url, DEFAULT_MAX_ATTEMPTS: "1" });
  let browser: Browser | undefined;
  try {
    await api.ready();
    browser = await launchBrowser();
  } catch (err) {
    await api.stop();
    await db.drop();
    throw err;
  }
  const headers = { authorization: `Bearer ${token}`, "content-type": "application/json" };
  return {
    db,
    api,
    token,
    browser,
    async admit(body) {
      const res = await fetch(`${api.url}/v1/runs`, {
        method: "POST",
        headers,
        body: JSON.stringify(body),
      });
      const run = await res.json();
      assert.equal(res.status, 201, JSON.stringify(run));
      return run.run_id;
    },
    async status(runId) {
      const res = await fetch(`${api.url}/v1/runs/${runId}`, { headers });
      return (await res.json()).status;
    },
    async [Symbol.asyncDispose]() {
      await browser?.[Symbol.asyncDispose]();
      await api.stop();
      await db.drop();
    },
  };
}

/** What a page did that it must not: requests elsewhere, CSP violations, dialogs. */
interface Watch {
  foreignRequests: string[];
  cspViolations: string[];
  dialogs: string[];
}

function watch(page: Page, origin: string): Watch {
  const w: Watch = { foreignRequests: [], cspViolations: [], dialogs: [] };
  page.on("request", (r) => {
    const url = r.url();
    if (!url.startsWith("data:") && new URL(url).origin !== origin) w.foreignRequests.push(url);
  });
  page.on("console", (m) => {
    if (/Content Security Policy/i.test(m.text())) w.cspViolations.push(m.text());
  });
  page.on("dialog", (d) => {
    w.dialogs.push(d.message());
    d.dismiss().catch(() => {});
  });
  return w;
}

async function screenshot(page: Page, name: string, fullPage = false) {
  if (!SCREENSHOTS) return;
  await Deno.mkdir(SCREENSHOTS, { recursive: true });
  await page.screenshot({ path: `${SCREENSHOTS}/${name}.png`, fullPage });
}

/** Opens the console, is sent to the login page, and logs in with `token`. */
async function logIn(page: Page, url: string, token: string, shoot = false) {
  const res = await page.goto(`${url}/console`);
  assert.equal(res?.headers()["content-security-policy"], CONSOLE_CSP);
  assert.equal(res?.headers()["x-content-type-options"], "nosniff");
  assert.equal(res?.headers()["referrer-policy"], "no-referrer");
  await page.waitForURL("**/console/login");
  await page.getByLabel("API token").waitFor();
  if (shoot) await screenshot(page, "login");
  await page.getByLabel("API token").fill(token);
  await page.getByRole("button", { name: "Log in" }).click();
  await page.waitForURL("**/console/runs");
  await page.locator("#tenant").waitFor();
}

Deno.test({
  name: "console: a person logs in, finds a run by its dispatch key, opens it and cancels it",
  ...BROWSER_TEST,
  async fn() {
    await using s = await setUp("acme");
    const page = await s.browser.context.newPage();
    const seen = watch(page, s.api.url);

    // A day's work to look at: runs a worker ran (most succeed, some fail),
    // admitted over the last hour; then, with no worker, runs that wait.
    const done: string[] = [];
    for (let i = 0; i < 48; i++) {
      done.push(
        await s.admit(
          i % 8 === 7
            ? { workflow_ref: "fail", input: { times: 5, message: "upstream said no" } }
            : { workflow_ref: "echo", input: { report: i }, goal_id: `nightly-${i % 3}` },
        ),
      );
    }
    const worker = new PoimenProcess("worker", { DATABASE_URL: s.db.url, WORKER_POLL_MS: "100" });
    try {
      await waitFor("the worker finished the first runs", async () => {
        const statuses = await Promise.all(done.map((id) => s.status(id)));
        return statuses.every((x) => x === "succeeded" || x === "failed");
      }, LONG);
    } finally {
      await worker.stop();
    }
    // Admission times spread over the hour, so the chart has a shape (test
    // data: when a run was admitted is not what this test is about).
    await s.db.sql`
      update runs set created_at = now() - (random() * interval '59 minutes')
       where run_id = any(${done}::uuid[])`;
    const key = `invoice-2024-${crypto.randomUUID().slice(0, 8)}`;
    // Due in an hour: it waits, whatever runs workers.
    const due = new Date(Date.now() + 3600 * SECOND);
    const target = await s.admit({
      workflow_ref: "echo",
      run_after: due.toISOString(),
      input: { invoice: 42, lines: [{ sku: "A-1", qty: 3 }] },
      goal_id: "billing",
      dispatch_key: key,
    });
    for (let i = 0; i < 3; i++) {
      await s.admit({ workflow_ref: "echo", input: { i }, dispatch_key: `other-${i}` });
    }

    await logIn(page, s.api.url, s.token, true);
    await page.locator("#runs tbody tr").first().waitFor();
    assert.ok(await page.locator("#runs tbody tr").count() >= 50);
    await screenshot(page, "runs");

    // Find it by its dispatch key with the filter.
    await page.getByLabel("Dispatch key").fill(key);
    await page.getByRole("button", { name: "Filter" }).click();
    await page.waitForURL((u) => u.searchParams.get("dispatch_key") === key);
    await page.locator("body[data-loaded=true]").waitFor();
    assert.equal(await page.locator("#runs tbody tr").count(), 1);
    assert.equal(await page.locator("#runs tbody tr .dispatch-key").textContent(), key);

    // Open it: its input and its timeline.
    await page.getByRole("link", { name: target }).click();
    await page.waitForURL(`**/console/runs/${target}`);
    await page.locator("#run-status [data-status=queued]").waitFor();
    assert.equal(await page.locator("#dispatch-key").textContent(), key);
    assert.equal(
      await page.locator("#run-due time").getAttribute("datetime"),
      due.toISOString(),
    );
    assert.deepEqual(JSON.parse(await page.locator("#run-input").textContent() ?? ""), {
      invoice: 42,
      lines: [{ sku: "A-1", qty: 3 }],
    });
    assert.match(await page.locator("#events").textContent() ?? "", /run\.admitted/);
    await screenshot(page, "run", true);

    // Cancel it, and see it cancelled.
    await page.getByRole("button", { name: "Cancel run" }).click();
    // Either it shows cancelled, or the console says why not (and the test fails saying so).
    await page.locator("#run-status [data-status=cancelled], #message:not([hidden])")
      .first().waitFor({ timeout: LONG });
    assert.equal(
      await page.locator("#message").isVisible(),
      false,
      await page.locator("#message").textContent() ?? "",
    );
    await page.locator("#run-status [data-status=cancelled]").waitFor();
    assert.equal(await page.getByRole("button", { name: "Cancel run" }).count(), 0);
    assert.equal(await s.status(target), "cancelled");

    // A workflow limited to one run per customer, hosted by a worker that
    // started one run of each customer (claimed here, as that worker would):
    // the others wait on the limit.
    await registerVersions(s.db.sql, LIMITED.catalogVersions(), "console-it");
    await notifyCatalog(s.db.sql);
    const backlog = { "acme-corp": 4, "globex": 3, "initech": 1 };
    await waitFor("the API knows crm.sync", async () => {
      const res = await fetch(`${s.api.url}/v1/runs`, {
        method: "POST",
        headers: { authorization: `Bearer ${s.token}`, "content-type": "application/json" },
        body: JSON.stringify({ workflow_ref: "crm.sync", input: { customer_id: "acme-corp" } }),
      });
      await res.body?.cancel();
      return res.status === 201;
    }, LONG);
    for (const [customer_id, n] of Object.entries(backlog)) {
      for (let i = customer_id === "acme-corp" ? 1 : 0; i < n; i++) {
        await s.admit({ workflow_ref: "crm.sync", input: { customer_id } });
      }
    }
    await renewWorker(s.db.sql, "console-it-worker", ["crm.sync@1"], 10 * 60 * SECOND);
    const started = await claimLimitedRuns(
      s.db.sql,
      "console-it-worker",
      16,
      10 * 60 * SECOND,
      LIMITED.hostedByLimit().limited,
    );
    assert.equal(started.length, 3, "one per customer");

    // The queue at a glance: what waits, and the hour's admissions.
    await page.getByRole("link", { name: "Queue" }).click();
    await page.waitForURL("**/console/queue");
    await page.locator("#queued").waitFor();
    assert.equal(await page.locator("#queued").textContent(), "8", "3 echo, 5 crm.sync");
    assert.equal(await page.locator("#running").textContent(), "3");
    assert.equal(await page.locator("#admitted-hour").textContent(), String(done.length + 12));
    assert.equal(await page.locator("svg.chart rect.bar").count(), 60);
    // Waiting on the limit: acme-corp's 3 and globex's 2 (initech's run started).
    assert.deepEqual(
      await page.locator("#concurrency-waiting tbody td").allTextContents(),
      ["crm.sync", "acme-corp", "1", "1", "3", "crm.sync", "globex", "1", "1", "2"],
    );
    assert.equal(await page.locator("#concurrency-waiting-runs").textContent(), "5");
    assert.equal(await page.locator("#concurrency-full-groups").textContent(), "2");
    await screenshot(page, "queue", true);

    assert.deepEqual(seen.foreignRequests, [], "no request leaves localhost");
    assert.deepEqual(seen.cspViolations, [], "nothing the page does violates its CSP");
    assert.deepEqual(seen.dialogs, []);
  },
});

Deno.test({
  name:
    "console: the workflows page shows each version, which one is current and its live workers; a promotion moves the mark",
  ...BROWSER_TEST,
  async fn() {
    await using s = await setUp("acme");
    const invoice = (version: number) =>
      defineWorkflow({
        name: "billing.invoice",
        version,
        input: z.object({ customer_id: z.string() }),
        handler: () => Promise.resolve(null),
      });
    await registerVersions(s.db.sql, new WorkflowRegistry([invoice(1)]).catalogVersions(), "it");
    await registerVersions(s.db.sql, new WorkflowRegistry([invoice(2)]).catalogVersions(), "it");
    await renewWorker(s.db.sql, "it-v1-a", ["billing.invoice@1"], 10 * 60 * SECOND);
    await renewWorker(s.db.sql, "it-v1-b", ["billing.invoice@1"], 10 * 60 * SECOND);
    await renewWorker(s.db.sql, "it-canary", ["billing.invoice@2"], 10 * 60 * SECOND);
    const page = await s.browser.context.newPage();
    const seen = watch(page, s.api.url);
    await logIn(page, s.api.url, s.token);

    const rows = async () => {
      await page.locator("#workflows").waitFor();
      const cells = await page.locator("#workflows tbody tr").evaluateAll((trs) =>
        trs.map((tr) => [...tr.querySelectorAll("td")].slice(0, 4).map((td) => td.textContent))
      );
      return cells.filter((r) => r[0] === "billing.invoice");
    };
    await page.getByRole("link", { name: "Workflows" }).click();
    await page.waitForURL("**/console/workflows");
    assert.deepEqual(await rows(), [
      ["billing.invoice", "1", "current", "2"],
      ["billing.invoice", "2", "", "1"],
    ]);
    await screenshot(page, "workflows", true);

    const promoted = await runCommand("workflow", ["promote", "billing.invoice@2"], {
      DATABASE_URL: s.db.url,
      LOG_LEVEL: "warn",
    });
    assert.equal(promoted.code, 0, promoted.stderr);
    await page.reload();
    assert.deepEqual(await rows(), [
      ["billing.invoice", "1", "", "2"],
      ["billing.invoice", "2", "current", "1"],
    ]);

    assert.deepEqual(seen.foreignRequests, []);
    assert.deepEqual(seen.cspViolations, []);
  },
});

Deno.test({
  name:
    "console: the schedules page lists the tenant's schedules with their next occurrences and where each comes from",
  ...BROWSER_TEST,
  async fn() {
    await using s = await setUp("acme");
    const nightly = defineWorkflow({
      name: "reports.nightly",
      version: 1,
      input: z.object({ full: z.boolean() }),
      tenants: ["acme"],
      schedules: [{
        id: "nightly-report",
        cron: "30 2 * * *",
        timezone: "Europe/Paris",
        input: { full: true },
      }],
      handler: () => Promise.resolve(null),
    });
    await writeDeclaredSchedules(
      s.db.sql,
      new WorkflowRegistry([nightly]).catalogVersions(),
      silentLogger,
    );
    const res = await fetch(`${s.api.url}/v1/schedules`, {
      method: "POST",
      headers: { authorization: `Bearer ${s.token}`, "content-type": "application/json" },
      body: JSON.stringify({
        id: "every-15",
        workflow_ref: "echo",
        cron: "*/15 * * * *",
        overlap: "skip",
      }),
    });
    assert.equal(res.status, 201, await res.text());
    const page = await s.browser.context.newPage();
    const seen = watch(page, s.api.url);
    await logIn(page, s.api.url, s.token);
    await page.getByRole("link", { name: "Schedules" }).click();
    await page.waitForURL("**/console/schedules");
    await page.locator("#schedules").waitFor();
    const rows = await page.locator("#schedules tbody tr").evaluateAll((trs) =>
      trs.map((tr) => [...tr.querySelectorAll("td")].map((td) => td.textContent ?? ""))
    );
    assert.deepEqual(rows.map((r) => [r[0], r[1], r[5]]), [
      ["every-15", "echo", "API"],
      ["nightly-report", "reports.nightly@1", "definition reports.nightly@1"],
    ]);
    assert.equal(rows[0][3].match(/\d\d:\d\d:00Z/g)?.length, 3, rows[0][3]);
    assert.match(rows[1][2], /30 2 \* \* \* Europe\/Paris/);
    await screenshot(page, "schedules", true);
    assert.deepEqual(seen.foreignRequests, []);
    assert.deepEqual(seen.cspViolations, []);
  },
});

Deno.test({
  name: "console: a run whose dispatch key and input are markup is shown as text",
  ...BROWSER_TEST,
  async fn() {
    await using s = await setUp("hostile");
    const key = `${SCRIPT}${IMG}`;
    const runId = await s.admit({
      workflow_ref: "echo",
      dispatch_key: key,
      goal_id: IMG,
      input: { note: SCRIPT, attr: IMG },
    });
    const page = await s.browser.context.newPage();
    const seen = watch(page, s.api.url);
    await logIn(page, s.api.url, s.token);

    const onlyOwnScript = async () => {
      const scripts = page.locator("script");
      assert.equal(await scripts.count(), 1, "no injected script element");
      assert.equal(await scripts.getAttribute("src"), "/console/app.js");
      assert.equal(await page.locator("img").count(), 0, "no injected img element");
      assert.equal(await page.locator("iframe, object, embed, svg").count(), 0);
    };

    // The list, filtered by the hostile key (through the form, as typed).
    await page.getByLabel("Dispatch key").fill(key);
    await page.getByRole("button", { name: "Filter" }).click();
    await page.waitForURL((u) => u.searchParams.get("dispatch_key") === key);
    await page.locator("body[data-loaded=true]").waitFor();
    const cell = page.locator("#runs tbody tr .dispatch-key");
    assert.equal(await cell.textContent(), key);
    assert.ok(await cell.isVisible());
    await onlyOwnScript();

    // The run page: key, goal and input as text.
    await page.getByRole("link", { name: runId }).click();
    await page.waitForURL(`**/console/runs/${runId}`);
    await page.locator("#run-input").waitFor();
    assert.equal(await page.locator("#dispatch-key").textContent(), key);
    assert.deepEqual(JSON.parse(await page.locator("#run-input").textContent() ?? ""), {
      note: SCRIPT,
      attr: IMG,
    });
    assert.ok(await page.getByText(SCRIPT).first().isVisible());
    await onlyOwnScript();

    assert.deepEqual(seen.dialogs, [], "no dialog fired");
    assert.deepEqual(seen.foreignRequests, []);
    assert.deepEqual(seen.cspViolations, []);
  },
});

Deno.test({
  name: "console: an open run's page follows it live, queued to running to succeeded, no reload",
  ...BROWSER_TEST,
  async fn() {
    await using s = await setUp("live");
    // No worker yet: it waits, queued.
    // Long enough to be seen running while its stream is still open.
    const runId = await s.admit({ workflow_ref: "sleep", input: { ms: 3000 } });
    const page = await s.browser.context.newPage();
    const seen = watch(page, s.api.url);
    await logIn(page, s.api.url, s.token);
    await page.goto(`${s.api.url}/console/runs/${runId}`);
    await page.locator("#run-status [data-status=queued]").waitFor();
    await page.locator("#live[data-state=live]").waitFor();
    assert.match(await page.locator("#live").textContent() ?? "", /Live/);
    // Gone after a reload: what tells this page was updated in place.
    await page.evaluate("document.body.dataset.mark = 'never reloaded'");

    const worker = new PoimenProcess("worker", { DATABASE_URL: s.db.url, WORKER_POLL_MS: "100" });
    try {
      await page.locator("#run-status [data-status=running]").waitFor({ timeout: LONG });
      await page.locator("#run-status [data-status=succeeded]").waitFor({ timeout: LONG });
    } finally {
      await worker.stop();
    }
    assert.equal(await page.locator("body[data-mark='never reloaded']").count(), 1);
    assert.match(await page.locator("#events").textContent() ?? "", /run\.succeeded/);
    await page.locator("#live[data-state=final]").waitFor();
    assert.equal(await page.locator("#live-refresh").isVisible(), false);
    assert.equal(await page.locator("#message").isVisible(), false);

    assert.deepEqual(seen.foreignRequests, []);
    assert.deepEqual(seen.cspViolations, []);
  },
});

Deno.test({
  name: "console: with its stream refused, a run's page still shows the run and says to reload",
  ...BROWSER_TEST,
  async fn() {
    await using s = await setUp("unlive");
    const runId = await s.admit({ workflow_ref: "echo", input: { live: false } });
    const page = await s.browser.context.newPage();
    const seen = watch(page, s.api.url);
    await logIn(page, s.api.url, s.token);
    const LIVE = "**/console/live/runs/**";
    const shownOff = async (why: RegExp) => {
      await page.locator("#run-status [data-status=queued]").waitFor();
      await page.locator("#live[data-state=off]").waitFor();
      const text = await page.locator("#live").textContent() ?? "";
      assert.match(text, /Not live/);
      assert.match(text, why);
      assert.ok(await page.locator("#live-refresh").isVisible());
      assert.equal(await page.locator("#message").isVisible(), false);
    };

    // The API is busy (all its watcher slots taken).
    await page.route(LIVE, (route) =>
      route.fulfill({
        status: 503,
        headers: { "retry-after": "1" },
        contentType: "application/problem+json",
        body: JSON.stringify({ title: "Server busy", status: 503, detail: "retry later" }),
      }));
    await page.goto(`${s.api.url}/console/runs/${runId}`);
    await shownOff(/Server busy/);
    await page.unrouteAll();

    // Blocked on the way (a proxy, an extension).
    await page.route(LIVE, (route) => route.abort());
    await page.reload();
    await shownOff(/could not be opened/);
    await page.unrouteAll();

    // A browser that cannot read a stream.
    await page.addInitScript({ content: "delete globalThis.ReadableStream;" });
    await page.reload();
    await shownOff(/cannot read a stream/);

    // What it did before it was live: the run changes, the page stays as
    // loaded, and Reload shows the change.
    const worker = new PoimenProcess("worker", { DATABASE_URL: s.db.url, WORKER_POLL_MS: "100" });
    try {
      await waitFor("the run succeeded", async () => await s.status(runId) === "succeeded", LONG);
    } finally {
      await worker.stop();
    }
    assert.equal(await page.locator("#run-status [data-status=queued]").count(), 1);
    await page.locator("#live-refresh").click();
    await page.locator("#run-status [data-status=succeeded]").waitFor();
    await page.locator("#live[data-state=final]").waitFor();

    assert.deepEqual(seen.foreignRequests, []);
    assert.deepEqual(seen.cspViolations, []);
  },
});

Deno.test({
  name:
    "console: a person sends a run a signal from its page: 201, then 200 for the same id, 422 refused, bad JSON not sent, 409 once the run ended",
  ...BROWSER_TEST,
  async fn() {
    await using s = await setUp("signals");
    // No worker: the run stays queued, and its mailbox keeps the signals.
    const runId = await s.admit({ workflow_ref: "echo", input: { order: 7 } });
    const page = await s.browser.context.newPage();
    const seen = watch(page, s.api.url);
    await logIn(page, s.api.url, s.token);
    await page.goto(`${s.api.url}/console/runs/${runId}`);
    await page.locator("#run-status [data-status=queued]").waitFor();

    const outcome = page.locator("#signal-outcome");
    const send = async (name: string, payload: string, signalId: string, expect: string) => {
      await page.getByLabel("Name", { exact: true }).fill(name);
      await page.getByLabel("Payload (JSON)").fill(payload);
      await page.getByLabel(/^Signal id/).fill(signalId);
      await page.getByRole("button", { name: "Send signal" }).click();
      await page.locator(`#signal-outcome[data-outcome=${expect}]`).waitFor({ timeout: LONG });
      return await outcome.textContent() ?? "";
    };
    const stored = async () =>
      (await s.db.sql<{ n: number }[]>`
        select count(*)::int as n from run_signals where run_id = ${runId}`)[0].n;

    // A new signal: 201, and its event reloads the page, which keeps saying so.
    const payload = JSON.stringify({ ok: true, note: SCRIPT });
    let said = await send("approval", payload, "sig-1", "sent");
    assert.match(
      said,
      /^Sent \(201\): signal approval, id sig-1, kept until a wait takes it; the run is queued$/,
    );
    await page.locator("#events", { hasText: "signal.received" }).waitFor({ timeout: LONG });
    assert.equal(await outcome.getAttribute("data-http-status"), "201");
    assert.equal(await stored(), 1);

    // The same signal_id again: a replay, nothing stored.
    said = await send("approval", '{"ok": false}', "sig-1", "replayed");
    assert.match(said, /^Already sent \(200\)/);
    assert.equal(await stored(), 1);

    // A name the API refuses: 422, with its reason.
    said = await send("a#b", "{}", "", "invalid");
    assert.equal(await outcome.getAttribute("data-http-status"), "422");
    assert.match(said, /^Invalid \(422\): .*name/);

    // Not JSON: never sent.
    said = await send("approval", "{ok: yes", "", "invalid");
    assert.match(said, /^Not sent: the payload is not JSON/);
    assert.equal(await outcome.getAttribute("data-http-status"), "0");
    assert.equal(await stored(), 1);

    // The run ends while the page, not following it (stream blocked), still
    // offers the form: 409, said as such.
    await page.route("**/console/live/runs/**", (route) => route.abort());
    await page.reload();
    await page.locator("#live[data-state=off]").waitFor();
    const cancelled = await fetch(`${s.api.url}/v1/runs/${runId}/cancel`, {
      method: "POST",
      headers: { authorization: `Bearer ${s.token}` },
    });
    assert.equal(cancelled.status, 200, await cancelled.text());
    assert.equal(await s.status(runId), "cancelled");
    said = await send("approval", "{}", "", "refused");
    assert.match(said, /^Refused \(409\): the run is finished/);
    assert.equal(await outcome.getAttribute("data-http-status"), "409");
    assert.equal(await stored(), 1);

    assert.equal(await page.locator("script").count(), 1, "no injected script element");
    assert.deepEqual(seen.dialogs, [], "no dialog fired");
    assert.deepEqual(seen.foreignRequests, []);
    assert.deepEqual(seen.cspViolations, []);
  },
});
