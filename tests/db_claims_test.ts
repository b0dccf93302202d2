/**
 * The claims cost the runs they claim, not what waits beside them (issue
 * 28): who has due work is read from the lanes and the groups' due times
 * (migration 016), which every statement that queues a run lowers and every
 * claim pushes back. Checked on the plans' row and buffer counts (never a
 * duration), on which runs a claim takes, under races, and through every
 * way a run goes back to the queue or leaves it.
 */
import assert from "node:assert/strict";
import { insertRuns, type NewRun } from "../db/admission.ts";
import { failAttempt, releaseRun } from "../db/attempt_end.ts";
import { requestCancel } from "../db/cancellation.ts";
import { type ClaimedRun, claimLimitedRuns, claimRuns } from "../db/claims.ts";
import { reclaimExpired } from "../db/leases.ts";
import type { Sql } from "../db/pool.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import { capturingPool, explainAnalyze, type PlanNode } from "./support/plans.ts";

const LEASE_MS = 30_000;
const ECHO = { names: ["echo"], versions: [1] };
const KEYED = { names: ["keyed"], versions: [1] };
const TOMORROW = () => new Date(Date.now() + 24 * 3600_000).toISOString();

function run(tenant: string, opts: { key?: string; runAfter?: string | null } = {}): NewRun {
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
    max_attempts: 5,
    run_after: opts.runAfter ?? null,
    concurrency_key: keyed ? opts.key : null,
    concurrency_limit: keyed ? 1 : null,
  };
}

async function tenants(sql: Sql, prefix: string, n: number): Promise<void> {
  await sql`insert into tenants (tenant_id)
            select ${prefix} || g from generate_series(1, ${n}::int) g on conflict do nothing`;
}

/**
 * `n` tenants with one run each due tomorrow, and `n` concurrency groups of
 * one tenant with one run each due tomorrow, admitted as the API does.
 */
async function notDue(sql: Sql, n: number): Promise<void> {
  await tenants(sql, "idle-", n);
  await tenants(sql, "keys", 1);
  for (let i = 0; i < n; i += 500) {
    const batch: NewRun[] = [];
    for (let j = i; j < Math.min(n, i + 500); j++) {
      batch.push(run(`idle-${j + 1}`, { runAfter: TOMORROW() }));
      batch.push(run("keys1", { key: `k${j}`, runAfter: TOMORROW() }));
    }
    await insertRuns(sql, batch);
  }
}

async function withDb(fn: (db: TestDatabase) => Promise<void>): Promise<void> {
  const db = await freshDatabase();
  try {
    await fn(db);
  } finally {
    await db.drop();
  }
}

/** What a plan read: rows out of (and filtered by) every scan of `tables`, and its buffers. */
function reads(plan: PlanNode, tables: string[]): { rows: number; buffers: number } {
  let rows = 0;
  const walk = (node: PlanNode) => {
    const n = node as PlanNode & Record<string, number>;
    if (
      node["Relation Name"] && tables.includes(node["Relation Name"]) &&
      node["Node Type"] !== "ModifyTable"
    ) {
      rows += ((n["Actual Rows"] ?? 0) + (n["Rows Removed by Filter"] ?? 0)) *
        (n["Actual Loops"] ?? 1);
    }
    for (const c of node.Plans ?? []) walk(c);
  };
  walk(plan);
  const top = plan as PlanNode & Record<string, number>;
  return { rows, buffers: (top["Shared Hit Blocks"] ?? 0) + (top["Shared Read Blocks"] ?? 0) };
}

/** Explains (analyzed, rolled back) the claim `call` issues, once its statement is prepared. */
async function claimReads(db: TestDatabase, call: (sql: Sql) => Promise<unknown>) {
  const spy = capturingPool(db.url);
  try {
    const [stmt] = await spy.capture(call);
    const { plan, result } = await explainAnalyze(db.sql, stmt);
    return { ...reads(plan, ["runs", "queue_lanes", "concurrency_slots"]), claimed: result };
  } finally {
    await spy.sql.end();
  }
}

