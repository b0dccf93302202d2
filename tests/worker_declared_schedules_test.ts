/**
 * Schedules declared in definitions, written when a worker registers its
 * versions (worker/declared_schedules.ts, db/schedules.ts
 * `syncDeclaredSchedules`), against a real Postgres: created once per tenant
 * however many workers start at once, updated by a newer version, never by
 * an older one, and never over a schedule made at run time.
 */
import assert from "node:assert/strict";
import { z } from "zod";
import { PoimenError } from "../core/errors.ts";
import { silentLogger } from "../core/log.ts";
import { insertSchedule, type ScheduleRow, selectSchedules } from "../db/schedules.ts";
import type { Sql } from "../db/pool.ts";
import { WorkerPresence } from "../worker/presence.ts";
import { writeDeclaredSchedules } from "../worker/declared_schedules.ts";
import { defineWorkflow, type ScheduleDeclaration } from "../workflows/define.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { Admission } from "../admission/admit.ts";
import { occurrenceKey, ScheduleTicker } from "../admission/schedule_ticker.ts";
import { MINUTE } from "../core/time.ts";
import { createWorker } from "../worker/run_worker.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import { insertTenant } from "../db/auth.ts";

const input = z.object({ full: z.boolean() });

function report(version: number, schedules: ScheduleDeclaration<{ full: boolean }>[]) {
  return defineWorkflow({
    name: "report",
    version,
    input,
    tenants: ["acme", "globex"],
    schedules,
    handler: () => null,
  });
}

const V1 = [
  { id: "nightly", cron: "30 2 * * *", timezone: "Europe/Paris", input: { full: true } },
  { id: "hourly", cron: "0 * * * *", input: { full: false }, tenants: ["globex"] },
  { id: "weekly", cron: "0 6 * * 1", input: { full: true } },
];

/** A database with the tenants acme and globex. */
async function database(): Promise<TestDatabase> {
  const db = await freshDatabase();
  for (const t of ["acme", "globex"]) await insertTenant(db.sql, t);
  return db;
}

/** Starts a worker's registration of `workflows` and stops it; resolves once registered. */
async function register(sql: Sql, id: string, workflows: ReturnType<typeof report>[]) {
  const presence = new WorkerPresence(sql, id, new WorkflowRegistry(workflows), silentLogger);
  try {
    await presence.start();
  } finally {
    await presence.stop();
  }
}

/** Every schedule, `tenant/id` → row. */
async function all(sql: Sql): Promise<Map<string, ScheduleRow>> {
  const out = new Map<string, ScheduleRow>();
  for (const tenant of ["acme", "globex"]) {
    for (const row of await selectSchedules(sql, tenant, { limit: 100 })) {
      out.set(`${tenant}/${row.schedule_id}`, row);
    }
  }
  return out;
}

Deno.test("declared schedules: a worker registering a version creates them, once per tenant, leaving a run-time schedule of the same id alone", async () => {
  const db = await database();
  try {
    // acme made its own "weekly" at run time: registration must not touch it.
    const mine = await insertSchedule(db.sql, "acme", "weekly", {
      workflow_ref: "echo",
      cron: "0 9 * * 5",
      timezone: "UTC",
      input: { mine: true },
      overlap: "allow",
      catchup: "skip",
      paused: false,
      next_at: null,
    });
    await register(db.sql, "w1", [report(1, V1)]);
    const rows = await all(db.sql);
    assert.deepEqual(
      [...rows.keys()].sort(),
      ["acme/nightly", "acme/weekly", "globex/hourly", "globex/nightly", "globex/weekly"],
    );
    const nightly = rows.get("globex/nightly")!;
    assert.equal(nightly.workflow_ref, "report@1");
    assert.equal(nightly.declared_by, "report");
    assert.equal(nightly.declared_version, 1);
    assert.equal(nightly.timezone, "Europe/Paris");
    assert.deepEqual(nightly.input, { full: true });
    assert.ok(nightly.next_at !== null && nightly.next_at > new Date(Date.now() - 60_000));
    assert.equal(nightly.next_at.getUTCMinutes(), 30, "02:30 Paris is :30 in UTC");
    assert.deepEqual(rows.get("acme/weekly"), mine, "the run-time schedule is as it was");
  } finally {
    await db.drop();
  }
});

Deno.test("declared schedules: eight workers registering at once create each schedule once, and a restart rewrites nothing", async () => {
  const db = await database();
  try {
    const registry = () => new WorkflowRegistry([report(1, V1)]);
    const results = await Promise.all(
      Array.from(
        { length: 8 },
        () => writeDeclaredSchedules(db.sql, registry().catalogVersions(), silentLogger),
      ),
    );
    const created = results.flat().filter((o) => o.outcome === "created");
    assert.equal(created.length, 5, "each of the 5 schedules created by exactly one worker");
    assert.equal(new Set(created.map((o) => `${o.tenant_id}/${o.schedule_id}`)).size, 5);
    assert.ok(
      results.flat().every((o) => o.outcome === "created" || o.outcome === "unchanged"),
      JSON.stringify(results),
    );
    // Workers that start while the version is not registered yet race the catalog too.
    await Promise.all(["a", "b", "c"].map((id) => register(db.sql, id, [report(1, V1)])));
    const before = await all(db.sql);
    assert.equal(before.size, 5);
    await register(db.sql, "restart", [report(1, V1)]);
    assert.deepEqual(await all(db.sql), before, "updated_at (the ticker's fence) and cursors kept");
  } finally {
    await db.drop();
  }
});

