/**
 * client/http.ts against a real API process (and, for the retry rules that
 * need answers the API never gives on demand, a small local HTTP server):
 * retries keep one dispatch_key so a call survives an API crash and a lost
 * answer with exactly one run; problems arrive typed; paging sees every run
 * once; the module loads nothing but dependency-free code.
 *
 *   deno test -A tests/client_http_test.ts
 */
import assert from "node:assert/strict";
import {
  MAX_RETRY_AFTER_MS,
  parseRetryAfter,
  PoimenClient,
  PoimenNetworkError,
  PoimenProblem,
  problemFromAnswer,
  type RetryInfo,
  signalRun,
} from "../client/http.ts";
import { PROBLEM_BASE } from "../core/errors.ts";
import { UUID_PATTERN } from "../core/uuid.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, freePort, newToken } from "./support/processes.ts";
import { PROJECT_ROOT } from "../dev/tasks.ts";

/** An API process on a port chosen here, so a restarted API is found at the same URL. */
class PinnedApi extends ApiProcess {
  override readonly url: string;
  constructor(port: number, env: Record<string, string>) {
    super({ ...env, PORT: String(port) });
    this.url = `http://127.0.0.1:${port}`;
  }
}

async function runsWithKey(db: TestDatabase, tenant: string, key: string) {
  return await db.sql<{ run_id: string }[]>`
    select run_id from runs where tenant_id = ${tenant} and dispatch_key = ${key}`;
}

/** Fast retries for tests; the defaults are for real networks. */
const QUICK = { baseDelayMs: 20, maxDelayMs: 200 };

interface Ctx {
  db: TestDatabase;
  tenant: string;
  token: string;
  port: number;
  api: PinnedApi;
  /** Starts another API on the same port (after the last one stopped). */
  restartApi(): Promise<PinnedApi>;
}

function apiTest(name: string, fn: (ctx: Ctx) => Promise<void>) {
  Deno.test(`client_http: ${name}`, async () => {
    const db = await freshDatabase();
    const tenant = `ch-${crypto.randomUUID().slice(0, 8)}`;
    const port = freePort();
    const start = () => new PinnedApi(port, { DATABASE_URL: db.url }).ready();
    const apis: PinnedApi[] = [];
    try {
      const token = await newToken(db.url, tenant);
      apis.push(await start());
      const ctx: Ctx = {
        db,
        tenant,
        token,
        port,
        api: apis[0],
        async restartApi() {
          const api = await start();
          apis.push(api);
          ctx.api = api;
          return api;
        },
      };
      await fn(ctx);
    } finally {
      for (const api of apis) await api.stop("SIGKILL");
      await db.drop();
    }
  });
}

apiTest(
  "admitRun survives an API crash mid-call and a restart: exactly one run",
  async ({ db, tenant, token, api, restartApi }) => {
    const key = `restart-${crypto.randomUUID()}`;
    // A transaction holding the key keeps the API's insert waiting, so the
    // crash below lands while the request is in flight, not between calls.
    const inserted = Promise.withResolvers<void>();
    const release = Promise.withResolvers<void>();
    const holder = db.sql.begin(async (tx) => {
      await tx`insert into runs (tenant_id, run_id, workflow_ref, workflow_name, workflow_version,
                                 input, dispatch_key, source, max_attempts)
               values (${tenant}, ${crypto.randomUUID()}, 'echo', 'echo', 1, '{}', ${key}, 'test', 3)`;
      inserted.resolve();
      await release.promise;
      throw new Error("roll back");
    }).catch(() => {});
    await inserted.promise;

    const client = new PoimenClient({ url: api.url, token });
    const retries: RetryInfo[] = [];
    const call = client.admitRun(
      { workflow_ref: "echo", input: { n: 1 }, dispatch_key: key },
      { ...QUICK, maxAttempts: 10_000, deadlineMs: 120_000, onRetry: (r) => retries.push(r) },
    );
    await waitFor("the admission in flight, waiting on the held key", async () => {
      const [r] = await db.sql`
        select count(*)::int as n from pg_stat_activity
         where datname = current_database() and wait_event_type = 'Lock'
           and application_name = 'poimen-api'`;
      return r.n === 1;
    });
    assert.equal(retries.length, 0);

    await api.stop("SIGKILL");
    // Retrying against a port nobody listens on any more.
    await waitFor("the client retrying after the crash", () => retries.length >= 3);
    release.resolve();
    await holder;
    await restartApi();

    const result = await call;
    assert.ok(result.attempts >= 4, `attempts: ${result.attempts}`);
    assert.ok(retries.every((r) => r.error instanceof PoimenNetworkError), "only network errors");
    assert.equal(result.dispatchKey, key);
    assert.equal(result.run.dispatch_key, key);
    assert.deepEqual(result.run.input, undefined, "the POST answer carries no input");
    // The crashed API's orphaned statement may or may not have committed its
    // run before the new API answered: either way there is one run, and the
    // call returns it.
    assert.ok(result.created || result.replayed);
    const rows = await runsWithKey(db, tenant, key);
    assert.equal(rows.length, 1);
    assert.equal(result.run.run_id, rows[0].run_id);
    assert.equal((await client.getRun(result.run.run_id)).input !== undefined, true);
  },
);

