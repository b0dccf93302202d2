/**
 * Durable runs across real worker processes (tests/support/durable_worker.ts,
 * a `runWorker` process file): a three-step run whose worker is killed
 * (SIGKILL) at each step boundary in turn still runs each step's side effect
 * exactly once and succeeds with all three results; a run sleeping 8 s holds
 * no worker slot (its concurrency-1 worker runs other runs meanwhile) and no
 * concurrency slot, and resumes after its deadline on another worker process.
 */
import assert from "node:assert/strict";
import { Admission } from "../admission/admit.ts";
import { insertTenant } from "../db/auth.ts";
import type { Sql } from "../db/pool.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { quick, sleeper, three } from "./support/durable_worker.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase, waitFor } from "./support/db.ts";
import { DurableWorker } from "./support/durable_worker_process.ts";

const TENANT = "acme";

async function setup() {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  // The handlers' own tables: what their side effects write, and where they stop.
  await db.sql`create table side_effects (run_id uuid, step text, step_key text,
                                          at timestamptz default now())`;
  await db.sql`create table parked (run_id uuid, boundary int, worker int,
                                    primary key (run_id, boundary))`;
  const admission = new Admission(
    db.sql,
    catalogOf(new WorkflowRegistry([three, sleeper, quick])),
    { maxBatch: 16, maxConcurrent: 2 },
  );
  const admit = async (workflow_ref: string, input: unknown) =>
    (await admission.admit({ workflow_ref, input }, {
      tenantId: TENANT,
      source: "test",
      entry: "http",
    })).run.run_id;
  return { db, admit };
}

async function sideEffects(sql: Sql, runId: string): Promise<Record<string, number>> {
  const rows = await sql<{ step: string; n: number }[]>`
    select step, count(*)::int as n from side_effects where run_id = ${runId} group by step`;
  return Object.fromEntries(rows.map((r) => [r.step, r.n]));
}

async function runRow(sql: Sql, runId: string) {
  const [row] = await sql<{ status: string; attempts: number; result: unknown }[]>`
    select status, attempts, result from runs where tenant_id = ${TENANT} and run_id = ${runId}`;
  return row;
}

async function events(sql: Sql, runId: string) {
  return await sql<{ type: string; payload: Record<string, unknown> }[]>`
    select type, payload from work_events where tenant_id = ${TENANT} and run_id = ${runId}
     order by seq`;
}

Deno.test("it durable: a worker killed (SIGKILL) at each step boundary in turn: every step's side effect happens once, and the run succeeds with all three results", async () => {
  const { db, admit } = await setup();
  const workers: DurableWorker[] = [];
  try {
    const runId = await admit("it.three", { order: "o-42" });
    const steps = ["reserve", "charge", "ship"];
    for (const boundary of [0, 1, 2, 3]) {
      const w = new DurableWorker(db, `doomed-${boundary}`);
      workers.push(w);
      await waitFor(
        `the run at boundary ${boundary}`,
        async () => {
          const [row] = await db.sql`
          select 1 from parked where run_id = ${runId} and boundary = ${boundary}`;
          return row !== undefined;
        },
        30_000,
        50,
      );
      // The steps before the boundary ran once each; none after it ran.
      const expected = Object.fromEntries(steps.slice(0, boundary).map((s) => [s, 1]));
      assert.deepEqual(await sideEffects(db.sql, runId), expected, `at boundary ${boundary}`);
      const killed = await w.kill("SIGKILL");
      assert.notEqual(killed.code, 0);
    }
    const rescuer = new DurableWorker(db, "rescuer");
    workers.push(rescuer);
    const row = await waitFor(
      "the run succeeded",
      async () => {
        const r = await runRow(db.sql, runId);
        return r.status === "succeeded" ? r : undefined;
      },
      60_000,
      100,
    );
    assert.deepEqual(row.result, ["reserve:o-42", "charge:o-42", "ship:o-42"]);
    assert.deepEqual(await sideEffects(db.sql, runId), { reserve: 1, charge: 1, ship: 1 });
    const keys = await db.sql<{ step_key: string }[]>`
      select step_key from side_effects where run_id = ${runId} order by at`;
    assert.deepEqual(keys.map((k) => k.step_key), steps.map((s) => `${TENANT}:${runId}:${s}`));
    // Four attempts lost to the kills (their leases expired), the fifth succeeded.
    assert.equal(row.attempts, 5);
    const evs = await events(db.sql, runId);
    const completed = evs.filter((e) => e.type === "step.completed").map((e) => e.payload.name);
    assert.deepEqual(completed, steps, "each step completed once, in order");
    assert.equal(evs.filter((e) => e.type === "run.retrying").length, 4);
  } finally {
    for (const w of workers) await w.kill("SIGKILL");
    await db.drop();
  }
});

