/**
 * dev/chaos/verdict.ts: the chaos invariants on made-up observations: a
 * perfect outcome passes, and each kind of damage is caught by its counter
 * (and by tenant_b when it hits the clean tenant), among them a concurrency
 * group over its limit and slot counts that drifted from the runs, and a
 * durable run's step called again after its result was stored. The
 * harness itself runs as `deno task chaos`, not here.
 *
 *   deno test -A tests/dev_chaos_verdict_test.ts
 */
import assert from "node:assert/strict";
import { DURABLE, KEYED, PARENT, type Plan, plan } from "../dev/chaos/plan.ts";
import type { ParentRun } from "../dev/chaos/parent_runs.ts";
import type { SlotGroup } from "../dev/chaos/observe.ts";
import type { DurableRun } from "../dev/chaos/step_calls.ts";
import {
  type Counter,
  COUNTERS,
  EXPECTED_REASONS,
  type Observed,
  verdict,
} from "../dev/chaos/verdict.ts";

const TENANTS = { poisoned: "t-a", clean: "t-b" };

function workload(): Plan {
  return plan({ messages: 600, tenants: TENANTS, seed: 7, bodyLimit: 1024 });
}

/** A group of the limited workflow as one sample (or the read after the drain) saw it. */
function group(tenant: string, key: string, running: number, queued: number): SlotGroup {
  return {
    tenant,
    workflow: KEYED.workflow,
    key,
    running,
    queued,
    slotRunning: running,
    slotQueued: queued,
    maxRunning: KEYED.limit,
  };
}

/** What a flawless run would leave behind for `p`. */
function perfect(p: Plan): Observed {
  const seen: Observed = {
    runs: [],
    events: [],
    deadLetters: [],
    dispatchCopies: new Map(),
    unpublished: [],
    http: [],
    crashes: [],
    uncommitted: new Map(),
    // Groups at their limit with runs waiting, then idle; all counted right.
    slots: {
      samples: [
        {
          at: 100,
          groups: [group(TENANTS.poisoned, "g1", 2, 3), group(TENANTS.clean, "g1", 1, 0)],
        },
        { at: 200, groups: [group(TENANTS.poisoned, "g1", 2, 1)] },
        { at: 300, groups: [] },
      ],
      failed: 1,
      final: [group(TENANTS.poisoned, "g1", 0, 0), group(TENANTS.clean, "g1", 0, 0)],
    },
    durable: [],
    parents: [],
  };
  const groups = new Map(
    p.messages.filter((m) => m.group).map((m) => [`${m.tenant}/${m.dispatchKey}`, m.group!]),
  );
  const sleeps = new Map(
    p.messages.filter((m) => m.sleepMs !== undefined).map((
      m,
    ) => [`${m.tenant}/${m.dispatchKey}`, m.sleepMs!]),
  );
  const parents = new Map(
    p.messages.filter((m) => m.children !== undefined).map((
      m,
    ) => [`${m.tenant}/${m.dispatchKey}`, m.children!]),
  );
  const addRun = (tenant: string, dispatchKey: string | null, marker: string | null) => {
    const runId = crypto.randomUUID();
    const group = groups.get(`${tenant}/${dispatchKey}`) ?? null;
    const sleepMs = sleeps.get(`${tenant}/${dispatchKey}`);
    if (sleepMs !== undefined) seen.durable.push(durableRun(tenant, runId, dispatchKey!, sleepMs));
    const children = parents.get(`${tenant}/${dispatchKey}`);
    if (children !== undefined) seen.parents.push(parentRun(tenant, runId, dispatchKey!, children));
    seen.runs.push({
      tenant,
      runId,
      dispatchKey,
      workflowName: group !== null
        ? KEYED.workflow
        : sleepMs !== undefined
        ? DURABLE.workflow
        : children !== undefined
        ? PARENT.workflow
        : "echo",
      concurrencyKey: group,
      status: "succeeded",
      eventSeq: 3,
      marker,
      attempts: 1,
      error: null,
    });
    for (const [seq, type] of ["run.admitted", "run.started", "run.succeeded"].entries()) {
      seen.events.push({ tenant, runId, seq: seq + 1, type });
    }
  };
  for (const [tenant, keys] of p.keys) for (const key of keys) addRun(tenant, key, null);
  for (const m of p.poison) {
    if (m.kind === "keyless") addRun(m.tenant, null, m.marker!);
    else if (m.kind !== "oversized-result") {
      seen.deadLetters.push({ tenant: m.tenant, key: m.key, reason: EXPECTED_REASONS[m.kind][0] });
    }
  }
  for (const m of p.messages) {
    seen.dispatchCopies.set(m.key, (seen.dispatchCopies.get(m.key) ?? 0) + 1);
  }
  return seen;
}

