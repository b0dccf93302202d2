/**
 * The concurrency slot reconciler (worker/slot_reconciler.ts,
 * db/slot_reconcile.ts) against a real Postgres: a drifted group is put back
 * to its runs and counted, a consistent one is not written, the walk goes
 * round every group a bounded number at a time, and rounds running beside
 * admissions, claims and ends never "correct" a count that was right.
 */
import assert from "node:assert/strict";
import client from "prom-client";
import { Admission } from "../admission/admit.ts";
import { silentLogger } from "../core/log.ts";
import { insertTenant } from "../db/auth.ts";
import { completeRun } from "../db/attempt_end.ts";
import { claimLimitedRuns } from "../db/claims.ts";
import type { Sql } from "../db/pool.ts";
import {
  type SlotCorrection,
  slotCorrectionMetric,
  SlotReconciler,
} from "../worker/slot_reconciler.ts";
import { catalogOf, limitedRegistry } from "./support/catalog.ts";
import { freshDatabase, type TestDatabase } from "./support/db.ts";
import { sampleValue } from "./support/processes.ts";

const HOSTED = limitedRegistry().hostedByLimit();
const METRIC = "poimen_concurrency_slot_corrections_total";

interface Slot {
  concurrency_key: string;
  running: number;
  queued: number;
  /** The row version: unchanged when nothing wrote the row. */
  xmin: string;
}

async function slots(sql: Sql): Promise<Map<string, Slot>> {
  const rows = await sql<Slot[]>`
    select concurrency_key, running, queued, xmin::text as xmin from concurrency_slots
     where tenant_id = 'acme' and workflow_name = 'shop.sync'`;
  return new Map(rows.map((r) => [r.concurrency_key, r]));
}

/** Groups whose counts differ from their runs. */
async function drift(sql: Sql): Promise<unknown[]> {
  return [
    ...await sql`
    with actual as (
      select tenant_id, workflow_name, concurrency_key,
             count(*) filter (where status = 'running')::int as running,
             count(*) filter (where status = 'queued')::int as queued
        from runs where concurrency_key is not null group by 1, 2, 3
    )
    select s.*, a.running as actual_running, a.queued as actual_queued
      from concurrency_slots s
      left join actual a using (tenant_id, workflow_name, concurrency_key)
     where s.running <> coalesce(a.running, 0) or s.queued <> coalesce(a.queued, 0)`,
  ];
}

async function setup(): Promise<{ db: TestDatabase; admit: (c: string) => Promise<string> }> {
  const db = await freshDatabase();
  await insertTenant(db.sql, "acme");
  const admission = new Admission(db.sql, catalogOf(limitedRegistry()), {
    maxBatch: 64,
    maxConcurrent: 4,
  });
  return {
    db,
    admit: async (customer) =>
      (await admission.admit(
        { workflow_ref: "shop.sync", input: { customer_id: customer, n: 0 } },
        { tenantId: "acme", source: "test", entry: "http" },
      )).run.run_id,
  };
}

function reconciler(sql: Sql, groupsPerRound: number, registry = new client.Registry()) {
  const corrections: SlotCorrection[] = [];
  const count = slotCorrectionMetric(registry);
  return {
    corrections,
    registry,
    service: new SlotReconciler(sql, {
      intervalMs: 60_000,
      groupsPerRound,
      log: silentLogger,
      onCorrected: (c) => {
        corrections.push(c);
        count(c);
      },
    }),
  };
}

Deno.test("slot reconciler: a group whose counts were corrupted by hand is set back to its runs and counted; a consistent one is not written", async () => {
  const { db, admit } = await setup();
  try {
    for (const c of ["a", "a", "a", "b", "b"]) await admit(c);
    // One run of each customer starts (limit 1 per customer).
    const claimed = await claimLimitedRuns(db.sql, "w1", 16, 30_000, HOSTED.limited);
    assert.equal(claimed.length, 2);
    await db.sql`
      update concurrency_slots set running = 0, queued = 7
       where tenant_id = 'acme' and workflow_name = 'shop.sync' and concurrency_key = 'a'`;
    const before = await slots(db.sql);
    const r = reconciler(db.sql, 100);
    const made = await r.service.reconcile();
    assert.deepEqual(made.map((c) => [c.concurrency_key, c.was, c.now]), [
      ["a", { running: 0, queued: 7 }, { running: 1, queued: 2 }],
    ]);
    const after = await slots(db.sql);
    assert.deepEqual([after.get("a")!.running, after.get("a")!.queued], [1, 2]);
    // Group b was right: its row was not even rewritten.
    assert.equal(after.get("b")!.xmin, before.get("b")!.xmin);
    assert.deepEqual([after.get("b")!.running, after.get("b")!.queued], [1, 1]);
    assert.deepEqual(await drift(db.sql), []);
    assert.equal(sampleValue(await r.registry.metrics(), METRIC, {}), 1);
    // A second round finds nothing to do.
    assert.deepEqual(await r.service.reconcile(), []);
    assert.equal(sampleValue(await r.registry.metrics(), METRIC, {}), 1);
  } finally {
    await db.drop();
  }
});

