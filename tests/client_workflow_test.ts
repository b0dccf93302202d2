/**
 * The typed verbs of the client (`start`, `result`, `run`) against a real
 * API process and a worker made by `createWorker` on a real Postgres: a run
 * is pinned to its definition's version, its result comes back as the
 * output schema parsed it, a run that does not succeed rejects with a
 * `PoimenRunError` saying why, and a run of another workflow is never
 * taken for the definition's. The worker puts its metrics on the caller's
 * registry and logs through the caller's logger.
 *
 *   deno test -A tests/client_workflow_test.ts
 */
import assert from "node:assert/strict";
import client from "prom-client";
import { z } from "zod";
import { PoimenClient, PoimenProblem, PoimenRunError } from "../client/http.ts";
import { createLogger } from "../core/log.ts";
import { createWorker } from "../worker/run_worker.ts";
import { defineWorkflow, implement } from "../workflows/define.ts";
import { freshDatabase } from "./support/db.ts";
import { ApiProcess, newToken } from "./support/processes.ts";

const quote = defineWorkflow({
  name: "shop.quote",
  version: 2,
  input: z.object({ sku: z.string().min(1), qty: z.number().int().min(1) }),
  output: z.object({ sku: z.string(), total_cents: z.number().int() }),
  maxAttempts: 3,
});

const flaky = defineWorkflow({
  name: "shop.flaky",
  version: 1,
  input: z.object({ mode: z.enum(["throw", "shape", "slow"]) }),
  output: z.object({ ok: z.boolean() }),
  maxAttempts: 1,
});

// The worker's side: what a producer never imports.
const quoteImpl = implement(quote, ({ sku, qty }) => ({
  sku,
  total_cents: qty * 250,
  // Not in the output schema: the stored result leaves it out.
  cost_basis: qty * 100,
}));
const flakyImpl = implement(flaky, async ({ mode }, ctx) => {
  if (mode === "throw") throw new Error("supplier down");
  if (mode === "slow") {
    await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
    throw new Error("stopped");
  }
  return { ok: "yes" } as never;
});

Deno.test("client workflow: start pins the definition's version, result is the parsed output, run does both; failures, timeouts and runs of another workflow reject", async () => {
  const db = await freshDatabase();
  const tenant = `cw-${crypto.randomUUID().slice(0, 8)}`;
  const lines: string[] = [];
  const registry = new client.Registry();
  const worker = createWorker({
    workflows: [quoteImpl, flakyImpl],
    databaseUrl: db.url,
    pollMs: 50,
    shutdownMs: 500,
    log: createLogger("caller", "info", (line) => lines.push(line)),
    metricsRegistry: registry,
  });
  const api = new ApiProcess({ DATABASE_URL: db.url });
  try {
    const token = await newToken(db.url, tenant);
    await worker.start();
    await api.ready();
    const poimen = new PoimenClient({ url: api.url, token });

    const handle = await poimen.start(quote, { sku: "pen", qty: 4 }, { goalId: "order-1" });
    assert.equal(handle.created, true);
    assert.equal(handle.replayed, false);
    assert.equal(handle.run.workflow_ref, "shop.quote@2", "pinned to the definition's version");
    assert.equal(handle.run.goal_id, "order-1");
    assert.equal(handle.workflow, quote);
    assert.deepEqual(await poimen.result(handle, { timeoutMs: 20_000 }), {
      sku: "pen",
      total_cents: 1000,
    });
    // By definition and id; and the same dispatch key gives the same run.
    assert.deepEqual(await poimen.result(quote, handle.runId), { sku: "pen", total_cents: 1000 });
    const again = await poimen.start(quote, { sku: "pen", qty: 4 }, {
      dispatchKey: handle.dispatchKey,
    });
    assert.equal(again.runId, handle.runId);
    assert.equal(again.replayed, true);
    assert.equal(again.created, false);

    assert.deepEqual(await poimen.run(quote, { sku: "ink", qty: 1 }, { resultTimeoutMs: 20_000 }), {
      sku: "ink",
      total_cents: 250,
    });

    // A run of another workflow is not this definition's, whichever way it is named.
    const other = await poimen.start(flaky, { mode: "throw" });
    await assert.rejects(
      poimen.result(quote, other.runId),
      /is a run of shop\.flaky@1, not of shop\.quote@2/,
    );
    await assert.rejects(
      poimen.start(quote, { sku: "pen", qty: 1 }, { dispatchKey: other.dispatchKey }),
      /is a run of shop\.flaky@1, not of shop\.quote@2/,
    );

    // What the types cannot catch, the API still refuses.
    await assert.rejects(poimen.start(quote, { sku: "", qty: 1 }), (err: unknown) => {
      assert.ok(err instanceof PoimenProblem);
      assert.equal(err.code, "validation");
      assert.deepEqual(err.errors.map((e) => e.path), ["input.sku"]);
      return true;
    });

    await assert.rejects(poimen.result(other, { timeoutMs: 20_000 }), (err: unknown) => {
      assert.ok(err instanceof PoimenRunError);
      assert.equal(err.status, "failed");
      assert.equal(err.code, undefined, "a handler's throw has no poimen code");
      assert.match(err.message, /shop\.flaky@1 failed: supplier down/);
      return true;
    });
    await assert.rejects(
      poimen.run(flaky, { mode: "shape" }, { resultTimeoutMs: 20_000 }),
      (err: unknown) => {
        assert.ok(err instanceof PoimenRunError);
        assert.equal(err.code, "invalid-output");
        assert.match(err.message, /failed \(invalid-output\): .*ok: /);
        return true;
      },
    );
    const slow = await poimen.start(flaky, { mode: "slow" });
    const waited = Date.now();
    await assert.rejects(poimen.result(slow, { timeoutMs: 1_000 }), (err: unknown) => {
      assert.ok(err instanceof PoimenRunError);
      assert.ok(err.status === "queued" || err.status === "running", err.status);
      assert.match(err.message, /has not ended: still/);
      return true;
    });
    assert.ok(Date.now() - waited < 10_000, "the wait ended near its timeout");
    await poimen.cancelRun(slow.runId);
    await assert.rejects(poimen.result(slow, { timeoutMs: 20_000 }), (err: unknown) => {
      assert.ok(err instanceof PoimenRunError);
      assert.equal(err.status, "cancelled");
      return true;
    });

    // The caller's registry and logger: the worker's metrics and lines are there.
    const metrics = await registry.getMetricsAsJSON();
    const claims = metrics.find((m) => m.name === "poimen_worker_claims_total");
    assert.ok(claims, metrics.map((m) => m.name).join(", "));
    assert.equal(claims.values[0]?.value, 5, "one claim per run started");
    assert.ok(
      lines.some((l) =>
        JSON.parse(l).msg === "worker started" && JSON.parse(l).service === "caller"
      ),
      lines.join("\n"),
    );
  } finally {
    await worker.stop();
    await api.stop("SIGKILL");
    await db.drop();
  }
});
