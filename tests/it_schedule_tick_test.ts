/**
 * The tick in real API processes: two APIs (each ticks every 200 ms) and a
 * worker on a database of this file's own; a schedule of `* * * * *`
 * created over HTTP starts its next occurrence once, within the tick of its
 * minute, and the run succeeds carrying its schedule_id and scheduled_for.
 * Up to a minute and a half of wall clock: the cron's resolution.
 *
 *   deno test -A tests/it_schedule_tick_test.ts
 */
import assert from "node:assert/strict";
import { SECOND } from "../core/time.ts";
import { freshDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, newToken, PoimenProcess } from "./support/processes.ts";

Deno.test("schedule tick: two API processes start a 1-minute schedule's occurrence once, and it runs", async () => {
  const db = await freshDatabase();
  const tenant = `tick-${crypto.randomUUID().slice(0, 8)}`;
  const token = await newToken(db.url, tenant);
  const env = { DATABASE_URL: db.url, LOG_LEVEL: "warn", SCHEDULE_TICK_MS: "200" };
  const apis = [new ApiProcess(env), new ApiProcess(env)];
  const worker = new PoimenProcess("worker", { ...env, WORKER_POLL_MS: "100" });
  const headers = { authorization: `Bearer ${token}`, "content-type": "application/json" };
  try {
    await Promise.all(apis.map((a) => a.ready()));
    const res = await fetch(`${apis[0].url}/v1/schedules`, {
      method: "POST",
      headers,
      body: JSON.stringify({
        id: "minutely",
        workflow_ref: "echo",
        cron: "* * * * *",
        input: { tick: 1 },
      }),
    });
    const schedule = await res.json();
    assert.equal(res.status, 201, JSON.stringify(schedule));
    const first: string = schedule.next_occurrences[0];
    const key = `schedule:minutely:${first}`;
    const runs = async () =>
      (await (await fetch(
        `${apis[1].url}/v1/runs?dispatch_key=${encodeURIComponent(key)}`,
        { headers },
      )).json()).runs as { run_id: string; status: string }[];
    const [run] = await waitFor(`the run of ${first}`, async () => {
      const found = await runs();
      return found.length > 0 && found[0].status === "succeeded" ? found : undefined;
    }, 90 * SECOND);
    // A few more ticks of both APIs: still the one run.
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal((await runs()).length, 1);
    const detail = await (await fetch(`${apis[0].url}/v1/runs/${run.run_id}`, { headers })).json();
    assert.equal(detail.schedule_id, "minutely");
    assert.equal(detail.scheduled_for, first);
    assert.equal(detail.source, "schedule:minutely");
    const [{ n }] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from runs where tenant_id = ${tenant}`;
    assert.ok(n >= 1 && n <= 2, `${n} runs: one per minute passed`);
    const after = await (await fetch(`${apis[1].url}/v1/schedules/minutely`, { headers })).json();
    assert.ok(after.next_occurrences[0] > first, JSON.stringify(after));
  } finally {
    await Promise.all([...apis, worker].map((p) => p.stop()));
    await db.drop();
  }
});