let callIds = 0;

/** A parent that went right: its map's children and its lone one, each once, succeeded. */
function parentRun(tenant: string, runId: string, dispatchKey: string, mapped: number): ParentRun {
  const js = Array.from({ length: mapped + 1 }, (_, j) => j);
  return {
    tenant,
    runId,
    dispatchKey,
    status: "succeeded",
    result: { key: dispatchKey, js },
    children: js.map((j) => ({
      dispatchKey: `child:${runId}:${j < mapped ? `${PARENT.map}#c${j}` : PARENT.solo}`,
      status: "succeeded",
      j,
    })),
    waited: 2,
  };
}

/**
 * A durable run that went right: each step called once and stored after its
 * call, the sleep suspended once, woken once, ended at its end.
 */
function durableRun(tenant: string, runId: string, dispatchKey: string, sleepMs: number) {
  const t0 = Date.parse("2026-12-01T10:00:00Z") + callIds * 10_000;
  const run: DurableRun = {
    tenant,
    runId,
    dispatchKey,
    status: "succeeded",
    result: { key: dispatchKey },
    steps: [],
    calls: [],
    suspended: 1,
    woken: 1,
  };
  let at = t0;
  for (const [i, name] of DURABLE.steps.entries()) {
    if (i === 1) {
      run.steps.push({
        name: DURABLE.sleep,
        kind: "sleep",
        status: "completed",
        result: null,
        until: at + sleepMs,
        completedAt: at + sleepMs + 40,
      });
      at += sleepMs + 50;
    }
    const id = ++callIds;
    run.calls.push({ id, step: name, attempt: 1, at });
    run.steps.push({
      name,
      kind: "step",
      status: "completed",
      result: id,
      until: null,
      completedAt: at + 3,
    });
    (run.result as Record<string, unknown>)[name] = id;
    at += 10;
  }
  return run;
}

function nonZero(counts: Record<Counter, number>): Partial<Record<Counter, number>> {
  return Object.fromEntries(Object.entries(counts).filter(([, n]) => n > 0));
}

function runOf(seen: Observed, tenant: string) {
  return seen.runs.find((r) => r.tenant === tenant && r.dispatchKey?.startsWith("chaos-"))!;
}

Deno.test("chaos verdict: about a quarter of the fresh keys are limited runs over few groups, on both tenants", () => {
  const p = workload();
  assert.deepEqual(p.limited, { workflow: KEYED.workflow, limit: KEYED.limit });
  const fresh = p.messages.filter((m) => m.kind === "fresh");
  const keyed = fresh.filter((m) => m.group !== undefined);
  const share = keyed.length / fresh.length;
  assert.ok(share > 0.18 && share < 0.32, `${keyed.length} of ${fresh.length} keyed`);
  for (const tenant of Object.values(TENANTS)) {
    const groups = new Set(keyed.filter((m) => m.tenant === tenant).map((m) => m.group));
    assert.ok(groups.size > 1 && groups.size <= KEYED.groups, `${tenant}: ${groups.size} groups`);
  }
  for (const m of keyed) {
    const body = JSON.parse(m.value);
    assert.equal(body.workflow_ref, KEYED.workflow);
    // The definition's key pointer finds the planned group in the input.
    assert.equal(body.input[KEYED.pointer.slice(1)], m.group);
    assert.ok(body.input.ms >= KEYED.minMs && body.input.ms <= KEYED.maxMs);
  }
  // A redelivery of a limited run is of the same group.
  const redelivered = p.messages.filter((m) => m.kind === "redelivery" && m.group);
  assert.ok(redelivered.length > 0);
});

