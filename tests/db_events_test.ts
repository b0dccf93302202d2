/**
 * Every event the queue's statements write parses strictly with the event
 * contract (contracts/events.ts), against a real Postgres: runs are taken
 * through every transition (admitted, claimed by both claims, succeeded
 * alone and in a batch, retried, failed by the handler and by an expired
 * lease, released, cancelled queued and cancelled at the end of a failed,
 * released or expired attempt), and a durable run through every statement
 * of its steps, sleeps, signal waits, suspends and wake-ups (each variant:
 * a step stored or failed, a sleep ended, a wait given its signal or timed
 * out, a suspend with a deadline or without, woken by its deadline or its
 * signal, cancelled while waiting), and each `work_events` row is read as
 * the outbox ships it and parsed. A statement writing a key too many or too few
 * fails here; so does an event type or variant no statement wrote.
 */
import assert from "node:assert/strict";
import { Admission } from "../admission/admit.ts";
import { silentLogger } from "../core/log.ts";
import { ChildAdmission } from "../worker/child_runs.ts";
import { insertTenant } from "../db/auth.ts";
import type { Sql } from "../db/pool.ts";
import { completeRun, completeRuns, failAttempt, releaseRun } from "../db/attempt_end.ts";
import { requestCancel } from "../db/cancellation.ts";
import { type ClaimedRun, claimLimitedRuns, claimRuns, type HostedVersions } from "../db/claims.ts";
import { reclaimExpired } from "../db/leases.ts";
import { completeStep, failStep, settleSleep, type StepFence } from "../db/run_steps.ts";
import { sendSignal, settleSignalWait } from "../db/signals.ts";
import { suspendRun, wakeDueRuns } from "../db/suspension.ts";
import type { PendingEvent } from "../db/outbox.ts";
import { toMessage } from "../outbox/event_message.ts";
import {
  type EventMessage,
  parseEventMessage,
  RUN_EVENT_PAYLOADS,
  RunEventBody,
} from "../contracts/events.ts";
import { RUN_EVENT_TYPES } from "../contracts/event_types.ts";
import { catalogOf, limitedRegistry } from "./support/catalog.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";

const TENANT = "acme";
const OWNER = "w-events";
const LEASE_MS = 30_000;
const ECHO: HostedVersions = { names: ["echo"], versions: [1] };
const LIMITED: HostedVersions = { names: ["shop.sync"], versions: [1] };

interface World {
  db: TestDatabase;
  admit(ref: string, input: unknown, extra?: Record<string, unknown>): Promise<string>;
  /** Claims the one queued run of `hosted`, `runId`, for OWNER. */
  claim(runId: string, leaseMs?: number, hosted?: HostedVersions): Promise<ClaimedRun>;
  /** Reclaims until `runId` was taken back (its lease of 1 ms has run out). */
  reclaim(runId: string): Promise<string>;
}

async function world(): Promise<World> {
  const db = await freshDatabase();
  await insertTenant(db.sql, TENANT);
  const admission = new Admission(db.sql, catalogOf(limitedRegistry()), {
    maxBatch: 8,
    maxConcurrent: 1,
  });
  return {
    db,
    async admit(ref, input, extra = {}) {
      const { run } = await admission.admit({ workflow_ref: ref, input, ...extra }, {
        tenantId: TENANT,
        source: "test",
        entry: "http",
      });
      return run.run_id;
    },
    async claim(runId, leaseMs = LEASE_MS, hosted = ECHO) {
      const claim = hosted === LIMITED ? claimLimitedRuns : claimRuns;
      const [run] = await claim(db.sql, OWNER, 10, leaseMs, hosted);
      assert.equal(run?.run_id, runId, "the run queued is the run claimed");
      return run;
    },
    async reclaim(runId) {
      return await waitFor(
        "the lease expired and was reclaimed",
        async () => {
          const taken = await reclaimExpired(db.sql, 10);
          return taken.find((r) => r.run_id === runId)?.status;
        },
        10_000,
        5,
      );
    },
  };
}

