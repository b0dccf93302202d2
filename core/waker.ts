/**
 * Waking workers without a NOTIFY on the admission hot path: a NOTIFY inside
 * every admission transaction serializes all commits behind one cluster-wide
 * lock. Instead, after admissions commit, `poke()` sends one NOTIFY outside
 * any admission; pokes that arrive while one is in flight coalesce into a
 * single follow-up. Workers also poll, so a lost wake-up only costs latency.
 */
export class Waker {
  readonly #notify: () => Promise<void>;
  readonly #onError: (err: unknown) => void;
  #inFlight = false;
  #again = false;

  constructor(notify: () => Promise<void>, onError: (err: unknown) => void) {
    this.#notify = notify;
    this.#onError = onError;
  }

  /** Asks for a wake-up soon; never throws, never waits. */
  poke(): void {
    if (this.#inFlight) {
      this.#again = true;
      return;
    }
    this.#inFlight = true;
    this.#notify().catch(this.#onError).finally(() => {
      this.#inFlight = false;
      if (this.#again) {
        this.#again = false;
        this.poke();
      }
    });
  }
}
