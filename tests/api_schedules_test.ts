/**
 * `/v1/schedules` through the app against a real Postgres: create (201,
 * 409 on a taken id, 422 on a bad cron or zone), read with its next
 * occurrences, pause and resume, backfill twice (one run per occurrence),
 * delete; another tenant's schedule is a 404; a run request with a
 * `schedule:` dispatch key is a 422; an occurrence's run shows its
 * schedule_id and scheduled_for. A schedule a definition declares answers
 * `origin: "definition"`, and may only be paused and resumed here.
 */
import assert from "node:assert/strict";
import client from "prom-client";
import { silentLogger } from "../core/log.ts";
import { PROBLEM_BASE } from "../core/errors.ts";
import { Admission } from "../admission/admit.ts";
import { createApp } from "../api/app.ts";
import { Authenticator } from "../api/auth.ts";
import { hashToken, newToken } from "../contracts/tokens.ts";
import { createApiMetrics } from "../api/metrics.ts";
import { loadConsoleAssets } from "../api/console/assets.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase } from "./support/db.ts";
import type { Sql } from "../db/pool.ts";
import { writeDeclaredSchedules } from "../worker/declared_schedules.ts";
import { defineWorkflow } from "../workflows/define.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { z } from "zod";

/** The app over `sql` with tenants acme and globex, and how to call it as either. */
async function api(sql: Sql) {
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
  const call = (method: string, path: string, body?: unknown, tenant = "acme") =>
    app.request(path, {
      method,
      body: body === undefined ? undefined : JSON.stringify(body),
      headers: { authorization: `Bearer ${tokens[tenant]}`, "content-type": "application/json" },
    });
  const problem = async (r: Response, status: number, type: string) => {
    const p = await r.json();
    assert.equal(r.status, status, JSON.stringify(p));
    assert.equal(p.type, PROBLEM_BASE + type);
    return p;
  };

  return { call, problem };
}

Deno.test("api schedules: create, read, pause, resume, backfill, delete; schedule: keys are reserved", async () => {
  const db = await freshDatabase();
  const { sql } = db;
  try {
    const { call, problem } = await api(sql);

    const nightly = {
      id: "nightly",
      workflow_ref: "echo",
      cron: "30 2 * * *",
      timezone: "Europe/Paris",
      input: { report: true },
      overlap: "skip",
    };
    const created = await call("POST", "/v1/schedules", nightly);
    assert.equal(created.status, 201);
    assert.equal(created.headers.get("location"), "/v1/schedules/nightly");
    const s = await created.json();
    assert.equal(s.catchup, "skip");
    assert.equal(s.paused, false);
    assert.equal(s.next_occurrences.length, 3);
    // 02:30 in Paris is 00:30 or 01:30 UTC, whatever the season.
    assert.ok(s.next_occurrences.every((t: string) => /T0[01]:30:00\.000Z$/.test(t)), s);
    await problem(await call("POST", "/v1/schedules", nightly), 409, "schedule-exists");
    const bad = await problem(
      await call("POST", "/v1/schedules", { ...nightly, id: "bad", cron: "* * * * * *" }),
      422,
      "validation",
    );
    assert.equal(bad.errors[0].path, "cron");
    const zone = await problem(
      await call("POST", "/v1/schedules", { ...nightly, id: "bad", timezone: "Mars/Olympus" }),
      422,
      "validation",
    );
    assert.equal(zone.errors[0].path, "timezone");

    // Another tenant sees none of it.
    await problem(
      await call("GET", "/v1/schedules/nightly", undefined, "globex"),
      404,
      "not-found",
    );
    assert.deepEqual(await (await call("GET", "/v1/schedules", undefined, "globex")).json(), {
      schedules: [],
      next_cursor: null,
    });
    const list = await (await call("GET", "/v1/schedules")).json();
    assert.deepEqual(list.schedules.map((x: { id: string }) => x.id), ["nightly"]);

    const paused = await (await call("PATCH", "/v1/schedules/nightly", { paused: true })).json();
    assert.equal(paused.paused, true);
    assert.deepEqual(paused.next_occurrences, []);
    const resumed = await (await call("PATCH", "/v1/schedules/nightly", { paused: false })).json();
    assert.deepEqual(resumed.next_occurrences, s.next_occurrences);
    await problem(
      await call("PATCH", "/v1/schedules/nightly", { cron: "nope" }),
      422,
      "validation",
    );

    // The spring-forward night: 02:30 does not exist on the 29th, it fires at 03:00 CEST.
    const range = { from: "2026-03-28T00:00:00Z", to: "2026-03-30T12:00:00Z" };
    const first = await call("POST", "/v1/schedules/nightly/backfill", range);
    assert.equal(first.status, 200);
    const once = (await first.json()).occurrences;
    assert.deepEqual(once.map((o: { scheduled_for: string }) => o.scheduled_for), [
      "2026-03-28T01:30:00.000Z",
      "2026-03-29T01:00:00.000Z",
      "2026-03-30T00:30:00.000Z",
    ]);
    assert.ok(once.every((o: { created: boolean }) => o.created));
    const again = (await (await call("POST", "/v1/schedules/nightly/backfill", range)).json())
      .occurrences;
    assert.deepEqual(again, once.map((o: object) => ({ ...o, created: false })));
    await problem(
      await call("POST", "/v1/schedules/nightly/backfill", { from: range.to, to: range.from }),
      422,
      "validation",
    );

    const run = await (await call("GET", `/v1/runs/${once[1].run_id}`)).json();
    assert.equal(run.schedule_id, "nightly");
    assert.equal(run.scheduled_for, "2026-03-29T01:00:00.000Z");
    assert.equal(run.dispatch_key, "schedule:nightly:2026-03-29T01:00:00.000Z");
    assert.equal(run.source, "schedule:nightly");
    assert.deepEqual(run.input, { report: true });

    // No caller may take an occurrence's key, in the body or the header.
    const taken = await problem(
      await call("POST", "/v1/runs", { workflow_ref: "echo", dispatch_key: run.dispatch_key }),
      422,
      "validation",
    );
    assert.equal(taken.errors[0].path, "dispatch_key");

    assert.equal((await call("DELETE", "/v1/schedules/nightly")).status, 204);
    await problem(await call("DELETE", "/v1/schedules/nightly"), 404, "not-found");
    await problem(await call("GET", "/v1/schedules/nightly"), 404, "not-found");
    // Its runs stay.
    assert.equal((await call("GET", `/v1/runs/${once[0].run_id}`)).status, 200);
  } finally {
    await db.drop();
  }
});

