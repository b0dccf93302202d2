/**
 * A worker's place in the workflow catalog (db/catalog.ts): before it claims
 * anything it registers each version it hosts — refusing to start when the
 * catalog holds another definition of one, or when a new version's
 * concurrency differs from its workflow's — and then keeps a liveness row
 * saying which versions it hosts, renewed while it runs and deleted when it
 * stops, so the API can say of a queued run that no live worker hosts its
 * version. A registration of new versions is announced on `poimen_catalog`
 * after it committed. Registering also writes the schedules the versions
 * declare (worker/declared_schedules.ts).
 */
import { PoimenError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { once, type Service } from "../core/lifecycle.ts";
import { backoffWithJitter, delay, SECOND } from "../core/time.ts";
import { registerVersions, removeWorker, renewWorker } from "../db/catalog.ts";
import { notifyCatalog } from "../db/notify.ts";
import { isUnavailable, type Sql } from "../db/pool.ts";
import type { WorkflowRegistry } from "../workflows/registry.ts";
import { writeDeclaredSchedules } from "./declared_schedules.ts";

/** `limit 5 per /customer_id`, `limit 5 per tenant`, `none`: a version's concurrency in words. */
function concurrencyText(
  c: { concurrency_limit?: number | null; concurrency_key?: string | null },
): string {
  if (c.concurrency_limit == null) return "none";
  return `limit ${c.concurrency_limit} per ${c.concurrency_key ?? "tenant"}`;
}

/** How long a liveness row lasts without renewal: a killed worker stops counting after this. */
export const PRESENCE_TTL_MS = 30 * SECOND;

// Renewed three times a TTL: one missed renewal (a slow Postgres) does not
// make a live worker look dead.
const RENEW_MS = PRESENCE_TTL_MS / 3;

// Another worker's registration of the same version may commit after this
// statement's snapshot: asked again this often before giving up.
const REGISTER_ROUNDS = 5;

/** Registration and liveness; see the module comment. */
export class WorkerPresence implements Service {
  readonly #sql: Sql;
  readonly #id: string;
  readonly #registry: WorkflowRegistry;
  readonly #log: Logger;
  readonly #stopping = new AbortController();
  #renewing: Promise<void> = Promise.resolve();
  #registered = false;

  constructor(sql: Sql, id: string, registry: WorkflowRegistry, log: Logger) {
    this.#sql = sql;
    this.#id = id;
    this.#registry = registry;
    this.#log = log;
  }

  /** Whether registration is done (claiming waits for it). */
  get registered(): boolean {
    return this.#registered;
  }

  /**
   * Registers the hosted versions and writes the liveness row. While Postgres
   * is unavailable it tries again with backoff, until `signal` (or `stop()`)
   * ends it; a conflicting definition throws a `workflow-conflict` error
   * naming the workflow.
   */
  async start(signal?: AbortSignal): Promise<void> {
    const give = signal ? AbortSignal.any([signal, this.#stopping.signal]) : this.#stopping.signal;
    for (let attempt = 0; !give.aborted; attempt++) {
      try {
        const created = await this.#register();
        await writeDeclaredSchedules(this.#sql, this.#registry.catalogVersions(), this.#log);
        await renewWorker(this.#sql, this.#id, this.#registry.list(), PRESENCE_TTL_MS);
        this.#registered = true;
        // APIs learn new versions from it; what a worker hosts they read when asked.
        if (created > 0) await this.#announce();
        this.#renewing = this.#renewLoop();
        return;
      } catch (err) {
        if (!isUnavailable(err)) throw err;
        this.#log.warn("workflow registration waits for Postgres", { error: err });
        await delay(backoffWithJitter(attempt, SECOND, 10 * SECOND), give);
      }
    }
  }

  /** Stops renewing and deletes the liveness row (its versions stop counting as hosted). */
  stop: () => Promise<void> = once(async () => {
    this.#stopping.abort();
    await this.#renewing;
    if (!this.#registered) return;
    try {
      await removeWorker(this.#sql, this.#id);
    } catch (err) {
      // Its row expires by itself within PRESENCE_TTL_MS.
      this.#log.warn("could not remove the worker's liveness row", { error: err });
    }
  });

  /** Registers the hosted versions; resolves with how many were new. */
  async #register(): Promise<number> {
    let created = 0;
    let pending = this.#registry.catalogVersions();
    for (let round = 0; pending.length > 0; round++) {
      const found = await registerVersions(this.#sql, pending, this.#id);
      const refused = found.find((r) => r.refused !== null);
      if (refused) {
        const mine = pending.find((v) => v.name === refused.name && v.version === refused.version)!;
        throw new PoimenError(
          "workflow-conflict",
          `worker: workflow ${refused.name}@${refused.version} declares concurrency ${
            concurrencyText(mine)
          } but ${refused.name}@${refused.refused!.version} declares ${
            concurrencyText(refused.refused!)
          }; the versions of a workflow share its concurrency slots, so a new version must ` +
            `declare the same (or the workflow a new name)`,
        );
      }
      const conflict = found.find((r) => r.same === false);
      if (conflict) {
        throw new PoimenError(
          "workflow-conflict",
          `worker: workflow ${conflict.name}@${conflict.version} is already registered ` +
            `with another definition (input or output schema, maxAttempts, concurrency, ` +
            `debounce, tenants or schedules); a registered version never changes: give the ` +
            `new definition a new version`,
        );
      }
      for (const r of found.filter((r) => r.created)) {
        created++;
        // Only a name's first version becomes current by itself; any later one waits for
        // `deno task workflow promote`.
        this.#log.info("workflow version registered", {
          workflow: `${r.name}@${r.version}`,
          current: r.current,
        });
      }
      const unsettled = new Set(
        found.filter((r) => r.same === null).map((r) => `${r.name}@${r.version}`),
      );
      pending = pending.filter((v) => unsettled.has(`${v.name}@${v.version}`));
      if (pending.length > 0 && round >= REGISTER_ROUNDS) {
        throw new Error(`registration of ${[...unsettled].join(", ")} did not settle`);
      }
    }
    return created;
  }

  async #renewLoop(): Promise<void> {
    while (!this.#stopping.signal.aborted) {
      await delay(RENEW_MS, this.#stopping.signal);
      if (this.#stopping.signal.aborted) return;
      try {
        await renewWorker(this.#sql, this.#id, this.#registry.list(), PRESENCE_TTL_MS);
      } catch (err) {
        this.#log.warn("worker liveness renewal failed", { error: err });
      }
    }
  }

  async #announce(): Promise<void> {
    try {
      await notifyCatalog(this.#sql);
    } catch (err) {
      // APIs refresh on a timer too.
      this.#log.warn("catalog notify failed", { error: err });
    }
  }
}
