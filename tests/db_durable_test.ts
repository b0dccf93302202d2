/**
 * Durable runs at the database (migrations 021 and 022), against a real
 * Postgres: step rows written only by the attempt holding the lease, sleeps
 * and waits whose deadline is computed once, the signal mailbox, suspension
 * and both kinds of wake-up (a signal, a deadline), cancel and quotas on
 * waiting runs, retention, and a race of signals against suspends.
 */
import assert from "node:assert/strict";
import { insertTenant } from "../db/auth.ts";
import type { Sql } from "../db/pool.ts";
import { insertRuns, type NewRun } from "../db/admission.ts";
import { type ClaimedRun, claimLimitedRuns, claimRuns } from "../db/claims.ts";
import { requestCancel } from "../db/cancellation.ts";
import { completeRun } from "../db/attempt_end.ts";
import {
  completeStep,
  failStep,
  loadSteps,
  selectStepSummaries,
  settleSleep,
  type StepFence,
} from "../db/run_steps.ts";
import { sendSignal, settleSignalWait } from "../db/signals.ts";
import { suspendRun, wakeDueRuns } from "../db/suspension.ts";
import { countQueuedRuns } from "../db/tenant_quotas.ts";
import { purgeFinishedRuns } from "../db/retention.ts";
import { createPool } from "../db/pool.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";

const TENANT = "acme";
const OWNER = "w-test";
const LEASE = 30_000;
const ECHO = { names: ["echo"], versions: [1] };
const KEYED = { names: ["keyed"], versions: [1] };

async function setup(): Promise<TestDatabase> {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  return db;
}

/** Admits `n` echo runs (limited to one running per key `k` when `limited`). */
async function admit(sql: Sql, n = 1, limited = false): Promise<string[]> {
  const runs: NewRun[] = Array.from({ length: n }, (_, i) => ({
    tenant_id: TENANT,
    run_id: crypto.randomUUID(),
    workflow_ref: limited ? "keyed" : "echo",
    workflow_name: limited ? "keyed" : "echo",
    workflow_version: 1,
    input: { i },
    goal_id: null,
    dispatch_key: null,
    source: "test",
    max_attempts: 3,
    run_after: null,
    ...(limited ? { concurrency_key: "k", concurrency_limit: 1 } : {}),
  }));
  const rows = await insertRuns(sql, runs);
  return rows.map((r) => r.run_id);
}

/** Claims every due echo run (or keyed run) as OWNER. */
async function claimAll(sql: Sql, limited = false): Promise<ClaimedRun[]> {
  const out: ClaimedRun[] = [];
  for (;;) {
    const batch = limited
      ? await claimLimitedRuns(sql, OWNER, 100, LEASE, KEYED)
      : await claimRuns(sql, OWNER, 100, LEASE, ECHO);
    out.push(...batch);
    if (batch.length === 0) return out;
  }
}

function fenceOf(run: ClaimedRun): StepFence {
  return { tenant_id: run.tenant_id, run_id: run.run_id, owner: OWNER, attempt: run.attempts };
}

async function runRow(sql: Sql, runId: string) {
  const [row] = await sql<
    {
      status: string;
      attempts: number;
      lease_owner: string | null;
      run_after: Date;
      wait_reason: string | null;
      wait_name: string | null;
    }[]
  >`select status, attempts, lease_owner, run_after, wait_reason, wait_name from runs
     where tenant_id = ${TENANT} and run_id = ${runId}`;
  return row;
}

async function eventTypes(sql: Sql, runId: string): Promise<[number, string, unknown][]> {
  const rows = await sql<{ seq: number; type: string; payload: unknown }[]>`
    select seq, type, payload from work_events
     where tenant_id = ${TENANT} and run_id = ${runId} order by seq`;
  return rows.map((r) => [r.seq, r.type, r.payload]);
}

