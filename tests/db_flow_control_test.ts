/**
 * Flow control in the queue, against a real Postgres: concurrency limits per
 * workflow and key (db/claims.ts `claimLimitedRuns`, the counts of
 * migration 011 moved by every statement that moves a limited run) and
 * priorities (higher first within a tenant, tenants still taking turns).
 */
import assert from "node:assert/strict";
import { z } from "zod";
import { Admission } from "../admission/admit.ts";
import { PoimenError } from "../core/errors.ts";
import { insertTenant } from "../db/auth.ts";
import type { Sql } from "../db/pool.ts";
import { completeRun, failAttempt, releaseRun } from "../db/attempt_end.ts";
import { requestCancel } from "../db/cancellation.ts";
import { type ClaimedRun, claimLimitedRuns, claimRuns } from "../db/claims.ts";
import { reclaimExpired } from "../db/leases.ts";
import { selectRun } from "../db/runs.ts";
import { purgeIdleConcurrencyGroups } from "../db/retention.ts";
import { registerVersions, renewWorker } from "../db/catalog.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { defineWorkflow } from "../workflows/define.ts";
import { catalogOf, perCustomer } from "./support/catalog.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";

const LEASE_MS = 30_000;

const perTenant = defineWorkflow({
  name: "shop.batch",
  version: 1,
  input: z.object({ n: z.number() }),
  concurrency: { limit: 2 },
  handler: () => Promise.resolve(null),
});

function registry(): WorkflowRegistry {
  const r = builtinRegistry();
  r.register(perCustomer).register(perTenant);
  return r;
}
const HOSTED = registry().hostedByLimit();

interface Setup {
  db: TestDatabase;
  admission: Admission;
  admit(
    tenant: string,
    ref: string,
    input: unknown,
    extra?: { priority?: number; dispatch_key?: string; run_after?: string },
  ): Promise<string>;
}

async function setup(tenants = ["acme"]): Promise<Setup> {
  const db = await freshDatabase();
  for (const t of tenants) await insertTenant(db.sql, t);
  const admission = new Admission(db.sql, catalogOf(registry()), {
    maxBatch: 64,
    maxConcurrent: 2,
  });
  return {
    db,
    admission,
    async admit(tenant, ref, input, extra = {}) {
      const { run } = await admission.admit({ workflow_ref: ref, input, ...extra }, {
        tenantId: tenant,
        source: "test",
        entry: "http",
      });
      return run.run_id;
    },
  };
}

/** Groups whose counts differ from their runs (none when every statement kept them). */
async function countDrift(sql: Sql): Promise<Record<string, unknown>[]> {
  const rows = await sql<Record<string, unknown>[]>`
    with actual as (
      select tenant_id, workflow_name, concurrency_key,
             count(*) filter (where status = 'running')::int as running,
             count(*) filter (where status = 'queued')::int as queued
        from runs where concurrency_key is not null group by 1, 2, 3
    )
    select s.tenant_id, s.workflow_name, s.concurrency_key, s.running, s.queued,
           coalesce(a.running, 0) as actual_running, coalesce(a.queued, 0) as actual_queued
      from concurrency_slots s
      left join actual a using (tenant_id, workflow_name, concurrency_key)
     where s.running <> coalesce(a.running, 0) or s.queued <> coalesce(a.queued, 0)`;
  return [...rows];
}

/** The most runs running at once in any group, per group key `workflow/key`. */
async function runningPerGroup(sql: Sql): Promise<Map<string, number>> {
  const rows = await sql<{ g: string; n: number }[]>`
    select workflow_name || '/' || concurrency_key as g, count(*)::int as n from runs
     where status = 'running' and concurrency_key is not null group by 1`;
  return new Map(rows.map((r) => [r.g, r.n]));
}

const claimLimited = async (sql: Sql, owner: string, n: number, leaseMs = LEASE_MS) => [
  ...await claimLimitedRuns(sql, owner, n, leaseMs, HOSTED.limited),
];

