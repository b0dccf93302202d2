/** Tenants and API tokens. Tokens are looked up by their SHA-256 only. */
import type { Sql } from "./pool.ts";

/** What a new token is bound to. */
export interface TokenRow {
  kind: "tenant" | "service";
  tenant_id: string | null;
  name: string;
  /** When it stops working; absent: never. */
  expires_at?: Date | null;
  /** A service token's tenants: a tenant scope (`acme,team-*`, contracts/tenant_scope.ts); absent: any. */
  tenant_pattern?: string | null;
}

/** A stored token as the API checks it: revoked and expired ones included, so the caller can say which. */
export interface StoredToken extends TokenRow {
  token_id: string;
  expires_at: Date | null;
  tenant_pattern: string | null;
  revoked_at: Date | null;
}

/** A token as an operator lists it: never its secret or hash. */
export interface TokenListing {
  token_id: string;
  kind: "tenant" | "service";
  tenant_id: string | null;
  name: string;
  tenant_pattern: string | null;
  created_at: Date;
  last_used_at: Date | null;
  expires_at: Date | null;
  revoked_at: Date | null;
}

/**
 * How stale `last_used_at` may get: a token's row is written at most once
 * per this, however often it is used, so authentication never costs a write
 * per request.
 */
const LAST_USED_RESOLUTION = "5 minutes";

/** Creates the tenant unless it exists; true when this call created it. */
export async function insertTenant(sql: Sql, tenantId: string): Promise<boolean> {
  const rows = await sql`
    insert into tenants (tenant_id) values (${tenantId})
    on conflict (tenant_id) do nothing returning tenant_id`;
  return rows.length > 0;
}

/** Whether the tenant exists. */
export async function tenantExists(sql: Sql, tenantId: string): Promise<boolean> {
  const [row] = await sql`select 1 from tenants where tenant_id = ${tenantId}`;
  return row !== undefined;
}

/** Every tenant id, sorted. */
export async function selectTenants(sql: Sql): Promise<string[]> {
  const rows = await sql<{ tenant_id: string }[]>`select tenant_id from tenants order by tenant_id`;
  return rows.map((r) => r.tenant_id);
}

/** Stores a token's hash; returns the token's public id. */
export async function insertToken(
  sql: Sql,
  hash: Uint8Array,
  token: TokenRow,
): Promise<string> {
  const [row] = await sql<{ token_id: string }[]>`
    insert into api_tokens (token_hash, kind, tenant_id, name, expires_at, tenant_pattern)
    values (${hash}, ${token.kind}, ${token.tenant_id}, ${token.name},
            ${token.expires_at ?? null}, ${token.tenant_pattern ?? null})
    returning token_id`;
  return row.token_id;
}

/**
 * The token with this hash, revoked or not. With `markUsed` (the API, on a
 * cache miss) it also marks a live token used, in the same round trip,
 * unless it was marked within LAST_USED_RESOLUTION: that condition keeps
 * even the misses of several API processes from writing more than once per
 * token per interval.
 */
export async function selectToken(
  sql: Sql,
  hash: Uint8Array,
  { markUsed = false }: { markUsed?: boolean } = {},
): Promise<StoredToken | undefined> {
  const [row] = markUsed
    ? await sql<StoredToken[]>`
        with used as (
          update api_tokens set last_used_at = now()
           where token_hash = ${hash} and revoked_at is null
             and (expires_at is null or expires_at > now())
             and (last_used_at is null
                  or last_used_at < now() - ${LAST_USED_RESOLUTION}::interval)
        )
        select token_id, kind, tenant_id, name, expires_at, tenant_pattern, revoked_at
          from api_tokens where token_hash = ${hash}`
    : await sql<StoredToken[]>`
        select token_id, kind, tenant_id, name, expires_at, tenant_pattern, revoked_at
          from api_tokens where token_hash = ${hash}`;
  return row;
}

/** The tenant's tokens (or, for `null`, the service tokens), oldest first. */
export async function selectTokens(sql: Sql, tenantId: string | null): Promise<TokenListing[]> {
  return await sql<TokenListing[]>`
    select token_id, kind, tenant_id, name, tenant_pattern, created_at, last_used_at,
           expires_at, revoked_at
      from api_tokens
     where ${tenantId === null ? sql`kind = 'service'` : sql`tenant_id = ${tenantId}`}
     order by created_at, token_id`;
}

/**
 * Revokes a token by its id; idempotent (a revoked token keeps its first
 * `revoked_at`). `undefined` when there is no such token.
 */
export async function revokeToken(
  sql: Sql,
  tokenId: string,
): Promise<{ listing: TokenListing; already: boolean } | undefined> {
  const [row] = await sql<(TokenListing & { already: boolean })[]>`
    with old as (select token_id, revoked_at from api_tokens where token_id = ${tokenId})
    update api_tokens t set revoked_at = coalesce(t.revoked_at, now())
      from old where t.token_id = old.token_id
    returning t.token_id, t.kind, t.tenant_id, t.name, t.tenant_pattern, t.created_at,
              t.last_used_at, t.expires_at, t.revoked_at, old.revoked_at is not null as already`;
  if (row === undefined) return undefined;
  const { already, ...listing } = row;
  return { listing, already };
}
