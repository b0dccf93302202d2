/**
 * The purge of finished runs, against a real Postgres (a database of this
 * file's own): old finished runs go with their events, in batches of at most
 * the limit; young finished runs, unfinished runs of any age and runs with an
 * event still to ship stay.
 */
import assert from "node:assert/strict";
import { insertTenant } from "../db/auth.ts";
import type { Sql } from "../db/pool.ts";
import { purgeFinishedRuns } from "../db/retention.ts";
import { DAY } from "../core/time.ts";
import { freshDatabase } from "./support/db.ts";

const TENANT = "acme";

/**
 * `n` runs of `status`, finished (or, unfinished, created) `ageDays` ago,
 * each with two events: published, or as `events` says. Returns their ids.
 */
async function runs(
  sql: Sql,
  n: number,
  status: string,
  ageDays: number,
  events: "published" | "pending" | "parked" = "published",
): Promise<string[]> {
  const finished = ["succeeded", "failed", "cancelled"].includes(status);
  const rows = await sql<{ run_id: string }[]>`
    insert into runs (tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input,
                      source, status, max_attempts, created_at, finished_at, lease_owner,
                      lease_expires_at, event_seq)
    select ${TENANT}, gen_random_uuid(), 'echo', 'echo', 1, 'null', 'test', ${status}, 3,
           now() - ${ageDays} * interval '1 day',
           case when ${finished} then now() - ${ageDays} * interval '1 day' end,
           case when ${status} = 'running' then 'w' end,
           case when ${status} = 'running' then now() + interval '1 minute' end,
           2
      from generate_series(1, ${n})
    returning run_id`;
  const ids = rows.map((r) => r.run_id);
  await sql`
    insert into work_events (tenant_id, run_id, seq, type, payload, published_at, parked_at,
                             parked_reason)
    select ${TENANT}, id, s, 'run.x', '{}',
           case when ${events} = 'published' or s = 1 then now() end,
           case when ${events} = 'parked' and s = 2 then now() end,
           case when ${events} = 'parked' and s = 2 then 'test' end
      from unnest(${ids}::uuid[]) id, generate_series(1, 2) s`;
  return ids;
}

async function remaining(sql: Sql, ids: string[]): Promise<{ runs: number; events: number }> {
  const [r] = await sql<{ runs: number; events: number }[]>`
    select (select count(*) from runs where run_id = any(${ids}::uuid[]))::int as runs,
           (select count(*) from work_events where run_id = any(${ids}::uuid[]))::int as events`;
  return r;
}

Deno.test("retention: old finished runs are purged with their events, at most `limit` per statement; young, unfinished and unshipped ones stay", async () => {
  const db = await freshDatabase();
  try {
    await insertTenant(db.sql, TENANT);
    const old = [
      ...await runs(db.sql, 9, "succeeded", 40),
      ...await runs(db.sql, 3, "failed", 40),
      ...await runs(db.sql, 2, "cancelled", 40),
    ];
    const oldParked = await runs(db.sql, 1, "failed", 40, "parked");
    const young = await runs(db.sql, 5, "succeeded", 10);
    const unfinished = [
      ...await runs(db.sql, 3, "queued", 40),
      ...await runs(db.sql, 2, "running", 40),
    ];
    const unshipped = await runs(db.sql, 2, "succeeded", 40, "pending");

    const batches: number[] = [];
    for (;;) {
      const r = await purgeFinishedRuns(db.sql, 30 * DAY, 4);
      assert.equal(r.events, 2 * r.runs, "every event of a purged run goes with it");
      batches.push(r.runs);
      if (r.runs < 4) break;
    }
    assert.deepEqual(batches, [4, 4, 4, 3]);
    assert.deepEqual(await remaining(db.sql, [...old, ...oldParked]), { runs: 0, events: 0 });
    assert.deepEqual(await remaining(db.sql, young), { runs: 5, events: 10 });
    assert.deepEqual(await remaining(db.sql, unfinished), { runs: 5, events: 10 });
    assert.deepEqual(await remaining(db.sql, unshipped), { runs: 2, events: 4 });

    // Once the outbox shipped them, they go too.
    await db.sql`update work_events set published_at = now()
                  where run_id = any(${unshipped}::uuid[]) and published_at is null`;
    assert.deepEqual(await purgeFinishedRuns(db.sql, 30 * DAY, 4), { runs: 2, events: 4 });
    assert.deepEqual(await purgeFinishedRuns(db.sql, 30 * DAY, 4), { runs: 0, events: 0 });
  } finally {
    await db.drop();
  }
});