Deno.test("concurrency: a claim starts at most the limit per key; the next run of a key starts when its slot frees, in order", async () => {
  const s = await setup();
  try {
    const ids: Record<string, string[]> = { a: [], b: [], c: [] };
    for (let n = 0; n < 4; n++) {
      for (const c of ["a", "b", "c"]) {
        ids[c].push(await s.admit("acme", "shop.sync", { customer_id: c, n }));
      }
    }
    const first = await claimLimited(s.db.sql, "w1", 16);
    assert.deepEqual(first.map((r) => r.run_id).sort(), [ids.a[0], ids.b[0], ids.c[0]].sort());
    assert.deepEqual(await claimLimited(s.db.sql, "w2", 16), [], "every key is at its limit");
    // The unlimited claim never takes a limited run.
    assert.equal((await claimRuns(s.db.sql, "w2", 16, LEASE_MS, HOSTED.unlimited)).length, 0);
    const a0 = first.find((r) => r.run_id === ids.a[0])!;
    assert.ok(await completeRun(s.db.sql, "acme", a0.run_id, "w1", a0.attempts, null));
    const next = await claimLimited(s.db.sql, "w2", 16);
    assert.deepEqual(next.map((r) => r.run_id), [ids.a[1]]);
    assert.deepEqual(await countDrift(s.db.sql), []);
  } finally {
    await s.db.drop();
  }
});

Deno.test("concurrency: without a key the limit is per tenant and workflow; another tenant has its own", async () => {
  const s = await setup(["acme", "beta"]);
  try {
    for (let n = 0; n < 5; n++) {
      await s.admit("acme", "shop.batch", { n });
      await s.admit("beta", "shop.batch", { n });
    }
    const claimed = await claimLimited(s.db.sql, "w1", 16);
    const per = new Map<string, number>();
    for (const r of claimed) per.set(r.tenant_id, (per.get(r.tenant_id) ?? 0) + 1);
    assert.deepEqual(Object.fromEntries(per), { acme: 2, beta: 2 });
    const [row] = await s.db.sql<{ concurrency_key: string }[]>`
      select concurrency_key from runs where run_id = ${claimed[0].run_id}`;
    assert.equal(row.concurrency_key, "");
  } finally {
    await s.db.drop();
  }
});

Deno.test("concurrency: every end of an attempt frees the slot once — success, retry, release, reclaim — and a cancelled queued run leaves the count", async () => {
  const s = await setup();
  try {
    const ids = [];
    for (let n = 0; n < 6; n++) {
      ids.push(await s.admit("acme", "shop.sync", { customer_id: "x", n }));
    }
    const claimOne = async (leaseMs = LEASE_MS): Promise<ClaimedRun> => {
      const got = await claimLimited(s.db.sql, "w1", 4, leaseMs);
      assert.equal(got.length, 1, "one run of the key at a time");
      assert.deepEqual(await claimLimited(s.db.sql, "w2", 4), []);
      return got[0];
    };
    // Retry: back to the queue (due in 0 ms), slot freed.
    let r = await claimOne();
    assert.equal(r.run_id, ids[0]);
    assert.equal(
      (await failAttempt(s.db.sql, "acme", r.run_id, "w1", r.attempts, { message: "x" }, 0))
        ?.status,
      "queued",
    );
    assert.deepEqual(await countDrift(s.db.sql), []);
    // Release on shutdown: queued again.
    r = await claimOne();
    assert.equal(await releaseRun(s.db.sql, "acme", r.run_id, "w1", r.attempts, "stop"), "queued");
    assert.deepEqual(await countDrift(s.db.sql), []);
    // A lease that expires: reclaimed once, its slot freed once.
    r = await claimOne(1);
    const reclaimed = await waitFor("the lease expired and was reclaimed", async () => {
      const got = await reclaimExpired(s.db.sql, 10);
      return got.length > 0 ? got : undefined;
    }, 10_000);
    assert.equal(reclaimed[0].run_id, r.run_id);
    assert.equal((await reclaimExpired(s.db.sql, 10)).length, 0);
    assert.deepEqual(await countDrift(s.db.sql), []);
    // Cancelling a queued run of the key.
    assert.equal((await requestCancel(s.db.sql, "acme", ids[5]))?.status, "cancelled");
    assert.deepEqual(await countDrift(s.db.sql), []);
    // Success: the slot frees and the next one starts.
    r = await claimOne();
    assert.ok(await completeRun(s.db.sql, "acme", r.run_id, "w1", r.attempts, 1));
    assert.deepEqual(await countDrift(s.db.sql), []);
    const [slot] = await s.db.sql<{ running: number; queued: number }[]>`
      select running, queued from concurrency_slots where tenant_id = 'acme'`;
    assert.deepEqual({ ...slot }, { running: 0, queued: 4 });
  } finally {
    await s.db.drop();
  }
});

