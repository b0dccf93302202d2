/**
 * Durable handlers in the worker, against a real Postgres: steps that run
 * once per run and replay from their stored results, names and their `#n`
 * suffixes, `ctx.stepKey`, retries within a step, the bound on a step's
 * result, non-determinism, sleeps that stay in the worker or suspend the
 * run (and are woken by the leader's waker), and signal waits (buffered,
 * woken by their signal, timing out to null). Workers run in this process;
 * tests/it_durable_test.ts runs worker processes.
 */
import assert from "node:assert/strict";
import { z } from "zod";
import { Admission } from "../admission/admit.ts";
import { silentLogger } from "../core/log.ts";
import { insertTenant } from "../db/auth.ts";
import { createPool, type Sql } from "../db/pool.ts";
import { sendSignal } from "../db/signals.ts";
import { requestCancel } from "../db/cancellation.ts";
import { notifyCancel } from "../db/notify.ts";
import { selectStepSummaries } from "../db/run_steps.ts";
import { defineWorkflow, type Workflow } from "../workflows/define.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { Worker, type WorkerOptions } from "../worker/worker.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";

const TENANT = "acme";

// deno-lint-ignore no-explicit-any
type AnyWorkflow = Workflow<any>;

async function setup(workflows: AnyWorkflow[]) {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  const admission = new Admission(db.sql, catalogOf(new WorkflowRegistry(workflows)), {
    maxBatch: 16,
    maxConcurrent: 2,
  });
  const admit = async (workflow_ref: string, input: unknown = {}) =>
    (await admission.admit({ workflow_ref, input }, {
      tenantId: TENANT,
      source: "test",
      entry: "http",
    })).run.run_id;
  return { db, admit };
}

function worker(sql: Sql, workflows: AnyWorkflow[], opts: Partial<WorkerOptions> = {}) {
  const { host, port, user, database } = sql.options;
  const url = `postgres://${user}@${host[0]}:${port[0]}/${database}`;
  return new Worker(sql, new WorkflowRegistry(workflows), {
    leaderSession: () => createPool({ url, max: 1, applicationName: "durable-test-leader" }),
    id: `w-${crypto.randomUUID().slice(0, 8)}`,
    concurrency: 4,
    leaseMs: 30_000,
    pollMs: 100,
    retryBaseMs: 20,
    shutdownMs: 2_000,
    wakeMs: 100,
    log: silentLogger,
    ...opts,
  });
}

async function run(sql: Sql, runId: string) {
  const [row] = await sql<
    {
      status: string;
      attempts: number;
      result: unknown;
      error: { code?: string; message: string } | null;
      wait_reason: string | null;
    }[]
  >`select status, attempts, result, error, wait_reason from runs
     where tenant_id = ${TENANT} and run_id = ${runId}`;
  return row;
}

const statusIs = (sql: Sql, runId: string, status: string) => async () => {
  const row = await run(sql, runId);
  return row?.status === status ? row : undefined;
};

async function eventTypes(sql: Sql, runId: string): Promise<string[]> {
  const rows = await sql<{ type: string }[]>`
    select type from work_events where tenant_id = ${TENANT} and run_id = ${runId} order by seq`;
  return rows.map((r) => r.type);
}

async function stopAll(db: TestDatabase, ...workers: Worker[]) {
  await Promise.all(workers.map((w) => w.stop()));
  await db.drop();
}

