/**
 * The admission kernel: `Admission.admit` is the only way a run is created.
 * It resolves and pins the workflow, validates the input against it, and
 * hands the run to a group-commit batcher whose flush is one
 * `INSERT … ON CONFLICT DO NOTHING` (plus, for keys already taken, one
 * follow-up `SELECT`). Idempotency is the unique index's alone: no
 * check-then-insert, no hash of the body; no `dispatch_key`, no dedup.
 */
import { type FieldError, PoimenError } from "../core/errors.ts";
import { delay } from "../core/time.ts";
import { newRunId } from "../core/uuid.ts";
import type { Sql } from "../db/pool.ts";
import { isUnavailable, toDbError } from "../db/pool.ts";
import {
  type AdmittedRow,
  insertRuns,
  type NewRun,
  selectRunsByDispatchKey,
} from "../db/admission.ts";
import type { RunRow } from "../db/runs.ts";
import type { RunRequest } from "../contracts/runs.ts";
import type { AdmissionVersion, WorkflowLookup } from "./catalog.ts";
import { Batcher } from "../core/batcher.ts";
import { formatPath } from "../contracts/json_value.ts";
import { keyAtPointer } from "../contracts/concurrency.ts";
import { admitDebounced } from "../db/debounce.ts";

/** A JSON Pointer's segments, unescaped (`/a~1b/0` → `["a/b", "0"]`). */
function pointerPath(pointer: string): string[] {
  return pointer.split("/").slice(1).map((s) => s.replaceAll("~1", "/").replaceAll("~0", "~"));
}

/** The key text of `input` at `pointer` for `wf`'s `what` key; a 422 naming the field when none. */
function keyOf(
  wf: AdmissionVersion,
  input: unknown,
  pointer: string | null,
  what: "concurrency" | "debounce",
): string {
  const outcome = keyAtPointer(input, pointer, what);
  if ("key" in outcome) return outcome.key;
  const path = formatPath(["input", ...pointerPath(pointer ?? "")]);
  throw new PoimenError("validation", `input does not match ${wf.name}@${wf.version}`, {
    errors: [{ path, message: outcome.problem }],
  });
}

/** What a caller asks for: the `POST /v1/runs` body, already schema-validated. */
export type AdmitRequest = RunRequest;

/**
 * Who is calling the kernel: the HTTP layer (every caller's run), a worker
 * starting a child run for a handler (`ctx.start`, worker/child_runs.ts), or
 * the schedule ticker (in the API process, admission/schedule_ticker.ts).
 * The origin is recorded (a metric label) so a test can prove nothing else
 * does.
 */
export type AdmissionEntry = "http" | "child" | "schedule";

export interface AdmitContext {
  tenantId: string;
  /** `http:<token name>` or `kafka:<topic>/<partition>/<offset>`. */
  source: string;
  entry: AdmissionEntry;
  /** The request's W3C traceparent, stored with a run it creates (a replay keeps the first's). */
  traceparent?: string;
  /**
   * A child run's lineage (entry `child`): its parent, and the root of the
   * parent's tree (the parent itself when it is a root).
   */
  parent?: { run_id: string; root_run_id: string; detached?: boolean };
}

export interface AdmitResult {
  run: RunRow;
  /** false: the dispatch key was already taken and `run` is the first run. */
  created: boolean;
  /** On a replay: whether the body equals the original's. Always true when created. */
  sameBody: boolean;
  /**
   * A debounced version's run: true when the request joined the pending run
   * of its debounce key (its input replaced, its start moved; `created`
   * false, and no replay), false when it made the run. Unset on a replay and
   * for a version without debounce.
   */
  debounced?: boolean;
}

export interface AdmissionHooks {
  /** After a flush that created at least one run committed (wakes workers). */
  onCreated?: (count: number) => void;
  /** Each call, with its entry (metrics). */
  onCall?: (entry: AdmissionEntry) => void;
  onFlush?: (size: number) => void;
}

export interface AdmissionOptions {
  maxBatch: number;
  maxConcurrent: number;
  /** Max attempts of a run whose version registered none (DEFAULT_MAX_ATTEMPTS); 3 by default. */
  defaultMaxAttempts?: number;
}

/**
 * The statements a flush runs (db/admission.ts). A seam for tests, which
 * wrap the real ones to inject a failure between them; production passes
 * nothing and gets these.
 */
export interface AdmissionStatements {
  insertRuns: typeof insertRuns;
  selectRunsByDispatchKey: typeof selectRunsByDispatchKey;
}

const STATEMENTS: AdmissionStatements = { insertRuns, selectRunsByDispatchKey };

// One flush at a time while flushes are quick: the batches are larger, so
// fewer statements and commits for the same admissions (20 % more of them at
// 16 and 64 connections, measured against two at a time). A second flush
// starts only while the one in flight has taken longer than this, so a slow
// or stuck flush does not hold every admission behind it.
const SPARE_FLUSH_AFTER_MS = 10;

