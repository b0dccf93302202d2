/**
 * Bearer-token authentication. Tokens are `pmn_` + 256 random bits, stored
 * as SHA-256; a verified token is cached briefly so admission does not pay a
 * database round trip per request (a revoked token stops working within
 * `cacheMs`, an expired one at its `expires_at`). A tenant token acts for
 * its own tenant; a service token acts for the tenant named in
 * `Poimen-Tenant` (one its tenant pattern allows, if it has one), and only a
 * service token may.
 */
import { PoimenError } from "../core/errors.ts";
import type { Sql } from "../db/pool.ts";
import { selectToken, type StoredToken, tenantExists } from "../db/auth.ts";
import { isTenantId } from "../contracts/topics.ts";

/** Who is calling, once authenticated. */
export interface Principal {
  kind: "tenant" | "service";
  /** The tenant this request acts for. */
  tenantId: string;
  /** The token's name, recorded as the run's source (`http:<name>`). */
  name: string;
}

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

/**
 * A service token's tenant pattern as the API applies it: the whole tenant
 * id must match (`acme|beta` allows exactly those two). Throws a
 * `SyntaxError` for a pattern that does not compile.
 */
export function tenantPatternRegExp(pattern: string): RegExp {
  return new RegExp(`^(?:${pattern})$`);
}

/** A stored token with its tenant pattern compiled once, when loaded. */
interface LoadedToken {
  row: StoredToken;
  /** null: any tenant. */
  tenants: RegExp | null;
}

// A pattern stored without the CLI's check and not compiling allows nothing:
// failing closed is the only safe reading of a limit nobody can interpret.
const NO_TENANT = /(?!)/;

function loaded(row: StoredToken): LoadedToken {
  let tenants: RegExp | null = null;
  if (row.tenant_pattern !== null) {
    try {
      tenants = tenantPatternRegExp(row.tenant_pattern);
    } catch {
      tenants = NO_TENANT;
    }
  }
  return { row, tenants };
}

interface Cached<T> {
  value: T;
  until: number;
}

/** Resolves a request's principal from its bearer token, with a short-lived cache of tokens. */
export class Authenticator {
  readonly #sql: Sql;
  readonly #cacheMs: number;
  readonly #tokens = new Map<string, Cached<LoadedToken | undefined>>();
  readonly #tenants = new Map<string, Cached<boolean>>();
  readonly #onFailure: (reason: string) => void;

  constructor(sql: Sql, cacheMs: number, onFailure: (reason: string) => void = () => {}) {
    this.#sql = sql;
    this.#cacheMs = cacheMs;
    this.#onFailure = onFailure;
  }

  /** Resolves the principal for an `Authorization` and a `Poimen-Tenant` header value. */
  async authenticate(
    authorization: string | undefined,
    tenantHeader: string | undefined,
  ): Promise<Principal> {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(authorization ?? "");
    if (!m) this.#fail("unauthorized", "missing-token", "a bearer token is required");
    const loadedToken = await this.#token(m[1]);
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
    if (loadedToken.tenants !== null && !loadedToken.tenants.test(tenantHeader)) {
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
    return await this.#cached(this.#tokens, token, async () => {
      const row = await selectToken(this.#sql, await hashToken(token), { markUsed: true });
      return row && loaded(row);
    });
  }

  async #tenantExists(tenantId: string): Promise<boolean> {
    // Only "exists" is cached: a tenant created a moment ago must work at once.
    return await this.#cached(
      this.#tenants,
      tenantId,
      () => tenantExists(this.#sql, tenantId),
      (exists) => exists,
    );
  }

  async #cached<T>(
    map: Map<string, Cached<T>>,
    key: string,
    load: () => Promise<T>,
    keep: (value: T) => boolean = () => true,
  ): Promise<T> {
    const now = Date.now();
    const hit = map.get(key);
    if (hit && hit.until > now) return hit.value;
    const value = await load();
    if (!keep(value)) return value;
    // Bounded: a flood of bad tokens must not grow memory without limit.
    if (map.size >= 10_000) map.clear();
    map.set(key, { value, until: now + this.#cacheMs });
    return value;
  }
}
