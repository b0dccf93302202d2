/**
 * The workflow catalog end to end, with real processes: an API process that
 * loads no workflow code learns a version a worker registers after the API
 * started (by NOTIFY, no restart) and validates input against it, naming the
 * failing field; the stock worker with `--workflows` hosts a module's
 * workflows, and refuses to start, exit 2 with one line, when its definition
 * of a registered version differs.
 */
import assert from "node:assert/strict";
import { z } from "zod";
import { silentLogger } from "../core/log.ts";
import { createWorker } from "../worker/run_worker.ts";
import { defineWorkflow } from "../workflows/define.ts";
import { freshDatabase, laneQueuedRuns, waitFor } from "./support/db.ts";
import { ApiProcess, newToken, PoimenProcess } from "./support/processes.ts";
import { localModuleGraph } from "./support/module_graph.ts";

const TENANT = "acme";

const invoice = defineWorkflow({
  name: "billing.invoice",
  version: 1,
  input: z.object({ customer_id: z.string().min(1), amount_cents: z.number().int().min(1) }),
  handler: (input) => Promise.resolve({ total_cents: input.amount_cents }),
});

async function post(api: ApiProcess, token: string, body: unknown) {
  const res = await fetch(`${api.url}/v1/runs`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

Deno.test("catalog: an API started before the worker learns its workflow by NOTIFY, validates input against it naming the failing field, and runs it; a workflow never registered is 422 unknown-workflow", async () => {
  const db = await freshDatabase();
  const token = await newToken(db.url, TENANT);
  // A fallback refresh far beyond the test: only the NOTIFY can teach it.
  const api = new ApiProcess({
    DATABASE_URL: db.url,
    LOG_LEVEL: "info",
    CATALOG_REFRESH_MS: "3600000",
  });
  const worker = createWorker({
    workflows: [invoice],
    databaseUrl: db.url,
    pollMs: 50,
    log: silentLogger,
  });
  try {
    await api.ready();
    const unknown = await post(api, token, { workflow_ref: "billing.invoice", input: {} });
    assert.equal(unknown.status, 422);
    assert.equal(unknown.body.type.endsWith("/unknown-workflow"), true, JSON.stringify(unknown));

    await worker.start();
    await waitFor(
      "the API learned billing.invoice@1",
      () =>
        api.logs().some((l) =>
          l.includes("workflow version learned") && l.includes("billing.invoice@1")
        ),
      10_000,
    );

    const bad = await post(api, token, {
      workflow_ref: "billing.invoice",
      input: { customer_id: "c-1", amount_cents: "12" },
    });
    assert.equal(bad.status, 422, JSON.stringify(bad.body));
    assert.ok(bad.body.type.endsWith("/validation"));
    assert.deepEqual(bad.body.errors.map((e: { path: string }) => e.path), ["input.amount_cents"]);

    const missing = await post(api, token, {
      workflow_ref: "billing.invoice@1",
      input: { amount_cents: 5 },
    });
    assert.equal(missing.status, 422);
    assert.deepEqual(missing.body.errors.map((e: { path: string }) => e.path), [
      "input.customer_id",
    ]);

    const ok = await post(api, token, {
      workflow_ref: "billing.invoice",
      input: { customer_id: "c-1", amount_cents: 1200 },
    });
    assert.equal(ok.status, 201, JSON.stringify(ok.body));
    assert.equal(ok.body.workflow_version, 1, "the newest version is pinned");
    const runId = ok.body.run_id;
    const [row] = await waitFor("the run succeeded", async () => {
      const rows = await db.sql<{ status: string; result: unknown }[]>`
        select status, result from runs where run_id = ${runId}`;
      return rows[0]?.status === "succeeded" ? rows : undefined;
    }, 15_000);
    assert.deepEqual(row.result, { total_cents: 1200 });

    const never = await post(api, token, { workflow_ref: "nobody.registered@3", input: {} });
    assert.equal(never.status, 422);
    assert.ok(never.body.type.endsWith("/unknown-workflow"));
  } finally {
    await worker.stop();
    await api.stop();
    await db.drop();
  }
});

/** A module of workflows outside the checkout, as a team would write it. */
async function workflowModule(source: string): Promise<{ path: string; remove(): Promise<void> }> {
  const dir = await Deno.makeTempDir({ prefix: "poimen-workflows-" });
  const path = `${dir}/workflows.ts`;
  await Deno.writeTextFile(path, source);
  return { path, remove: () => Deno.remove(dir, { recursive: true }) };
}

Deno.test("catalog: deno task worker --workflows hosts the module's workflows, and a worker whose definition of a registered version differs exits 2 with one line naming it", async () => {
  const db = await freshDatabase();
  const good = await workflowModule(`
import { z } from "zod";
import { defineWorkflow } from "@poimen/poimen/workflow";
export const greet = defineWorkflow({
  name: "team.greet",
  version: 1,
  input: z.object({ who: z.string() }),
  handler: ({ who }) => Promise.resolve({ hello: who }),
});
export const all = [greet];
`);
  // echo@1 is registered (a built-in: freshDatabase registers them, as `init --builtins` does);
  // this is another definition of it.
  const conflicting = await workflowModule(`
import { z } from "zod";
import { defineWorkflow } from "@poimen/poimen/workflow";
export const echo = defineWorkflow({
  name: "echo",
  version: 1,
  input: z.object({ text: z.string() }),
  handler: (input) => Promise.resolve(input),
});
`);
  const env = { DATABASE_URL: db.url, LOG_LEVEL: "info", WORKER_POLL_MS: "50" };
  const worker = new PoimenProcess("worker", env, ["--workflows", good.path]);
  try {
    const [{ run_id }] = await db.sql<{ run_id: string }[]>`
      with t as (insert into tenants (tenant_id) values (${TENANT}) on conflict do nothing)
      insert into runs (tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input,
                        source, max_attempts)
      values (${TENANT}, gen_random_uuid(), 'team.greet', 'team.greet', 1, '{"who":"ann"}',
              'test', 3)
      returning run_id`;
    await laneQueuedRuns(db.sql, TENANT);
    const [row] = await waitFor("the module's run succeeded", async () => {
      if (worker.exited) throw new Error(`worker exited:\n${worker.logs().join("\n")}`);
      const rows = await db.sql<{ status: string; result: unknown }[]>`
        select status, result from runs where run_id = ${run_id}`;
      return rows[0]?.status === "succeeded" ? rows : undefined;
    }, 20_000);
    assert.deepEqual(row.result, { hello: "ann" });

    const refused = new PoimenProcess("worker", env, ["--workflows", conflicting.path]);
    const status = await refused.status();
    assert.equal(status.code, 2, refused.logs().join("\n"));
    const plain = refused.logs().filter((l) => l.trim() !== "" && !l.startsWith("{"));
    assert.equal(plain.length, 1, plain.join("\n"));
    assert.match(plain[0], /workflow echo@1 is already registered with another definition/);
  } finally {
    await worker.stop();
    await good.remove();
    await conflicting.remove();
    await db.drop();
  }
});

Deno.test("catalog: the API's module graph holds no workflow or worker code", async () => {
  // main.ts imports each command lazily: the API's graph is api/process.ts's.
  const local = await localModuleGraph("api/process.ts");
  assert.ok(local.includes("admission/catalog.ts"), `the graph was read: ${local}`);
  const forbidden = local.filter((s) => /^(workflows|worker)\//.test(s));
  assert.deepEqual(forbidden, [], "api/process.ts must not import these");
});

Deno.test("catalog: a workflow registered for tenants [acme] admits acme's runs; for beta it is the unknown-workflow 422 an unregistered name gets, and beta's 422 never names it while acme's does", async () => {
  const db = await freshDatabase();
  const acme = await newToken(db.url, "acme");
  const beta = await newToken(db.url, "beta");
  const api = new ApiProcess({ DATABASE_URL: db.url, LOG_LEVEL: "info" });
  const worker = createWorker({
    workflows: [
      defineWorkflow({
        name: "acme.payroll",
        version: 1,
        tenants: ["acme"],
        input: z.object({ month: z.string() }),
        handler: () => Promise.resolve({}),
      }),
    ],
    databaseUrl: db.url,
    log: silentLogger,
  });
  try {
    await api.ready();
    await worker.start();
    await waitFor(
      "the API learned acme.payroll@1",
      () =>
        api.logs().some((l) =>
          l.includes("workflow version learned") && l.includes("acme.payroll@1")
        ),
      10_000,
    );
    const input = { month: "2026-11" };
    const ok = await post(api, acme, { workflow_ref: "acme.payroll", input });
    assert.equal(ok.status, 201, JSON.stringify(ok.body));

    const unregistered = await post(api, beta, { workflow_ref: "nobody.registered", input });
    for (const ref of ["acme.payroll", "acme.payroll@1"]) {
      const refused = await post(api, beta, { workflow_ref: ref, input });
      assert.equal(refused.status, 422, JSON.stringify(refused.body));
      assert.equal(refused.body.type, unregistered.body.type);
      assert.deepEqual(refused.body.errors, unregistered.body.errors);
      assert.equal(
        refused.body.detail,
        unregistered.body.detail.replace('"nobody.registered"', JSON.stringify(ref)),
      );
      // The ref asked for is echoed; the list of what beta may start is not changed by it.
      assert.ok(!refused.body.detail.split("registered:")[1].includes("acme"), refused.body.detail);
    }
    assert.ok(
      !JSON.stringify(unregistered.body).includes("acme.payroll"),
      unregistered.body.detail,
    );
    assert.match(unregistered.body.detail, /registered: echo@1, fail@1, sleep@1$/);

    const acmeUnknown = await post(api, acme, { workflow_ref: "nobody.registered", input });
    assert.match(acmeUnknown.body.detail, /registered: acme\.payroll@1, echo@1, fail@1, sleep@1$/);
    const [{ runs }] = await db.sql<{ runs: number }[]>`
      select count(*)::int as runs from runs where workflow_name = 'acme.payroll'`;
    assert.equal(runs, 1, "only acme's run exists");
  } finally {
    await worker.stop();
    await api.stop();
    await db.drop();
  }
});
