/**
 * The relay's pure parts, without Kafka or an API: the in-order offset
 * tracker, the classification of API answers, Retry-After, dead-letter
 * headers and the configuration.
 */
import assert from "node:assert/strict";
import { OffsetTracker } from "../relay/offsets.ts";
import {
  ApiClient,
  classify,
  derivedDispatchKey,
  notJson,
  PERMANENT_PROBLEMS,
  poimenProblem,
  prepareBody,
  problemDetail,
  retryDelay,
  traceHeaders,
} from "../relay/api_client.ts";
import { type ApiAnswer, problemFromAnswer } from "../client/http.ts";
import { RunRequest } from "../contracts/runs.ts";
import { deadLetter, DLQ_HEADERS, redriven, withoutDlqHeaders } from "../relay/dead_letter.ts";
import { readRelayConfig } from "../relay/config.ts";
import { ConfigError, type ErrorCode, ERRORS } from "../core/errors.ts";
import type { ConsumedMessage } from "../kafka/consumer.ts";

Deno.test("relay offsets: nothing committable until the first message is done", () => {
  const t = new OffsetTracker();
  assert.equal(t.committable, undefined);
  assert.equal(t.toCommit(), undefined);
  t.add(5n, 1000);
  assert.equal(t.toCommit(), undefined);
  assert.equal(t.pending, 1);
  assert.equal(t.oldestPendingTimestamp(), 1000);
  t.complete(5n);
  assert.equal(t.toCommit(), 6n);
  assert.equal(t.pending, 0);
  assert.equal(t.oldestPendingTimestamp(), undefined);
});

Deno.test("relay offsets: out-of-order completion commits only the contiguous prefix", () => {
  const t = new OffsetTracker();
  for (let o = 0n; o < 5n; o++) t.add(o, 100 + Number(o));
  t.complete(1n);
  t.complete(3n);
  assert.equal(t.toCommit(), undefined, "offset 0 is not done: nothing to commit");
  assert.equal(t.oldestPendingTimestamp(), 100);
  t.complete(0n);
  assert.equal(t.toCommit(), 2n, "0 and 1 done; 2 is not");
  assert.equal(t.oldestPendingTimestamp(), 102);
  t.committed(2n);
  assert.equal(t.toCommit(), undefined, "already committed");
  t.complete(2n);
  assert.equal(t.toCommit(), 4n, "2 and the earlier 3");
  t.complete(4n);
  assert.equal(t.toCommit(), 5n);
  assert.equal(t.pending, 0);
});

Deno.test("relay offsets: gaps in offsets (compaction, markers) are not waited for", () => {
  const t = new OffsetTracker();
  t.add(10n, 1);
  t.add(13n, 2);
  t.add(20n, 3);
  t.complete(13n);
  t.complete(10n);
  assert.equal(t.toCommit(), 14n);
  t.complete(20n);
  assert.equal(t.toCommit(), 21n);
});

Deno.test("relay offsets: completing twice or an unknown offset changes nothing", () => {
  const t = new OffsetTracker();
  t.add(0n, 1);
  t.add(1n, 2);
  t.complete(7n);
  t.complete(1n);
  t.complete(1n);
  assert.equal(t.toCommit(), undefined);
  assert.equal(t.pending, 1);
  t.complete(0n);
  assert.equal(t.toCommit(), 2n);
});

Deno.test("relay offsets: offsets must increase", () => {
  const t = new OffsetTracker();
  t.add(3n, 1);
  assert.throws(() => t.add(3n, 1), RangeError);
  assert.throws(() => t.add(2n, 1), RangeError);
  assert.equal(t.last, 3n);
});

Deno.test("relay offsets: a committed offset never goes back", () => {
  const t = new OffsetTracker();
  t.add(0n, 1);
  t.complete(0n);
  t.committed(1n);
  t.committed(0n);
  assert.equal(t.toCommit(), undefined);
});

