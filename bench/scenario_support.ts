/**
 * What the bench's sections share: a migrated database of their own per
 * section, tenants and tokens, counts of keyed rows, and waiting for a
 * process to answer HTTP.
 */
import { createPool, type Sql } from "../db/pool.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import { hashToken, newToken } from "../contracts/tokens.ts";
import { loadMigrations, migrate } from "../db/migrate.ts";
import { registerVersions } from "../db/catalog.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { silentLogger } from "../core/log.ts";
import { delay, SECOND } from "../core/time.ts";
import type { BenchContext } from "./run_context.ts";

function dbUrl(adminUrl: string, name: string): string {
  const u = new URL(adminUrl);
  u.pathname = `/${name}`;
  return u.href;
}

/**
 * Creates and migrates database `name` on `admin`'s server (`adminUrl`: the
 * run's, unless a section's own server), with the built-in workflows
 * registered (as `init --builtins` does: migrating registers none, and an API
 * admits echo before a worker hosting it starts); a pool of 4 on it.
 */
export async function createDb(
  ctx: BenchContext,
  admin: Sql,
  name: string,
  adminUrl = ctx.adminUrl,
): Promise<{ url: string; sql: Sql }> {
  await admin.unsafe(`create database ${name}`);
  const url = dbUrl(adminUrl, name);
  const sql = createPool({ url, max: 4, applicationName: "bench" });
  await migrate(sql, loadMigrations(), silentLogger);
  await registerVersions(sql, builtinRegistry().catalogVersions(), "bench");
  return { url, sql };
}

/** A new token for `tenant` (inserted too), or a service token when `kind` says so. */
export async function tenantToken(sql: Sql, tenant: string, kind: "tenant" | "service" = "tenant") {
  if (kind === "tenant") await insertTenant(sql, tenant);
  const token = newToken();
  await insertToken(sql, await hashToken(token), {
    kind,
    tenant_id: kind === "tenant" ? tenant : null,
    name: kind === "tenant" ? tenant : "relay",
  });
  return token;
}

/** Polls `count` until it stops changing (in-flight work landed). */
export async function settled(count: () => Promise<number>): Promise<number> {
  let last = await count();
  for (;;) {
    await delay(250);
    const now = await count();
    if (now === last) return now;
    last = now;
  }
}

/** Rows of `table` whose dispatch key starts with `prefix-`, and their distinct keys. */
export async function countWhere(sql: Sql, table: string, prefix: string) {
  const [r] = await sql.unsafe<{ n: number; d: number }[]>(
    `select count(*)::int as n, count(distinct dispatch_key)::int as d from ${table}
      where dispatch_key like $1`,
    [`${prefix}-%`],
  );
  return r;
}

/** Waits until `url` answers (200, or any status when `anyStatus`). */
export async function waitHttp(url: string, what: string, anyStatus = false) {
  const deadline = Date.now() + 60 * SECOND;
  while (Date.now() < deadline) {
    const ok = await fetch(url).then(async (r) => {
      await r.body?.cancel();
      return anyStatus || r.status === 200;
    }, () => false);
    if (ok) return;
    await delay(100);
  }
  throw new Error(`${what} not ready at ${url}`);
}
