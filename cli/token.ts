/**
 * `deno task token`: mints, lists and revokes API tokens.
 *
 * - `token [create] <tenant> [--name <n>] [--expires-in <d>]`: creates the
 *   tenant if needed and prints a new tenant token.
 * - `token [create] --service <name> [--tenants <scope>] [--expires-in <d>]`:
 *   prints a new service token (the relay's), which may act for the tenant
 *   named in Poimen-Tenant — any tenant, or those `--tenants` lists
 *   (`acme,beta,team-*`: ids and prefixes, contracts/tenant_scope.ts).
 * - `token list <tenant>` / `token list --service`: the tokens, as a table.
 * - `token revoke <id>`: revokes one (idempotent).
 *
 * The new token alone goes to stdout, so `TOKEN=$(deno task token acme)`
 * works; its id is logged on stderr. "create", "list" and "revoke" are
 * words only in the first position: a tenant by such a name is reached with
 * `token create list` (or `token list list`), never mistaken for one.
 */
import { z } from "zod";
import { databaseEnv, logEnv, processEnv, readEnv } from "../core/config.ts";
import { createLogger, type Logger } from "../core/log.ts";
import { createPool, type Sql } from "../db/pool.ts";
import {
  insertTenant,
  insertToken,
  revokeToken,
  selectTokens,
  tenantExists,
  type TokenListing,
} from "../db/auth.ts";
import { hashToken, newToken, storedTenantScope } from "../contracts/tokens.ts";
import { parseTenantScope } from "../contracts/tenant_scope.ts";
import { isTenantId } from "../contracts/topics.ts";
import { UUID_PATTERN } from "../core/uuid.ts";
import { type CommandSpec, parseCommandLine, usageError } from "../core/command_line.ts";

const TokenEnv = z.object({ ...databaseEnv, ...logEnv });

/** The subcommand words, recognised only as the first argument. */
const SUBCOMMANDS = ["create", "list", "revoke"] as const;

/** Exit code when the tenant or token named does not exist. */
export const NOT_FOUND = 1;

const COMMAND = {
  name: "token",
  synopsis: "[create] <tenant> | [create] --service <name> | list <tenant> | list --service | " +
    "revoke <id>",
  description: `
Mints, lists and revokes API tokens.

  token <tenant>            creates the tenant if needed and prints a new tenant
                            token alone on stdout: TOKEN=$(deno task token acme)
  token --service <name>    prints a new service token (the relay's), which acts
                            for the tenant named in Poimen-Tenant: any tenant, or
                            with --tenants only those listed (acme,beta,team-*)
  token list <tenant>       the tenant's tokens: id, name, created, last used,
                            expiry, revoked (never a secret)
  token list --service      the service tokens, with their tenant scopes
  token revoke <id>         revokes a token (idempotent); exit 1 if there is none

The new token's id (for list and revoke) is logged on stderr. create, list and
revoke are words only as the first argument: for a tenant named "list", say
'token create list'. Durations: a whole number and s, m, h or d (30d, 12h).`,
  flags: {
    service: { type: "string", valueName: "name", description: "a service token for <name>" },
    name: {
      type: "string",
      valueName: "name",
      description: "a tenant token's name, recorded as its runs' source (default: the tenant)",
    },
    "expires-in": {
      type: "string",
      valueName: "duration",
      description: "the token stops working after this long (default: never)",
    },
    tenants: {
      type: "string",
      valueName: "scope",
      description:
        "a service token only for these tenant ids and prefixes, e.g. 'acme,beta,team-*'" +
        " (* is every tenant)",
    },
  },
  positionals: { min: 0, max: 1 },
  env: TokenEnv,
} satisfies CommandSpec;

const LIST = {
  name: "token list",
  synopsis: "<tenant> | --service",
  description: `
Prints a tenant's tokens, or with --service the service tokens, as a table:
id, name, (tenant scope,) created, last used, expiry and revocation, oldest
first. Never a secret or its hash. Last use is coarse: it is recorded at most
once per five minutes per token. Exit 1 for an unknown tenant.`,
  flags: { service: { type: "boolean", description: "list the service tokens" } },
  positionals: { min: 0, max: 1 },
  env: TokenEnv,
} satisfies CommandSpec;