/**
 * A TCP proxy to `port` that lets the first connection's request through,
 * waits for the start of the answer (the API has done its work), then cuts
 * the connection instead of passing the answer on: a lost response.
 */
function lossyProxy(port: number): { url: string; close(): void } {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  let connections = 0;
  const ignore = () => {};
  void (async () => {
    for await (const conn of listener) {
      const drop = connections++ === 0;
      void (async () => {
        const upstream = await Deno.connect({ hostname: "127.0.0.1", port });
        conn.readable.pipeTo(upstream.writable).catch(ignore);
        if (!drop) return void upstream.readable.pipeTo(conn.writable).catch(ignore);
        const reader = upstream.readable.getReader();
        await reader.read();
        for (const c of [conn, upstream]) {
          try {
            c.close();
          } catch { /* closed by a pipe already */ }
        }
      })().catch(ignore);
    }
  })().catch(ignore);
  const { port: own } = listener.addr as Deno.NetAddr;
  return { url: `http://127.0.0.1:${own}`, close: () => listener.close() };
}

Deno.test({
  name:
    "client_http: with { idempotent: true } a lost answer is retried with the same generated key",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const db = await freshDatabase();
    const api = new ApiProcess({ DATABASE_URL: db.url });
    const proxy = lossyProxy(Number(new URL(api.url).port));
    try {
      const tenant = `ch-${crypto.randomUUID().slice(0, 8)}`;
      const token = await newToken(db.url, tenant);
      await api.ready();
      const client = new PoimenClient({ url: proxy.url, token });
      const retries: RetryInfo[] = [];
      const result = await client.admitRun(
        { workflow_ref: "echo", input: { lost: true } },
        { ...QUICK, idempotent: true, onRetry: (r) => retries.push(r) },
      );
      assert.equal(retries.length, 1);
      assert.ok(retries[0].error instanceof PoimenNetworkError, String(retries[0].error));
      assert.equal(result.attempts, 2);
      assert.match(result.dispatchKey ?? "", UUID_PATTERN);
      // The first attempt made the run; the second was told so.
      assert.equal(result.replayed, true);
      assert.equal(result.created, true, "nobody else knows a generated key");
      assert.equal(result.bodyMismatch, false);
      assert.equal(result.run.dispatch_key, result.dispatchKey);
      const [{ n }] = await db.sql`select count(*)::int as n from runs where tenant_id = ${tenant}`;
      assert.equal(n, 1);
    } finally {
      proxy.close();
      await api.stop("SIGKILL");
      await db.drop();
    }
  },
});

