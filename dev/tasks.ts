/**
 * The poimen processes' command lines, read from deno.json's tasks, so that
 * `deno task up` and the integration tests start each process with exactly
 * the permissions its task declares (one source of truth).
 */
const ROOT = new URL("../", import.meta.url);

/** The arguments after `deno` of task `name` (e.g. `run --allow-net … main.ts api`). */
export function taskArgs(name: string): string[] {
  const config = JSON.parse(Deno.readTextFileSync(new URL("deno.json", ROOT)));
  const line: string | undefined = config.tasks?.[name];
  if (!line) throw new Error(`deno.json has no task ${name}`);
  const words = line.trim().split(/\s+/);
  if (words[0] !== "deno" || words[1] !== "run") {
    throw new Error(`task ${name} is not a plain "deno run …" line: ${line}`);
  }
  return words.slice(1);
}

/** The project root, as a path. */
export const PROJECT_ROOT = decodeURIComponent(ROOT.pathname);
