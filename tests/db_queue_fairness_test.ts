/**
 * Claims are fair across tenants: one tenant's backlog does not make the
 * others wait for it to drain. Checked on what `claimRuns` returns, and with
 * a real worker process.
 */
import assert from "node:assert/strict";
import { Admission } from "../admission/admit.ts";
import { insertTenant } from "../db/auth.ts";
import type { Sql } from "../db/pool.ts";
import { claimRuns } from "../db/claims.ts";
import { BUILTIN_HOSTED, catalogOf } from "./support/catalog.ts";
import { freshDatabase, laneQueuedRuns, type TestDatabase, waitFor } from "./support/db.ts";
import { PoimenProcess } from "./support/processes.ts";

const LEASE_MS = 30_000;

/** `n` queued `workflow` runs of `tenant`, due since `ageSeconds` ago, oldest first by run_after. */
async function backlog(
  sql: Sql,
  tenant: string,
  n: number,
  ageSeconds = 3600,
  workflow = "echo",
  input: unknown = {},
): Promise<void> {
  await insertTenant(sql, tenant);
  await sql`
    insert into runs (tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input,
                      source, max_attempts, run_after)
    select ${tenant}, gen_random_uuid(), ${workflow}, ${workflow}, 1, ${sql.json(input as never)},
           'backlog', 3, now() - ${ageSeconds}::float8 * interval '1 second'
                         + g * interval '1 millisecond'
      from generate_series(1, ${n}::int) g`;
  await laneQueuedRuns(sql, tenant);
}

/** Admits one run for `tenant` the way the API does; returns its id. */
async function admitOne(sql: Sql, tenant: string, input: unknown = { hello: tenant }) {
  await insertTenant(sql, tenant);
  const admission = new Admission(sql, catalogOf(), { maxBatch: 8, maxConcurrent: 1 });
  const { run } = await admission.admit({ workflow_ref: "echo", input }, {
    tenantId: tenant,
    source: "test",
    entry: "http",
  });
  return run.run_id;
}

function countBy<T>(items: T[], key: (t: T) => string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const i of items) out[key(i)] = (out[key(i)] ?? 0) + 1;
  return out;
}

async function withDb(fn: (db: TestDatabase) => Promise<void>): Promise<void> {
  const db = await freshDatabase();
  try {
    await fn(db);
  } finally {
    await db.drop();
  }
}

Deno.test("fairness: with 20,000 runs of tenant A queued, tenant B's new run is in the first claim", async () => {
  await withDb(async (db) => {
    await backlog(db.sql, "a", 20_000);
    const b = await admitOne(db.sql, "b");
    const claimed = await claimRuns(db.sql, "w1", 4, LEASE_MS, BUILTIN_HOSTED);
    assert.equal(claimed.length, 3, "A's share is 2 of the 4 slots, B has 1 run for its 2");
    assert.deepEqual(countBy(claimed, (r) => r.tenant_id), { a: 2, b: 1 });
    assert.ok(claimed.some((r) => r.run_id === b), "B's run is claimed");
    // A's are its oldest.
    const [{ oldest }] = await db.sql<{ oldest: string[] }[]>`
      select array_agg(run_id::text order by run_after) as oldest
        from (select run_id, run_after from runs where tenant_id = 'a'
               order by run_after limit 2) x`;
    assert.deepEqual(
      claimed.filter((r) => r.tenant_id === "a").map((r) => r.run_id).sort(),
      [...oldest].sort(),
    );
  });
});

Deno.test("fairness: tenants share a claim as evenly as it divides, the longest-waiting first", async () => {
  await withDb(async (db) => {
    await backlog(db.sql, "a", 100, 300); // waiting longest
    await backlog(db.sql, "b", 100, 200);
    await backlog(db.sql, "c", 100, 100);
    const claimed = await claimRuns(db.sql, "w1", 8, LEASE_MS, BUILTIN_HOSTED);
    assert.deepEqual(countBy(claimed, (r) => r.tenant_id), { a: 3, b: 3, c: 2 });
  });
});

Deno.test("fairness: the tenants just served go to the back of the line, a newcomer first", async () => {
  await withDb(async (db) => {
    await backlog(db.sql, "a", 100, 300);
    await backlog(db.sql, "b", 100, 200);
    await claimRuns(db.sql, "w1", 3, LEASE_MS, BUILTIN_HOSTED); // a: 2 running, b: 1
    await backlog(db.sql, "c", 100, 100);
    // a and b were served (their lanes went to the back, at that claim's
    // now()); c has waited 100 s: the slots go round c, a, b, then c again.
    const claimed = await claimRuns(db.sql, "w1", 4, LEASE_MS, BUILTIN_HOSTED);
    assert.deepEqual(countBy(claimed, (r) => r.tenant_id), { a: 1, b: 1, c: 2 });
  });
});