// A key whose row vanished between the conflict and the follow-up select
// (deleted meanwhile) is tried again; more than this many times is a bug.
const MAX_ROUNDS = 5;
// A debounced admission that lost a race for its dispatch key (a unique
// violation) runs again, and then sees the holder; more than this is a bug.
const DEBOUNCE_ROUNDS = 3;
// An unknown workflow's problem names at most this many registered ones.
const MAX_NAMED = 20;
// The follow-up select after a committed insert: tried this often, waiting
// 50, then 100 ms, before the items it had to read fail.
const FOLLOW_UP_ATTEMPTS = 3;
const FOLLOW_UP_BACKOFF_MS = 50;

export class Admission {
  readonly #workflows: WorkflowLookup;
  readonly #defaultMaxAttempts: number;
  readonly #hooks: AdmissionHooks;
  readonly #batcher: Batcher<NewRun, AdmitResult>;
  readonly #sql: Sql;
  readonly #db: AdmissionStatements;

  constructor(
    sql: Sql,
    workflows: WorkflowLookup,
    opts: AdmissionOptions,
    hooks: AdmissionHooks = {},
    statements: Partial<AdmissionStatements> = {},
  ) {
    this.#sql = sql;
    this.#db = { ...STATEMENTS, ...statements };
    this.#workflows = workflows;
    this.#defaultMaxAttempts = opts.defaultMaxAttempts ?? 3;
    this.#hooks = hooks;
    this.#batcher = new Batcher((runs) => this.#flush(runs), {
      maxBatch: opts.maxBatch,
      maxConcurrent: opts.maxConcurrent,
      spareAfterMs: SPARE_FLUSH_AFTER_MS,
      onFlush: hooks.onFlush,
    }, (err) => !isUnavailable(err));
  }

  /**
   * The failing fields (paths under `payload`) of signal `name`'s payload,
   * for a run of `workflow@version` of `tenant`, against the schema that
   * version declares for it; undefined when it passes, the version declares
   * no signal of that name, or the version is not known here yet.
   */
  signalProblems(
    tenant: string,
    run: { workflow_name: string; workflow_version: number },
    name: string,
    payload: unknown,
  ): FieldError[] | undefined {
    const ref = `${run.workflow_name}@${run.workflow_version}`;
    return this.#workflows.resolve(ref, tenant)?.validateSignal(name, payload);
  }

  /** Admits one run; resolves with the created run or the one holding its dispatch key. */
  async admit(req: AdmitRequest, ctx: AdmitContext): Promise<AdmitResult> {
    this.#hooks.onCall?.(ctx.entry);
    const wf = this.#workflows.resolve(req.workflow_ref, ctx.tenantId) ??
      await this.#resolveUnknown(req, ctx.tenantId);
    const problems = wf.validate(req.input);
    if (problems) {
      throw new PoimenError("validation", `input does not match ${wf.name}@${wf.version}`, {
        errors: problems,
      });
    }
    let group: { concurrency_key: string; concurrency_limit: number } | undefined;
    if (wf.concurrency) {
      const key = keyOf(wf, req.input, wf.concurrency.key, "concurrency");
      group = { concurrency_key: key, concurrency_limit: wf.concurrency.limit };
    }
    const run: NewRun = {
      tenant_id: ctx.tenantId,
      run_id: newRunId(),
      workflow_ref: req.workflow_ref,
      workflow_name: wf.name,
      workflow_version: wf.version,
      // Stored as asked, not as parsed: the run replays the caller's input.
      input: req.input ?? null,
      goal_id: req.goal_id ?? null,
      dispatch_key: req.dispatch_key ?? null,
      source: ctx.source,
      max_attempts: wf.maxAttempts ?? this.#defaultMaxAttempts,
      run_after: req.run_after ?? null,
      traceparent: ctx.traceparent ?? null,
      priority: req.priority ?? 0,
      concurrency_key: group?.concurrency_key ?? null,
      concurrency_limit: group?.concurrency_limit ?? null,
      parent_run_id: ctx.parent?.run_id ?? null,
      root_run_id: ctx.parent?.root_run_id ?? null,
      detached: ctx.parent?.detached ?? false,
    };
    try {
      if (wf.debounce) return await this.#debounced(run, wf, req);
      return await this.#batcher.submit(run);
    } catch (err) {
      throw toDbError(err);
    }
  }

  /**
   * A run of a debounced version: one statement of its own (db/debounce.ts),
   * never the batcher's, so other workflows' admissions cost what they did.
   * Its start is the debounce's to set: a `run_after` is refused.
   */
  async #debounced(run: NewRun, wf: AdmissionVersion, req: AdmitRequest): Promise<AdmitResult> {
    const debounce = wf.debounce!;
    if (req.run_after != null) {
      throw new PoimenError("validation", `${wf.name}@${wf.version} is debounced`, {
        errors: [{
          path: "run_after",
          message: "is not allowed: the workflow is debounced, its debounce sets the start",
        }],
      });
    }
    const burst = {
      ...run,
      debounce_key: keyOf(wf, req.input, debounce.key, "debounce"),
      period_ms: debounce.period,
      max_wait_ms: debounce.maxWait,
    };
    for (let round = 1;; round++) {
      try {
        const { i: _, created, same_body, debounced: joined, ...row } = await admitDebounced(
          this.#sql,
          burst,
        );
        if (created) this.#hooks.onCreated?.(1);
        // A replay is a replay: it says nothing of debounce.
        return {
          run: row,
          created,
          sameBody: same_body,
          debounced: created || joined ? joined : undefined,
        };
      } catch (err) {
        // Its dispatch key taken after the statement's snapshot: run it again to see the holder.
        if ((err as { code?: string }).code !== "23505" || round >= DEBOUNCE_ROUNDS) throw err;
      }
    }
  }

  /**
   * A ref this process does not know: maybe registered a moment ago, its
   * NOTIFY still on the way, so look again once before calling it unknown.
   * A version registered for other tenants only is unknown to this one, in
   * the same words, and the list names only what this tenant may start.
   */
  async #resolveUnknown(req: AdmitRequest, tenant: string): Promise<AdmissionVersion> {
    await this.#workflows.refreshUnknown();
    const wf = this.#workflows.resolve(req.workflow_ref, tenant);
    if (wf) return wf;
    const known = this.#workflows.list(tenant);
    const named = known.length > MAX_NAMED
      ? `${known.slice(0, MAX_NAMED).join(", ")} and ${known.length - MAX_NAMED} more`
      : known.join(", ");
    throw new PoimenError(
      "unknown-workflow",
      `unknown workflow ${JSON.stringify(req.workflow_ref)}; registered: ${
        known.length > 0 ? named : "none (no worker has registered a workflow for this tenant yet)"
      }`,
      { errors: [{ path: "workflow_ref", message: "unknown workflow" }] },
    );
  }

  /**
   * One flush. Only the first insert may throw: until it committed, the batch
   * can be retried or split by the batcher. Once it committed, the flush
   * never throws (the batcher would run the same runs again: a keyless run's
   * caller got a 500 for a run that exists, the primary key refusing the
   * second insert): every item is answered from what the insert returned,
   * and only the follow-up reads are retried. An item a later statement
   * could not settle fails alone; it has a dispatch key (keyless items are
   * always created by the insert), so its caller's retry is idempotent.
   */
  async #flush(runs: NewRun[]): Promise<(AdmitResult | Error)[]> {
    const results = new Map<NewRun, AdmitResult | Error>();
    const settle = (batch: NewRun[], rows: AdmittedRow[]): NewRun[] => {
      for (const { i, created, same_body, ...run } of rows) {
        results.set(batch[i], { run, created, sameBody: same_body });
      }
      return batch.filter((r) => !results.has(r));
    };
    const rows = await this.#db.insertRuns(this.#sql, runs);
    const createdCount = rows.filter((r) => r.created).length;
    if (createdCount > 0) this.#hooks.onCreated?.(createdCount);
    let todo = settle(runs, rows);
    // Keys whose holder committed after the insert's snapshot: read them in a
    // new one. A holder deleted meanwhile leaves its key free: admit again.
    try {
      for (let round = 0; todo.length > 0 && round < MAX_ROUNDS; round++) {
        const keys = todo;
        todo = settle(
          todo,
          await this.#retried(() => this.#db.selectRunsByDispatchKey(this.#sql, keys)),
        );
        if (todo.length === 0) break;
        const again = await this.#db.insertRuns(this.#sql, todo);
        const n = again.filter((r) => r.created).length;
        if (n > 0) this.#hooks.onCreated?.(n);
        todo = settle(todo, again);
      }
    } catch (err) {
      for (const r of todo) results.set(r, err instanceof Error ? err : new Error(String(err)));
    }
    return runs.map((r) =>
      results.get(r) ??
        new PoimenError("internal", `admission of dispatch key ${r.dispatch_key} did not settle`)
    );
  }

  /** `read` (a select, safe to repeat), tried up to FOLLOW_UP_ATTEMPTS times with a short backoff. */
  async #retried<T>(read: () => Promise<T>): Promise<T> {
    for (let attempt = 1;; attempt++) {
      try {
        return await read();
      } catch (err) {
        if (attempt >= FOLLOW_UP_ATTEMPTS) throw err;
        await delay(FOLLOW_UP_BACKOFF_MS * 2 ** (attempt - 1));
      }
    }
  }
}