Deno.test("claims: a claim over 1,000 tenants with not-due runs and 1,000 not-due concurrency groups reads O(claimed) rows", async () => {
  await withDb(async (db) => {
    await tenants(db.sql, "busy", 1);
    // Due work: 3 runs of one tenant, 2 groups with a due run each.
    await insertRuns(db.sql, [
      run("busy1"),
      run("busy1"),
      run("busy1"),
      run("busy1", { key: "due-a" }),
      run("busy1", { key: "due-b" }),
    ]);
    const plain = (sql: Sql) => claimRuns(sql, "w", 16, LEASE_MS, ECHO);
    const limited = (sql: Sql) => claimLimitedRuns(sql, "w", 16, LEASE_MS, KEYED);
    // A hundred not-due first, so the indexes have their depth at both sizes.
    await notDue(db.sql, 100);
    const before = [await claimReads(db, plain), await claimReads(db, limited)];
    await notDue(db.sql, 1_000);
    const after = [await claimReads(db, plain), await claimReads(db, limited)];
    assert.deepEqual(after.map((a) => a.claimed), [3, 2], "the due runs are claimed");
    for (const [i, name] of ["claimRuns", "claimLimitedRuns"].entries()) {
      // A few index pages deeper at most: nothing of the 1,000 is read.
      assert.ok(
        after[i].rows <= before[i].rows + 2,
        `${name} read ${after[i].rows} rows beside 1,000 not-due (${before[i].rows} without)`,
      );
      assert.ok(
        after[i].buffers <= before[i].buffers + 20,
        `${name} touched ${after[i].buffers} buffers beside 1,000 not-due ` +
          `(${before[i].buffers} without)`,
      );
      assert.ok(after[i].rows <= 80, `${name} read ${after[i].rows} rows to claim a few`);
    }
  });
});

/** Index probes of `runs` in a plan: the loops of its index scans. */
function runsProbes(plan: PlanNode): number {
  let loops = 0;
  const walk = (node: PlanNode) => {
    const n = node as PlanNode & Record<string, number>;
    if (node["Relation Name"] === "runs" && String(node["Node Type"]).includes("Index")) {
      loops += n["Actual Loops"] ?? 1;
    }
    for (const c of node.Plans ?? []) walk(c);
  };
  walk(plan);
  return loops;
}

Deno.test("claims: a lane or group pays index probes for the priorities its runs hold, not for all 21 a run may have", async () => {
  await withDb(async (db) => {
    await tenants(db.sql, "p", 16);
    const runs: NewRun[] = [];
    for (let t = 1; t <= 16; t++) {
      runs.push(run(`p${t}`), run(`p${t}`), run(`p${t}`, { key: `k${t}` }));
      runs.push(run(`p${t}`, { key: `k${t}` }));
    }
    await insertRuns(db.sql, runs);
    for (
      const [name, call] of [
        ["claimRuns", (sql: Sql) => claimRuns(sql, "w", 16, LEASE_MS, ECHO)],
        ["claimLimitedRuns", (sql: Sql) => claimLimitedRuns(sql, "w", 16, LEASE_MS, KEYED)],
      ] as const
    ) {
      const spy = capturingPool(db.url);
      try {
        const [stmt] = await spy.capture(call);
        const { plan, result } = await explainAnalyze(db.sql, stmt);
        assert.equal(result, 16, `${name} claims one run of each of 16 lanes or groups`);
        // Per lane or group of one priority: two probes find its priorities,
        // one its share (or its next runs), one its next run; one more per
        // claimed run (its row by key). One probe per possible priority
        // (21) would be well over 300.
        const probes = runsProbes(plan);
        assert.ok(probes <= 16 * 6, `${name}: ${probes} index probes of runs for 16 lanes`);
      } finally {
        await spy.sql.end();
      }
    }
  });
});