Deno.test("declared schedules: a newer version's declaration updates, adds and removes them; an older one's worker changes nothing", async () => {
  const db = await database();
  try {
    await register(db.sql, "w1", [report(1, V1)]);
    // An operator paused globex's nightly at run time: it stays paused.
    await db.sql`update schedules set paused = true, next_at = null
                  where tenant_id = 'globex' and schedule_id = 'nightly'`;
    const v1 = await all(db.sql);
    await register(db.sql, "w2", [report(2, [
      // Same cron and zone, new input: the cursor stays.
      { id: "nightly", cron: "30 2 * * *", timezone: "Europe/Paris", input: { full: false } },
      // New cron: the cursor moves; now for both tenants.
      { id: "hourly", cron: "15 * * * *", input: { full: false }, overlap: "skip" },
      // weekly dropped; monthly added, for acme only.
      { id: "monthly", cron: "0 0 1 * *", input: { full: true }, tenants: ["acme"] },
    ])]);
    const v2 = await all(db.sql);
    assert.deepEqual(
      [...v2.keys()].sort(),
      ["acme/hourly", "acme/monthly", "acme/nightly", "globex/hourly", "globex/nightly"],
    );
    const acmeNightly = v2.get("acme/nightly")!;
    assert.equal(acmeNightly.workflow_ref, "report@2");
    assert.equal(acmeNightly.declared_version, 2);
    assert.deepEqual(acmeNightly.input, { full: false });
    assert.deepEqual(acmeNightly.next_at, v1.get("acme/nightly")!.next_at, "cursor kept");
    assert.equal(v2.get("globex/nightly")!.paused, true, "a run-time pause survives");
    assert.equal(v2.get("globex/nightly")!.next_at, null);
    const hourly = v2.get("globex/hourly")!;
    assert.equal(hourly.cron, "15 * * * *");
    assert.equal(hourly.overlap, "skip");
    assert.equal(hourly.next_at!.getUTCMinutes(), 15, "a changed cron moves the cursor");
    assert.equal(v2.get("acme/hourly")!.declared_version, 2);

    // A version 1 worker restarting (a rollout in progress) writes nothing.
    const outcomes = await writeDeclaredSchedules(
      db.sql,
      new WorkflowRegistry([report(1, V1)]).catalogVersions(),
      silentLogger,
    );
    assert.deepEqual(outcomes, []);
    await register(db.sql, "w1-again", [report(1, V1)]);
    assert.deepEqual(await all(db.sql), v2);
  } finally {
    await db.drop();
  }
});

Deno.test("declared schedules: a registered version declaring other schedules is a workflow conflict", async () => {
  const db = await database();
  try {
    await register(db.sql, "w1", [report(1, V1)]);
    await assert.rejects(
      register(db.sql, "w2", [report(1, V1.slice(1))]),
      (e: unknown) => {
        assert.ok(e instanceof PoimenError && e.code === "workflow-conflict", String(e));
        assert.match(e.message, /report@1 is already registered with another definition/);
        return true;
      },
    );
  } finally {
    await db.drop();
  }
});

Deno.test("declared schedules: a tenant that does not exist yet gets none until a worker starts after it was created", async () => {
  const db = await freshDatabase();
  try {
    await insertTenant(db.sql, "acme");
    const versions = new WorkflowRegistry([report(1, V1)]).catalogVersions();
    const first = await writeDeclaredSchedules(db.sql, versions, silentLogger);
    assert.deepEqual(
      first.map((o) => `${o.tenant_id}/${o.schedule_id} ${o.outcome}`).sort(),
      [
        "acme/nightly created",
        "acme/weekly created",
        "globex/hourly no-tenant",
        "globex/nightly no-tenant",
        "globex/weekly no-tenant",
      ],
    );
    assert.deepEqual([...(await all(db.sql)).keys()].sort(), ["acme/nightly", "acme/weekly"]);
    await insertTenant(db.sql, "globex");
    const again = await writeDeclaredSchedules(db.sql, versions, silentLogger);
    assert.equal(again.filter((o) => o.outcome === "created").length, 3);
    assert.equal((await all(db.sql)).size, 5);
  } finally {
    await db.drop();
  }
});

Deno.test("declared schedules: from a worker's start to an occurrence's run, run by that worker", async () => {
  const db = await database();
  const pulse = defineWorkflow({
    name: "pulse",
    version: 1,
    input: z.object({ beat: z.number() }),
    schedules: [{ id: "every-minute", cron: "* * * * *", input: { beat: 1 }, tenants: ["acme"] }],
    handler: ({ beat }) => ({ beat }),
  });
  const worker = createWorker({ workflows: [pulse], databaseUrl: db.url, log: silentLogger });
  try {
    await worker.start();
    const row = (await all(db.sql)).get("acme/every-minute")!;
    assert.equal(row.workflow_ref, "pulse@1");
    // An API's tick, its clock at the schedule's first occurrence.
    const admission = new Admission(db.sql, catalogOf(new WorkflowRegistry([pulse])), {
      maxBatch: 4,
      maxConcurrent: 1,
    });
    const ticker = new ScheduleTicker(db.sql, admission, {
      intervalMs: MINUTE,
      log: silentLogger,
      now: () => Promise.resolve(row.next_at!),
    });
    assert.equal(await ticker.tick(), 1);
    const key = occurrenceKey("every-minute", row.next_at!);
    const run = await waitFor("the occurrence's run succeeded", async () => {
      const [r] = await db.sql<{ status: string; result: unknown; workflow_version: number }[]>`
        select status, result, workflow_version from runs
         where tenant_id = 'acme' and dispatch_key = ${key}`;
      return r?.status === "succeeded" ? r : undefined;
    });
    assert.deepEqual(run.result, { beat: 1 });
    assert.equal(run.workflow_version, 1);
  } finally {
    await worker.stop();
    await db.drop();
  }
});
