/**
 * The client's waits and event streams against a real API and worker:
 * `waitForRun` and `admitRun({ waitMs })` come back with the final run (or
 * the run as it is at the deadline); `followRun` yields each event once, in
 * order, across a cut connection and an API restart, and `break` frees the
 * API's stream at once. The event-stream parser and the answers the API
 * never gives on demand (a `busy` 503, an API that does not wait) are
 * checked against a local server.
 *
 *   deno test -A tests/client_wait_test.ts
 */
import assert from "node:assert/strict";
import { PoimenClient, type ReconnectInfo, type RunEvent } from "../client/http.ts";
import { EventStreamParser } from "../client/event_stream.ts";
import { PROBLEM_BASE } from "../core/errors.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, freePort, PoimenProcess, runCommand } from "./support/processes.ts";

/** An API process on a port chosen here, so a restarted API is found at the same URL. */
class PinnedApi extends ApiProcess {
  override readonly url: string;
  constructor(port: number, env: Record<string, string>) {
    super({ ...env, PORT: String(port) });
    this.url = `http://127.0.0.1:${port}`;
  }
}

/** Fast retries for tests; the defaults are for real networks. */
const QUICK = { baseDelayMs: 20, maxDelayMs: 200 };

interface Ctx {
  db: TestDatabase;
  api: PinnedApi;
  client: PoimenClient;
  token: string;
  /** Starts a worker hosting the built-in workflows (stopped at the end). */
  startWorker(): PoimenProcess;
  /** Starts another API on the same port (after the last one stopped). */
  restartApi(): Promise<PinnedApi>;
}

function liveTest(name: string, fn: (ctx: Ctx) => Promise<void>) {
  Deno.test({
    name: `client_wait: ${name}`,
    // The proxies' pipes end after the test's last assertion.
    sanitizeOps: false,
    sanitizeResources: false,
    fn: async () => {
      const db = await freshDatabase();
      const port = freePort();
      const start = () => new PinnedApi(port, { DATABASE_URL: db.url }).ready();
      const processes: PoimenProcess[] = [];
      try {
        const tenant = `cw-${crypto.randomUUID().slice(0, 8)}`;
        const out = await runCommand("token", [tenant], {
          DATABASE_URL: db.url,
          LOG_LEVEL: "warn",
        });
        assert.equal(out.code, 0, out.stderr);
        const token = out.stdout.trim();
        const api = await start();
        processes.push(api);
        const ctx: Ctx = {
          db,
          api,
          token,
          client: new PoimenClient({ url: api.url, token, retry: QUICK }),
          startWorker() {
            const worker = new PoimenProcess("worker", {
              DATABASE_URL: db.url,
              WORKER_POLL_MS: "50",
              WORKER_RETRY_BASE_MS: "50",
              LOG_LEVEL: "warn",
            });
            processes.push(worker);
            return worker;
          },
          async restartApi() {
            const next = await start();
            processes.push(next);
            ctx.api = next;
            return next;
          },
        };
        await fn(ctx);
      } finally {
        for (const p of processes) await p.stop("SIGKILL");
        await db.drop();
      }
    },
  });
}

async function collect(events: AsyncIterable<RunEvent>, into: RunEvent[] = []) {
  for await (const event of events) into.push(event);
  return into;
}

/** Seqs 1..n, each once: no gap, no repeat. */
function assertGapless(events: RunEvent[]) {
  assert.deepEqual(events.map((e) => e.seq), events.map((_, i) => i + 1), JSON.stringify(events));
}

liveTest("waitForRun resolves with the succeeded run and its result", async (ctx) => {
  ctx.startWorker();
  const { run } = await ctx.client.admitRun({ workflow_ref: "sleep", input: { ms: 300 } });
  assert.equal(run.status, "queued");
  const done = await ctx.client.waitForRun(run.run_id, { timeoutMs: 30_000 });
  assert.equal(done.status, "succeeded");
  assert.deepEqual(done.result, { slept_ms: 300 });
  assert.ok(done.finished_at !== null);
});

