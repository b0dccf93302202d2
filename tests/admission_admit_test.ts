/**
 * admission/admit.ts against a real Postgres, with its statements wrapped
 * (the kernel's `statements` seam) to fail between the first, committed,
 * insert and the follow-up select: what committed is never flushed again,
 * and every caller gets the right answer.
 */
import assert from "node:assert/strict";
import { Admission, type AdmissionStatements, type AdmitResult } from "../admission/admit.ts";
import { PoimenError } from "../core/errors.ts";
import { type AdmittedRow, insertRuns, selectRunsByDispatchKey } from "../db/admission.ts";
import { insertTenant } from "../db/auth.ts";
import type { Sql } from "../db/pool.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase } from "./support/db.ts";

const CTX = (tenantId: string) => ({ tenantId, source: "test", entry: "http" as const });

/** How `p` ended, without throwing. */
function outcome<R>(p: Promise<R>): Promise<{ value: R } | { error: unknown }> {
  return p.then((value) => ({ value }), (error) => ({ error }));
}

async function runsOf(sql: Sql, tenant: string): Promise<{ run_id: string; n: number }[]> {
  return await sql<{ run_id: string; n: number }[]>`
    select run_id, (select count(*)::int from work_events w
                     where w.tenant_id = r.tenant_id and w.run_id = r.run_id) as n
      from runs r where tenant_id = ${tenant} order by run_id`;
}

/**
 * Real statements, counted; the insert hides the runs that already held a
 * key (as when their holder committed after the insert's snapshot), so the
 * kernel needs its follow-up select, which fails its first `selectFailures` calls.
 */
function flakyStatements(selectFailures: number) {
  const calls = { insert: 0, select: 0 };
  const statements: AdmissionStatements = {
    async insertRuns(sql, runs) {
      calls.insert++;
      const rows = await insertRuns(sql, runs);
      return rows.filter((r: AdmittedRow) => r.created);
    },
    async selectRunsByDispatchKey(sql, keys) {
      calls.select++;
      if (calls.select <= selectFailures) {
        throw new Error("injected: the follow-up select failed after the insert committed");
      }
      return await selectRunsByDispatchKey(sql, keys);
    },
  };
  return { calls, statements };
}

/** Admits a keyless warm-up (flushed alone) and, behind it, one batch of `reqs`. */
function admitBatch(admission: Admission, tenant: string, reqs: object[]) {
  const warmup = admission.admit({ workflow_ref: "echo", input: { warmup: true } }, CTX(tenant));
  const results = reqs.map((r) =>
    outcome(admission.admit({ workflow_ref: "echo", ...r }, CTX(tenant)))
  );
  return { warmup, results: Promise.all(results) };
}

Deno.test("admission: a follow-up select that fails once after the insert committed is retried alone; nothing is inserted twice", async () => {
  const db = await freshDatabase();
  const tenant = "adm-flaky-1";
  try {
    await insertTenant(db.sql, tenant);
    const plain = new Admission(db.sql, catalogOf(), { maxBatch: 10, maxConcurrent: 1 });
    const original = await plain.admit(
      { workflow_ref: "echo", input: { i: 0 }, dispatch_key: "k1" },
      CTX(tenant),
    );

    const { calls, statements } = flakyStatements(1);
    const admission = new Admission(
      db.sql,
      catalogOf(),
      {
        maxBatch: 10,
        maxConcurrent: 1,
      },
      {},
      statements,
    );
    const { warmup, results } = admitBatch(admission, tenant, [
      { input: { i: 1 } },
      { input: { i: 2 } },
      { input: { i: 0 }, dispatch_key: "k1" },
      { input: { i: 3 }, dispatch_key: "k2" },
    ]);
    await warmup;
    const got = await results;
    for (const r of got) assert.ok("value" in r, `rejected: ${"error" in r ? r.error : ""}`);
    const [a, b, replay, k2] = got.map((r) => (r as { value: AdmitResult }).value);
    assert.equal(a.created, true);
    assert.equal(b.created, true);
    assert.equal(k2.created, true);
    assert.equal(replay.created, false);
    assert.equal(replay.sameBody, true);
    assert.equal(replay.run.run_id, original.run.run_id);

    assert.equal(calls.insert, 2, "the warm-up's insert and the batch's, nothing again");
    assert.equal(calls.select, 2, "the failed follow-up and its retry");
    // original, warm-up, a, b, k2: each once, each with its one run.admitted event.
    const runs = await runsOf(db.sql, tenant);
    assert.deepEqual(
      runs.map((r) => r.run_id).sort(),
      [original, await warmup, a, b, k2].map((r) => r.run.run_id).sort(),
    );
    assert.ok(runs.every((r) => r.n === 1));
  } finally {
    await db.drop();
  }
});

