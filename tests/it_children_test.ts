/**
 * Child runs across real worker processes (tests/support/durable_worker.ts):
 * a parent starting 100 children (50 one `ctx.start` at a time, 50 in one
 * `ctx.map`) whose worker is killed (SIGKILL) while it starts them and
 * while it waits for them ends with exactly 100 children, each admitted
 * once under the key its place derives, and a result built from theirs.
 */
import assert from "node:assert/strict";
import { Admission } from "../admission/admit.ts";
import { insertTenant } from "../db/auth.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { fan, kid } from "./support/durable_worker.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase, waitFor } from "./support/db.ts";
import { DurableWorker } from "./support/durable_worker_process.ts";

const TENANT = "acme";
const N = 100;

const ENV = { WORKER_LEASE_MS: "1500", WORKER_CONCURRENCY: "8", LOG_LEVEL: "error" };

Deno.test("it children: a parent of 100 children killed (SIGKILL) while starting them and while waiting ends with exactly 100, its result built from theirs", async () => {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  const workers: DurableWorker[] = [];
  try {
    const admission = new Admission(db.sql, catalogOf(new WorkflowRegistry([fan, kid])), {
      maxBatch: 16,
      maxConcurrent: 2,
    });
    const { run } = await admission.admit(
      { workflow_ref: "it.fan", input: { n: N, ms: 150, pause_ms: 30 } },
      { tenantId: TENANT, source: "test", entry: "http" },
    );
    const parent = run.run_id;
    const children = async () =>
      (await db.sql<{ n: number }[]>`
        select count(*)::int as n from runs where tenant_id = ${TENANT} and parent_run_id = ${parent}`)[
        0
      ]
        .n;
    const status = async () =>
      (await db.sql<{ status: string }[]>`
        select status from runs where tenant_id = ${TENANT} and run_id = ${parent}`)[0].status;

    // Killed while starting, at points picked at random, each time a new worker takes over.
    const points = [5 + Math.floor(Math.random() * 15), 25 + Math.floor(Math.random() * 20)];
    for (const [i, at] of points.entries()) {
      const w = new DurableWorker(db, `doomed-start-${i}`, ENV);
      workers.push(w);
      await waitFor(`${at} children started`, async () => (await children()) >= at, 60_000, 20);
      await w.kill("SIGKILL");
    }
    // Killed while waiting for its children (all admitted, some still running).
    const waiter = new DurableWorker(db, "doomed-wait", ENV);
    workers.push(waiter);
    await waitFor(
      "the parent waiting for its children",
      async () => (await status()) === "waiting" && (await children()) === N,
      60_000,
      20,
    );
    await waiter.kill("SIGKILL");
    workers.push(new DurableWorker(db, "rescuer", ENV));

    await waitFor("the parent succeeded", async () => (await status()) === "succeeded", 120_000);
    const [row] = await db.sql<{ result: { js: number[] }; attempts: number }[]>`
      select result, attempts from runs where tenant_id = ${TENANT} and run_id = ${parent}`;
    assert.deepEqual(row.result.js, Array.from({ length: N }, (_, j) => j));
    assert.ok(row.attempts >= 3, `the kills cost the parent attempts: ${row.attempts}`);
    const kids = await db.sql<{ dispatch_key: string; status: string; j: number }[]>`
      select dispatch_key, status, (input ->> 'j')::int as j from runs
       where tenant_id = ${TENANT} and parent_run_id = ${parent}`;
    assert.equal(kids.length, N, "exactly 100 children");
    assert.equal(new Set(kids.map((k) => k.j)).size, N, "one child per place");
    const expected = new Set([
      ...Array.from({ length: N / 2 }, (_, j) => `child:${parent}:one-${j}`),
      ...Array.from({ length: N / 2 }, (_, i) => `child:${parent}:rest#c${i}`),
    ]);
    assert.deepEqual(new Set(kids.map((k) => k.dispatch_key)), expected, "each key its place's");
    assert.ok(kids.every((k) => k.status === "succeeded"));
  } finally {
    for (const w of workers) await w.kill("SIGKILL");
    await db.drop();
  }
});