Deno.test({
  name:
    "client_http: signal keeps one generated signal_id across a lost answer: one signal; replays, 404, 409 and 422 typed",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const db = await freshDatabase();
    const api = new ApiProcess({ DATABASE_URL: db.url });
    const proxy = lossyProxy(Number(new URL(api.url).port));
    try {
      const tenant = `ch-${crypto.randomUUID().slice(0, 8)}`;
      const token = await newToken(db.url, tenant);
      await api.ready();
      const direct = new PoimenClient({ url: api.url, token });
      // No worker runs here: the run stays queued, its mailbox holds what is sent.
      const { run } = await direct.admitRun({ workflow_ref: "echo" }, { idempotent: true });
      const lossy = new PoimenClient({ url: proxy.url, token });
      const retries: RetryInfo[] = [];
      const sent = await lossy.signal(run.run_id, { name: "approval", payload: { ok: true } }, {
        ...QUICK,
        onRetry: (r) => retries.push(r),
      });
      assert.equal(retries.length, 1);
      assert.ok(retries[0].error instanceof PoimenNetworkError, String(retries[0].error));
      // The first attempt stored it; the retry, with the same id, was told so.
      assert.equal(sent.replayed, true);
      assert.equal(sent.created, true, "nobody else knows a generated signal_id");
      assert.match(sent.signal.signal_id, UUID_PATTERN);
      assert.equal(sent.signal.run_id, run.run_id);
      assert.equal(sent.signal.name, "approval");
      assert.equal(sent.signal.run_status, "queued");
      const stored = async () =>
        await db.sql<{ signal_id: string; payload: unknown }[]>`
          select signal_id, payload from run_signals
           where tenant_id = ${tenant} and run_id = ${run.run_id} order by n`;
      assert.deepEqual((await stored()).map((r) => [r.signal_id, r.payload]), [
        [sent.signal.signal_id, { ok: true }],
      ]);
      // A given id: new, then a replay; the function form is the same call.
      const given = { name: "approval", payload: 2, signal_id: "s-given" };
      const first = await direct.signal(run.run_id, given);
      assert.deepEqual([first.created, first.replayed], [true, false]);
      const again = await signalRun(direct, run.run_id, given);
      assert.deepEqual([again.created, again.replayed], [false, true]);
      assert.equal(again.signal.received_at, first.signal.received_at);
      assert.equal((await stored()).length, 2);
      const [{ received }] = await db.sql<{ received: number }[]>`
        select count(*)::int as received from work_events
         where tenant_id = ${tenant} and run_id = ${run.run_id} and type = 'signal.received'`;
      assert.equal(received, 2);

      const refused = async (runId: string, body: { name: string }, status: number) => {
        const err = await direct.signal(runId, body, QUICK).catch((e) => e);
        assert.ok(err instanceof PoimenProblem, String(err));
        assert.equal(err.status, status, err.message);
        return err;
      };
      assert.equal((await refused(crypto.randomUUID(), { name: "a" }, 404)).code, "not-found");
      const invalid = await refused(run.run_id, { name: "a#b" }, 422);
      assert.equal(invalid.errors[0]?.path, "name");
      await db.sql`update runs set status = 'succeeded', finished_at = now()
                    where tenant_id = ${tenant} and run_id = ${run.run_id}`;
      assert.equal((await refused(run.run_id, { name: "late" }, 409)).code, "run-finished");
      assert.equal((await stored()).length, 2, "nothing stored by a refused signal");
    } finally {
      proxy.close();
      await api.stop("SIGKILL");
      await db.drop();
    }
  },
});

apiTest(
  "admitRuns: one request, each item's result in order; idempotent keys every item",
  async ({ db, tenant, api, token }) => {
    const client = new PoimenClient({ url: api.url, token, retry: QUICK });
    const key = `batch-${crypto.randomUUID()}`;
    const results = await client.admitRuns([
      { workflow_ref: "echo", input: { n: 1 }, dispatch_key: key },
      { workflow_ref: "nowhere" },
      { workflow_ref: "echo", input: { n: 2 }, dispatch_key: key },
      { workflow_ref: "echo", input: { n: 3 } },
    ], { idempotent: true });
    assert.deepEqual(results.map((r) => [r.outcome, r.status]), [
      ["created", 201],
      ["problem", 422],
      ["replayed", 200],
      ["created", 201],
    ]);
    assert.equal(results[1].problem?.type, PROBLEM_BASE + "unknown-workflow");
    assert.equal(results[1].problem?.retryable, false);
    assert.equal(results[2].run?.run_id, results[0].run?.run_id);
    assert.equal(results[2].body_mismatch, true);
    assert.ok(UUID_PATTERN.test(results[3].run?.dispatch_key ?? ""), "a generated key");
    assert.equal((await runsWithKey(db, tenant, key)).length, 1);
    assert.deepEqual(await client.admitRuns([]), []);
    await assert.rejects(
      () => client.admitRuns(Array(1001).fill({ workflow_ref: "echo" })),
      RangeError,
    );
  },
);