Deno.test("claims: a due group behind 1,000 not-due groups, and a due tenant behind 1,000 not-due tenants, are taken by the first claim", async () => {
  await withDb(async (db) => {
    await notDue(db.sql, 1_000);
    await tenants(db.sql, "late", 1);
    const [group, lane] = await insertRuns(db.sql, [
      run("keys1", { key: "due" }),
      run("late1"),
    ]);
    const limited = await claimLimitedRuns(db.sql, "w", 4, LEASE_MS, KEYED);
    assert.deepEqual(limited.map((r) => r.run_id), [group.run_id]);
    const plain = await claimRuns(db.sql, "w", 4, LEASE_MS, ECHO);
    assert.deepEqual(plain.map((r) => r.run_id), [lane.run_id]);
  });
});

/**
 * Lanes and groups whose due time is later than a queued run of theirs and
 * than now (a run left behind: no claim would look before its due time).
 */
async function stranded(sql: Sql): Promise<Record<string, unknown>[]> {
  const rows = await sql<Record<string, unknown>[]>`
    select r.tenant_id, r.workflow_name, r.concurrency_key, min(r.run_after) as run_after,
           min(coalesce(l.ready_at, s.due_at)) as due
      from runs r
      left join queue_lanes l
        on r.concurrency_key is null and l.tenant_id = r.tenant_id
       and l.workflow_name = r.workflow_name and l.workflow_version = r.workflow_version
      left join concurrency_slots s
        on s.tenant_id = r.tenant_id and s.workflow_name = r.workflow_name
       and s.concurrency_key = r.concurrency_key
     where r.status = 'queued'
     group by 1, 2, 3
    having min(coalesce(l.ready_at, s.due_at, 'infinity')) > greatest(min(r.run_after), now())`;
  return [...rows];
}

Deno.test("claims: a due run queued while a claim exhausts its lane or group is never stranded", async () => {
  await withDb(async (db) => {
    await tenants(db.sql, "race", 4);
    let admitted = 0;
    for (let round = 0; round < 150; round++) {
      const tenant = `race${1 + round % 4}`;
      const key = round % 2 ? { key: `g${round % 3}` } : {};
      // The lane (group) holds one due run; a claim takes it while another
      // run of it is admitted.
      await insertRuns(db.sql, [run(tenant, key)]);
      const claim = (round % 2 ? claimLimitedRuns : claimRuns)(
        db.sql,
        "w",
        16,
        LEASE_MS,
        round % 2 ? KEYED : ECHO,
      );
      const admit = (async () => {
        // Spread the admission over the claim's length.
        for (let i = 0; i < round % 5; i++) await db.sql`select 1`;
        await insertRuns(db.sql, [run(tenant, key)]);
      })();
      await Promise.all([claim, admit]);
      admitted += 2;
      assert.deepEqual(await stranded(db.sql), [], `round ${round}`);
      // Room again in every group.
      await db.sql`update runs set status = 'succeeded', lease_owner = null,
                                   lease_expires_at = null, finished_at = now()
                    where status = 'running'`;
      await db.sql`update concurrency_slots set running = 0`;
    }
    // Every run is claimed in the end, by claims alone.
    let claimed = await db.sql<{ n: number }[]>`
      select count(*)::int as n from runs where status <> 'queued'`.then((r) => r[0].n);
    for (let idle = 0; idle < 3;) {
      const got = [
        ...await claimRuns(db.sql, "w", 16, LEASE_MS, ECHO),
        ...await claimLimitedRuns(db.sql, "w", 16, LEASE_MS, KEYED),
      ];
      claimed += got.length;
      idle = got.length ? 0 : idle + 1;
      await db.sql`update concurrency_slots set running = 0`;
    }
    assert.equal(claimed, admitted);
  });
});

