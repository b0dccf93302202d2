/**
 * The one entry point: `deno run <permissions> main.ts <command> [args]`.
 * Each command's module is imported only when chosen, so a process loads
 * (and needs permissions for) nothing but its own code: the relay's module
 * graph holds no database code at all.
 */
import { ConfigError } from "./core/errors.ts";

type Command = (args: string[]) => Promise<number | void>;

const COMMANDS: Record<string, () => Promise<{ main: Command }>> = {
  api: () => import("./api/process.ts"),
  migrate: () => import("./cli/migrate.ts"),
  token: () => import("./cli/token.ts"),
  worker: () => import("./worker/process.ts"),
  outbox: () => import("./outbox/process.ts"),
  relay: () => import("./relay/process.ts"),
  topics: () => import("./cli/topics.ts"),
  dispatch: () => import("./cli/dispatch.ts"),
  dlq: () => import("./cli/dlq.ts"),
};

async function run(argv: string[]): Promise<number> {
  const [name, ...args] = argv;
  const load = name === undefined ? undefined : COMMANDS[name];
  if (!load) {
    console.error(`usage: main.ts <${Object.keys(COMMANDS).join("|")}> [args]`);
    return 64;
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
