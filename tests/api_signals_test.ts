/**
 * Signals over HTTP and what `GET /v1/runs/{id}` says of a durable run, in
 * process (`app.request()`) on a real Postgres, with an in-process worker:
 * `POST /v1/runs/{id}/signals` answers 201 for a new signal, 200 with
 * `Idempotent-Replayed` for one seen, 404 for no such run (another
 * tenant's included), 409 for a final run, 422/400/415 for a bad request;
 * the client's `signalRun` sends one; a waiting run shows what it waits for
 * and its steps, and the signal wakes it.
 */
import assert from "node:assert/strict";
import client from "prom-client";
import { z } from "zod";
import { silentLogger } from "../core/log.ts";
import { Admission } from "../admission/admit.ts";
import { createApp } from "../api/app.ts";
import { Authenticator } from "../api/auth.ts";
import { hashToken, newToken } from "../contracts/tokens.ts";
import { createApiMetrics } from "../api/metrics.ts";
import { loadConsoleAssets } from "../api/console/assets.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import { registerVersions } from "../db/catalog.ts";
import { createPool } from "../db/pool.ts";
import { defineWorkflow } from "../workflows/define.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { Worker } from "../worker/worker.ts";
import { PoimenClient, PoimenProblem, type Run, signalRun } from "../client/http.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase, waitFor } from "./support/db.ts";

const approval = defineWorkflow({
  name: "approval",
  version: 1,
  input: z.object({ order: z.string() }),
  async handler({ order }, ctx) {
    const charged = await ctx.step("charge", () => ({ order, cents: 500 }));
    const answer = await ctx.waitForSignal<{ ok: boolean }>("approval", { timeout: 3_600_000 });
    return { charged, approved: answer?.payload.ok ?? false, by: answer?.signal_id };
  },
});

// Declares its signal: the API checks the payload, and the wait is typed by it.
const declared = defineWorkflow({
  name: "approval.declared",
  version: 1,
  input: z.object({ order: z.string() }),
  signals: { approval: z.strictObject({ ok: z.boolean(), by: z.string().min(1) }) },
  async handler({ order }, ctx) {
    const answer = await ctx.waitForSignal("approval", { timeout: 60_000 });
    const ok: boolean | undefined = answer?.payload.ok;
    // @ts-expect-error: the declared payload has no such field
    void answer?.payload.amount;
    // An undeclared signal names its type, or is unknown.
    const other = await ctx.waitForSignal<{ n: number }>("other", { timeout: 0 });
    const n: number | undefined = other?.payload.n;
    return { order, ok, n };
  },
});

function registry(): WorkflowRegistry {
  return builtinRegistry().register(approval).register(declared);
}