/** The lane's due time (the group's, with `key`). */
async function dueTime(sql: Sql, tenant: string, key?: string): Promise<Date> {
  const [row] = key === undefined
    ? await sql<{ t: Date }[]>`select ready_at as t from queue_lanes where tenant_id = ${tenant}`
    : await sql<{ t: Date }[]>`select due_at as t from concurrency_slots
                                where tenant_id = ${tenant} and concurrency_key = ${key}`;
  return row.t;
}

Deno.test("claims: lanes and groups stay consistent through retry, release, reclaim and cancel, and a claim pushes them to their next run", async () => {
  await withDb(async (db) => {
    await tenants(db.sql, "t", 1);
    for (const key of [undefined, "g"]) {
      const opts = key === undefined ? {} : { key };
      const claim = async (leaseMs = LEASE_MS): Promise<ClaimedRun[]> =>
        key === undefined
          ? [...await claimRuns(db.sql, "w", 4, leaseMs, ECHO)]
          : [...await claimLimitedRuns(db.sql, "w", 4, leaseMs, KEYED)];
      const [a] = await insertRuns(db.sql, [run("t1", opts)]);
      const later = await insertRuns(db.sql, [run("t1", { ...opts, runAfter: TOMORROW() })]);
      let [r] = await claim();
      assert.equal(r.run_id, a.run_id);
      // The lane ran dry of due runs: pushed to its next run, tomorrow.
      assert.equal((await dueTime(db.sql, "t1", key)).getTime(), later[0].run_after.getTime());
      // A retry in an hour lowers it to the retry.
      const retry = await failAttempt(db.sql, "t1", r.run_id, "w", r.attempts, {
        message: "x",
      }, 3600_000);
      assert.equal(retry?.status, "queued");
      assert.equal((await dueTime(db.sql, "t1", key)).getTime(), retry!.retry_at.getTime());
      assert.deepEqual(await stranded(db.sql), []);
      assert.deepEqual(await claim(), [], "nothing due");
      // A release makes a run due at once.
      const [b] = await insertRuns(db.sql, [run("t1", opts)]);
      [r] = await claim();
      assert.equal(r.run_id, b.run_id);
      assert.equal(await releaseRun(db.sql, "t1", r.run_id, "w", r.attempts, "stop"), "queued");
      assert.deepEqual(await stranded(db.sql), []);
      assert.ok((await dueTime(db.sql, "t1", key)).getTime() <= Date.now());
      // A lease that expires: reclaimed, due again at once.
      [r] = await claim(1);
      assert.equal(r.run_id, b.run_id);
      await waitFor("the lease expired and was reclaimed", async () => {
        return (await reclaimExpired(db.sql, 10)).length > 0;
      }, 10_000);
      assert.deepEqual(await stranded(db.sql), []);
      assert.ok((await dueTime(db.sql, "t1", key)).getTime() <= Date.now());
      // Cancelled while queued: the lane may look due, and the claim that
      // finds nothing pushes it to its next run, the retry in an hour.
      assert.equal((await requestCancel(db.sql, "t1", b.run_id))?.status, "cancelled");
      assert.deepEqual(await stranded(db.sql), []);
      assert.deepEqual(await claim(), []);
      assert.equal((await dueTime(db.sql, "t1", key)).getTime(), retry!.retry_at.getTime());
      for (const id of [a.run_id, later[0].run_id]) await requestCancel(db.sql, "t1", id);
      if (key === undefined) {
        // Nothing queued: once a claim looks (as if the hour had passed),
        // the lane waits for 'infinity'.
        await db.sql`update queue_lanes set ready_at = now()`;
        assert.deepEqual(await claim(), []);
        const [{ never }] = await db.sql<{ never: boolean }[]>`
          select ready_at = 'infinity' as never from queue_lanes where tenant_id = 't1'`;
        assert.ok(never);
      }
    }
  });
});
