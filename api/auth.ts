/**
 * Bearer-token authentication. Tokens are `pmn_` + 256 random bits, stored
 * as SHA-256; a verified token is cached briefly so admission does not pay a
 * database round trip per request (a revoked token stops working within
 * `cacheMs`, an expired one at its `expires_at`). A tenant token acts for
 * its own tenant; a service token acts for the tenant named in
 * `Poimen-Tenant` (one its tenant scope allows, if it has one), and only a
 * service token may. What is not token-shaped is refused without I/O, and
 * unknown tokens are remembered apart from found ones, so junk never evicts
 * a real token from the cache.
 */
import { PoimenError } from "../core/errors.ts";
import type { Sql } from "../db/pool.ts";
import { selectToken, type StoredToken, tenantExists } from "../db/auth.ts";
import { isTenantId } from "../contracts/topics.ts";
import type { TenantScope } from "../contracts/tenant_scope.ts";
import { hashToken, isTokenShaped, storedTenantScope } from "../contracts/tokens.ts";
import type { Logger } from "../core/log.ts";

/** Who is calling, once authenticated. */
export interface Principal {
  kind: "tenant" | "service";
  /** The tenant this request acts for. */
  tenantId: string;
  /** The token's name, recorded as the run's source (`http:<name>`). */
  name: string;
}

/** A stored token with its tenant scope parsed once, when loaded. */
interface LoadedToken {
  row: StoredToken;
  /** null: any tenant. */
  tenants: TenantScope | null;
}

interface Cached<T> {
  value: T;
  until: number;
}

/** Tokens found (live, revoked or expired) kept at most: more than any installation has. */
const FOUND_MAX = 10_000;
/**
 * Token-shaped strings no token has, kept at most: a small, separate map, so
 * that a flood of made-up tokens evicts only other made-up tokens and never
 * a real one.
 */
const UNKNOWN_MAX = 1_000;

/** What the Authenticator needs besides its database; all optional. */
export interface AuthenticatorOptions {
  /** Called with each refusal's reason (a metric label). */
  onFailure?: (reason: string) => void;
  /** Where a token whose tenant pattern allows nothing is reported, when it is loaded. */
  log?: Logger;
  /** How a token is looked up by its hash (db/auth.ts selectToken; a test may count calls). */
  lookup?: typeof selectToken;
}

/** Resolves a request's principal from its bearer token, with a short-lived cache of tokens. */
export class Authenticator {
  readonly #sql: Sql;
  readonly #cacheMs: number;
  /** Tokens found in the database, whatever their state; evicted only by other found tokens. */
  readonly #found = new Map<string, Cached<LoadedToken>>();
  /** Token-shaped strings found in no row, remembered briefly so a retrying client costs little. */
  readonly #unknown = new Map<string, number>();
  readonly #tenants = new Map<string, Cached<boolean>>();
  readonly #onFailure: (reason: string) => void;
  readonly #log: Logger | undefined;
  readonly #lookup: typeof selectToken;

  constructor(sql: Sql, cacheMs: number, options: AuthenticatorOptions = {}) {
    this.#sql = sql;
    this.#cacheMs = cacheMs;
    this.#onFailure = options.onFailure ?? (() => {});
    this.#log = options.log;
    this.#lookup = options.lookup ?? selectToken;
  }