apiTest("a 422 surfaces as a typed PoimenProblem with its fields", async ({ api, token }) => {
  const client = new PoimenClient({ url: api.url, token });
  const retries: RetryInfo[] = [];
  const err = await client.admitRun(
    // deno-lint-ignore no-explicit-any
    { workflow_ref: "Not A Ref", input: {}, extra: 1 } as any,
    { idempotent: true, onRetry: (r) => retries.push(r) },
  ).catch((e) => e);
  assert.ok(err instanceof PoimenProblem, String(err));
  assert.ok(err instanceof Error);
  assert.equal(err.name, "PoimenProblem");
  assert.equal(err.code, "validation");
  assert.equal(err.type, `${PROBLEM_BASE}validation`);
  assert.equal(err.status, 422);
  assert.equal(err.retryable, false);
  assert.equal(typeof err.detail, "string");
  assert.ok(err.errors.some((e) => e.path === "workflow_ref"), JSON.stringify(err.errors));
  assert.ok(err.errors.every((e) => typeof e.message === "string" && e.message.length > 0));
  assert.match(err.message, /^422 validation: .*workflow_ref/);
  assert.equal(retries.length, 0, "a refusal is final: not retried");

  const unknown = await client.admitRun({ workflow_ref: "no-such-workflow" }).catch((e) => e);
  assert.ok(unknown instanceof PoimenProblem);
  assert.equal(unknown.code, "unknown-workflow");
  assert.equal(unknown.status, 422);
  assert.deepEqual(unknown.errors.map((e) => e.path), ["workflow_ref"]);

  const anonymous = new PoimenClient({ url: api.url, token: "not-a-token" });
  const denied = await anonymous.getRun(crypto.randomUUID()).catch((e) => e);
  assert.ok(denied instanceof PoimenProblem);
  assert.equal(denied.code, "unauthorized");
  assert.equal(denied.status, 401);
});

apiTest(
  "listRuns returns every run once over pages, following next_cursor",
  async ({ api, token }) => {
    const client = new PoimenClient({ url: api.url, token });
    const goal = `goal-${crypto.randomUUID()}`;
    const admitted = new Set<string>();
    for (let i = 0; i < 25; i++) {
      const { run, created } = await client.admitRun(
        { workflow_ref: "echo", input: { i }, goal_id: goal },
        { idempotent: true },
      );
      assert.equal(created, true);
      admitted.add(run.run_id);
    }
    // Runs of another goal must not show up in the filtered listing.
    await client.admitRun({ workflow_ref: "echo", goal_id: "other" }, { idempotent: true });

    const sizes: number[] = [];
    const seen: string[] = [];
    let last: string | null | undefined;
    for await (const page of client.listRuns({ goal_id: goal, limit: 7 })) {
      sizes.push(page.runs.length);
      seen.push(...page.runs.map((r) => r.run_id));
      last = page.next_cursor;
    }
    assert.deepEqual(sizes, [7, 7, 7, 4]);
    assert.equal(last, null);
    assert.equal(seen.length, 25);
    assert.deepEqual(new Set(seen), admitted);

    // A run's input and result only when fields asks for them.
    for await (const page of client.listRuns({ goal_id: goal, limit: 3 })) {
      assert.ok(page.runs.every((r) => !("input" in r) && !("result" in r)));
      break;
    }
    for await (const page of client.listRuns({ goal_id: goal, limit: 3, fields: ["input"] })) {
      assert.deepEqual(page.runs.map((r) => r.input), [{ i: 24 }, { i: 23 }, { i: 22 }]);
      assert.ok(page.runs.every((r) => !("result" in r)));
      break;
    }

    // Everything, in one page; stopping early stops fetching.
    let pages = 0;
    for await (const page of client.listRuns({ limit: 500 })) {
      pages++;
      assert.equal(page.runs.length, 26);
    }
    assert.equal(pages, 1);
    for await (const page of client.listRuns({ goal_id: goal, limit: 7 })) {
      assert.equal(page.runs.length, 7);
      break;
    }

    const one = [...admitted][3];
    const byKey = await client.getRun(one);
    const found = client.listRuns({ dispatch_key: byKey.dispatch_key! });
    const first = await found.next();
    assert.deepEqual(first.done ? [] : first.value.runs.map((r) => r.run_id), [one]);
  },
);

