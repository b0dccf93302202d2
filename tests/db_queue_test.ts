/**
 * The queue's finishing statements are fenced by attempt, against a real
 * Postgres (a fresh database of this file's own): a write meant for an
 * attempt that is over changes nothing, even when the same worker id holds
 * the run again under a newer attempt. Cancelling: a queued run at once, a
 * running one through its attempt's end (also when reclaimed or released).
 */
import assert from "node:assert/strict";
import { Admission } from "../admission/admit.ts";
import { insertTenant } from "../db/auth.ts";
import type { Sql } from "../db/pool.ts";
import { completeRun, completeRuns, failAttempt, releaseRun } from "../db/attempt_end.ts";
import { requestCancel } from "../db/cancellation.ts";
import { claimRuns } from "../db/claims.ts";
import { heartbeat, reclaimExpired } from "../db/leases.ts";
import { BUILTIN_HOSTED, catalogOf } from "./support/catalog.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";

const TENANT = "acme";
const OWNER = "w-same-id";
const LEASE_MS = 30_000;

async function setup(): Promise<{ db: TestDatabase; runId: string }> {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  const admission = new Admission(db.sql, catalogOf(), { maxBatch: 8, maxConcurrent: 1 });
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
  const [first] = await claimRuns(sql, OWNER, 1, 1, BUILTIN_HOSTED);
  assert.equal(first.run_id, runId);
  assert.equal(first.attempts, 1);
  await waitFor("the lease expired and was reclaimed", async () => {
    const r = await reclaimExpired(sql, 10);
    return r.length > 0;
  }, 10_000);
  const [second] = await claimRuns(sql, OWNER, 1, LEASE_MS, BUILTIN_HOSTED);
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
    const [first] = await claimRuns(db.sql, OWNER, 1, LEASE_MS, BUILTIN_HOSTED);
    assert.equal(first.attempts, 1);
    const error = { message: "boom" };
    // The first send commits; its reply is lost, so the worker will send it again.
    const done = await failAttempt(db.sql, TENANT, runId, OWNER, 1, error, 0);
    assert.equal(done?.status, "queued");
    // Meanwhile the same worker claims the retry.
    const [second] = await claimRuns(db.sql, OWNER, 1, LEASE_MS, BUILTIN_HOSTED);
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
    assert.equal(await heartbeat(db.sql, TENANT, runId, OWNER, 1, 0), "lost");
    const [{ lease_expires_at: leaseAfter }] = await db.sql<{ lease_expires_at: Date }[]>`
      select lease_expires_at from runs where tenant_id = ${TENANT} and run_id = ${runId}`;
    assert.deepEqual(leaseAfter, leaseBefore);
    assert.equal(await releaseRun(db.sql, TENANT, runId, OWNER, 1, "stale"), undefined);
    const row = await runRow(db.sql, runId);
    assert.equal(row.status, "running");
    assert.equal(row.attempts, 2);
    assert.equal(await heartbeat(db.sql, TENANT, runId, OWNER, 2, LEASE_MS), "held");
    assert.equal(await releaseRun(db.sql, TENANT, runId, OWNER, 2, "shutdown"), "queued");
    assert.equal((await runRow(db.sql, runId)).status, "queued");
  } finally {
    await db.drop();
  }
});

async function cancelState(sql: Sql, runId: string) {
  const [row] = await sql<
    { status: string; cancel_requested_at: Date | null; finished_at: Date | null }[]
  >`select status, cancel_requested_at, finished_at from runs
     where tenant_id = ${TENANT} and run_id = ${runId}`;
  return row;
}

Deno.test("queue cancel: a queued run is cancelled at once with a run.cancelled event; asking again writes nothing", async () => {
  const { db, runId } = await setup();
  try {
    const row = await requestCancel(db.sql, TENANT, runId);
    assert.equal(row?.status, "cancelled");
    assert.ok(row?.cancel_requested_at);
    assert.ok(row?.finished_at);
    assert.deepEqual(row?.input, { n: 1 });
    assert.deepEqual(await eventTypes(db.sql, runId), ["run.admitted", "run.cancelled"]);
    assert.equal(await requestCancel(db.sql, TENANT, runId), undefined);
    assert.deepEqual(await eventTypes(db.sql, runId), ["run.admitted", "run.cancelled"]);
    // Never claimed.
    assert.equal((await claimRuns(db.sql, OWNER, 10, LEASE_MS, BUILTIN_HOSTED)).length, 0);
  } finally {
    await db.drop();
  }
});

