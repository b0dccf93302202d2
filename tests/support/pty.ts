/**
 * A `deno task` run in a pseudo-terminal, as a person typing it would run it:
 * through util-linux's `script`, so the task's stdin and stderr are a TTY and
 * Deno would stop at a permission prompt there (through a pipe it silently
 * denies instead, which is why CI never saw one).
 */
import { PROJECT_ROOT } from "../../dev/tasks.ts";

/** What Deno prints when it stops to ask for a permission. */
export const PROMPT_MARKERS = ["Deno requests", "Allow?"];

function shellQuote(word: string): string {
  return `'${word.replaceAll("'", `'\\''`)}'`;
}

/** One task under a pseudo-terminal; its output is kept as it arrives. */
export class PtyTask {
  readonly task: string;
  readonly #child: Deno.ChildProcess;
  readonly #done: Promise<Deno.CommandStatus>;
  #output = "";
  #exited = false;

  constructor(task: string, args: string[], env: Record<string, string>) {
    this.task = task;
    const line = ["exec", "deno", "task", "-q", task, ...args.map(shellQuote)].join(" ");
    // -e: script exits with the child's code; /dev/null: keep no typescript file.
    this.#child = new Deno.Command("script", {
      args: ["-q", "-e", "-c", line, "/dev/null"],
      cwd: PROJECT_ROOT,
      env,
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
    for await (const chunk of stream.pipeThrough(new TextDecoderStream())) this.#output += chunk;
  }

  get exited(): boolean {
    return this.#exited;
  }

  /** Everything the terminal showed so far. */
  get output(): string {
    return this.#output;
  }

  /** Whether the terminal shows a permission prompt. */
  prompted(): boolean {
    return PROMPT_MARKERS.some((m) => this.#output.includes(m));
  }

  /** Resolves with the exit status of the task. */
  status(): Promise<Deno.CommandStatus> {
    return this.#done;
  }

  /**
   * Sends `signal` to the task's process group (`script` gives the task a
   * session of its own: `deno task`, the `deno run` it starts and their
   * children), then waits; SIGKILLs the group after `timeoutMs`.
   */
  async stop(signal: Deno.Signal = "SIGTERM", timeoutMs = 20_000): Promise<Deno.CommandStatus> {
    if (this.#exited) return await this.#done;
    const group = await this.#sessionLeader();
    const send = (sig: Deno.Signal) => {
      try {
        if (group !== undefined) Deno.kill(-group, sig);
        else this.#child.kill(sig);
      } catch { /* gone */ }
    };
    send(signal);
    const timer = setTimeout(() => send("SIGKILL"), timeoutMs);
    try {
      return await this.#done;
    } finally {
      clearTimeout(timer);
    }
  }

  async #sessionLeader(): Promise<number | undefined> {
    const out = await new Deno.Command("pgrep", { args: ["-P", String(this.#child.pid)] })
      .output();
    const pid = Number(new TextDecoder().decode(out.stdout).trim().split("\n")[0]);
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  }
}
