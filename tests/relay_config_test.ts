/**
 * The relay's RELAY_TENANT_PATTERN is a tenant scope (`acme,beta,team-*`),
 * never a regular expression: one that is not is refused at start-up in one
 * line naming the variable, and the scope picks the dispatch topics read.
 */
import assert from "node:assert/strict";
import { readRelayConfig, relayTenants } from "../relay/config.ts";
import { ConfigError } from "../core/errors.ts";

const BASE = { RELAY_TOKEN: "pmn_x" };

Deno.test("relay config: a regular expression as RELAY_TENANT_PATTERN is refused in one line naming it", () => {
  for (const bad of ["acme)|(.*", "(a+)+", ".*", "acme|beta", "ir-x(-[a-z0-9]+)?", " , "]) {
    assert.throws(
      () => readRelayConfig({ ...BASE, RELAY_TENANT_PATTERN: bad }),
      (err: unknown) => {
        assert.ok(err instanceof ConfigError, String(err));
        assert.match(err.message, /^config: RELAY_TENANT_PATTERN is invalid: not a tenant scope/);
        assert.equal(err.message.includes("\n"), false);
        return true;
      },
      bad,
    );
  }
});

Deno.test("relay config: RELAY_TENANT_PATTERN defaults to every tenant", () => {
  const config = readRelayConfig(BASE);
  assert.equal(config.RELAY_TENANT_PATTERN, "*");
  assert.ok(relayTenants(config).all);
});

Deno.test("relay config: a scope of ids and prefixes picks exactly those tenants", () => {
  const tenants = relayTenants(readRelayConfig({ ...BASE, RELAY_TENANT_PATTERN: "acme,team-*" }));
  for (const t of ["acme", "team-a", "team-"]) assert.ok(tenants.allows(t), t);
  for (const t of ["beta", "acme2", "team", "a".repeat(40)]) {
    assert.equal(tenants.allows(t), false, t);
  }
});
