/**
 * Fan-in at the database (migration 028, db/fan_in.ts), against a real
 * Postgres: a parent waiting for 10,000 children is woken once, by the last
 * child's finishing statement (counted in events, not time); with
 * `failFast`, the first failure wakes it and the rest are cancelled; every
 * path that makes a child final (completion, failure, a cancel, a lease
 * given up) delivers it; and a suspend racing the last child's completion
 * never leaves the parent waiting.
 */
import assert from "node:assert/strict";
import { insertTenant } from "../db/auth.ts";
import type { Sql } from "../db/pool.ts";
import { insertRuns, type NewRun } from "../db/admission.ts";
import { type ClaimedRun, claimRuns } from "../db/claims.ts";
import { requestCancel } from "../db/cancellation.ts";
import { completeRun, completeRuns, failAttempt, releaseRun } from "../db/attempt_end.ts";
import { reclaimExpired, renewLeases } from "../db/leases.ts";
import type { StepFence } from "../db/run_steps.ts";
import { awaitChildren, cancelChildren, selectChild, selectChildOutcomes } from "../db/fan_in.ts";
import { childDispatchKey } from "../contracts/runs.ts";
import { freshDatabase, type TestDatabase } from "./support/db.ts";

const TENANT = "acme";
const OWNER = "w-fan-in";
const LEASE = 30_000;
const PARENT = { names: ["parent"], versions: [1] };
const KID = { names: ["kid"], versions: [1] };

async function setup(): Promise<TestDatabase> {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  return db;
}

function newRun(workflow: string, extra: Partial<NewRun> = {}): NewRun {
  return {
    tenant_id: TENANT,
    run_id: crypto.randomUUID(),
    workflow_ref: workflow,
    workflow_name: workflow,
    workflow_version: 1,
    input: {},
    goal_id: null,
    dispatch_key: null,
    source: "test",
    max_attempts: 3,
    run_after: null,
    ...extra,
  };
}

/** A parent run, claimed: its attempt's fence. */
async function runningParent(sql: Sql): Promise<StepFence> {
  await insertRuns(sql, [newRun("parent")]);
  const [p] = await claimRuns(sql, OWNER, 1, LEASE, PARENT);
  return { tenant_id: TENANT, run_id: p.run_id, owner: OWNER, attempt: p.attempts };
}

/** `n` children of `parent` named `<group>#c<i>` (or `group` itself when `single`). */
async function addChildren(
  sql: Sql,
  parent: string,
  group: string,
  n: number,
  extra: Partial<NewRun> = {},
): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i += 1_000) {
    const batch = Array.from({ length: Math.min(1_000, n - i) }, (_, j) =>
      newRun("kid", {
        dispatch_key: childDispatchKey(parent, n === 1 ? group : `${group}#c${i + j}`),
        parent_run_id: parent,
        root_run_id: parent,
        source: `run:${parent}`,
        ...extra,
      }));
    ids.push(...(await insertRuns(sql, batch)).map((r) => r.run_id));
  }
  return ids;
}

async function claimKids(sql: Sql, limit = 500): Promise<ClaimedRun[]> {
  const out: ClaimedRun[] = [];
  for (;;) {
    const batch = await claimRuns(sql, OWNER, Math.min(limit - out.length, 500), LEASE, KID);
    out.push(...batch);
    if (batch.length === 0 || out.length >= limit) return out;
  }
}

async function parentRow(sql: Sql, runId: string) {
  const [row] = await sql<
    { status: string; children_awaited: number | null; wait_reason: string | null }[]
  >`select status, children_awaited, wait_reason from runs
     where tenant_id = ${TENANT} and run_id = ${runId}`;
  return row;
}

async function wakes(sql: Sql, runId: string) {
  return await sql<{ payload: Record<string, unknown> }[]>`
    select payload from work_events
     where tenant_id = ${TENANT} and run_id = ${runId} and type = 'run.woken'`;
}

