/**
 * Debounced admission (db/debounce.ts through admission/admit.ts) against a
 * real Postgres: a burst of requests for one key makes one run with the last
 * input, due `period` after the last request and never past `maxWait` after
 * the first; concurrent requests make one run; a dispatch key still replays;
 * a run that started ends its burst. Times are read from the database.
 */
import assert from "node:assert/strict";
import { z } from "zod";
import { Admission, type AdmitResult } from "../admission/admit.ts";
import { StaticCatalog } from "../admission/catalog.ts";
import { PoimenError } from "../core/errors.ts";
import { insertTenant } from "../db/auth.ts";
import { claimRuns } from "../db/claims.ts";
import { admitDebounced, type DebouncedRow } from "../db/debounce.ts";
import type { Sql } from "../db/pool.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { defineWorkflow } from "../workflows/define.ts";
import { freshDatabase, waitFor } from "./support/db.ts";

const PERIOD = 60_000;
const MAX_WAIT = 600_000;

/** Debounced per customer: one digest a minute after the last change, at most ten after the first. */
const digest = defineWorkflow({
  name: "notify.digest",
  version: 1,
  input: z.object({ customer_id: z.string(), n: z.number() }),
  debounce: { key: "/customer_id", period: PERIOD, maxWait: MAX_WAIT },
  handler: () => Promise.resolve(null),
});

/** A short burst window, to see maxWait end one while requests keep coming. */
const quick = defineWorkflow({
  name: "notify.quick",
  version: 1,
  input: z.object({ customer_id: z.string(), n: z.number() }),
  debounce: { key: "/customer_id", period: 1_500, maxWait: 3_000 },
  handler: () => Promise.resolve(null),
});

/** Its debounce key may be missing from a valid input: such a request is refused. */
const loose = defineWorkflow({
  name: "notify.loose",
  version: 1,
  input: z.object({ customer_id: z.string().optional(), n: z.number() }),
  debounce: { key: "/customer_id", period: 10, maxWait: 10 },
  handler: () => Promise.resolve(null),
});

const registry = builtinRegistry().register(digest).register(quick).register(loose);
const CTX = (tenantId: string) => ({ tenantId, source: "test", entry: "http" as const });

interface Stored {
  run_id: string;
  input: { customer_id: string; n: number };
  status: string;
  debounce_key: string | null;
  /** run_after - updated_at (the last request's statement time), in ms. */
  after_last_ms: number;
  /** run_after - created_at (the first request's statement time), in ms. */
  after_first_ms: number;
  events: number;
}

async function stored(sql: Sql, tenant: string, workflow: string): Promise<Stored[]> {
  return await sql<Stored[]>`
    select run_id, input, status, debounce_key,
           extract(epoch from run_after - updated_at) * 1000 as after_last_ms,
           extract(epoch from run_after - created_at) * 1000 as after_first_ms,
           (select count(*)::int from work_events w
             where w.tenant_id = r.tenant_id and w.run_id = r.run_id) as events
      from runs r
     where tenant_id = ${tenant} and workflow_name = ${workflow}
     order by created_at, run_id`;
}

async function setUp(tenants: string[]) {
  const db = await freshDatabase();
  for (const t of tenants) await insertTenant(db.sql, t);
  const admission = new Admission(db.sql, new StaticCatalog(registry.catalogVersions()), {
    maxBatch: 16,
    maxConcurrent: 2,
  });
  return { db, admission };
}

Deno.test("debounce: ten requests for one customer within a period make one run with the last input, due a period after the last", async () => {
  const { db, admission } = await setUp(["deb-a", "deb-b"]);
  try {
    const results: AdmitResult[] = [];
    for (let n = 1; n <= 10; n++) {
      const input = { customer_id: "c1", n };
      results.push(await admission.admit({ workflow_ref: "notify.digest", input }, CTX("deb-a")));
    }
    // Another customer, and the same customer of another tenant: bursts of their own.
    const other = await admission.admit(
      { workflow_ref: "notify.digest", input: { customer_id: "c2", n: 1 } },
      CTX("deb-a"),
    );
    const elsewhere = await admission.admit(
      { workflow_ref: "notify.digest", input: { customer_id: "c1", n: 1 } },
      CTX("deb-b"),
    );

    const runId = results[0].run.run_id;
    assert.equal(results[0].created, true);
    assert.equal(results[0].debounced, false);
    for (const r of results.slice(1)) {
      assert.equal(r.run.run_id, runId);
      assert.equal(r.created, false);
      assert.equal(r.debounced, true);
    }
    assert.equal(other.created, true);
    assert.equal(elsewhere.created, true);
    assert.notEqual(other.run.run_id, runId);

    const runs = await stored(db.sql, "deb-a", "notify.digest");
    assert.equal(runs.length, 2);
    const [run] = runs;
    assert.equal(run.run_id, runId);
    assert.deepEqual(run.input, { customer_id: "c1", n: 10 });
    assert.equal(run.status, "queued");
    assert.equal(run.debounce_key, "c1");
    // Due a period after the last request, by the database's clock.
    assert.equal(Number(run.after_last_ms), PERIOD);
    assert.equal(run.events, 1, "one run.admitted, none for the requests that joined");
    // The answer carries the run as it is now: its start moved.
    assert.equal(results[9].run.run_after.getTime() - results[9].run.updated_at.getTime(), PERIOD);
    assert.equal((await stored(db.sql, "deb-b", "notify.digest")).length, 1);
  } finally {
    await db.drop();
  }
});