/** Every event of the tenant, as the outbox reads and ships it. */
async function shipped(sql: Sql): Promise<EventMessage[]> {
  const rows = await sql<PendingEvent[]>`
    select tenant_id, run_id, seq, event_id, type, goal_id, dispatch_key,
           payload::text as payload, at
      from work_events where tenant_id = ${TENANT}
     order by event_id`;
  return rows.map((row) => parseEventMessage(toMessage(row).value));
}

/** Which statement wrote an event, as far as its payload tells. */
function variant(e: EventMessage): string {
  switch (e.type) {
    case "run.retrying":
      return `${e.type} ${e.payload.reason ?? `error ${e.payload.error?.message}`}`;
    case "run.failed":
      return `${e.type} ${e.payload.error.code ?? e.payload.error.message}`;
    case "run.cancelled":
      return `${e.type} ${e.payload.reason ?? e.payload.error?.message ?? "queued"}`;
    case "step.completed": {
      const p = e.payload;
      const how = p.kind !== "signal" ? "" : p.timed_out ? " timed out" : " signalled";
      return `${e.type} ${p.kind}${how}`;
    }
    case "run.waiting":
      return `${e.type} ${e.payload.reason} ${e.payload.until === null ? "forever" : "until"}`;
    case "run.woken":
      return `${e.type} by ${e.payload.by}`;
    default:
      return e.type;
  }
}

/**
 * A durable run through every statement its calls write: a step stored and
 * one failed, a sleep ended at once, a signal sent before its wait and
 * consumed, a wait timed out, a suspended sleep woken by its deadline, a
 * suspended wait woken by its signal; and a second run cancelled while
 * waiting. Returns the two run ids.
 */
async function durableRuns(w: World): Promise<[string, string]> {
  const { sql } = w.db;
  const fence = (run: ClaimedRun): StepFence => ({
    tenant_id: TENANT,
    run_id: run.run_id,
    owner: OWNER,
    attempt: run.attempts,
  });
  const id = await w.admit("echo", { durable: 1 }, { goal_id: "g-d", dispatch_key: "k-d" });
  await sendSignal(sql, TENANT, id, { name: "early", signal_id: "s-early", payload: { a: 1 } });
  let f = fence(await w.claim(id));
  const step = { name: "charge", seq: 1, resultJson: '{"id":1}', size: 8, durationMs: 12.6 };
  assert.equal(await completeStep(sql, f, step), "written");
  assert.equal(
    await failStep(sql, f, { name: "ship", seq: 2, tries: 3, error: { message: "down" } }),
    true,
  );
  assert.equal(
    (await settleSleep(sql, f, { name: "past", seq: 3, until: new Date(0) })).done,
    true,
  );
  const early = { name: "early", seq: 4, signalName: "early", timeoutMs: null };
  assert.equal((await settleSignalWait(sql, f, early)).outcome, "signal");
  const late = { name: "late", seq: 5, signalName: "late", timeoutMs: 0 };
  assert.equal((await settleSignalWait(sql, f, late)).outcome, "timeout");
  // A short sleep, suspended, woken by its deadline.
  const nap = await settleSleep(sql, f, { name: "nap", seq: 6, ms: 200 });
  assert.equal(
    await suspendRun(sql, f, { reason: "sleep", name: "nap", step: "nap", until: nap.until }),
    "suspended",
  );
  await waitFor("the nap's deadline", async () => {
    const woken = await wakeDueRuns(sql, 10);
    return woken.some((r) => r.run_id === id);
  }, 10_000);
  f = fence(await w.claim(id));
  assert.equal((await settleSleep(sql, f, { name: "nap", seq: 6 })).done, true);
  // A wait without a timeout, suspended, woken by its signal.
  const go = { name: "go", seq: 7, signalName: "go", timeoutMs: null };
  assert.equal((await settleSignalWait(sql, f, go)).outcome, "waiting");
  assert.equal(
    await suspendRun(sql, f, { reason: "signal", name: "go", step: "go", until: null }),
    "suspended",
  );
  const sent = await sendSignal(sql, TENANT, id, { name: "go", signal_id: "s-go", payload: 2 });
  assert.equal(sent.outcome === "created" && sent.woken, true);
  f = fence(await w.claim(id));
  assert.equal((await settleSignalWait(sql, f, go)).outcome, "signal");
  // A child it started, cancelled while queued: `child.started` and
  // `child.finished` on this run's timeline.
  const kid = await new ChildAdmission(sql, silentLogger, () => {}).start(
    { tenant_id: TENANT, run_id: id },
    { name: "kid", workflowRef: "echo@1", input: 1 },
  );
  assert.equal((await requestCancel(sql, TENANT, kid.run_id))?.status, "cancelled");

  assert.equal(await completeRun(sql, TENANT, id, OWNER, f.attempt, "done"), true);

  // Cancelled while waiting: no attempt ended.
  const parked = await w.admit("echo", { durable: 2 });
  const p = fence(await w.claim(parked));
  assert.equal(
    await suspendRun(sql, p, { reason: "signal", name: "never", step: "never", until: null }),
    "suspended",
  );
  assert.equal((await requestCancel(sql, TENANT, parked))?.status, "cancelled");
  return [id, parked];
}

