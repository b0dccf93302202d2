/**
 * The one entry point: `deno run <permissions> main.ts <command> [args]`;
 * `main.ts --help` lists the commands, `main.ts <command> --help` explains one.
 * Each command's module is imported only when chosen, so a process loads
 * (and needs permissions for) nothing but its own code: the relay's module
 * graph holds no database code at all.
 */
import { ConfigError } from "./core/errors.ts";
import { USAGE_ERROR } from "./core/command_line.ts";

type Command = (args: string[]) => Promise<number | void>;

// The summaries live here, not in the modules: listing them must not load
// (or need the permissions of) every command.
const COMMANDS: Record<string, { summary: string; load: () => Promise<{ main: Command }> }> = {
  api: { summary: "serve the HTTP API", load: () => import("./api/process.ts") },
  worker: { summary: "claim and execute queued runs", load: () => import("./worker/process.ts") },
  outbox: {
    summary: "publish run events to Kafka",
    load: () => import("./outbox/process.ts"),
  },
  relay: {
    summary: "admit dispatch messages from Kafka through the API",
    load: () => import("./relay/process.ts"),
  },
  migrate: { summary: "apply pending database migrations", load: () => import("./cli/migrate.ts") },
  init: {
    summary: "migrate, create tenants and topics, keep the relay's token (idempotent)",
    load: () => import("./cli/init.ts"),
  },
  token: { summary: "create a tenant or service token", load: () => import("./cli/token.ts") },
  schedule: {
    summary: "list, create, pause, resume, delete or backfill a tenant's schedules",
    load: () => import("./cli/schedule.ts"),
  },
  tenant: {
    summary: "show or set a tenant's quotas (max queued runs, admission rate)",
    load: () => import("./cli/tenant.ts"),
  },
  workflow: {
    summary: "list workflow versions and their workers, or promote a version to current",
    load: () => import("./cli/workflow.ts"),
  },
  topics: { summary: "declare tenants' Kafka topics", load: () => import("./cli/topics.ts") },
  dispatch: {
    summary: "publish one dispatch message to Kafka",
    load: () => import("./cli/dispatch.ts"),
  },
  dlq: { summary: "list or redrive a tenant's dead letters", load: () => import("./cli/dlq.ts") },
};

const USAGE = "usage: main.ts <command> [args]   (main.ts --help lists the commands)";

function help(): string {
  const width = Math.max(...Object.keys(COMMANDS).map((n) => n.length));
  return [
    "usage: main.ts <command> [args]",
    "",
    "commands (each also as `deno task <command>`; `<command> --help` explains one):",
    ...Object.entries(COMMANDS).map(([name, c]) => `  ${name.padEnd(width)}  ${c.summary}`),
  ].join("\n");
}

async function run(argv: string[]): Promise<number> {
  const [name, ...args] = argv;
  if (name === "--help" || name === "-h" || name === "help") {
    console.log(help());
    return 0;
  }
  if (name === undefined) {
    console.error(USAGE);
    return USAGE_ERROR;
  }
  const load = Object.hasOwn(COMMANDS, name) ? COMMANDS[name].load : undefined;
  if (!load) {
    console.error(
      `main.ts: unknown command ${JSON.stringify(name)}; one of ${
        Object.keys(COMMANDS).join(", ")
      }`,
    );
    return USAGE_ERROR;
  }
  try {
    const mod = await load();
    return (await mod.main(args)) ?? 0;
  } catch (err) {
    if (err instanceof ConfigError) {
      console.error(err.message);
      return 2;
    }
    console.error(`${name}: ${err instanceof Error ? err.message : String(err)}`);
    return 1;
  }
}

if (import.meta.main) Deno.exit(await run(Deno.args));