Deno.test("relay offsets: forgetting after a failing offset keeps it and what is before", () => {
  const t = new OffsetTracker();
  for (let o = 10n; o < 16n; o++) t.add(o, Number(o));
  t.complete(10n);
  t.complete(13n);
  // 11 fails: 12..15 are let go (13 though done: it comes again and replays).
  assert.equal(t.forgetAfter(11n), 3);
  assert.equal(t.last, 11n);
  assert.equal(t.pending, 1);
  assert.equal(t.toCommit(), 11n);
  t.complete(13n);
  assert.equal(t.toCommit(), 11n, "a forgotten offset completes nothing");
  // Fetched again from 12: accepted, and nothing commits past 11 before it is done.
  t.add(12n, 12);
  t.add(13n, 13);
  t.complete(12n);
  t.complete(13n);
  assert.equal(t.toCommit(), 11n);
  t.complete(11n);
  assert.equal(t.toCommit(), 14n);
  assert.throws(() => t.forgetAfter(5n), RangeError, "never forget the committable prefix");
  assert.equal(t.forgetAfter(13n), 0);
  assert.equal(t.last, 13n);
});

Deno.test("relay offsets: forgetting after the head of a fully done prefix", () => {
  const t = new OffsetTracker();
  t.add(0n, 0);
  t.add(1n, 1);
  t.complete(0n);
  t.complete(1n);
  assert.equal(t.forgetAfter(1n), 0);
  assert.equal(t.last, 1n);
  t.add(2n, 2);
  assert.equal(t.forgetAfter(1n), 1);
  assert.equal(t.last, 1n);
  t.add(2n, 2);
  assert.equal(t.pending, 1);
});

Deno.test("relay offsets: many messages finishing in random order", () => {
  const t = new OffsetTracker();
  const n = 5000;
  for (let o = 0; o < n; o++) t.add(BigInt(o), o);
  const order = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [order[i], order[j]] = [order[j], order[i]];
  }
  const done = new Set<number>();
  for (const o of order) {
    t.complete(BigInt(o));
    done.add(o);
    let prefix = 0;
    while (done.has(prefix)) prefix++;
    const expected = prefix === 0 ? undefined : BigInt(prefix);
    assert.equal(t.committable, expected);
    if (prefix < n) assert.equal(t.oldestPendingTimestamp(), prefix);
  }
  assert.equal(t.toCommit(), BigInt(n));
});

const answer = (status: number, text: string): ApiAnswer => ({
  status,
  headers: new Headers(),
  text,
});

const problem = (code: string, retryable = false) =>
  JSON.stringify({ type: `https://poimen.dev/problems/${code}`, title: code, retryable });

Deno.test("relay outcomes: permanent only for a poimen problem known to be permanent", () => {
  const verdict = (status: number, body = "") =>
    classify(status, poimenProblem(answer(status, body)));
  assert.equal(verdict(201).kind, "created");
  assert.equal(verdict(200).kind, "replayed");
  assert.equal(verdict(202).kind, "created");
  for (
    const [status, code] of [
      [400, "bad-json"],
      [422, "validation"],
      // A value Postgres refused: the same message fails every time.
      [422, "invalid-data"],
      [413, "body-too-large"],
      [415, "unsupported-media-type"],
    ] as const
  ) {
    assert.deepEqual(verdict(status, problem(code)), { kind: "permanent", reason: code });
    // The same status without poimen's word on it, or marked retryable: not a verdict.
    assert.equal(verdict(status, "<html>nope</html>").kind, "transient", `${status} bare`);
    assert.equal(verdict(status, problem(code, true)).kind, "transient", `${code} retryable`);
  }
  // A wrong API_URL or a proxy: retried, never dead-lettered.
  for (const s of [400, 404, 405, 409, 413, 415, 422]) {
    assert.deepEqual(verdict(s, "Not Found"), { kind: "transient", reason: "unexpected-response" });
  }
  assert.deepEqual(verdict(404, '{"type":"about:blank","retryable":false}'), {
    kind: "transient",
    reason: "unexpected-response",
  });
  // A poimen 404 (a path prefix missing) is no verdict on the message either.
  assert.equal(verdict(404, problem("not-found")).reason, "not-found");
  // During a rolling deploy a new workflow may not be known everywhere yet.
  assert.deepEqual(verdict(422, problem("unknown-workflow")), {
    kind: "transient",
    reason: "unknown-workflow",
  });
  assert.equal(verdict(401, problem("unauthorized")).reason, "unauthorized");
  assert.equal(verdict(403, problem("forbidden")).reason, "forbidden");
  assert.equal(verdict(403).reason, "unexpected-response");
  assert.equal(verdict(408, problem("body-timeout", true)).reason, "body-timeout");
  assert.equal(verdict(429).reason, "unexpected-response");
  // A poimen code this relay does not know yet (a newer API): no unbounded label.
  assert.equal(verdict(429, problem("some-new-code", true)).reason, "unexpected-response");
  assert.equal(
    verdict(503, problem("database-unavailable", true)).reason,
    "database-unavailable",
  );
  assert.equal(verdict(503, problem("busy", true)).reason, "busy");
  assert.equal(verdict(500, problem("internal", true)).reason, "internal");
  assert.equal(verdict(502, "Bad Gateway").reason, "unexpected-response");
  assert.equal(verdict(302).reason, "unexpected-response");
  assert.equal(verdict(101).reason, "unexpected-response");
});

