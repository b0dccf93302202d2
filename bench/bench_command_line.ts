/**
 * The bench tasks' arguments, read as every `main.ts` command reads its own
 * (core/command_line.ts): `--help` prints the usage on stdout and exits 0,
 * a usage mistake is one line on stderr and exit code 2, before any work.
 */
import { z } from "zod";
import {
  type CommandLine,
  type CommandSpec,
  type FlagSpec,
  type Output,
  parseCommandLine,
  usageError,
} from "../core/command_line.ts";

/** The Postgres server every bench creates its databases on, when BENCH_ADMIN_URL is unset. */
const DEFAULT_ADMIN_URL = "postgres://postgres@127.0.0.1:5432/postgres";

/** The variable every bench reads, for `--help`. */
export const BenchEnv = z.object({
  BENCH_ADMIN_URL: z.string().default(DEFAULT_ADMIN_URL),
});

/** BENCH_ADMIN_URL, or the local server. */
export function adminUrl(): string {
  return Deno.env.get("BENCH_ADMIN_URL") ?? DEFAULT_ADMIN_URL;
}

/**
 * The command line of a bench task, or the exit code once `--help` (0) or a
 * usage mistake (2) is printed. Every `--` is dropped first: deno task
 * (2.9.6) passes a `--` typed after the task name on as an argument, the
 * README's `deno task bench -- --quick` relies on it meaning nothing, and no
 * bench task takes positional arguments it could separate.
 */
export function parseBenchCommandLine<F extends Record<string, FlagSpec>>(
  spec: CommandSpec<F>,
  argv: string[],
  output?: Output,
): CommandLine<F> | number {
  return parseCommandLine(spec, argv.filter((arg) => arg !== "--"), output);
}

/** {@link parseBenchCommandLine}, exiting with its code after help or a usage mistake. */
export function benchCommandLine<F extends Record<string, FlagSpec>>(
  spec: CommandSpec<F>,
  argv: string[],
): CommandLine<F> {
  const line = parseBenchCommandLine(spec, argv);
  if (typeof line === "number") Deno.exit(line);
  return line;
}

/** Prints a one-line usage mistake about a flag's value and exits 2. */
export function exitUsage(spec: CommandSpec, message: string): never {
  Deno.exit(usageError(spec, message));
}