Deno.test("queue cancel: another tenant's run and a finished run are left as they are", async () => {
  const { db, runId } = await setup();
  try {
    await insertTenant(db.sql, "other");
    assert.equal(await requestCancel(db.sql, "other", runId), undefined);
    assert.equal((await cancelState(db.sql, runId)).status, "queued");
    await claimRuns(db.sql, OWNER, 1, LEASE_MS, BUILTIN_HOSTED);
    assert.equal(await completeRun(db.sql, TENANT, runId, OWNER, 1, "done"), true);
    assert.equal(await requestCancel(db.sql, TENANT, runId), undefined);
    const after = await cancelState(db.sql, runId);
    assert.equal(after.status, "succeeded");
    assert.equal(after.cancel_requested_at, null);
  } finally {
    await db.drop();
  }
});

Deno.test("queue cancel: a running run's heartbeat reports the request; its attempt's failure ends it cancelled, a stale attempt's is refused", async () => {
  const { db, runId } = await setup();
  try {
    await reclaimedAndClaimedAgain(db.sql, runId);
    const requested = await requestCancel(db.sql, TENANT, runId);
    assert.equal(requested?.status, "running");
    assert.ok(requested?.cancel_requested_at);
    // Asked again: nothing to write (the API reads the run instead).
    assert.equal(await requestCancel(db.sql, TENANT, runId), undefined);
    assert.equal(await heartbeat(db.sql, TENANT, runId, OWNER, 1, LEASE_MS), "lost");
    assert.equal(await heartbeat(db.sql, TENANT, runId, OWNER, 2, LEASE_MS), "cancel-requested");
    const aborted = { message: "run cancelled on request" };
    // Attempt 1 is over: its write changes nothing.
    assert.equal(await failAttempt(db.sql, TENANT, runId, OWNER, 1, aborted, 0), undefined);
    assert.equal((await cancelState(db.sql, runId)).status, "running");
    const out = await failAttempt(db.sql, TENANT, runId, OWNER, 2, aborted, 0);
    assert.equal(out?.status, "cancelled");
    const row = await runRow(db.sql, runId);
    assert.equal(row.status, "cancelled");
    assert.equal(row.attempts, 2);
    assert.equal(row.lease_owner, null);
    assert.ok((await cancelState(db.sql, runId)).finished_at);
    assert.deepEqual(await eventTypes(db.sql, runId), [
      "run.admitted",
      "run.started",
      "run.retrying",
      "run.started",
      "run.cancelled",
    ]);
    const [ev] = await db.sql<{ payload: { attempt: number; requested_at: string } }[]>`
      select payload from work_events
       where tenant_id = ${TENANT} and run_id = ${runId} and type = 'run.cancelled'`;
    assert.equal(ev.payload.attempt, 2);
    assert.ok(ev.payload.requested_at);
    assert.equal((await claimRuns(db.sql, OWNER, 10, LEASE_MS, BUILTIN_HOSTED)).length, 0);
  } finally {
    await db.drop();
  }
});

Deno.test("queue cancel: a cancel-requested run whose lease expired is cancelled, not requeued", async () => {
  const { db, runId } = await setup();
  try {
    const [claimed] = await claimRuns(db.sql, OWNER, 1, 1, BUILTIN_HOSTED);
    assert.equal(claimed.run_id, runId);
    await requestCancel(db.sql, TENANT, runId);
    const reclaimed = await waitFor("the lease expired and was reclaimed", async () => {
      const r = await reclaimExpired(db.sql, 10);
      return r.length > 0 ? r : undefined;
    }, 10_000);
    assert.equal(reclaimed[0].status, "cancelled");
    assert.equal((await cancelState(db.sql, runId)).status, "cancelled");
    assert.deepEqual(await eventTypes(db.sql, runId), [
      "run.admitted",
      "run.started",
      "run.cancelled",
    ]);
    assert.equal((await claimRuns(db.sql, OWNER, 10, LEASE_MS, BUILTIN_HOSTED)).length, 0);
  } finally {
    await db.drop();
  }
});

