/**
 * Tenant quotas over HTTP, against a real API process and the real
 * `deno task tenant` command: a tenant at its max_queued gets a 429
 * `queue-full` problem with Retry-After and nothing is written, while another
 * tenant is admitted; raising the quota with the command lets it through
 * within QUOTA_REFRESH_MS, without a restart. The admission rate likewise.
 * No worker runs, so admitted runs stay queued.
 */
import assert from "node:assert/strict";
import { PROBLEM_BASE } from "../core/errors.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, newToken, runCommand } from "./support/processes.ts";

const REFRESH_MS = 500;
/** What a loaded machine adds to the documented delay: the command's exit, a poll, a request. */
const SLACK_MS = 3_000;

async function countRuns(db: TestDatabase, tenant: string): Promise<number> {
  const [r] = await db.sql`
    select (select count(*)::int from runs where tenant_id = ${tenant})
         + (select count(*)::int from work_events where tenant_id = ${tenant}) as n`;
  return r.n;
}

async function tenantCommand(db: TestDatabase, ...args: string[]) {
  const out = await runCommand("tenant", args, { DATABASE_URL: db.url, LOG_LEVEL: "warn" });
  assert.equal(out.code, 0, out.stderr);
  return out.stdout.trim();
}

function post(api: ApiProcess, token: string, body: object = {}) {
  return fetch(`${api.url}/v1/runs`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify({ workflow_ref: "echo", input: {}, ...body }),
  });
}

async function refusedWith(res: Response, code: string) {
  const body = await res.json();
  assert.equal(res.status, 429, JSON.stringify(body));
  assert.equal(res.headers.get("content-type"), "application/problem+json");
  assert.equal(body.type, PROBLEM_BASE + code);
  assert.ok(body.type.endsWith(`/${code}`));
  assert.equal(body.retryable, true);
  const retryAfter = res.headers.get("retry-after");
  assert.match(retryAfter ?? "", /^[1-9][0-9]*$/, `Retry-After: ${retryAfter}`);
  return Number(retryAfter);
}

Deno.test("it: a tenant at its max-queued gets 429 queue-full, nothing written; raising it with deno task tenant lets it through", async () => {
  const db = await freshDatabase();
  let api: ApiProcess | undefined;
  try {
    const full = await newToken(db.url, "quota-full");
    const other = await newToken(db.url, "quota-other");
    assert.equal(
      await tenantCommand(db, "quota-full", "--max-queued", "2"),
      "quota-full: max-queued 2, rate unlimited (set; the APIs apply it within QUOTA_REFRESH_MS)",
    );
    assert.equal(await tenantCommand(db, "quota-full"), "quota-full: max-queued 2, rate unlimited");
    api = await new ApiProcess({ DATABASE_URL: db.url, QUOTA_REFRESH_MS: String(REFRESH_MS) })
      .ready();

    for (let i = 0; i < 2; i++) {
      const res = await post(api, full);
      assert.equal(res.status, 201, await res.text());
    }
    const before = await countRuns(db, "quota-full");
    assert.equal(before, 4, "two runs and their two events");
    assert.equal(await refusedWith(await post(api, full), "queue-full"), 1, "500 ms → 1 s");
    // A replay of a key is refused alike while full (it is retryable).
    await refusedWith(await post(api, full, { dispatch_key: "k" }), "queue-full");
    assert.equal(await countRuns(db, "quota-full"), before, "nothing written");

    // Another tenant is admitted meanwhile.
    for (let i = 0; i < 3; i++) {
      const res = await post(api, other);
      assert.equal(res.status, 201, await res.text());
    }

    // Seen by operators.
    assert.equal(
      await api.metric("poimen_admission_quota_refusals_total", {
        tenant: "quota-full",
        reason: "queue-full",
      }),
      2,
    );
    assert.equal(await api.metric("poimen_tenant_max_queued", { tenant: "quota-full" }), 2);
    assert.equal(await api.metric("poimen_tenant_queued_runs", { tenant: "quota-full" }), 2);
    assert.equal(await api.metric("poimen_tenant_max_queued", { tenant: "quota-other" }), 0);
    assert.equal(
      await api.metric("poimen_admissions_total", { outcome: "rejected" }),
      2,
      "a refusal is a rejected admission",
    );

    // Raised with the command: admitted within the documented delay, no restart.
    await tenantCommand(db, "quota-full", "--max-queued", "3");
    const raised = Date.now();
    const res = await waitFor(
      "admitted after the raise",
      async () => {
        const r = await post(api!, full);
        if (r.status === 429) {
          await r.body?.cancel();
          return false;
        }
        return r;
      },
      REFRESH_MS + SLACK_MS + 5_000,
      50,
    );
    assert.equal(res.status, 201, await res.text());
    const took = Date.now() - raised;
    assert.ok(took <= REFRESH_MS + SLACK_MS, `applied after ${took} ms`);
    assert.equal(await countRuns(db, "quota-full"), before + 2);
    await refusedWith(await post(api, full), "queue-full");
    await waitFor(
      "the gauge follows",
      async () => (await api!.metric("poimen_tenant_max_queued", { tenant: "quota-full" })) === 3,
      10_000,
    );

    // none: unlimited again.
    await tenantCommand(db, "quota-full", "--max-queued", "none");
    await waitFor(
      "unlimited",
      async () => {
        const r = await post(api!, full);
        await r.body?.cancel();
        return r.status === 201;
      },
      REFRESH_MS + SLACK_MS + 5_000,
      50,
    );
  } finally {
    if (api) assert.equal((await api.stop()).code, 0, api.logs().join("\n"));
    await db.drop();
  }
});

Deno.test("it: a tenant past its admission rate gets 429 rate-limited with Retry-After, nothing written", async () => {
  const db = await freshDatabase();
  let api: ApiProcess | undefined;
  try {
    const token = await newToken(db.url, "quota-rate");
    await tenantCommand(db, "quota-rate", "--rate", "0.25");
    api = await new ApiProcess({ DATABASE_URL: db.url, QUOTA_REFRESH_MS: String(REFRESH_MS) })
      .ready();
    const first = await post(api, token);
    assert.equal(first.status, 201, await first.text());
    const before = await countRuns(db, "quota-rate");
    const retryAfter = await refusedWith(await post(api, token), "rate-limited");
    assert.ok(
      retryAfter >= 3 && retryAfter <= 4,
      `0.25/s: the next token within 4 s: ${retryAfter}`,
    );
    assert.equal(await countRuns(db, "quota-rate"), before, "nothing written");
    assert.equal(
      await api.metric("poimen_admission_quota_refusals_total", {
        tenant: "quota-rate",
        reason: "rate-limited",
      }),
      1,
    );

    // Raised with the command: admitted again within the refresh.
    await tenantCommand(db, "quota-rate", "--rate", "1000");
    await waitFor(
      "admitted after the raise",
      async () => {
        const r = await post(api!, token);
        await r.body?.cancel();
        return r.status === 201;
      },
      REFRESH_MS + SLACK_MS,
      50,
    );
  } finally {
    if (api) assert.equal((await api.stop()).code, 0, api.logs().join("\n"));
    await db.drop();
  }
});
