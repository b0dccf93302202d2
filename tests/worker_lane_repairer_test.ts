/**
 * The lane repairer (worker/lane_repairer.ts): a queued run whose lane was
 * never lowered (a rolling deploy across migration 016, a bug) is invisible
 * to the claims until a round lowers its lane; a lane already early enough
 * is never written, and limited versions are left to their groups.
 */
import assert from "node:assert/strict";
import { insertRuns, type NewRun } from "../db/admission.ts";
import { claimRuns } from "../db/claims.ts";
import { silentLogger } from "../core/log.ts";
import { LaneRepairer } from "../worker/lane_repairer.ts";
import { freshDatabase } from "./support/db.ts";

const ECHO = { names: ["echo"], versions: [1] };

function run(tenant: string, opts: { key?: string; runAfter?: string } = {}): NewRun {
  const keyed = opts.key !== undefined;
  return {
    tenant_id: tenant,
    run_id: crypto.randomUUID(),
    workflow_ref: keyed ? "keyed" : "echo",
    workflow_name: keyed ? "keyed" : "echo",
    workflow_version: 1,
    input: {},
    goal_id: null,
    dispatch_key: null,
    source: "test",
    max_attempts: 3,
    run_after: opts.runAfter ?? null,
    concurrency_key: keyed ? opts.key! : null,
    concurrency_limit: keyed ? 1 : null,
  };
}

Deno.test("lane repairer: a queued run whose lane is missing is claimed once a round lowers its lane, and counted", async () => {
  const db = await freshDatabase();
  try {
    await db.sql`insert into tenants (tenant_id)
                 select 't' || g from generate_series(1, 5) g`;
    // Five tenants' runs, then the lanes of two of them lost, as runs admitted
    // by an API older than migration 016 would have none.
    const runs = ["t1", "t2", "t3", "t4", "t5"].map((t) => run(t));
    await insertRuns(db.sql, [...runs, run("t1", { key: "k1" })]);
    await db.sql`delete from queue_lanes where tenant_id in ('t2', 't4')`;
    const before = await claimRuns(db.sql, "w", 10, 30_000, ECHO);
    assert.deepEqual(before.map((r) => r.tenant_id).sort(), ["t1", "t3", "t5"]);

    const repaired: string[] = [];
    // Two lanes a round: the walk crosses rounds through its cursor.
    const repairer = new LaneRepairer(db.sql, {
      intervalMs: 60_000,
      lanesPerRound: 2,
      log: silentLogger,
      onRepaired: (r) => repaired.push(r.tenant_id),
    });
    for (let i = 0; i < 3; i++) await repairer.repair();
    assert.deepEqual(repaired.sort(), ["t2", "t4"]);
    const after = await claimRuns(db.sql, "w", 10, 30_000, ECHO);
    assert.deepEqual(after.map((r) => r.tenant_id).sort(), ["t2", "t4"]);
    // Limited runs wait on their group's due time, never a lane.
    const [{ n }] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from queue_lanes where workflow_name = 'keyed'`;
    assert.equal(n, 0);
  } finally {
    await db.drop();
  }
});

Deno.test("lane repairer: a lane already early enough is not written; a lane later than its runs is lowered to the earliest", async () => {
  const db = await freshDatabase();
  try {
    await db.sql`insert into tenants (tenant_id) values ('a'), ('b')`;
    const soon = new Date(Date.now() + 3600_000).toISOString();
    const later = new Date(Date.now() + 7200_000).toISOString();
    await insertRuns(db.sql, [
      run("a"),
      run("b", { runAfter: later }),
      run("b", { runAfter: soon }),
    ]);
    // b's lane pushed past its runs by hand: its earliest run is in an hour.
    await db.sql`update queue_lanes set ready_at = 'infinity' where tenant_id = 'b'`;
    const [{ xmin }] = await db.sql<{ xmin: string }[]>`
      select xmin::text from queue_lanes where tenant_id = 'a'`;
    const repairer = new LaneRepairer(db.sql, {
      intervalMs: 60_000,
      lanesPerRound: 10,
      log: silentLogger,
    });
    const round = await repairer.repair();
    assert.deepEqual(round.map((r) => r.tenant_id), ["b"]);
    const lanes = await db.sql<{ tenant_id: string; ready_at: Date; xmin: string }[]>`
      select tenant_id, ready_at, xmin::text from queue_lanes order by tenant_id`;
    assert.equal(lanes[0].xmin, xmin, "a's lane was not rewritten");
    assert.equal(lanes[1].ready_at.toISOString(), soon);
    // Nothing left to repair.
    assert.deepEqual(await repairer.repair(), []);
  } finally {
    await db.drop();
  }
});
