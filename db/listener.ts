/**
 * LISTEN for wake-up notifications (db/notify.ts has the channels).
 * Those who listen also poll, so a notification only saves latency; what
 * this module guards is that listening never stops for good:
 *
 * - `start()` waits for the first LISTEN, so a NOTIFY sent after it returns
 *   is not missed; when it fails (Postgres away), it returns anyway and
 *   tries again in the background with backoff, each time on a fresh pool,
 *   until one succeeds. A fresh pool, not the same one again: postgres.js
 *   (3.4.9) answers a later `listen()` on a channel from the result of that
 *   channel's first one, which, if it failed and the driver did not replace
 *   it, fails every later try.
 * - Once listening, a lost connection (a restart, `pg_terminate_backend`) is
 *   postgres.js's to mend: it reconnects and LISTENs again by itself. What
 *   was notified in between is lost, so `onListen` is called then, as after
 *   the first LISTEN: the caller looks for work once.
 */
import type { Service } from "../core/lifecycle.ts";
import { once } from "../core/lifecycle.ts";
import type { Logger } from "../core/log.ts";
import { backoffWithJitter, delay, SECOND } from "../core/time.ts";
import type { Sql } from "./pool.ts";

/** Where a `Listener` listens. */
export type ListenerPool =
  /**
   * Opens a pool used only for LISTEN: one per try, retried until one
   * listens, ended by `stop()`.
   */
  | { connect: () => Sql; pool?: never }
  /** A pool the listener does not own: it listens on it once, and if that fails, not at all. */
  | { pool: Sql; connect?: never };

/** Options of `Listener`. */
export type ListenerOptions = ListenerPool & {
  /** What to LISTEN on: each channel, with what to call for each of its notifications. */
  channels: Readonly<Record<string, (payload: string) => void>>;
  /**
   * Called once per channel each time its LISTEN took: the first time and
   * after each reconnect (notifications sent meanwhile are lost). Keep it
   * idempotent, like a wake-up.
   */
  onListen?: () => void;
  log: Logger;
  /** First retry's backoff ceiling after a failed LISTEN; 1 s by default. */
  retryBaseMs?: number;
  /** Largest retry backoff; 30 s by default. */
  retryCapMs?: number;
};

/** LISTENs on a set of channels until stopped; see the module comment. */
export class Listener implements Service {
  readonly #opts: ListenerOptions;
  readonly #log: Logger;
  readonly #stopping = new AbortController();
  #started = false;
  #retrying: Promise<void> = Promise.resolve();
  #unlisten: (() => Promise<void>) | undefined;

  constructor(opts: ListenerOptions) {
    this.#opts = opts;
    this.#log = opts.log;
  }

  /** Whether every channel's LISTEN has taken (and `stop()` has not been called). */
  get listening(): boolean {
    return this.#unlisten !== undefined;
  }

  /**
   * LISTENs, waiting for the first try only: when it fails, retries go on in
   * the background (with `connect`), and this still resolves.
   */
  async start(): Promise<void> {
    if (this.#started) throw new Error("listener already started");
    if (this.#stopping.signal.aborted) throw new Error("listener stopped");
    this.#started = true;
    if (!await this.#listen(0) && this.#opts.connect) this.#retrying = this.#retry();
  }

  /**
   * Stops retrying, UNLISTENs and ends its own pool. Safe to call twice, and
   * before `start()`.
   */
  readonly stop: () => Promise<void> = once(async () => {
    this.#stopping.abort();
    // A try under way when stop() came may yet succeed: unlisten it too.
    await this.#retrying;
    const unlisten = this.#unlisten;
    this.#unlisten = undefined;
    try {
      await unlisten?.();
    } catch (err) {
      this.#log.warn("unlisten failed", { error: err });
    }
  });

  async #retry(): Promise<void> {
    const signal = this.#stopping.signal;
    const base = this.#opts.retryBaseMs ?? SECOND;
    const cap = this.#opts.retryCapMs ?? 30 * SECOND;
    for (let n = 1; !signal.aborted; n++) {
      await delay(backoffWithJitter(n, base, cap), signal);
      if (signal.aborted) return;
      if (await this.#listen(n)) return;
    }
  }

  /** One try: true when every channel listens; on failure, nothing is left listening. */
  async #listen(retries: number): Promise<boolean> {
    const own = this.#opts.connect?.();
    const sql = own ?? this.#opts.pool!;
    const onListen = this.#opts.onListen && this.#guarded("onListen", this.#opts.onListen);
    const subs: { unlisten(): Promise<unknown> }[] = [];
    try {
      for (const [channel, onNotify] of Object.entries(this.#opts.channels)) {
        subs.push(await sql.listen(channel, this.#guarded(channel, onNotify), onListen));
      }
    } catch (err) {
      await Promise.allSettled(subs.map((s) => s.unlisten()));
      await own?.end({ timeout: 0 }).catch(() => {});
      this.#log.warn(
        own ? "listen failed; polling until it succeeds" : "listen failed; polling only",
        { error: err },
      );
      return false;
    }
    this.#unlisten = async () => {
      // Every UNLISTEN settles before stop() returns, even when one fails:
      // a stopped listener must not have a statement of its own on the wire.
      const results = await Promise.allSettled(subs.map((s) => s.unlisten()));
      await own?.end({ timeout: 1 });
      const failed = results.find((r) => r.status === "rejected");
      if (failed) throw (failed as PromiseRejectedResult).reason;
    };
    if (retries > 0) this.#log.info("listening", { retries });
    return true;
  }

  // The callbacks run inside the driver's socket handler, where a throw
  // would break the connection's reading.
  #guarded<A extends unknown[]>(what: string, fn: (...args: A) => void): (...args: A) => void {
    return (...args) => {
      try {
        fn(...args);
      } catch (err) {
        this.#log.error("listener callback threw", { callback: what, error: err });
      }
    };
  }
}
