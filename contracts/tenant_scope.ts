/**
 * A set of tenants, written as a list of tenant ids and prefixes:
 * `acme,beta,team-*` allows `acme`, `beta` and every tenant whose id starts
 * with `team-`; `*` allows every tenant. It is what a service token's
 * `--tenants`, the relay's `RELAY_TENANT_PATTERN` and a workflow's `tenants`
 * say.
 *
 * Why not a regular expression: a pattern written by whoever mints a token is
 * matched against a header anyone can send, and a regular expression can both
 * escape its anchors (`acme)|(.*`) and take exponential time (`(a+)+`). This
 * grammar has neither: matching is a set lookup and a few `startsWith`, linear
 * in the header's length, which is itself bounded by the tenant id grammar.
 */
import { isTenantId } from "./topics.ts";

// A prefix may be empty (`*`) and, like a tenant id, uses [a-z0-9_-]; 62
// characters leave room for at least one more in the tenant id (63 at most).
const PREFIX = /^[a-z0-9_-]{0,62}$/;

/** At most this many entries in one scope: a list, not a database. */
export const TENANT_SCOPE_MAX_ENTRIES = 100;

/** A parsed tenant scope; `allows` is linear in the tenant id's length. */
export interface TenantScope {
  /** Whether `tenant` is in the scope. */
  allows(tenant: string): boolean;
  /** The canonical text: entries sorted, duplicates dropped (what is stored). */
  readonly text: string;
  /** Whether the scope allows every tenant (`*`). */
  readonly all: boolean;
}

/**
 * Parses a scope, or says in one line why it cannot: `{ scope }` or
 * `{ problem }`. Accepts a comma-separated string or a list of entries;
 * spaces around entries are ignored.
 */
export function parseTenantScope(
  input: string | readonly string[],
): { scope: TenantScope; problem?: undefined } | { scope?: undefined; problem: string } {
  const entries = (typeof input === "string" ? input.split(",") : [...input]).map((e) => e.trim());
  if (entries.length === 0 || entries.every((e) => e === "")) {
    return { problem: "name at least one tenant id or prefix (acme,beta,team-*)" };
  }
  if (entries.length > TENANT_SCOPE_MAX_ENTRIES) {
    return { problem: `at most ${TENANT_SCOPE_MAX_ENTRIES} entries` };
  }
  const exact = new Set<string>();
  const prefixes = new Set<string>();
  for (const entry of entries) {
    if (entry.endsWith("*")) {
      const prefix = entry.slice(0, -1);
      if (!PREFIX.test(prefix)) {
        return {
          problem: `${
            JSON.stringify(entry)
          } is not a tenant id prefix ([a-z0-9_-] then one * at the end)`,
        };
      }
      prefixes.add(prefix);
    } else if (isTenantId(entry)) {
      exact.add(entry);
    } else {
      return {
        problem: `${
          JSON.stringify(entry)
        } is neither a tenant id ([a-z0-9_-]{1,63}) nor a prefix ending in *`,
      };
    }
  }
  const all = prefixes.has("");
  const text = all
    ? "*"
    : [...[...exact].sort(), ...[...prefixes].sort().map((p) => `${p}*`)].join(",");
  const prefixList = [...prefixes];
  return {
    scope: {
      text,
      all,
      allows: (tenant) =>
        isTenantId(tenant) &&
        (all || exact.has(tenant) || prefixList.some((p) => tenant.startsWith(p))),
    },
  };
}