Deno.test("durable db: a step's result is written once, by the attempt holding the lease, with step.completed in seq", async () => {
  const db = await setup();
  try {
    const [runId] = await admit(db.sql);
    const [run] = await claimAll(db.sql);
    const f = fenceOf(run);
    const step = { name: "charge", seq: 1, resultJson: '{"id":"ch_1"}', size: 13, durationMs: 5 };
    assert.equal(await completeStep(db.sql, f, step), "written");
    // A retried write (its reply lost) writes nothing twice.
    assert.equal(await completeStep(db.sql, f, step), "stored");
    // Another attempt, or another owner, writes nothing.
    assert.equal(await completeStep(db.sql, { ...f, attempt: 2 }, { ...step, name: "x" }), "lost");
    assert.equal(
      await completeStep(db.sql, { ...f, owner: "other" }, { ...step, name: "y" }),
      "lost",
    );
    assert.equal(
      await failStep(db.sql, { ...f, attempt: 2 }, { ...step, tries: 1, error: {} }),
      false,
    );
    const steps = await loadSteps(db.sql, TENANT, runId);
    assert.deepEqual(steps.map((s) => [s.name, s.seq, s.kind, s.status, s.result]), [
      ["charge", 1, "step", "completed", { id: "ch_1" }],
    ]);
    const evs = await eventTypes(db.sql, runId);
    assert.deepEqual(evs.map(([seq, type]) => [seq, type]), [
      [1, "run.admitted"],
      [2, "run.started"],
      [3, "step.completed"],
    ]);
    assert.deepEqual(evs[2][2], {
      name: "charge",
      seq: 1,
      kind: "step",
      size: 13,
      attempt: 1,
      duration_ms: 5,
      until: null,
      signal_id: null,
      timed_out: null,
    });
    // A failed step is recorded (step.failed) and completed later over it.
    assert.equal(
      await failStep(db.sql, f, { name: "ship", seq: 2, tries: 3, error: { message: "down" } }),
      true,
    );
    const [summary] = (await selectStepSummaries(db.sql, TENANT, runId)).slice(1);
    assert.equal(summary.status, "failed");
    assert.equal(summary.error_message, "down");
    assert.equal(
      await completeStep(db.sql, f, {
        name: "ship",
        seq: 2,
        resultJson: "1",
        size: 1,
        durationMs: 1,
      }),
      "written",
    );
    assert.deepEqual((await eventTypes(db.sql, runId)).map(([, t]) => t).slice(3), [
      "step.failed",
      "step.completed",
    ]);
  } finally {
    await db.drop();
  }
});

Deno.test("durable db: a sleep's end is computed once by Postgres and completed by the first call past it", async () => {
  const db = await setup();
  try {
    const [runId] = await admit(db.sql);
    const [run] = await claimAll(db.sql);
    const f = fenceOf(run);
    const first = await settleSleep(db.sql, f, { name: "nap", seq: 1, ms: 60_000 });
    assert.equal(first.done, false);
    assert.equal(first.held, true);
    const left = first.until.getTime() - first.now.getTime();
    assert.ok(left > 59_000 && left <= 60_000, `${left}`);
    // A replay asking for another length keeps the stored end.
    const again = await settleSleep(db.sql, f, { name: "nap", seq: 1, ms: 1 });
    assert.equal(again.until.getTime(), first.until.getTime());
    assert.equal(again.done, false);
    // A sleep already over completes at once, with its event.
    const past = await settleSleep(db.sql, f, { name: "past", seq: 2, until: new Date(0) });
    assert.equal(past.done, true);
    const zero = await settleSleep(db.sql, f, { name: "zero", seq: 3, ms: 0 });
    assert.equal(zero.done, true);
    assert.deepEqual((await eventTypes(db.sql, runId)).map(([, t]) => t), [
      "run.admitted",
      "run.started",
      "step.completed",
      "step.completed",
    ]);
    const lost = await settleSleep(db.sql, { ...f, attempt: 9 }, { name: "z", seq: 4, ms: 0 });
    assert.equal(lost.held, false);
    assert.deepEqual((await loadSteps(db.sql, TENANT, runId)).map((s) => [s.name, s.status]), [
      ["nap", "waiting"],
      ["past", "completed"],
      ["zero", "completed"],
    ]);
  } finally {
    await db.drop();
  }
});