Deno.test("concurrency: many workers claiming and finishing at once never run more than the limit of one key, and all runs finish", async () => {
  const s = await setup();
  try {
    const customers = 6;
    const total = 120;
    for (let n = 0; n < total; n++) {
      await s.admit("acme", "shop.sync", { customer_id: `c${n % customers}`, n });
    }
    for (let n = 0; n < 20; n++) await s.admit("acme", "shop.batch", { n });
    let finished = 0;
    let worst = 0;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        for (const [g, n] of await runningPerGroup(s.db.sql)) {
          const limit = g.startsWith("shop.batch/") ? 2 : 1;
          worst = Math.max(worst, n - limit);
        }
      }
    })();
    const worker = async (owner: string) => {
      for (let idle = 0; idle < 50;) {
        const got = await claimLimited(s.db.sql, owner, 4);
        if (got.length === 0) {
          idle++;
          await new Promise((r) => setTimeout(r, 2));
          continue;
        }
        idle = 0;
        await Promise.all(got.map(async (r) => {
          // Some attempts fail once (and are retried at once), some succeed.
          if (r.attempts === 1 && Math.random() < 0.2) {
            await failAttempt(s.db.sql, r.tenant_id, r.run_id, owner, r.attempts, {
              message: "flaky",
            }, 0);
          } else if (await completeRun(s.db.sql, r.tenant_id, r.run_id, owner, r.attempts, 1)) {
            finished++;
          }
        }));
      }
    };
    await Promise.all(["w1", "w2", "w3", "w4"].map(worker));
    sampling = false;
    await sampler;
    assert.equal(worst, 0, "a group ran more runs at once than its limit");
    assert.equal(finished, total + 20);
    assert.deepEqual(await countDrift(s.db.sql), []);
  } finally {
    await s.db.drop();
  }
});

Deno.test("concurrency: a run's GET says it waits on the limit of its key", async () => {
  const s = await setup();
  try {
    await renewWorker(s.db.sql, "w1", ["shop.sync@1"], LEASE_MS);
    await s.admit("acme", "shop.sync", { customer_id: "k", n: 0 });
    const second = await s.admit("acme", "shop.sync", { customer_id: "k", n: 1 });
    assert.equal(
      (await selectRun(s.db.sql, "acme", second, { waiting: true }))?.waiting_reason,
      "slot",
    );
    assert.equal((await claimLimited(s.db.sql, "w1", 4)).length, 1);
    const row = await selectRun(s.db.sql, "acme", second, { waiting: true });
    assert.equal(row?.waiting_reason, "concurrency");
    assert.equal(row?.concurrency_key, "k");
    assert.equal(row?.slot_limit, 1);
    assert.equal(row?.slot_running, 1);
  } finally {
    await s.db.drop();
  }
});

Deno.test("concurrency: an input without a value at the key pointer is refused with the field named; numbers are keys too", async () => {
  const s = await setup();
  try {
    await assert.rejects(
      () => s.admit("acme", "shop.sync", { n: 1 }),
      (err: unknown) =>
        err instanceof PoimenError && err.code === "validation" &&
        JSON.stringify(err.errors).includes("input.customer_id"),
    );
    const byNumber = defineWorkflow({
      name: "shop.num",
      version: 1,
      input: z.object({ id: z.number() }),
      concurrency: { limit: 1, key: "/id" },
      handler: () => Promise.resolve(null),
    });
    const admission = new Admission(s.db.sql, catalogOf(new WorkflowRegistry([byNumber])), {
      maxBatch: 8,
      maxConcurrent: 1,
    });
    const { run } = await admission.admit({ workflow_ref: "shop.num", input: { id: 42 } }, {
      tenantId: "acme",
      source: "test",
      entry: "http",
    });
    assert.equal(run.concurrency_key, "42");
    const [count] = await s.db.sql<{ n: number }[]>`select count(*)::int as n from runs`;
    assert.equal(count.n, 1, "the refused admission wrote nothing");
  } finally {
    await s.db.drop();
  }
});

Deno.test("priority: a tenant's higher priority run is claimed before its older runs; a replay keeps the first priority", async () => {
  const s = await setup();
  try {
    for (let n = 0; n < 5; n++) await s.admit("acme", "echo", { n });
    const urgent = await s.admit("acme", "echo", { n: "urgent" }, {
      priority: 10,
      dispatch_key: "urgent",
    });
    const replay = await s.admission.admit({
      workflow_ref: "echo",
      input: { n: "urgent" },
      dispatch_key: "urgent",
      priority: -10,
    }, { tenantId: "acme", source: "test", entry: "http" });
    assert.equal(replay.created, false);
    assert.equal(replay.run.priority, 10);
    const low = await s.admit("acme", "echo", { n: "low" }, { priority: -5 });
    const [first] = await claimRuns(s.db.sql, "w1", 1, LEASE_MS, HOSTED.unlimited);
    assert.equal(first.run_id, urgent);
    const rest = await claimRuns(s.db.sql, "w1", 16, LEASE_MS, HOSTED.unlimited);
    assert.equal(rest.length, 6);
    assert.equal(rest.at(-1)?.run_id, low, "the lowest priority last");
  } finally {
    await s.db.drop();
  }
});

