/**
 * The relay's signal messages, without a broker: which topics are inbox
 * topics, what a signal message is posted as (its derived `signal_id`), which
 * are poison, which answers can never succeed, and where a signal's dead
 * letter is redriven to.
 */
import assert from "node:assert/strict";
import { inboxTopic, prepareMessage, prepareSignal } from "../relay/inbox_messages.ts";
import { classify, PERMANENT_PROBLEMS, SIGNAL_PERMANENT_PROBLEMS } from "../relay/api_client.ts";
import { deadLetter, redriven } from "../relay/dead_letter.ts";
import type { ConsumedMessage } from "../kafka/consumer.ts";

const enc = new TextEncoder();
const dec = new TextDecoder();
const RUN = "01a23b8f-e2c6-7317-81a5-faf355b19cdf";

function message(topic: string, value: string, offset = 7n): ConsumedMessage {
  return {
    topic,
    partition: 2,
    offset,
    key: `acme/${RUN}`,
    value: enc.encode(value),
    headers: {},
    timestamp: Date.parse("2026-01-01T00:00:00Z"),
  } as ConsumedMessage;
}

Deno.test("relay signals: the inbox topics are the dispatch and signals topics, nothing else", () => {
  assert.deepEqual(inboxTopic("poimen.acme.dispatch"), { tenant: "acme", kind: "dispatch" });
  assert.deepEqual(inboxTopic("poimen.acme.signals"), { tenant: "acme", kind: "signal" });
  for (const t of ["poimen.acme.dispatch.dlq", "poimen.acme.events", "poimen.a.b.signals", "x"]) {
    assert.equal(inboxTopic(t), undefined, t);
  }
});

Deno.test("relay signals: a message is posted as the signal body, with its place in Kafka as its id when it has none", () => {
  const at = "kafka:poimen.acme.signals/2/7";
  const derived = prepareSignal(enc.encode(JSON.stringify({ run_id: RUN, name: "approval" })), at);
  assert.ok("runId" in derived);
  assert.equal(derived.runId, RUN);
  assert.equal(derived.derived, true);
  assert.deepEqual(JSON.parse(dec.decode(derived.body)), {
    name: "approval",
    payload: null,
    signal_id: at,
  });
  const given = prepareSignal(
    enc.encode(JSON.stringify({ run_id: RUN, name: "a", payload: { ok: 1 }, signal_id: "s-1" })),
    at,
  );
  assert.ok("runId" in given);
  assert.equal(given.derived, false);
  assert.deepEqual(JSON.parse(dec.decode(given.body)), {
    name: "a",
    payload: { ok: 1 },
    signal_id: "s-1",
  });
  // A null id is no id.
  const nulled = prepareSignal(
    enc.encode(JSON.stringify({ run_id: RUN, name: "a", signal_id: null })),
    at,
  );
  assert.ok("runId" in nulled && nulled.derived);

  const prepared = prepareMessage(
    message("poimen.acme.signals", JSON.stringify({ run_id: RUN, name: "a" })),
    "acme",
  );
  assert.equal(prepared.kind, "signal");
  assert.ok("call" in prepared && prepared.derived);
  const dispatch = prepareMessage(
    message("poimen.acme.dispatch", `{"workflow_ref":"echo"}`),
    "acme",
  );
  assert.equal(dispatch.kind, "dispatch");
  assert.ok("call" in dispatch && dispatch.derived);
});

Deno.test("relay signals: poison is judged locally, bad JSON apart from a bad shape", () => {
  const at = "kafka:poimen.acme.signals/0/0";
  const cases: [Uint8Array, string][] = [
    [new Uint8Array([0xff, 0xfe]), "bad-json"],
    [enc.encode("{not json"), "bad-json"],
    [enc.encode("[]"), "validation"],
    [enc.encode(JSON.stringify({ name: "approval" })), "validation"],
    [enc.encode(JSON.stringify({ run_id: "nope", name: "approval" })), "validation"],
    [enc.encode(JSON.stringify({ run_id: RUN, name: "a#2" })), "validation"],
    [enc.encode(JSON.stringify({ run_id: RUN, name: "a", extra: true })), "validation"],
  ];
  for (const [value, reason] of cases) {
    const got = prepareSignal(value, at);
    assert.ok("reason" in got, dec.decode(value));
    assert.equal(got.reason, reason, dec.decode(value));
    assert.ok(got.detail.length > 0);
  }
});

Deno.test("relay signals: a gone or final run can never take its signal; for a dispatch message a 404 is retried", () => {
  const problem = (code: string) => ({ code, retryable: false });
  for (const code of ["not-found", "run-finished"]) {
    assert.equal(classify(404, problem(code), SIGNAL_PERMANENT_PROBLEMS).kind, "permanent");
    assert.equal(classify(404, problem(code), PERMANENT_PROBLEMS).kind, "transient");
  }
  assert.equal(classify(422, problem("validation"), SIGNAL_PERMANENT_PROBLEMS).kind, "permanent");
  assert.equal(classify(201, undefined, SIGNAL_PERMANENT_PROBLEMS).kind, "created");
  assert.equal(classify(200, undefined, SIGNAL_PERMANENT_PROBLEMS).kind, "replayed");
  // Not poimen's word (a proxy's 404), or a retryable one: retried.
  assert.equal(classify(404, undefined, SIGNAL_PERMANENT_PROBLEMS).kind, "transient");
  assert.equal(
    classify(503, { code: "database-unavailable", retryable: true }, SIGNAL_PERMANENT_PROBLEMS)
      .kind,
    "transient",
  );
  assert.equal(
    classify(429, { code: "queue-full", retryable: true }, SIGNAL_PERMANENT_PROBLEMS).kind,
    "transient",
  );
});

Deno.test("relay signals: a signal's dead letter is redriven to the signals topic", () => {
  const now = new Date();
  const why = {
    reason: "run-finished",
    status: 409 as const,
    detail: "d",
    attempts: 1,
    firstFailure: now,
    lastFailure: now,
  };
  for (const topic of ["poimen.acme.signals", "poimen.acme.dispatch"]) {
    const letter = deadLetter("acme", message(topic, "{}"), why);
    assert.equal(letter.topic, "poimen.acme.dispatch.dlq");
    const back = redriven("acme", {
      ...message(letter.topic, "{}"),
      headers: letter.headers!,
    });
    assert.equal(back.topic, topic);
    assert.deepEqual(back.headers, {});
  }
});
