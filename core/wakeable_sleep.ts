/**
 * The wait between two looks for work in a polling loop (the worker's
 * claims, the outbox publisher's batches): it lasts the poll interval unless a
 * wake-up (a NOTIFY, a freed slot, a retry falling due) or the stop signal
 * ends it early. A wake-up that arrives while the loop is looking, not
 * sleeping, is kept: the next sleep returns at once, so it is never lost
 * between the look and the sleep.
 */
import { delay } from "./time.ts";

/** A sleep that `wake()` ends early; see the module comment. */
export class WakeableSleep {
  readonly #stop: AbortSignal;
  #woken = false;
  #wakeup: AbortController | undefined;

  /** `stop` ends every sleep, now and later, at once. */
  constructor(stop: AbortSignal) {
    this.#stop = stop;
  }

  /**
   * Forgets earlier wake-ups. Call it just before looking for work: one
   * arriving while the look runs is kept and makes the next sleep return.
   */
  clear(): void {
    this.#woken = false;
  }

  /** Waits `ms`, or less if woken (or stopping). */
  async sleep(ms: number): Promise<void> {
    if (this.#woken) {
      this.#woken = false;
      return;
    }
    this.#wakeup = new AbortController();
    await delay(ms, AbortSignal.any([this.#wakeup.signal, this.#stop]));
    this.#wakeup = undefined;
    this.#woken = false;
  }

  /** Ends the sleep in progress, or the next one if none is. Never throws. */
  wake(): void {
    this.#woken = true;
    this.#wakeup?.abort();
  }
}
