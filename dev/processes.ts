/**
 * Real poimen processes: `deno run <permissions of its deno.json task>
 * main.ts <command>` with its own environment, output kept for failure
 * reports, stopped with a signal. Shared by the integration tests
 * (tests/support/processes.ts) and `deno task chaos`.
 */
import { PROJECT_ROOT, taskArgs } from "./tasks.ts";

/**
 * The runtime flags of process `command` (permissions, `--no-prompt`, V8
 * flags), as its deno.json task declares them.
 */
export function runFlags(command: string): string[] {
  return taskArgs(command).filter((a) =>
    a === "--no-prompt" || a.startsWith("--allow-") || a.startsWith("--deny-") ||
    a.startsWith("--v8-flags=")
  );
}

/** A free TCP port on 127.0.0.1 (asked of the OS, then released). */
export function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

/** The variable naming each process's metrics/health port. */
const METRICS_PORT_VARIABLE: Record<string, string> = {
  api: "API_METRICS_PORT",
  worker: "WORKER_METRICS_PORT",
  outbox: "OUTBOX_METRICS_PORT",
  relay: "RELAY_METRICS_PORT",
};

/** One running poimen process (`main.ts <command>`). */
export class PoimenProcess {
  readonly command: string;
  /**
   * Where an API, worker, outbox or relay serves `/metrics` (the API's with
   * its per-tenant series), `/healthz` and `/readyz`: a free port unless `env` names one, so processes of parallel
   * tests (and a `deno task up` elsewhere) never fight over the defaults.
   */
  readonly metricsUrl: string | undefined;
  readonly #child: Deno.ChildProcess;
  readonly #log: string[] = [];
  readonly #done: Promise<Deno.CommandStatus>;
  #exited = false;

  constructor(command: string, env: Record<string, string>, extraArgs: string[] = []) {
    this.command = command;
    const portVariable = METRICS_PORT_VARIABLE[command];
    if (portVariable !== undefined) {
      env = { [portVariable]: String(freePort()), ...env };
      this.metricsUrl = `http://127.0.0.1:${env[portVariable]}`;
    }
    this.#child = new Deno.Command(Deno.execPath(), {
      args: ["run", ...runFlags(command), "main.ts", command, ...extraArgs],
      cwd: PROJECT_ROOT,
      env: { NO_COLOR: "1", ...env },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.#collect(this.#child.stdout);
    this.#collect(this.#child.stderr);
    this.#done = this.#child.status.then((s) => {
      this.#exited = true;
      return s;
    });
  }

  async #collect(stream: ReadableStream<Uint8Array>) {
    const lines = stream.pipeThrough(new TextDecoderStream());
    let rest = "";
    for await (const chunk of lines) {
      const parts = (rest + chunk).split("\n");
      rest = parts.pop() ?? "";
      this.#log.push(...parts);
      if (this.#log.length > 5000) this.#log.splice(0, this.#log.length - 5000);
    }
    if (rest) this.#log.push(rest);
  }

  get pid(): number {
    return this.#child.pid;
  }

  get exited(): boolean {
    return this.#exited;
  }

  /** Everything the process wrote so far. */
  logs(): string[] {
    return [...this.#log];
  }

  /** Resolves with the exit status. */
  status(): Promise<Deno.CommandStatus> {
    return this.#done;
  }

  /** Sends `signal` and waits for the exit (killing it after `timeoutMs`). */
  async stop(signal: Deno.Signal = "SIGTERM", timeoutMs = 15_000): Promise<Deno.CommandStatus> {
    if (!this.#exited) {
      try {
        this.#child.kill(signal);
      } catch { /* already gone */ }
      const timer = setTimeout(() => {
        try {
          this.#child.kill("SIGKILL");
        } catch { /* gone */ }
      }, timeoutMs);
      try {
        return await this.#done;
      } finally {
        clearTimeout(timer);
      }
    }
    return await this.#done;
  }
}

/** Runs `main.ts <command> args` to completion and returns its status and output. */
export async function runCommand(
  command: string,
  args: string[],
  env: Record<string, string>,
  flags: string[] = ["-A"],
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", ...flags, "main.ts", command, ...args],
    cwd: PROJECT_ROOT,
    env: { NO_COLOR: "1", ...env },
    stdin: "null",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}
