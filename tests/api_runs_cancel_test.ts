/**
 * `POST /v1/runs/{id}/cancel` cascades (api/runs.ts, db/cascade.ts), in
 * process on a real Postgres: cancelling a root cancels its tree (a child
 * and a grandchild), not a detached child; cancelling a run that already
 * succeeded is a 409 and leaves its children alone.
 */
import assert from "node:assert/strict";
import client from "prom-client";
import { silentLogger } from "../core/log.ts";
import { Admission } from "../admission/admit.ts";
import { createApp } from "../api/app.ts";
import { Authenticator } from "../api/auth.ts";
import { hashToken, newToken } from "../contracts/tokens.ts";
import { createApiMetrics } from "../api/metrics.ts";
import { loadConsoleAssets } from "../api/console/assets.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import { ChildAdmission } from "../worker/child_runs.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase } from "./support/db.ts";

const TENANT = "acme";

Deno.test("api cancel: a root's cancel cancels its tree, not a detached child; a finished root's is a 409", async () => {
  const db = await freshDatabase();
  const { sql } = db;
  const token = newToken();
  await insertTenant(sql, TENANT);
  await insertToken(sql, await hashToken(token), { kind: "tenant", tenant_id: TENANT, name: "a" });
  const admission = new Admission(sql, catalogOf(), { maxBatch: 16, maxConcurrent: 2 });
  const app = createApp({
    sql,
    admission,
    auth: new Authenticator(sql, 30_000),
    metrics: createApiMetrics(new client.Registry()),
    log: silentLogger,
    bodyLimit: 4096,
    consoleAssets: loadConsoleAssets(),
  });
  const call = async (path: string, method = "GET") => {
    const r = await app.request(path, { method, headers: { authorization: `Bearer ${token}` } });
    return { status: r.status, body: await r.json() };
  };
  const kids = new ChildAdmission(sql, silentLogger, () => {});
  const root = async () =>
    (await admission.admit({ workflow_ref: "echo", input: 0 }, {
      tenantId: TENANT,
      source: "test",
      entry: "http",
    })).run.run_id;
  const child = async (parent: string, name: string, detached = false) =>
    (await kids.start({ tenant_id: TENANT, run_id: parent }, {
      name,
      workflowRef: "echo@1",
      input: 1,
      detached,
    })).run_id;
  const status = async (id: string) => (await call(`/v1/runs/${id}`)).body.status;
  try {
    const top = await root();
    const a = await child(top, "a");
    const ax = await child(a, "x");
    const d = await child(top, "d", true);
    const dx = await child(d, "x");
    const cancelled = await call(`/v1/runs/${top}/cancel`, "POST");
    assert.equal(cancelled.status, 200, JSON.stringify(cancelled.body));
    assert.equal(cancelled.body.status, "cancelled");
    assert.equal(await status(a), "cancelled");
    assert.equal(await status(ax), "cancelled");
    assert.equal(await status(d), "queued");
    assert.equal(await status(dx), "queued");
    assert.equal((await call(`/v1/runs/${d}`)).body.detached, true);
    assert.equal((await call(`/v1/runs/${a}`)).body.detached, false);

    // A root that succeeded: 409, its child left alone.
    const done = await root();
    const kid = await child(done, "k");
    await sql`update runs set status = 'succeeded', finished_at = now()
               where tenant_id = ${TENANT} and run_id = ${done}`;
    const refused = await call(`/v1/runs/${done}/cancel`, "POST");
    assert.equal(refused.status, 409);
    assert.equal(refused.body.run_status, "succeeded");
    assert.equal(await status(kid), "queued");
  } finally {
    await db.drop();
  }
});
