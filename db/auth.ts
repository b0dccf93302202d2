/** Tenants and API tokens. Tokens are looked up by their SHA-256 only. */
import type { Sql } from "./pool.ts";

export interface TokenRow {
  kind: "tenant" | "service";
  tenant_id: string | null;
  name: string;
}

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

/** Stores a token's hash. */
export async function insertToken(
  sql: Sql,
  hash: Uint8Array,
  token: TokenRow,
): Promise<void> {
  await sql`
    insert into api_tokens (token_hash, kind, tenant_id, name)
    values (${hash}, ${token.kind}, ${token.tenant_id}, ${token.name})`;
}

/** The live (not revoked) token with this hash. */
export async function selectToken(sql: Sql, hash: Uint8Array): Promise<TokenRow | undefined> {
  const [row] = await sql<TokenRow[]>`
    select kind, tenant_id, name from api_tokens
     where token_hash = ${hash} and revoked_at is null`;
  return row;
}
