/**
 * A workflow's current version (migration 018) against a real Postgres: the
 * first version registered is current, a later one only once promoted, and
 * admission's catalog resolves a bare name to it; existing databases keep
 * what a bare name meant; a new version whose concurrency differs from its
 * workflow's is refused, also when two workers register at once.
 */
import assert from "node:assert/strict";
import { z } from "zod";
import { WorkflowCatalog } from "../admission/catalog.ts";
import { PoimenError } from "../core/errors.ts";
import { silentLogger } from "../core/log.ts";
import {
  type CatalogVersion,
  registerVersions,
  renewWorker,
  selectCatalog,
} from "../db/catalog.ts";
import { loadMigrations, migrate } from "../db/migrate.ts";
import { createPool } from "../db/pool.ts";
import { promoteVersion, selectVersionListing } from "../db/workflow_current.ts";
import { createWorker } from "../worker/run_worker.ts";
import { defineWorkflow } from "../workflows/define.ts";
import { freshDatabase, waitFor } from "./support/db.ts";

function version(name: string, v: number, extra: Partial<CatalogVersion> = {}): CatalogVersion {
  return {
    name,
    version: v,
    input_schema: { type: "object" },
    max_attempts: null,
    concurrency_limit: null,
    concurrency_key: null,
    tenants: null,
    ...extra,
  };
}

/** The catalog's current version of each name. */
async function currents(sql: Parameters<typeof selectCatalog>[0]): Promise<Record<string, number>> {
  return Object.fromEntries(
    (await selectCatalog(sql)).filter((v) => v.current).map((v) => [v.name, v.version]),
  );
}

Deno.test("current: the first version registered is current, a later one only once promoted (forward or back), and the API's catalog resolves a bare name to it", async () => {
  const db = await freshDatabase(true, { builtins: false });
  const catalog = new WorkflowCatalog(db.sql, {
    refreshMs: 3_600_000,
    listen: () => createPool({ url: db.url, max: 1, applicationName: "current-test-listen" }),
    log: silentLogger,
  });
  try {
    const [first] = await registerVersions(db.sql, [version("billing.invoice", 1)], "w1");
    assert.deepEqual([first.created, first.current], [true, true]);
    const [second] = await registerVersions(db.sql, [version("billing.invoice", 2)], "w2");
    assert.deepEqual([second.created, second.current], [true, false], "a canary is not current");
    const [again] = await registerVersions(db.sql, [version("billing.invoice", 2)], "w3");
    assert.deepEqual([again.created, again.same, again.current], [false, true, false]);
    assert.deepEqual(await currents(db.sql), { "billing.invoice": 1 });

    await catalog.start();
    assert.equal(catalog.resolve("billing.invoice", "acme")?.version, 1);
    assert.equal(catalog.resolve("billing.invoice@2", "acme")?.version, 2);

    assert.deepEqual(await promoteVersion(db.sql, "billing.invoice", 2, "test"), {
      previous: 1,
      version: 2,
    });
    await catalog.refresh();
    assert.equal(catalog.resolve("billing.invoice", "acme")?.version, 2);
    // Back, and again (a no-op but its time).
    assert.deepEqual(await promoteVersion(db.sql, "billing.invoice", 1, "test"), {
      previous: 2,
      version: 1,
    });
    assert.deepEqual(await promoteVersion(db.sql, "billing.invoice", 1, "test"), {
      previous: 1,
      version: 1,
    });
    await catalog.refresh();
    assert.equal(catalog.resolve("billing.invoice", "acme")?.version, 1);

    assert.equal(await promoteVersion(db.sql, "billing.invoice", 3, "test"), undefined);
    assert.equal(await promoteVersion(db.sql, "nobody", 1, "test"), undefined);
    assert.deepEqual(await currents(db.sql), { "billing.invoice": 1 });

    // A name first registered with two versions at once: the newer is current.
    const both = await registerVersions(db.sql, [version("x", 1), version("x", 2)], "w4");
    assert.deepEqual(both.map((r) => [r.version, r.current]), [[1, false], [2, true]]);

    // The listing: versions, which is current, the live workers of each.
    await renewWorker(db.sql, "worker-b", ["billing.invoice@2"], 60_000);
    await renewWorker(db.sql, "worker-a", ["billing.invoice@1", "billing.invoice@2"], 60_000);
    await renewWorker(db.sql, "worker-dead", ["billing.invoice@1"], -1_000);
    const listing = await selectVersionListing(db.sql, "billing.invoice");
    assert.deepEqual(listing.map((v) => [v.version, v.current, v.workers]), [
      [1, true, ["worker-a"]],
      [2, false, ["worker-a", "worker-b"]],
    ]);
    assert.ok(listing[0].promoted_at instanceof Date);
    assert.equal(listing[1].promoted_at, null);
  } finally {
    await catalog.stop();
    await db.drop();
  }
});