Deno.test("retention: a purger skips the runs another holds instead of waiting for them", async () => {
  const db = await freshDatabase();
  try {
    await insertTenant(db.sql, TENANT);
    const ids = await runs(db.sql, 6, "succeeded", 40);
    const held = ids.slice(0, 3);
    const reserved = await db.sql.reserve();
    try {
      await reserved`begin`;
      await reserved`select 1 from runs where run_id = any(${held}::uuid[]) for update`;
      assert.deepEqual(await purgeFinishedRuns(db.sql, 30 * DAY, 100), { runs: 3, events: 6 });
      assert.deepEqual(await remaining(db.sql, held), { runs: 3, events: 6 });
      await reserved`rollback`;
    } finally {
      reserved.release();
    }
    assert.deepEqual(await purgeFinishedRuns(db.sql, 30 * DAY, 100), { runs: 3, events: 6 });
  } finally {
    await db.drop();
  }
});

Deno.test("retention: the purge is sent unprepared, so no plan made on a young table outlives its growth", async () => {
  const db = await freshDatabase();
  try {
    await insertTenant(db.sql, TENANT);
    const conn = await db.sql.reserve();
    try {
      // Beyond plan_cache_mode's five custom plans: a prepared statement
      // would be in the session's cache by now.
      for (let i = 0; i < 7; i++) await purgeFinishedRuns(conn as unknown as Sql, 30 * DAY, 10);
      const [{ n }] = await conn<{ n: number }[]>`
        select count(*)::int as n from pg_prepared_statements
         where strpos(statement, ${"with doomed as"}) > 0`;
      assert.equal(n, 0);
    } finally {
      conn.release();
    }
  } finally {
    await db.drop();
  }
});

Deno.test("retention: a child is kept while its root lives, and goes after it, the whole tree", async () => {
  const db = await freshDatabase();
  try {
    await insertTenant(db.sql, TENANT);
    const [root, other] = await runs(db.sql, 2, "succeeded", 40);
    // The root's tree: old finished children and a grandchild, and a young one.
    const kids = await runs(db.sql, 3, "succeeded", 50);
    const [young] = await runs(db.sql, 1, "failed", 1);
    await db.sql`update runs set parent_run_id = ${root}, root_run_id = ${root}
                  where run_id = any(${[...kids, young]}::uuid[])`;
    await db.sql`update runs set parent_run_id = ${kids[0]} where run_id = ${kids[2]}`;
    // A tree whose root is still running: its old finished child stays.
    const [live] = await runs(db.sql, 1, "running", 40);
    const [liveKid] = await runs(db.sql, 1, "succeeded", 40);
    await db.sql`update runs set parent_run_id = ${live}, root_run_id = ${live}
                  where run_id = ${liveKid}`;

    // The first batch takes the roots only; the children follow in the next.
    assert.deepEqual(await purgeFinishedRuns(db.sql, 30 * DAY, 100), { runs: 2, events: 4 });
    assert.deepEqual(await remaining(db.sql, [root, other]), { runs: 0, events: 0 });
    assert.deepEqual(await remaining(db.sql, kids), { runs: 3, events: 6 });
    assert.deepEqual(await purgeFinishedRuns(db.sql, 30 * DAY, 100), { runs: 3, events: 6 });
    assert.deepEqual(await remaining(db.sql, kids), { runs: 0, events: 0 });
    // Past neither retention: the young child, and the live root's child.
    assert.deepEqual(await purgeFinishedRuns(db.sql, 30 * DAY, 100), { runs: 0, events: 0 });
    assert.deepEqual(await remaining(db.sql, [young, live, liveKid]), { runs: 3, events: 6 });
  } finally {
    await db.drop();
  }
});

Deno.test("retention: the dispatch keys that joined a debounced run go with it, and only its", async () => {
  const db = await freshDatabase();
  try {
    await insertTenant(db.sql, TENANT);
    const [old] = await runs(db.sql, 1, "succeeded", 40);
    const [young] = await runs(db.sql, 1, "succeeded", 10);
    await db.sql`insert into debounce_joins (tenant_id, dispatch_key, run_id)
                 values (${TENANT}, 'old-1', ${old}), (${TENANT}, 'old-2', ${old}),
                        (${TENANT}, 'young-1', ${young})`;
    assert.deepEqual(await purgeFinishedRuns(db.sql, 30 * DAY, 10), { runs: 1, events: 2 });
    const left = await db.sql<{ dispatch_key: string }[]>`
      select dispatch_key from debounce_joins where tenant_id = ${TENANT} order by 1`;
    assert.deepEqual(left.map((r) => r.dispatch_key), ["young-1"]);
  } finally {
    await db.drop();
  }
});