Deno.test("debounce: a run starts maxWait after the first request while requests keep coming, and the next request starts a new burst", async () => {
  const { db, admission } = await setUp(["deb-max"]);
  const hosted = registry.hostedByLimit().unlimited;
  try {
    const first = await admission.admit(
      { workflow_ref: "notify.quick", input: { customer_id: "c1", n: 0 } },
      CTX("deb-max"),
    );
    let n = 0;
    // A request every 50 ms (pacing, far under the period even on a loaded
    // machine) and a claim after each, until the first run has started and a
    // later request made another run.
    const second = await waitFor(
      "a second run after the first started",
      async () => {
        const r = await admission.admit(
          { workflow_ref: "notify.quick", input: { customer_id: "c1", n: ++n } },
          CTX("deb-max"),
        );
        await claimRuns(db.sql, "deb-worker", 10, 60_000, hosted);
        await new Promise((resolve) => setTimeout(resolve, 50));
        return r.run.run_id !== first.run.run_id ? r : undefined;
      },
      20_000,
      0,
    );
    assert.equal(second.created, true);
    const runs = await stored(db.sql, "deb-max", "notify.quick");
    assert.equal(runs[0].run_id, first.run.run_id);
    assert.notEqual(runs[0].status, "queued", "the first run started");
    // Its start was held at maxWait after the first request, never later.
    assert.equal(Number(runs[0].after_first_ms), 3_000);
    assert.ok(runs.length >= 2);
  } finally {
    await db.drop();
  }
});

Deno.test("debounce: 20 concurrent requests for one key make one run", async () => {
  const { db, admission } = await setUp(["deb-race"]);
  try {
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, n) =>
        admission.admit(
          { workflow_ref: "notify.digest", input: { customer_id: "c1", n } },
          CTX("deb-race"),
        )),
    );
    assert.equal(new Set(results.map((r) => r.run.run_id)).size, 1);
    assert.equal(results.filter((r) => r.created).length, 1);
    assert.equal(results.filter((r) => r.debounced).length, 19);
    const runs = await stored(db.sql, "deb-race", "notify.digest");
    assert.equal(runs.length, 1);
    assert.equal(runs[0].events, 1);
  } finally {
    await db.drop();
  }
});

