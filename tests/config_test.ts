/**
 * Every process refuses a bad or missing setting at start-up with one line
 * naming the variable and exit code 2, before it touches anything.
 */
import assert from "node:assert/strict";
import { runCommand, runFlags } from "./support/processes.ts";

const CASES: [command: string, env: Record<string, string>, variable: string][] = [
  ["api", { PORT: "eighty" }, "PORT"],
  ["api", { DATABASE_URL: "not a url" }, "DATABASE_URL"],
  ["api", { BODY_LIMIT_BYTES: "-1" }, "BODY_LIMIT_BYTES"],
  ["api", { QUOTA_REFRESH_MS: "0" }, "QUOTA_REFRESH_MS"],
  ["api", { BODY_BUDGET_TENANT_BYTES: "5000000" }, "BODY_BUDGET_TENANT_BYTES"],
  ["api", { BODY_BUDGET_SERVICE_BYTES: "4000000" }, "BODY_BUDGET_SERVICE_BYTES"],
  ["worker", { WORKER_CONCURRENCY: "0" }, "WORKER_CONCURRENCY"],
  ["worker", { LOG_LEVEL: "loud" }, "LOG_LEVEL"],
  ["worker", { RUN_RESULT_MAX_BYTES: "2000000" }, "RUN_RESULT_MAX_BYTES"],
  ["outbox", { OUTBOX_BATCH_SIZE: "many" }, "OUTBOX_BATCH_SIZE"],
  ["relay", {}, "RELAY_TOKEN"],
  ["relay", { RELAY_TOKEN: "x", KAFKA_BROKERS: "no port" }, "KAFKA_BROKERS"],
  ["relay", { RELAY_TOKEN: "x", API_URL: "nowhere" }, "API_URL"],
];

for (const [command, env, variable] of CASES) {
  Deno.test(`config: ${command} with a bad ${variable} says so in one line and exits 2`, async () => {
    const out = await runCommand(command, [], env, runFlags(command));
    assert.equal(out.code, 2, out.stderr);
    const lines = out.stderr.trim().split("\n");
    assert.equal(lines.length, 1, out.stderr);
    assert.match(lines[0], new RegExp(`^config: ${variable} is (unset|invalid): `));
  });
}

Deno.test("config: a secret in a bad setting is not echoed back", async () => {
  const secret = "pmn_supersecretvalue";
  const out = await runCommand(
    "api",
    [],
    { DATABASE_URL: `postgres://u:${secret}@` },
    runFlags("api"),
  );
  assert.equal(out.code, 2);
  assert.ok(!out.stderr.includes(secret), out.stderr);
});