apiTest(
  "getRun reads the tenant's run; another tenant's run is a not-found problem",
  async ({ db, api, token, tenant }) => {
    const client = new PoimenClient({ url: api.url, token });
    const { run } = await client.admitRun({ workflow_ref: "echo", input: { a: 1 } });
    const got = await client.getRun(run.run_id);
    assert.equal(got.run_id, run.run_id);
    assert.equal(got.tenant_id, tenant);
    assert.deepEqual(got.input, { a: 1 });
    assert.equal(run.dispatch_key, null, "no key asked, none generated");

    const other = new PoimenClient({ url: api.url, token: await newToken(db.url, `${tenant}-x`) });
    const err = await other.getRun(run.run_id).catch((e) => e);
    assert.ok(err instanceof PoimenProblem);
    assert.equal(err.code, "not-found");
    assert.equal(err.status, 404);

    // A service token acts for the tenant the client names.
    const service = new PoimenClient({
      url: api.url,
      token: await newToken(db.url, "--service", "client-test"),
      tenant,
    });
    assert.equal((await service.getRun(run.run_id)).run_id, run.run_id);
    const admitted = await service.admitRun({ workflow_ref: "echo" }, { idempotent: true });
    assert.equal(admitted.run.tenant_id, tenant);
    assert.equal(admitted.run.source, "http:client-test");
  },
);

// The contract: 200 with the run, idempotent; a 409 `run-finished` problem
// with `run_status` when the run already finished.
Deno.test({
  name: "client_http: cancelRun cancels a queued run, again is fine, a finished run is a 409",
  fn: async () => {
    const db = await freshDatabase();
    const api = new ApiProcess({ DATABASE_URL: db.url });
    try {
      const tenant = `ch-${crypto.randomUUID().slice(0, 8)}`;
      const client = new PoimenClient({ url: api.url, token: await newToken(db.url, tenant) });
      await api.ready();
      // No worker runs here: the run stays queued until cancelled.
      const { run } = await client.admitRun({ workflow_ref: "echo" }, { idempotent: true });
      const cancelled = await client.cancelRun(run.run_id);
      assert.equal(cancelled.run_id, run.run_id);
      assert.equal(cancelled.status, "cancelled");
      assert.equal((await client.cancelRun(run.run_id)).status, "cancelled", "idempotent");
      assert.equal((await client.getRun(run.run_id)).status, "cancelled");

      const { run: done } = await client.admitRun({ workflow_ref: "echo" }, { idempotent: true });
      await db.sql`update runs set status = 'succeeded', finished_at = now()
                    where tenant_id = ${tenant} and run_id = ${done.run_id}`;
      const err = await client.cancelRun(done.run_id).catch((e) => e);
      assert.ok(err instanceof PoimenProblem, String(err));
      assert.equal(err.status, 409);
      assert.equal(err.code, "run-finished");
      assert.equal(err.retryable, false);
      assert.equal(err.extensions.run_status, "succeeded");
      assert.equal((await client.getRun(done.run_id)).status, "succeeded");
    } finally {
      await api.stop("SIGKILL");
      await db.drop();
    }
  },
});

/** A local server answering from `answers` in turn (the last one repeats), counting requests. */
function scripted(
  answers: (() => Response)[],
): { url: string; bodies: string[]; close(): Promise<void> } {
  const bodies: string[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (req) => {
    bodies.push(await req.text());
    return answers[Math.min(bodies.length - 1, answers.length - 1)]();
  });
  return { url: `http://127.0.0.1:${server.addr.port}`, bodies, close: () => server.shutdown() };
}