Deno.test("relay outcomes: every permanent code is a non-retryable 4xx of the error table", () => {
  assert.ok(PERMANENT_PROBLEMS.size > 0);
  for (const code of PERMANENT_PROBLEMS) {
    const kind = ERRORS[code as ErrorCode];
    assert.ok(kind, code);
    assert.equal(kind.retryable, false, code);
    assert.ok(kind.status >= 400 && kind.status < 500, code);
    assert.equal(classify(kind.status, { code, retryable: kind.retryable }).kind, "permanent");
  }
});

Deno.test("relay backoff: max(Retry-After, exponential with full jitter)", () => {
  const top = () => 0.999;
  const bottom = () => 0;
  // Without Retry-After: full jitter under a doubling ceiling, capped.
  assert.equal(retryDelay(1, undefined, 200, 30_000, bottom), 0);
  assert.equal(retryDelay(1, undefined, 200, 30_000, top), 199);
  assert.equal(retryDelay(2, undefined, 200, 30_000, top), 399);
  assert.equal(retryDelay(5, undefined, 200, 30_000, top), 3196);
  assert.equal(retryDelay(40, undefined, 200, 30_000, top), 29_970);
  // Retry-After is a floor, never the whole answer: a 503 with Retry-After: 1
  // on every try backs off beyond a second as the tries add up.
  const waits = [1, 2, 3, 4, 5, 6, 7, 8].map((a) => retryDelay(a, 1000, 200, 30_000, top));
  assert.ok(waits.every((w) => w >= 1000), String(waits));
  assert.deepEqual(waits.slice(0, 3), [1000, 1000, 1000]);
  assert.ok(waits[7] > 20_000, String(waits));
  for (let i = 1; i < waits.length; i++) assert.ok(waits[i] >= waits[i - 1], String(waits));
  assert.equal(retryDelay(3, 1000, 200, 30_000, bottom), 1000, "the floor holds at a zero draw");
  assert.equal(retryDelay(3, 0, 200, 30_000, top), 799);
  // The real jitter stays within its bounds.
  for (let i = 0; i < 1000; i++) {
    const w = retryDelay(6, 500, 100, 2000);
    assert.ok(w >= 500 && w < 2000, String(w));
  }
});

Deno.test("relay keys: a keyless message gets a key from its topic, partition and offset", () => {
  const enc = (s: string) => new TextEncoder().encode(s);
  const dec = (b: Uint8Array) => new TextDecoder().decode(b);
  const key = derivedDispatchKey("poimen.acme.dispatch", 2, 41n);
  assert.equal(key, "kafka:poimen.acme.dispatch/2/41");
  const posted = (value: string) => {
    const out = prepareBody(enc(value), key);
    assert.ok("body" in out, value);
    return { text: dec(out.body), derived: out.derivedKey };
  };
  // Keyed: verbatim, byte for byte.
  const keyed = '{"workflow_ref":"echo","input":{"n":1e400},"dispatch_key":"k1"}';
  assert.deepEqual(posted(keyed), { text: keyed, derived: undefined });
  // Keyless or null: the derived key, everything else untouched.
  const keyless = posted('{"workflow_ref":"echo", "input":{"big":12345678901234567890} }\n');
  assert.equal(keyless.derived, key);
  assert.equal(
    keyless.text,
    '{"workflow_ref":"echo", "input":{"big":12345678901234567890} ,' +
      '"dispatch_key":"kafka:poimen.acme.dispatch/2/41"}',
  );
  assert.equal(
    JSON.parse(posted('{"workflow_ref":"echo","dispatch_key":null}').text).dispatch_key,
    key,
  );
  assert.deepEqual(JSON.parse(posted("{ }").text), { dispatch_key: key });
  // Not an object: the API's to judge.
  assert.deepEqual(posted("[1,2]"), { text: "[1,2]", derived: undefined });
  assert.deepEqual(posted('"x"'), { text: '"x"', derived: undefined });
  // Not JSON: never posted.
  assert.ok("error" in prepareBody(enc("{nope"), key));
  assert.ok("error" in prepareBody(new Uint8Array([0x7b, 0xff, 0x7d]), key));
  // The longest tenant id still makes a key the admission schema accepts.
  const longest = derivedDispatchKey(
    `poimen.${"a".repeat(63)}.dispatch`,
    2 ** 31 - 1,
    2n ** 63n - 1n,
  );
  const parsed = RunRequest.safeParse({ workflow_ref: "echo", dispatch_key: longest });
  assert.ok(parsed.success, JSON.stringify(parsed.error));
});

