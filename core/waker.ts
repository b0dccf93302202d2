/**
 * Waking workers without a NOTIFY on the admission hot path: a NOTIFY inside
 * every admission transaction serializes all commits behind one cluster-wide
 * lock. Instead, after admissions commit, `poke()` sends one NOTIFY outside
 * any admission; pokes that arrive while one is in flight coalesce into a
 * single follow-up. Workers also poll, so a lost wake-up only costs latency.
 *
 * With `minIntervalMs`, NOTIFYs start at least that far apart: under load a
 * listener is already awake and busy, and each NOTIFY is a statement and a
 * commit of its own. The first poke after a quiet spell still goes at once.
 */
export class Waker {
  readonly #notify: () => Promise<void>;
  readonly #onError: (err: unknown) => void;
  readonly #minIntervalMs: number;
  #inFlight = false;
  #again = false;
  #lastSent = -Infinity;

  constructor(notify: () => Promise<void>, onError: (err: unknown) => void, minIntervalMs = 0) {
    this.#notify = notify;
    this.#onError = onError;
    this.#minIntervalMs = minIntervalMs;
  }

  /** Asks for a wake-up soon; never throws, never waits. */
  poke(): void {
    if (this.#inFlight) {
      this.#again = true;
      return;
    }
    this.#inFlight = true;
    const wait = this.#lastSent + this.#minIntervalMs - performance.now();
    if (wait > 0) setTimeout(() => this.#send(), wait);
    else this.#send();
  }

  #send(): void {
    this.#lastSent = performance.now();
    this.#notify().catch(this.#onError).finally(() => {
      this.#inFlight = false;
      if (this.#again) {
        this.#again = false;
        this.poke();
      }
    });
  }
}