const problem = (status: number, code: string, headers: Record<string, string> = {}) => () =>
  new Response(
    JSON.stringify({ type: PROBLEM_BASE + code, title: code, status, retryable: status >= 500 }),
    { status, headers: { "content-type": "application/problem+json", ...headers } },
  );
const created = () =>
  new Response(JSON.stringify({ run_id: crypto.randomUUID() }), {
    status: 201,
    headers: { "content-type": "application/json" },
  });

Deno.test("client_http: Retry-After wins over a shorter backoff, and every retry keeps the key", async () => {
  const server = scripted([problem(503, "database-unavailable", { "retry-after": "1" }), created]);
  try {
    const retries: RetryInfo[] = [];
    const result = await new PoimenClient({ url: server.url, token: "t" }).admitRun(
      { workflow_ref: "echo" },
      { ...QUICK, idempotent: true, onRetry: (r) => retries.push(r) },
    );
    assert.equal(result.attempts, 2);
    assert.equal(retries.length, 1);
    assert.ok(retries[0].delayMs >= 1000, `waited ${retries[0].delayMs} ms`);
    assert.equal((retries[0].error as PoimenProblem).retryAfterMs, 1000);
    const keys = server.bodies.map((b) => JSON.parse(b).dispatch_key);
    assert.equal(keys.length, 2);
    assert.equal(keys[0], keys[1]);
    assert.equal(keys[0], result.dispatchKey);
  } finally {
    await server.close();
  }
});

Deno.test("client_http: send is one attempt that hands back any answer, and no answer as a network error", async () => {
  const server = scripted([problem(503, "database-unavailable", { "retry-after": "2" })]);
  try {
    const client = new PoimenClient({ url: server.url, token: "t", tenant: "acme" });
    const answer = await client.send("POST", "/v1/runs", {
      headers: { "content-type": "application/json" },
      body: new TextEncoder().encode('{"workflow_ref":"echo"}'),
    });
    assert.equal(server.bodies.length, 1, "no retry");
    assert.equal(server.bodies[0], '{"workflow_ref":"echo"}');
    assert.equal(answer.status, 503);
    const problem = problemFromAnswer(answer);
    assert.equal(problem.code, "database-unavailable");
    assert.equal(problem.retryAfterMs, 2000);
  } finally {
    await server.close();
  }
  const nobody = new PoimenClient({ url: `http://127.0.0.1:${freePort()}`, token: "t" });
  const err = await nobody.send("GET", "/v1/runs").catch((e) => e);
  assert.ok(err instanceof PoimenNetworkError, String(err));
  assert.equal(err.code, "network");
});

Deno.test("client_http: Retry-After as seconds or a date, bounded", () => {
  const now = Date.parse("2026-01-01T00:00:00Z");
  assert.equal(parseRetryAfter(null, now), undefined);
  assert.equal(parseRetryAfter("3", now), 3000);
  assert.equal(parseRetryAfter(" 0 ", now), 0);
  assert.equal(parseRetryAfter("Thu, 01 Jan 2026 00:00:05 GMT", now), 5000);
  assert.equal(parseRetryAfter("Wed, 31 Dec 2025 23:00:00 GMT", now), 0, "a past date: now");
  assert.equal(parseRetryAfter("999999", now), MAX_RETRY_AFTER_MS);
  assert.equal(parseRetryAfter("soon", now), undefined);
  assert.equal(parseRetryAfter("-1", now), undefined);
});

Deno.test("client_http: without a key, a 500 is not retried (it may have made a run) but a 503 is", async () => {
  const failing = scripted([problem(500, "internal")]);
  const refused = scripted([problem(503, "database-unavailable"), created]);
  try {
    const err = await new PoimenClient({ url: failing.url, token: "t" })
      .admitRun({ workflow_ref: "echo" }, QUICK).catch((e) => e);
    assert.ok(err instanceof PoimenProblem);
    assert.equal(err.code, "internal");
    assert.equal(failing.bodies.length, 1);
    assert.equal(JSON.parse(failing.bodies[0]).dispatch_key, undefined);

    const ok = await new PoimenClient({ url: refused.url, token: "t" })
      .admitRun({ workflow_ref: "echo" }, QUICK);
    assert.equal(ok.attempts, 2);
    assert.equal(ok.dispatchKey, null);
  } finally {
    await failing.close();
    await refused.close();
  }
});

