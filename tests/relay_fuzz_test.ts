/**
 * Property-based test of the inbox relay, end to end: a generated batch of
 * dispatch messages (arbitrary bytes, invalid UTF-8, non-JSON, JSON that is
 * not an object, objects with hostile fields — NUL, lone surrogates, 1e400,
 * deep nesting, huge strings around the API's body limit, unknown workflows —
 * and valid requests with and without `dispatch_key`, keys repeated) with
 * hostile headers (traceparent garbage, forged dead-letter headers) and
 * Kafka keys, published to a fresh tenant's dispatch topic on the shared
 * broker and drained by a real relay process into a real API process.
 *
 * For every message: it is admitted or dead-lettered with a reason, never
 * both, never neither; exactly one run per distinct dispatch key (a keyless
 * message's key is derived from where it sits); every partition's committed
 * offset reaches its end; the relay never dies; the API never answers 5xx.
 *
 *   deno test -A tests/relay_fuzz_test.ts
 *
 * Seeded: `FUZZ_SEED=<n>` generates another batch (the default is fixed, so
 * CI always runs the same one; the seed is printed on failure),
 * `FUZZ_RUNS=<n>` sets the number of messages (default 300).
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import { createAdmin } from "../kafka/admin.ts";
import { createProducer, type ProduceMessage, recordBatchBytes } from "../kafka/producer.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { dispatchTopic, dlqTopic, tenantTopics } from "../contracts/topics.ts";
import { SECOND } from "../core/time.ts";
import type { TopicPartitionOffset } from "../kafka/client.ts";
import { freshDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, PoimenProcess, runCommand, sampleValue } from "./support/processes.ts";
import { BROKER, consume, KAFKA_TEST } from "./support/kafka.ts";

const SEED = Number(Deno.env.get("FUZZ_SEED") ?? 917_263);
const MESSAGES = Number(Deno.env.get("FUZZ_RUNS") ?? 300);
/** The API's BODY_LIMIT_BYTES in this test: small, so "near the limit" is cheap to publish. */
const BODY_LIMIT = 64 * 1024;
const PARTITIONS = 3;
const DEADLINE = 150 * SECOND;

// ---------------------------------------------------------------- generators

type Expect = "admitted" | "dead-lettered" | "either";

/** One generated dispatch message, with what must become of it where that is certain. */
interface Generated {
  kind: string;
  value: Uint8Array;
  key: string;
  headers: Record<string, string>;
  partition: number;
  expect: Expect;
  /** The dead letter's `poimen-dlq-reason`, when `expect` is "dead-lettered" and it is certain. */
  reason?: string;
}

/** A message value and what must become of it. */
interface Value {
  kind: string;
  value: Uint8Array;
  expect: Expect;
  reason?: string;
}

const utf8 = new TextEncoder();

/** Strings a hostile or unlucky publisher sends. */
const HOSTILE_STRINGS = [
  "",
  "\u0000",
  "a\u0000b",
  "\ud800",
  "\udc00",
  "x\ud83d",
  "\ude00y",
  "\u2028\u2029",
  "\ufeff",
  "\uffff",
  "\u202e",
  "\r\n",
  "\u007f",
  "__proto__",
  "constructor",
  "kafka:",
  "'; drop table runs; --",
  "x".repeat(300),
];

const hostileString = fc.oneof(
  fc.constantFrom(...HOSTILE_STRINGS),
  fc.string({ unit: "binary", maxLength: 20 }),
);

/** Number texts: some finite, some that JSON.parse reads as ±Infinity. */
const numberText = fc.oneof(
  fc.integer().map(String),
  fc.constantFrom("1e400", "-1e400", "1E+309", "5e-324", "-0", "1.7976931348623157e308", "1e20"),
);

