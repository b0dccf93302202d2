/**
 * Migration 017: the hot tables carry their own autovacuum settings
 * (docs/operations.md, "Vacuum"), whatever the server's defaults are.
 */
import assert from "node:assert/strict";
import { freshDatabase } from "./support/db.ts";

Deno.test("migration 017: runs, work_events, concurrency_slots and workflow_workers vacuum on their own triggers", async () => {
  const db = await freshDatabase();
  try {
    const rows = await db.sql<{ relname: string; options: string[] }[]>`
      select relname, reloptions as options from pg_class
       where relname in ('runs', 'work_events', 'concurrency_slots', 'workflow_workers')
         and relkind in ('r', 'p')`;
    const options = new Map(
      rows.map((r) => [r.relname, Object.fromEntries((r.options ?? []).map((o) => o.split("=")))]),
    );
    for (const table of ["runs", "work_events"]) {
      assert.deepEqual(options.get(table), {
        autovacuum_vacuum_scale_factor: "0.02",
        autovacuum_vacuum_threshold: "1000",
        autovacuum_vacuum_insert_scale_factor: "0.05",
        autovacuum_analyze_scale_factor: "0.02",
        autovacuum_vacuum_cost_limit: "2000",
        autovacuum_vacuum_cost_delay: "1",
      }, table);
    }
    assert.deepEqual(options.get("concurrency_slots"), {
      autovacuum_vacuum_scale_factor: "0",
      autovacuum_vacuum_threshold: "500",
      autovacuum_analyze_scale_factor: "0",
      autovacuum_analyze_threshold: "500",
      autovacuum_vacuum_cost_delay: "0",
    });
    assert.equal(options.get("workflow_workers")?.autovacuum_vacuum_threshold, "200");
  } finally {
    await db.drop();
  }
});
