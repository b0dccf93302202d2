/**
 * The cancel cascade (db/cascade.ts) and children on their parent's
 * timeline (db/child_events.ts, db/child_admission.ts), against a real
 * Postgres: cancelling a root cancels its tree (depth 3), not a detached
 * child's subtree nor a finished run; a child admitted under a parent whose
 * cancel won the race is cancelled in its own admission; children admitted
 * concurrently with a cancel never escape it; `child.started` and
 * `child.finished` land on the parent's timeline, parse strictly, and keep
 * its seqs gapless.
 */
import assert from "node:assert/strict";
import { Admission } from "../admission/admit.ts";
import { EventMessage } from "../contracts/events.ts";
import { silentLogger } from "../core/log.ts";
import { insertTenant } from "../db/auth.ts";
import { cancelTree } from "../db/cascade.ts";
import { childFinishedMoves } from "../db/child_events.ts";
import type { Sql } from "../db/pool.ts";
import { ChildAdmission } from "../worker/child_runs.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase } from "./support/db.ts";

const TENANT = "cascade";

async function world() {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  const admission = new Admission(db.sql, catalogOf(), { maxBatch: 50, maxConcurrent: 1 });
  const children = new ChildAdmission(db.sql, silentLogger, () => {});
  const root = async () =>
    (await admission.admit({ workflow_ref: "echo", input: 0 }, {
      tenantId: TENANT,
      source: "test",
      entry: "http",
    })).run.run_id;
  const child = async (parent: string, name: string, detached = false) =>
    (await children.start({ tenant_id: TENANT, run_id: parent }, {
      name,
      workflowRef: "echo@1",
      input: name,
      detached,
    })).run_id;
  return { db, root, child };
}

// A worker's claim, as far as the cascade can tell: its attempt runs.
async function markRunning(sql: Sql, runId: string): Promise<void> {
  await sql`update runs set status = 'running', attempts = 1, started_at = now(),
                            lease_owner = 'w', lease_expires_at = now() + interval '1 hour'
             where tenant_id = ${TENANT} and run_id = ${runId}`;
}

async function statusOf(sql: Sql, runId: string) {
  const [row] = await sql<{ status: string; requested: boolean }[]>`
    select status, cancel_requested_at is not null as requested from runs
     where tenant_id = ${TENANT} and run_id = ${runId}`;
  return row;
}

/** Run `runId`'s events, each parsed strictly; its seqs must be 1..n. */
async function timeline(sql: Sql, runId: string) {
  const rows = await sql<Record<string, unknown>[]>`
    select event_id::int, tenant_id, run_id, seq, type, goal_id, dispatch_key, payload,
           to_char(at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') as at
      from work_events where tenant_id = ${TENANT} and run_id = ${runId} order by seq`;
  const events = rows.map((r) => EventMessage.parse(r));
  assert.deepEqual(events.map((e) => e.seq), events.map((_, i) => i + 1), "gapless seqs");
  return events;
}

Deno.test("cascade: cancelling a root cancels its tree of depth 3, not a detached subtree, not a finished run", async () => {
  const { db, root, child } = await world();
  const { sql } = db;
  try {
    const top = await root();
    await markRunning(sql, top);
    const a = await child(top, "a");
    const b = await child(top, "b");
    const d = await child(top, "d", true); // detached
    const a1 = await child(a, "a1");
    const a2 = await child(a, "a2");
    const a1x = await child(a1, "x"); // depth 3
    const dx = await child(d, "dx"); // under the detached child
    const done = await child(b, "done");
    for (const id of [a, a1, b, d]) await markRunning(sql, id);
    await sql`update runs set status = 'succeeded', finished_at = now()
               where tenant_id = ${TENANT} and run_id = ${done}`;

    const tree = await cancelTree(sql, TENANT, top);
    assert.equal(tree.run?.status, "running", "the root's cancel is requested");
    assert.deepEqual(new Set(tree.running), new Set([a, b, a1]));
    assert.equal(tree.cancelled, 2, "a2 and x, queued, cancelled at once");
    for (const id of [top, a, b, a1]) {
      assert.deepEqual(await statusOf(sql, id), { status: "running", requested: true });
    }
    for (const id of [a2, a1x]) {
      assert.deepEqual(await statusOf(sql, id), { status: "cancelled", requested: true });
    }
    assert.deepEqual(await statusOf(sql, d), { status: "running", requested: false });
    assert.deepEqual(await statusOf(sql, dx), { status: "queued", requested: false });
    assert.deepEqual(await statusOf(sql, done), { status: "succeeded", requested: false });

    // The parents' timelines: each child's start, and the ends of those cancelled.
    const events = await timeline(sql, a);
    assert.deepEqual(
      events.filter((e) => e.type.startsWith("child.")).map((e) => [e.type, e.payload]),
      [
        ["child.started", {
          run_id: a1,
          name: "a1",
          workflow: "echo",
          workflow_version: 1,
          detached: false,
        }],
        ["child.started", {
          run_id: a2,
          name: "a2",
          workflow: "echo",
          workflow_version: 1,
          detached: false,
        }],
        ["child.finished", { run_id: a2, name: "a2", status: "cancelled" }],
      ],
    );
    const a1Events = await timeline(sql, a1);
    assert.deepEqual(a1Events.at(-1)?.payload, { run_id: a1x, name: "x", status: "cancelled" });
    const topEvents = await timeline(sql, top);
    const started = topEvents.filter((e) => e.type === "child.started");
    assert.deepEqual(started.map((e) => e.payload), [
      { run_id: a, name: "a", workflow: "echo", workflow_version: 1, detached: false },
      { run_id: b, name: "b", workflow: "echo", workflow_version: 1, detached: false },
      { run_id: d, name: "d", workflow: "echo", workflow_version: 1, detached: true },
    ]);

    // A repeated cancel re-applies the cascade: a child the cancel missed
    // (written around it here, as a bug would) is cancelled too.
    await sql`update runs set cancel_requested_at = null
               where tenant_id = ${TENANT} and run_id = ${b}`;
    const again = await cancelTree(sql, TENANT, top);
    assert.equal(again.run, undefined, "the root's cancel was requested already");
    assert.deepEqual(again.running, [b]);
  } finally {
    await db.drop();
  }
});

