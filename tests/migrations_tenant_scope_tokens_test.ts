/**
 * Migration 015 rewrites the service tokens' tenant patterns that say the
 * same thing as a tenant scope into one, and leaves every other regular
 * expression as it was, so the API reads it as allowing no tenant.
 */
import assert from "node:assert/strict";
import { loadMigrations, migrate } from "../db/migrate.ts";
import { hashToken, newToken, storedTenantScope } from "../contracts/tokens.ts";
import { insertToken } from "../db/auth.ts";
import { silentLogger } from "../core/log.ts";
import { freshDatabase } from "./support/db.ts";

const REWRITES: [before: string, after: string | null][] = [
  [".*", null],
  ["acme", "acme"],
  ["acme|beta", "acme,beta"],
  ["(team-.*|ops)", "ops,team-*"],
  ["(?:a|b.*)", "a,b*"],
];
// Anything else fails closed: these either widen when read as a scope or are no list at all.
const LEFT = ["acme)|(.*", "(a+)+", "team-.+", "Acme", "acme|", "ir-x(-[a-z0-9]+)?", "[ab]"];

Deno.test("migration 015: tenant patterns already in the scope grammar are rewritten, others fail closed", async () => {
  const db = await freshDatabase(false);
  try {
    const all = loadMigrations();
    assert.ok(all.some((m) => m.version === 15), "migration 015 is embedded");
    await migrate(db.sql, all.filter((m) => m.version < 15), silentLogger);
    const ids = new Map<string, string>();
    for (const pattern of [...REWRITES.map(([b]) => b), ...LEFT]) {
      ids.set(
        pattern,
        await insertToken(db.sql, await hashToken(newToken()), {
          kind: "service",
          tenant_id: null,
          name: "old",
          tenant_pattern: pattern,
        }),
      );
    }
    assert.deepEqual(await migrate(db.sql, all.filter((m) => m.version <= 15), silentLogger), [15]);
    const rows = await db.sql<{ token_id: string; tenant_pattern: string | null }[]>`
      select token_id, tenant_pattern from api_tokens`;
    const after = new Map(rows.map((r) => [r.token_id, r.tenant_pattern]));
    for (const [before, expected] of REWRITES) {
      const now = after.get(ids.get(before)!)!;
      assert.equal(now, expected, before);
      assert.equal(storedTenantScope(now).legacy, false, before);
    }
    for (const before of LEFT) {
      const now = after.get(ids.get(before)!)!;
      assert.equal(now, before, "left as it was");
      const { scope, legacy } = storedTenantScope(now);
      assert.ok(legacy, before);
      for (const t of ["acme", "a", "aaa", "team-x", "ir-x"]) {
        assert.equal(scope!.allows(t), false, `${before} allows ${t}`);
      }
    }
  } finally {
    await db.drop();
  }
});