liveTest("waitForRun on a long run resolves with the run as it is at the deadline", async (ctx) => {
  ctx.startWorker();
  const { run } = await ctx.client.admitRun({ workflow_ref: "sleep", input: { ms: 60_000 } });
  await waitFor(
    "the run started",
    async () => (await ctx.client.getRun(run.run_id)).status === "running",
  );
  const started = Date.now();
  const now = await ctx.client.waitForRun(run.run_id, { timeoutMs: 2_000 });
  const took = Date.now() - started;
  assert.equal(now.status, "running");
  assert.ok(took >= 1_500 && took < 4_000, `took ${took} ms`);
  await ctx.client.cancelRun(run.run_id);
  assert.equal(
    (await ctx.client.waitForRun(run.run_id, { timeoutMs: 30_000 })).status,
    "cancelled",
  );
});

liveTest("admitRun with waitMs answers once the run is final, in one call", async (ctx) => {
  ctx.startWorker();
  const ok = await ctx.client.admitRun(
    { workflow_ref: "sleep", input: { ms: 300 } },
    { idempotent: true, waitMs: 30_000 },
  );
  assert.equal(ok.attempts, 1);
  assert.equal(ok.created, true);
  assert.equal(ok.run.status, "succeeded");
  assert.deepEqual(ok.run.result, { slept_ms: 300 });

  // Fails more times than it may try: failed after its 3 attempts.
  const bad = await ctx.client.admitRun(
    { workflow_ref: "fail", input: { times: 5 } },
    { waitMs: 30_000 },
  );
  assert.equal(bad.attempts, 1);
  assert.equal(bad.run.status, "failed");
  assert.equal(bad.run.attempts, 3);
  assert.equal(bad.run.max_attempts, 3);

  // The same key again: a replay, waited for too, still one run.
  const again = await ctx.client.admitRun(
    { workflow_ref: "sleep", input: { ms: 300 }, dispatch_key: ok.dispatchKey },
    { waitMs: 5_000 },
  );
  assert.equal(again.replayed, true);
  assert.equal(again.run.run_id, ok.run.run_id);
  assert.equal(again.run.status, "succeeded");
});

liveTest("followRun yields admitted, started, succeeded in order, then ends", async (ctx) => {
  ctx.startWorker();
  const { run } = await ctx.client.admitRun({ workflow_ref: "sleep", input: { ms: 300 } });
  const events = await collect(ctx.client.followRun(run.run_id));
  assert.deepEqual(events.map((e) => e.type), ["run.admitted", "run.started", "run.succeeded"]);
  assertGapless(events);
  // A finished run's stream gives what it has and ends; `after` skips the seen ones.
  const rest = await collect(ctx.client.followRun(run.run_id, { after: 1 }));
  assert.deepEqual(rest.map((e) => e.seq), [2, 3]);
});

/**
 * A TCP proxy to `port` that records each request's head and cuts the first
 * connection right after the first event of its stream passed.
 */
function cuttingProxy(port: number): { url: string; requests: string[]; close(): void } {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const requests: string[] = [];
  const bytes = new TextDecoder("latin1");
  const ignore = () => {};
  let connections = 0;
  void (async () => {
    for await (const conn of listener) {
      const cut = connections++ === 0;
      void (async () => {
        const upstream = await Deno.connect({ hostname: "127.0.0.1", port });
        void (async () => {
          const writer = upstream.writable.getWriter();
          let head = "";
          for await (const chunk of conn.readable) {
            if (!head.includes("\r\n\r\n")) {
              head += bytes.decode(chunk);
              if (head.includes("\r\n\r\n")) requests.push(head);
            }
            await writer.write(chunk);
          }
        })().catch(ignore);
        if (!cut) return void upstream.readable.pipeTo(conn.writable).catch(ignore);
        let got = new Uint8Array(0);
        for await (const chunk of upstream.readable) {
          got = new Uint8Array([...got, ...chunk]);
          const text = bytes.decode(got);
          const first = text.indexOf("id: 1\n");
          const end = first === -1 ? -1 : text.indexOf("\n\n", first);
          if (end === -1) continue;
          const writer = conn.writable.getWriter();
          await writer.write(got.slice(0, end + 2));
          break;
        }
        for (const c of [conn, upstream]) {
          try {
            c.close();
          } catch { /* closed by a pipe already */ }
        }
      })().catch(ignore);
    }
  })().catch(ignore);
  const { port: own } = listener.addr as Deno.NetAddr;
  return { url: `http://127.0.0.1:${own}`, requests, close: () => listener.close() };
}