/** JSON texts of arbitrary shape, hostile leaves included (written by hand: `1e400` is no JS number). */
const hostileJson: fc.Arbitrary<string> = fc.letrec<{ node: string }>((tie) => ({
  node: fc.oneof(
    { depthSize: "small", withCrossShrink: true },
    { weight: 3, arbitrary: numberText },
    { weight: 3, arbitrary: hostileString.map((s) => JSON.stringify(s)) },
    { weight: 1, arbitrary: fc.constantFrom("true", "false", "null") },
    {
      weight: 2,
      arbitrary: fc.array(tie("node"), { maxLength: 4 }).map((items) => `[${items.join(",")}]`),
    },
    {
      weight: 2,
      arbitrary: fc.array(fc.tuple(hostileString, tie("node")), { maxLength: 4 })
        .map((entries) => `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${v}`).join(",")}}`),
    },
  ),
})).node;

/** A few keys shared by many messages, so that duplicates of the same key are common. */
const poolKey = fc.integer({ min: 0, max: 24 }).map((i) => `fz-${i}`);

/** JSON values poimen admits as input (no NUL, well-formed strings, finite numbers, shallow). */
const fineInput = fc.jsonValue({ maxDepth: 3, stringUnit: "grapheme" })
  .filter((v) => !JSON.stringify(v).includes("\\u0000"));

/** A request the API must admit: echo, fine input, keyed from the pool or keyless. */
const valid: fc.Arbitrary<Value> = fc.record({
  workflow: fc.constantFrom("echo", "echo@1"),
  input: fc.option(fineInput, { nil: undefined }),
  key: fc.option(poolKey, { nil: undefined }),
  explicitNull: fc.boolean(),
  goal: fc.option(fc.constantFrom("g1", "g2"), { nil: undefined }),
  pretty: fc.boolean(),
}).map((r) => {
  const body: Record<string, unknown> = { workflow_ref: r.workflow };
  if (r.input !== undefined) body.input = r.input;
  if (r.goal !== undefined) body.goal_id = r.goal;
  if (r.key !== undefined) body.dispatch_key = r.key;
  else if (r.explicitNull) body.dispatch_key = null;
  // Whitespace after the closing brace: the relay appends a derived key before it.
  const text = r.pretty ? JSON.stringify(body, null, 2) + "\n \t" : JSON.stringify(body);
  return {
    kind: r.key === undefined ? "valid-keyless" : "valid-keyed",
    value: utf8.encode(text),
    expect: "admitted" as const,
  };
});

/** A well-formed request naming a workflow no API knows: dead-lettered after the grace. */
const unknownWorkflow: fc.Arbitrary<Value> = fc.record({
  workflow: fc.constantFrom("no-such-workflow", "nope@1"),
  key: fc.option(poolKey, { nil: undefined }),
}).map((r) => ({
  kind: "unknown-workflow",
  value: utf8.encode(JSON.stringify({ workflow_ref: r.workflow, dispatch_key: r.key, input: 1 })),
  expect: "dead-lettered" as const,
  reason: "unknown-workflow",
}));

/** A value that is not UTF-8: a valid request with a stray byte sequence spliced in. */
const invalidUtf8: fc.Arbitrary<Value> = fc.tuple(
  valid,
  fc.constantFrom([0xff], [0xc3], [0xed, 0xa0, 0x80], [0xf8, 0x88, 0x80, 0x80, 0x80], [0x80]),
  fc.nat(),
).map(([v, bad, at]) => {
  const i = at % (v.value.length + 1);
  const value = new Uint8Array([...v.value.slice(0, i), ...bad, ...v.value.slice(i)]);
  return { kind: "invalid-utf8", value, expect: "dead-lettered" as const, reason: "bad-json" };
});

function parsesAsJson(value: Uint8Array): boolean {
  try {
    JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(value));
    return true;
  } catch {
    return false;
  }
}

/** UTF-8 text that is not JSON. */
const nonJson: fc.Arbitrary<Value> = fc.oneof(
  fc.constantFrom(
    "",
    "{",
    "hello",
    '{"workflow_ref":"echo"',
    "NaN",
    "undefined",
    "{'workflow_ref':'echo'}",
    "[1,]",
    '{"workflow_ref":"echo",}',
    "\ufeff\ufeff{}",
  ),
  fc.string({ unit: "grapheme", maxLength: 30 }),
).map((s) => utf8.encode(s)).filter((v) => !parsesAsJson(v)).map((value) => ({
  kind: "non-json",
  value,
  expect: "dead-lettered" as const,
  reason: "bad-json",
}));

/** JSON that is not an object: the API refuses it whatever it is. */
const nonObject: fc.Arbitrary<Value> = fc.oneof(
  fc.jsonValue({ maxDepth: 2 }).filter((v) =>
    typeof v !== "object" || v === null || Array.isArray(v)
  ).map((v) => JSON.stringify(v)),
  fc.constantFrom("[]", '[{"workflow_ref":"echo"}]', '"echo"', "1e400", "null", " 0 "),
).map((text) => ({
  kind: "json-non-object",
  value: utf8.encode(text),
  expect: "dead-lettered" as const,
}));

/** An object whose fields may be anything at all. */
const hostileObject: fc.Arbitrary<Value> = fc.record({
  workflow: fc.oneof(
    { weight: 3, arbitrary: fc.constant('"echo"') },
    { weight: 1, arbitrary: hostileJson },
    { weight: 1, arbitrary: fc.constant(undefined) },
  ),
  input: fc.option(hostileJson, { nil: undefined }),
  key: fc.oneof(
    fc.constant(undefined),
    fc.constant("null"),
    poolKey.map((k) => JSON.stringify(k)),
    hostileJson,
  ),
  goal: fc.option(hostileJson, { nil: undefined, freq: 3 }),
  extra: fc.option(fc.tuple(hostileString, hostileJson), { nil: undefined, freq: 3 }),
  duplicate: fc.boolean(),
}).map((r) => {
  const fields: string[] = [];
  if (r.workflow !== undefined) fields.push(`"workflow_ref":${r.workflow}`);
  if (r.input !== undefined) fields.push(`"input":${r.input}`);
  if (r.goal !== undefined) fields.push(`"goal_id":${r.goal}`);
  if (r.key !== undefined) fields.push(`"dispatch_key":${r.key}`);
  if (r.extra) fields.push(`${JSON.stringify(r.extra[0])}:${r.extra[1]}`);
  if (r.duplicate) fields.push(`"workflow_ref":"echo"`);
  return {
    kind: "hostile-object",
    value: utf8.encode(`{${fields.join(",")}}`),
    expect: "either" as const,
  };
});

/** Input the API must refuse with a 422: NUL, a lone surrogate, a number beyond a double. */
const invalidInput: fc.Arbitrary<Value> = fc.record({
  input: fc.constantFrom('"\\u0000"', '"a\\ud800b"', '{"k":"\\udc00"}', "1e400", "[-1e400]"),
  key: fc.option(poolKey, { nil: undefined }),
}).map((r) => ({
  kind: "invalid-input",
  value: utf8.encode(
    `{"workflow_ref":"echo","input":${r.input}` +
      (r.key ? `,"dispatch_key":${JSON.stringify(r.key)}}` : "}"),
  ),
  expect: "dead-lettered" as const,
  reason: "validation",
}));

/** Nesting around the API's documented depth limit (64), and far beyond it. */
const deep: fc.Arbitrary<Value> = fc.record({
  depth: fc.constantFrom(10, 62, 63, 64, 65, 66, 1_000, 100_000),
  open: fc.constantFrom("[", '{"k":'),
  key: fc.option(poolKey, { nil: undefined }),
}).map((r) => {
  const nested = r.open.repeat(r.depth) + "1" + (r.open === "[" ? "]" : "}").repeat(r.depth);
  const key = r.key ? `,"dispatch_key":${JSON.stringify(r.key)}` : "";
  return {
    kind: "deep",
    value: utf8.encode(`{"workflow_ref":"echo","input":${nested}${key}}`),
    expect: "either" as const,
  };
});

/** Bodies around the API's body limit (a keyless one grows by its derived key), and far over it. */
const huge: fc.Arbitrary<Value> = fc.record({
  size: fc.oneof(
    { weight: 4, arbitrary: fc.integer({ min: BODY_LIMIT - 200, max: BODY_LIMIT + 50 }) },
    { weight: 1, arbitrary: fc.integer({ min: 3 * BODY_LIMIT, max: 4 * BODY_LIMIT }) },
  ),
  keyed: fc.boolean(),
  char: fc.constantFrom("x", "é", "💩"),
}).map((r) => {
  const head = '{"workflow_ref":"echo","input":"';
  const tail = r.keyed ? `","dispatch_key":"huge-${r.size}"}` : '"}';
  const room = Math.max(0, r.size - head.length - tail.length);
  const fill = r.char.repeat(Math.floor(room / utf8.encode(r.char).length));
  const value = utf8.encode(head + fill + tail);
  return {
    kind: "huge",
    value,
    expect: value.length > 2 * BODY_LIMIT ? "dead-lettered" as const : "either" as const,
    reason: value.length > 2 * BODY_LIMIT ? "body-too-large" : undefined,
  };
});