Deno.test("relay outcomes: values that are not JSON are caught locally", () => {
  const enc = (s: string) => new TextEncoder().encode(s);
  assert.equal(notJson(enc('{"workflow_ref":"echo"}')), undefined);
  assert.equal(notJson(enc("[1,2]")), undefined, "JSON, if not a request: the API judges it");
  assert.match(notJson(enc("{nope"))!, /not JSON/);
  assert.match(notJson(enc(""))!, /not JSON/);
  assert.match(notJson(new Uint8Array([0x7b, 0xff, 0x7d]))!, /not UTF-8/);
});

Deno.test("relay outcomes: problem bodies become a reason and a short detail", () => {
  const summary = (status: number, text: string) => {
    const p = problemFromAnswer(answer(status, text));
    return {
      reason: p.code === "unexpected-response" ? undefined : p.code,
      detail: problemDetail(p),
    };
  };
  const p = summary(
    422,
    JSON.stringify({
      type: "https://poimen.dev/problems/validation",
      title: "Request does not match the schema",
      status: 422,
      detail: "the request does not match the schema",
      retryable: false,
      errors: [{ path: "workflow_ref", message: "expected string" }],
    }),
  );
  assert.equal(p.reason, "validation");
  assert.equal(p.detail, "the request does not match the schema: workflow_ref: expected string");
  const long = summary(400, "x".repeat(5000));
  assert.equal(long.reason, undefined);
  assert.ok(long.detail.length <= 500);
  assert.equal(summary(404, "").detail, "HTTP 404");
  // A stranger's "type" under poimen's URI is not a code.
  assert.equal(summary(400, problem("Not A Code")).reason, undefined);
});

Deno.test("relay trace headers: only a well-formed traceparent (and its tracestate) is passed on", () => {
  const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  assert.deepEqual(traceHeaders(parent, "congo=t61rcWkgMzE"), {
    traceparent: parent,
    tracestate: "congo=t61rcWkgMzE",
  });
  assert.deepEqual(traceHeaders(parent, undefined), { traceparent: parent });
  // A later version may append fields; version ff is invalid.
  assert.deepEqual(traceHeaders(`01${parent.slice(2)}-x`, undefined), {
    traceparent: `01${parent.slice(2)}-x`,
  });
  for (
    const bad of [
      "",
      "garbage",
      parent.toUpperCase(),
      ` ${parent}`,
      `${parent}\n`,
      `${parent}\r\nx-evil: 1`,
      `${parent}\u0000`,
      `${parent}-extra`,
      `ff${parent.slice(2)}`,
      "00-00000000000000000000000000000000-b7ad6b7169203331-01",
      "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
      "💩",
      "x".repeat(10_000),
    ]
  ) {
    // Without a valid traceparent, its tracestate means nothing either.
    assert.deepEqual(traceHeaders(bad, "a=b"), {}, JSON.stringify(bad.slice(0, 80)));
  }
  // A tracestate that is no valid header value, or too long, is dropped alone.
  for (const state of ["é", "💩", "a\nb", "\u0000", "x".repeat(513)]) {
    assert.deepEqual(traceHeaders(parent, state), { traceparent: parent });
  }
});