Deno.test("durable worker: each step runs once per run; a retried attempt replays the stored results without calling them", async () => {
  const calls: Record<string, number> = {};
  const keys: string[] = [];
  const count = (name: string) => (calls[name] = (calls[name] ?? 0) + 1);
  const wf = defineWorkflow({
    name: "three",
    version: 1,
    input: z.object({}),
    maxAttempts: 3,
    async handler(_input, ctx) {
      const a = await ctx.step("a", () => (count("a"), { n: 1, at: new Date(0) }));
      const b = await ctx.step("b", async (key) => {
        count("b");
        await Promise.resolve();
        keys.push(ctx.stepKey, key);
        return 2;
      });
      // Twice the same name: a#2.
      const a2 = await ctx.step("a", () => (count("a#2"), "again"));
      if (ctx.attempt === 1) throw new Error("crash between steps");
      const c = await ctx.step("c", () => (count("c"), undefined));
      return { a, b, a2, c };
    },
  });
  const { db, admit } = await setup([wf]);
  const w = worker(db.sql, [wf]);
  try {
    await w.start();
    const runId = await admit("three");
    const row = await waitFor("run succeeded", statusIs(db.sql, runId, "succeeded"), 15_000);
    // What a step returns is its stored JSON: the Date is a string, undefined null.
    assert.deepEqual(row.result, {
      a: { n: 1, at: "1970-01-01T00:00:00.000Z" },
      b: 2,
      a2: "again",
      c: null,
    });
    assert.equal(row.attempts, 2);
    assert.deepEqual(calls, { a: 1, b: 1, "a#2": 1, c: 1 });
    assert.deepEqual(keys, [`${TENANT}:${runId}:b`, `${TENANT}:${runId}:b`]);
    const steps = await selectStepSummaries(db.sql, TENANT, runId);
    assert.deepEqual(steps.map((s) => [s.seq, s.name, s.kind, s.status, s.attempt]), [
      [1, "a", "step", "completed", 1],
      [2, "b", "step", "completed", 1],
      [3, "a#2", "step", "completed", 1],
      [4, "c", "step", "completed", 2],
    ]);
    assert.deepEqual(await eventTypes(db.sql, runId), [
      "run.admitted",
      "run.started",
      "step.completed",
      "step.completed",
      "step.completed",
      "run.retrying",
      "run.started",
      "step.completed",
      "run.succeeded",
    ]);
  } finally {
    await stopAll(db, w);
  }
});

Deno.test("durable worker: a step retries within the attempt; one failing every try records step.failed and fails the attempt, and runs again on the next", async () => {
  let flaky = 0;
  let broken = 0;
  const wf = defineWorkflow({
    name: "retrying",
    version: 1,
    input: z.object({}),
    maxAttempts: 2,
    async handler(_input, ctx) {
      await ctx.step("flaky", () => {
        if (++flaky < 3) throw new Error(`flaky ${flaky}`);
        return flaky;
      }, { retries: 2 });
      return await ctx.step("broken", () => {
        broken++;
        throw new Error("always");
      }, { retries: 1 });
    },
  });
  const { db, admit } = await setup([wf]);
  const w = worker(db.sql, [wf]);
  try {
    await w.start();
    const runId = await admit("retrying");
    const row = await waitFor("run failed", statusIs(db.sql, runId, "failed"), 20_000);
    assert.equal(row.error?.message, "always");
    assert.equal(flaky, 3, "flaky ran three times in attempt 1, never again");
    assert.equal(broken, 4, "broken ran twice in each attempt");
    const types = await eventTypes(db.sql, runId);
    assert.deepEqual(types.filter((t) => t.startsWith("step.")), [
      "step.completed",
      "step.failed",
      "step.failed",
    ]);
    const [, failed] = await selectStepSummaries(db.sql, TENANT, runId);
    assert.deepEqual([failed.name, failed.status, failed.error_message], [
      "broken",
      "failed",
      "always",
    ]);
  } finally {
    await stopAll(db, w);
  }
});

Deno.test("durable worker: a step result over RUN_STEP_MAX_BYTES fails the run for good with step-too-large; ctx.stepKey outside a step and a bad name throw", async () => {
  const seen: string[] = [];
  const wf = defineWorkflow({
    name: "big",
    version: 1,
    input: z.object({}),
    maxAttempts: 3,
    async handler(_input, ctx) {
      try {
        void ctx.stepKey;
      } catch (err) {
        seen.push((err as Error).name);
      }
      await ctx.step("bad#name", () => 1).catch((err) => seen.push((err as Error).name));
      return await ctx.step("big", () => "x".repeat(5000));
    },
  });
  const { db, admit } = await setup([wf]);
  const w = worker(db.sql, [wf], { stepMaxBytes: 2048 });
  try {
    await w.start();
    const runId = await admit("big");
    const row = await waitFor("run failed", statusIs(db.sql, runId, "failed"), 15_000);
    assert.equal(row.attempts, 1, "not retried");
    assert.equal(row.error?.code, "step-too-large");
    assert.match(
      row.error!.message,
      /step big: its result is 5002 bytes as JSON, over RUN_STEP_MAX_BYTES \(2048\)/,
    );
    assert.deepEqual(seen, ["TypeError", "TypeError"]);
  } finally {
    await stopAll(db, w);
  }
});

