/** The wire contracts: one definition each, and the code that speaks them agrees with it. */
import assert from "node:assert/strict";
import { EventMessage, parseEventMessage } from "../contracts/events.ts";
import { formatPath, jsonProblems, MAX_JSON_DEPTH } from "../contracts/json_value.ts";
import { RunRequest } from "../contracts/runs.ts";
import {
  DISPATCH_TOPIC_PATTERN,
  dispatchTopic,
  dlqTopic,
  eventMessageKey,
  eventsTopic,
  isTenantId,
  signalMessageKey,
  SIGNALS_TOPIC_PATTERN,
  signalsTopic,
  TENANT_ID_PATTERN,
  tenantOfTopic,
  tenantTopics,
} from "../contracts/topics.ts";
import { SignalMessage } from "../contracts/signals.ts";
import type { PendingEvent } from "../db/outbox.ts";
import { toMessage } from "../outbox/event_message.ts";
import { catalogOf } from "./support/catalog.ts";

Deno.test("contracts: the tenants table checks tenant ids with the contract's pattern", async () => {
  const sql = await Deno.readTextFile(
    new URL("../migrations/001_tenants_and_tokens.sql", import.meta.url),
  );
  assert.ok(
    sql.includes(`check (tenant_id ~ '${TENANT_ID_PATTERN.source}')`),
    `migrations/001 does not check tenant_id against ${TENANT_ID_PATTERN.source}`,
  );
});

Deno.test("contracts: the dispatch topic pattern takes exactly the valid tenants' dispatch topics", () => {
  for (const t of ["acme", "a", "x_y-z", "9".repeat(63)]) {
    assert.ok(isTenantId(t));
    assert.equal(DISPATCH_TOPIC_PATTERN.exec(dispatchTopic(t))?.[1], t);
    assert.equal(DISPATCH_TOPIC_PATTERN.test(dlqTopic(t)), false);
    assert.equal(DISPATCH_TOPIC_PATTERN.test(eventsTopic(t)), false);
  }
  for (const t of ["", "Acme", "a.b", "a b", "9".repeat(64)]) {
    assert.equal(isTenantId(t), false, t);
    assert.equal(DISPATCH_TOPIC_PATTERN.test(`poimen.${t}.dispatch`), false, t);
  }
});

Deno.test("contracts: the signals topic is the tenant's, apart from its other topics; a signal message is a signal body plus run_id", () => {
  for (const t of ["acme", "a", "x_y-z", "9".repeat(63)]) {
    const topic = signalsTopic(t);
    assert.equal(topic, `poimen.${t}.signals`);
    assert.equal(SIGNALS_TOPIC_PATTERN.exec(topic)?.[1], t);
    assert.equal(tenantOfTopic(topic), t);
    assert.equal(DISPATCH_TOPIC_PATTERN.test(topic), false);
    for (const other of [dispatchTopic(t), dlqTopic(t), eventsTopic(t)]) {
      assert.equal(SIGNALS_TOPIC_PATTERN.test(other), false, other);
    }
    assert.deepEqual(tenantTopics(t), [eventsTopic(t), dispatchTopic(t), dlqTopic(t), topic]);
    assert.equal(signalMessageKey(t, "r-1"), `${t}/r-1`);
  }
  assert.throws(() => signalsTopic("a.b"), TypeError);
  const runId = crypto.randomUUID();
  assert.ok(SignalMessage.safeParse({ run_id: runId, name: "approval" }).success);
  assert.ok(
    SignalMessage.safeParse({ run_id: runId, name: "a", payload: [1], signal_id: null }).success,
  );
  for (
    const bad of [
      { name: "approval" },
      { run_id: "nope", name: "approval" },
      { run_id: runId, name: "a#2" },
      { run_id: runId, name: "a", extra: 1 },
    ]
  ) {
    assert.equal(SignalMessage.safeParse(bad).success, false, JSON.stringify(bad));
  }
});

