/**
 * The admission kernel: `Admission.admit` is the only way a run is created.
 * It resolves and pins the workflow, validates the input against it, and
 * hands the run to a group-commit batcher whose flush is one
 * `INSERT … ON CONFLICT DO NOTHING` (plus, for keys already taken, one
 * follow-up `SELECT`). Idempotency is the unique index's alone: no
 * check-then-insert, no hash of the body; no `dispatch_key`, no dedup.
 */
import type { z } from "zod";
import { PoimenError } from "../core/errors.ts";
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
import type { WorkflowRegistry } from "../workflows/registry.ts";
import type { RunRequest } from "../contracts/runs.ts";
import { Batcher } from "./batcher.ts";

/** What a caller asks for: the `POST /v1/runs` body, already schema-validated. */
export type AdmitRequest = RunRequest;

/**
 * Who is calling the kernel. Only the HTTP layer admits runs; the origin is
 * recorded (a metric label) so a test can prove nothing else does.
 */
export type AdmissionEntry = "http";

export interface AdmitContext {
  tenantId: string;
  /** `http:<token name>` or `kafka:<topic>/<partition>/<offset>`. */
  source: string;
  entry: AdmissionEntry;
}

export interface AdmitResult {
  run: RunRow;
  /** false: the dispatch key was already taken and `run` is the first run. */
  created: boolean;
  /** On a replay: whether the body equals the original's. Always true when created. */
  sameBody: boolean;
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
}

// A key whose row vanished between the conflict and the follow-up select
// (deleted meanwhile) is tried again; more than this many times is a bug.
const MAX_ROUNDS = 5;

export class Admission {
  readonly #registry: WorkflowRegistry;
  readonly #hooks: AdmissionHooks;
  readonly #batcher: Batcher<NewRun, AdmitResult>;
  readonly #sql: Sql;

  constructor(
    sql: Sql,
    registry: WorkflowRegistry,
    opts: AdmissionOptions,
    hooks: AdmissionHooks = {},
  ) {
    this.#sql = sql;
    this.#registry = registry;
    this.#hooks = hooks;
    this.#batcher = new Batcher((runs) => this.#flush(runs), {
      ...opts,
      onFlush: hooks.onFlush,
    }, (err) => !isUnavailable(err));
  }

  /** Admits one run; resolves with the created run or the one holding its dispatch key. */
  async admit(req: AdmitRequest, ctx: AdmitContext): Promise<AdmitResult> {
    this.#hooks.onCall?.(ctx.entry);
    const wf = this.#registry.resolve(req.workflow_ref);
    if (!wf) {
      throw new PoimenError(
        "unknown-workflow",
        `unknown workflow ${JSON.stringify(req.workflow_ref)}; known: ${
          this.#registry.list().join(", ")
        }`,
        { errors: [{ path: "workflow_ref", message: "unknown workflow" }] },
      );
    }
    const parsed = wf.workflow.input.safeParse(req.input);
    if (!parsed.success) {
      throw new PoimenError("validation", `input does not match ${wf.name}@${wf.version}`, {
        errors: parsed.error.issues.map((i: z.core.$ZodIssue) => ({
          path: ["input", ...i.path.map(String)].join("."),
          message: i.message,
        })),
      });
    }
    try {
      return await this.#batcher.submit({
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
        max_attempts: wf.maxAttempts,
      });
    } catch (err) {
      throw toDbError(err);
    }
  }

  async #flush(runs: NewRun[]): Promise<(AdmitResult | Error)[]> {
    const results = new Map<NewRun, AdmitResult>();
    const settle = (batch: NewRun[], rows: AdmittedRow[]): NewRun[] => {
      for (const { i, created, same_body, ...run } of rows) {
        results.set(batch[i], { run, created, sameBody: same_body });
      }
      return batch.filter((r) => !results.has(r));
    };
    const rows = await insertRuns(this.#sql, runs);
    const createdCount = rows.filter((r) => r.created).length;
    if (createdCount > 0) this.#hooks.onCreated?.(createdCount);
    let todo = settle(runs, rows);
    // Keys whose holder committed after the insert's snapshot: read them in a
    // new one. A holder deleted meanwhile leaves its key free: admit again.
    for (let round = 0; todo.length > 0 && round < MAX_ROUNDS; round++) {
      todo = settle(todo, await selectRunsByDispatchKey(this.#sql, todo));
      if (todo.length === 0) break;
      const again = await insertRuns(this.#sql, todo);
      const n = again.filter((r) => r.created).length;
      if (n > 0) this.#hooks.onCreated?.(n);
      todo = settle(todo, again);
    }
    return runs.map((r) =>
      results.get(r) ??
        new PoimenError("internal", `admission of dispatch key ${r.dispatch_key} did not settle`)
    );
  }
}