Deno.test("fairness: with more tenants than slots, each claim serves the tenants the last ones did not", async () => {
  await withDb(async (db) => {
    for (const [i, t] of ["a", "b", "c", "d", "e", "f"].entries()) {
      await backlog(db.sql, t, 50, 600 - i * 10); // a waited longest
    }
    const rounds: string[][] = [];
    for (let i = 0; i < 3; i++) {
      rounds.push(
        (await claimRuns(db.sql, "w1", 2, LEASE_MS, BUILTIN_HOSTED)).map((r) => r.tenant_id).sort(),
      );
    }
    assert.deepEqual(rounds, [["a", "b"], ["c", "d"], ["e", "f"]]);
  });
});

Deno.test("fairness: one tenant alone fills the claim with its oldest due runs, skipping runs not due", async () => {
  await withDb(async (db) => {
    await backlog(db.sql, "a", 50);
    await db.sql`update runs set run_after = now() + interval '1 hour'
                  where run_id in (select run_id from runs order by run_after limit 5)`;
    const claimed = await claimRuns(db.sql, "w1", 16, LEASE_MS, BUILTIN_HOSTED);
    const expected = await db.sql<{ run_id: string }[]>`
      select run_id from runs
       where run_after <= now() order by run_after limit 16`;
    assert.deepEqual(claimed.map((r) => r.run_id).sort(), expected.map((r) => r.run_id).sort());
    const rows = await db.sql<{ status: string; n: number }[]>`
      select status, count(*)::int as n from runs group by status order by status`;
    assert.deepEqual([...rows], [{ status: "queued", n: 34 }, { status: "running", n: 16 }]);
  });
});

Deno.test("fairness: a claim skips the runs another claim holds, and both fill their batches", async () => {
  await withDb(async (db) => {
    await backlog(db.sql, "a", 20);
    await backlog(db.sql, "b", 20);
    let inner: string[] = [];
    const rollback = new Error("rollback");
    await db.sql.begin(async (tx) => {
      const held = await claimRuns(tx as unknown as Sql, "w1", 8, LEASE_MS, BUILTIN_HOSTED);
      // While the first claim's transaction holds its rows locked:
      inner = (await claimRuns(db.sql, "w2", 8, LEASE_MS, BUILTIN_HOSTED)).map((r) => r.run_id);
      assert.equal(held.length, 8);
      assert.equal(inner.length, 8);
      const overlap = held.filter((r) => inner.includes(r.run_id));
      assert.deepEqual(overlap, []);
      throw rollback;
    }).catch((err) => {
      if (err !== rollback) throw err;
    });
    assert.equal(inner.length, 8);
  });
});

Deno.test("fairness: a worker process starts tenant B's run while tenant A still has a backlog of 20,000", async () => {
  await withDb(async (db) => {
    // A's runs each hold a slot for a minute: nothing but a fair claim lets
    // B's run in before A's backlog drains.
    await backlog(db.sql, "a", 20_000, 3600, "sleep", { ms: 60_000 });
    const b = await admitOne(db.sql, "b");
    const worker = new PoimenProcess("worker", {
      DATABASE_URL: db.url,
      LOG_LEVEL: "warn",
      WORKER_CONCURRENCY: "4",
      WORKER_POLL_MS: "200",
      WORKER_SHUTDOWN_MS: "100",
      WORKER_METRICS_PORT: "0",
    });
    try {
      const done = await waitFor("B's run to succeed", async () => {
        if (worker.exited) throw new Error(`worker exited:\n${worker.logs().join("\n")}`);
        const [row] = await db.sql<{ status: string; started_at: Date }[]>`
          select status, started_at from runs where tenant_id = 'b' and run_id = ${b}`;
        return row?.status === "succeeded" ? row : undefined;
      });
      const [a] = await db.sql<{ queued: number; started_before: number }[]>`
        select count(*) filter (where status = 'queued')::int as queued,
               count(*) filter (where started_at <= ${done.started_at})::int as started_before
          from runs where tenant_id = 'a'`;
      assert.ok(a.queued > 19_990, `A still has ${a.queued} queued`);
      assert.ok(a.started_before <= 4, `${a.started_before} of A's runs started before B's`);
    } finally {
      await worker.stop("SIGTERM");
    }
  });
});
