/**
 * A durable run's console page, rendered on the server (`app.request()`) on
 * a real Postgres, with an in-process worker: a run waiting for a signal
 * shows its step timeline (name, kind, status, size, when), what it waits
 * for and until when, and the form that sends the signal, its name filled
 * in; a sleeping run shows its sleep's end; step and signal names that are
 * markup are shown as text; once the signal (sent as the form sends it)
 * woke the run and it finished, the page shows every step completed and no
 * form (a final run takes no signal).
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
import { createPool } from "../db/pool.ts";
import { defineWorkflow } from "../workflows/define.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { Worker } from "../worker/worker.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase, waitFor } from "./support/db.ts";

const HOUR = 3_600_000;
const SCRIPT = "<script>alert(1)</script>";

// A step and a signal whose names are markup: the page must show them as text.
const approval = defineWorkflow({
  name: "approval",
  version: 1,
  input: z.object({ order: z.string() }),
  async handler({ order }, ctx) {
    const charged = await ctx.step(`charge ${SCRIPT}`, () => ({ order, cents: 500 }));
    const answer = await ctx.waitForSignal<{ ok: boolean }>(`ok ${SCRIPT}`, { timeout: HOUR });
    return { charged, approved: answer?.payload.ok ?? false };
  },
});
const nap = defineWorkflow({
  name: "nap",
  version: 1,
  input: z.object({}),
  async handler(_input, ctx) {
    await ctx.sleep("nap", HOUR);
    return null;
  },
});

function registry() {
  return builtinRegistry().register(approval).register(nap);
}

/** The rows of the step table: name, kind, status, size. */
function stepRows(html: string): string[][] {
  return [
    ...html.matchAll(
      /<tr data-step="[^"]*" data-kind="(\w+)" data-step-status="(\w+)"><td>\d+<\/td><td class="mono">([^<]*)(?:<span[^>]*>[^<]*<\/span>)?<\/td><td>\w+<\/td><td><span[^>]*>\w+<\/span><\/td><td>([^<]*)<\/td>/g,
    ),
  ].map((m) => [m[3], m[1], m[2], m[4]]);
}

const text = (page: string, id: string) => new RegExp(`id="${id}"[^>]*>([^<]*)<`).exec(page)?.[1];

Deno.test("console durable run: the step timeline, what it waits for, and the signal form", async () => {
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
  const call = async (path: string, body?: unknown) => {
    const r = await app.request(path, {
      method: body === undefined ? "GET" : "POST",
      body: body === undefined ? undefined : JSON.stringify(body),
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    });
    return { status: r.status, text: await r.text() };
  };
  const admit = async (workflow_ref: string, input: unknown) =>
    JSON.parse((await call("/v1/runs", { workflow_ref, input })).text).run_id as string;
  const fragment = async (runId: string) => {
    const r = await call(`/console/fragments/runs/${runId}`);
    assert.equal(r.status, 200, r.text);
    return r.text;
  };
  const { host, port, user, database } = sql.options;
  const url = `postgres://${user}@${host[0]}:${port[0]}/${database}`;
  const worker = new Worker(sql, registry(), {
    leaderSession: () => createPool({ url, max: 1, applicationName: "console-durable-leader" }),
    id: "console-durable-test",
    concurrency: 2,
    leaseMs: 30_000,
    pollMs: 100,
    retryBaseMs: 50,
    shutdownMs: 2_000,
    log: silentLogger,
  });
  try {
    // A plain run shows no step table, and a form while it is open.
    const plain = await admit("echo", { hi: 1 });
    const queued = await fragment(plain);
    assert.ok(!queued.includes('id="steps"'), "no steps table for a run without steps");
    assert.match(queued, new RegExp(`<form id="signal" class="signal" data-signal="${plain}"`));

    const order = await admit("approval", { order: "o-1" });
    const sleeper = await admit("nap", {});
    worker.start();
    const status = async (id: string) => JSON.parse((await call(`/v1/runs/${id}`)).text).status;
    await waitFor(
      "both runs waiting",
      async () => (await status(order)) === "waiting" && (await status(sleeper)) === "waiting",
    );

    // Waiting for its signal: the timeline, the wait, the form with its name.
    const waiting = await fragment(order);
    assert.ok(!waiting.includes("<script>"), "no script element");
    const escaped = "&lt;script&gt;alert(1)&lt;/script&gt;";
    const charge = `charge ${escaped}`;
    const ok = `ok ${escaped}`;
    assert.deepEqual(stepRows(waiting), [
      [charge, "step", "completed", "27 B"],
      [ok, "signal", "waiting", "—"],
    ]);
    assert.match(waiting, /id="run-waiting-for" data-reason="signal">signal /);
    assert.equal(text(waiting, "run-waiting-name"), ok);
    const until = /id="run-waiting-until"><time datetime="([^"]+)"/.exec(waiting)?.[1];
    assert.ok(until, "the wait's timeout is shown");
    const left = Date.parse(until) - Date.now();
    assert.ok(left > HOUR - 60_000 && left <= HOUR, `times out in ${left} ms`);
    assert.ok(
      waiting.includes(`<input name="name" type="text" required maxlength="200" value="${ok}">`),
      "the form names the signal the run waits for",
    );
    assert.match(waiting, /<textarea name="payload"[^>]*>\{\}<\/textarea>/);
    assert.match(waiting, /<input name="signal_id" type="text" maxlength="255"/);
    assert.match(waiting, /<p id="signal-outcome" role="status" hidden=""><\/p>/);

    // Sleeping: its sleep and when it ends.
    const sleeping = await fragment(sleeper);
    assert.deepEqual(stepRows(sleeping), [["nap", "sleep", "waiting", "0 B"]]);
    assert.match(
      sleeping,
      /data-reason="sleep">sleep <span class="mono" id="run-waiting-name">nap</,
    );
    const end = /id="run-waiting-until"><time datetime="([^"]+)"/.exec(sleeping)?.[1];
    assert.ok(end && Math.abs(Date.parse(end) - Date.now() - HOUR) < 60_000, `ends ${end}`);

    // The signal, as the form sends it: it wakes the run, which finishes.
    const sent = await call(`/v1/runs/${order}/signals`, {
      name: `ok ${SCRIPT}`,
      payload: { ok: true },
      signal_id: "from-the-console",
    });
    assert.equal(sent.status, 201, sent.text);
    await waitFor("the order succeeded", async () => (await status(order)) === "succeeded");
    const done = await fragment(order);
    assert.deepEqual(stepRows(done).map((r) => r.slice(0, 3)), [
      [charge, "step", "completed"],
      [ok, "signal", "completed"],
    ]);
    assert.ok(!done.includes('id="signal"'), "a final run offers no signal form");
    assert.ok(!done.includes('id="run-waiting-for"'));
  } finally {
    await worker.stop();
    await db.drop();
  }
});
