/**
 * The project's own checks, as deno.json's `test`, `doc` and `ok` tasks:
 *
 *   deno task test [--filter <pattern>] [--serial] [<test file>…]
 *   deno task doc
 *   deno task ok
 *
 * `test` migrates one template database (named after the migrations' hash,
 * so it is rebuilt only when a migration changes) and runs the test files in
 * parallel; each file's `freshDatabase()` clones the template instead of
 * migrating (tests/support/db.ts). `doc` lints the documentation of every
 * published entry point; `ok` is fmt, lint, type check, `doc` and `test`.
 */
import { z } from "zod";
import { type CommandSpec, parseCommandLine, usageError } from "../core/command_line.ts";
import { silentLogger } from "../core/log.ts";
import { createPool } from "../db/pool.ts";
import { loadMigrations, migrate } from "../db/migrate.ts";
import { PROJECT_ROOT } from "./tasks.ts";

/** The environment variable naming the template database to clone. */
const TEMPLATE_VARIABLE = "POIMEN_TEST_TEMPLATE";

const TEST_ENV = z.object({
  TEST_DATABASE_ADMIN_URL: z.string().url().default("postgres://postgres@127.0.0.1:5432/postgres"),
  DENO_JOBS: z.string().optional(),
});

const TEST = {
  name: "test",
  synopsis: "[--filter <pattern>] [--serial] [<test file>…]",
  description: `
Runs the tests (all files under tests/, or the files given) against the real
Postgres and Kafka, files in parallel (DENO_JOBS at a time, default: the
number of cores). The Kafka tests start the local broker when none answers.`,
  flags: {
    filter: {
      type: "string",
      valueName: "pattern",
      description: "only tests whose name contains it (or /a regexp/)",
    },
    serial: { type: "boolean", description: "one file at a time" },
  },
  positionals: { min: 0, max: 1000 },
  env: TEST_ENV,
} satisfies CommandSpec;

const DOC = {
  name: "doc",
  synopsis: "",
  description: "Lints the documentation (deno doc --lint) of every entry point deno.json exports.",
} satisfies CommandSpec;

const OK = {
  name: "ok",
  synopsis: "",
  description: `
Everything a change must pass: deno fmt --check, deno lint, deno check, the
documentation lint (deno task doc) and the tests (deno task test).`,
} satisfies CommandSpec;

async function deno(args: string[], env: Record<string, string> = {}): Promise<number> {
  const child = new Deno.Command(Deno.execPath(), { args, cwd: PROJECT_ROOT, env }).spawn();
  return (await child.status).code;
}

/** The entry points of deno.json's `exports`, as paths. */
function exportedModules(): string[] {
  const config = JSON.parse(Deno.readTextFileSync(`${PROJECT_ROOT}deno.json`));
  return Object.values(config.exports as Record<string, string>);
}

/**
 * The migrated template database for this set of migrations, made if
 * missing. Built under a temporary name and renamed when complete, so a
 * concurrent run never clones a half-migrated one.
 */
async function templateDatabase(adminUrl: string): Promise<string> {
  const migrations = loadMigrations();
  // The embedded copies, which are what migrate() applies (tests/dev_embed_test.ts
  // holds them equal to migrations/*.sql), so the template follows what runs.
  const bytes = new TextEncoder().encode(migrations.map((m) => `${m.name}\n${m.sql}`).join("\n"));
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  const hash = [...digest.slice(0, 6)].map((b) => b.toString(16).padStart(2, "0")).join("");
  const name = `poimen_test_template_${hash}`;
  const admin = createPool({ url: adminUrl, max: 1, applicationName: "poimen-test" });
  try {
    const [found] = await admin`select 1 from pg_database where datname = ${name}`;
    if (found) return name;
    const building = `poimen_test_building_${crypto.randomUUID().replaceAll("-", "").slice(0, 12)}`;
    await admin.unsafe(`create database ${building}`);
    const url = new URL(adminUrl);
    url.pathname = `/${building}`;
    const sql = createPool({ url: url.href, max: 1, applicationName: "poimen-test" });
    try {
      await migrate(sql, migrations, silentLogger);
    } finally {
      await sql.end({ timeout: 5 });
    }
    try {
      await admin.unsafe(`alter database ${building} rename to ${name}`);
    } catch {
      // Another run finished the same template first: use that one.
      await admin.unsafe(`drop database if exists ${building}`);
    }
    // Templates of older migrations are of no further use.
    const old = await admin<{ datname: string }[]>`
      select datname from pg_database
      where datname like 'poimen\_test\_template\_%' and datname <> ${name}`;
    for (const { datname } of old) {
      await admin.unsafe(`drop database if exists ${datname}`).catch(() => {});
    }
    return name;
  } finally {
    await admin.end();
  }
}

async function test(args: string[]): Promise<number> {
  const line = parseCommandLine(TEST, args);
  if (typeof line === "number") return line;
  const env = TEST_ENV.parse(Deno.env.toObject());
  const template = await templateDatabase(env.TEST_DATABASE_ADMIN_URL);
  const files = line.positionals.length > 0 ? line.positionals : ["tests/"];
  return await deno([
    "test",
    "--allow-all",
    ...(line.flags.serial ? [] : ["--parallel"]),
    ...(line.flags.filter !== undefined ? ["--filter", line.flags.filter] : []),
    ...files,
  ], { [TEMPLATE_VARIABLE]: template });
}

async function doc(args: string[]): Promise<number> {
  const line = parseCommandLine(DOC, args);
  if (typeof line === "number") return line;
  return await deno(["doc", "--lint", ...exportedModules()]);
}

async function ok(args: string[]): Promise<number> {
  const line = parseCommandLine(OK, args);
  if (typeof line === "number") return line;
  const steps: string[][] = [
    ["fmt", "--check"],
    ["lint"],
    ["check", "main.ts", "dev/", "bench/", "tests/"],
  ];
  for (const step of steps) {
    const code = await deno(step);
    if (code !== 0) return code;
  }
  const documented = await doc([]);
  if (documented !== 0) return documented;
  return await test([]);
}

const CHECKS: Record<string, (args: string[]) => Promise<number>> = { test, doc, ok };

if (import.meta.main) {
  const [which, ...args] = Deno.args;
  const check = which !== undefined && Object.hasOwn(CHECKS, which) ? CHECKS[which] : undefined;
  if (!check) {
    Deno.exit(usageError(OK, `unknown check ${JSON.stringify(which)}; one of test, doc, ok`));
  }
  try {
    Deno.exit(await check(args));
  } catch (err) {
    console.error(`${which}: ${err instanceof Error ? err.message : String(err)}`);
    Deno.exit(1);
  }
}