Deno.test("admission: when the follow-up select keeps failing, only the keys it had to read fail; the committed runs are answered", async () => {
  const db = await freshDatabase();
  const tenant = "adm-flaky-2";
  try {
    await insertTenant(db.sql, tenant);
    const plain = new Admission(db.sql, catalogOf(), { maxBatch: 10, maxConcurrent: 1 });
    await plain.admit({ workflow_ref: "echo", input: {}, dispatch_key: "k1" }, CTX(tenant));

    const { calls, statements } = flakyStatements(Infinity);
    const admission = new Admission(
      db.sql,
      catalogOf(),
      {
        maxBatch: 10,
        maxConcurrent: 1,
      },
      {},
      statements,
    );
    const { warmup, results } = admitBatch(admission, tenant, [
      { input: { i: 1 } },
      { input: {}, dispatch_key: "k1" },
      { input: { i: 2 }, dispatch_key: "k2" },
    ]);
    await warmup;
    const [a, replay, k2] = await results;
    assert.ok("value" in a && a.value.created, "the keyless run is answered as created");
    assert.ok("value" in k2 && k2.value.created, "the new key's run is answered as created");
    assert.ok("error" in replay, "the replay whose holder could not be read fails");
    assert.equal(calls.insert, 2, "nothing inserted again");
    assert.equal(calls.select, 3, "the follow-up alone was retried, a bounded number of times");
    assert.equal((await runsOf(db.sql, tenant)).length, 4);
  } finally {
    await db.drop();
  }
});

Deno.test("admission: a value Postgres refuses fails its own caller alone, with a final invalid-data; the rest of its batch is admitted", async () => {
  const db = await freshDatabase();
  const tenant = "adm-refused";
  try {
    await insertTenant(db.sql, tenant);
    const admission = new Admission(db.sql, catalogOf(), { maxBatch: 10, maxConcurrent: 1 });
    // Past the door's schema (the kernel takes it as validated): what it would let through if
    // it missed a bound.
    const bad = [
      { input: { bad: 1 }, run_after: "0000-01-01T00:00:00Z" },
      { input: { bad: 2 }, run_after: "2030-01-01T00:00:00+16:00" },
      { input: { bad: 3 }, priority: 40_000 },
    ];
    const { warmup, results } = admitBatch(admission, tenant, [
      { input: { i: 1 } },
      ...bad,
      { input: { i: 2 }, dispatch_key: "k" },
    ]);
    await warmup;
    const got = await results;
    for (const r of [got[0], got[4]]) {
      assert.ok("value" in r && r.value.created, `rejected: ${"error" in r ? r.error : ""}`);
    }
    for (const r of got.slice(1, 4)) {
      assert.ok("error" in r, "refused");
      const err = r.error as PoimenError;
      assert.ok(err instanceof PoimenError, String(err));
      assert.equal(err.code, "invalid-data", err.message);
      assert.equal(err.status, 422);
      assert.equal(err.retryable, false);
    }
    const runs = await runsOf(db.sql, tenant);
    assert.equal(runs.length, 3, "the warm-up and the two good ones");
    assert.ok(runs.every((r) => r.n === 1));
  } finally {
    await db.drop();
  }
});
