/**
 * The one way a poimen process starts and stops: a list of named parts
 * (the pool, the metrics server, the worker…), started in order and stopped
 * in reverse order. SIGTERM or SIGINT starts the graceful stop; a second
 * signal, or the stop deadline, forces the exit with one line naming the part
 * that did not stop. A signal within `REPEATED_SIGNAL_MS` of the first is the
 * same request arriving twice, not a second one: Ctrl-C in a terminal reaches
 * every process of its group, and `deno task` also passes it on to its child. A part that fails to start stops the parts already
 * started, in reverse, and the process exits 1 — or 2, with the error's
 * message as one line on stderr, when it refused to start (`isRefusal`: a
 * configuration a restart cannot fix). A part still starting when the stop
 * is asked for sees its `start` signal aborted.
 *
 * Exit codes (what `run()` resolves with, and what a forced exit exits with):
 * - 0: stopped gracefully;
 * - 2: a part refused to start (core/errors.ts `isRefusal`);
 * - 1: a part failed to start, a part's stop failed (the others were still
 *   stopped), or the stop deadline passed;
 * - 128 + the signal's number (130 for SIGINT, 143 for SIGTERM): a second
 *   signal forced the exit, as a shell reports a process that signal killed.
 */
import type { Service } from "./lifecycle.ts";
import type { Logger } from "./log.ts";
import { isRefusal } from "./errors.ts";
import { SECOND } from "./time.ts";

/** One named part of a process. Both steps are optional (a pool has nothing to start). */
export interface Part {
  /** Named in the log lines about starting and stopping. */
  readonly name: string;
  /** `signal` is aborted when the stop is asked for while this part still starts. */
  start?(signal?: AbortSignal): Promise<void>;
  stop?(): Promise<void>;
}

/**
 * A part, or parts that start in the order given and stop together (the
 * outbox's publisher and purgers): a stop does not wait for one before the next.
 */
export type Stage = Part | readonly Part[];

/** Where the signals that stop the process come from (a fake in tests). */
export interface SignalSource {
  /** Calls `handler` on every signal until the returned function is called. */
  listen(handler: (signal: Deno.Signal) => void): () => void;
}

export interface HarnessOptions {
  log: Logger;
  /**
   * How long the stop may take, from its first signal (or the failed start),
   * before the exit is forced. Default `DEFAULT_STOP_DEADLINE_MS`.
   */
  stopDeadlineMs?: number;
  /** Ends the process on a forced exit; `Deno.exit` unless a test passes its own. */
  exit?: (code: number) => void;
  /** Default: SIGTERM and SIGINT of this process. */
  signals?: SignalSource;
  /** Signals this soon after the first are not a second one. Default `REPEATED_SIGNAL_MS`. */
  repeatedSignalMs?: number;
}

/** How soon after the first a signal is taken for the same one, delivered twice. */
export const REPEATED_SIGNAL_MS = 1 * SECOND;

/** The stop deadline unless a process asks for another. */
export const DEFAULT_STOP_DEADLINE_MS = 30 * SECOND;

/** What a process's stop needs beyond the graceful wait its own configuration allows. */
const STOP_MARGIN_MS = 20 * SECOND;

/**
 * The stop deadline of a process that waits up to `gracefulMs` for its work
 * in flight (WORKER_SHUTDOWN_MS…): never shorter than that wait, so a longer
 * configured wait is not cut short, nor than the default.
 */
export function stopDeadline(gracefulMs: number): number {
  return Math.max(DEFAULT_STOP_DEADLINE_MS, gracefulMs + STOP_MARGIN_MS);
}

/** `service` as a part called `name`. */
export function named(name: string, service: Service): Part {
  return { name, start: (signal) => service.start(signal), stop: () => service.stop() };
}

const SIGNAL_NUMBERS: Partial<Record<Deno.Signal, number>> = { SIGINT: 2, SIGTERM: 15 };

/** SIGTERM and SIGINT of this process. */
const processSignals: SignalSource = {
  listen(handler) {
    const signals: Deno.Signal[] = ["SIGTERM", "SIGINT"];
    const listeners = signals.map((signal) => {
      const listener = () => handler(signal);
      Deno.addSignalListener(signal, listener);
      return [signal, listener] as const;
    });
    return () => {
      for (const [signal, listener] of listeners) Deno.removeSignalListener(signal, listener);
    };
  },
};

/** Starts `stages`, runs until a signal, stops them; resolves with the exit code. */
export function runProcess(stages: readonly Stage[], options: HarnessOptions): Promise<number> {
  return new ProcessHarness(stages, options).run();
}

/** One process's parts and their lifecycle; see the module's comment. */
export class ProcessHarness {
  readonly #stages: readonly (readonly Part[])[];
  readonly #log: Logger;
  readonly #deadlineMs: number;
  readonly #exit: (code: number) => void;
  readonly #signals: SignalSource;
  readonly #repeatedSignalMs: number;
  #firstSignalAt: number | undefined;
  // Resolved by the first signal or stop(): the graceful stop begins.
  readonly #stopAsked = Promise.withResolvers<void>();
  // Resolved with the code of a forced exit.
  readonly #forced = Promise.withResolvers<number>();
  #stopping = false;
  readonly #startAbort = new AbortController();
  #isForced = false;
  #deadline: ReturnType<typeof setTimeout> | undefined;
  // What the lifecycle waits for right now, named in the forced exit's line.
  #waitingFor: { action: "starting" | "stopping"; parts: Set<string> } | undefined;
  #running: Promise<number> | undefined;