Deno.test("durable db: a signal sent before the wait is buffered and consumed once; a replayed signal_id is one signal; a final run refuses a new one", async () => {
  const db = await setup();
  try {
    const [runId] = await admit(db.sql);
    const sent = await sendSignal(db.sql, TENANT, runId, {
      name: "approval",
      signal_id: "s-1",
      payload: { ok: true },
    });
    assert.equal(sent.outcome, "created");
    const again = await sendSignal(db.sql, TENANT, runId, {
      name: "approval",
      signal_id: "s-1",
      payload: { ok: false },
    });
    assert.equal(again.outcome, "replayed");
    assert.equal(
      (await sendSignal(db.sql, "other", runId, { name: "a", signal_id: "x", payload: 1 }))
        .outcome,
      "no-run",
    );
    const [run] = await claimAll(db.sql);
    const f = fenceOf(run);
    const got = await settleSignalWait(db.sql, f, {
      name: "approval",
      seq: 1,
      signalName: "approval",
      timeoutMs: null,
    });
    assert.equal(got.outcome, "signal");
    assert.deepEqual(got.outcome === "signal" && got.signal.payload, { ok: true });
    // The second wait of the name finds nothing left: the first consumed it.
    const second = await settleSignalWait(db.sql, f, {
      name: "approval#2",
      seq: 2,
      signalName: "approval",
      timeoutMs: 60_000,
    });
    assert.equal(second.outcome, "waiting");
    const [{ consumed_as }] = await db.sql<{ consumed_as: string }[]>`
      select consumed_as from run_signals where run_id = ${runId}`;
    assert.equal(consumed_as, "approval");
    // A wait whose timeout passed returns null (a timeout) and completes.
    const timedOut = await settleSignalWait(db.sql, f, {
      name: "late",
      seq: 3,
      signalName: "late",
      timeoutMs: 0,
    });
    assert.equal(timedOut.outcome, "timeout");
    assert.deepEqual(
      (await loadSteps(db.sql, TENANT, runId)).map((s) => [s.name, s.kind, s.status, s.result]),
      [
        ["approval", "signal", "completed", {
          name: "approval",
          signal_id: "s-1",
          payload: { ok: true },
          received_at: (await loadSteps(db.sql, TENANT, runId))[0].result &&
            ((await loadSteps(db.sql, TENANT, runId))[0].result as { received_at: string })
              .received_at,
        }],
        ["approval#2", "signal", "waiting", null],
        ["late", "signal", "completed", null],
      ],
    );
    const types = (await eventTypes(db.sql, runId)).map(([, t]) => t);
    assert.deepEqual(types, [
      "run.admitted",
      "signal.received",
      "run.started",
      "step.completed",
      "step.completed",
    ]);
    assert.equal(await completeRun(db.sql, TENANT, runId, OWNER, run.attempts, null), true);
    const refused = await sendSignal(db.sql, TENANT, runId, {
      name: "approval",
      signal_id: "s-2",
      payload: null,
    });
    assert.deepEqual(refused, { outcome: "final", status: "succeeded" });
    // A replay of a signal stored before the run finished is still a replay.
    const replay = await sendSignal(db.sql, TENANT, runId, {
      name: "approval",
      signal_id: "s-1",
      payload: null,
    });
    assert.equal(replay.outcome, "replayed");
  } finally {
    await db.drop();
  }
});