Deno.test("events: every event every statement writes parses strictly, every type and variant written", async () => {
  const w = await world();
  const { sql } = w.db;
  try {
    // Admitted with everything an admission may carry; started, succeeded.
    const ok = await w.admit("echo", { n: 1 }, {
      goal_id: "g-1",
      dispatch_key: "k-1",
      run_after: "2020-01-01T00:00:00+02:00",
    });
    await w.claim(ok);
    assert.equal(await completeRun(sql, TENANT, ok, OWNER, 1, { hello: "world" }), true);

    // Retried after a failed attempt, then failed for good.
    const failing = await w.admit("echo", null);
    await w.claim(failing);
    assert.equal(
      (await failAttempt(sql, TENANT, failing, OWNER, 1, { message: "boom", name: "Error" }, 0))
        ?.status,
      "queued",
    );
    await w.claim(failing);
    const final = await failAttempt(sql, TENANT, failing, OWNER, 2, { message: "bust" }, 0, true);
    assert.equal(final?.status, "failed");

    // Leases that expire: retried until the attempts are spent, then failed.
    const dying = await w.admit("echo", 1);
    let status = "queued";
    while (status === "queued") {
      await w.claim(dying, 1);
      status = await w.reclaim(dying);
    }
    assert.equal(status, "failed");

    // Released by a stopping worker.
    const released = await w.admit("echo", 2);
    const claimed = await w.claim(released);
    assert.equal(
      await releaseRun(sql, TENANT, released, OWNER, claimed.attempts, "worker shutdown"),
      "queued",
    );
    await requestCancel(sql, TENANT, released); // and then cancelled while queued

    // Cancel requested while running, ended by the attempt's failure, its
    // release, or its expired lease.
    const byFailure = await w.admit("echo", 3);
    await w.claim(byFailure);
    await requestCancel(sql, TENANT, byFailure);
    const aborted = { message: "aborted", name: "AbortError" };
    assert.equal(
      (await failAttempt(sql, TENANT, byFailure, OWNER, 1, aborted, 0))?.status,
      "cancelled",
    );
    const byRelease = await w.admit("echo", 4);
    await w.claim(byRelease);
    await requestCancel(sql, TENANT, byRelease);
    assert.equal(
      await releaseRun(sql, TENANT, byRelease, OWNER, 1, "worker shutdown"),
      "cancelled",
    );
    const byLease = await w.admit("echo", 5);
    await w.claim(byLease, 1);
    await requestCancel(sql, TENANT, byLease);
    assert.equal(await w.reclaim(byLease), "cancelled");

    // A limited run, through the other claim, succeeded in a batch.
    const limited = await w.admit("shop.sync", { customer_id: "c-1", n: 1 });
    await w.claim(limited, LEASE_MS, LIMITED);
    assert.deepEqual(
      await completeRuns(sql, OWNER, [
        { tenant_id: TENANT, run_id: limited, attempt: 1, result_json: "null" },
      ]),
      [true],
    );

    const [durable, parked] = await durableRuns(w);

    const events = await shipped(sql);
    assert.deepEqual(
      [...new Set(events.map((e) => e.type))].sort(),
      [...RUN_EVENT_TYPES].sort(),
      "every type is written",
    );
    assert.deepEqual([...new Set(events.map(variant))].sort(), [
      "child.finished",
      "child.started",
      "run.admitted",
      "run.cancelled aborted",
      "run.cancelled lease expired",
      "run.cancelled queued",
      "run.cancelled worker shutdown",
      "run.failed bust",
      "run.failed lease-expired",
      "run.released",
      "run.retrying error boom",
      "run.retrying lease expired",
      "run.started",
      "run.succeeded",
      "run.waiting signal forever",
      "run.waiting sleep until",
      "run.woken by deadline",
      "run.woken by signal",
      "signal.received",
      "step.completed signal signalled",
      "step.completed signal timed out",
      "step.completed sleep",
      "step.completed step",
      "step.failed",
    ]);
    // What each one says, beyond its shape.
    const of = (runId: string) => events.filter((e) => e.run_id === runId);
    const first = of(ok);
    assert.deepEqual(first.map((e) => [e.seq, e.type, e.goal_id, e.dispatch_key]), [
      [1, "run.admitted", "g-1", "k-1"],
      [2, "run.started", "g-1", "k-1"],
      [3, "run.succeeded", "g-1", "k-1"],
    ]);
    const [admitted, started, succeeded] = first.map((e) => e.payload);
    assert.deepEqual({ ...admitted, run_after: undefined }, {
      workflow_ref: "echo",
      workflow: "echo",
      workflow_version: 1,
      source: "test",
      run_after: undefined,
    });
    assert.deepEqual(started, { attempt: 1, worker: OWNER });
    assert.deepEqual(succeeded, { attempt: 1, result: { hello: "world" } });
    const expired = of(byLease).at(-1)!;
    assert.ok(expired.type === "run.cancelled", expired.type);
    assert.deepEqual({ ...expired.payload, requested_at: undefined }, {
      attempt: 1,
      requested_at: undefined,
      error: null,
      reason: "lease expired",
      worker: OWNER,
    });
    assert.deepEqual(of(limited).map((e) => e.type), [
      "run.admitted",
      "run.started",
      "run.succeeded",
    ]);
    assert.deepEqual(of(limited)[2].payload, { attempt: 1, result: null });
    assertDurable(of(durable), of(parked));
  } finally {
    await w.db.drop();
  }
});