Deno.test("chaos verdict: the plan has every poison kind, redeliveries, and races", () => {
  const p = workload();
  assert.equal(p.messages.length, 600);
  const kinds = new Set(p.poison.map((m) => m.kind));
  assert.equal(kinds.size, 6);
  assert.ok(p.poison.every((m) => m.tenant === TENANTS.poisoned));
  const redeliveries = p.messages.filter((m) => m.kind === "redelivery");
  assert.ok(redeliveries.length >= 100, `${redeliveries.length} redeliveries`);
  // A redelivery is the same bytes after its original.
  for (const r of redeliveries) {
    const first = p.messages.findIndex((m) => m.key === r.key);
    assert.equal(p.messages[first].kind, "fresh");
    assert.equal(p.messages[first].value, r.value);
  }
  assert.ok(p.messages.some((m) => m.race));
  assert.deepEqual(plan({ messages: 600, tenants: TENANTS, seed: 7, bodyLimit: 1024 }), p);
});

Deno.test("chaos verdict: a flawless outcome has every counter at 0", () => {
  const p = workload();
  const v = verdict(p, perfect(p), TENANTS.clean);
  assert.deepEqual(nonZero(v.counts), {});
  assert.deepEqual(Object.keys(v.counts), [...COUNTERS]);
});

Deno.test("chaos verdict: a missing run is lost, and on the clean tenant also tenant_b", () => {
  const p = workload();
  const seen = perfect(p);
  const victim = runOf(seen, TENANTS.clean);
  seen.runs = seen.runs.filter((r) => r !== victim);
  seen.events = seen.events.filter((e) => e.runId !== victim.runId);
  assert.deepEqual(nonZero(verdict(p, seen, TENANTS.clean).counts), { lost: 1, tenant_b: 1 });
});

Deno.test("chaos verdict: two runs of one key, or of one keyless message, are dup", () => {
  const p = workload();
  const seen = perfect(p);
  const keyed = runOf(seen, TENANTS.poisoned);
  const keyless = seen.runs.find((r) => r.marker !== null)!;
  for (const r of [keyed, keyless]) {
    const runId = crypto.randomUUID();
    seen.runs.push({ ...r, runId });
    for (let seq = 1; seq <= 3; seq++) {
      seen.events.push({
        tenant: r.tenant,
        runId,
        seq,
        type: seq === 3 ? "run.succeeded" : "x",
      });
    }
  }
  assert.deepEqual(nonZero(verdict(p, seen, TENANTS.clean).counts), { dup: 2 });
});

Deno.test("chaos verdict: an open run is stuck; a failed echo run is failed", () => {
  const p = workload();
  const seen = perfect(p);
  const runs = seen.runs.filter((r) => r.tenant === TENANTS.poisoned && r.dispatchKey);
  runs[0].status = "running";
  runs[1].status = "failed";
  assert.deepEqual(nonZero(verdict(p, seen, TENANTS.clean).counts), { stuck: 1, failed: 1 });
});

Deno.test("chaos verdict: a seq missing on Kafka is a gap unless parked; unpublished is unparked", () => {
  const p = workload();
  const seen = perfect(p);
  const [a, b] = seen.runs;
  seen.events = seen.events.filter((e) =>
    !((e.runId === a.runId || e.runId === b.runId) && e.seq === 2)
  );
  seen.unpublished = [
    { tenant: a.tenant, runId: a.runId, seq: 2, type: "run.started", parked: false },
    { tenant: b.tenant, runId: b.runId, seq: 2, type: "run.started", parked: true },
  ];
  const v = verdict(p, seen, TENANTS.clean);
  const expected: Partial<Record<Counter, number>> = { gaps: 1, unparked: 1 };
  if (a.tenant === TENANTS.clean) expected.tenant_b = 2;
  assert.deepEqual(nonZero(v.counts), expected);
  assert.equal(v.info.parked, 1);
});

Deno.test("chaos verdict: events out of seq order, or no terminal event, are caught", () => {
  const p = workload();
  const seen = perfect(p);
  const [a, b] = seen.runs.filter((r) => r.tenant === TENANTS.poisoned);
  const ofA = seen.events.filter((e) => e.runId === a.runId);
  [ofA[0].seq, ofA[1].seq] = [2, 1];
  for (const e of seen.events) if (e.runId === b.runId && e.seq === 3) e.type = "run.started";
  assert.deepEqual(nonZero(verdict(p, seen, TENANTS.clean).counts), { order: 1, gaps: 1 });
});

