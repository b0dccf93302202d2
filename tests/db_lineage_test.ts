/**
 * Run lineage (migrations 024, 025): a child admitted through the kernel
 * with its parent's lineage records parent and root, is found again by its
 * derived key (a replay, never a second run), and is listed by parent and
 * by root; `GET /v1/runs/{id}` shows the lineage and the children.
 */
import assert from "node:assert/strict";
import { Admission } from "../admission/admit.ts";
import { childDispatchKey } from "../contracts/runs.ts";
import { insertTenant } from "../db/auth.ts";
import { selectRuns } from "../db/runs.ts";
import { catalogOf } from "./support/catalog.ts";
import client from "prom-client";
import { silentLogger } from "../core/log.ts";
import { createApp } from "../api/app.ts";
import { Authenticator } from "../api/auth.ts";
import { createApiMetrics } from "../api/metrics.ts";
import { loadConsoleAssets } from "../api/console/assets.ts";
import { hashToken, newToken } from "../contracts/tokens.ts";
import { insertToken } from "../db/auth.ts";
import { freshDatabase } from "./support/db.ts";

Deno.test("lineage: children record parent and root, dedup by their derived key, list by parent and root", async () => {
  const db = await freshDatabase();
  const tenant = "lineage-1";
  try {
    await insertTenant(db.sql, tenant);
    const admission = new Admission(db.sql, catalogOf(), { maxBatch: 50, maxConcurrent: 1 });
    const http = { tenantId: tenant, source: "test", entry: "http" as const };
    const root = (await admission.admit({ workflow_ref: "echo", input: 0 }, http)).run;
    assert.equal(root.parent_run_id, null);
    assert.equal(root.root_run_id, null);

    const childCtx = (parent: { run_id: string; root_run_id: string | null }) => ({
      tenantId: tenant,
      source: `run:${parent.run_id}`,
      entry: "child" as const,
      parent: { run_id: parent.run_id, root_run_id: parent.root_run_id ?? parent.run_id },
    });
    const admitChild = (parent: typeof root, name: string) =>
      admission.admit(
        { workflow_ref: "echo", input: name, dispatch_key: childDispatchKey(parent.run_id, name) },
        childCtx(parent),
      );
    const kids = await Promise.all(["a", "b", "c"].map((n) => admitChild(root, n)));
    for (const k of kids) {
      assert.equal(k.created, true);
      assert.equal(k.run.parent_run_id, root.run_id);
      assert.equal(k.run.root_run_id, root.run_id);
    }
    // A retried parent starting "b" again finds the child it started.
    const again = await admitChild(root, "b");
    assert.equal(again.created, false);
    assert.equal(again.run.run_id, kids[1].run.run_id);

    const grandchild = await admitChild(kids[0].run, "x");
    assert.equal(grandchild.run.parent_run_id, kids[0].run.run_id);
    assert.equal(grandchild.run.root_run_id, root.run_id);

    const ids = (rows: { run_id: string }[]) => rows.map((r) => r.run_id).sort();
    assert.deepEqual(
      ids(await selectRuns(db.sql, tenant, { parentRunId: root.run_id, limit: 10 })),
      ids(kids.map((k) => k.run)),
    );
    assert.deepEqual(
      ids(await selectRuns(db.sql, tenant, { rootRunId: root.run_id, limit: 10 })),
      ids([...kids.map((k) => k.run), grandchild.run]),
    );
    // Another tenant sees none of them.
    assert.equal(
      (await selectRuns(db.sql, "other", { rootRunId: root.run_id, limit: 10 })).length,
      0,
    );
    const [{ n }] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from runs where tenant_id = ${tenant}`;
    assert.equal(n, 5, "root, three children, one grandchild: nothing twice");

    // The API: lineage on each run, a parent's children, a root's tree.
    const token = newToken();
    await insertToken(db.sql, await hashToken(token), {
      kind: "tenant",
      tenant_id: tenant,
      name: "t",
    });
    const app = createApp({
      sql: db.sql,
      admission,
      auth: new Authenticator(db.sql, 30_000),
      metrics: createApiMetrics(new client.Registry()),
      log: silentLogger,
      bodyLimit: 4096,
      consoleAssets: loadConsoleAssets(),
    });
    const get = async (path: string) => {
      const r = await app.request(path, { headers: { authorization: `Bearer ${token}` } });
      const body = await r.json();
      assert.equal(r.status, 200, JSON.stringify(body));
      return body;
    };
    const top = await get(`/v1/runs/${root.run_id}`);
    assert.equal(top.parent_run_id, null);
    assert.equal(top.root_run_id, null);
    assert.deepEqual(
      top.children.runs.map((c: { dispatch_key: string }) => c.dispatch_key).sort(),
      ["a", "b", "c"].map((name) => childDispatchKey(root.run_id, name)),
    );
    assert.equal(top.children.next_cursor, null);
    const b = await get(`/v1/runs/${kids[1].run.run_id}`);
    assert.equal(b.parent_run_id, root.run_id);
    assert.equal(b.root_run_id, root.run_id);
    assert.deepEqual(b.children, { runs: [], next_cursor: null });
    const tree = await get(`/v1/runs?root_run_id=${root.run_id}`);
    assert.deepEqual(ids(tree.runs), ids([...kids.map((k) => k.run), grandchild.run]));
    // Children page on by cursor.
    const first = await get(`/v1/runs?parent_run_id=${root.run_id}&limit=2`);
    assert.equal(first.runs.length, 2);
    const rest = await get(
      `/v1/runs?parent_run_id=${root.run_id}&limit=2&cursor=${first.next_cursor}`,
    );
    assert.equal(rest.next_cursor, null);
    assert.deepEqual(ids([...first.runs, ...rest.runs]), ids(kids.map((k) => k.run)));
  } finally {
    await db.drop();
  }
});

Deno.test("lineage: a detached child is stored detached; every other run is not", async () => {
  const db = await freshDatabase();
  const tenant = "lineage-2";
  try {
    await insertTenant(db.sql, tenant);
    const admission = new Admission(db.sql, catalogOf(), { maxBatch: 50, maxConcurrent: 1 });
    const root = (await admission.admit({ workflow_ref: "echo", input: 0 }, {
      tenantId: tenant,
      source: "test",
      entry: "http",
    })).run;
    const child = (name: string, detached?: boolean) =>
      admission.admit(
        { workflow_ref: "echo", input: name, dispatch_key: childDispatchKey(root.run_id, name) },
        {
          tenantId: tenant,
          source: `run:${root.run_id}`,
          entry: "child",
          parent: { run_id: root.run_id, root_run_id: root.run_id, detached },
        },
      );
    const [d, a] = [await child("d", true), await child("a")];
    assert.equal(root.detached, false);
    assert.equal(d.run.detached, true);
    assert.equal(a.run.detached, false);
    const rows = await selectRuns(db.sql, tenant, { parentRunId: root.run_id, limit: 10 });
    assert.deepEqual(
      rows.map((r) => [r.run_id, r.detached]).sort(),
      [[d.run.run_id, true], [a.run.run_id, false]].sort(),
    );
  } finally {
    await db.drop();
  }
});