Deno.test("durable db: a suspended sleep frees the lease, the attempt and the concurrency slot, and the waker queues it at its deadline, claimable again as the same attempt", async () => {
  const db = await setup();
  try {
    const ids = await admit(db.sql, 2, true);
    const [run] = await claimAll(db.sql, true);
    const runId = run.run_id;
    const otherId = ids.find((id) => id !== runId)!;
    // One running per key: the other waits for the slot.
    assert.equal((await claimAll(db.sql, true)).length, 0);
    const f = fenceOf(run);
    // Long enough that a loaded machine still suspends before the deadline
    // (past it, the suspend rightly answers "ready").
    const sleep = await settleSleep(db.sql, f, { name: "nap", seq: 1, ms: 2_000 });
    const outcome = await suspendRun(db.sql, f, {
      reason: "sleep",
      name: "nap",
      step: "nap",
      until: sleep.until,
    });
    assert.equal(outcome, "suspended");
    const row = await runRow(db.sql, runId);
    assert.equal(row.status, "waiting");
    assert.equal(row.attempts, 0);
    assert.equal(row.lease_owner, null);
    assert.equal(row.run_after.getTime(), sleep.until.getTime());
    assert.deepEqual([row.wait_reason, row.wait_name], ["sleep", "nap"]);
    // The slot is free: the other run of the key starts.
    const [other] = await claimAll(db.sql, true);
    assert.equal(other.run_id, otherId);
    assert.equal(await completeRun(db.sql, TENANT, otherId, OWNER, other.attempts, null), true);
    // Fenced: the suspended attempt writes nothing more.
    assert.equal(
      await completeStep(db.sql, f, { name: "s", seq: 2, resultJson: "1", size: 1, durationMs: 0 }),
      "lost",
    );
    // Quotas count it as queued work.
    assert.equal(await countQueuedRuns(db.sql, TENANT, 10), 1);
    const woken = await waitFor(
      "the sleep's deadline",
      async () => {
        const w = await wakeDueRuns(db.sql, 10);
        return w.length > 0 ? w : undefined;
      },
      20_000,
      50,
    );
    assert.deepEqual([...woken], [{
      tenant_id: TENANT,
      run_id: runId,
      reason: "sleep",
      name: "nap",
    }]);
    assert.equal((await runRow(db.sql, runId)).status, "queued");
    assert.equal((await runRow(db.sql, runId)).wait_reason, null);
    const [again] = await claimAll(db.sql, true);
    assert.equal(again.run_id, runId);
    assert.equal(again.attempts, 1, "the attempt was not spent");
    const settled = await settleSleep(db.sql, fenceOf(again), { name: "nap", seq: 1, ms: 300 });
    assert.equal(settled.done, true);
    const types = (await eventTypes(db.sql, runId)).map(([, t, p]) => [t, p]);
    assert.deepEqual(types.map(([t]) => t), [
      "run.admitted",
      "run.started",
      "run.waiting",
      "run.woken",
      "run.started",
      "step.completed",
    ]);
    // Postgres prints a timestamp without its trailing zeros (.5, not .500):
    // the instant is what must match.
    const waiting = types[2][1] as { until: string };
    assert.equal(Date.parse(waiting.until), sleep.until.getTime());
    assert.deepEqual({ ...waiting, until: undefined }, {
      reason: "sleep",
      name: "nap",
      step: "nap",
      until: undefined,
      attempt: 1,
    });
    assert.deepEqual(types[3][1], {
      by: "deadline",
      reason: "sleep",
      name: "nap",
      signal_id: null,
    });
    const [slot] = await db.sql<{ running: number; queued: number }[]>`
      select running, queued from concurrency_slots where tenant_id = ${TENANT}`;
    assert.deepEqual({ ...slot }, { running: 1, queued: 0 });
  } finally {
    await db.drop();
  }
});

