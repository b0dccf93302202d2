/**
 * `deno task workflow`: the workflow catalog as an operator sees it.
 *
 * - `workflow list [<name>]`: every registered version, which is current,
 *   its tenants, concurrency and live workers, as a table.
 * - `workflow promote <name>@<version>`: makes that version current, so runs
 *   naming only the workflow get it from then on (migration 018); the APIs
 *   learn it by NOTIFY at once (or within CATALOG_REFRESH_MS).
 *
 * A worker of a new version starting changes nothing for runs naming only
 * the workflow: only a name's first version becomes current by itself.
 */
import { z } from "zod";
import { databaseEnv, logEnv, processEnv, readEnv } from "../core/config.ts";
import { createLogger, type Logger } from "../core/log.ts";
import { type CommandSpec, parseCommandLine, usageError } from "../core/command_line.ts";
import { WORKFLOW_NAME_PATTERN, WORKFLOW_REF_PATTERN } from "../contracts/runs.ts";
import { notifyCatalog } from "../db/notify.ts";
import { createPool, type Sql } from "../db/pool.ts";
import {
  promoteVersion,
  selectVersionListing,
  type VersionListing,
} from "../db/workflow_current.ts";

const WorkflowEnv = z.object({ ...databaseEnv, ...logEnv });

/** Exit code when the workflow or version named is not registered. */
export const NOT_FOUND = 1;

/** Recorded as `promoted_by` of a promotion made here. */
const PROMOTED_BY = "deno task workflow promote";

const COMMAND = {
  name: "workflow",
  synopsis: "list [<name>] | promote <name>@<version>",
  description: `
Lists the registered workflow versions, or promotes one to current.

  workflow list                      every version: which is current, its
                                     tenants, concurrency and live workers
  workflow list billing.invoice      the versions of one workflow
  workflow promote billing.invoice@2 runs naming only billing.invoice get
                                     version 2 from now on

A run naming only the workflow (workflow_ref "billing.invoice") gets its
current version; "billing.invoice@1" always gets version 1. The first version
of a workflow registered becomes current by itself; a later one (a worker of
version 2 starting, a canary) only when promoted here, and stopping its workers
changes nothing either. Promoting an older version goes back to it. A tenant
that may not start the current version (a version's tenants) gets the newest
older version it may start. Runs admitted before a promotion keep their
version. The APIs apply a promotion at once (NOTIFY), or within
CATALOG_REFRESH_MS. Exit 1 when the workflow or version is not registered.`,
  positionals: { min: 0, max: 2 },
  env: WorkflowEnv,
} satisfies CommandSpec;

const LIST = {
  name: "workflow list",
  synopsis: "[<name>]",
  description: `
Prints the registered workflow versions (of <name> only, when given) as a
table, by name and version: whether it is current, the tenants that may start
it, its concurrency limit (and key), max attempts, when it was registered, and
the live workers hosting it (how many, and their ids). Exit 1 when <name> has
no registered version.`,
  positionals: { min: 0, max: 1 },
  env: WorkflowEnv,
} satisfies CommandSpec;

const PROMOTE = {
  name: "workflow promote",
  synopsis: "<name>@<version>",
  description: `
Makes <name>@<version> the workflow's current version: runs naming only
<name> get it from now on; runs already admitted keep theirs. The version must
be registered (a worker hosting it has started once). Promoting a version no
live worker hosts is allowed (its runs wait for one), and the line printed
says so. Exit 1 when the version is not registered.`,
  positionals: { min: 1, max: 1 },
  env: WorkflowEnv,
} satisfies CommandSpec;