Deno.test("queue cancel: a cancel-requested run released on shutdown is cancelled, not requeued", async () => {
  const { db, runId } = await setup();
  try {
    await claimRuns(db.sql, OWNER, 1, LEASE_MS, BUILTIN_HOSTED);
    await requestCancel(db.sql, TENANT, runId);
    assert.equal(await releaseRun(db.sql, TENANT, runId, OWNER, 1, "worker shutdown"), "cancelled");
    const row = await runRow(db.sql, runId);
    assert.equal(row.status, "cancelled");
    assert.equal(row.attempts, 1, "the attempt is not given back: the run is over");
    assert.deepEqual(await eventTypes(db.sql, runId), [
      "run.admitted",
      "run.started",
      "run.cancelled",
    ]);
  } finally {
    await db.drop();
  }
});

Deno.test("completeRuns() writes the batch's live attempts in one statement and refuses the others", async () => {
  const { db, runId } = await setup();
  try {
    const admission = new Admission(db.sql, catalogOf(), { maxBatch: 8, maxConcurrent: 1 });
    const more = [];
    for (let n = 2; n <= 4; n++) {
      const { run } = await admission.admit({ workflow_ref: "echo", input: { n } }, {
        tenantId: TENANT,
        source: "test",
        entry: "http",
      });
      more.push(run.run_id);
    }
    const claimed = await claimRuns(db.sql, OWNER, 4, LEASE_MS, BUILTIN_HOSTED);
    assert.equal(claimed.length, 4);
    const [a, b, c] = more;
    // Run c is another worker's now: released by this one, claimed by "w-other".
    await releaseRun(db.sql, TENANT, c, OWNER, 1, "test");
    const [other] = await claimRuns(db.sql, "w-other", 1, LEASE_MS, BUILTIN_HOSTED);
    assert.equal(other.run_id, c);
    const written = await completeRuns(db.sql, OWNER, [
      { tenant_id: TENANT, run_id: runId, attempt: 1, result_json: '{"n": 1}' },
      { tenant_id: TENANT, run_id: a, attempt: 2, result_json: '"stale attempt"' },
      { tenant_id: TENANT, run_id: b, attempt: 1, result_json: "null" },
      { tenant_id: TENANT, run_id: c, attempt: 1, result_json: '"not mine"' },
      { tenant_id: TENANT, run_id: crypto.randomUUID(), attempt: 1, result_json: "1" },
    ]);
    assert.deepEqual(written, [true, false, true, false, false]);
    const [r1, ra, rb, rc] = await Promise.all([runId, a, b, c].map((id) => runRow(db.sql, id)));
    assert.deepEqual([r1.status, r1.result, r1.lease_owner], ["succeeded", { n: 1 }, null]);
    assert.deepEqual([ra.status, ra.lease_owner], ["running", OWNER]);
    assert.deepEqual([rb.status, rb.result], ["succeeded", null]);
    assert.deepEqual([rc.status, rc.lease_owner], ["running", "w-other"]);
    assert.deepEqual(await eventTypes(db.sql, runId), [
      "run.admitted",
      "run.started",
      "run.succeeded",
    ]);
    assert.deepEqual(await eventTypes(db.sql, a), ["run.admitted", "run.started"]);
    const [event] = await db.sql<{ seq: number; payload: unknown }[]>`
      select seq, payload from work_events
       where tenant_id = ${TENANT} and run_id = ${b} and type = 'run.succeeded'`;
    assert.deepEqual(event, { seq: rb.event_seq, payload: { attempt: 1, result: null } });
  } finally {
    await db.drop();
  }
});