Deno.test("priority: one tenant's high-priority flood does not take another tenant's turn", async () => {
  const s = await setup(["acme", "beta"]);
  try {
    for (let n = 0; n < 20; n++) await s.admit("acme", "echo", { n }, { priority: 10 });
    const beta = await s.admit("beta", "echo", { n: 0 }, { priority: -10 });
    const claimed = await claimRuns(s.db.sql, "w1", 4, LEASE_MS, HOSTED.unlimited);
    assert.ok(claimed.some((r) => r.run_id === beta), "beta's run is in the first claim");
  } finally {
    await s.db.drop();
  }
});

Deno.test("priority: within a key of a limited workflow, the higher priority starts next", async () => {
  const s = await setup();
  try {
    for (let n = 0; n < 3; n++) await s.admit("acme", "shop.sync", { customer_id: "k", n });
    const urgent = await s.admit("acme", "shop.sync", { customer_id: "k", n: 9 }, { priority: 5 });
    const [first] = await claimLimited(s.db.sql, "w1", 4);
    assert.equal(first.run_id, urgent);
  } finally {
    await s.db.drop();
  }
});

Deno.test("catalog: a version's concurrency limit and tenants are part of its definition — registering it again with another limit, key or tenants is a conflict", async () => {
  const db = await freshDatabase();
  try {
    const base = {
      name: "shop.sync",
      version: 1,
      input_schema: { type: "object" },
      max_attempts: null,
      concurrency_limit: 1,
      concurrency_key: "/customer_id",
    };
    const [first] = await registerVersions(db.sql, [base], "w1");
    assert.equal(first.created, true);
    const [same] = await registerVersions(db.sql, [base], "w2");
    assert.equal(same.same, true);
    const [otherLimit] = await registerVersions(db.sql, [{ ...base, concurrency_limit: 2 }], "w3");
    assert.equal(otherLimit.same, false);
    const [otherKey] = await registerVersions(db.sql, [{ ...base, concurrency_key: "/x" }], "w3");
    assert.equal(otherKey.same, false);
    const [unlimited] = await registerVersions(db.sql, [{
      ...base,
      concurrency_limit: null,
      concurrency_key: null,
    }], "w3");
    assert.equal(unlimited.same, false);
    // A version's tenants are part of it too (migration 014).
    const [scoped] = await registerVersions(db.sql, [{ ...base, tenants: "acme" }], "w3");
    assert.equal(scoped.same, false);
    const tenanted = { ...base, version: 2, tenants: "acme,team-*" };
    assert.equal((await registerVersions(db.sql, [tenanted], "w4"))[0].created, true);
    assert.equal((await registerVersions(db.sql, [tenanted], "w5"))[0].same, true);
    const [wider] = await registerVersions(db.sql, [{ ...tenanted, tenants: null }], "w5");
    assert.equal(wider.same, false);
  } finally {
    await db.drop();
  }
});

Deno.test("retention: idle concurrency groups are purged, busy ones kept, and a key used again starts a fresh group", async () => {
  const s = await setup();
  try {
    const done = await s.admit("acme", "shop.sync", { customer_id: "idle", n: 0 });
    await s.admit("acme", "shop.sync", { customer_id: "busy", n: 0 });
    await s.admit("acme", "shop.sync", { customer_id: "busy", n: 1 });
    const claimed = await claimLimited(s.db.sql, "w1", 4);
    assert.equal(claimed.length, 2);
    const idle = claimed.find((r) => r.run_id === done)!;
    assert.ok(await completeRun(s.db.sql, "acme", idle.run_id, "w1", idle.attempts, 1));
    // Idle for a day: nothing yet.
    assert.equal(await purgeIdleConcurrencyGroups(s.db.sql, 24 * 3600_000, 100), 0);
    assert.equal(await purgeIdleConcurrencyGroups(s.db.sql, 0, 100), 1);
    const keys = await s.db.sql<{ concurrency_key: string }[]>`
      select concurrency_key from concurrency_slots order by 1`;
    assert.deepEqual(keys.map((k) => k.concurrency_key), ["busy"]);
    await s.admit("acme", "shop.sync", { customer_id: "idle", n: 1 });
    assert.equal((await claimLimited(s.db.sql, "w1", 4)).length, 1, "idle's new run starts");
    assert.deepEqual(await countDrift(s.db.sql), []);
  } finally {
    await s.db.drop();
  }
});