Deno.test("durable worker: reordering two steps of a deployed version fails its replaying run with non-determinism, for good", async () => {
  const order = (first: string, second: string): AnyWorkflow =>
    defineWorkflow({
      name: "ordered",
      version: 1,
      input: z.object({}),
      maxAttempts: 5,
      async handler(_input, ctx) {
        await ctx.step(first, () => first);
        await ctx.step(second, () => second);
        await ctx.waitForSignal("go");
        return "done";
      },
    });
  const before = order("a", "b");
  const after = order("b", "a");
  const { db, admit } = await setup([before]);
  const w1 = worker(db.sql, [before]);
  const w2 = worker(db.sql, [after]);
  try {
    await w1.start();
    const runId = await admit("ordered");
    await waitFor("run waiting", statusIs(db.sql, runId, "waiting"), 15_000);
    await w1.stop();
    // The same name@version, deployed again with its two steps swapped.
    await w2.start();
    await sendSignal(db.sql, TENANT, runId, { name: "go", signal_id: "1", payload: null });
    const row = await waitFor("run failed", statusIs(db.sql, runId, "failed"), 15_000);
    assert.equal(row.error?.code, "non-determinism");
    assert.match(
      row.error!.message,
      /ordered@1: call 1 is stored as a \(a step\), and made as b \(a step\)/,
    );
    assert.equal(row.attempts, 1, "final: no retry, and the suspended attempt was not spent");
  } finally {
    await stopAll(db, w1, w2);
  }
});

