/**
 * `main.ts worker`: the stock worker process (worker/run_worker.ts). It hosts
 * the built-in workflows (workflows/builtin.ts), or, with `--workflows
 * <module>`, the workflows a team's module exports, for teams that want no
 * process file of their own.
 *
 * Handlers run with less than the worker: the worker reads its configuration
 * from the environment, then gives up env access before any handler's code
 * is loaded, so no handler can read `DATABASE_URL` (or any other variable).
 * A `--workflows` module is loaded from a local file only, and its handlers
 * may read only the module's folder and `node_modules`: Deno's permissions
 * cannot be narrowed at run time, so a worker that may read everything (as
 * `deno task worker` may, to find the module) starts itself again with
 * `--allow-read=<the module's folder>,<node_modules>` and waits for that
 * process, passing it SIGTERM and SIGINT and answering with its exit code.
 * The confined process holds the read end of a pipe from it and exits, as a
 * crash would, when that pipe closes: a worker killed with SIGKILL (which it
 * cannot pass on) leaves no worker behind still claiming runs, and its runs
 * are reclaimed when their leases lapse, as after any crash.
 */
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { ConfigError } from "../core/errors.ts";
import { type CommandSpec, parseCommandLine } from "../core/command_line.ts";
import { processEnv } from "../core/config.ts";
import { isWorkflow, isWorkflowDefinition, type Workflow } from "../workflows/define.ts";
import { echo, fail, sleep } from "../workflows/builtin.ts";
import { workerEnvSchema } from "./config.ts";
import { runWorker } from "./run_worker.ts";

const COMMAND = {
  name: "worker",
  synopsis: "[--workflows <module>]",
  description: `
Claims queued runs and executes them, WORKER_CONCURRENCY at a time, until
SIGTERM or SIGINT; serves /metrics, /healthz and /readyz on
WORKER_METRICS_HOST:WORKER_METRICS_PORT. Hosts the built-in workflows (echo,
sleep, fail), or with --workflows the workflows a local module exports (each
export made by implement or by defineWorkflow with a handler, or an array of
them; definitions without a handler are left out). Handlers get no
environment (the worker reads its configuration first) and may read only
the module's folder and node_modules: deno task worker starts itself again
with exactly that read access. Handlers that need more run in a process
file of their own (runWorker, docs/workflows.md).`,
  flags: {
    workflows: {
      type: "string",
      valueName: "module",
      description: "host the workflows this local module exports instead of the built-ins",
    },
  },
  env: workerEnvSchema,
} satisfies CommandSpec;

// The confined worker's runtime flags besides its read access: the worker
// task's (deno.json), less --allow-read and --allow-run.
const CONFINED_FLAGS = [
  "--no-prompt",
  "--v8-flags=--max-semi-space-size=8",
  "--allow-net",
  "--allow-env",
  "--allow-sys=hostname",
];

const ROOT = new URL("../", import.meta.url);

// Set for the confined worker: its stdin is a pipe from the worker that
// started it, closed when that one exits however it exits.
const PARENT_PIPE = "POIMEN_WORKER_PARENT_PIPE";

/** Exits (code 1) once stdin, the pipe from the parent worker, closes. */
function exitWhenParentGoes(): void {
  (async () => {
    const buffer = new Uint8Array(64);
    try {
      while (await Deno.stdin.read(buffer) !== null) { /* nothing is sent */ }
    } catch { /* a broken pipe is the parent gone too */ }
    Deno.exit(1);
  })();
}

/** Runs the worker until a signal; returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const path = line.flags.workflows;
  if (path === undefined) {
    const env = processEnv();
    // The built-ins read nothing and start nothing.
    await revoke("env", "read", "run");
    return await runWorker({ workflows: [echo, sleep, fail], env });
  }
  const url = workflowsUrl(path);
  if (Deno.permissions.querySync({ name: "read" }).state === "granted") {
    return await confined(url, path);
  }
  const env = processEnv();
  if (env[PARENT_PIPE] === "stdin") exitWhenParentGoes();
  await revoke("env", "run");
  return await runWorker({ workflows: await loadWorkflows(path, url), env });
}

/**
 * Where `--workflows <path>` points: relative to where the command was typed
 * (`deno task` runs in the project's folder and says where it was started
 * in INIT_CWD). Only a local file: anything else (`https:`, `npm:`,
 * `data:`…) is a `ConfigError` naming it.
 */