  constructor(stages: readonly Stage[], options: HarnessOptions) {
    this.#stages = stages.map((s) => Array.isArray(s) ? s : [s as Part]);
    this.#log = options.log;
    this.#deadlineMs = options.stopDeadlineMs ?? DEFAULT_STOP_DEADLINE_MS;
    this.#exit = options.exit ?? ((code) => Deno.exit(code));
    this.#signals = options.signals ?? processSignals;
    this.#repeatedSignalMs = options.repeatedSignalMs ?? REPEATED_SIGNAL_MS;
  }

  /**
   * Starts the parts in order, waits for a signal or `stop()`, then stops the
   * started parts in reverse order; resolves with the exit code. A forced
   * exit calls the exit function first (a test's own resolves it too).
   */
  run(): Promise<number> {
    return this.#running ??= this.#run();
  }

  /** Asks for the graceful stop, as a first signal does; resolves as `run()` does. Safe twice. */
  stop(): Promise<number> {
    if (!this.#stopping) {
      this.#stopping = true;
      this.#log.info("stopping");
      this.#beginStop();
    }
    return this.run();
  }

  async #run(): Promise<number> {
    const unlisten = this.#signals.listen((signal) => this.#onSignal(signal));
    try {
      return await Promise.race([this.#lifecycle(), this.#forced.promise]);
    } finally {
      clearTimeout(this.#deadline);
      unlisten();
    }
  }

  async #lifecycle(): Promise<number> {
    const started: Part[][] = [];
    let failed: { part: string; error: unknown } | undefined;
    starting: for (const stage of this.#stages) {
      const up: Part[] = [];
      started.push(up);
      for (const part of stage) {
        if (this.#stopping) break starting;
        this.#waitingFor = { action: "starting", parts: new Set([part.name]) };
        try {
          await part.start?.(this.#startAbort.signal);
        } catch (error) {
          failed = { part: part.name, error };
          break starting;
        }
        up.push(part);
      }
    }
    this.#waitingFor = undefined;
    if (failed && isRefusal(failed.error)) {
      // Not a log line: the one line an operator reads, as for a bad variable.
      console.error((failed.error as Error).message);
      this.#stopping = true;
      this.#beginStop();
      await this.#stopStarted(started.reverse());
      return 2;
    }
    if (failed) {
      this.#log.error("start failed", failed);
      // From here a signal forces the exit, as during any stop.
      this.#stopping = true;
      this.#beginStop();
    } else {
      await this.#stopAsked.promise;
    }
    const stopped = await this.#stopStarted(started.reverse());
    if (failed) return 1;
    if (stopped) this.#log.info("stopped");
    return stopped ? 0 : 1;
  }

  /** Stops each stage's parts together, last stage first; false when a stop failed. */
  async #stopStarted(stages: Part[][]): Promise<boolean> {
    let ok = true;
    for (const stage of stages) {
      if (stage.length === 0) continue;
      const waiting = new Set(stage.map((p) => p.name));
      this.#waitingFor = { action: "stopping", parts: waiting };
      await Promise.all(stage.map(async (part) => {
        try {
          await part.stop?.();
        } catch (error) {
          ok = false;
          this.#log.error("stop failed", { part: part.name, error });
        } finally {
          waiting.delete(part.name);
        }
      }));
    }
    this.#waitingFor = undefined;
    return ok;
  }

  #onSignal(signal: Deno.Signal): void {
    if (this.#isForced) return;
    if (this.#stopping) {
      const since = this.#firstSignalAt === undefined ? Infinity : Date.now() - this.#firstSignalAt;
      if (since < this.#repeatedSignalMs) {
        this.#log.debug("signal repeated, still stopping", { signal, since_ms: since });
        return;
      }
      this.#force(`second ${signal}`, 128 + (SIGNAL_NUMBERS[signal] ?? 0));
      return;
    }
    this.#firstSignalAt = Date.now();
    this.#stopping = true;
    this.#log.info("stopping", { signal });
    this.#beginStop();
  }

  #beginStop(): void {
    this.#startAbort.abort();
    if (this.#deadline !== undefined || this.#isForced) return;
    this.#stopAsked.resolve();
    this.#deadline = setTimeout(
      () => this.#force(`stop deadline of ${this.#deadlineMs} ms`, 1),
      this.#deadlineMs,
    );
  }

  #force(reason: string, code: number): void {
    if (this.#isForced) return;
    this.#isForced = true;
    clearTimeout(this.#deadline);
    const waiting = this.#waitingFor;
    this.#log.error("forced exit", {
      reason,
      [waiting?.action === "starting" ? "did_not_start" : "did_not_stop"]: waiting
        ? [...waiting.parts]
        : [],
      exit_code: code,
    });
    this.#forced.resolve(code);
    this.#exit(code);
  }
}