const REVOKE = {
  name: "token revoke",
  synopsis: "<id>",
  description: `
Revokes the token with this id (see 'token list'). The API refuses it within
AUTH_CACHE_MS. Revoking a revoked token changes nothing and succeeds; an id
no token has is exit 1.`,
  positionals: { min: 1, max: 1 },
  env: TokenEnv,
} satisfies CommandSpec;

const NAME = /^[A-Za-z0-9_.-]{1,100}$/;
/** What api_tokens.tenant_pattern holds at most (migrations/010). */
const TENANTS_MAX_CHARS = 1000;
const UNITS_MS: Record<string, number> = { s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** `30d`, `12h`, `15m`, `90s` in milliseconds; `undefined` for anything else. */
function parseDuration(text: string): number | undefined {
  const m = /^([1-9][0-9]{0,5})([smhd])$/.exec(text);
  return m ? Number(m[1]) * UNITS_MS[m[2]] : undefined;
}

export async function main(args: string[]): Promise<number> {
  const first = args[0];
  if (first === "list") return await list(args.slice(1));
  if (first === "revoke") return await revoke(args.slice(1));
  return await create(first === "create" ? args.slice(1) : args, first === "create");
}

async function create(args: string[], explicit: boolean): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const { flags } = line;
  const service = flags.service !== undefined;
  const name = flags.service ?? line.positionals[0];
  if (name === undefined || (service && line.positionals.length > 0)) {
    return usageError(COMMAND, "give either a <tenant> or --service <name> (see 'token --help')");
  }
  if (!explicit && (SUBCOMMANDS as readonly string[]).includes(name)) {
    return usageError(
      COMMAND,
      `"${name}" is a subcommand only as the first argument; for a ${
        service ? "service" : "tenant"
      } by that name say 'token create ${service ? "--service " : ""}${name}'`,
    );
  }
  if (!service && !isTenantId(name)) {
    return usageError(
      COMMAND,
      `bad tenant id ${JSON.stringify(name)}: use a-z, 0-9, _ and -, 1-63 chars`,
    );
  }
  if (service && !NAME.test(name)) {
    return usageError(COMMAND, `bad service name ${JSON.stringify(name)}: use A-Z a-z 0-9 _ . -`);
  }
  if (service && flags.name !== undefined) {
    return usageError(
      COMMAND,
      "--name is for tenant tokens; a service token is named by --service",
    );
  }
  if (flags.name !== undefined && !NAME.test(flags.name)) {
    return usageError(COMMAND, `bad --name ${JSON.stringify(flags.name)}: use A-Z a-z 0-9 _ . -`);
  }
  if (!service && flags.tenants !== undefined) {
    return usageError(COMMAND, "--tenants limits a service token; a tenant token has its tenant");
  }
  let pattern: string | undefined;
  if (flags.tenants !== undefined) {
    const { scope, problem } = parseTenantScope(flags.tenants);
    if (problem !== undefined) {
      return usageError(
        COMMAND,
        `bad --tenants ${
          JSON.stringify(flags.tenants)
        }: ${problem}; give tenant ids and prefixes, e.g. acme,beta,team-*`,
      );
    }
    // Stored canonical; `*` is the same as no limit, stored as none.
    pattern = scope.all ? undefined : scope.text;
    if (pattern !== undefined && pattern.length > TENANTS_MAX_CHARS) {
      return usageError(
        COMMAND,
        `bad --tenants: at most ${TENANTS_MAX_CHARS} characters (use prefixes: team-*)`,
      );
    }
  }
  let expiresInMs: number | undefined;
  if (flags["expires-in"] !== undefined) {
    expiresInMs = parseDuration(flags["expires-in"]);
    if (expiresInMs === undefined) {
      return usageError(
        COMMAND,
        `bad --expires-in ${
          JSON.stringify(flags["expires-in"])
        }: use a whole number and s, m, h or d, e.g. 30d`,
      );
    }
  }

  return await withDatabase("poimen-token", async (sql, log) => {
    const token = newToken();
    const hash = await hashToken(token);
    const expires_at = expiresInMs === undefined ? null : new Date(Date.now() + expiresInMs);
    let id;
    if (service) {
      id = await insertToken(sql, hash, {
        kind: "service",
        tenant_id: null,
        name,
        expires_at,
        tenant_pattern: pattern ?? null,
      });
    } else {
      if (await insertTenant(sql, name)) log.info("tenant created", { tenant: name });
      id = await insertToken(sql, hash, {
        kind: "tenant",
        tenant_id: name,
        name: flags.name ?? name,
        expires_at,
      });
    }
    log.info("token created", {
      id,
      ...(service ? { service_name: name, tenants: pattern ?? "any" } : { tenant: name }),
      expires_at: expires_at?.toISOString() ?? "never",
    });
    console.log(token);
    return 0;
  });
}

