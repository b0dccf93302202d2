/**
 * Maintenance services in the manner of River's: a background loop of rounds
 * (reclaim expired leases, purge published events, purge finished runs) beside
 * the process's main work, with a wait between rounds, started once and
 * stopped any number of times. Subclasses say what a round does and how long
 * to wait; the lifecycle is written once, here.
 */
import { once, type Service } from "./lifecycle.ts";
import type { Logger } from "./log.ts";
import { backoffWithJitter, delay } from "./time.ts";

/** A loop of `round()`s with `nextWaitMs()` between them, until stopped. */
export abstract class MaintenanceService implements Service {
  readonly #name: string;
  readonly #log: Logger;
  readonly #abort = new AbortController();
  #loop: Promise<void> = Promise.resolve();
  #started = false;

  constructor(name: string, log: Logger) {
    this.#name = name;
    this.#log = log;
  }

  /**
   * One round of work. It handles its own failures (a maintenance round that
   * fails is retried next time); `signal` aborts when the service stops.
   */
  protected abstract round(signal: AbortSignal): Promise<void>;

  /** How long to wait before the next round; `first` is the wait before the first (0: at once). */
  protected abstract nextWaitMs(first: boolean): number;

  /** Starts the rounds in the background; never waits on what they talk to. */
  start(): Promise<void> {
    if (this.#abort.signal.aborted) throw new Error(`${this.#name} stopped`);
    if (this.#started) throw new Error(`${this.#name} already started`);
    this.#started = true;
    this.#loop = this.#run();
    return Promise.resolve();
  }

  /** Stops after the round in flight. Safe to call twice. */
  readonly stop: () => Promise<void> = once(async () => {
    this.#abort.abort();
    await this.#loop;
  });

  async #run(): Promise<void> {
    const signal = this.#abort.signal;
    for (let first = true; !signal.aborted; first = false) {
      const wait = this.nextWaitMs(first);
      if (wait > 0) await delay(wait, signal);
      if (signal.aborted) return;
      try {
        await this.round(signal);
      } catch (error) {
        // A round should not throw; if one does, the service keeps its schedule.
        this.#log.error(`${this.#name} round failed`, { error });
      }
    }
  }
}

/**
 * A maintenance service whose rounds come every `intervalMs` (jittered ±25%,
 * so a fleet started together does not act in lockstep, the first round one
 * interval away like every other) and, after a failing round, later each
 * time up to `retryCapMs`. A failure is logged as `failedMessage` with the
 * count of failures in a row; `work` is the round.
 */
export abstract class IntervalMaintenance extends MaintenanceService {
  readonly #timing: { intervalMs: number; retryCapMs: number; failedMessage: string };
  readonly #log: Logger;
  #failures = 0;

  constructor(
    name: string,
    log: Logger,
    timing: { intervalMs: number; retryCapMs: number; failedMessage: string },
  ) {
    super(name, log);
    this.#log = log;
    this.#timing = timing;
  }

  /** The round's work; a throw counts as a failed round. */
  protected abstract work(signal: AbortSignal): Promise<void>;

  protected nextWaitMs(): number {
    const { intervalMs, retryCapMs } = this.#timing;
    const wait = intervalMs * (0.75 + Math.random() / 2);
    return this.#failures ? backoffWithJitter(this.#failures, wait, retryCapMs) : wait;
  }

  protected async round(signal: AbortSignal): Promise<void> {
    try {
      await this.work(signal);
      this.#failures = 0;
    } catch (error) {
      this.#failures++;
      this.#log.warn(this.#timing.failedMessage, { error, failures: this.#failures });
    }
  }
}