Deno.test("durable db: a run suspended on a signal is woken by the signal's transaction, and does not suspend when the signal is already there", async () => {
  const db = await setup();
  try {
    const [runId] = await admit(db.sql);
    const [run] = await claimAll(db.sql);
    const f = fenceOf(run);
    const wait = { name: "approval", seq: 1, signalName: "approval", timeoutMs: null };
    const state = await settleSignalWait(db.sql, f, wait);
    assert.equal(state.outcome, "waiting");
    const suspended = await suspendRun(db.sql, f, {
      reason: "signal",
      name: "approval",
      step: "approval",
      until: null,
    });
    assert.equal(suspended, "suspended");
    const [{ never }] = await db.sql<{ never: boolean }[]>`
      select run_after = 'infinity' as never from runs where run_id = ${runId}`;
    assert.equal(never, true, "no deadline: never due before its signal");
    // Another name does not wake it; its own does.
    const other = await sendSignal(db.sql, TENANT, runId, {
      name: "other",
      signal_id: "o",
      payload: 1,
    });
    assert.equal(other.outcome === "created" && other.woken, false);
    assert.equal((await runRow(db.sql, runId)).status, "waiting");
    const sent = await sendSignal(db.sql, TENANT, runId, {
      name: "approval",
      signal_id: "a",
      payload: { ok: true },
    });
    assert.equal(sent.outcome === "created" && sent.woken, true);
    assert.equal((await runRow(db.sql, runId)).status, "queued");
    const [again] = await claimAll(db.sql);
    const got = await settleSignalWait(db.sql, fenceOf(again), wait);
    assert.equal(got.outcome, "signal");
    // Waiting again for a signal already in the mailbox: not suspended.
    await sendSignal(db.sql, TENANT, runId, { name: "next", signal_id: "n", payload: 2 });
    const ready = await suspendRun(db.sql, fenceOf(again), {
      reason: "signal",
      name: "next",
      step: "next",
      until: null,
    });
    assert.equal(ready, "ready");
    assert.equal((await runRow(db.sql, runId)).status, "running");
    // Nor when its deadline has passed.
    const past = await suspendRun(db.sql, fenceOf(again), {
      reason: "sleep",
      name: "nap",
      step: "nap",
      until: new Date(Date.now() - 1000),
    });
    assert.equal(past, "ready");
    assert.equal(
      await suspendRun(db.sql, { ...fenceOf(again), attempt: 7 }, {
        reason: "sleep",
        name: "x",
        step: "x",
        until: null,
      }),
      "lost",
    );
    const types = (await eventTypes(db.sql, runId)).map(([, t]) => t);
    assert.deepEqual(types, [
      "run.admitted",
      "run.started",
      "run.waiting",
      "signal.received",
      "signal.received",
      "run.woken",
      "run.started",
      "step.completed",
      "signal.received",
    ]);
  } finally {
    await db.drop();
  }
});

Deno.test("durable db: cancel ends a waiting run at once and moves no concurrency count; a cancel requested while running refuses the suspend", async () => {
  const db = await setup();
  try {
    const ids = await admit(db.sql, 2, true);
    const [run] = await claimAll(db.sql, true);
    const a = run.run_id;
    const b = ids.find((id) => id !== a)!;
    const wait = { reason: "signal" as const, name: "go", step: "go", until: null };
    assert.equal(await suspendRun(db.sql, fenceOf(run), wait), "suspended");
    const cancelled = await requestCancel(db.sql, TENANT, a);
    assert.equal(cancelled?.status, "cancelled");
    const [slot] = await db.sql<{ running: number; queued: number }[]>`
      select running, queued from concurrency_slots where tenant_id = ${TENANT}`;
    assert.deepEqual({ ...slot }, { running: 0, queued: 1 });
    const row = await runRow(db.sql, a);
    assert.deepEqual([row.wait_reason, row.wait_name], ["signal", "go"]);
    // A signal to it now is refused; nothing wakes it.
    const sent = await sendSignal(db.sql, TENANT, a, { name: "go", signal_id: "1", payload: 1 });
    assert.equal(sent.outcome, "final");
    const [next] = await claimAll(db.sql, true);
    assert.equal(next.run_id, b);
    await requestCancel(db.sql, TENANT, b);
    assert.equal(await suspendRun(db.sql, fenceOf(next), wait), "cancel-requested");
    assert.equal((await runRow(db.sql, b)).status, "running");
  } finally {
    await db.drop();
  }
});

