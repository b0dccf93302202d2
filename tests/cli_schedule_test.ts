/**
 * `deno task schedule` on a schedule a definition declares, as the real
 * command (a subprocess): `list` names the declaring version, `pause` and
 * `resume` work, `delete` refuses (exit 1) and leaves it, while a schedule
 * made at run time is deleted as before.
 */
import assert from "node:assert/strict";
import { z } from "zod";
import { silentLogger } from "../core/log.ts";
import { insertTenant } from "../db/auth.ts";
import { selectSchedule } from "../db/schedules.ts";
import { writeDeclaredSchedules } from "../worker/declared_schedules.ts";
import { defineWorkflow } from "../workflows/define.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { freshDatabase } from "./support/db.ts";
import { runCommand } from "./support/processes.ts";

Deno.test("schedule command: a declared schedule is listed with its version, paused and resumed, never deleted", async () => {
  const db = await freshDatabase();
  try {
    await insertTenant(db.sql, "acme");
    const nightly = defineWorkflow({
      name: "echo",
      version: 1,
      input: z.unknown(),
      tenants: ["acme"],
      schedules: [{ id: "nightly", cron: "30 2 * * *", input: { full: true } }],
      handler: () => null,
    });
    await writeDeclaredSchedules(
      db.sql,
      new WorkflowRegistry([nightly]).catalogVersions(),
      silentLogger,
    );
    const schedule = (...args: string[]) =>
      runCommand("schedule", ["acme", ...args], { DATABASE_URL: db.url, LOG_LEVEL: "warn" });

    const made = await schedule("create", "mine", "--workflow", "echo", "--cron", "0 * * * *");
    assert.equal(made.code, 0, made.stderr);
    const list = await schedule("list");
    assert.equal(list.code, 0, list.stderr);
    const lines = list.stdout.trim().split("\n");
    assert.match(lines[0], /^mine echo /);
    assert.doesNotMatch(lines[0], /declared-by/);
    assert.match(lines[1], /^nightly echo@1 "30 2 \* \* \*" UTC .* declared-by=echo@1$/);

    const refused = await schedule("delete", "nightly");
    assert.equal(refused.code, 1);
    assert.match(refused.stderr, /nightly is declared by workflow echo@1/);
    assert.ok(await selectSchedule(db.sql, "acme", "nightly"), "still there");

    assert.equal((await schedule("pause", "nightly")).code, 0);
    assert.equal((await selectSchedule(db.sql, "acme", "nightly"))!.paused, true);
    assert.equal((await schedule("resume", "nightly")).code, 0);
    const resumed = (await selectSchedule(db.sql, "acme", "nightly"))!;
    assert.equal(resumed.paused, false);
    assert.equal(resumed.next_at!.getUTCMinutes(), 30);
    assert.equal(resumed.cron, "30 2 * * *");

    assert.equal((await schedule("delete", "mine")).code, 0);
    assert.equal(await selectSchedule(db.sql, "acme", "mine"), undefined);
  } finally {
    await db.drop();
  }
});
