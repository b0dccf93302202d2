/**
 * Child runs in the worker (`ctx.start`, issue 31), against a real
 * Postgres: a parent starts its children through the admission kernel with
 * derived dispatch keys, so an attempt that crashed after starting some of
 * them and is retried starts each once; the children carry the parent's
 * lineage and run; a child of a workflow no worker registered fails the
 * parent's call at once with the admission's error; `result()` and
 * `ctx.map` wait for children (across a retried parent, outputs in input
 * order, `failFast` cancelling the rest). Workers run in this process.
 */
import assert from "node:assert/strict";
import { z } from "zod";
import { Admission } from "../admission/admit.ts";
import { PoimenError } from "../core/errors.ts";
import { setTenantQuota } from "../db/tenant_quotas.ts";
import { cancelTree } from "../db/cascade.ts";
import { notifyCancels } from "../db/notify.ts";
import { childDispatchKey } from "../contracts/runs.ts";
import { silentLogger } from "../core/log.ts";
import { insertTenant } from "../db/auth.ts";
import { registerVersions } from "../db/catalog.ts";
import { createPool, type Sql } from "../db/pool.ts";
import { ChildRunFailed, defineWorkflow, type Workflow } from "../workflows/define.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { Worker } from "../worker/worker.ts";
import { ChildAdmission } from "../worker/child_runs.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase, waitFor } from "./support/db.ts";

const TENANT = "acme";
const N = 25;

// deno-lint-ignore no-explicit-any
type AnyWorkflow = Workflow<any>;

const square = defineWorkflow({
  name: "square",
  version: 1,
  input: z.object({ n: z.number() }),
  output: z.object({ sq: z.number() }),
  handler: ({ n }) => Promise.resolve({ sq: n * n }),
});

// Never registered by any worker: a child of it is refused by admission.
const ghost = defineWorkflow({ name: "ghost", version: 1, input: z.object({}) });

const fanOut = defineWorkflow({
  name: "fan.out",
  version: 1,
  input: z.object({ n: z.number() }),
  maxAttempts: 3,
  async handler({ n }, ctx) {
    const ids: string[] = [];
    for (let i = 0; i < n; i++) {
      const child = await ctx.start(`c${i}`, square, { n: i }, { priority: 2 });
      ids.push(child.runId);
      // The first attempt dies halfway through starting them.
      if (ctx.attempt === 1 && i === Math.floor(n / 2)) throw new Error("crash while starting");
    }
    return { ids };
  },
});

const startsGhost = defineWorkflow({
  name: "starts.ghost",
  version: 1,
  input: z.object({}),
  maxAttempts: 1,
  async handler(_input, ctx) {
    await ctx.start("g", ghost, {});
    return null;
  },
});

// Fails for `fail`; else naps long enough to be waiting (suspended) when a sibling fails.
const maybe = defineWorkflow({
  name: "maybe",
  version: 1,
  input: z.object({ i: z.number(), fail: z.boolean() }),
  output: z.object({ i: z.number() }),
  maxAttempts: 1,
  async handler({ i, fail }, ctx) {
    if (fail) throw new Error(`child ${i} fails`);
    await ctx.sleep("nap", 60_000);
    return { i };
  },
});

const gather = defineWorkflow({
  name: "gather",
  version: 1,
  input: z.object({ n: z.number() }),
  maxAttempts: 3,
  async handler({ n }, ctx) {
    const one = await ctx.start("one", square, { n: 7 });
    // The first attempt dies between starting the child and waiting for it.
    if (ctx.attempt === 1) throw new Error("crash before result()");
    const seven = await one.result();
    const all = await ctx.map("sq", square, Array.from({ length: n }, (_, i) => ({ n: i })));
    return { seven: seven.sq, all: all.map((r) => r.sq) };
  },
});