Deno.test("durable worker: a short sleep stays in the worker; a long one suspends the run (no slot held, the worker runs others) and the waker resumes it at its end", async () => {
  let others = 0;
  const sleeper = defineWorkflow({
    name: "sleeper",
    version: 1,
    input: z.object({ ms: z.number() }),
    async handler({ ms }, ctx) {
      const before = await ctx.step("before", () => Date.now());
      await ctx.sleep("nap", ms);
      await ctx.sleepUntil("past", new Date(0));
      return { slept: Date.now() - before };
    },
  });
  const quick = defineWorkflow({
    name: "quick",
    version: 1,
    input: z.object({}),
    handler: () => Promise.resolve(++others),
  });
  const { db, admit } = await setup([sleeper, quick]);
  const w = worker(db.sql, [sleeper, quick], { concurrency: 1, suspendAfterMs: 500 });
  try {
    await w.start();
    const short = await admit("sleeper", { ms: 200 });
    const shortRow = await waitFor(
      "short sleep done",
      statusIs(db.sql, short, "succeeded"),
      10_000,
    );
    assert.ok((shortRow.result as { slept: number }).slept >= 200);
    assert.ok(!(await eventTypes(db.sql, short)).includes("run.waiting"), "not suspended");

    const long = await admit("sleeper", { ms: 3000 });
    await waitFor("long sleep suspended", statusIs(db.sql, long, "waiting"), 10_000);
    assert.equal(w.inFlight, 0, "the suspended run holds no slot");
    // One slot, and it runs other runs while the sleep lasts.
    const quickIds = await Promise.all([1, 2, 3].map(() => admit("quick")));
    for (const id of quickIds) {
      await waitFor("quick run", statusIs(db.sql, id, "succeeded"), 10_000);
    }
    assert.equal((await run(db.sql, long)).status, "waiting", "still asleep");
    const row = await waitFor("long sleep done", statusIs(db.sql, long, "succeeded"), 15_000);
    assert.ok((row.result as { slept: number }).slept >= 3000);
    assert.equal(row.attempts, 1);
    assert.deepEqual(await eventTypes(db.sql, long), [
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
  } finally {
    await stopAll(db, w);
  }
});

Deno.test("durable worker: signals sent before the wait, during it (suspended), twice with one signal_id: each consumed once; a wait times out to null", async () => {
  const got: unknown[] = [];
  const wf = defineWorkflow({
    name: "approvals",
    version: 1,
    input: z.object({}),
    async handler(_input, ctx) {
      const early = await ctx.waitForSignal("early");
      const late = await ctx.waitForSignal<{ ok: boolean }>("late", { timeout: 60_000 });
      const none = await ctx.waitForSignal("never", { timeout: 300 });
      const again = await ctx.waitForSignal("late", { timeout: 200 });
      got.push(early?.payload, late?.payload, none, again);
      return { early: early?.signal_id, late: late?.payload.ok, none, again };
    },
  });
  const { db, admit } = await setup([wf]);
  const w = worker(db.sql, [wf], { suspendAfterMs: 1000 });
  try {
    const runId = await admit("approvals");
    // Before the wait, before any worker runs it.
    await sendSignal(db.sql, TENANT, runId, { name: "early", signal_id: "e1", payload: "first" });
    await w.start();
    await waitFor("waiting for late", async () => {
      const r = await run(db.sql, runId);
      return r.status === "waiting" && r.wait_reason === "signal";
    }, 10_000);
    // During the wait: it wakes the run; the same id again is one signal.
    const first = await sendSignal(db.sql, TENANT, runId, {
      name: "late",
      signal_id: "l1",
      payload: { ok: true },
    });
    assert.equal(first.outcome === "created" && first.woken, true);
    const second = await sendSignal(db.sql, TENANT, runId, {
      name: "late",
      signal_id: "l1",
      payload: { ok: false },
    });
    assert.equal(second.outcome, "replayed");
    const row = await waitFor("run succeeded", statusIs(db.sql, runId, "succeeded"), 15_000);
    assert.deepEqual(row.result, { early: "e1", late: true, none: null, again: null });
    assert.equal(row.attempts, 1);
    // Each wait consumed its signal once, even across the replay.
    const consumed = await db.sql<{ name: string; consumed_as: string }[]>`
      select name, consumed_as from run_signals where run_id = ${runId} order by n`;
    assert.deepEqual(consumed.map((c) => [c.name, c.consumed_as]), [
      ["early", "early"],
      ["late", "late"],
    ]);
    const steps = await selectStepSummaries(db.sql, TENANT, runId);
    assert.deepEqual(steps.map((s) => [s.name, s.kind, s.status]), [
      ["early", "signal", "completed"],
      ["late", "signal", "completed"],
      ["never", "signal", "completed"],
      ["late#2", "signal", "completed"],
    ]);
  } finally {
    await stopAll(db, w);
  }
});

Deno.test("durable worker: a waiting run is cancelled at once, and a cancel during a short wait ends the run cancelled", async () => {
  const wf = defineWorkflow({
    name: "patient",
    version: 1,
    input: z.object({ timeout: z.number().optional() }),
    async handler({ timeout }, ctx) {
      await ctx.waitForSignal("go", { timeout });
      return "went";
    },
  });
  const { db, admit } = await setup([wf]);
  const w = worker(db.sql, [wf], { suspendAfterMs: 5000 });
  try {
    await w.start();
    const suspended = await admit("patient", {});
    await waitFor("suspended", statusIs(db.sql, suspended, "waiting"), 10_000);
    assert.equal((await requestCancel(db.sql, TENANT, suspended))?.status, "cancelled");
    assert.equal((await run(db.sql, suspended)).status, "cancelled");
    const short = await admit("patient", { timeout: 4000 });
    await waitFor("running its short wait", statusIs(db.sql, short, "running"), 10_000);
    await requestCancel(db.sql, TENANT, short);
    await notifyCancel(db.sql, TENANT, short);
    await waitFor("cancelled", statusIs(db.sql, short, "cancelled"), 10_000);
  } finally {
    await stopAll(db, w);
  }
});
