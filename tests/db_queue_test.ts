/**
 * The queue's finishing statements are fenced by attempt, against a real
 * Postgres (a fresh database of this file's own): a write meant for an
 * attempt that is over changes nothing, even when the same worker id holds
 * the run again under a newer attempt.
 */
import assert from "node:assert/strict";
import { Admission } from "../admission/admit.ts";
import { insertTenant } from "../db/auth.ts";
import type { Sql } from "../db/pool.ts";
import {
  claimRuns,
  completeRun,
  failAttempt,
  heartbeat,
  reclaimExpired,
  releaseRun,
} from "../db/queue.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";

const TENANT = "acme";
const OWNER = "w-same-id";
const LEASE_MS = 30_000;

async function setup(): Promise<{ db: TestDatabase; runId: string }> {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  const admission = new Admission(db.sql, builtinRegistry(), { maxBatch: 8, maxConcurrent: 1 });
  const { run } = await admission.admit({ workflow_ref: "echo", input: { n: 1 } }, {
    tenantId: TENANT,
    source: "test",
    entry: "http",
  });
  return { db, runId: run.run_id };
}

async function runRow(sql: Sql, runId: string) {
  const [row] = await sql<
    {
      status: string;
      attempts: number;
      lease_owner: string | null;
      event_seq: number;
      result: unknown;
      error: unknown;
    }[]
  >`select status, attempts, lease_owner, event_seq, result, error from runs
     where tenant_id = ${TENANT} and run_id = ${runId}`;
  return row;
}

async function eventTypes(sql: Sql, runId: string): Promise<string[]> {
  const rows = await sql<{ type: string }[]>`
    select type from work_events where tenant_id = ${TENANT} and run_id = ${runId} order by seq`;
  return rows.map((r) => r.type);
}

/** Attempt 1 claimed with a lease that ends at once, reclaimed, then claimed again by the same id. */
async function reclaimedAndClaimedAgain(sql: Sql, runId: string): Promise<void> {
  const [first] = await claimRuns(sql, OWNER, 1, 1);
  assert.equal(first.run_id, runId);
  assert.equal(first.attempts, 1);
  await waitFor("the lease expired and was reclaimed", async () => {
    const r = await reclaimExpired(sql, 10);
    return r.length > 0;
  }, 10_000);
  const [second] = await claimRuns(sql, OWNER, 1, LEASE_MS);
  assert.equal(second.run_id, runId);
  assert.equal(second.attempts, 2);
}

Deno.test("queue fencing: attempt 1's completion replayed after the same worker re-claimed the run is refused", async () => {
  const { db, runId } = await setup();
  try {
    await reclaimedAndClaimedAgain(db.sql, runId);
    const before = await runRow(db.sql, runId);
    const ok = await completeRun(db.sql, TENANT, runId, OWNER, 1, { from: "attempt 1" });
    assert.equal(ok, false);
    const after = await runRow(db.sql, runId);
    assert.equal(after.status, "running");
    assert.equal(after.attempts, 2);
    assert.equal(after.lease_owner, OWNER);
    assert.equal(after.event_seq, before.event_seq);
    assert.equal(after.result, null);
    assert.deepEqual(await eventTypes(db.sql, runId), [
      "run.admitted",
      "run.started",
      "run.retrying",
      "run.started",
    ]);
    // The current attempt still finishes.
    assert.equal(await completeRun(db.sql, TENANT, runId, OWNER, 2, { from: "attempt 2" }), true);
    assert.deepEqual((await runRow(db.sql, runId)).result, { from: "attempt 2" });
  } finally {
    await db.drop();
  }
});

Deno.test("queue fencing: a failAttempt retried after its reply was lost does not fail the next attempt", async () => {
  const { db, runId } = await setup();
  try {
    const [first] = await claimRuns(db.sql, OWNER, 1, LEASE_MS);
    assert.equal(first.attempts, 1);
    const error = { message: "boom" };
    // The first send commits; its reply is lost, so the worker will send it again.
    const done = await failAttempt(db.sql, TENANT, runId, OWNER, 1, error, 0);
    assert.equal(done?.status, "queued");
    // Meanwhile the same worker claims the retry.
    const [second] = await claimRuns(db.sql, OWNER, 1, LEASE_MS);
    assert.equal(second.attempts, 2);
    const before = await runRow(db.sql, runId);
    const replay = await failAttempt(db.sql, TENANT, runId, OWNER, 1, error, 0);
    assert.equal(replay, undefined);
    const after = await runRow(db.sql, runId);
    assert.equal(after.status, "running");
    assert.equal(after.attempts, 2);
    assert.equal(after.lease_owner, OWNER);
    assert.equal(after.event_seq, before.event_seq);
    assert.deepEqual(await eventTypes(db.sql, runId), [
      "run.admitted",
      "run.started",
      "run.retrying",
      "run.started",
    ]);
  } finally {
    await db.drop();
  }
});

Deno.test("queue fencing: a stale attempt's heartbeat and release are refused; the current attempt's are not", async () => {
  const { db, runId } = await setup();
  try {
    await reclaimedAndClaimedAgain(db.sql, runId);
    const [{ lease_expires_at: leaseBefore }] = await db.sql<{ lease_expires_at: Date }[]>`
      select lease_expires_at from runs where tenant_id = ${TENANT} and run_id = ${runId}`;
    // A lease of 0 ms would let the run be reclaimed at once, were it written.
    assert.equal(await heartbeat(db.sql, TENANT, runId, OWNER, 1, 0), false);
    const [{ lease_expires_at: leaseAfter }] = await db.sql<{ lease_expires_at: Date }[]>`
      select lease_expires_at from runs where tenant_id = ${TENANT} and run_id = ${runId}`;
    assert.deepEqual(leaseAfter, leaseBefore);
    assert.equal(await releaseRun(db.sql, TENANT, runId, OWNER, 1, "stale"), false);
    const row = await runRow(db.sql, runId);
    assert.equal(row.status, "running");
    assert.equal(row.attempts, 2);
    assert.equal(await heartbeat(db.sql, TENANT, runId, OWNER, 2, LEASE_MS), true);
    assert.equal(await releaseRun(db.sql, TENANT, runId, OWNER, 2, "shutdown"), true);
    assert.equal((await runRow(db.sql, runId)).status, "queued");
  } finally {
    await db.drop();
  }
});