Deno.test("api schedules: a declared schedule says so, may be paused and resumed, and is neither changed nor deleted here", async () => {
  const db = await freshDatabase();
  const { sql } = db;
  try {
    const { call, problem } = await api(sql);
    const report = defineWorkflow({
      name: "echo",
      version: 1,
      input: z.unknown(),
      schedules: [{ id: "nightly", cron: "30 2 * * *", input: { full: true }, tenants: ["acme"] }],
      handler: () => null,
    });
    await writeDeclaredSchedules(
      sql,
      new WorkflowRegistry([report]).catalogVersions(),
      silentLogger,
    );
    assert.equal(
      (await call("POST", "/v1/schedules", { id: "mine", workflow_ref: "echo", cron: "0 * * * *" }))
        .status,
      201,
    );
    const list = (await (await call("GET", "/v1/schedules")).json()).schedules;
    assert.deepEqual(
      list.map((x: Record<string, unknown>) => [x.id, x.origin, x.declared_by, x.workflow_ref]),
      [["mine", "api", null, "echo"], ["nightly", "definition", "echo@1", "echo@1"]],
    );
    assert.equal(list[1].next_occurrences.length, 3);

    const refused = await problem(
      await call("PATCH", "/v1/schedules/nightly", { cron: "0 3 * * *", paused: true }),
      409,
      "schedule-declared",
    );
    assert.match(refused.detail, /declared by workflow echo@1/);
    await problem(await call("DELETE", "/v1/schedules/nightly"), 409, "schedule-declared");
    const paused = await call("PATCH", "/v1/schedules/nightly", { paused: true });
    assert.equal(paused.status, 200);
    assert.deepEqual((await paused.json()).next_occurrences, []);
    const resumed = await (await call("PATCH", "/v1/schedules/nightly", { paused: false })).json();
    assert.equal(resumed.paused, false);
    assert.equal(resumed.cron, "30 2 * * *");
    assert.equal(resumed.origin, "definition");
    assert.equal((await call("GET", "/v1/schedules/nightly")).status, 200, "still there");
    assert.equal((await call("DELETE", "/v1/schedules/mine")).status, 204);
  } finally {
    await db.drop();
  }
});
