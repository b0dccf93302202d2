/**
 * Child runs (`ctx.start`, issue 31): how a worker admits the runs its
 * handlers start.
 *
 * Through the admission kernel itself (admission/admit.ts), in process, not
 * through the HTTP API: the worker is trusted (it already writes its runs'
 * state), and the kernel is what makes a run — version resolution, input
 * validation against the catalog's JSON Schema, concurrency groups, the
 * group-commit batcher whose one `INSERT … ON CONFLICT DO NOTHING` makes
 * admission exactly-once. A child is the parent's tenant's run, with the
 * dispatch key `child:<parent run_id>:<call name>` (reserved: no caller may
 * use it, api/runs.ts), so a parent retried after a crash finds the child
 * it started instead of starting another. The relay's HTTP-only rule is
 * about an untrusted edge; a worker holds a database pool anyway.
 *
 * The catalog is read when a workflow is first met (the kernel refreshes
 * on a miss) and never listened to: a child is started by its definition's
 * `name@version`, which never changes once registered, so nothing here can
 * go stale. Each admission also writes the parent's `child.started` and
 * cancels a child whose parent's cancel won the race (db/child_admission.ts).
 *
 * The tenant's quotas apply as at the API's door (admission/quota.ts, the
 * same gate, one per worker): over `max_queued` or `admission_rate`, the
 * start throws the API's 429 error (`queue-full`, `rate-limited`: a
 * retryable `PoimenError`), which fails the parent's step and its attempt,
 * retried later. The quotas are read again at most every
 * CHILD_QUOTA_REFRESH_MS, when a child is started (no timer to stop).
 */
import { Admission } from "../admission/admit.ts";
import { QuotaGate } from "../admission/quota.ts";
import { WorkflowCatalog } from "../admission/catalog.ts";
import type { Logger } from "../core/log.ts";
import { childDispatchKey } from "../contracts/runs.ts";
import { selectRootRunId } from "../db/lineage.ts";
import { insertChildRuns } from "../db/child_admission.ts";
import type { Sql } from "../db/pool.ts";
import type { RunRow } from "../db/runs.ts";
import type { ChildRun, StartOptions } from "../workflows/durable.ts";

/** A parent run, as its attempt knows it. */
export interface ParentRun {
  tenant_id: string;
  run_id: string;
  traceparent?: string | null;
}

/** What a child is started with. */
export interface ChildRequest {
  /** The durable call's name in the parent (`name`, `name#2`…): part of the child's key. */
  name: string;
  /** `name@version` of the child's workflow. */
  workflowRef: string;
  input: unknown;
  priority?: number;
  /** Not reached by a cancel of its ancestors (`StartOptions.detached`). */
  detached?: boolean;
}

// Admission batches: children a handler starts at once share a flush.
const MAX_BATCH = 500;
const MAX_CONCURRENT = 2;
/** How often a worker reads the tenants' quotas again, at most (as QUOTA_REFRESH_MS at the API). */
export const CHILD_QUOTA_REFRESH_MS = 1_000;
// Unused: the catalog is never started (see the module comment), so it never listens.
const CATALOG_REFRESH_MS = 30_000;

/** Admits child runs for one worker's handlers; see the module comment. */
export class ChildAdmission {
  readonly #sql: Sql;
  readonly #admission: Admission;
  readonly #roots = new Map<string, string>();
  readonly #quota: QuotaGate;
  readonly #log: Logger;
  #quotaReadAt = performance.now();

  constructor(sql: Sql, log: Logger, onCreated: () => void) {
    this.#sql = sql;
    this.#log = log;
    this.#quota = new QuotaGate(sql, { refreshMs: CHILD_QUOTA_REFRESH_MS, log });
    const catalog = new WorkflowCatalog(sql, {
      refreshMs: CATALOG_REFRESH_MS,
      listen: () => sql,
      log,
    });
    this.#admission = new Admission(
      sql,
      catalog,
      {
        maxBatch: MAX_BATCH,
        maxConcurrent: MAX_CONCURRENT,
      },
      { onCreated },
      { insertRuns: insertChildRuns },
    );
  }

  /**
   * Admits `child` for `parent` (or finds the child admitted before under
   * its key). Throws the kernel's typed errors: `unknown-workflow`,
   * `validation` (the input against the child's schema), `unavailable`;
   * and the quota gate's: `queue-full`, `rate-limited` (retryable).
   */
  async start(parent: ParentRun, child: ChildRequest): Promise<RunRow> {
    const root = await this.#rootOf(parent);
    this.#refreshQuotas();
    const { run } = await this.#quota.admit(parent.tenant_id, () =>
      this.#admission.admit({
        workflow_ref: child.workflowRef,
        input: child.input,
        dispatch_key: childDispatchKey(parent.run_id, child.name),
        priority: child.priority,
      }, {
        tenantId: parent.tenant_id,
        source: `run:${parent.run_id}`,
        entry: "child",
        traceparent: parent.traceparent ?? undefined,
        parent: { run_id: parent.run_id, root_run_id: root, detached: child.detached ?? false },
      }));
    return run;
  }

  /** Reads the quotas again in the background when the last read is CHILD_QUOTA_REFRESH_MS old. */
  #refreshQuotas(): void {
    const now = performance.now();
    if (now - this.#quotaReadAt < CHILD_QUOTA_REFRESH_MS) return;
    this.#quotaReadAt = now;
    this.#quota.refresh().catch((error) =>
      this.#log.warn("tenant quotas not read; retrying", { error })
    );
  }

  /** The parent's root, read once per parent run (it never changes). */
  async #rootOf(parent: ParentRun): Promise<string> {
    const known = this.#roots.get(parent.run_id);
    if (known) return known;
    const root = await selectRootRunId(this.#sql, parent.tenant_id, parent.run_id) ??
      parent.run_id;
    // Bounded: a worker hosts many runs over its life.
    if (this.#roots.size >= 10_000) this.#roots.clear();
    this.#roots.set(parent.run_id, root);
    return root;
  }
}

/** A `ctx.start` call as the handler made it. */
export interface StartCall {
  name: string;
  definition: { name: string; version: number };
  input: unknown;
  options?: StartOptions;
}

/**
 * `ctx.start`: a step (`step`, the durable calls' own, named as the call)
 * whose result is the child's run id. The step's key makes the child's
 * dispatch key, so a step that died after the admission committed and
 * before its result was stored admits a replay the next time: the same child.
 */
export async function startChild<O>(
  children: ChildAdmission | undefined,
  run: ParentRun,
  step: (fn: (stepKey: string) => Promise<{ run_id: string }>) => Promise<{ run_id: string }>,
  call: StartCall,
  result: (runId: string) => Promise<O>,
): Promise<ChildRun<O>> {
  const { name, definition, input, options = {} } = call;
  if (!children) throw new TypeError(`ctx.start ${name}: this worker cannot start child runs`);
  if (typeof definition?.name !== "string" || !Number.isInteger(definition.version)) {
    throw new TypeError(`ctx.start ${name}: definition must be a workflow definition`);
  }
  const prefix = `${run.tenant_id}:${run.run_id}:`;
  const started = await step(async (key) => {
    const child = await children.start(run, {
      name: key.slice(prefix.length),
      workflowRef: `${definition.name}@${definition.version}`,
      input,
      priority: options.priority,
      detached: options.detached === true,
    });
    return { run_id: child.run_id };
  });
  const runId = started.run_id;
  return { runId, result: () => result(runId) };
}