Deno.test("client_http: retries end at maxAttempts, at the deadline, and when the signal aborts", async () => {
  const server = scripted([
    problem(502, "internal"),
    () => new Response("<html>bad gateway</html>", { status: 502 }),
  ]);
  try {
    const client = new PoimenClient({ url: server.url, token: "t" });
    const spent = await client.admitRun({ workflow_ref: "echo", dispatch_key: "k" }, {
      ...QUICK,
      maxAttempts: 3,
    }).catch((e) => e);
    assert.equal(server.bodies.length, 3);
    assert.ok(spent instanceof PoimenProblem);
    assert.equal(spent.code, PoimenProblem.UNEXPECTED, "a proxy's page is no poimen problem");
    assert.equal(spent.status, 502);
    assert.equal(spent.retryable, true);

    // A Retry-After beyond the deadline ends the call at once.
    const busy = scripted([problem(503, "database-unavailable", { "retry-after": "30" })]);
    try {
      const late = await new PoimenClient({ url: busy.url, token: "t" }).admitRun(
        { workflow_ref: "echo", dispatch_key: "k" },
        { ...QUICK, deadlineMs: 5_000 },
      ).catch((e) => e);
      assert.ok(late instanceof PoimenProblem, String(late));
      assert.equal(late.code, "database-unavailable");
      assert.equal(busy.bodies.length, 1);
    } finally {
      await busy.close();
    }

    // An attempt still waiting at the deadline times out.
    const silent = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    try {
      const { port } = silent.addr as Deno.NetAddr;
      const timedOut = await new PoimenClient({ url: `http://127.0.0.1:${port}`, token: "t" })
        .admitRun({ workflow_ref: "echo", dispatch_key: "k" }, { ...QUICK, deadlineMs: 200 })
        .catch((e) => e);
      assert.ok(timedOut instanceof PoimenNetworkError, String(timedOut));
      assert.equal(timedOut.code, "timeout");
    } finally {
      silent.close();
    }

    const abort = new AbortController();
    const call = client.admitRun({ workflow_ref: "echo", dispatch_key: "k" }, {
      baseDelayMs: 60_000,
      maxDelayMs: 60_000,
      signal: abort.signal,
      onRetry: () => abort.abort(new Error("caller gave up")),
    });
    await assert.rejects(call, /caller gave up/);
  } finally {
    await server.close();
  }
});

Deno.test("client_http: the client module loads no third-party, database or Kafka code", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", "client/http.ts"],
    cwd: PROJECT_ROOT,
    stdout: "piped",
  }).output();
  assert.equal(out.code, 0);
  const info = JSON.parse(new TextDecoder().decode(out.stdout)) as {
    modules: { specifier: string; dependencies?: { specifier: string }[] }[];
  };
  const root = new URL("../", import.meta.url).href;
  const local = info.modules.map((m) => m.specifier.replace(root, "")).sort();
  assert.deepEqual(local, [
    "client/batch.ts",
    "client/event_stream.ts",
    "client/follow_run.ts",
    "client/http.ts",
    "client/options.ts",
    "client/problems.ts",
    "client/retry.ts",
    "client/signal.ts",
    "client/transport.ts",
    "client/types.ts",
    "client/wait_for_run.ts",
    "client/workflow_runs.ts",
    "contracts/concurrency.ts",
    "contracts/debounce.ts",
    "contracts/event_types.ts",
    "contracts/wire.ts",
    "contracts/workflow.ts",
    "core/errors.ts",
    "core/time.ts",
  ]);
  const imported = info.modules.flatMap((m) => (m.dependencies ?? []).map((d) => d.specifier));
  assert.ok(
    imported.every((s) => s.startsWith("../") || s.startsWith("./")),
    JSON.stringify(imported),
  );
});