Deno.test("fan-in: 10,000 children finishing from four connections wake their parent once, at the last", async () => {
  const db = await setup();
  try {
    const parent = await runningParent(db.sql);
    await addChildren(db.sql, parent.run_id, "m", 10_000);
    assert.equal(await awaitChildren(db.sql, parent, { group: "m", failFast: false }), "suspended");
    assert.deepEqual(await parentRow(db.sql, parent.run_id), {
      status: "waiting",
      children_awaited: 10_000,
      wait_reason: "children",
    });
    // All but one, in batches of 250, four statements at a time.
    const kids = await claimKids(db.sql, 10_000);
    assert.equal(kids.length, 10_000);
    const last = kids.pop()!;
    const batches: ClaimedRun[][] = [];
    for (let i = 0; i < kids.length; i += 250) batches.push(kids.slice(i, i + 250));
    const lanes = [0, 1, 2, 3].map(async (lane) => {
      for (let b = lane; b < batches.length; b += 4) {
        const done = await completeRuns(
          db.sql,
          OWNER,
          batches[b].map((k) => ({
            tenant_id: k.tenant_id,
            run_id: k.run_id,
            attempt: k.attempts,
            result_json: JSON.stringify({ i: k.dispatch_key }),
          })),
        );
        assert.ok(done.every(Boolean));
      }
    });
    await Promise.all(lanes);
    assert.deepEqual(await parentRow(db.sql, parent.run_id), {
      status: "waiting",
      children_awaited: 1,
      wait_reason: "children",
    });
    assert.equal((await wakes(db.sql, parent.run_id)).length, 0);

    assert.ok(await completeRun(db.sql, TENANT, last.run_id, OWNER, last.attempts, "last"));
    const row = await parentRow(db.sql, parent.run_id);
    assert.equal(row.status, "queued");
    assert.equal(row.wait_reason, null);
    const woken = await wakes(db.sql, parent.run_id);
    assert.equal(woken.length, 1, "one wake for 10,000 children");
    assert.deepEqual(woken[0].payload, {
      by: "child",
      reason: "children",
      name: "m",
      signal_id: null,
    });
    // Claimable again; its children's outcomes are theirs, read on resume.
    const [again] = await claimRuns(db.sql, OWNER, 1, LEASE, PARENT);
    assert.equal(again?.run_id, parent.run_id);
    const resumed = { ...parent, attempt: again.attempts };
    assert.equal(await awaitChildren(db.sql, resumed, { group: "m", failFast: false }), "ready");
    const outcomes = await selectChildOutcomes(db.sql, TENANT, parent.run_id, "m");
    assert.equal(outcomes.length, 10_000);
    assert.ok(outcomes.every((o) => o.status === "succeeded"));
    assert.equal(new Set(outcomes.map((o) => o.name)).size, 10_000);
  } finally {
    await db.drop();
  }
});

