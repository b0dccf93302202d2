/**
 * Command-line arguments, the same way for every `main.ts` command: parsed by
 * `node:util`'s `parseArgs` (flags in any position, `--` ends them), `--help`
 * / `-h` prints usage to stdout and exits 0, and a usage mistake is one line
 * on stderr and exit code 2 (as a bad setting is).
 */
import { parseArgs } from "node:util";
import { z } from "zod";

/** Exit code of a usage mistake (unknown flag, missing argument); the same as a bad setting. */
export const USAGE_ERROR = 2;

/** One flag of a command. */
export interface FlagSpec {
  type: "boolean" | "string";
  /** What `--help` says about it. */
  description: string;
  /** Shown in `--help` as `--name <value>` (string flags). */
  valueName?: string;
}

/** What a command accepts and what its `--help` says. */
export interface CommandSpec<F extends Record<string, FlagSpec> = Record<string, FlagSpec>> {
  /** As typed after `main.ts` (or `deno task`). */
  name: string;
  /** The synopsis after the name, e.g. `[--raw] <tenant> '<json>'`. */
  synopsis: string;
  /** What the command does, for `--help`. */
  description: string;
  flags?: F;
  /** How many positional arguments it takes (default: none). */
  positionals?: { min: number; max: number };
  /** The environment schema whose variables (and defaults) `--help` lists. */
  env?: z.ZodObject;
}

/** The flags and positionals of one invocation. */
export interface CommandLine<F extends Record<string, FlagSpec>> {
  flags: { [K in keyof F]?: F[K]["type"] extends "boolean" ? boolean : string };
  positionals: string[];
}

/** Writes to stdout/stderr; a parameter so tests of the wording need no subprocess. */
export interface Output {
  out(line: string): void;
  err(line: string): void;
}

const CONSOLE: Output = {
  out: (line) => console.log(line),
  err: (line) => console.error(line),
};

/**
 * Parses `argv` for `spec`. Returns the command line, or an exit code once
 * it has printed the help (0) or a one-line usage error (2).
 */
export function parseCommandLine<F extends Record<string, FlagSpec>>(
  spec: CommandSpec<F>,
  argv: string[],
  output: Output = CONSOLE,
): CommandLine<F> | number {
  const ends = argv.indexOf("--");
  const flagsPart = ends === -1 ? argv : argv.slice(0, ends);
  // Help wins over any other mistake on the line: it is what the user needs then.
  if (flagsPart.includes("--help") || flagsPart.includes("-h")) {
    output.out(helpText(spec));
    return 0;
  }
  const options: Record<string, { type: "boolean" | "string" }> = {};
  for (const [name, flag] of Object.entries(spec.flags ?? {})) options[name] = { type: flag.type };
  let parsed;
  try {
    parsed = parseArgs({ args: argv, options, strict: true, allowPositionals: true });
  } catch (err) {
    output.err(`${spec.name}: ${firstSentence(err)} (see '${spec.name} --help')`);
    return USAGE_ERROR;
  }
  const { min, max } = spec.positionals ?? { min: 0, max: 0 };
  const n = parsed.positionals.length;
  if (n < min || n > max) {
    output.err(`usage: ${spec.name} ${spec.synopsis}`.trimEnd() + ` (see '${spec.name} --help')`);
    return USAGE_ERROR;
  }
  return { flags: parsed.values as CommandLine<F>["flags"], positionals: parsed.positionals };
}

/** Prints a one-line usage error about the arguments and returns the exit code. */
export function usageError(spec: CommandSpec, message: string, output: Output = CONSOLE): number {
  output.err(`${spec.name}: ${message}`);
  return USAGE_ERROR;
}

// parseArgs' messages are one readable sentence followed by advice about
// `--` that rarely applies; "Unknown option '--x'" → "unknown option '--x'".
function firstSentence(err: unknown): string {
  const message = err instanceof Error ? err.message : String(err);
  const first = message.split(/\.\s/)[0].replace(/\.$/, "");
  return first.charAt(0).toLowerCase() + first.slice(1);
}

/** The `--help` text of `spec`. */
function helpText(spec: CommandSpec): string {
  const lines = [`usage: ${spec.name} ${spec.synopsis}`.trimEnd(), "", spec.description.trim()];
  const flags: [string, string][] = Object.entries(spec.flags ?? {}).map(([name, f]) => {
    const value = f.type === "string" ? ` <${f.valueName ?? "value"}>` : "";
    return [`--${name}${value}`, f.description];
  });
  flags.push(["-h, --help", "print this help and exit"]);
  lines.push("", "options:", ...table(flags));
  if (spec.env) {
    const vars = Object.entries(spec.env.shape).map(([name, field]) =>
      [name, describeField(field)] as const
    );
    lines.push("", "environment:", ...table(vars));
  }
  return lines.join("\n");
}

function table(rows: readonly (readonly [string, string])[]): string[] {
  const width = Math.max(...rows.map(([left]) => left.length));
  return rows.map(([left, right]) => `  ${left.padEnd(width)}  ${right}`.trimEnd());
}

function describeField(field: unknown): string {
  if (field instanceof z.ZodOptional) return "optional";
  if (!(field instanceof z.ZodDefault)) return "required";
  const value = field.def.defaultValue;
  return `default ${typeof value === "string" ? value : JSON.stringify(value)}`;
}