Deno.test("chaos verdict: poison without its dead letter, or with the wrong reason, is dlq_missing", () => {
  const p = workload();
  const seen = perfect(p);
  const [first, second] = seen.deadLetters;
  seen.deadLetters = seen.deadLetters.filter((d) => d !== first);
  second.reason = "http_500";
  const v = verdict(p, seen, TENANTS.clean);
  assert.deepEqual(nonZero(v.counts), { dlq_missing: 2 });
  assert.ok(v.examples.dlq_missing.some((e) => e.includes("http_500")));
});

Deno.test("chaos verdict: a dead-lettered good message, or admitted poison, is dlq_extra", () => {
  const p = workload();
  const seen = perfect(p);
  const good = runOf(seen, TENANTS.clean);
  seen.deadLetters.push({
    tenant: good.tenant,
    key: `${good.tenant}/${good.dispatchKey}`,
    reason: "validation",
  });
  const poison = p.poison.find((m) => m.kind === "nul-input")!;
  const runId = crypto.randomUUID();
  seen.runs.push({
    tenant: poison.tenant,
    runId,
    dispatchKey: poison.dispatchKey!,
    workflowName: "echo",
    concurrencyKey: null,
    status: "succeeded",
    eventSeq: 1,
    marker: null,
    attempts: 1,
    error: null,
  });
  seen.events.push({ tenant: poison.tenant, runId, seq: 1, type: "run.succeeded" });
  assert.deepEqual(nonZero(verdict(p, seen, TENANTS.clean).counts), {
    dlq_extra: 2,
    tenant_b: 1,
  });
});

Deno.test("chaos verdict: a caller told another run, or none, is http; a crash is crashes", () => {
  const p = workload();
  const seen = perfect(p);
  const r = runOf(seen, TENANTS.poisoned);
  seen.http = [
    { tenant: r.tenant, dispatchKey: r.dispatchKey!, runId: r.runId, status: 200 },
    { tenant: r.tenant, dispatchKey: r.dispatchKey!, runId: crypto.randomUUID(), status: 201 },
    { tenant: r.tenant, dispatchKey: r.dispatchKey!, error: "no answer" },
  ];
  seen.crashes = ["api#1 exited with code 1: error: Uncaught"];
  assert.deepEqual(nonZero(verdict(p, seen, TENANTS.clean).counts), { http: 2, crashes: 1 });
});

Deno.test("chaos verdict: messages the relay group never committed are lag", () => {
  const p = workload();
  const seen = perfect(p);
  seen.uncommitted = new Map([["poimen.t-b.dispatch/1", 30], ["poimen.t-a.dispatch/0", 0]]);
  assert.deepEqual(nonZero(verdict(p, seen, TENANTS.clean).counts), { lag: 30, tenant_b: 1 });
});

Deno.test("chaos verdict: a keyless message dead-lettered instead of admitted is lost and dlq_extra", () => {
  const p = workload();
  const seen = perfect(p);
  const keyless = p.poison.find((m) => m.kind === "keyless")!;
  const run = seen.runs.find((r) => r.marker === keyless.marker)!;
  seen.runs = seen.runs.filter((r) => r !== run);
  seen.events = seen.events.filter((e) => e.runId !== run.runId);
  seen.deadLetters.push({
    tenant: keyless.tenant,
    key: keyless.key,
    reason: "missing-dispatch-key",
  });
  assert.deepEqual(nonZero(verdict(p, seen, TENANTS.clean).counts), { lost: 1, dlq_extra: 1 });
});

Deno.test("chaos verdict: a sampled group with more than its limit running is overlimit, once per sample", () => {
  const p = workload();
  const seen = perfect(p);
  const over = KEYED.limit + 1;
  seen.slots.samples.push(
    { at: 400, groups: [group(TENANTS.poisoned, "g2", over, 0)] },
    {
      at: 500,
      groups: [group(TENANTS.poisoned, "g2", over, 2), group(TENANTS.clean, "g5", over, 0)],
    },
  );
  const v = verdict(p, seen, TENANTS.clean);
  assert.deepEqual(nonZero(v.counts), { overlimit: 3, tenant_b: 1 });
  assert.ok(v.examples.overlimit.some((e) => e.includes(`g2 at +0.4 s: ${over} running`)));
  assert.equal(v.info.limited.maxRunning, over);
});