/** What the durable run's events say, beyond their shapes. */
function assertDurable(events: EventMessage[], parked: EventMessage[]): void {
  assert.deepEqual(events.map((e) => [e.seq, e.type, e.goal_id, e.dispatch_key]), [
    [1, "run.admitted", "g-d", "k-d"],
    [2, "signal.received", "g-d", "k-d"],
    [3, "run.started", "g-d", "k-d"],
    [4, "step.completed", "g-d", "k-d"],
    [5, "step.failed", "g-d", "k-d"],
    [6, "step.completed", "g-d", "k-d"],
    [7, "step.completed", "g-d", "k-d"],
    [8, "step.completed", "g-d", "k-d"],
    [9, "run.waiting", "g-d", "k-d"],
    [10, "run.woken", "g-d", "k-d"],
    [11, "run.started", "g-d", "k-d"],
    [12, "step.completed", "g-d", "k-d"],
    [13, "run.waiting", "g-d", "k-d"],
    [14, "signal.received", "g-d", "k-d"],
    [15, "run.woken", "g-d", "k-d"],
    [16, "run.started", "g-d", "k-d"],
    [17, "step.completed", "g-d", "k-d"],
    [18, "child.started", "g-d", "k-d"],
    [19, "child.finished", "g-d", "k-d"],
    [20, "run.succeeded", "g-d", "k-d"],
  ]);
  const at = (seq: number) => events.find((e) => e.seq === seq)!.payload;
  const untilOf = (seq: number) => (at(seq) as { until: string | null }).until;
  const nulls = { duration_ms: null, until: null, signal_id: null, timed_out: null };
  assert.deepEqual(at(2), { name: "early", signal_id: "s-early" });
  assert.deepEqual(at(4), {
    ...nulls,
    name: "charge",
    seq: 1,
    kind: "step",
    size: 8,
    attempt: 1,
    duration_ms: 13,
  });
  assert.deepEqual(at(5), {
    name: "ship",
    seq: 2,
    attempt: 1,
    tries: 3,
    error: { message: "down" },
  });
  assert.deepEqual(at(6), {
    ...nulls,
    name: "past",
    seq: 3,
    kind: "sleep",
    size: 0,
    attempt: 1,
    until: "1970-01-01T00:00:00+00:00",
  });
  const early = at(7) as { size: number };
  assert.ok(early.size > 0);
  assert.deepEqual(early, {
    ...nulls,
    name: "early",
    seq: 4,
    kind: "signal",
    size: early.size,
    attempt: 1,
    signal_id: "s-early",
    timed_out: false,
  });
  assert.deepEqual(at(8), {
    ...nulls,
    name: "late",
    seq: 5,
    kind: "signal",
    size: 4, // JSON null
    attempt: 1,
    until: untilOf(8),
    timed_out: true,
  });
  assert.ok(untilOf(8) !== null);
  assert.deepEqual(at(9), {
    attempt: 1,
    reason: "sleep",
    name: "nap",
    step: "nap",
    until: untilOf(9),
  });
  assert.ok(untilOf(9) !== null);
  assert.deepEqual(at(10), { by: "deadline", reason: "sleep", name: "nap", signal_id: null });
  // The suspend got the sleep's end as a Date: the same instant, to the millisecond.
  assert.equal(new Date(untilOf(12)!).getTime(), new Date(untilOf(9)!).getTime());
  assert.deepEqual(at(12), { ...at(6), name: "nap", seq: 6, until: untilOf(12) });
  assert.deepEqual(at(13), { attempt: 1, reason: "signal", name: "go", step: "go", until: null });
  assert.deepEqual(at(15), { by: "signal", reason: "signal", name: "go", signal_id: "s-go" });
  const go = at(17) as { size: number };
  assert.deepEqual(go, {
    ...nulls,
    name: "go",
    seq: 7,
    kind: "signal",
    size: go.size,
    attempt: 1,
    signal_id: "s-go",
    timed_out: false,
  });
  assert.deepEqual(parked.map((e) => e.type), [
    "run.admitted",
    "run.started",
    "run.waiting",
    "run.cancelled",
  ]);
  assert.deepEqual({ ...parked[3].payload, requested_at: undefined }, {
    attempt: 0,
    requested_at: undefined,
    error: null,
    reason: null,
    worker: null,
  });
}