  /** Resolves the principal for an `Authorization` and a `Poimen-Tenant` header value. */
  async authenticate(
    authorization: string | undefined,
    tenantHeader: string | undefined,
  ): Promise<Principal> {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(authorization ?? "");
    if (!m) this.#fail("unauthorized", "missing-token", "a bearer token is required");
    // What no token can be is refused as an unknown one is, with no I/O.
    const loadedToken = isTokenShaped(m[1]) ? await this.#token(m[1]) : undefined;
    if (!loadedToken) this.#fail("unauthorized", "bad-token", "the bearer token is not valid");
    const token = loadedToken.row;
    if (token.revoked_at !== null) {
      this.#fail("unauthorized", "revoked-token", "the bearer token has been revoked");
    }
    // Checked on every use, not only when loaded: a cached token must not
    // outlive its expiry by up to the cache's lifetime.
    if (token.expires_at !== null && token.expires_at.getTime() <= Date.now()) {
      this.#fail("unauthorized", "expired-token", "the bearer token has expired");
    }

    if (token.kind === "tenant") {
      if (tenantHeader !== undefined && tenantHeader !== token.tenant_id) {
        this.#fail("forbidden", "wrong-tenant", "this token may act only for its own tenant");
      }
      return { kind: "tenant", tenantId: token.tenant_id!, name: token.name };
    }
    if (tenantHeader === undefined) {
      this.#fail("forbidden", "no-tenant", "a service token must name a tenant in Poimen-Tenant");
    }
    // A set lookup and a few prefixes: linear in the header, whatever was stored.
    if (loadedToken.tenants !== null && !loadedToken.tenants.allows(tenantHeader)) {
      this.#fail(
        "forbidden",
        "tenant-not-allowed",
        `this service token may not act for tenant ${JSON.stringify(tenantHeader)}`,
      );
    }
    if (!isTenantId(tenantHeader) || !(await this.#tenantExists(tenantHeader))) {
      this.#fail("forbidden", "unknown-tenant", `unknown tenant ${JSON.stringify(tenantHeader)}`);
    }
    return { kind: "service", tenantId: tenantHeader, name: token.name };
  }

  #fail(code: "unauthorized" | "forbidden", reason: string, message: string): never {
    this.#onFailure(reason);
    throw new PoimenError(code, message);
  }

  // Keyed by the token as presented, not by its hash: hashing (an async
  // WebCrypto call) was the largest single CPU cost of an admission. The
  // token is in this process' memory for the request anyway; only its hash
  // is ever stored or sent to the database.
  // A miss is also what marks the token used (db/auth.ts selectToken), so
  // last_used_at costs nothing on a cache hit.
  async #token(token: string): Promise<LoadedToken | undefined> {
    const now = Date.now();
    const hit = this.#found.get(token);
    if (hit && hit.until > now) return hit.value;
    const unknownUntil = this.#unknown.get(token);
    if (unknownUntil !== undefined && unknownUntil > now) return undefined;
    const row = await this.#lookup(this.#sql, await hashToken(token), { markUsed: true });
    if (row === undefined) {
      remember(this.#unknown, token, now + this.#cacheMs, UNKNOWN_MAX);
      return undefined;
    }
    this.#unknown.delete(token);
    const { scope, legacy } = storedTenantScope(row.tenant_pattern);
    if (legacy) {
      // Logged when loaded, so at most once per token per cache lifetime.
      this.#log?.warn("service token's tenant pattern is not a tenant scope: it allows no tenant", {
        id: row.token_id,
        name: row.name,
        hint: "mint a new token with --tenants acme,beta,team-* and revoke this one",
      });
    }
    const value = { row, tenants: scope };
    remember(this.#found, token, { value, until: now + this.#cacheMs }, FOUND_MAX);
    return value;
  }

  async #tenantExists(tenantId: string): Promise<boolean> {
    // Only "exists" is cached: a tenant created a moment ago must work at once.
    const now = Date.now();
    const hit = this.#tenants.get(tenantId);
    if (hit && hit.until > now) return hit.value;
    const exists = await tenantExists(this.#sql, tenantId);
    if (exists) {
      remember(this.#tenants, tenantId, { value: true, until: now + this.#cacheMs }, FOUND_MAX);
    }
    return exists;
  }
}

/**
 * Sets `key` as the newest entry of a map bounded to `max` entries, dropping
 * the oldest when full: one flood cannot grow memory, and an entry is
 * evicted only by entries of its own map.
 */
function remember<V>(map: Map<string, V>, key: string, value: V, max: number): void {
  map.delete(key);
  if (map.size >= max) map.delete(map.keys().next().value!);
  map.set(key, value);
}