/** Runs `workflow` with its arguments; returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const first = args[0];
  if (first === "list") return await list(args.slice(1));
  if (first === "promote") return await promote(args.slice(1));
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  return usageError(
    COMMAND,
    first === undefined
      ? "give list or promote (see 'workflow --help')"
      : `unknown subcommand ${JSON.stringify(first)}: list or promote (see 'workflow --help')`,
  );
}

async function list(args: string[]): Promise<number> {
  const line = parseCommandLine(LIST, args);
  if (typeof line === "number") return line;
  const name = line.positionals[0];
  if (name !== undefined && !WORKFLOW_NAME_PATTERN.test(name)) {
    return usageError(LIST, badName(name));
  }
  return await withDatabase(async (sql) => {
    const versions = await selectVersionListing(sql, name);
    if (name !== undefined && versions.length === 0) {
      console.error(`workflow list: no version of ${name} is registered`);
      return NOT_FOUND;
    }
    for (const row of versionTable(versions)) console.log(row);
    return 0;
  });
}

async function promote(args: string[]): Promise<number> {
  const line = parseCommandLine(PROMOTE, args);
  if (typeof line === "number") return line;
  const ref = line.positionals[0];
  const m = WORKFLOW_REF_PATTERN.exec(ref);
  if (!m || m[2] === undefined) {
    return usageError(
      PROMOTE,
      `bad version ${JSON.stringify(ref)}: give <name>@<version>, e.g. billing.invoice@2`,
    );
  }
  const [name, version] = [m[1], Number(m[2])];
  return await withDatabase(async (sql, log) => {
    const promoted = await promoteVersion(sql, name, version, PROMOTED_BY);
    if (promoted === undefined) {
      const known = (await selectVersionListing(sql, name)).map((v) => `@${v.version}`);
      console.error(
        `workflow promote: ${name}@${version} is not registered (${
          known.length > 0 ? `${name} has ${known.join(", ")}` : `no version of ${name} is`
        }); a version is registered when a worker hosting it starts`,
      );
      return NOT_FOUND;
    }
    // The APIs take it from the NOTIFY; their timer is the fallback.
    await notifyCatalog(sql).catch((err) =>
      log.warn("catalog notify failed; the APIs apply it within CATALOG_REFRESH_MS", {
        error: err,
      })
    );
    const [listing] = (await selectVersionListing(sql, name)).filter((v) => v.version === version);
    log.info("workflow version promoted", {
      workflow: `${name}@${version}`,
      previous: promoted.previous === null ? null : `${name}@${promoted.previous}`,
    });
    console.log(promotionLine(name, promoted.previous, version, listing?.workers.length ?? 0));
    return 0;
  });
}

/** The line a promotion prints: what is current now, what was, and whether a worker hosts it. */
export function promotionLine(
  name: string,
  previous: number | null,
  version: number,
  liveWorkers: number,
): string {
  const what = previous === version
    ? `${name}@${version} was current already`
    : `${name}@${version} is current${
      previous === null ? "" : ` (was @${previous})`
    }: runs naming ${name} get version ${version} from now on`;
  const hosted = liveWorkers === 0
    ? "; no live worker hosts it yet: its runs wait for one"
    : `; ${liveWorkers === 1 ? "1 live worker hosts" : `${liveWorkers} live workers host`} it`;
  return what + hosted;
}

/** The aligned table `workflow list` prints: a header, then a row per version. */
export function versionTable(versions: VersionListing[]): string[] {
  const header = [
    "WORKFLOW",
    "VERSION",
    "CURRENT",
    "TENANTS",
    "CONCURRENCY",
    "MAX ATTEMPTS",
    "REGISTERED",
    "LIVE WORKERS",
  ];
  const rows = versions.map((v) => [
    v.name,
    String(v.version),
    v.current ? "current" : "-",
    v.tenants ?? "all",
    v.concurrency_limit === null
      ? "-"
      : `${v.concurrency_limit} per ${v.concurrency_key ?? "tenant"}`,
    v.max_attempts === null ? "default" : String(v.max_attempts),
    v.registered_at.toISOString().replace(/\.\d{3}Z$/, "Z"),
    v.workers.length === 0 ? "0" : `${v.workers.length}: ${v.workers.join(", ")}`,
  ]);
  const all = [header, ...rows];
  const widths = header.map((_, i) => Math.max(...all.map((r) => r[i].length)));
  return all.map((r) => r.map((cell, i) => cell.padEnd(widths[i])).join("  ").trimEnd());
}

function badName(text: string): string {
  return `bad workflow name ${JSON.stringify(text)}: a-z first, then a-z, 0-9, _ . and -, ` +
    "at most 100 characters, without @version";
}

async function withDatabase(work: (sql: Sql, log: Logger) => Promise<number>): Promise<number> {
  const config = readEnv(WorkflowEnv, processEnv());
  const log = createLogger("workflow", config.LOG_LEVEL);
  const sql = createPool({ url: config.DATABASE_URL, max: 1, applicationName: "poimen-workflow" });
  try {
    return await work(sql, log);
  } finally {
    await sql.end({ timeout: 5 });
  }
}
