/**
 * The console's schedules page, rendered on the server (`app.request()`) on a
 * real Postgres: a tenant's schedules with their next occurrences (UTC),
 * policies, origin (declared by a definition, or made through the API) and
 * last run; a paused one says so and lists no occurrence; another tenant's
 * are never shown; the fragment is behind the bearer tokens, the shell is not.
 */
import assert from "node:assert/strict";
import client from "prom-client";
import { z } from "zod";
import { silentLogger } from "../core/log.ts";
import { nextOccurrence } from "../core/cron.ts";
import { Admission } from "../admission/admit.ts";
import { createApp } from "../api/app.ts";
import { Authenticator } from "../api/auth.ts";
import { CONSOLE_CSP } from "../api/console/console_routes.tsx";
import { hashToken, newToken } from "../contracts/tokens.ts";
import { createApiMetrics } from "../api/metrics.ts";
import { loadConsoleAssets } from "../api/console/assets.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import { writeDeclaredSchedules } from "../worker/declared_schedules.ts";
import { defineWorkflow } from "../workflows/define.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase } from "./support/db.ts";

const report = defineWorkflow({
  name: "echo",
  version: 1,
  input: z.unknown(),
  schedules: [
    { id: "nightly", cron: "30 2 * * *", timezone: "Europe/Paris", input: {}, tenants: ["acme"] },
  ],
  handler: () => null,
});

/** The schedule rows of a fragment: id, origin, paused, and the next occurrences listed. */
function rows(html: string) {
  return [
    ...html.matchAll(
      /<tr data-schedule="([^"]+)" data-origin="(\w+)" data-paused="(\w+)">(.*?)<\/tr>/g,
    ),
  ].map((m) => ({
    id: m[1],
    origin: m[2],
    paused: m[3] === "true",
    next: [...m[4].matchAll(/<time datetime="([^"]+)"/g)].map((t) => t[1]),
    html: m[4],
  }));
}

Deno.test("console schedules: the tenant's schedules with their next occurrences and origin, never another tenant's", async () => {
  const db = await freshDatabase();
  const { sql } = db;
  try {
    const tokens: Record<string, string> = {};
    for (const t of ["acme", "globex"]) {
      tokens[t] = newToken();
      await insertTenant(sql, t);
      await insertToken(sql, await hashToken(tokens[t]), { kind: "tenant", tenant_id: t, name: t });
    }
    const app = createApp({
      sql,
      admission: new Admission(sql, catalogOf(), { maxBatch: 16, maxConcurrent: 2 }),
      auth: new Authenticator(sql, 30_000),
      metrics: createApiMetrics(new client.Registry()),
      log: silentLogger,
      bodyLimit: 4096,
      consoleAssets: loadConsoleAssets(),
    });
    const call = (method: string, path: string, tenant?: string, body?: unknown) =>
      app.request(path, {
        method,
        body: body === undefined ? undefined : JSON.stringify(body),
        headers: {
          ...(tenant ? { authorization: `Bearer ${tokens[tenant]}` } : {}),
          "content-type": "application/json",
        },
      });
    const page = async (tenant: string) => {
      const r = await call("GET", "/console/fragments/schedules", tenant);
      assert.equal(r.status, 200);
      assert.equal(r.headers.get("content-security-policy"), CONSOLE_CSP);
      return await r.text();
    };

    const empty = await page("acme");
    assert.ok(empty.includes('id="no-schedules"'), empty);

    await writeDeclaredSchedules(
      sql,
      new WorkflowRegistry([report]).catalogVersions(),
      silentLogger,
    );
    for (
      const body of [
        { id: "every-15", workflow_ref: "echo", cron: "*/15 * * * *", overlap: "skip" },
        { id: "quiet", workflow_ref: "echo", cron: "0 9 * * 1", paused: true },
      ]
    ) {
      assert.equal((await call("POST", "/v1/schedules", "acme", body)).status, 201);
    }
    assert.equal(
      (await call("POST", "/v1/schedules", "globex", {
        id: "globex-only",
        workflow_ref: "echo",
        cron: "0 * * * *",
      })).status,
      201,
    );

    const acme = rows(await page("acme"));
    assert.deepEqual(
      acme.map((r) => [r.id, r.origin, r.paused, r.next.length]),
      [["every-15", "api", false, 3], ["nightly", "definition", false, 3], [
        "quiet",
        "api",
        true,
        0,
      ]],
    );
    // The occurrences listed are the schedule's, in order.
    const [first, second, third] = acme[0].next.map((t) => new Date(t));
    assert.equal(first.getUTCMinutes() % 15, 0);
    assert.deepEqual(nextOccurrence("*/15 * * * *", "UTC", first), second);
    assert.deepEqual(nextOccurrence("*/15 * * * *", "UTC", second), third);
    assert.ok(acme[0].html.includes("skip / skip"), acme[0].html);
    assert.ok(acme[1].html.includes("Europe/Paris"), acme[1].html);
    assert.ok(acme[1].html.includes("echo@1"), "the declaring version is named");
    assert.ok(acme[2].html.includes("paused"));
    assert.ok(!acme.some((r) => r.id === "globex-only"));
    assert.deepEqual(rows(await page("globex")).map((r) => r.id), ["globex-only"]);

    assert.equal((await call("GET", "/console/fragments/schedules")).status, 401);
    const shell = await call("GET", "/console/schedules");
    assert.equal(shell.status, 200);
    const text = await shell.text();
    assert.ok(text.includes('data-fragment="/console/fragments/schedules"'), text);
    assert.ok(text.includes('href="/console/schedules"'), "in the navigation");
    assert.ok(!text.includes("nightly"), "a shell carries no tenant data");
  } finally {
    await db.drop();
  }
});
