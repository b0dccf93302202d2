/**
 * The Authenticator against a real database: what is not token-shaped is
 * refused without a lookup, unknown tokens never evict a real one from the
 * cache, and a stored tenant pattern is read as a tenant scope — one that is
 * not (a regular expression from before migration 015) allows no tenant.
 * Lookups are counted by wrapping the real db/auth.ts selectToken.
 *
 *   deno task test tests/api_auth_test.ts
 */
import assert from "node:assert/strict";
import { Authenticator } from "../api/auth.ts";
import { hashToken, isTokenShaped, newToken } from "../contracts/tokens.ts";
import { insertTenant, insertToken, selectToken } from "../db/auth.ts";
import { PoimenError } from "../core/errors.ts";
import { createLogger } from "../core/log.ts";
import { freshDatabase, type TestDatabase } from "./support/db.ts";

/** An Authenticator whose token lookups (real ones) are counted, and whose refusals are kept. */
function counted(db: TestDatabase, cacheMs = 60_000) {
  const lookups: string[] = [];
  const failures: string[] = [];
  const warnings: string[] = [];
  const auth = new Authenticator(db.sql, cacheMs, {
    onFailure: (reason) => failures.push(reason),
    log: createLogger("test", "warn", (line) => warnings.push(line)),
    lookup: async (sql, hash, opts) => {
      lookups.push(Array.from(hash, (b) => b.toString(16).padStart(2, "0")).join(""));
      return await selectToken(sql, hash, opts);
    },
  });
  return { auth, lookups, failures, warnings };
}

async function refusal(p: Promise<unknown>): Promise<{ code: string; message: string }> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof PoimenError, String(err));
    return { code: err.code, message: err.message };
  }
  assert.fail("expected a refusal");
}

async function withDatabase(fn: (db: TestDatabase) => Promise<void>) {
  const db = await freshDatabase();
  try {
    await fn(db);
  } finally {
    await db.drop();
  }
}

async function tenantToken(db: TestDatabase, tenant: string): Promise<string> {
  await insertTenant(db.sql, tenant);
  const token = newToken();
  await insertToken(db.sql, await hashToken(token), {
    kind: "tenant",
    tenant_id: tenant,
    name: tenant,
  });
  return token;
}

Deno.test("auth: a token is pmn_ and 43 base64url characters, as newToken makes", () => {
  for (let i = 0; i < 100; i++) assert.ok(isTokenShaped(newToken()));
  const good = newToken();
  for (
    const bad of [
      "",
      "pmn_",
      good.slice(0, -1),
      good + "A",
      good.replace("pmn_", "PMN_"),
      "pmn_" + "+".repeat(43),
      "pmn_" + "=".repeat(43),
      "x".repeat(10_000),
    ]
  ) {
    assert.equal(isTokenShaped(bad), false, bad.slice(0, 60));
  }
});

Deno.test("auth: a token that is not token-shaped is refused like an unknown one, with no lookup", async () => {
  await withDatabase(async (db) => {
    const { auth, lookups, failures } = counted(db);
    const unknown = await refusal(auth.authenticate(`Bearer ${newToken()}`, undefined));
    assert.equal(lookups.length, 1, "a token-shaped one is looked up");
    for (let i = 0; i < 1_000; i++) {
      const junk = i % 2 === 0 ? `junk-${i}-${crypto.randomUUID()}` : `pmn_${"A".repeat(i % 40)}`;
      const refused = await refusal(auth.authenticate(`Bearer ${junk}`, undefined));
      assert.deepEqual(refused, unknown, junk);
    }
    assert.equal(lookups.length, 1, "junk cost no lookup");
    assert.equal(failures.filter((r) => r === "bad-token").length, 1_001);
  });
});

Deno.test("auth: 10,000 unknown tokens do not evict a good one from the cache", async () => {
  await withDatabase(async (db) => {
    const good = await tenantToken(db, "acme");
    const { auth, lookups } = counted(db);
    assert.equal((await auth.authenticate(`Bearer ${good}`, undefined)).tenantId, "acme");
    const goodHash = lookups[0];
    // In rounds of 100 at once (the pool's connections overlap their round trips).
    for (let round = 0; round < 100; round++) {
      await Promise.all(
        Array.from(
          { length: 100 },
          () => refusal(auth.authenticate(`Bearer ${newToken()}`, undefined)),
        ),
      );
    }
    assert.equal(lookups.length, 10_001, "each unknown token-shaped one was looked up once");
    for (let i = 0; i < 5; i++) {
      assert.equal((await auth.authenticate(`Bearer ${good}`, undefined)).tenantId, "acme");
    }
    assert.equal(lookups.filter((h) => h === goodHash).length, 1, "the good one was not reloaded");
    assert.equal(lookups.length, 10_001);
  });
});

Deno.test("auth: an unknown token is remembered briefly, apart from found ones", async () => {
  await withDatabase(async (db) => {
    const { auth, lookups } = counted(db);
    const unknown = newToken();
    for (let i = 0; i < 3; i++) await refusal(auth.authenticate(`Bearer ${unknown}`, undefined));
    assert.equal(lookups.length, 1, "a client retrying one unknown token costs one lookup");
  });
});

Deno.test("auth: a service token scoped acme,team-* acts for those tenants only", async () => {
  await withDatabase(async (db) => {
    for (const t of ["acme", "team-x", "beta", "team", "acme2"]) await insertTenant(db.sql, t);
    const service = newToken();
    await insertToken(db.sql, await hashToken(service), {
      kind: "service",
      tenant_id: null,
      name: "relay",
      tenant_pattern: "acme,team-*",
    });
    const { auth } = counted(db);
    for (const t of ["acme", "team-x"]) {
      assert.deepEqual(await auth.authenticate(`Bearer ${service}`, t), {
        kind: "service",
        tenantId: t,
        name: "relay",
      });
    }
    for (const t of ["beta", "team", "acme2", "ACME", "acme,beta"]) {
      const refused = await refusal(auth.authenticate(`Bearer ${service}`, t));
      assert.equal(refused.code, "forbidden", t);
      assert.match(refused.message, /may not act for tenant/, t);
    }
  });
});

Deno.test("auth: a stored regular expression allows no tenant, answers at once, and is logged", async () => {
  await withDatabase(async (db) => {
    await insertTenant(db.sql, "aaa");
    const service = newToken();
    const id = await insertToken(db.sql, await hashToken(service), {
      kind: "service",
      tenant_id: null,
      name: "old",
      tenant_pattern: "(a+)+",
    });
    const { auth, warnings } = counted(db);
    // As a regular expression this matched "aaa", and took exponential time on the long one.
    for (const t of ["aaa", "a".repeat(40) + "!"]) {
      const refused = await refusal(auth.authenticate(`Bearer ${service}`, t));
      assert.equal(refused.code, "forbidden", t);
    }
    assert.equal(warnings.length, 1, "logged once, when loaded");
    const logged = JSON.parse(warnings[0]);
    assert.match(logged.msg, /not a tenant scope/);
    assert.equal(logged.id, id);
    assert.ok(!warnings[0].includes(service), "never the secret");
  });
});
