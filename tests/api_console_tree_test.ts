/**
 * A run's tree on its console page (api/console/tree.tsx), rendered on the
 * server (`app.request()`) on a real Postgres: a root lists its children
 * by name with their status (a cancelled one too) and no parent; a child
 * links to its parent, a grandchild to its parent and its root; a detached
 * child says so; a child's name that is markup is shown as text; a run
 * with neither parent nor children has no tree; more children than a page
 * shows are a link to the runs list by parent, whose pages keep the filter.
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
import { requestCancel } from "../db/cancellation.ts";
import { ChildAdmission } from "../worker/child_runs.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase } from "./support/db.ts";

const TENANT = "acme";
const SCRIPT = "<script>alert(1)</script>";

Deno.test("console tree: parent, root, detached, children with their status, and the link to the rest", async () => {
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
  const page = async (path: string) => {
    const r = await app.request(path, { headers: { authorization: `Bearer ${token}` } });
    const text = await r.text();
    assert.equal(r.status, 200, text);
    return text;
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
  try {
    const lone = await root();
    assert.ok(!(await page(`/console/fragments/runs/${lone}`)).includes('id="run-tree"'));

    const top = await root();
    const a = await child(top, "a");
    const b = await child(top, `b ${SCRIPT}`);
    const d = await child(top, "d", true);
    const ax = await child(a, "x");
    await requestCancel(sql, TENANT, b);

    const topPage = await page(`/console/fragments/runs/${top}`);
    assert.match(topPage, /id="run-tree"/);
    assert.match(topPage, /— \(a root\)/);
    const rows = [
      ...topPage.matchAll(
        /<tr data-run-id="([^"]+)"><td class="mono">([^<]*)<\/td><td><a[^>]*>[^<]*<\/a><\/td><td><span[^>]*data-status="(\w+)"/g,
      ),
    ].map((m) => [m[1], m[2], m[3]]);
    assert.deepEqual(
      rows.sort(),
      [
        [a, "a", "queued"],
        [b, "b &lt;script&gt;alert(1)&lt;/script&gt;", "cancelled"],
        [d, "d", "queued"],
      ].sort(),
    );
    assert.ok(!topPage.includes(SCRIPT), "a child's name is text, not markup");
    assert.ok(!topPage.includes('id="run-children-more"'));

    const aPage = await page(`/console/fragments/runs/${a}`);
    assert.match(aPage, new RegExp(`id="run-parent" href="/console/runs/${top}"`));
    assert.ok(!aPage.includes('id="run-root"'), "a child of a root: its parent is its root");
    assert.ok(!aPage.includes('id="run-detached"'));
    assert.match(aPage, new RegExp(`<tr data-run-id="${ax}">`));
    const axPage = await page(`/console/fragments/runs/${ax}`);
    assert.match(axPage, new RegExp(`id="run-parent" href="/console/runs/${a}"`));
    assert.match(axPage, new RegExp(`id="run-root" href="/console/runs/${top}"`));
    assert.match(axPage, /No children\./);
    assert.match(await page(`/console/fragments/runs/${d}`), /id="run-detached"/);

    // More children than the page lists: a link to the runs list by parent.
    const many = await root();
    await Promise.all(Array.from({ length: 51 }, (_, i) => child(many, `c${i}`)));
    const manyPage = await page(`/console/fragments/runs/${many}`);
    assert.equal([...manyPage.matchAll(/<tr data-run-id=/g)].length, 50);
    assert.match(
      manyPage,
      new RegExp(`id="run-children-more" href="/console/runs\\?parent_run_id=${many}"`),
    );
    const list = await page(`/console/fragments/runs?parent_run_id=${many}&limit=20`);
    assert.match(list, new RegExp(`id="older" href="/console/runs\\?parent_run_id=${many}&amp;`));
  } finally {
    await db.drop();
  }
});
