import assert from "node:assert/strict";
import { z } from "zod";
import { Admission } from "../admission/admit.ts";
import { compileVersion, StaticCatalog, WorkflowCatalog } from "../admission/catalog.ts";
import { type PoimenError } from "../core/errors.ts";
import { silentLogger } from "../core/log.ts";
import { insertTenant } from "../db/auth.ts";
import { registerVersions, selectCatalog } from "../db/catalog.ts";
import { createPool } from "../db/pool.ts";
import { defineWorkflow } from "../workflows/define.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { freshDatabase } from "./support/db.ts";

const handler = () => Promise.resolve(null);
const order = defineWorkflow({
  name: "shop.order",
  version: 1,
  input: z.object({
    sku: z.string().regex(/^[A-Z]{3}-\d+$/),
    email: z.email(),
    lines: z.array(z.object({ qty: z.number().int().min(1) }).strict()).max(3),
  }),
  handler,
});

Deno.test("catalog: a failing input is reported per field under input, with readable messages", () => {
  const v = compileVersion(new WorkflowRegistry([order]).catalogVersions()[0]);
  assert.equal(v.validate({ sku: "ABC-1", email: "a@b.co", lines: [{ qty: 1 }] }), undefined);
  const errors = v.validate({
    sku: "abc",
    email: "nope",
    lines: [{ qty: 0 }, { qty: 1, extra: true }],
  });
  assert.deepEqual(errors, [
    { path: "input.sku", message: "does not match the pattern" },
    { path: "input.email", message: "must be a valid email" },
    { path: "input.lines[0].qty", message: "must be >= 1" },
    { path: "input.lines[1].extra", message: "is not allowed" },
  ]);
  assert.deepEqual(v.validate({ sku: "ABC-1", lines: [] }), [
    { path: "input.email", message: "is required" },
  ]);
});

Deno.test("catalog: name resolves to its current version (in a static set with none marked, the newest), name@version to that one, an unknown ref to nothing", () => {
  const versions = [1, 3, 2].map((version) =>
    defineWorkflow({ name: "w", version, input: z.unknown(), handler })
  );
  const catalog = new StaticCatalog(new WorkflowRegistry(versions).catalogVersions());
  assert.equal(catalog.resolve("w", "acme")?.version, 3);
  assert.equal(catalog.resolve("w@2", "acme")?.version, 2);
  assert.equal(catalog.resolve("w@4", "acme"), undefined);
  assert.equal(catalog.resolve("x", "acme"), undefined);
  assert.deepEqual(catalog.list("acme"), ["w@1", "w@2", "w@3"]);

  const marked = new StaticCatalog(
    new WorkflowRegistry(versions).catalogVersions().map((v) => ({
      ...v,
      current: v.version === 2,
    })),
  );
  assert.equal(marked.resolve("w", "acme")?.version, 2, "the current one, not the newest");
  assert.equal(marked.resolve("w@3", "acme")?.version, 3, "a newer one by its version");
});

Deno.test("catalog: a version registered without a NOTIFY reaching the API is found by the refresh an unknown workflow makes; admission pins it and takes its max attempts", async () => {
  const db = await freshDatabase();
  const catalog = new WorkflowCatalog(db.sql, {
    refreshMs: 3_600_000,
    // Listens on a pool no one notifies on: only the refresh on a miss can help.
    listen: () => createPool({ url: db.url, max: 1, applicationName: "catalog-test-listen" }),
    log: silentLogger,
    missRefreshMs: 0,
  });
  const admission = new Admission(db.sql, catalog, { maxBatch: 8, maxConcurrent: 1 });
  try {
    await insertTenant(db.sql, "acme");
    await catalog.start();
    assert.equal(catalog.resolve("shop.order", "acme"), undefined);
    const registry = new WorkflowRegistry([
      defineWorkflow({ ...order, maxAttempts: 7 }),
    ]);
    await registerVersions(db.sql, registry.catalogVersions(), "test");
    const ctx = { tenantId: "acme", source: "test", entry: "http" as const };
    const { run } = await admission.admit({
      workflow_ref: "shop.order",
      input: { sku: "ABC-1", email: "a@b.co", lines: [] },
    }, ctx);
    assert.equal(run.workflow_version, 1);
    assert.equal(run.max_attempts, 7);
    await assert.rejects(
      () => admission.admit({ workflow_ref: "shop.order", input: { sku: 1 } }, ctx),
      (e: PoimenError) =>
        e.code === "validation" && e.errors?.some((f) => f.path === "input.sku") === true,
    );
    await assert.rejects(
      () => admission.admit({ workflow_ref: "shop.nothing", input: {} }, ctx),
      (e: PoimenError) =>
        e.code === "unknown-workflow" && /registered: echo@1, fail@1, shop.order@1/.test(e.message),
    );
  } finally {
    await catalog.stop();
    await catalog.stop();
    await db.drop();
  }
});

