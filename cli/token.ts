/**
 * `deno task token <tenant>`: creates the tenant if needed and prints a new
 * tenant token. `deno task token --service <name>`: prints a new service
 * token (the relay's), which may act for any tenant named in Poimen-Tenant.
 * The token alone goes to stdout, so `TOKEN=$(deno task token acme)` works.
 */
import { z } from "zod";
import { databaseEnv, logEnv, processEnv, readEnv } from "../core/config.ts";
import { createLogger } from "../core/log.ts";
import { createPool } from "../db/pool.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import { hashToken, newToken } from "../api/auth.ts";
import { isTenantId } from "../contracts/topics.ts";
import { type CommandSpec, parseCommandLine, usageError } from "../core/command_line.ts";

const TokenEnv = z.object({ ...databaseEnv, ...logEnv });

const COMMAND = {
  name: "token",
  synopsis: "<tenant> | --service <name>",
  description: `
Creates the tenant if needed and prints a new tenant token; with --service,
prints a new service token (the relay's), which may act for any tenant named
in Poimen-Tenant. The token alone goes to stdout: TOKEN=$(deno task token acme).`,
  flags: {
    service: { type: "string", valueName: "name", description: "a service token for <name>" },
  },
  positionals: { min: 0, max: 1 },
  env: TokenEnv,
} satisfies CommandSpec;

export async function main(args: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const service = line.flags.service !== undefined;
  const name = line.flags.service ?? line.positionals[0];
  if (name === undefined || (service && line.positionals.length > 0)) {
    return usageError(COMMAND, "give either a <tenant> or --service <name> (see 'token --help')");
  }
  if (!service && !isTenantId(name)) {
    return usageError(
      COMMAND,
      `bad tenant id ${JSON.stringify(name)}: use a-z, 0-9, _ and -, 1-63 chars`,
    );
  }
  if (service && !/^[A-Za-z0-9_.-]{1,100}$/.test(name)) {
    return usageError(COMMAND, `bad service name ${JSON.stringify(name)}: use A-Z a-z 0-9 _ . -`);
  }
  const config = readEnv(TokenEnv, processEnv());
  const log = createLogger("token", config.LOG_LEVEL);
  const sql = createPool({ url: config.DATABASE_URL, max: 1, applicationName: "poimen-token" });
  try {
    const token = newToken();
    const hash = await hashToken(token);
    if (service) {
      await insertToken(sql, hash, { kind: "service", tenant_id: null, name });
    } else {
      if (await insertTenant(sql, name)) log.info("tenant created", { tenant: name });
      await insertToken(sql, hash, { kind: "tenant", tenant_id: name, name });
    }
    console.log(token);
    return 0;
  } finally {
    await sql.end({ timeout: 5 });
  }
}
