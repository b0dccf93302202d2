/**
 * examples/fanout's workflows in a worker against a real Postgres: a
 * month of 60 customers fans out to 60 children (at most 20 unfinished at
 * once), gathers their totals in order, and reports the closed customer's
 * failed child without failing itself; each child admitted once. The
 * project's files type-check.
 */
import assert from "node:assert/strict";
import { Admission } from "../admission/admit.ts";
import { silentLogger } from "../core/log.ts";
import { insertTenant } from "../db/auth.ts";
import { createPool } from "../db/pool.ts";
import { PROJECT_ROOT } from "../dev/tasks.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { Worker } from "../worker/worker.ts";
import { customerMonth, month } from "../examples/fanout/workflows.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase, waitFor } from "./support/db.ts";

const TENANT = "fanout";

Deno.test("examples/fanout: a month fans out to its customers' children and sums them", async () => {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  const registry = new WorkflowRegistry([month, customerMonth]);
  const { host, port, user, database } = db.sql.options;
  const url = `postgres://${user}@${host[0]}:${port[0]}/${database}`;
  const w = new Worker(db.sql, registry, {
    leaderSession: () => createPool({ url, max: 1, applicationName: "fanout-test-leader" }),
    id: "w-fanout",
    concurrency: 8,
    leaseMs: 30_000,
    pollMs: 100,
    retryBaseMs: 20,
    shutdownMs: 2_000,
    wakeMs: 100,
    log: silentLogger,
  });
  try {
    await w.start();
    const customers = [...Array.from({ length: 60 }, (_, i) => `cus-${i}`), "closed-1"];
    const admission = new Admission(db.sql, catalogOf(registry), {
      maxBatch: 16,
      maxConcurrent: 1,
    });
    const { run } = await admission.admit(
      { workflow_ref: "billing.month@1", input: { month: "2026-11", customers } },
      { tenantId: TENANT, source: "test", entry: "http" },
    );
    const done = await waitFor("the month final", async () => {
      const [row] = await db.sql<{ status: string; result: unknown; error: unknown }[]>`
        select status, result, error from runs
         where tenant_id = ${TENANT} and run_id = ${run.run_id}
           and status in ('succeeded', 'failed', 'cancelled')`;
      return row;
    }, 60_000);
    assert.equal(done.status, "succeeded", JSON.stringify(done.error));
    const result = done.result as { customers: number; cents: number; failed: string | null };
    assert.equal(result.customers, 60);
    const kids = await db.sql<
      { dispatch_key: string; status: string; result: { cents: number } }[]
    >`
      select dispatch_key, status, result from runs
       where tenant_id = ${TENANT} and parent_run_id = ${run.run_id}`;
    assert.equal(kids.length, 61, "one child per customer, and the closed one's");
    assert.equal(new Set(kids.map((k) => k.dispatch_key)).size, 61);
    const sum = kids.filter((k) => k.status === "succeeded")
      .reduce((s, k) => s + k.result.cents, 0);
    assert.equal(result.cents, sum);
    assert.match(result.failed ?? "", /child closed .* failed: customer closed-1 is closed/);
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("examples/fanout: its files type-check against this checkout", async () => {
  // From the checkout, with its import map (the example's own deno.json
  // links the checkout the same way); nothing is written into the example.
  const files = ["workflows.ts", "worker.ts", "submit.ts"].map((f) => `examples/fanout/${f}`);
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["check", "--config", `${PROJECT_ROOT}deno.json`, ...files],
    cwd: PROJECT_ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
});