Deno.test("api signals: 201, a replay 200, 404, 409, 422; a waiting run shows its wait and steps, and its signal wakes it", async () => {
  const db = await freshDatabase();
  const { sql } = db;
  const tokens: Record<string, string> = {};
  for (const t of ["acme", "globex"]) {
    tokens[t] = newToken();
    await insertTenant(sql, t);
    await insertToken(sql, await hashToken(tokens[t]), { kind: "tenant", tenant_id: t, name: t });
  }
  tokens.relay = newToken();
  await insertToken(sql, await hashToken(tokens.relay), {
    kind: "service",
    tenant_id: null,
    name: "relay",
    tenant_pattern: "*",
  });
  const app = createApp({
    sql,
    admission: new Admission(sql, catalogOf(registry()), { maxBatch: 16, maxConcurrent: 2 }),
    auth: new Authenticator(sql, 30_000),
    metrics: createApiMetrics(new client.Registry()),
    log: silentLogger,
    bodyLimit: 4096,
    consoleAssets: loadConsoleAssets(),
  });
  const call = (
    path: string,
    body?: unknown,
    opts: { tenant?: string; type?: string; source?: string } = {},
  ) =>
    app.request(path, {
      method: body === undefined ? "GET" : "POST",
      body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
      headers: {
        authorization: `Bearer ${
          tokens[opts.source === undefined ? opts.tenant ?? "acme" : "relay"]
        }`,
        "content-type": opts.type ?? "application/json",
        // The relay's service token acts for the tenant it names.
        ...(opts.source === undefined
          ? {}
          : { "poimen-tenant": opts.tenant ?? "acme", "poimen-source": opts.source }),
      },
    });
  const admit = async (workflow_ref: string, input: unknown) =>
    (await (await call("/v1/runs", { workflow_ref, input })).json()).run_id as string;
  const problem = async (r: Response, status: number, type: string) => {
    const body = await r.json();
    assert.equal(r.status, status, JSON.stringify(body));
    assert.equal(body.type, `https://poimen.dev/problems/${type}`);
    return body;
  };
  const { host, port, user, database } = sql.options;
  const url = `postgres://${user}@${host[0]}:${port[0]}/${database}`;
  const worker = new Worker(sql, registry(), {
    leaderSession: () => createPool({ url, max: 1, applicationName: "signals-test-leader" }),
    id: "signals-test",
    concurrency: 2,
    leaseMs: 30_000,
    pollMs: 100,
    retryBaseMs: 50,
    shutdownMs: 2_000,
    log: silentLogger,
  });
  try {
    // A queued run (no worker yet) buffers its signals.
    const queued = await admit("echo", { hi: 1 });
    const first = await call(`/v1/runs/${queued}/signals`, {
      name: "approval",
      payload: { ok: true },
      signal_id: "sig-1",
    });
    assert.equal(first.status, 201);
    const receipt = await first.json();
    assert.deepEqual({ ...receipt, received_at: undefined }, {
      run_id: queued,
      name: "approval",
      signal_id: "sig-1",
      received_at: undefined,
      consumed_by: null,
      run_status: "queued",
    });
    const again = await call(`/v1/runs/${queued}/signals`, {
      name: "approval",
      payload: { ok: false },
      signal_id: "sig-1",
    });
    assert.equal(again.status, 200);
    assert.equal(again.headers.get("idempotent-replayed"), "true");
    assert.equal((await again.json()).received_at, receipt.received_at);
    // Without an id, each call is a new signal.
    const ids = new Set<string>();
    for (let i = 0; i < 2; i++) {
      const r = await call(`/v1/runs/${queued}/signals`, { name: "ping" });
      assert.equal(r.status, 201);
      ids.add((await r.json()).signal_id);
    }
    assert.equal(ids.size, 2);
    const [{ n }] = await sql<{ n: number }[]>`
      select count(*)::int as n from run_signals where run_id = ${queued}`;
    assert.equal(n, 3);

    // No such run: unknown, another tenant's, not a uuid.
    await problem(
      await call(`/v1/runs/${crypto.randomUUID()}/signals`, { name: "a" }),
      404,
      "not-found",
    );
    await problem(
      await call(`/v1/runs/${queued}/signals`, { name: "a" }, { tenant: "globex" }),
      404,
      "not-found",
    );
    await problem(await call(`/v1/runs/nope/signals`, { name: "a" }), 404, "not-found");
    // A bad request.
    const bad = await problem(
      await call(`/v1/runs/${queued}/signals`, { name: "a#2", extra: 1 }),
      422,
      "validation",
    );
    assert.deepEqual(bad.errors.map((e: { path: string }) => e.path).sort(), ["extra", "name"]);
    await problem(await call(`/v1/runs/${queued}/signals`, { payload: 1 }), 422, "validation");
    await problem(await call(`/v1/runs/${queued}/signals`, "{"), 400, "bad-json");
    await problem(
      await call(`/v1/runs/${queued}/signals`, "{}", { type: "text/plain" }),
      415,
      "unsupported-media-type",
    );
    // The relay's ids (`kafka:`) are its own: only a service token may send
    // one, as its request's own Poimen-Source.
    const reserved = "kafka:poimen.acme.signals/0/7";
    const taken = await problem(
      await call(`/v1/runs/${queued}/signals`, { name: "a", signal_id: reserved }),
      422,
      "validation",
    );
    assert.deepEqual(taken.errors.map((e: { path: string }) => e.path), ["signal_id"]);
    await problem(
      await call(`/v1/runs/${queued}/signals`, { name: "a", signal_id: reserved }, {
        source: "kafka:poimen.acme.signals/0/8",
      }),
      422,
      "validation",
    );
    const relayed = await call(`/v1/runs/${queued}/signals`, { name: "a", signal_id: reserved }, {
      source: reserved,
    });
    assert.equal(relayed.status, 201);
    assert.equal((await relayed.json()).signal_id, reserved);
    // A final run refuses a new signal and replays a seen one.
    await call(`/v1/runs/${queued}/cancel`, {});
    const refused = await problem(
      await call(`/v1/runs/${queued}/signals`, { name: "late" }),
      409,
      "run-finished",
    );
    assert.equal(refused.run_status, "cancelled");
    assert.equal(
      (await call(`/v1/runs/${queued}/signals`, { name: "approval", signal_id: "sig-1" })).status,
      200,
    );

    // A durable run: it charges, then waits (suspended) for its approval.
    await worker.start();
    const runId = await admit("approval", { order: "o-1" });
    const waiting = await waitFor("the run waits", async () => {
      const run = await (await call(`/v1/runs/${runId}`)).json() as Run;
      return run.status === "waiting" ? run : undefined;
    }, 15_000);
    assert.equal(waiting.waiting_for?.reason, "signal");
    assert.equal(waiting.waiting_for?.name, "approval");
    assert.ok(Date.parse(waiting.waiting_for!.until!) > Date.now() + 3_000_000);
    assert.deepEqual(
      waiting.steps?.map((s) => [s.seq, s.name, s.kind, s.status, s.signal_name]),
      [[1, "charge", "step", "completed", null], [2, "approval", "signal", "waiting", "approval"]],
    );
    assert.equal(waiting.steps?.[0].size, JSON.stringify({ order: "o-1", cents: 500 }).length);
    // The client sends it, and the run resumes where it stopped.
    const poimen = new PoimenClient({
      url: "http://api.test",
      token: tokens.acme,
      fetch: (input, init) => Promise.resolve(app.request(String(input), init)),
    });
    const sent = await signalRun(poimen, runId, { name: "approval", payload: { ok: true } });
    assert.equal(sent.created, true);
    assert.equal(sent.signal.run_status, "queued");
    const done = await waitFor("the run succeeded", async () => {
      const run = await (await call(`/v1/runs/${runId}`)).json() as Run;
      return run.status === "succeeded" ? run : undefined;
    }, 15_000);
    assert.deepEqual(done.result, {
      charged: { order: "o-1", cents: 500 },
      approved: true,
      by: sent.signal.signal_id,
    });
    assert.equal(done.waiting_for, null);
    assert.deepEqual(done.steps?.map((s) => s.status), ["completed", "completed"]);
    const events = (await (await call(`/v1/runs/${runId}/events`)).json()).events as {
      type: string;
    }[];
    assert.deepEqual(events.map((e) => e.type), [
      "run.admitted",
      "run.started",
      "step.completed",
      "run.waiting",
      "signal.received",
      "run.woken",
      "run.started",
      "step.completed",
      "run.succeeded",
    ]);
    await assert.rejects(
      () => signalRun(poimen, runId, { name: "approval" }),
      (err) => err instanceof PoimenProblem && err.status === 409,
    );
  } finally {
    await worker.stop();
    await db.drop();
  }
});

