/**
 * `deno task init`: readies an empty installation, idempotently, so a
 * container platform can run it before every start (compose.yaml's `init`
 * service): migrates, creates the tenants of POIMEN_TENANTS with their
 * topics, with `--builtins` registers the built-in workflows (echo, sleep,
 * fail: for development and trying poimen out; `migrate` registers no
 * workflow), and, when RELAY_TOKEN_FILE is set, keeps the relay's service token
 * there — minted on the first run, read back and re-registered (should the
 * database have been reset) on every later one, so restarts reuse it; one
 * revoked or expired is replaced by a new one. The token minted is a service
 * token named "relay" for every tenant, so tenants added later need no new
 * token (`deno task token --service relay --tenants …` mints a limited one to
 * put in the file instead). The token itself is never printed or logged.
 */
import { z } from "zod";
import { databaseEnv, kafkaEnv, logEnv, processEnv, readEnv } from "../core/config.ts";
import { kafkaConnection } from "../kafka/security.ts";
import { createLogger, type Logger } from "../core/log.ts";
import { type CommandSpec, parseCommandLine } from "../core/command_line.ts";
import { isTenantId } from "../contracts/topics.ts";
import { createPool, type Sql } from "../db/pool.ts";
import { insertTenant, insertToken, selectToken } from "../db/auth.ts";
import { registerVersions } from "../db/catalog.ts";
import { notifyCatalog } from "../db/notify.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { hashToken, isTokenShaped, newToken } from "../contracts/tokens.ts";
import { createAdmin } from "../kafka/admin.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { createAndMigrate, migrationEnv, migrationOptions } from "./migrate.ts";

/** The service name the relay's token is registered under. */
export const RELAY_SERVICE = "relay";

export const InitEnv = z.object({
  ...databaseEnv,
  ...kafkaEnv,
  ...logEnv,
  ...migrationEnv,
  /** Tenants to create, with their topics: a comma-separated list of tenant ids. */
  POIMEN_TENANTS: z.string().default("").refine(
    (v) => tenantList(v).every(isTenantId),
    "expected tenant ids (a-z, 0-9, _ and -, 1-63 chars) separated by commas",
  ),
  /** Where the relay's service token is kept; unset: no relay token. */
  RELAY_TOKEN_FILE: z.string().min(1).optional(),
});

const COMMAND = {
  name: "init",
  synopsis: "",
  description: `
Readies an installation, idempotently: migrates the database, creates the
tenants of POIMEN_TENANTS and declares their topics, and keeps the relay's
service token in RELAY_TOKEN_FILE (minted once, re-registered if the database
lost it). Safe to run before every start.

With --builtins it also registers the built-in workflows echo@1, sleep@1 and
fail@1 in the catalog, so they are admitted before a worker hosting them
starts (deno task up and compose.yaml do, for development). Without it the
catalog holds only what workers registered: in production, leave it out, or
any tenant could queue runs of them that wait for a worker forever.`,
  flags: {
    builtins: {
      type: "boolean",
      description: "register the built-in workflows echo, sleep and fail (development)",
    },
  },
  env: InitEnv,
} satisfies CommandSpec;

function tenantList(value: string): string[] {
  return value.split(",").map((t) => t.trim()).filter(Boolean);
}

export async function main(args: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const config = readEnv(InitEnv, processEnv());
  const log = createLogger("init", config.LOG_LEVEL);
  const tenants = tenantList(config.POIMEN_TENANTS);

  await createAndMigrate(config.DATABASE_URL, log, migrationOptions(config));
  const sql = createPool({ url: config.DATABASE_URL, max: 1, applicationName: "poimen-init" });
  try {
    for (const tenant of tenants) {
      if (await insertTenant(sql, tenant)) log.info("tenant created", { tenant });
    }
    if (line.flags.builtins) await registerBuiltins(sql, log);
    if (config.RELAY_TOKEN_FILE !== undefined) {
      await ensureRelayToken(sql, config.RELAY_TOKEN_FILE, log);
    }
  } finally {
    await sql.end({ timeout: 5 });
  }

  if (tenants.length > 0) {
    const admin = createAdmin({
      ...kafkaConnection(config),
      clientId: `${config.KAFKA_CLIENT_ID}-init`,
      logger: log,
    });
    try {
      for (const tenant of tenants) {
        const { created } = await ensureTenantTopics(admin, tenant, {
          partitions: config.TOPIC_PARTITIONS,
          replicationFactor: config.TOPIC_REPLICATION_FACTOR,
          retentionMs: config.TOPIC_RETENTION_MS,
        });
        log.info("topics declared", { tenant, created });
      }
    } finally {
      await admin.close();
    }
  }
  log.info("initialised", { tenants });
  return 0;
}

/**
 * Registers the built-in workflows as a worker hosting them would (so a
 * version already registered with another definition is an error), and
 * tells the APIs. Each name's first version registered is its current one.
 */
export async function registerBuiltins(sql: Sql, log: Logger): Promise<void> {
  const found = await registerVersions(sql, builtinRegistry().catalogVersions(), "poimen init");
  const conflict = found.find((r) => r.same !== true);
  if (conflict) {
    throw new Error(
      `built-in workflow ${conflict.name}@${conflict.version} ${
        conflict.refused
          ? `declares another concurrency than ${conflict.name}@${conflict.refused.version}`
          : "is registered with another definition"
      }; init registers the built-ins only where they are poimen's own`,
    );
  }
  const created = found.filter((r) => r.created).map((r) => `${r.name}@${r.version}`);
  if (created.length > 0) await notifyCatalog(sql);
  log.info("built-in workflows registered", { created });
}

/**
 * Reads the token kept in `path` (minting and writing one when there is none,
 * or when the one kept was revoked or has expired) and registers it. The
 * token minted is an unlimited service token named RELAY_SERVICE; one the
 * operator put in the file instead (say, limited with `token --service relay
 * --tenants …`) is kept as it is.
 */
async function ensureRelayToken(sql: Sql, path: string, log: Logger): Promise<void> {
  let token = (await Deno.readTextFile(path).catch((err) => {
    if (err instanceof Deno.errors.NotFound) return "";
    throw err;
  })).trim();
  // Only what `newToken` makes is registered: a stray line, a path or a
  // password put in the file by mistake must not become a service token.
  if (token !== "" && !isTokenShaped(token)) {
    throw new Error(
      `${path} does not hold a poimen token (pmn_ and 43 base64url characters); ` +
        "empty it to mint one, or put a token from 'deno task token --service relay' in it",
    );
  }
  let known = token === "" ? undefined : await selectToken(sql, await hashToken(token));
  if (known !== undefined && known.kind !== "service") {
    throw new Error(`${path} holds a ${known.kind} token, not a service token`);
  }
  const dead = known !== undefined &&
    (known.revoked_at !== null || (known.expires_at !== null && known.expires_at <= new Date()));
  if (token === "" || dead) {
    token = newToken();
    known = undefined;
    // Written whole or not at all: a crash mid-write must not leave half a token.
    const partial = `${path}.partial`;
    await Deno.writeTextFile(partial, token + "\n", { mode: 0o600 });
    await Deno.rename(partial, path);
    log.info(dead ? "relay token revoked or expired: minted a new one" : "relay token minted", {
      file: path,
    });
  }
  if (known === undefined) {
    const id = await insertToken(sql, await hashToken(token), {
      kind: "service",
      tenant_id: null,
      name: RELAY_SERVICE,
    });
    log.info("relay token registered", { file: path, id });
  } else {
    log.info("relay token already registered", { file: path, id: known.token_id });
  }
}