export function workflowsUrl(path: string): URL {
  const base = Deno.env.get("INIT_CWD") ?? Deno.cwd();
  let url: URL | undefined;
  try {
    url = new URL(path, `file://${base.endsWith("/") ? base : `${base}/`}`);
  } catch { /* refused below */ }
  if (url?.protocol !== "file:") {
    throw new ConfigError(
      `worker: --workflows ${path}: only a local module can be loaded (a path or a file: URL)`,
    );
  }
  return url;
}

/**
 * The workflows `path` exports: every implementation among its exports
 * (`implement`, `defineWorkflow` with a handler) and in exported arrays,
 * once each. Definitions without a handler are left out: a module of
 * implementations may re-export the definitions it implements. A module
 * that cannot be loaded or exports no implementation is a `ConfigError`
 * naming it.
 */
export async function loadWorkflows(path: string, url = workflowsUrl(path)): Promise<Workflow[]> {
  let exports: Record<string, unknown>;
  try {
    exports = await import(url.href);
  } catch (err) {
    throw new ConfigError(
      `worker: --workflows ${path}: cannot load it: ${
        (err instanceof Error ? err.message : String(err)).split("\n")[0]
      }`,
    );
  }
  const found = new Set<Workflow>();
  const unimplemented = new Set<string>();
  for (const value of Object.values(exports).flatMap((v) => Array.isArray(v) ? v : [v])) {
    if (isWorkflow(value)) found.add(value);
    else if (isWorkflowDefinition(value)) unimplemented.add(`${value.name}@${value.version}`);
  }
  if (found.size === 0) {
    throw new ConfigError(
      `worker: --workflows ${path}: exports no workflow (export what implement returns` +
        (unimplemented.size > 0
          ? `; ${[...unimplemented].sort().join(", ")} ${
            unimplemented.size === 1 ? "is a definition" : "are definitions"
          } without a handler)`
          : ")"),
    );
  }
  return [...found];
}

/**
 * Runs this command again for `url`, reading only the module's folder and
 * `node_modules`, and waits for it; see the module comment.
 */
async function confined(url: URL, path: string): Promise<number> {
  let file: string;
  try {
    file = Deno.realPathSync(fileURLToPath(url));
  } catch (err) {
    throw new ConfigError(
      `worker: --workflows ${path}: cannot load it: ${err instanceof Error ? err.message : err}`,
    );
  }
  const folder = dirname(file);
  if (folder.includes(",")) {
    // --allow-read takes a comma-separated list.
    throw new ConfigError(`worker: --workflows ${path}: its folder's name has a comma`);
  }
  const root = fileURLToPath(ROOT);
  const deno = Deno.execPath();
  if (Deno.permissions.querySync({ name: "run", command: deno }).state !== "granted") {
    throw new ConfigError(
      `worker: --workflows ${path}: the worker confines handlers to the module's folder by ` +
        `starting itself again, which needs --allow-run (deno task worker grants it); or give ` +
        `it --allow-read=<the module's folder>,node_modules instead of --allow-read`,
    );
  }
  const child = new Deno.Command(deno, {
    args: [
      "run",
      `--config=${join(root, "deno.json")}`,
      ...CONFINED_FLAGS,
      `--allow-read=${folder},${join(root, "node_modules")}`,
      join(root, "main.ts"),
      "worker",
      "--workflows",
      file,
    ],
    env: { [PARENT_PIPE]: "stdin" },
    stdin: "piped",
    stdout: "inherit",
    stderr: "inherit",
  }).spawn();
  // This process runs no handler; it holds nothing a handler could want.
  await revoke("env", "read", "run");
  const signals: Deno.Signal[] = ["SIGTERM", "SIGINT"];
  const pass = signals.map((signal) => {
    const handler = () => {
      try {
        child.kill(signal);
      } catch { /* already gone */ }
    };
    Deno.addSignalListener(signal, handler);
    return () => Deno.removeSignalListener(signal, handler);
  });
  try {
    return (await child.status).code;
  } finally {
    for (const remove of pass) remove();
  }
}

/** Gives up these permissions for the rest of the process. */
async function revoke(...names: ("env" | "read" | "run")[]): Promise<void> {
  for (const name of names) await Deno.permissions.revoke({ name });
}
