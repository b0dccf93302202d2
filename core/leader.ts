/**
 * Leader election among the processes of one role, as River elects its
 * leader: each tries to take a session-level advisory lock (db/leader.ts)
 * on a connection of its own, every `retryMs`; the one that holds it is the
 * leader and runs the role's leader-only tasks (`whileLeader`), the others
 * keep trying. The leader checks every `retryMs` that its session still
 * holds the lock; when the check fails (the connection died, Postgres
 * restarted, the check hung) it stops its tasks and steps down, and its lock
 * is gone with its session, so another process takes over within about one
 * `retryMs`. A leader that stops gives the lock up at once.
 *
 * The work it guards must stay correct with two leaders for a moment (a
 * leader cut off from Postgres may not know yet that it lost the lock): it
 * is maintenance that is safe to run twice (every statement skips rows others
 * hold), done once instead of once per process.
 */
import type { Logger } from "./log.ts";
import { once, type Service } from "./lifecycle.ts";
import { delay } from "./time.ts";
import type { Sql } from "../db/pool.ts";
import {
  holdsLeaderLock,
  type LeaderRole,
  releaseLeaderLock,
  tryLeaderLock,
} from "../db/leader.ts";

/** Options of `LeaderElector`. */
export interface LeaderElectorOptions {
  role: LeaderRole;
  /**
   * Opens the session the lock is held on: a pool of one connection of its
   * own, ended when leadership ends (so a session in doubt is closed, and
   * its lock freed, with it). Never a connection reserved from a shared
   * pool: a reserved connection has no guard against a kill
   * (vendor/postgres/PATCHES.md) and would go back to the pool closed.
   */
  connect: () => Sql;
  /** Mean time between two tries of a follower, and two checks of the leader (jittered ±25%). */
  retryMs: number;
  log: Logger;
  /** Leadership won (true) or lost (false); must not throw. */
  onChange?(leader: boolean): void;
}

interface Session {
  sql: Sql;
  /** Closes it for good: the lock goes with it. */
  end(): Promise<void>;
}

/** Elects one leader per role across processes; see the module comment. */
export class LeaderElector implements Service {
  readonly #opts: LeaderElectorOptions;
  readonly #tasks: { name: string; make: () => Service }[] = [];
  readonly #stopping = new AbortController();
  #running: { name: string; service: Service }[] = [];
  #session: Session | undefined;
  #leader = false;
  #loop: Promise<void> = Promise.resolve();
  #started = false;

  constructor(opts: LeaderElectorOptions) {
    this.#opts = opts;
  }

  /** Whether this process is the leader now. */
  get isLeader(): boolean {
    return this.#leader;
  }

  /**
   * Runs a service made by `make` while this process leads: made and
   * started each time leadership is won, stopped when it is lost or this
   * elector stops. Register before `start()`.
   */
  whileLeader(name: string, make: () => Service): void {
    if (this.#started) throw new Error(`leader task ${name} registered after start`);
    this.#tasks.push({ name, make });
  }

  /** Tries at once, then every `retryMs`, in the background; never waits on Postgres. */
  start(): Promise<void> {
    if (this.#stopping.signal.aborted) throw new Error("leader elector stopped");
    if (this.#started) throw new Error("leader elector already started");
    this.#started = true;
    this.#loop = this.#run();
    return Promise.resolve();
  }

  /** Stops trying; a leader stops its tasks and gives the lock up. Safe to call twice. */
  readonly stop: () => Promise<void> = once(async () => {
    this.#stopping.abort();
    await this.#loop;
    await this.#stepDown("stopping");
  });

  async #run(): Promise<void> {
    const signal = this.#stopping.signal;
    while (!signal.aborted) {
      if (this.#leader) await this.#check();
      else await this.#try();
      if (signal.aborted) return;
      await delay(this.#opts.retryMs * (0.75 + Math.random() / 2), signal);
    }
  }

  #open(): Promise<Session> {
    const sql = this.#opts.connect();
    return Promise.resolve({ sql, end: () => sql.end({ timeout: 0 }) });
  }

  async #try(): Promise<void> {
    const { role, log } = this.#opts;
    try {
      this.#session ??= await this.#withTimeout(this.#open());
      if (!await this.#withTimeout(tryLeaderLock(this.#session.sql, role))) {
        return;
      }
    } catch (error) {
      log.warn("leader election failed; trying again", { role, error });
      await this.#close();
      return;
    }
    if (this.#stopping.signal.aborted) return;
    this.#leader = true;
    log.info("leader elected: this process", { role });
    this.#opts.onChange?.(true);
    for (const { name, make } of this.#tasks) {
      try {
        const service = make();
        await service.start();
        this.#running.push({ name, service });
      } catch (error) {
        log.error("leader task failed to start", { role, task: name, error });
      }
    }
  }

  async #check(): Promise<void> {
    let held = false;
    let error: unknown;
    try {
      held = await this.#withTimeout(holdsLeaderLock(this.#session!.sql, this.#opts.role));
    } catch (err) {
      error = err;
    }
    if (held) return;
    this.#opts.log.warn("leadership lost: the lock's session is gone", {
      role: this.#opts.role,
      error,
    });
    // The session may be alive (a hung check): end it, so its lock goes too.
    await this.#stepDown("lost");
  }

  /** Stops the tasks, then gives the lock up and closes the session. */
  async #stepDown(why: "lost" | "stopping"): Promise<void> {
    const wasLeader = this.#leader;
    this.#leader = false;
    const running = this.#running;
    this.#running = [];
    await Promise.all(running.map(async ({ name, service }) => {
      try {
        await service.stop();
      } catch (error) {
        this.#opts.log.error("leader task failed to stop", { task: name, error });
      }
    }));
    // Given up even when lost: a check that hung may have left the session
    // alive; ending the session frees it too, but only once the pool closes it.
    if (wasLeader && this.#session) {
      try {
        await this.#withTimeout(releaseLeaderLock(this.#session.sql, this.#opts.role));
      } catch (error) {
        if (why === "stopping") {
          this.#opts.log.warn("could not give the leader lock up; it goes with the session", {
            error,
          });
        }
      }
    }
    await this.#close();
    if (wasLeader) this.#opts.onChange?.(false);
  }

  async #close(): Promise<void> {
    const session = this.#session;
    this.#session = undefined;
    try {
      await session?.end();
    } catch { /* it is gone either way */ }
  }

  /** `p`, or a rejection after `retryMs`: a check that hangs counts as failed. */
  #withTimeout<T>(p: Promise<T>): Promise<T> {
    const ms = this.#opts.retryMs;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
    });
    return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
  }
}