Deno.test("catalog: a version for some tenants resolves and is listed only for them; a bare name gets the current version, or the newest older one the tenant may start", () => {
  const v = (version: number, tenants?: string[]) =>
    defineWorkflow({ name: "report", version, tenants, input: z.unknown(), handler });
  const catalog = new StaticCatalog(
    new WorkflowRegistry([v(1), v(2, ["team-*", "acme"]), v(3, ["acme"])]).catalogVersions(),
  );
  assert.equal(catalog.resolve("report", "acme")?.version, 3);
  assert.equal(catalog.resolve("report", "team-red")?.version, 2, "the newest it may start");
  assert.equal(catalog.resolve("report", "beta")?.version, 1);
  assert.equal(catalog.resolve("report@3", "team-red"), undefined);
  assert.equal(catalog.resolve("report@2", "beta"), undefined);
  assert.equal(catalog.resolve("report@2", "team-blue")?.version, 2);
  assert.equal(catalog.resolve("report@1", "acme")?.version, 1);
  assert.deepEqual(catalog.list("acme"), ["report@1", "report@2", "report@3"]);
  assert.deepEqual(catalog.list("team-red"), ["report@1", "report@2"]);
  assert.deepEqual(catalog.list("beta"), ["report@1"]);

  // The current version is a ceiling: with 2 current, acme's bare name gets 2, not 3.
  const atTwo = new StaticCatalog(
    new WorkflowRegistry([v(1), v(2, ["team-*", "acme"]), v(3, ["acme"])]).catalogVersions()
      .map((c) => ({ ...c, current: c.version === 2 })),
  );
  assert.equal(atTwo.resolve("report", "acme")?.version, 2);
  assert.equal(atTwo.resolve("report", "beta")?.version, 1);
  assert.equal(atTwo.resolve("report@3", "acme")?.version, 3);

  const only = new StaticCatalog(new WorkflowRegistry([v(1, ["acme"])]).catalogVersions());
  assert.equal(only.resolve("report", "beta"), undefined);
  assert.deepEqual(only.list("beta"), []);
});

Deno.test("catalog: a version's debounce is stored with it, read back by admission, and part of its immutable definition", async () => {
  const db = await freshDatabase();
  try {
    const digest = (maxWait: number) =>
      defineWorkflow({
        name: "notify.digest",
        version: 1,
        input: z.object({ customer_id: z.string() }),
        debounce: { key: "/customer_id", period: 1_000, maxWait },
        handler,
      });
    const plain = defineWorkflow({ name: "plain", version: 1, input: z.unknown(), handler });
    const [first] = await registerVersions(
      db.sql,
      new WorkflowRegistry([digest(5_000), plain]).catalogVersions(),
      "w1",
    );
    assert.equal(first.created, true);
    const [same] = await registerVersions(
      db.sql,
      new WorkflowRegistry([digest(5_000)]).catalogVersions(),
      "w2",
    );
    assert.deepEqual([same.created, same.same], [false, true]);
    const [other] = await registerVersions(
      db.sql,
      new WorkflowRegistry([digest(6_000)]).catalogVersions(),
      "w3",
    );
    assert.deepEqual([other.created, other.same], [false, false], "another debounce differs");
    const rows = await selectCatalog(db.sql);
    const versions = new Map(rows.map((r) => [r.name, compileVersion(r)]));
    assert.deepEqual(versions.get("notify.digest")?.debounce, {
      key: "/customer_id",
      period: 1_000,
      maxWait: 5_000,
    });
    assert.equal(versions.get("plain")?.debounce, null);
  } finally {
    await db.drop();
  }
});