Deno.test("slot reconciler: a round checks at most its share of groups and the walk goes round all of them", async () => {
  const { db, admit } = await setup();
  try {
    const customers = ["c0", "c1", "c2", "c3", "c4"];
    for (const c of customers) await admit(c);
    // Every group corrupted: each round corrects exactly the ones it reached.
    await db.sql`update concurrency_slots set queued = 9 where tenant_id = 'acme'`;
    const r = reconciler(db.sql, 2);
    const rounds: string[][] = [];
    for (let i = 0; i < 4; i++) {
      rounds.push((await r.service.reconcile()).map((c) => c.concurrency_key));
    }
    assert.deepEqual(rounds, [["c0", "c1"], ["c2", "c3"], ["c4"], []]);
    assert.deepEqual(await drift(db.sql), []);
  } finally {
    await db.drop();
  }
});

Deno.test("slot reconciler: a group a claim holds is skipped, not waited for, and checked next time", async () => {
  const { db, admit } = await setup();
  try {
    await admit("a");
    await db.sql`update concurrency_slots set queued = 5 where tenant_id = 'acme'`;
    const r = reconciler(db.sql, 100);
    const held = await db.sql.reserve();
    try {
      await held`begin`;
      await held`select 1 from concurrency_slots where tenant_id = 'acme' for update`;
      assert.deepEqual(await r.service.reconcile(), [], "held: skipped");
      await held`rollback`;
    } finally {
      held.release();
    }
    assert.equal((await r.service.reconcile()).length, 1);
    assert.deepEqual(await drift(db.sql), []);
  } finally {
    await db.drop();
  }
});

Deno.test("slot reconciler: rounds beside admissions, claims and ends never correct a right count, and leave none wrong", async () => {
  const { db, admit } = await setup();
  try {
    const customers = ["a", "b", "c", "d"];
    const r = reconciler(db.sql, 100);
    let admitted = 0;
    let done = false;
    const admitting = (async () => {
      for (let i = 0; i < 200; i++) {
        await admit(customers[i % customers.length]);
        admitted++;
      }
    })();
    const working = (worker: string) =>
      (async () => {
        let finished = 0;
        while (!done || finished < admitted) {
          const runs = await claimLimitedRuns(db.sql, worker, 4, 30_000, HOSTED.limited);
          for (const run of runs) {
            assert.ok(await completeRun(db.sql, "acme", run.run_id, worker, run.attempts, null));
          }
          finished += runs.length;
          const [{ left }] = await db.sql<{ left: number }[]>`
            select count(*)::int as left from runs
             where tenant_id = 'acme' and status in ('queued', 'running')`;
          if (done && left === 0) break;
        }
      })();
    // Two reconcilers, looping with no pause, race the same groups.
    const reconciling = (async () => {
      let rounds = 0;
      while (!done || rounds < 3) {
        await Promise.all([r.service.reconcile(), r.service.reconcile()]);
        rounds++;
      }
      return rounds;
    })();
    const workers = ["w1", "w2", "w3", "w4"].map(working);
    await admitting;
    done = true;
    await Promise.all(workers);
    const rounds = await reconciling;
    assert.ok(rounds >= 3);
    assert.deepEqual(r.corrections, [], "a right count was 'corrected'");
    assert.deepEqual(await drift(db.sql), []);
    const final = await slots(db.sql);
    for (const c of customers) {
      assert.deepEqual([final.get(c)!.running, final.get(c)!.queued], [0, 0], c);
    }
  } finally {
    await db.drop();
  }
});
