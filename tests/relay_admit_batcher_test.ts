/**
 * The relay's batches (relay/admit_batcher.ts) against a stub HTTP server
 * that answers as the API does: messages ready together go in one request
 * with each item's source and trace, each item's result becomes its own
 * outcome, an answer about the whole request is no verdict on a message,
 * and batches are cut by bytes and header size. The real API and Kafka are
 * in tests/it_inbox_relay_test.ts.
 */
import assert from "node:assert/strict";
import { ApiClient, type Outcome } from "../relay/api_client.ts";
import { type BatchItem, cut, MAX_SOURCES_HEADER } from "../relay/admit_batcher.ts";
import { parseItemSources } from "../contracts/run_batch.ts";
import { PROBLEM_BASE } from "../core/errors.ts";

interface Seen {
  sources: string | null;
  source: string | null;
  traceparent: string | null;
  body: unknown;
}

const problem = (code: string, status: number, retryable: boolean) => ({
  type: PROBLEM_BASE + code,
  title: code,
  status,
  detail: `because ${code}`,
  retryable,
});

/** A stub API: `answer` decides each request's answer from its parsed body. */
async function withApi(
  answer: (body: unknown, seen: Seen[]) => Response,
  fn: (client: ApiClient, seen: Seen[]) => Promise<void>,
  batch = { maxItems: 100, maxBytes: 512 * 1024, maxConcurrent: 1 },
): Promise<void> {
  const seen: Seen[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, async (req) => {
    const body = JSON.parse(await req.text());
    seen.push({
      sources: req.headers.get("poimen-sources"),
      source: req.headers.get("poimen-source"),
      traceparent: req.headers.get("traceparent"),
      body,
    });
    return answer(body, seen);
  });
  try {
    const client = new ApiClient({
      apiUrl: `http://127.0.0.1:${server.addr.port}`,
      token: "t0k",
      timeoutMs: 5000,
      batch,
    });
    await fn(client, seen);
  } finally {
    await server.shutdown();
  }
}

const json = (body: unknown, status: number, headers: Record<string, string> = {}) =>
  new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", ...headers },
  });

function message(n: number, value: string = `{"workflow_ref":"echo","input":${n}}`) {
  return {
    tenant: "acme",
    body: new TextEncoder().encode(value),
    source: `kafka:poimen.acme.dispatch/0/${n}`,
    traceparent: n % 2 === 0
      ? `00-${"ab".repeat(16)}-${String(n + 1).padStart(16, "0")}-01`
      : undefined,
  };
}

Deno.test("relay batches: messages ready together go in one request, each item its own outcome", async () => {
  // Item 2 is poison (validation, final), item 3 unknown (retried), item 4 over quota.
  await withApi((body) => {
    if (!Array.isArray(body)) return json({}, 201);
    return json(
      {
        results: body.map((item: { input: number }) => {
          if (item.input === 2) {
            return { outcome: "problem", status: 422, problem: problem("validation", 422, false) };
          }
          if (item.input === 3) {
            return {
              outcome: "problem",
              status: 422,
              problem: problem("unknown-workflow", 422, true),
            };
          }
          if (item.input === 4) {
            return {
              outcome: "problem",
              status: 429,
              problem: problem("too-many-runs", 429, true),
            };
          }
          return item.input === 1
            ? { outcome: "replayed", status: 200 }
            : { outcome: "created", status: 201 };
        }),
      },
      207,
      { "retry-after": "3" },
    );
  }, async (client, seen) => {
    const outcomes = await Promise.all([0, 1, 2, 3, 4].map((n) => client.admit(message(n))));
    assert.equal(seen.length, 1, "one request for the five");
    assert.equal(seen[0].source, null, "no Poimen-Source on a batch");
    assert.deepEqual(
      seen[0].body,
      [0, 1, 2, 3, 4].map((n) => ({ workflow_ref: "echo", input: n })),
    );
    const sources = parseItemSources(seen[0].sources ?? "", 5);
    assert.ok(typeof sources !== "string", String(sources));
    assert.deepEqual(
      sources,
      [0, 1, 2, 3, 4].map((n) => {
        const m = message(n);
        return m.traceparent
          ? { source: m.source, traceparent: m.traceparent }
          : { source: m.source };
      }),
    );
    assert.deepEqual(outcomes.map((o) => o.kind), [
      "created",
      "replayed",
      "permanent",
      "transient",
      "transient",
    ]);
    const [, , poison, unknown, quota] = outcomes as Extract<Outcome, { reason: string }>[];
    assert.equal(poison.reason, "validation");
    assert.equal(unknown.reason, "unknown-workflow");
    assert.equal(quota.kind === "transient" && quota.retryAfterMs, 3000);
  });
});

