/**
 * A workflow's current version end to end: an API process (which learns
 * only by NOTIFY here), a worker of billing.invoice@1, then a worker of
 * billing.invoice@2 (a canary). Callers of the bare name stay on version 1
 * while the canary starts, runs and stops, and move to version 2 only when
 * `deno task workflow promote billing.invoice@2` says so; each version's runs
 * are run by its own worker.
 */
import assert from "node:assert/strict";
import { z } from "zod";
import { silentLogger } from "../core/log.ts";
import { createWorker, type PoimenWorker } from "../worker/run_worker.ts";
import { defineWorkflow } from "../workflows/define.ts";
import { freshDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, newToken, runCommand, runFlags } from "./support/processes.ts";

const TENANT = "acme";

const invoice = (version: number) =>
  defineWorkflow({
    name: "billing.invoice",
    version,
    input: z.object({ customer_id: z.string(), amount_cents: z.number().int().min(1) }),
    handler: (input) => Promise.resolve({ version, total_cents: input.amount_cents }),
  });

Deno.test("current version: a v2 worker starting (and stopping) leaves callers of the bare name on v1; `workflow promote billing.invoice@2` moves them to v2", async () => {
  const db = await freshDatabase();
  const token = await newToken(db.url, TENANT);
  // No fallback refresh within the test: the APIs learn registrations and the promotion by NOTIFY.
  const api = new ApiProcess({
    DATABASE_URL: db.url,
    LOG_LEVEL: "info",
    CATALOG_REFRESH_MS: "3600000",
  });
  const env = { DATABASE_URL: db.url, LOG_LEVEL: "warn" };
  const workflow = (...args: string[]) => runCommand("workflow", args, env, runFlags("workflow"));
  const workers: PoimenWorker[] = [];
  const worker = async (version: number, id: string) => {
    const w = createWorker({
      workflows: [invoice(version)],
      databaseUrl: db.url,
      pollMs: 50,
      id,
      log: silentLogger,
    });
    workers.push(w);
    await w.start();
    return w;
  };
  const admit = async (ref: string, n: number) => {
    const res = await fetch(`${api.url}/v1/runs`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify({ workflow_ref: ref, input: { customer_id: "c-1", amount_cents: n } }),
    });
    const body = await res.json();
    assert.equal(res.status, 201, JSON.stringify(body));
    return body as { run_id: string; workflow_version: number };
  };
  const learned = (text: string) =>
    waitFor(`the API logged ${text}`, () => api.logs().some((l) => l.includes(text)), 10_000);
  try {
    await api.ready();
    await worker(1, "worker-v1");
    await learned("billing.invoice@1");
    const before = await admit("billing.invoice", 1);
    assert.equal(before.workflow_version, 1);

    // The canary starts: registered, learned by the API, and nobody moves.
    const canary = await worker(2, "worker-v2-canary");
    await learned('"workflow version learned","workflow":"billing.invoice@2"');
    for (let i = 0; i < 3; i++) {
      assert.equal((await admit("billing.invoice", 10 + i)).workflow_version, 1, "still v1");
    }
    const pinned = await admit("billing.invoice@2", 2);
    assert.equal(pinned.workflow_version, 2, "asked by its version, the canary is there");

    const listed = await workflow("list", "billing.invoice");
    assert.equal(listed.code, 0, listed.stderr);
    const rows = listed.stdout.trim().split("\n").map((l) => l.split(/\s{2,}/));
    assert.deepEqual(rows.map((r) => [r[0], r[1], r[2], r.at(-1)]), [
      ["WORKFLOW", "VERSION", "CURRENT", "LIVE WORKERS"],
      ["billing.invoice", "1", "current", "1: worker-v1"],
      ["billing.invoice", "2", "-", "1: worker-v2-canary"],
    ]);

    // The canary stops: still nobody moves.
    await canary.stop();
    assert.equal((await admit("billing.invoice", 20)).workflow_version, 1);

    // A v2 worker again, and the operator promotes it.
    await worker(2, "worker-v2");
    const promoted = await workflow("promote", "billing.invoice@2");
    assert.equal(promoted.code, 0, promoted.stderr);
    assert.equal(
      promoted.stdout.trim(),
      "billing.invoice@2 is current (was @1): runs naming billing.invoice get version 2 from " +
        "now on; 1 live worker hosts it",
    );
    const after = await waitFor("the bare name to pin v2", async () => {
      const run = await admit("billing.invoice", 30);
      return run.workflow_version === 2 ? run : undefined;
    }, 10_000);
    assert.equal((await admit("billing.invoice@1", 3)).workflow_version, 1, "v1 by its version");

    // Each version's runs ran on its own workers.
    for (const [run, version] of [[before, 1], [pinned, 2], [after, 2]] as const) {
      const [row] = await waitFor(`run ${run.run_id} succeeded`, async () => {
        const r = await db.sql<{ status: string; result: { version: number } }[]>`
          select status, result from runs where run_id = ${run.run_id}`;
        return r[0]?.status === "succeeded" ? r : undefined;
      }, 15_000);
      assert.equal(row.result.version, version);
    }

    const unknown = await workflow("promote", "billing.invoice@7");
    assert.equal(unknown.code, 1);
    assert.equal(
      unknown.stderr.trim(),
      "workflow promote: billing.invoice@7 is not registered (billing.invoice has @1, @2); " +
        "a version is registered when a worker hosting it starts",
    );
  } finally {
    for (const w of workers) await w.stop();
    await api.stop();
    await db.drop();
  }
});
