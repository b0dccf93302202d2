/**
 * `deno task tenant <tenant> [--max-queued N|none] [--rate R|none]`: a
 * tenant's quotas (migration 012, admission/quota.ts). With no option it
 * prints them; with one it sets them (creating the tenant if needed, as
 * `deno task token` does) and prints one line with the result. The APIs
 * apply a change within their QUOTA_REFRESH_MS, without a restart.
 */
import { z } from "zod";
import { databaseEnv, logEnv, processEnv, readEnv } from "../core/config.ts";
import { createLogger } from "../core/log.ts";
import { createPool } from "../db/pool.ts";
import {
  type QuotaChange,
  selectTenantQuota,
  setTenantQuota,
  type TenantQuota,
} from "../db/tenant_quotas.ts";
import { isTenantId } from "../contracts/topics.ts";
import { type CommandSpec, parseCommandLine, usageError } from "../core/command_line.ts";

const TenantEnv = z.object({ ...databaseEnv, ...logEnv });

/** Exit code when the tenant asked about does not exist. */
export const NOT_FOUND = 1;

/** The largest `--max-queued` (the column is an integer). */
const MAX_QUEUED_LIMIT = 2_147_483_647;
/** The largest `--rate`, runs per second. */
const MAX_RATE = 1_000_000;

const COMMAND = {
  name: "tenant",
  synopsis: "<tenant> [--max-queued <n>|none] [--rate <r>|none]",
  description: `
Shows or sets a tenant's quotas. Past either, POST /v1/runs answers 429
(queue-full, rate-limited) with Retry-After and admits nothing; over Kafka the
relay retries the tenant's messages with backoff (its partitions wait, other
tenants flow) and never dead-letters them for it.

  tenant acme                    prints acme's quotas
  tenant acme --max-queued 1000  at most 1000 queued runs (due or not)
  tenant acme --rate 50          at most 50 runs admitted per second
  tenant acme --rate none        no rate limit (none: unlimited)

Setting a quota creates the tenant if needed and prints the result in one
line. The API processes read the quotas again every QUOTA_REFRESH_MS (1 s by
default), so a change takes effect within that, without a restart. The rate
is counted per API process (a burst of max(1, rate)): with N of them, a tenant
may get up to N x rate. Exit 1 when printing a tenant that does not exist.`,
  flags: {
    "max-queued": {
      type: "string",
      valueName: "n|none",
      description: "most queued runs, a whole number from 0; none: unlimited",
    },
    rate: {
      type: "string",
      valueName: "r|none",
      description: "most runs admitted per second (e.g. 0.5, 20), above 0; none: unlimited",
    },
  },
  positionals: { min: 1, max: 1 },
  env: TenantEnv,
} satisfies CommandSpec;

/** `--max-queued`'s value: a count, null for none, or undefined when it is not one. */
function parseMaxQueued(text: string): number | null | undefined {
  if (text === "none") return null;
  if (!/^(0|[1-9][0-9]{0,9})$/.test(text)) return undefined;
  const n = Number(text);
  return n <= MAX_QUEUED_LIMIT ? n : undefined;
}

/** `--rate`'s value: runs per second, null for none, or undefined when it is not one. */
function parseRate(text: string): number | null | undefined {
  if (text === "none") return null;
  if (!/^[0-9]{1,7}(\.[0-9]{1,6})?$/.test(text)) return undefined;
  const r = Number(text);
  return r > 0 && r <= MAX_RATE ? r : undefined;
}

/** One line for people: `acme: max-queued 1000, rate 50/s` (`unlimited` for none). */
function quotaLine(q: TenantQuota): string {
  const queued = q.max_queued === null ? "unlimited" : String(q.max_queued);
  const rate = q.admission_rate === null ? "unlimited" : `${q.admission_rate}/s`;
  return `${q.tenant_id}: max-queued ${queued}, rate ${rate}`;
}

/** Runs `tenant` with its arguments; returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const tenant = line.positionals[0];
  if (!isTenantId(tenant)) {
    return usageError(
      COMMAND,
      `bad tenant id ${JSON.stringify(tenant)}: use a-z, 0-9, _ and -, 1-63 chars`,
    );
  }
  const change: QuotaChange = {};
  const queued = line.flags["max-queued"];
  if (queued !== undefined) {
    const n = parseMaxQueued(queued);
    if (n === undefined) {
      return usageError(
        COMMAND,
        `bad --max-queued ${JSON.stringify(queued)}: a whole number from 0 to ` +
          `${MAX_QUEUED_LIMIT}, or none`,
      );
    }
    change.max_queued = n;
  }
  const rate = line.flags.rate;
  if (rate !== undefined) {
    const r = parseRate(rate);
    if (r === undefined) {
      return usageError(
        COMMAND,
        `bad --rate ${JSON.stringify(rate)}: runs per second above 0 (at most ${MAX_RATE}, ` +
          `e.g. 0.5 or 20), or none`,
      );
    }
    change.admission_rate = r;
  }

  const config = readEnv(TenantEnv, processEnv());
  const log = createLogger("tenant", config.LOG_LEVEL);
  const sql = createPool({ url: config.DATABASE_URL, max: 1, applicationName: "poimen-tenant" });
  try {
    if (Object.keys(change).length === 0) {
      const quota = await selectTenantQuota(sql, tenant);
      if (quota === undefined) {
        console.error(`tenant: no tenant ${JSON.stringify(tenant)}`);
        return NOT_FOUND;
      }
      console.log(quotaLine(quota));
      return 0;
    }
    const quota = await setTenantQuota(sql, tenant, change);
    log.debug("tenant quotas set", {
      tenant,
      max_queued: quota.max_queued,
      admission_rate: quota.admission_rate,
    });
    console.log(`${quotaLine(quota)} (set; the APIs apply it within QUOTA_REFRESH_MS)`);
    return 0;
  } finally {
    await sql.end({ timeout: 5 });
  }
}