Deno.test("migration 018: in an existing database each name's newest version becomes current, so no bare name moves", async () => {
  const db = await freshDatabase(false);
  try {
    const all = loadMigrations();
    await migrate(db.sql, all.filter((m) => m.version < 18), silentLogger);
    await db.sql`
      insert into workflow_versions (name, version, input_schema, tenants, registered_by)
      values ('report', 1, '{}', null, 'old'), ('report', 3, '{}', 'acme', 'old'),
             ('report', 2, '{}', null, 'old'), ('echo', 1, '{}', null, 'old')`;
    assert.deepEqual(await migrate(db.sql, all.filter((m) => m.version <= 18), silentLogger), [18]);
    // The catalog reads the columns of later migrations too.
    await migrate(db.sql, all, silentLogger);
    assert.deepEqual(await currents(db.sql), { echo: 1, report: 3 });
    const catalog = new WorkflowCatalog(db.sql, {
      refreshMs: 3_600_000,
      listen: () => createPool({ url: db.url, max: 1, applicationName: "current-test-listen" }),
      log: silentLogger,
    });
    try {
      await catalog.start();
      // As before the migration: the newest version each tenant may start.
      assert.equal(catalog.resolve("report", "acme")?.version, 3);
      assert.equal(catalog.resolve("report", "beta")?.version, 2);
    } finally {
      await catalog.stop();
    }
    const [{ by }] = await db
      .sql`select promoted_by as by from workflow_current where name = 'echo'`;
    assert.equal(by, "migration 018");
  } finally {
    await db.drop();
  }
});

Deno.test("current: a new version whose concurrency differs from its workflow's is refused naming the version it must agree with; registering two at once, one is", async () => {
  const db = await freshDatabase(true, { builtins: false });
  const other = createPool({ url: db.url, max: 1, applicationName: "current-test-other" });
  try {
    const limited = { concurrency_limit: 5, concurrency_key: "/customer_id" };
    await registerVersions(db.sql, [version("crm.sync", 1, limited)], "w1");
    const [wider] = await registerVersions(
      db.sql,
      [version("crm.sync", 2, { ...limited, concurrency_limit: 10 })],
      "w2",
    );
    assert.equal(wider.created, false);
    assert.deepEqual(wider.refused, {
      version: 1,
      concurrency_limit: 5,
      concurrency_key: "/customer_id",
    });
    const [unlimited] = await registerVersions(db.sql, [version("crm.sync", 2)], "w2");
    assert.deepEqual(unlimited.refused?.version, 1);
    const [otherKey] = await registerVersions(
      db.sql,
      [version("crm.sync", 2, { ...limited, concurrency_key: "/region" })],
      "w2",
    );
    assert.deepEqual(otherKey.refused?.version, 1);
    const [same] = await registerVersions(db.sql, [version("crm.sync", 2, limited)], "w2");
    assert.deepEqual([same.created, same.refused], [true, null]);

    // One call with two new versions of a new name that disagree: the newest one stands.
    const pair = await registerVersions(db.sql, [
      version("new.pair", 1, { concurrency_limit: 1 }),
      version("new.pair", 2, { concurrency_limit: 2 }),
    ], "w3");
    assert.deepEqual(pair.map((r) => [r.version, r.created, r.refused?.version ?? null]), [
      [1, false, 2],
      [2, true, null],
    ]);

    // Two workers at once, each with a version of a new name: they take turns, so one is refused.
    for (let round = 0; round < 5; round++) {
      const name = `race.r${round}`;
      const [a, b] = await Promise.all([
        registerVersions(db.sql, [version(name, 1, { concurrency_limit: 1 })], "wa"),
        registerVersions(other, [version(name, 2, { concurrency_limit: 2 })], "wb"),
      ]);
      const created = [a[0], b[0]].filter((r) => r.created);
      const refused = [a[0], b[0]].filter((r) => r.refused !== null);
      assert.equal(created.length, 1, JSON.stringify([a, b]));
      assert.equal(refused.length, 1, JSON.stringify([a, b]));
      assert.equal(created[0].current, true);
    }

    // A database from before the rule may hold versions that disagree: they register again.
    await db.sql`
      insert into workflow_versions (name, version, input_schema, concurrency_limit, registered_by)
      values ('crm.sync', 9, '{"type":"object"}', 99, 'old')`;
    const [legacy] = await registerVersions(
      db.sql,
      [version("crm.sync", 9, { concurrency_limit: 99 })],
      "w4",
    );
    assert.deepEqual([legacy.same, legacy.refused], [true, null]);
  } finally {
    await other.end({ timeout: 5 });
    await db.drop();
  }
});

Deno.test("current: a worker hosting a version whose concurrency differs from its workflow's fails to start with one line naming the workflow, both versions and both limits", async () => {
  const db = await freshDatabase(true, { builtins: false });
  const define = (version: number, limit: number) =>
    defineWorkflow({
      name: "billing.invoice",
      version,
      input: z.object({ customer_id: z.string() }),
      concurrency: { limit },
      handler: () => Promise.resolve(null),
    });
  const v1 = createWorker({ workflows: [define(1, 5)], databaseUrl: db.url, log: silentLogger });
  const v2 = createWorker({ workflows: [define(2, 10)], databaseUrl: db.url, log: silentLogger });
  try {
    await v1.start();
    const err = await v2.start().then(() => undefined, (e) => e);
    assert.ok(err instanceof PoimenError, String(err));
    assert.equal(err.code, "workflow-conflict");
    assert.equal(err.message.split("\n").length, 1);
    assert.match(
      err.message,
      /^worker: workflow billing\.invoice@2 declares concurrency limit 10 per tenant but billing\.invoice@1 declares limit 5 per tenant; /,
    );
    await waitFor("v2 left no trace", async () => {
      const rows = await db.sql`select 1 from workflow_versions where version = 2`;
      return rows.length === 0;
    }, 1_000);
  } finally {
    await v2.stop();
    await v1.stop();
    await db.drop();
  }
});