const failing = defineWorkflow({
  name: "failing",
  version: 1,
  input: z.object({ n: z.number(), bad: z.number() }),
  maxAttempts: 1,
  async handler({ n, bad }, ctx) {
    const inputs = Array.from({ length: n }, (_, i) => ({ i, fail: i === bad }));
    try {
      await ctx.map("m", maybe, inputs, { failFast: true });
      return { caught: null };
    } catch (err) {
      if (!(err instanceof ChildRunFailed)) throw err;
      return { caught: { index: err.index, status: err.status, message: err.message } };
    }
  },
});

const bounded = defineWorkflow({
  name: "bounded",
  version: 1,
  input: z.object({ n: z.number(), c: z.number() }),
  async handler({ n, c }, ctx) {
    const inputs = Array.from({ length: n }, (_, i) => ({ n: i }));
    const out = await ctx.map("b", square, inputs, { concurrency: c });
    return out.map((r) => r.sq);
  },
});

const wide = defineWorkflow({
  name: "wide",
  version: 1,
  input: z.object({ n: z.number() }),
  async handler({ n }, ctx) {
    const out = await ctx.map("w", square, Array.from({ length: n }, (_, i) => ({ n: i })));
    return { n: out.length, sum: out.reduce((s, r) => s + r.sq, 0) };
  },
});

const mapsGhost = defineWorkflow({
  name: "maps.ghost",
  version: 1,
  input: z.object({}),
  maxAttempts: 1,
  async handler(_input, ctx) {
    await ctx.map("g", ghost, [{}, {}]);
    return null;
  },
});

const WORKFLOWS: AnyWorkflow[] = [
  mapsGhost,
  square,
  fanOut,
  startsGhost,
  maybe,
  gather,
  failing,
  bounded,
  wide,
];

function worker(sql: Sql, extra: AnyWorkflow[] = []) {
  const { host, port, user, database } = sql.options;
  const url = `postgres://${user}@${host[0]}:${port[0]}/${database}`;
  return new Worker(sql, new WorkflowRegistry([...WORKFLOWS, ...extra]), {
    leaderSession: () => createPool({ url, max: 1, applicationName: "children-test-leader" }),
    id: `w-${crypto.randomUUID().slice(0, 8)}`,
    concurrency: 8,
    leaseMs: 30_000,
    pollMs: 100,
    retryBaseMs: 20,
    shutdownMs: 2_000,
    wakeMs: 100,
    log: silentLogger,
  });
}

interface Row {
  run_id: string;
  status: string;
  result: unknown;
  error: { code?: string; message: string } | null;
  dispatch_key: string | null;
  parent_run_id: string | null;
  root_run_id: string | null;
  priority: number;
  source: string;
}

async function runRow(sql: Sql, runId: string): Promise<Row | undefined> {
  const [row] = await sql<Row[]>`
    select run_id, status, result, error, dispatch_key, parent_run_id, root_run_id, priority,
           source
      from runs where tenant_id = ${TENANT} and run_id = ${runId}`;
  return row;
}

const final = (sql: Sql, runId: string) => async () => {
  const row = await runRow(sql, runId);
  return row && ["succeeded", "failed", "cancelled"].includes(row.status) ? row : undefined;
};

