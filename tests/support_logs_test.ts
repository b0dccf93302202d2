/** tests/support/logs.ts: a negative log assertion fails when its message is not the code's. */
import assert from "node:assert/strict";
import { assertNotLogged, isLoggedByCode } from "./support/logs.ts";

Deno.test("support logs: messages the code logs are known, literal or from a template", () => {
  assert.equal(isLoggedByCode("kafka stream stopped fetching, starting it again"), true);
  // outbox/publisher.ts: `${phase} unavailable, events wait in postgres; retrying with backoff`
  assert.equal(
    isLoggedByCode("kafka unavailable, events wait in postgres; retrying with backoff"),
    true,
  );
  assert.equal(isLoggedByCode("kafka unavailable"), false, "a fragment is not a message");
  assert.equal(isLoggedByCode("a message nothing logs"), false);
});

Deno.test("support logs: assertNotLogged fails on a reworded message and on a line that has it", () => {
  const msg = "kafka stream stopped fetching, starting it again";
  assert.throws(() => assertNotLogged([], "kafka stream stalled"), /no code logs/);
  assert.throws(() => assertNotLogged([JSON.stringify({ level: "warn", msg })], msg), /was logged/);
  assertNotLogged([JSON.stringify({ level: "warn", msg: "something else" })], msg);
});