Deno.test("fan-in: failFast wakes the parent at the first failure, and the rest end cancelled", async () => {
  const db = await setup();
  try {
    const parent = await runningParent(db.sql);
    await addChildren(db.sql, parent.run_id, "f", 20, { max_attempts: 1 });
    assert.equal(await awaitChildren(db.sql, parent, { group: "f", failFast: true }), "suspended");
    const running = await claimKids(db.sql, 5);
    assert.ok(await completeRun(db.sql, TENANT, running[0].run_id, OWNER, 1, 0));
    assert.equal((await parentRow(db.sql, parent.run_id)).status, "waiting");
    const failed = await failAttempt(db.sql, TENANT, running[1].run_id, OWNER, 1, {
      message: "boom",
      code: "boom",
    }, 0);
    assert.equal(failed?.status, "failed");
    assert.equal((await parentRow(db.sql, parent.run_id)).status, "queued");
    assert.equal((await wakes(db.sql, parent.run_id)).length, 1);

    // The parent resumes, finds the failure, and cancels the rest.
    const [again] = await claimRuns(db.sql, OWNER, 1, LEASE, PARENT);
    const resumed = { ...parent, attempt: again.attempts };
    assert.equal(await awaitChildren(db.sql, resumed, { group: "f", failFast: true }), "ready");
    const asked = await cancelChildren(db.sql, TENANT, parent.run_id, "f");
    assert.deepEqual(asked.sort(), running.slice(2).map((r) => r.run_id).sort());
    // The running ones end cancelled when their workers give up.
    for (const r of running.slice(2)) {
      const end = await failAttempt(db.sql, TENANT, r.run_id, OWNER, 1, { message: "x" }, 0);
      assert.equal(end?.status, "cancelled");
    }
    const statuses = (await selectChildOutcomes(db.sql, TENANT, parent.run_id, "f"))
      .map((o) => o.status);
    assert.equal(statuses.filter((s) => s === "succeeded").length, 1);
    assert.equal(statuses.filter((s) => s === "failed").length, 1);
    assert.equal(statuses.filter((s) => s === "cancelled").length, 18);
    // The parent was running meanwhile: no second wake.
    assert.equal((await wakes(db.sql, parent.run_id)).length, 1);
    const [{ n }] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from work_events
       where tenant_id = ${TENANT} and type = 'run.cancelled'
         and payload ->> 'reason' = 'fail-fast'`;
    assert.equal(n, 15, "the queued ones cancelled by the parent's statement");
    const finished = await db.sql<{ seq: number }[]>`
      select seq from work_events
       where tenant_id = ${TENANT} and run_id = ${parent.run_id} and type = 'child.finished'
       order by seq`;
    assert.equal(finished.length, 15, "each child the parent cancelled is its child.finished");
    assert.equal(new Set(finished.map((e) => e.seq)).size, 15);
  } finally {
    await db.drop();
  }
});

Deno.test("fan-in: a cancel, a failure for good, a cancelled release and a lease given up each deliver a child", async () => {
  const db = await setup();
  try {
    const check = async (end: (child: string, parent: StepFence) => Promise<void>) => {
      const parent = await runningParent(db.sql);
      const [child] = await addChildren(db.sql, parent.run_id, "one", 1, { max_attempts: 1 });
      assert.equal(
        await awaitChildren(db.sql, parent, { group: "one", failFast: false }),
        "suspended",
      );
      await end(child, parent);
      assert.equal((await parentRow(db.sql, parent.run_id)).status, "queued");
      assert.equal((await wakes(db.sql, parent.run_id)).length, 1);
      const out = await selectChild(db.sql, TENANT, parent.run_id, child);
      assert.ok(out && out.status !== "succeeded" && out.name === "one");
      // Another parent's child is not one of this parent's.
      assert.equal(await selectChild(db.sql, TENANT, crypto.randomUUID(), child), undefined);
      // Done with this parent.
      const [p] = await claimRuns(db.sql, OWNER, 1, LEASE, PARENT);
      assert.ok(await completeRun(db.sql, TENANT, p.run_id, OWNER, p.attempts, null));
    };
    // A queued child cancelled by the API: delivered, and its child.finished
    // written before the wake-up, in the parent's one update (distinct seqs).
    await check(async (child, parent) => {
      assert.equal((await requestCancel(db.sql, TENANT, child))?.status, "cancelled");
      const timeline = await db.sql<{ seq: number; type: string; payload: { run_id?: string } }[]>`
        select seq, type, payload from work_events
         where tenant_id = ${TENANT} and run_id = ${parent.run_id} order by seq`;
      const tail = timeline.slice(-2);
      assert.deepEqual(tail.map((e) => e.type), ["child.finished", "run.woken"]);
      assert.equal(tail[0].payload.run_id, child);
      assert.equal(tail[1].seq, tail[0].seq + 1);
      const [{ event_seq }] = await db.sql<{ event_seq: number }[]>`
        select event_seq from runs where tenant_id = ${TENANT} and run_id = ${parent.run_id}`;
      assert.equal(event_seq, tail[1].seq, "the parent's event_seq is its last event's");
    });
    // A child failed for good by its worker.
    await check(async (child) => {
      const [k] = await claimKids(db.sql, 1);
      assert.equal(k.run_id, child);
      const end = await failAttempt(db.sql, TENANT, child, OWNER, 1, { message: "no" }, 0);
      assert.equal(end?.status, "failed");
    });
    // A running child whose cancel was requested, given back by its worker's shutdown.
    await check(async (child) => {
      await claimKids(db.sql, 1);
      assert.equal((await requestCancel(db.sql, TENANT, child))?.status, "running");
      assert.equal(await releaseRun(db.sql, TENANT, child, OWNER, 1, "shutdown"), "cancelled");
    });
    // A child whose worker died on its last attempt.
    await check(async (child) => {
      await claimKids(db.sql, 1);
      await db.sql`update runs set lease_expires_at = now() - interval '1 second'
                    where tenant_id = ${TENANT} and run_id = ${child}`;
      const reclaimed = await reclaimExpired(db.sql, 10);
      assert.deepEqual(reclaimed.map((r) => [r.run_id, r.status]), [[child, "failed"]]);
    });
  } finally {
    await db.drop();
  }
});

Deno.test("fan-in: a suspend racing its last child's completion never leaves the parent waiting", async () => {
  const db = await setup();
  try {
    for (let round = 0; round < 30; round++) {
      const parent = await runningParent(db.sql);
      const [child] = await addChildren(db.sql, parent.run_id, "r", 1);
      const [k] = await claimKids(db.sql, 1);
      assert.equal(k.run_id, child);
      const [outcome] = await Promise.all([
        awaitChildren(db.sql, parent, { group: "r", failFast: false }),
        completeRun(db.sql, TENANT, child, OWNER, k.attempts, round),
      ]);
      const row = await parentRow(db.sql, parent.run_id);
      if (outcome === "suspended") {
        assert.equal(row.status, "queued", `round ${round}: suspended, then woken`);
        assert.equal((await wakes(db.sql, parent.run_id)).length, 1);
      } else {
        assert.equal(outcome, "ready");
        assert.equal(row.status, "running", `round ${round}: not suspended`);
      }
      await db.sql`update runs set status = 'succeeded', finished_at = now(),
                          lease_owner = null, lease_expires_at = null
                    where tenant_id = ${TENANT} and run_id = ${parent.run_id}
                      and status in ('running', 'queued')`;
    }
  } finally {
    await db.drop();
  }
});

Deno.test("fan-in: a child's finishing transaction does not keep its running parent from renewing its lease", async () => {
  const db = await setup();
  try {
    const parent = await runningParent(db.sql);
    const [child] = await addChildren(db.sql, parent.run_id, "h", 1);
    const [k] = await claimKids(db.sql, 1);
    assert.equal(k.run_id, child);
    const lease = [{ tenant_id: TENANT, run_id: parent.run_id, attempt: parent.attempt }];
    await db.sql.begin(async (t) => {
      // The child's completion holds its parent's row (KEY SHARE) until it commits.
      assert.ok(await completeRun(t as unknown as Sql, TENANT, child, OWNER, k.attempts, 1));
      const [{ locked }] = await db.sql<{ locked: boolean }[]>`
        select exists (select 1 from runs where tenant_id = ${TENANT} and run_id = ${parent.run_id}
                        for update skip locked) is false as locked`;
      assert.equal(locked, true, "the parent's row is locked by the child's transaction");
      assert.deepEqual(await renewLeases(db.sql, OWNER, lease, LEASE), ["held"]);
    });
    assert.equal((await parentRow(db.sql, parent.run_id)).status, "running");
  } finally {
    await db.drop();
  }
});