liveTest(
  "followRun resumes a cut connection with Last-Event-ID: no gap, no repeat",
  async (ctx) => {
    const proxy = cuttingProxy(Number(new URL(ctx.api.url).port));
    try {
      // No worker yet: the run waits, so the cut comes after `run.admitted` alone.
      const { run } = await ctx.client.admitRun({ workflow_ref: "sleep", input: { ms: 300 } });
      const client = new PoimenClient({ url: proxy.url, token: ctx.token, retry: QUICK });
      const reconnects: ReconnectInfo[] = [];
      const events: RunEvent[] = [];
      const following = collect(
        client.followRun(run.run_id, { onReconnect: (r) => reconnects.push(r) }),
        events,
      );
      await waitFor(
        "the stream resumed",
        () => reconnects.length >= 1 && proxy.requests.length >= 2,
      );
      assert.deepEqual(
        events.map((e) => e.type),
        ["run.admitted"],
      );
      ctx.startWorker();
      await following;
      assert.deepEqual(events.map((e) => e.type), ["run.admitted", "run.started", "run.succeeded"]);
      assertGapless(events);
      assert.equal(reconnects[0].after, 1);
      assert.ok(reconnects[0].error instanceof Error, String(reconnects[0].error));
      assert.doesNotMatch(proxy.requests[0], /last-event-id/i);
      assert.match(proxy.requests[1], /\r\nlast-event-id: 1\r\n/i);
      assert.match(proxy.requests[1], /\r\naccept: text\/event-stream\r\n/i);
    } finally {
      proxy.close();
    }
  },
);

liveTest("followRun carries on across an API restart (SIGTERM, then a new API)", async (ctx) => {
  const { run } = await ctx.client.admitRun({ workflow_ref: "sleep", input: { ms: 300 } });
  const reconnects: ReconnectInfo[] = [];
  const events: RunEvent[] = [];
  const following = collect(
    ctx.client.followRun(run.run_id, {
      maxAttempts: 1_000,
      onReconnect: (r) => reconnects.push(r),
    }),
    events,
  );
  await waitFor("run.admitted", () => events.length === 1);
  const status = await ctx.api.stop("SIGTERM");
  assert.equal(status.code, 0, ctx.api.logs().join("\n"));
  await ctx.restartApi();
  ctx.startWorker();
  await following;
  assert.deepEqual(events.map((e) => e.type), ["run.admitted", "run.started", "run.succeeded"]);
  assertGapless(events);
  // A stopping API ends its streams: a clean end without the final event, so the client asked
  // for the run (through the restart) and, finding it not final, connected again.
  assert.equal(reconnects[0].error, undefined);
  assert.ok(reconnects.every((r) => r.after >= 1));
});

liveTest("breaking out of followRun closes the API's stream; a signal rejects it", async (ctx) => {
  const { run } = await ctx.client.admitRun({ workflow_ref: "sleep", input: { ms: 300 } });
  for await (const event of ctx.client.followRun(run.run_id)) {
    assert.equal(event.type, "run.admitted");
    assert.equal(await ctx.api.metric("poimen_run_watchers"), 1);
    break;
  }
  await waitFor(
    "the stream's slot freed",
    async () => (await ctx.api.metric("poimen_run_watchers")) === 0,
  );

  // return() while a next() waits (nothing comes: no worker) ends both.
  const iterator = ctx.client.followRun(run.run_id, { after: 1 });
  const pending = iterator.next();
  await waitFor("the stream open", async () => (await ctx.api.metric("poimen_run_watchers")) === 1);
  await iterator.return!();
  assert.deepEqual(await pending, { done: true, value: undefined });
  await waitFor(
    "the slot freed again",
    async () => (await ctx.api.metric("poimen_run_watchers")) === 0,
  );

  const abort = new AbortController();
  const seen: RunEvent[] = [];
  const aborted = collect(ctx.client.followRun(run.run_id, { signal: abort.signal }), seen);
  await waitFor("the first event", () => seen.length === 1);
  abort.abort(new Error("caller gave up"));
  await assert.rejects(aborted, /caller gave up/);

  const missing = await collect(ctx.client.followRun(crypto.randomUUID())).catch((e) => e);
  assert.equal(missing.code, "not-found");
});