Deno.test("api signals: a declared signal's payload is checked against its schema (422 naming the field, nothing stored); others take any payload; the version's signals are part of its definition", async () => {
  const db = await freshDatabase();
  const { sql } = db;
  const token = newToken();
  await insertTenant(sql, "acme");
  await insertToken(sql, await hashToken(token), { kind: "tenant", tenant_id: "acme", name: "a" });
  const app = createApp({
    sql,
    admission: new Admission(sql, catalogOf(registry()), { maxBatch: 16, maxConcurrent: 2 }),
    auth: new Authenticator(sql, 30_000),
    metrics: createApiMetrics(new client.Registry()),
    log: silentLogger,
    bodyLimit: 4096,
    consoleAssets: loadConsoleAssets(),
  });
  const post = (path: string, body: unknown) =>
    app.request(path, {
      method: "POST",
      body: JSON.stringify(body),
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    });
  try {
    const admitted = await post("/v1/runs", {
      workflow_ref: "approval.declared",
      input: { order: "o-1" },
    });
    assert.equal(admitted.status, 201);
    const runId = (await admitted.json()).run_id as string;
    const signals = `/v1/runs/${runId}/signals`;
    const refused = await post(signals, { name: "approval", payload: { ok: "yes", by: "" } });
    const problem = await refused.json();
    assert.equal(refused.status, 422, JSON.stringify(problem));
    assert.equal(problem.type, "https://poimen.dev/problems/validation");
    assert.match(problem.detail ?? problem.title, /approval\.declared@1/);
    assert.deepEqual(problem.errors.map((e: { path: string }) => e.path).sort(), [
      "payload.by",
      "payload.ok",
    ]);
    const extra = await post(signals, { name: "approval", payload: { ok: true, by: "a", x: 1 } });
    assert.equal(extra.status, 422);
    assert.deepEqual((await extra.json()).errors.map((e: { path: string }) => e.path), [
      "payload.x",
    ]);
    assert.equal((await post(signals, { name: "approval" })).status, 422, "a null payload");
    const [{ n }] = await sql<{ n: number }[]>`
      select count(*)::int as n from run_signals where run_id = ${runId}`;
    assert.equal(n, 0, "a refused signal is not stored");
    const ok = await post(signals, { name: "approval", payload: { ok: true, by: "alice" } });
    assert.equal(ok.status, 201);
    // A name the version does not declare takes any payload; so does any run of a version
    // declaring none.
    assert.equal((await post(signals, { name: "other", payload: "anything" })).status, 201);
    const echo = (await (await post("/v1/runs", { workflow_ref: "echo" })).json()).run_id;
    assert.equal(
      (await post(`/v1/runs/${echo}/signals`, { name: "approval", payload: 1 })).status,
      201,
    );
    // The catalog keeps the version's signals: registered again with others, it differs.
    const [version] = registry().catalogVersions().filter((v) => v.name === "approval.declared");
    assert.deepEqual(Object.keys(version.signal_schemas ?? {}), ["approval"]);
    const [same] = await registerVersions(sql, [version], "w-1");
    assert.deepEqual([same.created, same.same], [true, true]);
    const [changed] = await registerVersions(sql, [{ ...version, signal_schemas: null }], "w-2");
    assert.deepEqual([changed.created, changed.same], [false, false]);
  } finally {
    await db.drop();
  }
});