Deno.test("durable db: retention purges a finished run's steps and signals with it, and leaves a waiting run's", async () => {
  const db = await setup();
  try {
    const [done, waiting] = await admit(db.sql, 2);
    const runs = await claimAll(db.sql);
    const byId = new Map(runs.map((r) => [r.run_id, r]));
    for (const id of [done, waiting]) {
      const f = fenceOf(byId.get(id)!);
      await completeStep(db.sql, f, { name: "a", seq: 1, resultJson: "1", size: 1, durationMs: 0 });
      await sendSignal(db.sql, TENANT, id, { name: "s", signal_id: "1", payload: 1 });
    }
    await suspendRun(db.sql, fenceOf(byId.get(waiting)!), {
      reason: "signal",
      name: "t",
      step: "t",
      until: null,
    });
    await completeRun(db.sql, TENANT, done, OWNER, 1, null);
    await db.sql`update runs set finished_at = now() - interval '1 day' where run_id = ${done}`;
    await db.sql`update work_events set published_at = now()`;
    const purged = await purgeFinishedRuns(db.sql, 60_000, 100);
    assert.equal(purged.runs, 1);
    const left = await db.sql<{ t: string; run_id: string }[]>`
      select 'step' as t, run_id from run_steps
      union all select 'signal', run_id from run_signals order by 1`;
    assert.deepEqual(left.map((r) => [r.t, r.run_id]), [["signal", waiting], ["step", waiting]]);
  } finally {
    await db.drop();
  }
});

Deno.test("durable db: 1,000 signals raced against suspends on several connections leave no run waiting with an unconsumed signal of its name", async () => {
  const db = await setup();
  // Two pools: the workers' statements and the API's signals on connections of their own.
  const api = createPool({ url: db.url, max: 6, applicationName: "durable-race-api" });
  const workers = createPool({ url: db.url, max: 6, applicationName: "durable-race-worker" });
  try {
    const ITERATIONS = 1000;
    const ids = await admit(db.sql, ITERATIONS);
    const claimed = await claimAll(db.sql);
    assert.equal(claimed.length, ITERATIONS);
    const wait = { name: "go", seq: 1, signalName: "go", timeoutMs: null };
    // What a handler's wait does: look, suspend if nothing is there, look again if told "ready".
    const waiter = async (run: ClaimedRun) => {
      const f = fenceOf(run);
      for (;;) {
        const state = await settleSignalWait(workers, f, wait);
        if (state.outcome !== "waiting") return state.outcome;
        const s = await suspendRun(workers, f, {
          reason: "signal",
          name: "go",
          step: "go",
          until: null,
        });
        if (s !== "ready") return s;
      }
    };
    const signaller = (run: ClaimedRun) =>
      sendSignal(api, run.tenant_id, run.run_id, { name: "go", signal_id: "once", payload: 1 });
    // Each pair starts its two sides in either order, several pairs at once.
    let next = 0;
    const lanes = Array.from({ length: 6 }, async () => {
      while (next < claimed.length) {
        const run = claimed[next++];
        const sides = [() => waiter(run), () => signaller(run)];
        if (Math.random() < 0.5) sides.reverse();
        await Promise.all(sides.map((side) => side()));
      }
    });
    await Promise.all(lanes);
    const [lost] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from runs r
       where r.status = 'waiting'
         and exists (select 1 from run_signals s
                      where s.tenant_id = r.tenant_id and s.run_id = r.run_id
                        and s.name = r.wait_name and s.consumed_as is null)`;
    assert.equal(lost.n, 0, "runs left waiting with their signal unconsumed");
    // Every run either consumed its signal while running, or was woken by it (queued, the
    // signal left for its replay); none is waiting, none has two signals.
    const states = await db.sql<{ state: string; n: number }[]>`
      select r.status || ':' || case when s.consumed_as is null then 'unconsumed'
                                     else 'consumed' end as state, count(*)::int as n
        from runs r join run_signals s on s.tenant_id = r.tenant_id and s.run_id = r.run_id
       group by 1 order by 1`;
    const byState = Object.fromEntries(states.map((s) => [s.state, s.n]));
    assert.deepEqual(
      Object.keys(byState).filter((k) => k !== "running:consumed" && k !== "queued:unconsumed"),
      [],
      JSON.stringify(byState),
    );
    assert.equal(states.reduce((a, s) => a + s.n, 0), ids.length);
    // Both orders happened: some runs were woken, some found their signal.
    assert.ok((byState["queued:unconsumed"] ?? 0) > 0, JSON.stringify(byState));
    assert.ok((byState["running:consumed"] ?? 0) > 0, JSON.stringify(byState));
  } finally {
    await api.end();
    await workers.end();
    await db.drop();
  }
});