Deno.test("cascade: a child admitted after its parent's cancel is cancelled in its own admission; a detached one is not", async () => {
  const { db, root, child } = await world();
  const { sql } = db;
  try {
    const top = await root();
    await markRunning(sql, top);
    await cancelTree(sql, TENANT, top);
    const late = await child(top, "late");
    const free = await child(top, "free", true);
    assert.deepEqual(await statusOf(sql, late), { status: "cancelled", requested: true });
    assert.deepEqual(await statusOf(sql, free), { status: "queued", requested: false });
    // Replayed: the same child, nothing written again.
    assert.equal(await child(top, "late"), late);
    const events = (await timeline(sql, top)).filter((e) => e.type.startsWith("child."));
    assert.deepEqual(events.map((e) => [e.type, (e.payload as { run_id: string }).run_id]), [
      ["child.started", late],
      ["child.finished", late],
      ["child.started", free],
    ]);
  } finally {
    await db.drop();
  }
});

Deno.test("cascade: children admitted while their parents are cancelled never escape the cancel", async () => {
  const { db, root, child } = await world();
  const { sql } = db;
  try {
    for (let round = 0; round < 5; round++) {
      const top = await root();
      await markRunning(sql, top);
      const mid = await child(top, "mid");
      await markRunning(sql, mid);
      // Children of both levels started while the root's cancel runs.
      const starts = Array.from(
        { length: 30 },
        (_, i) => child(i % 2 ? top : mid, `c${i}`).catch((e) => e as Error),
      );
      const [, ...ids] = await Promise.all([cancelTree(sql, TENANT, top), ...starts]);
      for (const id of ids) assert.equal(typeof id, "string", String(id));
      const loose = await sql<{ run_id: string; status: string }[]>`
        select run_id, status from runs
         where tenant_id = ${TENANT} and root_run_id = ${top}
           and status not in ('succeeded', 'failed', 'cancelled')
           and cancel_requested_at is null`;
      assert.deepEqual(
        [...loose],
        [],
        `round ${round}: every child cancelled or its cancel requested`,
      );
      const [{ n }] = await sql<{ n: number }[]>`
        select count(*)::int as n from runs where tenant_id = ${TENANT} and root_run_id = ${top}`;
      assert.equal(n, 31);
      await timeline(sql, top);
      await timeline(sql, mid);
    }
  } finally {
    await db.drop();
  }
});

Deno.test("cascade: childFinishedMoves takes the embedding statement's other changes to the parent in its one update", async () => {
  const { db, root, child } = await world();
  const { sql } = db;
  try {
    const top = await root();
    const a = await child(top, "a");
    const b = await child(top, "b");
    // A statement ending two children at once (as a completion would), with
    // its own change to the parent folded in.
    const moves = childFinishedMoves("finished", {
      set: "priority = p.priority + f.n_failed",
      returning: "f.n, f.n_failed, f.n_cancelled, p.priority",
    });
    const [row] = await sql.unsafe(
      `with upd as (
         update runs set status = case when run_id = $3::uuid then 'failed' else 'succeeded' end,
                         finished_at = now(), event_seq = event_seq + 1
          where tenant_id = $1 and run_id in ($2::uuid, $3::uuid)
         returning tenant_id, run_id, parent_run_id, dispatch_key, status
       ),
       finished as (select * from upd),
       ${moves}
       select n, n_failed, n_cancelled, priority from child_parents`,
      [TENANT, a, b],
    );
    assert.deepEqual({ ...row }, { n: 2, n_failed: 1, n_cancelled: 0, priority: 1 });
    const finished = (await timeline(sql, top)).filter((e) => e.type === "child.finished");
    assert.deepEqual(
      finished.map((e) => e.payload).sort((x, y) =>
        (x as { name: string }).name.localeCompare((y as { name: string }).name)
      ),
      [
        { run_id: a, name: "a", status: "succeeded" },
        { run_id: b, name: "b", status: "failed" },
      ],
    );
  } finally {
    await db.drop();
  }
});