Deno.test("debounce: requests racing an uncommitted run wait for it, then join it (its debounce key) or replay it (its dispatch key)", async () => {
  const { db, admission } = await setUp(["deb-race-key"]);
  const tenant = "deb-race-key";
  const req = (customer: string, n: number, dispatch_key?: string) =>
    admission.admit(
      { workflow_ref: "notify.digest", input: { customer_id: customer, n }, dispatch_key },
      CTX(tenant),
    );
  try {
    // The first request's statement, in a transaction held open: the others
    // reach the unique indexes while its run is not committed.
    let commit!: () => void;
    const committed = new Promise<void>((resolve) => commit = resolve);
    let first!: DebouncedRow;
    const held = db.sql.begin(async (tx) => {
      first = await admitDebounced(tx as unknown as Sql, {
        tenant_id: tenant,
        run_id: crypto.randomUUID(),
        workflow_ref: "notify.digest",
        workflow_name: "notify.digest",
        workflow_version: 1,
        input: { customer_id: "c1", n: 0 },
        goal_id: null,
        dispatch_key: "k1",
        source: "test",
        max_attempts: 3,
        run_after: null,
        debounce_key: "c1",
        period_ms: PERIOD,
        max_wait_ms: MAX_WAIT,
      });
      await committed;
    });
    await waitFor("the first request's run inserted", () => first !== undefined);
    // Same debounce key: they wait on the pending index, then join.
    const joiners = [1, 2, 3].map((n) => req("c1", n));
    // Same dispatch key, another customer: a unique violation, run again: a replay.
    const replays = [4, 5].map((n) => req(`other-${n}`, n, "k1"));
    await waitFor("five requests waiting on the first's locks", async () => {
      const [{ n }] = await db.sql<{ n: number }[]>`
        select count(*)::int as n from pg_stat_activity
         where datname = current_database() and wait_event_type = 'Lock'`;
      return n >= 5;
    });
    commit();
    await held;
    const joined = await Promise.all(joiners);
    const replayed = await Promise.all(replays);
    for (const r of [...joined, ...replayed]) assert.equal(r.run.run_id, first.run_id);
    assert.deepEqual(joined.map((r) => [r.created, r.debounced]), [
      [false, true],
      [false, true],
      [false, true],
    ]);
    assert.deepEqual(replayed.map((r) => [r.created, r.debounced]), [
      [false, undefined],
      [false, undefined],
    ]);
    const runs = await stored(db.sql, tenant, "notify.digest");
    assert.equal(runs.length, 1);
    assert.equal(runs[0].events, 1);
  } finally {
    await db.drop();
  }
});

Deno.test("debounce: a dispatch key a run holds, or that joined it, replays it, before and after it started, and moves nothing", async () => {
  const { db, admission } = await setUp(["deb-key"]);
  const hosted = registry.hostedByLimit().unlimited;
  try {
    const req = (n: number, dispatch_key?: string) =>
      admission.admit(
        { workflow_ref: "notify.digest", input: { customer_id: "c1", n }, dispatch_key },
        CTX("deb-key"),
      );
    const a = await req(1, "d1");
    const b = await req(2, "d2");
    assert.equal(b.run.run_id, a.run.run_id);
    assert.equal(b.debounced, true);
    const before = await stored(db.sql, "deb-key", "notify.digest");

    const replay = await req(3, "d1");
    assert.equal(replay.run.run_id, a.run.run_id);
    assert.equal(replay.created, false);
    assert.equal(replay.debounced, undefined, "a replay says nothing of debounce");
    assert.equal(replay.sameBody, false);
    // The key of a request that joined the run replays it too.
    const joinedAgain = await req(3, "d2");
    assert.equal(joinedAgain.run.run_id, a.run.run_id);
    assert.deepEqual([joinedAgain.created, joinedAgain.debounced], [false, undefined]);
    const after = await stored(db.sql, "deb-key", "notify.digest");
    assert.deepEqual(after, before, "a replay replaces no input and moves no start");
    assert.deepEqual(after[0].input, { customer_id: "c1", n: 2 });

    // Started: a replay still returns it; a keyless request starts a new burst.
    await db.sql`update runs set run_after = now() where tenant_id = 'deb-key'`;
    await db.sql`update queue_lanes set ready_at = now() where tenant_id = 'deb-key'`;
    const claimed = await claimRuns(db.sql, "deb-worker", 10, 60_000, hosted);
    assert.equal(claimed.length, 1);
    assert.equal((await req(4, "d1")).run.run_id, a.run.run_id);
    assert.equal((await req(4, "d2")).run.run_id, a.run.run_id);
    const fresh = await req(5);
    assert.equal(fresh.created, true);
    assert.notEqual(fresh.run.run_id, a.run.run_id);
  } finally {
    await db.drop();
  }
});

Deno.test("debounce: a request without the key, or with a run_after, is refused", async () => {
  const { db, admission } = await setUp(["deb-bad"]);
  try {
    await assert.rejects(
      admission.admit(
        {
          workflow_ref: "notify.digest",
          input: { customer_id: "c1", n: 1 },
          run_after: "2030-01-01T00:00:00Z",
        },
        CTX("deb-bad"),
      ),
      (e) =>
        e instanceof PoimenError && e.code === "validation" &&
        JSON.stringify(e.errors).includes("run_after"),
    );
    await assert.rejects(
      admission.admit({ workflow_ref: "notify.loose", input: { n: 1 } }, CTX("deb-bad")),
      (e) =>
        e instanceof PoimenError && e.code === "validation" &&
        JSON.stringify(e.errors).includes("debounce key"),
    );
    assert.equal((await stored(db.sql, "deb-bad", "notify.digest")).length, 0);
  } finally {
    await db.drop();
  }
});
