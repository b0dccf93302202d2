/**
 * API tokens as they are issued and stored: a token's shape (`pmn_` + 256
 * random bits, base64url), its SHA-256 (what is stored and looked up, never
 * the token), and how a stored `tenant_pattern` reads. The CLI issues
 * tokens (cli/token.ts, cli/init.ts) and the API checks them (api/auth.ts)
 * by these same definitions. Depends on nothing but contracts/tenant_scope.ts.
 */
import { parseTenantScope, type TenantScope } from "./tenant_scope.ts";

/** A new random token, as shown once to its owner. */
export function newToken(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(32));
  return "pmn_" + btoa(String.fromCharCode(...bytes)).replaceAll("+", "-").replaceAll("/", "_")
    .replaceAll("=", "");
}

/** SHA-256 of a token: what is stored and looked up. */
export async function hashToken(token: string): Promise<Uint8Array> {
  return new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(token)));
}

const TOKEN_SHAPE = /^pmn_[A-Za-z0-9_-]{43}$/;

/**
 * Whether `text` has the shape of a token `newToken` makes: `pmn_` and 43
 * base64url characters. Anything else cannot be a token, so it is refused
 * without hashing it or asking the database.
 */
export function isTokenShaped(text: string): boolean {
  return TOKEN_SHAPE.test(text);
}

const NO_TENANT: TenantScope = { allows: () => false, text: "", all: false };

/**
 * A stored `tenant_pattern` as the API applies it: a tenant scope
 * (`acme,beta,team-*`, contracts/tenant_scope.ts), null when the token may
 * act for any tenant. A pattern that is not a scope (a regular expression
 * stored before migration 015 that it could not rewrite) allows no tenant:
 * failing closed is the only safe reading of a limit nobody can interpret,
 * and no regular expression built from stored data is ever run on a header.
 */
export function storedTenantScope(
  pattern: string | null,
): { scope: TenantScope | null; legacy: boolean } {
  if (pattern === null) return { scope: null, legacy: false };
  const { scope } = parseTenantScope(pattern);
  return scope ? { scope, legacy: false } : { scope: NO_TENANT, legacy: true };
}