Deno.test("chaos verdict: a group exactly at its limit is no violation, and counts as contended when runs wait", () => {
  const p = workload();
  const v = verdict(p, perfect(p), TENANTS.clean);
  assert.deepEqual(v.info.limited, {
    samples: 3,
    failedSamples: 1,
    maxRunning: KEYED.limit,
    contended: 2,
    groups: 2,
  });
});

Deno.test("chaos verdict: no sample at all, or a limited run stored without its group, is overlimit", () => {
  const p = workload();
  const seen = perfect(p);
  seen.slots.samples = [];
  const limited = seen.runs.find((r) =>
    r.workflowName === KEYED.workflow && r.tenant === TENANTS.poisoned
  )!;
  limited.concurrencyKey = null;
  const v = verdict(p, seen, TENANTS.clean);
  assert.deepEqual(nonZero(v.counts), { overlimit: 2 });
  assert.ok(v.examples.overlimit.some((e) => e.includes("the limit went unchecked")));
});

Deno.test("chaos verdict: slot counts unlike the runs are slotdrift, during the run and after the drain", () => {
  const p = workload();
  const seen = perfect(p);
  // A reclaimed run counted twice: the row says 2 running, one run is.
  seen.slots.samples.push({
    at: 400,
    groups: [{ ...group(TENANTS.poisoned, "g3", 1, 0), slotRunning: 2 }],
  });
  // After the drain: a slot never freed on the clean tenant; a row with another limit.
  seen.slots.final = [
    { ...group(TENANTS.clean, "g4", 0, 0), slotRunning: 1 },
    { ...group(TENANTS.poisoned, "g6", 0, 0), maxRunning: KEYED.limit + 5 },
  ];
  // Runs queued with no row at all.
  seen.slots.samples.push({
    at: 500,
    groups: [{ ...group(TENANTS.poisoned, "g7", 0, 2), slotRunning: null, slotQueued: null }],
  });
  const v = verdict(p, seen, TENANTS.clean);
  assert.deepEqual(nonZero(v.counts), { slotdrift: 4, tenant_b: 1 });
  assert.ok(v.examples.slotdrift.some((e) => e.includes("no concurrency_slots row")));
  assert.ok(v.examples.slotdrift.some((e) => e.includes("after the drain")));
});

Deno.test("chaos verdict: about a tenth of the keys are durable runs whose sleep suspends", () => {
  const p = workload();
  assert.deepEqual(p.durable, {
    workflow: DURABLE.workflow,
    steps: DURABLE.steps,
    sleep: DURABLE.sleep,
  });
  const fresh = p.messages.filter((m) => m.kind === "fresh");
  const durable = fresh.filter((m) => m.sleepMs !== undefined);
  const share = durable.length / fresh.length;
  assert.ok(share > 0.06 && share < 0.17, `${durable.length} of ${fresh.length} durable`);
  for (const m of durable) {
    const body = JSON.parse(m.value);
    assert.equal(body.workflow_ref, DURABLE.workflow);
    assert.equal(body.input.sleep_ms, m.sleepMs);
    assert.equal(m.group, undefined);
    // Each sleep is longer than the workers' threshold: it suspends its run.
    assert.ok(m.sleepMs! > DURABLE.suspendAfterMs * 2, `${m.sleepMs} ms`);
  }
  assert.ok(new Set(durable.map((m) => m.tenant)).size === 2);
});

function durableOf(seen: Observed, tenant: string): DurableRun {
  return seen.durable.find((r) => r.tenant === tenant)!;
}

