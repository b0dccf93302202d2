/**
 * The run queue and the worker, against a real Postgres (a database of this
 * file's own). Runs are created by the admission kernel, as in production.
 */
import assert from "node:assert/strict";
import { z } from "zod";
import postgres from "postgres";
import { Admission } from "../admission/admit.ts";
import { createLogger, silentLogger } from "../core/log.ts";
import { insertTenant } from "../db/auth.ts";
import { createPool, type Sql } from "../db/pool.ts";
import { claimRuns } from "../db/claims.ts";
import { type ReclaimedRun, reclaimExpired } from "../db/leases.ts";
import { queueStats } from "../db/queue_stats.ts";
import { BUILTIN_HOSTED, catalogOf } from "./support/catalog.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { defineWorkflow } from "../workflows/define.ts";
import { isHosted } from "../db/catalog.ts";
import { isRefusal, type PoimenError } from "../core/errors.ts";
import {
  type AttemptOutcome,
  type FencedStatement,
  Worker,
  type WorkerOptions,
} from "../worker/worker.ts";
import { Reclaimer } from "../worker/reclaimer.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";

const TENANT = "acme";
const log = createLogger("worker_test", "info");

interface Event {
  seq: number;
  type: string;
  payload: Record<string, unknown>;
  goal_id: string | null;
  dispatch_key: string | null;
}

async function setup(
  admissionRegistry: WorkflowRegistry = builtinRegistry(),
): Promise<{ db: TestDatabase; admit: (ref: string, input: unknown) => Promise<string> }> {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  const admission = new Admission(db.sql, catalogOf(admissionRegistry), {
    maxBatch: 64,
    maxConcurrent: 4,
  });
  const admit = async (workflow_ref: string, input: unknown) => {
    const { run } = await admission.admit({ workflow_ref, input }, {
      tenantId: TENANT,
      source: "test",
      entry: "http",
    });
    return run.run_id;
  };
  return { db, admit };
}

function worker(sql: Sql, opts: Partial<WorkerOptions> = {}, registry = builtinRegistry()) {
  // The leader's session: a one-connection pool of its own on the same database.
  const { host, port, user, database } = sql.options;
  const url = `postgres://${user}@${host[0]}:${port[0]}/${database}`;
  return new Worker(sql, registry, {
    leaderSession: () => createPool({ url, max: 1, applicationName: "worker-test-leader" }),
    id: `w-${crypto.randomUUID().slice(0, 8)}`,
    concurrency: 4,
    leaseMs: 30_000,
    pollMs: 200,
    retryBaseMs: 50,
    shutdownMs: 2_000,
    log: silentLogger,
    ...opts,
  });
}

async function runRow(sql: Sql, runId: string) {
  const [row] = await sql<
    {
      status: string;
      attempts: number;
      result: unknown;
      error: Record<string, unknown> | null;
      event_seq: number;
      lease_owner: string | null;
      lease_expires_at: Date | null;
    }[]
  >`select status, attempts, result, error, event_seq, lease_owner, lease_expires_at from runs
     where tenant_id = ${TENANT} and run_id = ${runId}`;
  return row;
}

async function events(sql: Sql, runId: string): Promise<Event[]> {
  return await sql<Event[]>`
    select seq, type, payload, goal_id, dispatch_key from work_events
     where tenant_id = ${TENANT} and run_id = ${runId} order by seq`;
}

/** First claim to last finish, as Postgres saw them: throughput without process start-up. */
async function executionSpan(sql: Sql) {
  const [{ n, span }] = await sql<{ n: number; span: number }[]>`
    select count(*)::int as n,
           extract(epoch from max(finished_at) - min(started_at))::float8 as span
      from runs where status = 'succeeded'`;
  return {
    execution_seconds: Number(span.toFixed(3)),
    execution_runs_per_second: Math.round(n / span),
  };
}

/** A TCP port nothing listens on right now. */
function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = l.addr as Deno.NetAddr;
  l.close();
  return port;
}

const statusIs = (sql: Sql, runId: string, status: string) => async () => {
  const row = await runRow(sql, runId);
  return row?.status === status ? row : undefined;
};

/** Spawns `deno task worker`'s exact command line against `url`. */
function spawnWorker(url: string, env: Record<string, string> = {}): Deno.ChildProcess {
  return new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-net", "--allow-env", "--allow-sys=hostname", "main.ts", "worker"],
    cwd: new URL("..", import.meta.url).pathname,
    // Port 0: several workers side by side, none on the default metrics port.
    env: {
      DATABASE_URL: url,
      LOG_LEVEL: "warn",
      WORKER_POLL_MS: "200",
      WORKER_METRICS_PORT: "0",
      ...env,
    },
    stdout: "null",
    stderr: "piped",
  }).spawn();
}

/** Waits for a spawned process to exit; returns its code and what it wrote on stderr. */
async function exited(p: Deno.ChildProcess): Promise<{ code: number; stderr: string }> {
  const [status, err] = await Promise.all([p.status, new Response(p.stderr).text()]);
  return { code: status.code, stderr: err };
}

