/**
 * `main.ts worker`: the stock worker process (worker/run_worker.ts). It hosts
 * the built-in workflows (workflows/builtin.ts), or, with `--workflows
 * <module>`, the workflows a team's module exports, for teams that want no
 * process file of their own.
 */
import { ConfigError } from "../core/errors.ts";
import { type CommandSpec, parseCommandLine } from "../core/command_line.ts";
import { isWorkflow, type Workflow } from "../workflows/define.ts";
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
sleep, fail), or with --workflows the workflows a module exports (each
export made by defineWorkflow, or an array of them). Loading a module needs
read access to it: deno task worker grants --allow-read; handlers get the
task's permissions (net, env, read, sys=hostname).`,
  flags: {
    workflows: {
      type: "string",
      valueName: "module",
      description: "host the workflows this module exports instead of the built-ins",
    },
  },
  env: workerEnvSchema,
} satisfies CommandSpec;

/** Runs the worker until a signal; returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const module = line.flags.workflows;
  const workflows = module === undefined ? [echo, sleep, fail] : await loadWorkflows(module);
  return await runWorker({ workflows });
}

/**
 * The workflows `path` exports: every export made by `defineWorkflow`, and
 * those in exported arrays (once each). A module that cannot be loaded or
 * exports none is a `ConfigError` naming it.
 */
export async function loadWorkflows(path: string): Promise<Workflow[]> {
  // Relative to where the command was typed: `deno task` runs in the
  // project's folder and says where it was started in INIT_CWD.
  const base = Deno.env.get("INIT_CWD") ?? Deno.cwd();
  const url = new URL(path, `file://${base.endsWith("/") ? base : `${base}/`}`);
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
  for (const value of Object.values(exports)) {
    if (isWorkflow(value)) found.add(value);
    else if (Array.isArray(value)) { for (const v of value) if (isWorkflow(v)) found.add(v); }
  }
  if (found.size === 0) {
    throw new ConfigError(
      `worker: --workflows ${path}: exports no workflow (export what defineWorkflow returns)`,
    );
  }
  return [...found];
}