Deno.test("chaos verdict: a step called after its result was stored is steps_dup; a re-run before is not", () => {
  const p = workload();
  const seen = perfect(p);
  const run = durableOf(seen, TENANTS.clean);
  const ship = run.steps.find((s) => s.name === "ship")!;
  // The worker died between the side effect and the store: called again, stored once.
  const other = durableOf(seen, TENANTS.poisoned);
  const charge = other.steps.find((s) => s.name === "charge")!;
  other.calls.unshift({
    id: 10_000_000,
    step: "charge",
    attempt: 1,
    at: charge.completedAt! - 500,
  });
  let v = verdict(p, seen, TENANTS.clean);
  assert.deepEqual(nonZero(v.counts), {});
  assert.equal(v.info.durable.reruns, 1);
  assert.equal(v.info.durable.calls, seen.durable.length * 3 + 1);
  // A replay that ran the stored step again: a duplicate side effect.
  run.calls.push({ id: 10_000_001, step: "ship", attempt: 2, at: ship.completedAt! + 1 });
  v = verdict(p, seen, TENANTS.clean);
  assert.deepEqual(nonZero(v.counts), { steps_dup: 1, tenant_b: 1 });
  assert.match(v.examples.steps_dup[0], /step ship called again .* after its result was stored/);
});

Deno.test("chaos verdict: a step stored without its call, or a result not the stored one, is steps_lost", () => {
  const p = workload();
  const seen = perfect(p);
  const [a, b, c, d] = seen.durable.filter((r) => r.tenant === TENANTS.poisoned);
  // The step's stored result is no call of it.
  a.calls = a.calls.filter((x) => x.step !== "notify");
  // The run's result is not what the step stored.
  (b.result as Record<string, unknown>).charge = -1;
  // Succeeded without its last step stored.
  c.steps = c.steps.filter((s) => s.name !== "notify");
  // A planned durable run that never ran the durable workflow.
  seen.durable = seen.durable.filter((r) => r !== d);
  const v = verdict(p, seen, TENANTS.clean);
  assert.deepEqual(nonZero(v.counts), { steps_lost: 5 });
  assert.ok(v.examples.steps_lost.some((e) => e.includes(`key ${d.dispatchKey}: no run of`)));
});

Deno.test("chaos verdict: a sleep that ended early, a suspension never woken, or none suspended, is sleeps", () => {
  const p = workload();
  const seen = perfect(p);
  const [a, b, c] = seen.durable.filter((r) => r.tenant === TENANTS.poisoned);
  const sleep = a.steps.find((s) => s.kind === "sleep")!;
  sleep.completedAt = sleep.until! - 200;
  b.suspended = 2;
  c.steps = c.steps.filter((s) => s.kind !== "sleep");
  let v = verdict(p, seen, TENANTS.clean);
  assert.deepEqual(nonZero(v.counts), { sleeps: 3 });
  assert.match(v.examples.sleeps[0], /sleep ended 200 ms before its end/);

  // The threshold never crossed: the suspension went unexercised.
  const quiet = perfect(p);
  for (const r of quiet.durable) r.suspended = r.woken = 0;
  v = verdict(p, quiet, TENANTS.clean);
  assert.deepEqual(nonZero(v.counts), { sleeps: 1 });
  assert.equal(v.info.durable.suspendedRuns, 0);
});

Deno.test("chaos verdict: a few keys are parents; a second child, a lost one, a parent left waiting are flagged", () => {
  const p = workload();
  const planned = p.messages.filter((m) => m.kind === "fresh" && m.children !== undefined);
  assert.ok(planned.length > 0, "the workload has parents");
  for (const m of planned) {
    const body = JSON.parse(m.value);
    assert.equal(body.workflow_ref, PARENT.workflow);
    assert.equal(body.input.children, m.children);
    assert.ok(m.children! >= PARENT.minChildren && m.children! <= PARENT.maxChildren);
  }
  assert.deepEqual(nonZero(verdict(p, perfect(p), TENANTS.clean).counts), {});

  const seen = perfect(p);
  const [a, b, c, d] = seen.parents.filter((x) => x.tenant === TENANTS.poisoned);
  // A retried parent that started its first child again.
  a.children.push({ ...a.children[0], dispatchKey: "child:other" });
  // A succeeded parent missing its lone child, its result still claiming it.
  b.children.pop();
  // A parent still waiting though every child is final.
  c.status = "waiting";
  // A result not built from the children.
  d.result = { key: d.dispatchKey, js: [0] };
  const v = verdict(p, seen, TENANTS.clean);
  assert.deepEqual(nonZero(v.counts), {
    children_dup: 2,
    children_lost: 2,
    parents_waiting: 1,
  });
});