Deno.test("contracts: a workflow_ref the registry could never resolve is refused by the schema", () => {
  const accepts = (ref: string) => RunRequest.safeParse({ workflow_ref: ref }).success;
  // Once accepted here and then "unknown workflow": a version past int4.
  assert.equal(accepts("echo@1234567890"), false);
  for (const ref of ["echo@0", "Echo", "echo@", "a".repeat(101), "echo@01"]) {
    assert.equal(accepts(ref), false, ref);
  }
  const catalog = catalogOf();
  for (const ref of ["echo", "echo@1", "sleep"]) {
    assert.ok(accepts(ref), ref);
    assert.ok(catalog.resolve(ref, "acme"), ref);
  }
  assert.ok(accepts("echo@999999999"));
  assert.ok(accepts(`${"a".repeat(100)}@1`));
});

Deno.test("contracts: the outbox's event message parses with the event contract and is keyed by run", () => {
  const event: PendingEvent = {
    tenant_id: "acme",
    run_id: "01912345-6789-7abc-8def-0123456789ab",
    seq: 3,
    event_id: "42",
    type: "run.succeeded",
    goal_id: null,
    dispatch_key: "k-1",
    // As Postgres prints jsonb.
    payload: '{"result": {"ok": true}, "attempt": 1}',
    at: new Date("2025-01-02T03:04:05.678Z"),
  };
  const m = toMessage(event);
  assert.equal(m.key, eventMessageKey("acme", event.run_id));
  assert.equal(m.topic, eventsTopic("acme"));
  assert.deepEqual(parseEventMessage(m.value), {
    event_id: 42,
    tenant_id: "acme",
    run_id: event.run_id,
    seq: 3,
    type: "run.succeeded",
    goal_id: null,
    dispatch_key: "k-1",
    payload: { attempt: 1, result: { ok: true } },
    at: "2025-01-02T03:04:05.678Z",
  });
  assert.equal(m.headers?.["poimen-event-id"], "42");
  assert.equal(m.headers?.["poimen-goal-id"], undefined);
  // A value off the contract is refused, not read as something else.
  const value = JSON.parse(new TextDecoder().decode(m.value));
  assert.throws(() => parseEventMessage(JSON.stringify({ ...value, event_id: "42" })));
  assert.equal(EventMessage.safeParse({}).success, false);
});

Deno.test("contracts: jsonProblems finds what jsonb cannot store, each at its path", () => {
  assert.deepEqual(jsonProblems({ a: [1, "ok", { b: "x\u0000" }], n: 1e300, t: true }), [{
    path: ["a", 2, "b"],
    message: "contains NUL (U+0000)",
  }]);
  assert.deepEqual(jsonProblems(["\ud800", "\udc00\ud800", "\ud83d\ude00"]).map((p) => p.path), [
    [0],
    [1],
  ]);
  assert.deepEqual(jsonProblems({ "k\u0000": 1 }).map((p) => p.path), [["k\u0000"]]);
  assert.deepEqual(jsonProblems([JSON.parse("1e400"), -Infinity, NaN]).map((p) => p.path), [
    [0],
    [1],
    [2],
  ]);
  assert.deepEqual(jsonProblems(10n), [{ path: [], message: "a bigint is not JSON" }]);
});

Deno.test("contracts: nesting is bounded, and checking a very deep value cannot overflow the stack", () => {
  const nest = (n: number) => JSON.parse("[".repeat(n) + "]".repeat(n));
  assert.deepEqual(jsonProblems(nest(MAX_JSON_DEPTH)), []);
  const [p] = jsonProblems(nest(MAX_JSON_DEPTH + 1));
  assert.equal(p.path.length, MAX_JSON_DEPTH);
  assert.equal(jsonProblems(nest(1_000_000)).length, 1);
  assert.equal(
    RunRequest.safeParse({ workflow_ref: "echo", input: nest(200_000) }).success,
    false,
  );
});

Deno.test("contracts: jsonProblems reports a bounded number of problems", () => {
  assert.equal(jsonProblems(Array(10_000).fill("\u0000")).length, 20);
});

Deno.test("contracts: field paths read like code and keep hostile keys visible", () => {
  assert.equal(formatPath(["input", "a", "b", 3]), "input.a.b[3]");
  assert.equal(formatPath(["input", "a b", "\u0000", "0"]), 'input["a b"]["\\u0000"]["0"]');
  assert.equal(formatPath([0, "x"]), "[0].x");
  assert.equal(formatPath([]), "");
});