Deno.test("worker: a claimed run ends succeeded with its result, after events admitted, started, succeeded", async () => {
  const { db, admit } = await setup();
  const w = worker(db.sql);
  try {
    await w.start();
    const runId = await admit("echo", { hello: "world" });
    const row = await waitFor("run succeeded", statusIs(db.sql, runId, "succeeded"), 10_000);
    assert.deepEqual(row.result, { hello: "world" });
    assert.equal(row.attempts, 1);
    assert.equal(row.lease_owner, null);
    assert.equal(row.event_seq, 3);
    const evs = await events(db.sql, runId);
    assert.deepEqual(evs.map((e) => [e.seq, e.type]), [
      [1, "run.admitted"],
      [2, "run.started"],
      [3, "run.succeeded"],
    ]);
    assert.deepEqual(evs[1].payload, { attempt: 1, worker: w.id });
    assert.deepEqual(evs[2].payload, { attempt: 1, result: { hello: "world" } });
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("worker: 200 runs shared by 3 workers each run exactly once", async () => {
  const { db, admit } = await setup();
  const workers = [0, 1, 2].map(() => worker(db.sql, { concurrency: 8 }));
  try {
    const ids = await Promise.all(Array.from({ length: 200 }, (_, i) => admit("echo", { i })));
    const started = performance.now();
    await Promise.all(workers.map((w) => w.start()));
    await waitFor(
      "all 200 succeeded",
      async () => {
        const [{ n }] = await db.sql<{ n: number }[]>`
        select count(*)::int as n from runs where status = 'succeeded'`;
        return n === 200;
      },
      60_000,
      20,
    );
    const seconds = (performance.now() - started) / 1000;
    log.info("queue throughput, 3 in-process workers", {
      runs: 200,
      seconds: Number(seconds.toFixed(3)),
      runs_per_second: Math.round(200 / seconds),
      ...await executionSpan(db.sql),
    });
    const starts = await db.sql<{ run_id: string; n: number }[]>`
      select run_id, count(*)::int as n from work_events
       where type = 'run.started' group by run_id`;
    assert.equal(starts.length, 200);
    assert.ok(starts.every((s) => s.n === 1), "a run was started twice");
    assert.deepEqual(new Set(starts.map((s) => s.run_id)), new Set(ids));
    const [{ multi }] = await db.sql<{ multi: number }[]>`
      select count(*)::int as multi from runs where attempts <> 1`;
    assert.equal(multi, 0);
    const owners = await db.sql<{ worker: string }[]>`
      select distinct payload->>'worker' as worker from work_events where type = 'run.started'`;
    assert.ok(owners.length >= 2, "the runs were not spread over the workers");
  } finally {
    await Promise.all(workers.map((w) => w.stop()));
    await db.drop();
  }
});

Deno.test("worker: 200 runs shared by 3 worker processes each run exactly once, and SIGTERM stops them cleanly", async () => {
  const { db, admit } = await setup();
  const procs: Deno.ChildProcess[] = [];
  try {
    await Promise.all(Array.from({ length: 200 }, (_, i) => admit("echo", { i })));
    const ports = [freePort(), freePort(), freePort()];
    const metricsPort = ports[0];
    for (let i = 0; i < 3; i++) {
      procs.push(spawnWorker(db.url, {
        WORKER_ID: `proc-${i}`,
        WORKER_CONCURRENCY: "8",
        WORKER_METRICS_PORT: String(ports[i]),
      }));
    }
    await waitFor(
      "all 200 succeeded",
      async () => {
        const [{ n }] = await db.sql<{ n: number }[]>`
        select count(*)::int as n from runs where status = 'succeeded'`;
        return n === 200;
      },
      60_000,
      50,
    );
    const [{ dup }] = await db.sql<{ dup: number }[]>`
      select count(*)::int as dup from (
        select run_id from work_events where type = 'run.started'
         group by run_id having count(*) <> 1) d`;
    assert.equal(dup, 0);
    log.info("queue throughput, 3 worker processes", { runs: 200, ...await executionSpan(db.sql) });
    // The queue-wide gauges come from the elected leader alone; every worker
    // says whether it is the leader.
    const leaderMetrics = await waitFor("the leader's metrics served", async () => {
      for (const port of ports) {
        const res = await fetch(`http://127.0.0.1:${port}/metrics`).catch(() => undefined);
        const text = res?.ok ? await res.text() : (await res?.body?.cancel(), undefined);
        if (text && /^poimen_worker_leader 1$/m.test(text)) return text;
      }
      return undefined;
    }, 10_000);
    assert.match(leaderMetrics, /^poimen_runs\{status="queued"\} 0$/m);
    assert.match(leaderMetrics, /^poimen_runs\{status="running"\} 0$/m);
    assert.match(leaderMetrics, /^poimen_queue_oldest_due_age_seconds 0$/m);
    const metrics = await waitFor("metrics served", async () => {
      const res = await fetch(`http://127.0.0.1:${metricsPort}/metrics`);
      return res.ok ? await res.text() : (await res.body?.cancel(), undefined);
    }, 10_000);
    assert.match(metrics, /^poimen_worker_claims_total \d+$/m);
    // Two fast workers can finish all 200 before the third is up: a SIGTERM
    // before a process handles it is not what this test is about.
    for (const port of ports) {
      await waitFor("worker ready", async () => {
        const res = await fetch(`http://127.0.0.1:${port}/readyz`).catch(() => undefined);
        await res?.body?.cancel();
        return res?.ok;
      }, 10_000);
    }
    for (const p of procs) p.kill("SIGTERM");
    const results = await Promise.all(procs.map(exited));
    for (const r of results) assert.equal(r.code, 0, r.stderr);
  } finally {
    for (const p of procs) {
      try {
        p.kill("SIGKILL");
      } catch { /* already exited */ }
    }
    await Promise.all(procs.map((p) => p.status));
    await db.drop();
  }
});

Deno.test("worker: a process killed with SIGKILL mid-run loses no run: another worker finishes it after the lease expires", async () => {
  const { db, admit } = await setup();
  const proc = spawnWorker(db.url, { WORKER_ID: "doomed", WORKER_LEASE_MS: "2000" });
  const rescuer = worker(db.sql, { leaseMs: 2_000, pollMs: 100 });
  try {
    const runId = await admit("sleep", { ms: 1_500 });
    await waitFor("the process claimed the run", async () => {
      const row = await runRow(db.sql, runId);
      return row.status === "running" && row.lease_owner === "doomed";
    }, 20_000);
    proc.kill("SIGKILL");
    await proc.status;
    await rescuer.start();
    const row = await waitFor("run succeeded", statusIs(db.sql, runId, "succeeded"), 20_000);
    assert.deepEqual(row.result, { slept_ms: 1_500 });
    assert.equal(row.attempts, 2);
    const evs = await events(db.sql, runId);
    assert.deepEqual(evs.map((e) => e.type), [
      "run.admitted",
      "run.started",
      "run.retrying",
      "run.started",
      "run.succeeded",
    ]);
    assert.deepEqual(evs.map((e) => e.seq), [1, 2, 3, 4, 5]);
    assert.equal(evs[1].payload.worker, "doomed");
    assert.equal(evs[2].payload.reason, "lease expired");
    assert.equal(evs[2].payload.worker, "doomed");
    assert.equal(evs[3].payload.worker, rescuer.id);
  } finally {
    try {
      proc.kill("SIGKILL");
    } catch { /* already dead */ }
    await proc.stderr.cancel();
    await rescuer.stop();
    await db.drop();
  }
});

Deno.test("worker: its reclaimer returns a run whose lease expired to the queue and reports it", async () => {
  const { db, admit } = await setup();
  const reported: ReclaimedRun[] = [];
  const reclaimer = new Reclaimer(db.sql, {
    intervalMs: 50,
    log: silentLogger,
    onReclaimed: (runs) => reported.push(...runs),
  });
  try {
    const runId = await admit("echo", 1);
    // Claimed by a worker that then vanished: its 1 ms lease runs out at once.
    const [claimed] = await claimRuns(db.sql, "vanished", 1, 1, BUILTIN_HOSTED);
    assert.equal(claimed.run_id, runId);
    await reclaimer.start();
    const row = await waitFor("run queued again", statusIs(db.sql, runId, "queued"), 10_000);
    assert.equal(row.lease_owner, null);
    await waitFor("the reclaim reported", () => reported.length > 0, 10_000);
    assert.deepEqual(reported.map((r) => [r.run_id, r.status, r.previous_owner]), [
      [runId, "queued", "vanished"],
    ]);
    const evs = await events(db.sql, runId);
    assert.deepEqual(evs.map((e) => e.type), ["run.admitted", "run.started", "run.retrying"]);
    assert.equal(evs[2].payload.reason, "lease expired");
  } finally {
    await Promise.all([reclaimer.stop(), reclaimer.stop()]);
    await db.drop();
  }
});

Deno.test("worker: of two workers one is the leader and reclaims; when it stops the other takes over and reclaims", async () => {
  const { db, admit } = await setup();
  const reclaimedBy: Record<string, string[]> = {};
  const make = (name: string) =>
    worker(db.sql, {
      id: name,
      leaseMs: 600,
      leaderRetryMs: 100,
      reclaimMs: 50,
      hooks: {
        onReclaimed: (runs) => (reclaimedBy[name] ??= []).push(...runs.map((r) => r.run_id)),
      },
    });
  const a = make("w-a"), b = make("w-b");
  try {
    await a.start();
    await b.start();
    await waitFor("a leader", () => a.isLeader || b.isLeader, 10_000);
    assert.equal(Number(a.isLeader) + Number(b.isLeader), 1);
    const [leader, other] = a.isLeader ? [a, b] : [b, a];
    // A run claimed by a worker that vanished: its lease ran out at once.
    const first = await admit("sleep", { ms: 600_000 });
    await waitFor("first running", statusIs(db.sql, first, "running"), 10_000);
    const runs = await db.sql`update runs set lease_owner = 'vanished', lease_expires_at = now()
                               where tenant_id = ${TENANT} and run_id = ${first} returning 1`;
    assert.equal(runs.length, 1);
    await waitFor("the leader reclaimed it", () => reclaimedBy[leader.id]?.includes(first), 10_000);
    assert.equal(reclaimedBy[other.id], undefined, "only the leader reclaims");

    await leader.stop();
    await waitFor("the other leads", () => other.isLeader, 10_000);
    const second = await admit("sleep", { ms: 600_000 });
    await waitFor("second running", async () => {
      const row = await runRow(db.sql, second);
      return row.status === "running" && row.attempts >= 1;
    }, 10_000);
    await db.sql`update runs set lease_owner = 'vanished', lease_expires_at = now()
                  where tenant_id = ${TENANT} and run_id = ${second}`;
    await waitFor("the new leader reclaimed it", () => reclaimedBy[other.id]?.includes(second));
  } finally {
    await a.stop();
    await b.stop();
    await db.drop();
  }
});

Deno.test("worker: a failing run is retried with backoff, then failed after max_attempts, with an event per step", async () => {
  const { db, admit } = await setup();
  const outcomes: AttemptOutcome[] = [];
  const w = worker(db.sql, { hooks: { onFinished: (o) => outcomes.push(o) } });
  try {
    await w.start();
    const runId = await admit("fail", { times: 5, message: "boom" });
    const row = await waitFor("run failed", statusIs(db.sql, runId, "failed"), 20_000);
    assert.equal(row.attempts, 3);
    assert.equal(row.error?.message, "boom");
    const evs = await events(db.sql, runId);
    assert.deepEqual(evs.map((e) => e.type), [
      "run.admitted",
      "run.started",
      "run.retrying",
      "run.started",
      "run.retrying",
      "run.started",
      "run.failed",
    ]);
    assert.deepEqual(evs.map((e) => e.seq), [1, 2, 3, 4, 5, 6, 7]);
    assert.deepEqual(evs.filter((e) => e.type === "run.started").map((e) => e.payload.attempt), [
      1,
      2,
      3,
    ]);
    for (const e of evs.filter((e) => e.type === "run.retrying")) {
      assert.equal((e.payload.error as { message: string }).message, "boom");
      assert.ok(typeof e.payload.retry_at === "string");
    }
    assert.equal(evs[6].payload.attempt, 3);
    assert.deepEqual(outcomes, ["retrying", "retrying", "failed"]);
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("worker: a run that fails fewer times than max_attempts succeeds on a retry", async () => {
  const { db, admit } = await setup();
  const w = worker(db.sql);
  try {
    await w.start();
    const runId = await admit("fail", { times: 1 });
    const row = await waitFor("run succeeded", statusIs(db.sql, runId, "succeeded"), 20_000);
    assert.equal(row.attempts, 2);
    assert.equal(row.error, null);
    assert.deepEqual(row.result, { failed_attempts: 1 });
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("worker: a run pinned to a version no running worker hosts stays queued with no attempt while other runs are executed, and starts once a worker hosting it comes up", async () => {
  const v2 = defineWorkflow({
    name: "echo",
    version: 2,
    input: z.object({ x: z.number() }),
    handler: (input) => Promise.resolve({ v2: input }),
  });
  const { db, admit } = await setup(builtinRegistry().register(v2));
  const v1Worker = worker(db.sql);
  let v2Worker: Worker | undefined;
  try {
    await v1Worker.start();
    const waiting = await admit("echo@2", { x: 1 });
    const other = await admit("echo@1", { y: 2 });
    await waitFor("the v1 run", statusIs(db.sql, other, "succeeded"), 10_000);
    // Later runs of v1 pass it by; it is never claimed.
    for (let i = 0; i < 5; i++) {
      const r = await admit("echo@1", { i });
      await waitFor(`v1 run ${i}`, statusIs(db.sql, r, "succeeded"), 10_000);
    }
    const [queued] = await db.sql<{ status: string; attempts: number }[]>`
      select status, attempts from runs where run_id = ${waiting}`;
    assert.deepEqual({ ...queued }, { status: "queued", attempts: 0 });
    assert.deepEqual(await isHosted(db.sql, "echo", 2), false);
    assert.deepEqual(await isHosted(db.sql, "echo", 1), true);

    v2Worker = worker(db.sql, {}, new WorkflowRegistry([v2]));
    await v2Worker.start();
    const row = await waitFor("the v2 run", statusIs(db.sql, waiting, "succeeded"), 10_000);
    assert.deepEqual(row.result, { v2: { x: 1 } });
    assert.equal(row.attempts, 1);
  } finally {
    await v1Worker.stop();
    await v2Worker?.stop();
    await db.drop();
  }
});

Deno.test("worker: in a rolling deploy a v1 worker and a v2 worker side by side each run the runs pinned to their version", async () => {
  const step = (version: number) =>
    defineWorkflow({
      name: "deploy.step",
      version,
      input: z.object({ i: z.number() }),
      handler: ({ i }) => Promise.resolve({ version, i }),
    });
  const [v1, v2] = [step(1), step(2)];
  const { db, admit } = await setup(new WorkflowRegistry([v1, v2]));
  const old = worker(db.sql, {}, new WorkflowRegistry([v1]));
  const next = worker(db.sql, {}, new WorkflowRegistry([v2]));
  try {
    await old.start();
    await next.start();
    const pinned = new Map<string, number>();
    for (let i = 0; i < 20; i++) {
      const version = i % 2 === 0 ? 1 : 2;
      pinned.set(await admit(`deploy.step@${version}`, { i }), version);
    }
    for (const [runId, version] of pinned) {
      const row = await waitFor(`run ${runId}`, statusIs(db.sql, runId, "succeeded"), 10_000);
      assert.deepEqual((row.result as { version: number }).version, version);
      assert.equal(row.attempts, 1, "no attempt burnt on the worker without the version");
      const [started] = await db.sql<{ worker: string }[]>`
        select payload->>'worker' as worker from work_events
         where run_id = ${runId} and type = 'run.started'`;
      assert.equal(started.worker, version === 1 ? old.id : next.id);
    }
  } finally {
    await old.stop();
    await next.stop();
    await db.drop();
  }
});

Deno.test("worker: a second worker with another definition of a registered name@version refuses to start with a workflow-conflict error naming it", async () => {
  const { db } = await setup();
  const first = worker(db.sql);
  const changed = new WorkflowRegistry([
    defineWorkflow({
      name: "sleep",
      version: 1,
      input: z.object({ ms: z.number(), extra: z.string() }),
      handler: () => Promise.resolve(null),
    }),
  ]);
  const second = worker(db.sql, {}, changed);
  try {
    await first.start();
    await assert.rejects(second.start(), (err: unknown) => {
      assert.ok(isRefusal(err));
      assert.equal((err as PoimenError).code, "workflow-conflict");
      assert.match((err as Error).message, /workflow sleep@1 is already registered/);
      return true;
    });
    const hosts = await db.sql<{ worker_id: string }[]>`select worker_id from workflow_workers`;
    assert.deepEqual(hosts.map((h) => h.worker_id), [first.id]);
  } finally {
    await second.stop();
    await first.stop();
    await db.drop();
  }
});

Deno.test("worker: the same definition registered again (another worker, a restart) is accepted, and a stopped worker no longer counts as hosting", async () => {
  const { db } = await setup();
  const a = worker(db.sql);
  const b = worker(db.sql);
  try {
    await a.start();
    await b.start();
    const [{ n }] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from workflow_versions where name = 'echo'`;
    assert.equal(n, 1);
    await a.stop();
    await b.stop();
    assert.equal(await isHosted(db.sql, "echo", 1), false);
  } finally {
    await a.stop();
    await b.stop();
    await db.drop();
  }
});

Deno.test("worker: input the catalog's JSON Schema admits but the full zod schema refuses ends the run failed with invalid-input, on its first attempt", async () => {
  const even = defineWorkflow({
    name: "even",
    version: 1,
    maxAttempts: 5,
    input: z.object({ n: z.number().refine((n) => n % 2 === 0, "must be even") }),
    handler: (input) => Promise.resolve(input),
  });
  const registry = builtinRegistry().register(even);
  const { db, admit } = await setup(registry);
  const w = worker(db.sql, {}, registry);
  try {
    await w.start();
    const runId = await admit("even@1", { n: 3 });
    const row = await waitFor("run failed", statusIs(db.sql, runId, "failed"), 10_000);
    assert.equal(row.attempts, 1);
    assert.equal(row.error?.code, "invalid-input");
    assert.match(JSON.stringify(row.error), /must be even/);
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("worker: a result its output schema refuses ends the run failed with invalid-output on its first attempt, naming the field; one it takes is stored as parsed", async () => {
  const priced = defineWorkflow({
    name: "priced",
    version: 1,
    maxAttempts: 5,
    input: z.object({ bad: z.boolean() }),
    output: z.object({ total: z.number() }),
    // The wrong shape for `bad`, as a handler with a bug would return it.
    handler: ({ bad }) => (bad ? { total: "12" } : { total: 12, extra: "dropped" }) as never,
  });
  const registry = builtinRegistry().register(priced);
  const { db, admit } = await setup(registry);
  const w = worker(db.sql, {}, registry);
  try {
    await w.start();
    const [stored] = await db.sql<{ output_schema: unknown }[]>`
      select output_schema from workflow_versions where name = 'priced' and version = 1`;
    assert.deepEqual(stored.output_schema, priced.outputSchema, "registered as JSON Schema");
    const badRun = await admit("priced@1", { bad: true });
    const goodRun = await admit("priced@1", { bad: false });
    const bad = await waitFor("run failed", statusIs(db.sql, badRun, "failed"), 10_000);
    assert.equal(bad.attempts, 1, "final: not retried");
    assert.equal(bad.error?.code, "invalid-output");
    assert.match(
      String(bad.error?.message),
      /result of priced@1 does not match its output schema: total:/,
    );
    assert.deepEqual((bad.error?.issues as { path: string }[]).map((i) => i.path), ["total"]);
    assert.equal(bad.result, null);
    const good = await waitFor("run succeeded", statusIs(db.sql, goodRun, "succeeded"), 10_000);
    assert.deepEqual(good.result, { total: 12 }, "the parsed value: unknown keys dropped");
    const evs = await events(db.sql, goodRun);
    assert.deepEqual(evs.at(-1)?.payload.result, { total: 12 });
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("worker: a version registered again with another output schema, or none, is a workflow-conflict", async () => {
  const { db } = await setup();
  const base = {
    name: "shaped",
    version: 1,
    input: z.unknown(),
    // Never called: only registration is tested.
    handler: () => Promise.resolve(null as never),
  };
  const first = worker(
    db.sql,
    {},
    new WorkflowRegistry([
      defineWorkflow({ ...base, output: z.object({ n: z.number() }) }),
    ]),
  );
  const others = [
    defineWorkflow({ ...base, output: z.object({ n: z.string() }) }),
    defineWorkflow(base),
  ].map((wf) => worker(db.sql, {}, new WorkflowRegistry([wf])));
  try {
    await first.start();
    for (const other of others) {
      await assert.rejects(other.start(), (err: unknown) => {
        assert.equal((err as PoimenError).code, "workflow-conflict");
        assert.match((err as Error).message, /shaped@1 is already registered/);
        return true;
      });
    }
  } finally {
    for (const other of others) await other.stop();
    await first.stop();
    await db.drop();
  }
});

/** Queries sent by `application` since `since` (the latest query of each of its connections). */
// `since` as Postgres' text: a JS Date keeps milliseconds only, and a query
// that ended just before it, in the same millisecond, would seem to follow it.
async function queriesSince(sql: Sql, application: string, since: string): Promise<string[]> {
  const rows = await sql<{ query: string }[]>`
    select query from pg_stat_activity
     where application_name = ${application} and query_start > ${since}::timestamptz`;
  // The last statements of stop() itself — the listen session's `unlisten`
  // and the delete of the worker's liveness row, both awaited by stop() —
  // have been seen with a query_start stamped after stop() returned (under
  // load: the unlisten 2 of ~10 full runs, the delete once), so they are
  // left out: neither is a stopped worker polling, which is what this looks
  // for.
  return rows.map((r) => r.query).filter((q) =>
    !/^\s*unlisten\b/i.test(q) && !/^\s*delete from workflow_workers\b/i.test(q)
  );
}

Deno.test("worker: stop twice is safe, and once stopped it sends no query and claims nothing", async () => {
  const { db, admit } = await setup();
  // The worker gets a pool of its own, named, so Postgres can tell its queries from the test's.
  const application = `poimen-test-stopped-${crypto.randomUUID().slice(0, 8)}`;
  const pool = createPool({ url: db.url, max: 4, applicationName: application });
  const pollMs = 50;
  const w = worker(pool, { pollMs });
  try {
    await w.start();
    const first = await admit("echo", 1);
    await waitFor("first run succeeded", statusIs(db.sql, first, "succeeded"), 10_000);
    await Promise.all([w.stop(), w.stop()]);
    await w.stop();
    const [{ stopped }] = await db.sql<{ stopped: string }[]>`
      select clock_timestamp()::text as stopped`;

    // A run due now, and a NOTIFY for it (admission pokes the workers).
    const later = await admit("echo", 2);
    // Twenty poll intervals: a worker still polling would have claimed it
    // many times over. Any sign of life ends the wait at once.
    const watch = Date.now();
    const seen = await waitFor("twenty poll intervals of a stopped worker", async () => {
      const status = (await runRow(db.sql, later)).status;
      const queries = await queriesSince(db.sql, application, stopped);
      const quiet = status === "queued" && queries.length === 0;
      return !quiet || Date.now() - watch > 20 * pollMs ? { status, queries } : undefined;
    }, 10_000);
    assert.deepEqual(seen, { status: "queued", queries: [] }, "the stopped worker stayed silent");
    await assert.rejects(() => w.start());

    // The run was there for the taking: a live worker takes it.
    const other = worker(db.sql);
    await other.start();
    await waitFor("later run succeeded", statusIs(db.sql, later, "succeeded"), 10_000);
    await other.stop();
    assert.equal((await events(db.sql, later))[1].payload.worker, other.id);
  } finally {
    await w.stop();
    await pool.end();
    await db.drop();
  }
});

Deno.test("worker: graceful stop releases a run still running after the shutdown wait, and another worker finishes it", async () => {
  const { db, admit } = await setup();
  const outcomes: AttemptOutcome[] = [];
  const w = worker(db.sql, { shutdownMs: 200, hooks: { onFinished: (o) => outcomes.push(o) } });
  const other = worker(db.sql);
  try {
    await w.start();
    const runId = await admit("sleep", { ms: 1_500 });
    await waitFor("run running", statusIs(db.sql, runId, "running"), 10_000);
    await w.stop();
    assert.deepEqual(outcomes, ["released"]);
    const row = await runRow(db.sql, runId);
    assert.equal(row.status, "queued");
    assert.equal(row.attempts, 0, "a released attempt is given back");
    const evs = await events(db.sql, runId);
    assert.deepEqual(evs.map((e) => e.type), ["run.admitted", "run.started", "run.released"]);
    assert.deepEqual(evs[2].payload, { attempt: 1, worker: w.id, reason: "worker shutdown" });
    await other.start();
    const done = await waitFor("run succeeded", statusIs(db.sql, runId, "succeeded"), 10_000);
    assert.equal(done.attempts, 1);
    assert.deepEqual((await events(db.sql, runId)).map((e) => e.type).slice(3), [
      "run.started",
      "run.succeeded",
    ]);
  } finally {
    await w.stop();
    await other.stop();
    await db.drop();
  }
});

Deno.test("worker: losing its lease aborts the handler and writes nothing", async () => {
  const { db, admit } = await setup();
  const outcomes: AttemptOutcome[] = [];
  const w = worker(db.sql, { leaseMs: 600, hooks: { onFinished: (o) => outcomes.push(o) } });
  try {
    await w.start();
    const runId = await admit("sleep", { ms: 60_000 });
    await waitFor("run running", statusIs(db.sql, runId, "running"), 10_000);
    // Another worker took it over (as after a reclaim and a new claim).
    await db
      .sql`update runs set lease_owner = 'someone-else', lease_expires_at = now() + interval '1 hour'
                  where tenant_id = ${TENANT} and run_id = ${runId}`;
    await waitFor("the handler gave up", () => outcomes.includes("lost"), 10_000);
    const row = await runRow(db.sql, runId);
    assert.equal(row.status, "running");
    assert.equal(row.lease_owner, "someone-else");
    assert.equal(row.event_seq, 2);
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("worker: queueStats counts the queued and the running runs and ages the oldest due one", async () => {
  const { db, admit } = await setup();
  try {
    const empty = await queueStats(db.sql);
    assert.equal(empty.byStatus.queued, 0);
    assert.equal(empty.oldestQueuedAgeSeconds, 0);
    const a = await admit("echo", 1);
    await admit("echo", 2);
    await db.sql`update runs set run_after = now() - interval '30 seconds'
                  where tenant_id = ${TENANT} and run_id = ${a}`;
    const s = await queueStats(db.sql);
    assert.equal(s.byStatus.queued, 2);
    assert.equal(s.byStatus.running, 0);
    assert.ok(s.oldestQueuedAgeSeconds >= 30 && s.oldestQueuedAgeSeconds < 60);
  } finally {
    await db.drop();
  }
});

const jsonBytes = (v: unknown) => new TextEncoder().encode(JSON.stringify(v)).length;

Deno.test("worker: an echo run whose result would be ~4 MB as JSON fails with result-too-large, and no event carries it", async () => {
  const { db, admit } = await setup();
  const outcomes: AttemptOutcome[] = [];
  const w = worker(db.sql, { hooks: { onFinished: (o) => outcomes.push(o) } });
  try {
    // ~900 KB as the caller writes it ("1e20,"), ~4 MB as JSON once parsed.
    const input = Array.from({ length: 180_000 }, () => 1e20);
    assert.ok(jsonBytes(input) > 3_500_000);
    await w.start();
    const runId = await admit("echo", input);
    const row = await waitFor("run failed", statusIs(db.sql, runId, "failed"), 30_000);
    assert.equal(row.error?.code, "result-too-large");
    assert.equal(row.error?.limit, 256 * 1024);
    assert.ok((row.error?.bytes as number) > 3_500_000);
    assert.equal(row.result, null);
    // Final: the same input would give the same result, so no retry.
    assert.equal(row.attempts, 1);
    assert.deepEqual(outcomes, ["failed"]);
    const evs = await events(db.sql, runId);
    assert.deepEqual(evs.map((e) => e.type), ["run.admitted", "run.started", "run.failed"]);
    for (const e of evs) assert.ok(jsonBytes(e.payload) < 256 * 1024, `${e.type} is small`);
    assert.equal((evs[2].payload.error as Record<string, unknown>).code, "result-too-large");
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("worker: a result JSON has no text for (a function) or jsonb cannot store (a NUL) fails its run with bad-result at once; look-alike text is stored as it is", async () => {
  const lookalike = { s: "\\u0000 \\ud800 \\\\u0000 😀 \u0001", n: [1, null, { "é": true }] };
  const registry = builtinRegistry().register({
    name: "odd",
    version: 1,
    maxAttempts: 3,
    input: z.enum(["function", "nul", "lookalike"]),
    handler: (kind) =>
      Promise.resolve(
        kind === "function" ? () => 1 : kind === "nul" ? { a: ["ok", "x\0"] } : lookalike,
      ),
  });
  const { db, admit } = await setup(registry);
  const outcomes: AttemptOutcome[] = [];
  const w = worker(db.sql, { hooks: { onFinished: (o) => outcomes.push(o) } }, registry);
  try {
    await w.start();
    const fn = await admit("odd", "function");
    const nul = await admit("odd", "nul");
    const ok = await admit("odd", "lookalike");
    for (const runId of [fn, nul]) {
      const row = await waitFor("run failed", statusIs(db.sql, runId, "failed"), 10_000);
      assert.equal(row.error?.code, "bad-result");
      assert.equal(row.attempts, 1, "final: the same input gives the same result");
      assert.equal(row.result, null);
    }
    assert.match((await runRow(db.sql, nul)).error?.message as string, /\$\.a\[1\]/);
    const row = await waitFor("run succeeded", statusIs(db.sql, ok, "succeeded"), 10_000);
    assert.deepEqual(row.result, lookalike);
    const evs = await events(db.sql, ok);
    assert.deepEqual(evs[2].payload, { attempt: 1, result: lookalike });
    assert.deepEqual(outcomes.sort(), ["failed", "failed", "succeeded"]);
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("worker: a handler error too large or holding a NUL is stored storable and cut to RUN_RESULT_MAX_BYTES", async () => {
  const registry = builtinRegistry().register({
    name: "loud",
    version: 1,
    maxAttempts: 2,
    input: z.unknown(),
    handler: () => Promise.reject(new Error("\0" + "é".repeat(1_000_000))),
  });
  const { db, admit } = await setup(registry);
  const limit = 64 * 1024;
  const w = worker(db.sql, { resultMaxBytes: limit }, registry);
  try {
    await w.start();
    const runId = await admit("loud", null);
    const row = await waitFor("run failed", statusIs(db.sql, runId, "failed"), 30_000);
    assert.equal(row.attempts, 2);
    assert.ok(jsonBytes(row.error) <= limit);
    assert.equal(row.error?.truncated, true);
    assert.equal(row.error?.name, "Error");
    assert.ok((row.error?.message as string).startsWith("\uFFFDéé"));
    const evs = await events(db.sql, runId);
    assert.deepEqual(evs.map((e) => e.type), [
      "run.admitted",
      "run.started",
      "run.retrying",
      "run.started",
      "run.failed",
    ]);
    for (const e of evs) assert.ok(jsonBytes(e.payload) < limit + 1024, `${e.type} is small`);
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("worker: its completion for an attempt that is over is fenced, even under its own id, and counted", async () => {
  const { db, admit } = await setup();
  const outcomes: AttemptOutcome[] = [];
  const fenced: FencedStatement[] = [];
  const w = worker(db.sql, {
    hooks: { onFinished: (o) => outcomes.push(o), onFenced: (s) => fenced.push(s) },
  });
  try {
    await w.start();
    const runId = await admit("sleep", { ms: 1_500 });
    await waitFor("run running", statusIs(db.sql, runId, "running"), 10_000);
    // As if the lease had expired and this same worker id had claimed attempt 2.
    await db.sql`update runs set attempts = attempts + 1
                  where tenant_id = ${TENANT} and run_id = ${runId}`;
    await waitFor("the completion was refused", () => outcomes.includes("lost"), 10_000);
    assert.deepEqual(fenced, ["complete"]);
    const row = await runRow(db.sql, runId);
    assert.equal(row.status, "running");
    assert.equal(row.attempts, 2);
    assert.equal(row.lease_owner, w.id);
    assert.equal(row.result, null);
    assert.equal(row.event_seq, 2);
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("worker: a lease renewal stuck on a lock times out, and the handler is aborted when the lease runs out", async () => {
  const { db, admit } = await setup();
  const outcomes: AttemptOutcome[] = [];
  let timeouts = 0;
  const w = worker(db.sql, {
    leaseMs: 900,
    hooks: { onFinished: (o) => outcomes.push(o), onHeartbeatTimeout: () => timeouts++ },
  });
  let unlock = () => {};
  const unlocked = new Promise<void>((r) => unlock = r);
  let holder: Promise<unknown> = Promise.resolve();
  try {
    await w.start();
    const runId = await admit("sleep", { ms: 60_000 });
    await waitFor("run running", statusIs(db.sql, runId, "running"), 10_000);
    // Holds the table against writers: every renewal waits for it (a row
    // lock alone is skipped; see the next test).
    let locked = false;
    holder = db.sql.begin(async (tx) => {
      await tx`lock table runs in exclusive mode`;
      locked = true;
      await unlocked;
    });
    await waitFor("table locked", () => locked, 10_000);
    await waitFor("the handler was aborted", () => outcomes.includes("lost"), 10_000);
    assert.ok(timeouts > 0);
    unlock();
    await holder;
    // The cancelled renewals wrote nothing for the lost attempt.
    const evs = await events(db.sql, runId);
    assert.ok(!evs.some((e) => e.type === "run.succeeded" || e.type === "run.failed"));
  } finally {
    unlock();
    await holder;
    await w.stop();
    await db.drop();
  }
});

Deno.test("worker: a run whose row another statement holds is left unrenewed and aborted when its lease runs out, while its other runs' leases are renewed", async () => {
  const { db, admit } = await setup();
  const outcomes: AttemptOutcome[] = [];
  const w = worker(db.sql, { leaseMs: 900, hooks: { onFinished: (o) => outcomes.push(o) } });
  let unlock = () => {};
  const unlocked = new Promise<void>((r) => unlock = r);
  let holder: Promise<unknown> = Promise.resolve();
  try {
    await w.start();
    const stuck = await admit("sleep", { ms: 60_000 });
    const free = await admit("sleep", { ms: 60_000 });
    for (const id of [stuck, free]) {
      await waitFor("run running", statusIs(db.sql, id, "running"), 10_000);
    }
    let locked = false;
    holder = db.sql.begin(async (tx) => {
      await tx`select 1 from runs where tenant_id = ${TENANT} and run_id = ${stuck} for update`;
      locked = true;
      await unlocked;
    });
    await waitFor("row locked", () => locked, 10_000);
    const before = (await runRow(db.sql, free)).lease_expires_at;
    await waitFor("the stuck run's handler was aborted", () => outcomes.includes("lost"), 10_000);
    assert.deepEqual(outcomes, ["lost"]);
    await waitFor("the free run's lease renewed", async () => {
      const row = await runRow(db.sql, free);
      return row.status === "running" && row.lease_expires_at! > before!;
    }, 10_000);
  } finally {
    unlock();
    await holder;
    await w.stop();
    await db.drop();
  }
});

Deno.test("worker: one statement per interval renews the leases of all its 20 running runs", async () => {
  const { db, admit } = await setup();
  // The worker's own pool, whose statements the test sees as sent.
  const renewals: number[] = [];
  const pool = postgres(db.url, {
    max: 10,
    onnotice: () => {},
    debug: (_conn, text, parameters) => {
      if (!text.includes("with ordinality as l(tenant_id, run_id, attempt, i)")) return;
      // The run ids, as the driver serialized the uuid[] parameter.
      const ids = String((parameters as unknown[])[1]).replace(/^\{|\}$/g, "").split(",");
      renewals.push(ids.length);
    },
  });
  const w = worker(pool as unknown as Sql, { concurrency: 20, leaseMs: 900 });
  try {
    await w.start();
    const ids = [];
    for (let i = 0; i < 20; i++) ids.push(await admit("sleep", { ms: 600_000 }));
    await waitFor("20 runs running", () => w.inFlight === 20 ? true : undefined, 20_000);
    const [{ running }] = await db.sql<{ running: number }[]>`
      select count(*)::int as running from runs where status = 'running'`;
    assert.equal(running, 20);
    const from = renewals.length;
    await waitFor("three renewals", () => renewals.length >= from + 3, 20_000);
    // Every renewal since all 20 ran carried all 20: one statement, not one per run.
    assert.deepEqual(renewals.slice(from, from + 3), [20, 20, 20]);
  } finally {
    await w.stop();
    await pool.end();
    await db.drop();
  }
});

Deno.test("worker: a run reclaimed and claimed by another worker is reported lost to the renewal, its handler aborted, and only it", async () => {
  const { db, admit } = await setup();
  const outcomes: AttemptOutcome[] = [];
  const fenced: FencedStatement[] = [];
  const w = worker(db.sql, {
    leaseMs: 900,
    hooks: { onFinished: (o) => outcomes.push(o), onFenced: (s) => fenced.push(s) },
  });
  try {
    await w.start();
    const ids = [];
    for (let i = 0; i < 3; i++) ids.push(await admit("sleep", { ms: 600_000 }));
    for (const id of ids) await waitFor("run running", statusIs(db.sql, id, "running"), 10_000);
    const [taken, ...kept] = ids;
    // Its lease expires, the reclaimer takes it back and another worker
    // claims it, in one transaction: this worker cannot renew or re-claim
    // it in between.
    await db.sql.begin(async (tx) => {
      await tx`update runs set lease_expires_at = now() - interval '1 second'
                where tenant_id = ${TENANT} and run_id = ${taken}`;
      const reclaimed = await reclaimExpired(tx as unknown as Sql, 10);
      assert.deepEqual(reclaimed.map((r) => r.run_id), [taken]);
      const claimed = await claimRuns(tx as unknown as Sql, "w-other", 1, 600_000, BUILTIN_HOSTED);
      assert.deepEqual(claimed.map((r) => r.run_id), [taken]);
    });
    await waitFor("the taken run's handler gave up", () => outcomes.includes("lost"), 10_000);
    assert.deepEqual(outcomes, ["lost"]);
    assert.deepEqual(fenced, ["heartbeat"]);
    const row = await runRow(db.sql, taken);
    assert.equal(row.lease_owner, "w-other");
    assert.equal(row.attempts, 2);
    for (const id of kept) {
      const before = (await runRow(db.sql, id)).lease_expires_at;
      await waitFor("a kept run's lease renewed", async () => {
        const r = await runRow(db.sql, id);
        return r.lease_owner === w.id && r.lease_expires_at! > before!;
      }, 10_000);
    }
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("worker: a cancel it was not notified of reaches the handler through its heartbeat", async () => {
  const { db, admit } = await setup();
  const outcomes: AttemptOutcome[] = [];
  // Beats every second. The request below is written without a NOTIFY, so
  // only a heartbeat can carry it.
  const w = worker(db.sql, { leaseMs: 3_000, hooks: { onFinished: (o) => outcomes.push(o) } });
  try {
    await w.start();
    const runId = await admit("sleep", { ms: 600_000 });
    await waitFor("run running", statusIs(db.sql, runId, "running"), 10_000);
    await db.sql`update runs set cancel_requested_at = now()
                  where tenant_id = ${TENANT} and run_id = ${runId}`;
    const row = await waitFor("run cancelled", statusIs(db.sql, runId, "cancelled"), 20_000);
    assert.equal(row.attempts, 1);
    assert.equal(row.error?.message, "sleep interrupted");
    assert.deepEqual(outcomes, ["cancelled"]);
    assert.deepEqual((await events(db.sql, runId)).map((e) => e.type), [
      "run.admitted",
      "run.started",
      "run.cancelled",
    ]);
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("worker: after a cancel, a handler that ignores its aborted signal and returns a result succeeds", async () => {
  const registry = builtinRegistry().register({
    name: "stubborn",
    version: 1,
    input: z.object({ ms: z.number() }),
    async handler({ ms }, ctx) {
      await new Promise((r) => setTimeout(r, ms));
      return { done: true, aborted: ctx.signal.aborted };
    },
  });
  const { db, admit } = await setup(registry);
  // Beats every second: a few before the handler returns, and a lease that
  // a loaded machine does not lose (a lost lease would end the run otherwise).
  const w = worker(db.sql, { leaseMs: 3_000 }, registry);
  try {
    await w.start();
    const runId = await admit("stubborn", { ms: 4_000 });
    await waitFor("run running", statusIs(db.sql, runId, "running"), 10_000);
    await db.sql`update runs set cancel_requested_at = now()
                  where tenant_id = ${TENANT} and run_id = ${runId}`;
    const row = await waitFor("run succeeded", statusIs(db.sql, runId, "succeeded"), 20_000);
    assert.deepEqual(row.result, { done: true, aborted: true });
  } finally {
    await w.stop();
    await db.drop();
  }
});

Deno.test("worker: a finishing write stuck on a row lock frees the handler's slot: it claims and finishes other runs meanwhile", async () => {
  // `gate@1` returns when the test opens its gate: the test decides when a
  // handler ends.
  const gates = new Map<number, () => void>();
  const opened = new Map<number, Promise<void>>();
  for (const id of [1, 2]) opened.set(id, new Promise<void>((r) => gates.set(id, r)));
  const registry = builtinRegistry().register({
    name: "gate",
    version: 1,
    input: z.object({ id: z.number() }),
    handler: async ({ id }) => {
      await opened.get(id);
      return { id };
    },
  });
  const { db, admit } = await setup(registry);
  const w = worker(db.sql, { concurrency: 2 }, registry);
  let unlock = () => {};
  const unlocked = new Promise<void>((r) => unlock = r);
  let holder: Promise<unknown> = Promise.resolve();
  try {
    await w.start();
    const gated = [await admit("gate", { id: 1 }), await admit("gate", { id: 2 })];
    for (const id of gated) await waitFor("gated run running", statusIs(db.sql, id, "running"));
    // Both slots are taken. Lock both rows: their completion will wait on it.
    let locked = false;
    holder = db.sql.begin(async (tx) => {
      await tx`select 1 from runs where tenant_id = ${TENANT} and run_id in ${
        tx(gated)
      } for update`;
      locked = true;
      await unlocked;
    });
    await waitFor("rows locked", () => locked);
    for (const open of gates.values()) open();

    const others = [await admit("echo", { n: 1 }), await admit("echo", { n: 2 })];
    for (const id of others) {
      await waitFor("a later run succeeded", statusIs(db.sql, id, "succeeded"), 10_000);
    }
    for (const id of gated) {
      assert.equal((await runRow(db.sql, id)).status, "running", "its completion still waits");
    }

    unlock();
    await holder;
    for (const id of gated) {
      const row = await waitFor("gated run succeeded", statusIs(db.sql, id, "succeeded"));
      assert.equal(row.attempts, 1);
    }
  } finally {
    unlock();
    await holder;
    await w.stop();
    await db.drop();
  }
});