/** Arbitrary bytes. */
const bytes: fc.Arbitrary<Value> = fc.uint8Array({ maxLength: 64 }).map((value) => ({
  kind: "bytes",
  value,
  expect: "either" as const,
}));

const messageValue: fc.Arbitrary<Value> = fc.oneof(
  { weight: 40, arbitrary: valid },
  { weight: 3, arbitrary: unknownWorkflow },
  { weight: 5, arbitrary: invalidUtf8 },
  { weight: 5, arbitrary: nonJson },
  { weight: 5, arbitrary: nonObject },
  { weight: 15, arbitrary: hostileObject },
  { weight: 5, arbitrary: invalidInput },
  { weight: 4, arbitrary: deep },
  { weight: 4, arbitrary: huge },
  { weight: 4, arbitrary: bytes },
);

/** A header value as a publisher may send it: Kafka headers are bytes, these are UTF-8 of anything. */
const headerGarbage = fc.oneof(
  fc.constantFrom(
    "",
    "garbage",
    "00-xyz",
    "\n",
    "a\r\nb",
    "\u0000",
    "💩",
    "é",
    "\ud800",
    "x".repeat(10_000),
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\u0000",
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\nx-evil: 1",
  ),
  fc.string({ unit: "binary", maxLength: 30 }),
);