Deno.test("events: the contract refuses a payload with a key too many or too few, for every type", async () => {
  const w = await world();
  try {
    const ok = await w.admit("echo", { n: 1 });
    await w.claim(ok);
    await completeRun(w.db.sql, TENANT, ok, OWNER, 1, null);
    const queued = await w.admit("echo", 1);
    await requestCancel(w.db.sql, TENANT, queued);
    await durableRuns(w);
    const written = await shipped(w.db.sql);
    assert.deepEqual(
      [...new Set(written.map((e) => e.type))].sort(),
      [...RUN_EVENT_TYPES].filter((t) =>
        !["run.retrying", "run.failed", "run.released"].includes(t)
      )
        .sort(),
    );
    for (const { type, payload } of written) {
      const body = { type, payload: { ...payload } as Record<string, unknown> };
      assert.ok(RunEventBody.safeParse(body).success, type);
      const extra = { ...body, payload: { ...body.payload, extra: 1 } };
      assert.equal(RunEventBody.safeParse(extra).success, false, `${type} with a key too many`);
      for (const key of Object.keys(body.payload)) {
        const { [key]: _, ...rest } = body.payload;
        assert.equal(
          RunEventBody.safeParse({ type, payload: rest }).success,
          false,
          `${type} without ${key}`,
        );
      }
    }
    // A type nobody writes is no event.
    assert.equal(RunEventBody.safeParse({ type: "run.step", payload: {} }).success, false);
    // Every type has its strict payload schema.
    for (const type of RUN_EVENT_TYPES) {
      assert.equal(RUN_EVENT_PAYLOADS[type].safeParse({}).success, false, type);
    }
  } finally {
    await w.db.drop();
  }
});
