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

const USAGE = "usage: token <tenant> | token --service <name>";

export async function main(args: string[]): Promise<number> {
  const service = args[0] === "--service";
  const name = service ? args[1] : args[0];
  if (name === undefined || args.length !== (service ? 2 : 1)) {
    console.error(USAGE);
    return 64;
  }
  if (!service && !isTenantId(name)) {
    console.error(
      `token: bad tenant id ${JSON.stringify(name)}: use a-z, 0-9, _ and -, 1-63 chars`,
    );
    return 64;
  }
  if (service && !/^[A-Za-z0-9_.-]{1,100}$/.test(name)) {
    console.error(`token: bad service name ${JSON.stringify(name)}: use A-Z a-z 0-9 _ . -`);
    return 64;
  }
  const config = readEnv(z.object({ ...databaseEnv, ...logEnv }), processEnv());
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