Deno.test("relay outcomes: the client classifies real HTTP answers", async () => {
  const answers: Record<string, () => Response> = {
    "/created": () => new Response("{}", { status: 201 }),
    "/replayed": () =>
      new Response("{}", { status: 200, headers: { "idempotent-replayed": "true" } }),
    "/unavailable": () =>
      new Response('{"type":"https://poimen.dev/problems/database-unavailable"}', {
        status: 503,
        headers: { "retry-after": "2" },
      }),
    "/unknown": () =>
      new Response(
        '{"type":"https://poimen.dev/problems/unknown-workflow","detail":"no workflow nope"}',
        { status: 422 },
      ),
    "/auth": () =>
      new Response(
        '{"type":"https://poimen.dev/problems/unauthorized","title":"no","retryable":false}',
        { status: 401, headers: { "content-type": "application/problem+json" } },
      ),
    "/schema": () =>
      new Response(
        '{"type":"https://poimen.dev/problems/validation","detail":"bad input","retryable":false}',
        { status: 422, headers: { "content-type": "application/problem+json" } },
      ),
    "/proxy-404": () => new Response("<html>Not Found</html>", { status: 404 }),
    "/proxy-502": () => new Response("Bad Gateway", { status: 502 }),
  };
  const seen: Record<string, string | null>[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, async (req) => {
    const prefix = new URL(req.url).pathname.replace(/\/v1\/runs$/, "");
    seen.push({
      auth: req.headers.get("authorization"),
      tenant: req.headers.get("poimen-tenant"),
      source: req.headers.get("poimen-source"),
      traceparent: req.headers.get("traceparent"),
      type: req.headers.get("content-type"),
      body: await req.text(),
    });
    return answers[prefix]();
  });
  try {
    const base = `http://127.0.0.1:${server.addr.port}`;
    const client = (path: string) =>
      new ApiClient({ apiUrl: base + path, token: "t0k", timeoutMs: 5000 });
    const req = {
      tenant: "acme",
      body: new TextEncoder().encode('{"workflow_ref":"echo"}'),
      source: "kafka:poimen.acme.dispatch/0/7",
      traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    };
    assert.deepEqual(await client("/created").admit(req), { kind: "created", status: 201 });
    assert.deepEqual(await client("/replayed").admit(req), { kind: "replayed", status: 200 });
    const unavailable = await client("/unavailable").admit(req);
    assert.equal(unavailable.kind, "transient");
    assert.equal(unavailable.kind === "transient" && unavailable.retryAfterMs, 2000);
    const unknown = await client("/unknown").admit(req);
    assert.deepEqual(unknown, {
      kind: "transient",
      reason: "unknown-workflow",
      status: 422,
      problem: "unknown-workflow",
      retryAfterMs: undefined,
      detail: "no workflow nope",
    });
    assert.deepEqual(await client("/schema").admit(req), {
      kind: "permanent",
      reason: "validation",
      status: 422,
      detail: "bad input",
    });
    const proxy404 = await client("/proxy-404").admit(req);
    assert.equal(proxy404.kind === "transient" && proxy404.reason, "unexpected-response");
    const proxy502 = await client("/proxy-502").admit(req);
    assert.equal(proxy502.kind === "transient" && proxy502.reason, "unexpected-response");
    const auth = await client("/auth").admit(req);
    assert.equal(auth.kind === "transient" && auth.reason, "unauthorized");
    assert.deepEqual(seen[0], {
      auth: "Bearer t0k",
      tenant: "acme",
      source: "kafka:poimen.acme.dispatch/0/7",
      traceparent: req.traceparent,
      type: "application/json",
      body: '{"workflow_ref":"echo"}',
    });
  } finally {
    await server.shutdown();
  }
  // Nothing listening: a transient network failure, not a throw.
  const gone = await new ApiClient({ apiUrl: "http://127.0.0.1:9", token: "t", timeoutMs: 2000 })
    .admit({ tenant: "acme", body: new Uint8Array([123, 125]), source: "s" });
  assert.equal(gone.kind === "transient" && gone.reason, "network");
});

Deno.test({
  name:
    "relay API client: no answer within the timeout is a transient timeout; a shutdown abort, during or before the call, is not",
  sanitizeOps: true,
  sanitizeResources: true,
  async fn() {
    const release = Promise.withResolvers<void>();
    const server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen() {} },
      async () => {
        await release.promise;
        return new Response(null, { status: 201 });
      },
    );
    const base = `http://127.0.0.1:${server.addr.port}`;
    const req = { tenant: "acme", body: new Uint8Array([123, 125]), source: "s" };
    try {
      const slow = await new ApiClient({ apiUrl: base, token: "t", timeoutMs: 100 }).admit(req);
      assert.equal(slow.kind === "transient" && slow.reason, "timeout");
      const stop = new AbortController();
      const client = new ApiClient({ apiUrl: base, token: "t", timeoutMs: 60_000 });
      const call = client.admit(req, stop.signal);
      stop.abort();
      const stopped = await call;
      assert.equal(stopped.kind === "transient" && stopped.reason, "network");
      const already = await client.admit(req, stop.signal);
      assert.equal(already.kind === "transient" && already.reason, "network");
    } finally {
      release.resolve();
      await server.shutdown();
    }
  },
});