Deno.test("client_wait: the event-stream parser splits lines and fields as the standard says", () => {
  const parser = new EventStreamParser();
  const text = 'retry: 2000\n\n: keep-alive\n\nid: 1\nevent: a\ndata: {"x":\ndata:1}\n\n' +
    "data: no id\r\n\r\nid: 3\revent: c\rdata:  two spaces\r\r" +
    "event: dropped\nid: 4\n\ndata\n\nid\ndata: after\n\n";
  const events = [];
  // Every split of the text, one character at a time, must give the same events.
  for (const c of text) events.push(...parser.push(c));
  assert.deepEqual(events, [
    { event: "a", data: '{"x":\n1}', lastEventId: "1" },
    { event: "message", data: "no id", lastEventId: "1" },
    { event: "c", data: " two spaces", lastEventId: "3" },
    { event: "message", data: "", lastEventId: "4" },
    { event: "message", data: "after", lastEventId: "" },
  ]);
  assert.equal(parser.retryMs, 2000);
  // CRLF split across chunks is one line end, not two.
  const split = new EventStreamParser();
  assert.deepEqual(split.push("data: x\r"), []);
  assert.deepEqual(split.push("\ndata: y\r"), []);
  assert.deepEqual(split.push("\r"), [{ event: "message", data: "x\ny", lastEventId: "" }]);
  // An event the stream did not finish is not dispatched.
  assert.deepEqual(new EventStreamParser().push("data: cut"), []);
});

/** A local server answering from `answers` in turn (the last one repeats), keeping requests. */
function scripted(answers: ((req: Request) => Response)[]) {
  const requests: { headers: Headers }[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (req) => {
    requests.push({ headers: new Headers(req.headers) });
    return answers[Math.min(requests.length - 1, answers.length - 1)](req);
  });
  return { url: `http://127.0.0.1:${server.addr.port}`, requests, close: () => server.shutdown() };
}

const RUN = { run_id: "r", status: "running" };

Deno.test("client_wait: an API that does not wait is asked once a second, not in a loop", async () => {
  const server = scripted([() => Response.json(RUN)]);
  try {
    const client = new PoimenClient({ url: server.url, token: "t" });
    const started = Date.now();
    const run = await client.waitForRun("r", { timeoutMs: 2_500 });
    assert.equal(run.status, "running");
    assert.ok(Date.now() - started >= 2_000);
    assert.ok(server.requests.length <= 4, `${server.requests.length} requests`);
    assert.equal(server.requests[0].headers.get("prefer"), "wait=3");
  } finally {
    await server.close();
  }
});

Deno.test("client_wait: followRun retries a busy 503, drops repeats and ends after the final event", async () => {
  const event = (seq: number, type: string) =>
    `id: ${seq}\r\nevent: ${type}\r\ndata: ${JSON.stringify({ seq, type, payload: {} })}\r\n\r\n`;
  const busy = () =>
    new Response(
      JSON.stringify({ type: PROBLEM_BASE + "busy", title: "busy", status: 503, retryable: true }),
      { status: 503, headers: { "content-type": "application/problem+json", "retry-after": "0" } },
    );
  const stream = () =>
    new Response(
      "retry: 2000\r\n\r\n" + event(1, "run.admitted") + ": keep-alive\r\n\r\n" +
        event(1, "run.admitted") + event(2, "run.started") + event(3, "run.failed"),
      { headers: { "content-type": "text/event-stream; charset=utf-8" } },
    );
  const server = scripted([busy, stream]);
  try {
    const client = new PoimenClient({ url: server.url, token: "t", retry: QUICK });
    const events = await collect(client.followRun("r"));
    assert.deepEqual(events.map((e) => e.type), ["run.admitted", "run.started", "run.failed"]);
    assert.equal(server.requests.length, 2);
    assert.equal(server.requests[1].headers.get("accept"), "text/event-stream");
  } finally {
    await server.close();
  }
});
