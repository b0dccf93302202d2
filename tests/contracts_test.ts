/** The wire contracts: one definition each, and the code that speaks them agrees with it. */
import assert from "node:assert/strict";
import { EventMessage, parseEventMessage } from "../contracts/events.ts";
import { RunRequest } from "../contracts/runs.ts";
import {
  DISPATCH_TOPIC_PATTERN,
  dispatchTopic,
  dlqTopic,
  eventMessageKey,
  eventsTopic,
  isTenantId,
  TENANT_ID_PATTERN,
} from "../contracts/topics.ts";
import type { PendingEvent } from "../db/outbox.ts";
import { toMessage } from "../outbox/publisher.ts";
import { builtinRegistry } from "../workflows/builtin.ts";

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

Deno.test("contracts: a workflow_ref the registry could never resolve is refused by the schema", () => {
  const accepts = (ref: string) => RunRequest.safeParse({ workflow_ref: ref }).success;
  // Once accepted here and then "unknown workflow": a version past int4.
  assert.equal(accepts("echo@1234567890"), false);
  for (const ref of ["echo@0", "Echo", "echo@", "a".repeat(101), "echo@01"]) {
    assert.equal(accepts(ref), false, ref);
  }
  const registry = builtinRegistry();
  for (const ref of ["echo", "echo@1", "sleep"]) {
    assert.ok(accepts(ref), ref);
    assert.ok(registry.resolve(ref), ref);
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
    payload: { attempt: 1, result: { ok: true } },
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