Deno.test("children: a parent retried after crashing while starting them starts each once, with its lineage", async () => {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  const admission = new Admission(db.sql, catalogOf(new WorkflowRegistry(WORKFLOWS)), {
    maxBatch: 16,
    maxConcurrent: 2,
  });
  const w = worker(db.sql);
  try {
    const parent = (await admission.admit({ workflow_ref: "fan.out", input: { n: N } }, {
      tenantId: TENANT,
      source: "test",
      entry: "http",
    })).run.run_id;
    // A start that died after its admission committed, before its step was
    // stored: the child c3 exists already, and the parent must find it.
    await registerVersions(db.sql, new WorkflowRegistry(WORKFLOWS).catalogVersions(), "tests");
    const early = await new ChildAdmission(db.sql, silentLogger, () => {}).start(
      { tenant_id: TENANT, run_id: parent },
      { name: "c3", workflowRef: "square@1", input: { n: 3 }, priority: 2 },
    );
    await w.start();
    const done = await waitFor("parent final", final(db.sql, parent), 30_000);
    assert.equal(done.status, "succeeded", JSON.stringify(done.error));
    const ids = (done.result as { ids: string[] }).ids;
    assert.equal(ids.length, N);

    const children = await db.sql<Row[]>`
      select run_id, status, result, error, dispatch_key, parent_run_id, root_run_id, priority,
             source
        from runs where tenant_id = ${TENANT} and parent_run_id = ${parent} order by dispatch_key`;
    assert.equal(children.length, N, "each child admitted once, the crash's included");
    assert.deepEqual(
      children.map((c) => c.dispatch_key).sort(),
      Array.from({ length: N }, (_, i) => `child:${parent}:c${i}`).sort(),
    );
    assert.deepEqual(new Set(children.map((c) => c.run_id)), new Set(ids));
    assert.equal(ids[3], early.run_id, "the child admitted before the crash, found again");
    for (const c of children) {
      assert.equal(c.root_run_id, parent);
      assert.equal(c.priority, 2);
      assert.equal(c.source, `run:${parent}`);
    }
    // The children run: each one's result is its input squared.
    for (const c of children) {
      const row = await waitFor(`child ${c.dispatch_key}`, final(db.sql, c.run_id), 20_000);
      const i = Number(c.dispatch_key!.split(":c").pop());
      assert.deepEqual(row.result, { sq: i * i });
    }
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("children: a child of a workflow no worker registered fails the parent's call at once, clearly", async (t) => {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  const admission = new Admission(db.sql, catalogOf(new WorkflowRegistry(WORKFLOWS)), {
    maxBatch: 16,
    maxConcurrent: 2,
  });
  const w = worker(db.sql);
  try {
    await w.start();
    const parent = (await admission.admit({ workflow_ref: "starts.ghost", input: {} }, {
      tenantId: TENANT,
      source: "test",
      entry: "http",
    })).run.run_id;
    const done = await waitFor("parent final", final(db.sql, parent), 20_000);
    assert.equal(done.status, "failed");
    assert.match(done.error!.message, /unknown workflow "ghost@1"/);
    const [step] = await db.sql<{ name: string; status: string; error: { message: string } }[]>`
      select name, status, error from run_steps where tenant_id = ${TENANT} and run_id = ${parent}`;
    assert.equal(step.name, "g");
    assert.equal(step.status, "failed");
    assert.match(step.error.message, /unknown workflow "ghost@1"/);
    const [{ n }] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from runs where tenant_id = ${TENANT} and parent_run_id = ${parent}`;
    assert.equal(n, 0);

    await t.step("a map of it fails its step the same way", async () => {
      const mapper = (await admission.admit({ workflow_ref: "maps.ghost", input: {} }, {
        tenantId: TENANT,
        source: "test",
        entry: "http",
      })).run.run_id;
      const ended = await waitFor("map parent final", final(db.sql, mapper), 20_000);
      assert.equal(ended.status, "failed");
      assert.match(ended.error!.message, /unknown workflow "ghost@1"/);
      const [mapStep] = await db.sql<{ name: string; status: string }[]>`
        select name, status from run_steps where tenant_id = ${TENANT} and run_id = ${mapper}`;
      assert.deepEqual(mapStep, { name: "g", status: "failed" });
    });
  } finally {
    await w.stop();
    await db.drop();
  }
});

async function admitRoot(sql: Sql, workflow: string, input: unknown): Promise<string> {
  const admission = new Admission(sql, catalogOf(new WorkflowRegistry(WORKFLOWS)), {
    maxBatch: 16,
    maxConcurrent: 2,
  });
  return (await admission.admit({ workflow_ref: workflow, input }, {
    tenantId: TENANT,
    source: "test",
    entry: "http",
  })).run.run_id;
}

async function eventsOf(sql: Sql, runId: string, type: string) {
  return await sql<{ payload: { reason?: string; by?: string; name?: string } }[]>`
    select payload from work_events where tenant_id = ${TENANT} and run_id = ${runId}
       and type = ${type} order by seq`;
}

Deno.test("children: result() across a retried parent, and ctx.map's outputs in input order", async () => {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  const w = worker(db.sql);
  try {
    await w.start();
    const parent = await admitRoot(db.sql, "gather", { n: N });
    const done = await waitFor("parent final", final(db.sql, parent), 30_000);
    assert.equal(done.status, "succeeded", JSON.stringify(done.error));
    assert.deepEqual(done.result, {
      seven: 49,
      all: Array.from({ length: N }, (_, i) => i * i),
    });
    const keys = (await db.sql<{ dispatch_key: string }[]>`
      select dispatch_key from runs where tenant_id = ${TENANT} and parent_run_id = ${parent}`)
      .map((r) => r.dispatch_key).sort();
    assert.deepEqual(
      keys,
      [`child:${parent}:one`, ...Array.from({ length: N }, (_, i) => `child:${parent}:sq#c${i}`)]
        .sort(),
      "one child, and one per input: none twice across the retry",
    );
    // Each wait for children woke the parent at most once: the map's once at most.
    const woken = await eventsOf(db.sql, parent, "run.woken");
    assert.ok(woken.every((e) => e.payload.by === "child"));
    assert.ok(woken.filter((e) => e.payload.name === "sq").length <= 1);
    const waits = await eventsOf(db.sql, parent, "run.waiting");
    assert.equal(waits.length, woken.length, "every suspend for children was woken once");
    // The map stored its group and count, not the outputs.
    const [step] = await db.sql<{ result: unknown }[]>`
      select result from run_steps where tenant_id = ${TENANT} and run_id = ${parent}
         and name = 'sq'`;
    assert.deepEqual(step.result, { group: "sq", count: N });
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("children: ctx.map with failFast throws the failed child's ChildRunFailed and cancels the rest", async () => {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  const w = worker(db.sql);
  try {
    await w.start();
    const parent = await admitRoot(db.sql, "failing", { n: 10, bad: 6 });
    const done = await waitFor("parent final", final(db.sql, parent), 30_000);
    assert.equal(done.status, "succeeded", JSON.stringify(done.error));
    const caught = (done.result as {
      caught: { index: number; status: string; message: string };
    }).caught;
    assert.equal(caught.index, 6);
    assert.equal(caught.status, "failed");
    assert.match(caught.message, /child m#c6 .* failed: child 6 fails/);
    // The others napped (waiting) and ended cancelled: none runs on.
    const kids = await waitFor("children final", async () => {
      const rows = await db.sql<{ dispatch_key: string; status: string }[]>`
        select dispatch_key, status from runs
         where tenant_id = ${TENANT} and parent_run_id = ${parent}`;
      return rows.every((r) => ["succeeded", "failed", "cancelled"].includes(r.status))
        ? rows
        : undefined;
    }, 20_000);
    assert.equal(kids.length, 10);
    for (const k of kids) {
      assert.equal(
        k.status,
        k.dispatch_key.endsWith("#c6") ? "failed" : "cancelled",
        k.dispatch_key,
      );
    }
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("children: ctx.map with concurrency keeps at most that many children unfinished, outputs in order", async () => {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  const w = worker(db.sql);
  try {
    await w.start();
    const parent = await admitRoot(db.sql, "bounded", { n: 12, c: 3 });
    const done = await waitFor("parent final", final(db.sql, parent), 30_000);
    assert.equal(done.status, "succeeded", JSON.stringify(done.error));
    assert.deepEqual(done.result, Array.from({ length: 12 }, (_, i) => i * i));
    // At each child's admission, the children admitted before it and not
    // yet final (by Postgres' clock) are within the bound.
    const [{ most, n }] = await db.sql<{ most: number; n: number }[]>`
      select max(o.open)::int as most, count(*)::int as n
        from runs c
       cross join lateral (
             select count(*) as open from runs d
              where d.tenant_id = ${TENANT} and d.parent_run_id = ${parent}
                and d.created_at <= c.created_at and d.finished_at > c.created_at) o
       where c.tenant_id = ${TENANT} and c.parent_run_id = ${parent}`;
    assert.equal(n, 12);
    assert.ok(most <= 3, `${most} children unfinished at once`);
    const waits = await eventsOf(db.sql, parent, "run.waiting");
    assert.ok(waits.length >= 1, "the parent waited for room at least once");
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("children: a map of 2,000 children is admitted in batches and wakes its parent once", async () => {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  const w = worker(db.sql);
  try {
    await w.start();
    const n = 2_000;
    const parent = await admitRoot(db.sql, "wide", { n });
    const done = await waitFor("parent final", final(db.sql, parent), 120_000);
    assert.equal(done.status, "succeeded", JSON.stringify(done.error));
    let sum = 0;
    for (let i = 0; i < n; i++) sum += i * i;
    assert.deepEqual(done.result, { n, sum });
    // Admitted together: far fewer admission transactions than children.
    const [{ kids, txs }] = await db.sql<{ kids: number; txs: number }[]>`
      select count(*)::int as kids, count(distinct created_at)::int as txs from runs
       where tenant_id = ${TENANT} and parent_run_id = ${parent}`;
    assert.equal(kids, n);
    assert.ok(txs <= n / 50, `${txs} admission transactions for ${n} children`);
    const woken = await eventsOf(db.sql, parent, "run.woken");
    assert.ok(woken.length <= 1, `${woken.length} wakes`);
    const waits = await eventsOf(db.sql, parent, "run.waiting");
    assert.equal(waits.length, woken.length);
  } finally {
    await w.stop();
    await db.drop();
  }
});

// Starts three children; over the tenant's quota, its step and attempt fail.
const startsThree = defineWorkflow({
  name: "starts.three",
  version: 1,
  input: z.object({}),
  maxAttempts: 1,
  async handler(_input, ctx) {
    for (let i = 0; i < 3; i++) await ctx.start(`q${i}`, square, { n: i });
    return null;
  },
});

Deno.test("children: over the tenant's quota, a start throws the API's retryable 429 error and the parent's step fails with it", async () => {
  const db = await freshDatabase();
  const tenant = "quota-kids";
  await setTenantQuota(db.sql, tenant, { max_queued: 2 });
  await registerVersions(db.sql, new WorkflowRegistry(WORKFLOWS).catalogVersions(), "tests");
  try {
    const children = new ChildAdmission(db.sql, silentLogger, () => {});
    const parent = { tenant_id: tenant, run_id: crypto.randomUUID() };
    const start = (name: string) =>
      children.start(parent, { name, workflowRef: "square@1", input: { n: 1 } });
    await start("a");
    await start("b");
    const refused = await start("c").then(() => undefined, (e: unknown) => e);
    assert.ok(refused instanceof PoimenError, String(refused));
    assert.equal(refused.code, "queue-full");
    assert.equal(refused.retryable, true);
    assert.match(refused.message, /max_queued/);
    // Under the quota again (a child claimed, its count read again), it starts.
    await setTenantQuota(db.sql, tenant, { max_queued: 3 });
    await waitFor("the quota read again", () => start("c").then(() => true, () => false), 10_000);

    // Through a worker: the parent's call fails clearly, its attempt with the code.
    const other = "quota-parent";
    // None at all: its first child is refused, whatever the worker claimed meanwhile.
    await setTenantQuota(db.sql, other, { max_queued: 0 });
    const registry = new WorkflowRegistry([...WORKFLOWS, startsThree]);
    const admission = new Admission(db.sql, catalogOf(registry), {
      maxBatch: 16,
      maxConcurrent: 2,
    });
    const top = (await admission.admit({ workflow_ref: "starts.three", input: {} }, {
      tenantId: other,
      source: "test",
      entry: "http",
    })).run.run_id;
    const w = worker(db.sql, [startsThree]);
    try {
      await w.start();
      const done = await waitFor("parent final", async () => {
        const [row] = await db.sql<{ status: string; error: { code?: string; message: string } }[]>`
          select status, error from runs where tenant_id = ${other} and run_id = ${top}
             and status in ('succeeded', 'failed', 'cancelled')`;
        return row;
      }, 20_000);
      assert.equal(done.status, "failed");
      assert.equal(done.error.code, "queue-full");
      const [step] = await db.sql<{ name: string; error: { message: string } }[]>`
        select name, error from run_steps
         where tenant_id = ${other} and run_id = ${top} and status = 'failed'`;
      assert.equal(step.name, "q0");
      assert.match(step.error.message, /max_queued/);
    } finally {
      await w.stop();
    }
  } finally {
    await db.drop();
  }
});

// Waits for its cancel (its handler's signal), then ends by throwing.
const hang = defineWorkflow({
  name: "hang",
  version: 1,
  input: z.object({}),
  async handler(_input, ctx) {
    await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
    throw new Error("aborted");
  },
});

// Starts a child that hangs and a detached one, then hangs itself.
const tree = defineWorkflow({
  name: "tree",
  version: 1,
  input: z.object({}),
  async handler(_input, ctx) {
    await ctx.start("hang", hang, {});
    await ctx.start("free", square, { n: 7 }, { detached: true });
    await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
    throw new Error("aborted");
  },
});

Deno.test("children: cancelling a running parent cancels its running child through its worker; a detached child runs to its end", async () => {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  const registry = new WorkflowRegistry([...WORKFLOWS, hang, tree]);
  const admission = new Admission(db.sql, catalogOf(registry), { maxBatch: 16, maxConcurrent: 2 });
  const w = worker(db.sql, [hang, tree]);
  try {
    await w.start();
    const top = (await admission.admit({ workflow_ref: "tree", input: {} }, {
      tenantId: TENANT,
      source: "test",
      entry: "http",
    })).run.run_id;
    const child = (name: string) => async () => {
      const [row] = await db.sql<{ run_id: string; status: string; result: unknown }[]>`
        select run_id, status, result from runs
         where tenant_id = ${TENANT} and dispatch_key = ${childDispatchKey(top, name)}`;
      return row;
    };
    const hung = await waitFor("the child running", async () => {
      const row = await child("hang")();
      return row?.status === "running" ? row : undefined;
    }, 20_000);
    await waitFor("the detached child started", child("free"), 20_000);
    await waitFor(
      "the parent running",
      async () => (await runRow(db.sql, top))?.status === "running",
      20_000,
    );

    const cancelled = await cancelTree(db.sql, TENANT, top);
    assert.equal(cancelled.run?.status, "running");
    assert.deepEqual(cancelled.running, [hung.run_id]);
    await notifyCancels(db.sql, TENANT, [top, ...cancelled.running]);

    assert.equal((await waitFor("parent final", final(db.sql, top), 20_000)).status, "cancelled");
    assert.equal(
      (await waitFor("child final", final(db.sql, hung.run_id), 20_000)).status,
      "cancelled",
    );
    const free = await child("free")();
    const freeDone = await waitFor("detached final", final(db.sql, free.run_id), 20_000);
    assert.equal(freeDone.status, "succeeded");
    assert.deepEqual(freeDone.result, { sq: 49 });
  } finally {
    await w.stop();
    await db.drop();
  }
});