const headers: fc.Arbitrary<Record<string, string>> = fc.record({
  traceparent: fc.oneof(
    { weight: 4, arbitrary: fc.constant(undefined) },
    {
      weight: 2,
      arbitrary: fc.constant("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    },
    { weight: 4, arbitrary: headerGarbage },
  ),
  tracestate: fc.option(headerGarbage, { nil: undefined, freq: 4 }),
  forged: fc.option(fc.constantFrom("poimen-dlq-reason", "poimen-dlq-offset"), {
    nil: undefined,
    freq: 8,
  }),
  other: fc.option(fc.tuple(hostileString, headerGarbage), { nil: undefined, freq: 4 }),
}).map((h) => {
  // fromEntries: a header named "__proto__" is a header, not a prototype.
  const out: [string, string][] = [];
  if (h.other) out.push(h.other);
  if (h.traceparent !== undefined) out.push(["traceparent", h.traceparent]);
  if (h.tracestate !== undefined) out.push(["tracestate", h.tracestate]);
  if (h.forged !== undefined) out.push([h.forged, "forged"]);
  return Object.fromEntries(out);
});

function generate(tenant: string): Generated[] {
  const message = fc.record({
    v: messageValue,
    headers,
    key: fc.oneof(
      { weight: 4, arbitrary: fc.constant(`${tenant}/k`) },
      { weight: 1, arbitrary: hostileString },
    ),
    partition: fc.nat(PARTITIONS - 1),
  });
  return fc.sample(message, { seed: SEED, numRuns: MESSAGES }).map((m) => ({
    kind: m.v.kind,
    value: m.v.value,
    expect: m.v.expect,
    reason: m.v.reason,
    headers: m.headers,
    key: m.key,
    partition: m.partition,
  }));
}

// ---------------------------------------------------------------- checks

/** The dispatch key a message is admitted under: its own, or the relay's derived one. */
function effectiveKey(value: Uint8Array, topic: string, partition: number, offset: bigint) {
  const parsed = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(value));
  const own = parsed.dispatch_key;
  return own === undefined || own === null ? `kafka:${topic}/${partition}/${offset}` : String(own);
}

/** Requests the API answered with a 5xx, whatever the route. */
function serverErrors(metrics: string): number {
  let n = 0;
  for (const line of metrics.split("\n")) {
    if (line.startsWith("poimen_http_requests_total{") && /status="5\d\d"/.test(line)) {
      n += Number(line.slice(line.lastIndexOf(" ") + 1));
    }
  }
  return n;
}

/** Splits `messages` into sends whose per-partition batches stay far below `max.message.bytes`. */
function chunks(messages: ProduceMessage[], maxBytes = 256 * 1024): ProduceMessage[][] {
  const out: ProduceMessage[][] = [];
  let current: ProduceMessage[] = [];
  let size = 0;
  for (const m of messages) {
    const b = recordBatchBytes(m);
    if (current.length > 0 && size + b > maxBytes) {
      out.push(current);
      current = [];
      size = 0;
    }
    current.push(m);
    size += b;
  }
  if (current.length > 0) out.push(current);
  return out;
}

Deno.test({
  name:
    "relay fuzz: every generated message is admitted once or dead-lettered with a reason, and the relay drains to the end",
  ...KAFKA_TEST,
  fn: async () => {
    const run = crypto.randomUUID().slice(0, 8);
    const tenant = `rf-${run}`;
    const topic = dispatchTopic(tenant);
    const groupId = `poimen-test-relay-fuzz-${run}`;
    const db = await freshDatabase();
    const admin = createAdmin({ brokers: [BROKER], clientId: "poimen-test" });
    const producer = createProducer({ brokers: [BROKER], clientId: "poimen-test" });
    let api: ApiProcess | undefined;
    let relay: PoimenProcess | undefined;
    let failed = true;
    try {
      const token = async (args: string[]) => {
        const out = await runCommand("token", args, { DATABASE_URL: db.url, LOG_LEVEL: "warn" });
        assert.equal(out.code, 0, out.stderr);
        return out.stdout.trim();
      };
      await token([tenant]);
      const serviceToken = await token(["--service", "relay"]);
      await ensureTenantTopics(admin, tenant, {
        partitions: PARTITIONS,
        replicationFactor: 1,
        retentionMs: 3_600_000,
      });
      api = await new ApiProcess({
        DATABASE_URL: db.url,
        BODY_LIMIT_BYTES: String(BODY_LIMIT),
      }).ready();
      relay = new PoimenProcess("relay", {
        KAFKA_BROKERS: BROKER,
        API_URL: api.url,
        RELAY_TOKEN: serviceToken,
        RELAY_GROUP_ID: groupId,
        RELAY_TENANT_PATTERN: tenant,
        RELAY_TOPIC_REFRESH_MS: "500",
        RELAY_LAG_INTERVAL_MS: "300",
        RELAY_COMMIT_INTERVAL_MS: "100",
        RELAY_BACKOFF_BASE_MS: "50",
        RELAY_BACKOFF_CAP_MS: "500",
        RELAY_SESSION_TIMEOUT_MS: "6000",
        // Unknown workflows are dead-lettered soon, not after a rolling deploy's 5 minutes.
        RELAY_UNKNOWN_WORKFLOW_GRACE_MS: "500",
        // "admitted" is a debug line: the per-message record of what the relay did.
        LOG_LEVEL: "debug",
      });

      const generated = generate(tenant);
      const messages = generated.map((g): ProduceMessage => ({
        topic,
        key: g.key,
        value: g.value,
        headers: g.headers,
        partition: g.partition,
      }));
      const at: TopicPartitionOffset[] = [];
      for (const chunk of chunks(messages)) at.push(...await producer.send(chunk));
      assert.equal(at.length, generated.length);

      // Drained: every partition's committed offset is its end offset.
      const ends = new Map(
        (await admin.endOffsets([topic])).map((o) => [o.partition, o.offset]),
      );
      await waitFor(
        "the relay committed every partition to its end",
        async () => {
          if (relay!.exited) throw new Error("the relay exited");
          const committed = await admin.committedOffsets(groupId, [topic]);
          return [...ends].every(([p, end]) =>
            committed.some((c) => c.partition === p && c.offset === end)
          );
        },
        DEADLINE,
        200,
      );
      assert.ok(!relay.exited, "the relay is alive");

      // What the relay did with each message: its "admitted" lines and the dead letters.
      const where = (p: number, o: bigint | string) => `${p}/${o}`;
      const admitted = new Map<string, number>();
      for (const line of relay.logs()) {
        if (!line.includes('"msg":"admitted"')) continue;
        const l = JSON.parse(line) as { topic: string; partition: number; offset: string };
        if (l.topic !== topic) continue;
        const w = where(l.partition, l.offset);
        admitted.set(w, (admitted.get(w) ?? 0) + 1);
      }
      const dlqEnd = (await admin.endOffsets([dlqTopic(tenant)]))
        .reduce((n, o) => n + Number(o.offset), 0);
      const { got: letters, consumer } = consume(dlqTopic(tenant));
      try {
        await waitFor(`${dlqEnd} dead letters`, () => letters.length >= dlqEnd, DEADLINE);
      } finally {
        await consumer.close();
      }
      const dead = new Map<string, { reason: string; count: number }>();
      for (const letter of letters) {
        const h = letter.headers;
        assert.equal(h["poimen-dlq-topic"], topic);
        const w = where(Number(h["poimen-dlq-partition"]), h["poimen-dlq-offset"]);
        const seen = dead.get(w);
        dead.set(w, { reason: h["poimen-dlq-reason"], count: (seen?.count ?? 0) + 1 });
      }

      const problems: string[] = [];
      const keys = new Map<string, string>();
      const counts: Record<string, { admitted: number; dead: number }> = {};
      generated.forEach((g, i) => {
        const w = where(at[i].partition, at[i].offset);
        const a = admitted.get(w) ?? 0;
        const d = dead.get(w);
        const what = `#${i} ${g.kind} at ${w} (${
          JSON.stringify(new TextDecoder().decode(g.value.slice(0, 120)))
        })`;
        const c = counts[g.kind] ??= { admitted: 0, dead: 0 };
        if (a > 0) c.admitted++;
        if (d) c.dead++;
        if (a > 1) problems.push(`${what}: admitted ${a} times`);
        if (d && d.count > 1) problems.push(`${what}: dead-lettered ${d.count} times`);
        if (a > 0 && d) problems.push(`${what}: admitted AND dead-lettered (${d.reason})`);
        if (a === 0 && !d) problems.push(`${what}: neither admitted nor dead-lettered`);
        if (d && !/^[a-z][a-z0-9-]*$/.test(d.reason ?? "")) {
          problems.push(`${what}: dead letter without a reason: ${d.reason}`);
        }
        if (g.expect === "admitted" && a === 0) {
          problems.push(`${what}: must be admitted, was dead-lettered (${d?.reason})`);
        }
        if (g.expect === "dead-lettered" && a > 0) {
          problems.push(`${what}: must be dead-lettered, was admitted`);
        }
        if (g.reason && d && d.reason !== g.reason) {
          problems.push(`${what}: dead-lettered as ${d.reason}, expected ${g.reason}`);
        }
        if (a > 0) keys.set(effectiveKey(g.value, topic, at[i].partition, at[i].offset), w);
      });
      for (const w of dead.keys()) {
        if (!at.some((o) => where(o.partition, o.offset) === w)) {
          problems.push(`a dead letter of ${w}, which was never published`);
        }
      }

      // Exactly one run per distinct key of an admitted message, and no other run.
      const runs = await db.sql<{ dispatch_key: string; n: number }[]>`
        select dispatch_key, count(*)::int as n from runs where tenant_id = ${tenant}
         group by dispatch_key`;
      for (const r of runs) {
        if (r.n !== 1) problems.push(`${r.n} runs for dispatch key ${r.dispatch_key}`);
        if (!keys.has(r.dispatch_key)) {
          problems.push(`a run for ${JSON.stringify(r.dispatch_key)}, no admitted message has it`);
        }
      }
      const runKeys = new Set(runs.map((r) => r.dispatch_key));
      for (const [key, w] of keys) {
        if (!runKeys.has(key)) {
          problems.push(`no run for ${JSON.stringify(key)} (admitted at ${w})`);
        }
      }

      const apiMetrics = await (await fetch(`${api.url}/metrics`)).text();
      if (serverErrors(apiMetrics) > 0) {
        problems.push(`the API answered ${serverErrors(apiMetrics)} requests with a 5xx`);
      }
      const relayMetrics = await (await fetch(`${relay.metricsUrl}/metrics`)).text();
      const finished = sampleValue(relayMetrics, "poimen_inbox_messages_total", {});
      if (finished !== generated.length) {
        problems.push(`the relay counted ${finished} messages finished, ${generated.length} sent`);
      }

      assert.deepEqual(
        problems,
        [],
        `FUZZ_SEED=${SEED} FUZZ_RUNS=${MESSAGES} reproduces this failure; outcomes by kind: ${
          JSON.stringify(counts)
        }`,
      );
      // Sanity of the generator: each certain outcome happened at least once.
      assert.ok(runs.length > 0 && dead.size > 0, JSON.stringify(counts));

      const status = await relay.stop();
      assert.equal(status.code, 0, "the relay stops cleanly");
      failed = false;
    } finally {
      if (failed && api) {
        console.error(`--- api logs (last 40 lines) ---`);
        console.error(api.logs().slice(-40).join("\n"));
      }
      if (failed && relay) {
        const file = await Deno.makeTempFile({ prefix: "relay-fuzz-", suffix: ".log" });
        await Deno.writeTextFile(file, relay.logs().join("\n") + "\n");
        console.error(`--- relay logs (all of them: ${file}) ---`);
        console.error(`--- relay logs (pauses, then the last 40 lines; FUZZ_SEED=${SEED}) ---`);
        const notable =
          /"msg":"(partition paused|partition resumed|offsets went backwards|partition revoked)/;
        console.error(relay.logs().filter((l) => notable.test(l)).join("\n"));
        console.error(
          relay.logs().filter((l) => !l.includes('"msg":"admitted"')).slice(-40).join("\n"),
        );
      }
      await relay?.stop("SIGKILL");
      await api?.stop();
      await producer.close();
      await admin.deleteTopics(tenantTopics(tenant)).catch(() => {});
      await admin.close();
      await db.drop();
    }
  },
});
