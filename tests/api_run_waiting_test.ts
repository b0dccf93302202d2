/**
 * `waiting_for` of GET /v1/runs/{run_id}, in process on a real Postgres: a
 * queued run says what it waits for — a worker hosting its version, its
 * schedule, or a free slot — and any other run says null. Only that GET
 * carries it.
 */
import assert from "node:assert/strict";
import client from "prom-client";
import { freshDatabase } from "./support/db.ts";
import { silentLogger } from "../core/log.ts";
import { Admission } from "../admission/admit.ts";
import { catalogOf } from "./support/catalog.ts";
import { createApp } from "../api/app.ts";
import { Authenticator } from "../api/auth.ts";
import { hashToken, newToken } from "../contracts/tokens.ts";
import { createApiMetrics } from "../api/metrics.ts";
import { loadConsoleAssets } from "../api/console/assets.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import { renewWorker } from "../db/catalog.ts";
import { Run } from "../contracts/runs.ts";

Deno.test("GET /v1/runs/{id}: waiting_for says what a queued run waits for", async (t) => {
  const db = await freshDatabase();
  const sql = db.sql;
  try {
    const app = createApp({
      sql,
      admission: new Admission(sql, catalogOf(), { maxBatch: 8, maxConcurrent: 2 }),
      auth: new Authenticator(sql, 30_000),
      metrics: createApiMetrics(new client.Registry()),
      log: silentLogger,
      bodyLimit: 65536,
      consoleAssets: loadConsoleAssets(),
    });
    const token = newToken();
    await insertTenant(sql, "acme");
    await insertToken(sql, await hashToken(token), {
      kind: "tenant",
      tenant_id: "acme",
      name: "a",
    });
    const other = newToken();
    await insertTenant(sql, "globex");
    await insertToken(sql, await hashToken(other), {
      kind: "tenant",
      tenant_id: "globex",
      name: "g",
    });
    const call = async (path: string, init: RequestInit = {}, bearer = token) => {
      const r = await app.request(path, {
        ...init,
        headers: { authorization: `Bearer ${bearer}`, "content-type": "application/json" },
      });
      return { status: r.status, body: await r.json() };
    };
    const admit = async (body: Record<string, unknown> = {}) => {
      const r = await call("/v1/runs", {
        method: "POST",
        body: JSON.stringify({ workflow_ref: "echo", ...body }),
      });
      assert.equal(r.status, 201, JSON.stringify(r.body));
      return Run.parse(r.body);
    };
    const waiting = async (runId: string) => {
      const r = await call(`/v1/runs/${runId}`);
      assert.equal(r.status, 200, JSON.stringify(r.body));
      return Run.parse(r.body).waiting_for;
    };

    const due = await admit();
    const ref = `${due.workflow}@${due.workflow_version}`;
    const later = await admit({ run_after: new Date(Date.now() + 3600_000).toISOString() });

    await t.step("no live worker hosts its version: worker", async () => {
      const expected = {
        reason: "worker",
        workflow: ref,
        detail: `no running worker hosts ${ref}`,
      };
      assert.deepEqual(await waiting(due.run_id), expected);
      // Before its schedule too: without a worker it will not start when due either.
      assert.deepEqual(await waiting(later.run_id), expected);
    });

    await t.step("a worker whose row expired hosts nothing", async () => {
      await renewWorker(sql, "dead-worker", [ref], 1);
      await sql`update workflow_workers set expires_at = now() - interval '1 second'`;
      assert.equal((await waiting(due.run_id))?.reason, "worker");
      // Another version hosted is not this one.
      await renewWorker(
        sql,
        "other-worker",
        [`${due.workflow}@${due.workflow_version + 1}`],
        60_000,
      );
      assert.equal((await waiting(due.run_id))?.reason, "worker");
    });

    await t.step("hosted and due: slot", async () => {
      await renewWorker(sql, "live-worker", ["other@1", ref], 60_000);
      assert.deepEqual(await waiting(due.run_id), {
        reason: "slot",
        detail: "due; waiting for a free worker slot",
      });
    });

    await t.step("hosted and not due yet: schedule, until its run_after", async () => {
      const w = await waiting(later.run_id);
      assert.equal(w?.reason, "schedule");
      assert.equal(w?.until, later.run_after);
      assert.ok(w?.detail.includes(later.run_after), w?.detail);
      assert.equal(w?.workflow, undefined);
    });

    await t.step("a run that is not queued: null", async () => {
      const cancelled = await call(`/v1/runs/${due.run_id}/cancel`, { method: "POST" });
      assert.equal(cancelled.status, 200);
      assert.equal(cancelled.body.status, "cancelled");
      assert.equal(await waiting(due.run_id), null);
      await sql`update runs set status = 'succeeded', finished_at = now(), result = '1'
                 where run_id = ${later.run_id}`;
      assert.equal(await waiting(later.run_id), null);
    });

    await t.step("only GET /v1/runs/{id} carries it, tenant-scoped", async () => {
      const queued = await admit();
      assert.equal("waiting_for" in queued, false, "not on admission");
      const list = await call(`/v1/runs?limit=5`);
      assert.equal(list.status, 200);
      for (const r of list.body.runs) assert.equal("waiting_for" in r, false, "not on the list");
      assert.equal((await waiting(queued.run_id))?.reason, "slot");
      assert.equal((await call(`/v1/runs/${queued.run_id}`, {}, other)).status, 404);
    });
  } finally {
    await db.drop();
  }
});