async function list(args: string[]): Promise<number> {
  const line = parseCommandLine(LIST, args);
  if (typeof line === "number") return line;
  const service = line.flags.service === true;
  const tenant = line.positionals[0];
  if (service === (tenant !== undefined)) {
    return usageError(LIST, "give either a <tenant> or --service (see 'token list --help')");
  }
  if (tenant !== undefined && !isTenantId(tenant)) {
    return usageError(
      LIST,
      `bad tenant id ${JSON.stringify(tenant)}: use a-z, 0-9, _ and -, 1-63 chars`,
    );
  }
  return await withDatabase("poimen-token", async (sql) => {
    if (tenant !== undefined && !(await tenantExists(sql, tenant))) {
      console.error(`token list: no tenant ${JSON.stringify(tenant)}`);
      return NOT_FOUND;
    }
    for (const row of tokenTable(await selectTokens(sql, tenant ?? null), service)) {
      console.log(row);
    }
    return 0;
  });
}

async function revoke(args: string[]): Promise<number> {
  const line = parseCommandLine(REVOKE, args);
  if (typeof line === "number") return line;
  const id = line.positionals[0].toLowerCase();
  if (!UUID_PATTERN.test(id)) {
    return usageError(REVOKE, `bad token id ${JSON.stringify(id)}: ids are UUIDs (token list)`);
  }
  return await withDatabase("poimen-token", async (sql, log) => {
    const revoked = await revokeToken(sql, id);
    if (revoked === undefined) {
      console.error(`token revoke: no token ${id}`);
      return NOT_FOUND;
    }
    const { listing, already } = revoked;
    log.info(already ? "token already revoked" : "token revoked", {
      id,
      name: listing.name,
      ...(listing.tenant_id === null ? { kind: "service" } : { tenant: listing.tenant_id }),
      revoked_at: listing.revoked_at?.toISOString(),
    });
    console.log(`${already ? "already revoked" : "revoked"} ${id} ${when(listing.revoked_at)}`);
    return 0;
  });
}

/** The aligned table `token list` prints: a header, then a row per token. */
function tokenTable(tokens: TokenListing[], service: boolean): string[] {
  const header = [
    "ID",
    "NAME",
    ...(service ? ["TENANTS"] : []),
    "CREATED",
    "LAST USED",
    "EXPIRES",
    "REVOKED",
  ];
  const rows = tokens.map((t) => [
    t.token_id,
    t.name,
    ...(service ? [tenantsCell(t.tenant_pattern)] : []),
    when(t.created_at),
    when(t.last_used_at),
    when(t.expires_at),
    when(t.revoked_at),
  ]);
  const all = [header, ...rows];
  const widths = header.map((_, i) => Math.max(...all.map((r) => r[i].length)));
  return all.map((r) => r.map((cell, i) => cell.padEnd(widths[i])).join("  ").trimEnd());
}

// A pattern stored as a regular expression that migration 015 could not
// rewrite allows no tenant; the listing says so rather than suggest otherwise.
function tenantsCell(pattern: string | null): string {
  if (pattern === null) return "any";
  return storedTenantScope(pattern).legacy ? `none (not a scope: ${pattern})` : pattern;
}

function when(at: Date | null): string {
  return at === null ? "-" : at.toISOString().replace(/\.\d{3}Z$/, "Z");
}

async function withDatabase(
  applicationName: string,
  work: (sql: Sql, log: Logger) => Promise<number>,
): Promise<number> {
  const config = readEnv(TokenEnv, processEnv());
  const log = createLogger("token", config.LOG_LEVEL);
  const sql = createPool({ url: config.DATABASE_URL, max: 1, applicationName });
  try {
    return await work(sql, log);
  } finally {
    await sql.end({ timeout: 5 });
  }
}