Deno.test("relay batches: a transient answer to the whole batch is every item's; a refusal sends each alone", async () => {
  await withApi((body) => {
    if (!Array.isArray(body)) {
      return (body as { input: number }).input === 1
        ? json(problem("validation", 422, false), 422)
        : json({}, 201);
    }
    // The first batch: 503; the second: refused as a whole (as a body over the API's limit).
    return json(
      problem("database-unavailable", 503, true),
      503,
      { "retry-after": "1" },
    );
  }, async (client, seen) => {
    const down = await Promise.all([0, 1, 2].map((n) => client.admit(message(n))));
    assert.equal(seen.length, 1);
    assert.ok(
      down.every((o) =>
        o.kind === "transient" && o.reason === "database-unavailable" && o.retryAfterMs === 1000
      ),
    );
  });

  await withApi(
    (body) =>
      Array.isArray(body)
        ? json(problem("body-too-large", 413, false), 413)
        : (body as { input: number }).input === 1
        ? json(problem("validation", 422, false), 422)
        : json({}, 201),
    async (client, seen) => {
      const outcomes = await Promise.all([0, 1, 2].map((n) => client.admit(message(n))));
      assert.equal(seen.length, 4, "the batch, then each message alone");
      assert.deepEqual(
        seen.slice(1).map((s) => s.source).sort(),
        [0, 1, 2].map((n) => message(n).source),
      );
      assert.deepEqual(outcomes.map((o) => o.kind), ["created", "permanent", "created"]);
    },
  );

  // A 207 that does not answer every item is no verdict either.
  await withApi(
    (body) => Array.isArray(body) ? json({ results: [] }, 207) : json({}, 201),
    async (client, seen) => {
      const outcomes = await Promise.all([0, 1].map((n) => client.admit(message(n))));
      assert.equal(seen.length, 3);
      assert.deepEqual(outcomes.map((o) => o.kind), ["created", "created"]);
    },
  );
});

Deno.test("relay batches: a value that is not an object goes alone; one message goes as a single request", async () => {
  await withApi(() => json({}, 201), async (client, seen) => {
    const array = { ...message(7, '[{"workflow_ref":"echo"}]'), alone: true };
    await Promise.all([client.admit(array), client.admit(message(8))]);
    assert.equal(seen.length, 2);
    assert.deepEqual(seen.map((s) => [s.source, s.sources]).sort(), [
      [array.source, null],
      [message(8).source, null],
    ]);
    assert.equal(
      seen.find((s) => s.source === message(8).source)?.traceparent,
      message(8).traceparent,
      "a message alone carries its own trace",
    );
  });
});

Deno.test("relay batches: cut by bytes of values and by the size of Poimen-Sources", () => {
  const item = (bytes: number, n: number): BatchItem => ({
    req: {
      tenant: "acme",
      body: new Uint8Array(bytes),
      source: `kafka:poimen.acme.dispatch/0/${n}`,
    },
    trace: { traceparent: `00-${"ab".repeat(16)}-${"cd".repeat(8)}-01` },
  });
  assert.deepEqual(
    cut([item(400, 1), item(400, 2), item(400, 3), item(2000, 4), item(10, 5)], 1000)
      .map((p) => p.map((i) => i.req.source.split("/").at(-1))),
    [["1", "2"], ["3"], ["4"], ["5"]],
  );
  const many = Array.from({ length: 300 }, (_, n) => item(10, n));
  const parts = cut(many, 1 << 20);
  assert.ok(parts.length > 1, "300 sources with traces do not fit one header");
  assert.equal(parts.flat().length, 300);
  for (const part of parts) {
    const header = part.map((i) => `${i.req.source} ${i.trace.traceparent}`).join(",");
    assert.ok(header.length <= MAX_SOURCES_HEADER, `${header.length} bytes`);
  }
});