Deno.test("relay dead letters: original key, value and headers plus the why and where", () => {
  const message: ConsumedMessage = {
    topic: "poimen.acme.dispatch",
    partition: 2,
    offset: 41n,
    key: "acme/k1",
    value: new TextEncoder().encode("{nope"),
    headers: { traceparent: "00-x-y-01", "poimen-dlq-reason": "stale" },
    timestamp: Date.parse("2026-01-01T00:00:00Z"),
  };
  const first = new Date("2026-01-01T00:00:01Z");
  const last = new Date("2026-01-01T00:00:02Z");
  const letter = deadLetter("acme", message, {
    reason: "bad-json",
    status: "none",
    detail: "the value is not JSON",
    attempts: 1,
    firstFailure: first,
    lastFailure: last,
  });
  assert.equal(letter.topic, "poimen.acme.dispatch.dlq");
  assert.equal(letter.key, "acme/k1");
  assert.equal(letter.value, message.value);
  assert.deepEqual(letter.headers, {
    traceparent: "00-x-y-01",
    [DLQ_HEADERS.reason]: "bad-json",
    [DLQ_HEADERS.status]: "none",
    [DLQ_HEADERS.detail]: "the value is not JSON",
    [DLQ_HEADERS.attempts]: "1",
    [DLQ_HEADERS.firstFailure]: "2026-01-01T00:00:01.000Z",
    [DLQ_HEADERS.lastFailure]: "2026-01-01T00:00:02.000Z",
    [DLQ_HEADERS.topic]: "poimen.acme.dispatch",
    [DLQ_HEADERS.partition]: "2",
    [DLQ_HEADERS.offset]: "41",
    [DLQ_HEADERS.timestamp]: "2026-01-01T00:00:00.000Z",
  });
  assert.deepEqual(withoutDlqHeaders(letter.headers!), { traceparent: "00-x-y-01" });
  const back = redriven("acme", { ...message, topic: letter.topic, headers: letter.headers! });
  assert.deepEqual(back, {
    topic: "poimen.acme.dispatch",
    key: "acme/k1",
    value: message.value,
    headers: { traceparent: "00-x-y-01" },
  });
});

Deno.test("relay config: defaults, and a missing token is one line naming it", () => {
  const c = readRelayConfig({ RELAY_TOKEN: "pmn_x" });
  assert.equal(c.API_URL, "http://127.0.0.1:8080");
  assert.equal(c.RELAY_GROUP_ID, "poimen-inbox-relay");
  assert.equal(c.RELAY_MAX_IN_FLIGHT, 256);
  assert.equal(c.RELAY_BATCH_MAX, 100);
  assert.equal(c.RELAY_BATCH_MAX_BYTES, 512 * 1024);
  assert.equal(c.RELAY_BATCH_CONCURRENCY, 4);
  assert.equal(c.RELAY_COMMIT_INTERVAL_MS, 200);
  assert.equal(c.RELAY_BACKOFF_BASE_MS, 200);
  assert.equal(c.RELAY_BACKOFF_CAP_MS, 30_000);
  assert.equal(c.RELAY_TOPIC_REFRESH_MS, 5000);
  assert.equal(c.RELAY_SHUTDOWN_MS, 10_000);
  assert.equal(c.RELAY_METRICS_PORT, 9465);
  assert.equal(c.RELAY_MAX_PENDING, 10_000);
  assert.equal(c.RELAY_MAX_PENDING_BYTES, 64 * 1024 * 1024);
  assert.equal(c.RELAY_UNKNOWN_WORKFLOW_GRACE_MS, 5 * 60_000);
  assert.throws(() => readRelayConfig({}), (e: unknown) => {
    assert.ok(e instanceof ConfigError);
    assert.match(e.message, /^config: RELAY_TOKEN is unset: /);
    assert.ok(!e.message.includes("\n"));
    return true;
  });
  assert.throws(
    () => readRelayConfig({ RELAY_TOKEN: "t", RELAY_MAX_IN_FLIGHT: "0" }),
    /RELAY_MAX_IN_FLIGHT/,
  );
  assert.throws(
    () => readRelayConfig({ RELAY_TOKEN: "t", RELAY_MAX_PENDING_BYTES: "lots" }),
    /RELAY_MAX_PENDING_BYTES/,
  );
});