Deno.test("it durable: a run sleeping 8 s holds no worker slot and no concurrency slot, and resumes after its deadline on another worker process", async () => {
  const { db, admit } = await setup();
  const first = new DurableWorker(db, "first", { WORKER_CONCURRENCY: "1" });
  let second: DurableWorker | undefined;
  try {
    const sleepy = await admit("it.sleeper", { ms: 8_000 });
    await waitFor(
      "the first sleeper suspended",
      async () => {
        return (await runRow(db.sql, sleepy)).status === "waiting";
      },
      30_000,
      50,
    );
    const [{ deadline }] = await db.sql<{ deadline: Date }[]>`
      select run_after as deadline from runs where run_id = ${sleepy}`;
    // No concurrency slot: the workflow allows one running at a time, and
    // a second sleeper starts (and suspends too) while the first sleeps.
    const [slot] = await db.sql<{ running: number }[]>`
      select running from concurrency_slots where workflow_name = 'it.sleeper'`;
    assert.equal(slot.running, 0);
    const other = await admit("it.sleeper", { ms: 60_000 });
    await waitFor(
      "the second sleeper suspended",
      async () => {
        return (await runRow(db.sql, other)).status === "waiting";
      },
      30_000,
      50,
    );
    // No worker slot: the concurrency-1 worker runs other runs meanwhile.
    const quickIds = await Promise.all([1, 2, 3].map((i) => admit("it.quick", { i })));
    for (const id of quickIds) {
      await waitFor("a quick run", async () => (await runRow(db.sql, id)).status === "succeeded");
    }
    assert.ok(Date.now() < deadline.getTime(), "the quick runs ran while the first slept");
    assert.equal((await runRow(db.sql, sleepy)).status, "waiting");
    // The first worker goes away; another resumes the run after its deadline.
    const stopped = await first.kill("SIGTERM");
    assert.equal(stopped.code, 0, stopped.stderr);
    second = new DurableWorker(db, "second");
    const done = await waitFor(
      "the first sleeper resumed and succeeded",
      async () => {
        const r = await runRow(db.sql, sleepy);
        return r.status === "succeeded" ? r : undefined;
      },
      40_000,
      100,
    );
    assert.ok((done.result as { slept_ms: number }).slept_ms >= 8_000);
    assert.equal(done.attempts, 1, "suspending spent no attempt");
    assert.deepEqual(await sideEffects(db.sql, sleepy), { before: 1, after: 1 });
    const evs = await events(db.sql, sleepy);
    assert.deepEqual(evs.map((e) => e.type), [
      "run.admitted",
      "run.started",
      "step.completed",
      "run.waiting",
      "run.woken",
      "run.started",
      "step.completed",
      "step.completed",
      "run.succeeded",
    ]);
    assert.equal(evs[1].payload.worker, "first");
    assert.equal(evs[5].payload.worker, "second");
    const [woken] = await db.sql<{ at: Date }[]>`
      select at from work_events where run_id = ${sleepy} and type = 'run.woken'`;
    assert.ok(woken.at.getTime() >= deadline.getTime(), "woken at or after its deadline");
  } finally {
    await first.kill("SIGKILL");
    await second?.kill("SIGKILL");
    await db.drop();
  }
});
